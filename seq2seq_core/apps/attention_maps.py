"""Attention maps of a trained run: `s2s attention RUN_DIR --input FILE --output DIR`.

For each input line the run's own search writes a hypothesis (the checkpoint, the decoding
settings and the constraint that `s2s generate` uses); then one teacher-forced forward pass over
(source, hypothesis) returns every attention's weights, from the model's own forward pass
(`Transformer.forward(..., return_attention=True)`), and they are drawn with the tokens on both
axes: encoder self-attention (source x source), decoder self-attention (decoder input x decoder
input) and encoder-decoder attention (output token predicted x source). A page shows all heads
of one layer (a grid, as the paper's Figures 3-5), or one head when a head is chosen. Beside the
PNGs, one JSON per line holds the tokens and the weights drawn. matplotlib draws off-screen.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .. import textio
from ..data.idspace import N_SPECIAL
from ..data.members import decode_settings
from ..data.batches import chunks
from ..decode.batched import prepared_sources, source_batch
from ..decode.search import search, sentences_per_batch
from ..errors import ConfigError, UsageError
from ..files import (
    atomic_write_text,
    output_folder,
    own_outputs,
    record_outputs,
    remove_stale_temporaries,
    replacing,
)
from ..inference import load_for_inference
from ..tokenizers import BOS, EOS, SPECIALS

log = logging.getLogger("s2s")

KINDS = {
    "encoder": "Encoder self-attention",
    "decoder": "Decoder self-attention",
    "cross": "Encoder-decoder attention",
}
#: (query axis, key axis) of each kind
AXES = {
    "encoder": ("query: source token", "key: source token"),
    "decoder": ("query: decoder input", "key: decoder input"),
    "cross": ("query: output token it predicts", "key: source token"),
}


@dataclass(frozen=True)
class AttentionRequest:
    """Which maps `s2s attention` draws and where: its command-line options. Layers and heads
    are numbered from 1; None draws them all."""

    input: str | Path  # the source lines
    output: str | Path  # the folder for the PNG and JSON files
    task: str | None = None  # the member of a multi-task run (None: its only one)
    layer: int | None = None  # only this layer
    head: int | None = None  # a page for this head alone (None: all heads on a page)
    beam: int | None = None  # the search's beam (None: decode.beam)
    overrides: tuple[str, ...] = ()  # key=value, over the run's config.yaml


def draw_attention(run_dir, registry, request: AttentionRequest) -> list[Path]:
    """Write the attention maps of every line of `request.input` into folder `request.output`,
    decoded by the run at `run_dir`. Returns the files written."""
    if request.beam is not None and request.beam < 1:
        raise UsageError(f"--beam {request.beam}: at least 1")
    beam = [f"decode.beam={request.beam}"] if request.beam is not None else []
    overrides = [*request.overrides, *beam]
    _readable(request.input)
    out = Path(request.output)
    output_folder(out, "--output")  # not a file, nor below one, nor a run's own folder
    cfg, member, model = load_for_inference(run_dir, registry, overrides, request.task)
    settings = decode_settings(member, cfg.decode)
    if settings.beam > member.task.tgt_vocab_size:
        setting = "--beam" if request.beam is not None else "decode.beam"
        raise ConfigError(
            f"{setting}={settings.beam}: the beam is larger than the target vocabulary of "
            f"{run_dir} ({member.task.tgt_vocab_size} tokens)"
        )
    n_layers, n_heads = len(model.encoder), model.encoder[0].self_attn.h
    for name, value, most in (
        ("--layer", request.layer, n_layers),
        ("--head", request.head, n_heads),
    ):
        if value is not None and not 1 <= value <= most:
            raise UsageError(f"{name} {value}: this model has {most} (numbered 1 to {most})")
    raw = textio.read_lines(request.input)
    lines = prepared_sources(
        member, raw
    )  # as s2s generate reads them (parsing: Penn Treebank tokens)
    ids = member.encode_source(lines)
    keep = [i for i, seq in enumerate(ids) if len(seq) + 1 <= model.max_positions]
    for i in sorted(set(range(len(ids))) - set(keep)):
        log.warning(
            "%s, line %d: %d source tokens do not fit model.max_positions=%d; no maps drawn",
            request.input,
            i + 1,
            len(ids[i]) + 1,
            model.max_positions,
        )
    layers = [request.layer] if request.layer is not None else list(range(1, n_layers + 1))
    width = len(str(len(lines)))
    planned = [
        name
        for i in keep
        for name in [
            *(
                _map_name(f"{i + 1:0{width}d}", kind, L, request.head)
                for kind in KINDS
                for L in layers
            ),
            f"{i + 1:0{width}d}.json",
        ]
    ]
    own_outputs(out, planned, "--output")  # never over a file of the user's
    device = next(model.parameters()).device
    hyps = {}
    for batch in chunks(
        keep, sentences_per_batch(cfg.decode.max_sentences, device)
    ):  # the search `s2s generate` runs
        src = source_batch([ids[i] for i in batch]).to(device)
        found = search(model, src, settings, member.constraint([lines[i] for i in batch]))
        hyps.update((i, h.tokens) for i, h in zip(batch, found))
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    head = request.head  # a page for this head alone, else every head on one page
    written = []
    for i in keep:
        src = source_batch([ids[i]]).to(device)
        tgt_in = torch.tensor([[BOS, *hyps[i]]], device=device)
        with torch.no_grad():
            _, weights = model(src, tgt_in, return_attention=True)
        src_tokens = source_tokens(member, src[0].tolist())
        tgt_tokens = target_tokens(member, tgt_in[0].tolist())
        labels = {
            "encoder": (src_tokens, src_tokens),
            "decoder": (tgt_tokens, tgt_tokens),
            "cross": (tgt_tokens[1:] + [SPECIALS[EOS]], src_tokens),
        }
        stem, first = f"{i + 1:0{width}d}", len(written)
        record = {
            "line": i + 1,
            "source": raw[i],
            "hypothesis": member.decode_target(hyps[i]),
            "source_tokens": src_tokens,
            "decoder_input_tokens": tgt_tokens,
            "predicted_tokens": labels["cross"][0],
            "layers": n_layers,
            "heads": n_heads,
            "attention": {},
        }
        for kind, per_layer in weights.kinds().items():
            record["attention"][kind] = {}
            for L in layers:
                w = per_layer[L - 1][0].float().cpu().numpy()  # [h, queries, keys]
                heads = [head] if head is not None else list(range(1, n_heads + 1))
                record["attention"][kind][str(L)] = {
                    str(H): np.round(w[H - 1], 6).tolist() for H in heads
                }
                rows, cols = labels[kind]
                title = f"{KINDS[kind]}, layer {L} of {n_layers}" + (
                    f", head {head} of {n_heads}" if head else f", all {n_heads} heads"
                )
                name = _map_name(stem, kind, L, head)
                page = Page(kind, f"{title}  (line {i + 1})", heads, rows, cols)
                written.append(draw(page, w[[H - 1 for H in heads]], out / name))
        atomic_write_text(out / f"{stem}.json", json.dumps(record, ensure_ascii=False) + "\n")
        written.append(out / f"{stem}.json")
        record_outputs(out, [p.name for p in written[first:]])
    return written


def _map_name(stem: str, kind: str, layer: int, head: int | None) -> str:
    """The PNG of one line's attention of one kind and layer (and head)."""
    return f"{stem}.{kind}.layer{layer}" + (f".head{head}" if head else "") + ".png"


def _readable(path) -> None:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"input {p}: {'is a directory' if p.is_dir() else 'no such file'}")


# -- tokens ------------------------------------------------------------------------------------
def source_tokens(member, run_ids: Sequence[int]) -> list[str]:
    """A source row's run ids as the member's token strings (its task token as <NAME>)."""
    out, member_ids = [], []
    for i in run_ids:
        if i == member.ids.task_token:
            out.append(f"<{member.name}>")
        else:
            member_ids.append(i - member.ids.src_offset if i >= N_SPECIAL else i)
    return out + token_strings(member.task.src_vocab, member_ids)


def target_tokens(member, run_ids: Sequence[int]) -> list[str]:
    return token_strings(member.task.tgt_vocab, member.ids.tgt_back(run_ids))


def token_strings(vocab, ids: Sequence[int]) -> list[str]:
    """Each id of a vocabulary as its token: a word-level vocabulary's own (`itos`), a `tokenizers`
    vocabulary's piece (byte-level pieces as text, a word's start as ▁), else the id decoded
    alone."""
    itos = getattr(vocab, "itos", None)
    tokenizer = vocab.to_tokenizers() if itos is None and hasattr(vocab, "to_tokenizers") else None
    byte_level = tokenizer is not None and type(tokenizer.pre_tokenizer).__name__ == "ByteLevel"
    out = []
    for i in ids:
        if i < N_SPECIAL:
            out.append(SPECIALS[i])
        elif itos is not None:
            out.append(itos[i])
        elif tokenizer is not None:
            piece = tokenizer.id_to_token(i) or f"#{i}"
            out.append(_from_bytes(piece) if byte_level else piece)
        else:
            out.append(vocab.decode([i]) or f"#{i}")
    return out


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


BYTES = _byte_chars()


def _from_bytes(piece: str) -> str:
    """A byte-level piece as text, a space as ▁; the piece itself when its bytes are not whole
    UTF-8."""
    text, pending = [], bytearray()
    try:
        for ch in piece:
            if ch in BYTES:
                pending.append(BYTES[ch])
                continue
            text.append(
                pending.decode("utf-8") + ch
            )  # a character of the piece's own (a continuation mark)
            pending.clear()
        text.append(pending.decode("utf-8"))
    except UnicodeDecodeError:
        return piece
    return "".join(text).replace(" ", "▁")


# -- drawing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Page:
    """What one page of maps shows: the kind of attention (a key of KINDS), its title, the heads
    drawn (numbered from 1) and the tokens along each axis (rows: queries, cols: keys)."""

    kind: str
    title: str
    heads: Sequence[int]
    rows: Sequence[str]
    cols: Sequence[str]


def draw(page: Page, weights: np.ndarray, path: Path) -> Path:
    """One page: a heatmap per head of weights [heads, queries, keys], tokens on both axes, one
    colour bar; the page grows with the sentence (a quarter inch a token, up to 14 inches a map).
    Colour follows the square root of a weight on one scale, 0 to 1, for every page (a uniform head
    looks as faint as it is), so that weights of 0.05 to 0.3, a spread-out head's, stay apart; the
    colour bar is marked in weights."""
    # matplotlib when drawing only: the server reads this module's tokens and never draws
    from matplotlib import colormaps
    from matplotlib.colors import PowerNorm
    from matplotlib.figure import Figure

    n = len(page.heads)
    ncols = min(n, 2 if n <= 4 else 4)  # 4 heads 2 x 2, 8 heads 4 x 2, 16 heads 4 x 4
    nrows = math.ceil(n / ncols)
    pw, ph = (
        min(14.0, max(2.2, 0.24 * len(t) + 0.8)) for t in (page.cols, page.rows)
    )  # a map's inches
    fig = Figure(figsize=(ncols * (pw + 1.4) + 1.2, nrows * (ph + 1.6) + 0.8), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    cmap = colormaps["viridis"].with_extremes(bad="#d9d9d9")
    image = None
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.set_axis_off()
            continue
        w = weights[k]
        if page.kind == "decoder":  # the future a query may not see: grey, not a weight of 0
            w = np.ma.masked_array(w, mask=np.triu(np.ones_like(w, dtype=bool), 1))
        image = ax.imshow(
            w, cmap=cmap, norm=PowerNorm(0.5, 0.0, 1.0), aspect="auto", interpolation="nearest"
        )
        for axis, tokens, inches, setter in (
            (ax.xaxis, page.cols, pw, ax.set_xticks),
            (ax.yaxis, page.rows, ph, ax.set_yticks),
        ):
            size = min(9.0, 0.8 * 72 * inches / max(1, len(tokens)))  # points a label may take
            step = max(1, math.ceil(4.0 / size))  # below 4 pt, every step-th label
            where = list(range(0, len(tokens), step))
            setter(where, [tokens[j] for j in where], fontsize=max(size, 4.0))
        ax.tick_params(axis="x", labelrotation=90)
        if n > 1:
            ax.set_title(f"head {page.heads[k]}", fontsize=10)
        ax.set_xlabel(AXES[page.kind][1], fontsize=9)
        ax.set_ylabel(AXES[page.kind][0], fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.9 if nrows == 1 else 0.6, label="attention weight")
    fig.suptitle(page.title, fontsize=12)
    with replacing(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    return path
