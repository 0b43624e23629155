"""What the formats share, so that no format reaches into another: the import job and what a
reader hands back, JSON and weights files read with one-line errors, the one typed reader of a
model folder's values (`Fields`) and of its vocabulary's ids (`read_ids`), every imported tensor
checked against its config (`checked_weight`: shape, dtype, finiteness), the layers' names in
fairseq's and transformers' Marian layout (`layer_weights`), the export folder's marker, a task's
tokens in id order, and transformers' MarianMTModel both ways (`permutation`,
`marian_state_dict`, `from_marian_state`, `save_marian_model`), which OPUS-MT's models
(`marian`) and s2s's own Hugging Face exports (`huggingface`) both are."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from ...nn.model import Transformer
from ...tokenizers import SPECIALS
from ...errors import ExportError, ImportModelError

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
MARKER = "s2s_export.json"  # in every export folder: the format, the source run, the files written


@dataclass(frozen=True)
class ImportJob:
    """One `s2s import`: the source (a folder or a hub name), the run directory to write, the
    languages (None: from the tokenizer's config or the model's name), the hub revision."""

    source: str
    output: str
    src_lang: str | None = None
    tgt_lang: str | None = None
    revision: str | None = None


@dataclass
class Imported:
    """What a reader made of a source: the run's config (a dict), the record of where it came
    from, the two vocabularies, and a function from the new model to its state dict."""

    config: dict
    origin: dict
    src_vocab: object
    tgt_vocab: object
    state: Callable
    weights_file: Path
    config_file: Path


def depths(encoder: int, decoder: int) -> dict:
    """The model section's depths of an imported model: `layers` alone when the stacks are
    alike (so that a `model.layers` override still sets both, and a contradiction with the
    weights is refused), and each stack's own where they differ."""
    if encoder == decoder:
        return {"layers": encoder}
    return {"layers": encoder, "encoder_layers": encoder, "decoder_layers": decoder}


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImportModelError(f"{path} is missing: not a Hugging Face model folder") from None
    except (OSError, ValueError) as e:
        raise ImportModelError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise ImportModelError(f"{path}: not a JSON object")
    return value


_NEEDED = object()  # a Fields default: the key must be there


def shown(value) -> str:
    """A value read from a model file as it stands there (JSON's spelling), cut at 40 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:40] + "..."


class Fields:
    """The values of one model file (config.json, generation_config.json, tokenizer_config.json,
    a fairseq checkpoint's args) read typed: the one reader of these untrusted values. A value of
    the wrong type or out of range is refused in one line naming the file, the key and the value,
    before any work: the string "false" is not read as true, "6" or 6.5 never reaches int(), a
    negative length is not a length. A whole float (6.0) is a whole number; a bool is no number."""

    def __init__(self, where, values: dict):
        self.where, self.values = where, values

    def _get(self, key, default):
        value = self.values.get(key)
        if value is None and default is _NEEDED:
            raise ImportModelError(f"{self.where}: {key!r} is missing")
        return value

    def _bad(self, key, value, wanted: str):
        raise ImportModelError(f"{self.where}: {key}={shown(value)} is not {wanted}")

    def int(self, key: str, default=_NEEDED, minimum: int | None = None):
        value = self._get(key, default)
        if value is None:
            return default
        whole = isinstance(value, float) and value.is_integer()
        if isinstance(value, bool) or not (isinstance(value, int) or whole):
            self._bad(key, value, "a whole number")
        if minimum is not None and value < minimum:
            self._bad(key, value, f"a whole number of at least {minimum}")
        return int(value)

    def float(self, key: str, default=_NEEDED, minimum: float | None = None):
        value = self._get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._bad(key, value, "a number")
        number = float(value) if abs(value) < 1e308 else math.inf  # a JSON integer of 400 digits
        if not math.isfinite(number) or (minimum is not None and number < minimum):
            wanted = "a finite number" + ("" if minimum is None else f" of at least {minimum}")
            self._bad(key, value, wanted)
        return number

    def bool(self, key: str, default=_NEEDED):
        value = self._get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self._bad(key, value, "true or false")
        return value

    def str(self, key: str, default=_NEEDED):
        value = self._get(key, default)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            self._bad(key, value, "a non-empty string")
        return value


def read_ids(path: Path) -> dict:
    """A vocabulary file mapping each piece to its id (OPUS-MT's vocab.json): a JSON object whose
    ids are whole numbers 0..n-1, each piece's its own; a string id, a gap or two pieces on one
    id is refused in one line naming the file and the piece."""
    vocab = read_json(path)
    by_id = {}
    for piece, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ImportModelError(
                f"{path}: piece {piece!r} has id {shown(i)}, not a whole number of at least 0"
            )
        if i in by_id:
            raise ImportModelError(
                f"{path}: pieces {by_id[i]!r} and {piece!r} both have id {i}: one piece an id"
            )
        by_id[i] = piece
    gap = next((i for i in range(len(by_id)) if i not in by_id), None)
    if gap is not None:
        raise ImportModelError(
            f"{path}: no piece has id {gap} but {len(by_id)} pieces go up to id {max(by_id)}: "
            "the ids must be 0..n-1"
        )
    return vocab


def checked_weight(path: Path, name: str, tensor, shape) -> torch.Tensor:
    """The float32 copy of weight `name` of `path`, which the model its config describes holds
    with `shape`: a tensor of another shape (never cut to fit), of integers or bools, or holding
    NaN or infinities is refused in one line naming the tensor, before the run is written."""
    if not isinstance(tensor, torch.Tensor):
        raise ImportModelError(f"{path}: {name!r} is a {type(tensor).__name__}, not a tensor")
    if not tensor.is_floating_point():
        raise ImportModelError(
            f"{path}: {name!r} holds {str(tensor.dtype).removeprefix('torch.')} values, not "
            "floating-point weights"
        )
    if tuple(tensor.shape) != tuple(shape):
        raise ImportModelError(
            f"{path}: {name!r} has shape {list(tensor.shape)} but the model its config describes "
            f"needs {list(shape)}"
        )
    weight = tensor.float()  # the tensor itself where it is float32 already: no copy
    # counted a slice at a time: a mask of the whole 256k-row embedding table would be 268 MB
    bad = sum(int((~torch.isfinite(part)).sum()) for part in weight.reshape(-1).split(1 << 22))
    if bad:
        raise ImportModelError(f"{path}: {name!r} holds {bad} NaN or infinite values")
    return weight


class Weights(Mapping):
    """A weights file's tensors by name, each read from the file when asked for and held by the
    caller alone, so that an import holds the source's tensors one at a time beside the run's
    (not the whole file beside the model): safetensors' tensors copied out of a mapping of the
    file that is closed again at once (its pages leave the process), a PyTorch file's tensors
    mapped (`torch.load(mmap=True)`: pages of the file, read where touched, never written).
    The names (the file's header) are read when it is opened, so that a damaged file is refused
    before any work; a tensor that cannot be read later is refused in one line naming it."""

    def __init__(self, path: Path, names: list[str], read: Callable[[str], object]):
        self.path, self._names, self._read = path, dict.fromkeys(names), read

    def __getitem__(self, name: str):
        if name not in self._names:
            raise KeyError(name)
        try:
            return self._read(name)
        except Exception as e:  # noqa: BLE001 -- a file changed or damaged since it was opened
            raise ImportModelError(
                f"{self.path}: {name!r} is unreadable: {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0]}"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def read_weights(folder: Path) -> tuple[Path, Weights]:
    """The first of `WEIGHTS` in `folder` as `Weights` (read tensor by tensor); a file that is
    truncated, damaged or holds no tensors by name is refused in one line naming it."""
    for name in WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return path, _safetensors(path)
            state = torch_file(path)
        except Exception as e:  # noqa: BLE001 -- truncated or damaged files raise many kinds
            raise ImportModelError(
                f"{path} is unreadable (truncated or damaged?): {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0]}"
            ) from None
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise ImportModelError(f"{path}: holds no weights by name (a state dict)")
        return path, Weights(path, list(state), state.__getitem__)
    raise ImportModelError(f"{folder} holds no weights ({' or '.join(WEIGHTS)})")


def _safetensors(path: Path) -> Weights:
    """A safetensors file's tensors, each copied out of a mapping of the file opened for it
    alone: a mapping kept open would hold every page read in the process's memory (its RSS)
    beside the copies, as many bytes again as the file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:  # the header, checked against the file size
        names = list(f.keys())

    def read(name):
        with safe_open(str(path), framework="pt") as f:
            return f.get_tensor(name).clone()

    return Weights(path, names, read)


def torch_file(path: Path):
    """A PyTorch file (pytorch_model.bin, a fairseq checkpoint) mapped rather than read whole
    where its format allows (torch.save's zip format, since PyTorch 1.6), read whole where not."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as e:
        if "mmap" not in str(e):  # the legacy format, which cannot be mapped
            raise
    return torch.load(path, map_location="cpu", weights_only=True)


def layer_weights(model) -> Iterator[tuple[str, str, str]]:
    """(s2s's name, fairseq's name, role) of every linear layer and layer norm of the model's
    stacks, without ".weight" / ".bias"; transformers' MarianMTModel kept fairseq's names. The
    role says what it does to the residual stream: "reads" it (its input columns are d_model),
    "writes" it (its output rows are), or is a "norm" over it."""
    for stack, cross in (("encoder", False), ("decoder", True)):
        for i in range(len(getattr(model, stack))):
            p, q = f"{stack}.{i}", f"{stack}.layers.{i}"
            attentions = [("self_attn", "self_attn", "res1")]
            attentions += [("cross_attn", "encoder_attn", "res2")] if cross else []
            for ours, theirs, residual in attentions:
                for a, b in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj")):
                    yield f"{p}.{ours}.{a}", f"{q}.{theirs}.{b}", "reads"
                yield f"{p}.{ours}.w_o", f"{q}.{theirs}.out_proj", "writes"
                yield f"{p}.{residual}.norm", f"{q}.{theirs}_layer_norm", "norm"
            yield f"{p}.ffn.0", f"{q}.fc1", "reads"
            yield f"{p}.ffn.2", f"{q}.fc2", "writes"
            yield f"{p}.{'res3' if cross else 'res2'}.norm", f"{q}.final_layer_norm", "norm"


# -- vocabularies ----------------------------------------------------------------------------
def tokenizers_of(task):
    try:
        src, tgt = task.tokenizers()
    except NotImplementedError as e:
        raise ExportError(
            f"{e}: CTranslate2 and Hugging Face exports need the vocabulary's tokens"
        ) from None
    return src, tgt


def tokens_of(tokenizer) -> list[str]:
    """The vocabulary's tokens in id order (ids 0..n-1, specials first)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        if i >= len(tokens):
            raise ExportError(
                f"the vocabulary's ids are not 0..{len(vocab) - 1} (token {token!r} has id {i})"
            )
        tokens[i] = token
    if tokens[: len(SPECIALS)] != SPECIALS:
        raise ExportError(
            f"the vocabulary must start with {SPECIALS}, it starts with {tokens[: len(SPECIALS)]}"
        )
    return tokens


def task_tokens(task) -> tuple[list[str], list[str]]:
    """The source and target tokens in id order, each a distinct string, as a CTranslate2
    export names them: an imported vocabulary's own list (an OPUS-MT or NLLB sentencepiece
    `Pieces`, a fairseq `MosesBPE`: what turns text into ids is the vocabulary file itself, not a
    `tokenizers.Tokenizer`), any other's through its tokenizer (`tokens_of`). Specials keep their
    names; a later token spelled as an earlier one (a model's own "<s>" after s2s's) gets "#id"
    appended, so that every id has its own name and names map back to ids."""
    from ...tokenizers import Imported as ImportedVocab

    own = getattr(task, "task", task)  # a run's member serves as its task
    src, tgt = own.src_vocab, own.tgt_vocab
    if isinstance(src, ImportedVocab) and isinstance(tgt, ImportedVocab):
        return _distinct(src.itos), _distinct(tgt.itos)
    src, tgt = tokenizers_of(task)
    return tokens_of(src), tokens_of(tgt)


def _distinct(tokens: list[str]) -> list[str]:
    seen, out = set(), []
    for i, token in enumerate(tokens):
        while token in seen:
            token = f"{token}#{i}"
        seen.add(token)
        out.append(token)
    return out


# -- transformers' MarianMTModel ----------------------------------------------------------------
def permutation(d_model: int) -> torch.Tensor:
    """Dimension j of a Marian hidden state is dimension perm[j] of ours: even ones, then odd ones,
    which turns our interleaved sinusoids into Marian's [sin | cos] halves."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def marian_state_dict(model: Transformer, src_order=None, tgt_order=None) -> dict:
    """Our weights under MarianMTModel's names, with the d_model dimensions permuted and the
    vocabulary rows in the order `src_order` / `tgt_order` (s2s's id of each of the export's
    ids; None: s2s's own)."""
    perm = permutation(model.d_model)
    src_rows = slice(None) if src_order is None else torch.tensor(src_order)
    tgt_rows = slice(None) if tgt_order is None else torch.tensor(tgt_order)
    state = {}

    def inp(name, lin):  # reads the residual stream: permute the input columns
        state[f"{name}.weight"] = lin.weight[:, perm].clone()
        state[f"{name}.bias"] = lin.bias.clone()

    def outp(name, lin):  # writes the residual stream: permute the output rows
        state[f"{name}.weight"] = lin.weight[perm].clone()
        state[f"{name}.bias"] = lin.bias[perm].clone()

    def norm(name, ln):
        state[f"{name}.weight"], state[f"{name}.bias"] = (
            ln.weight[perm].clone(),
            ln.bias[perm].clone(),
        )

    def attention(name, attn):
        for ours, theirs in ((attn.w_q, "q_proj"), (attn.w_k, "k_proj"), (attn.w_v, "v_proj")):
            inp(f"{name}.{theirs}", ours)
        outp(f"{name}.out_proj", attn.w_o)

    state["model.encoder.embed_tokens.weight"] = model.src_embed.weight[src_rows][:, perm].clone()
    state["model.decoder.embed_tokens.weight"] = model.tgt_embed.weight[tgt_rows][:, perm].clone()
    if model.src_embed is model.tgt_embed:  # one matrix, Marian's `shared`
        state["model.shared.weight"] = state["model.encoder.embed_tokens.weight"]
    for i, layer in enumerate(model.encoder):
        p = f"model.encoder.layers.{i}"
        attention(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.res1.norm)
        inp(f"{p}.fc1", layer.ffn[0])
        outp(f"{p}.fc2", layer.ffn[2])
        norm(f"{p}.final_layer_norm", layer.res2.norm)
    for i, layer in enumerate(model.decoder):
        p = f"model.decoder.layers.{i}"
        attention(f"{p}.self_attn", layer.self_attn)
        norm(f"{p}.self_attn_layer_norm", layer.res1.norm)
        attention(f"{p}.encoder_attn", layer.cross_attn)
        norm(f"{p}.encoder_attn_layer_norm", layer.res2.norm)
        inp(f"{p}.fc1", layer.ffn[0])
        outp(f"{p}.fc2", layer.ffn[2])
        norm(f"{p}.final_layer_norm", layer.res3.norm)
    if (
        model.out.weight is not model.tgt_embed.weight
    ):  # untied (model.tie_output): Marian's lm_head
        state["lm_head.weight"] = model.out.weight[tgt_rows][:, perm].clone()
    bias = model.out.bias
    rows = model.tgt_embed.num_embeddings if tgt_order is None else len(tgt_order)
    state["final_logits_bias"] = (
        torch.zeros(1, rows) if bias is None else bias.detach()[tgt_rows].clone()[None]
    )
    return state


def from_marian_state(model, weights, src_ids, tgt_ids, path) -> dict:
    """MarianMTModel's weights under s2s's names: s2s's id i takes the source's row ids[i] (-1:
    a row the source lacks, zero, its output bias -inf), the d_model dimensions in s2s's
    interleaved order (`permutation`'s inverse). Every tensor is checked against the shape the
    model needs (`checked_weight`); one vocabulary has one embedding table."""
    inv = torch.argsort(permutation(model.d_model))
    names = {k.removeprefix("model."): k for k in weights}  # s2s's reading -> the file's key
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    taken = set()

    def get(name, shape):
        if name not in names:
            raise ImportModelError(f"{path}: {name!r} is missing")
        taken.add(name)
        return checked_weight(path, names[name], weights[names[name]], shape)

    def rows(table, ids):  # [V_source, d] -> [V_s2s, d]: a row the source lacks zero
        out = table[torch.tensor([max(i, 0) for i in ids])]  # indexing copies
        out[torch.tensor([i < 0 for i in ids])] = 0.0
        return out

    state = {}

    def inp(ours, theirs):
        state[f"{ours}.weight"] = get(f"{theirs}.weight", shapes[f"{ours}.weight"])[:, inv]
        state[f"{ours}.bias"] = get(f"{theirs}.bias", shapes[f"{ours}.bias"])

    def outp(ours, theirs):
        state[f"{ours}.weight"] = get(f"{theirs}.weight", shapes[f"{ours}.weight"])[inv]
        state[f"{ours}.bias"] = get(f"{theirs}.bias", shapes[f"{ours}.bias"])[inv]

    d = model.d_model
    n_src, n_tgt = sum(i >= 0 for i in src_ids), sum(i >= 0 for i in tgt_ids)
    tables = ("shared", "encoder.embed_tokens", "decoder.embed_tokens")
    tables = [f"{t}.weight" for t in tables if f"{t}.weight" in names]
    one = model.src_embed is model.tgt_embed  # one vocabulary (vocab.json alone)
    if one or "shared.weight" in tables:  # one table: every table the file holds is that one
        if not one and n_tgt != n_src:
            raise ImportModelError(
                f"{path}: one embedding table ('shared.weight', {n_src} rows) for a target "
                f"vocabulary of {n_tgt} pieces"
            )
        if not tables:
            raise ImportModelError(f"{path}: 'shared.weight' is missing")
        first = get(tables[0], (n_src, d))  # the others compared with it one at a time
        if any(not torch.equal(first, get(other, (n_src, d))) for other in tables[1:]):
            raise ImportModelError(
                f"{path}: the encoder's and the decoder's embedding tables differ but "
                + (
                    "the tokenizer has one vocabulary (vocab.json, no target_vocab.json): s2s "
                    "shares embeddings exactly when the vocabularies are one"
                    if one
                    else "'shared.weight' says they are one"
                )
            )
        src_table = tgt_table = first
        del first
    else:
        src_table = get("encoder.embed_tokens.weight", (n_src, d))
        tgt_table = get("decoder.embed_tokens.weight", (n_tgt, d))
    state["src_embed.weight"] = rows(src_table, src_ids)[:, inv]
    same = src_table is tgt_table and list(src_ids) == list(tgt_ids)  # one table: made once
    state["tgt_embed.weight"] = (
        state["src_embed.weight"] if same else rows(tgt_table, tgt_ids)[:, inv]
    )
    del src_table, tgt_table  # the source's tables: not held beside the rest
    for ours, theirs, role in layer_weights(model):
        {"reads": inp, "writes": outp, "norm": outp}[role](ours, theirs)
    if model.out.weight is model.tgt_embed.weight:
        state["out.weight"] = state["tgt_embed.weight"]
    else:
        if "lm_head.weight" not in names:
            raise ImportModelError(
                f"{path}: 'lm_head.weight' is missing (tie_word_embeddings=false)"
            )
        state["out.weight"] = rows(get("lm_head.weight", (n_tgt, d)), tgt_ids)[:, inv]
    if model.out.bias is not None:
        if "final_logits_bias" in names:
            bias = get("final_logits_bias", (1, n_tgt)).reshape(-1)
        else:
            bias = torch.zeros(n_tgt)
        state["out.bias"] = bias[torch.tensor([max(i, 0) for i in tgt_ids])].clone()
        # a row the source lacks (s2s's PAD for OPUS-MT) is never written: outside every softmax
        state["out.bias"][torch.tensor([i < 0 for i in tgt_ids])] = -torch.inf
    skipped = {k for k in names if k.endswith("embed_positions.weight")}
    skipped |= {"final_logits_bias"} if model.out.bias is None else set()  # zero: none here
    # a tied output projection the file also holds: the embedding table again
    skipped |= {"lm_head.weight"} if model.out.weight is model.tgt_embed.weight else set()
    left = sorted(set(names) - taken - skipped)
    if left:
        raise ImportModelError(
            f"{path}: {names[left[0]]!r} has no place in the Transformer s2s imports"
        )
    return state


def transformers_shape(model: Transformer, m) -> dict:
    """The settings transformers' encoder-decoder configs (MarianConfig, M2M100Config) share,
    from the model and its config section `m`: sizes, depths, positions, activation, dropout."""
    return dict(
        d_model=m.d_model,
        encoder_layers=len(model.encoder),
        decoder_layers=len(model.decoder),
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        encoder_attention_heads=m.heads,
        decoder_attention_heads=m.heads,
        max_position_embeddings=m.max_positions,
        activation_function=m.activation,
        scale_embedding=model.embed_scale != 1.0,
        dropout=m.dropout,
        attention_dropout=m.attention_dropout,
        activation_dropout=0.0,
    )


def save_marian_model(model: Transformer, cfg, task, out: Path, orders, starts) -> None:
    """`model` as a MarianMTModel (config.json, model.safetensors, generation_config.json) in
    `out`: vocabulary rows in `orders` (source, target: s2s's id of each of the export's ids),
    `starts` its (pad, bos, eos) ids. What Marian cannot express is refused naming the setting."""
    try:
        from transformers import GenerationConfig, MarianConfig, MarianMTModel
    except ImportError:
        raise ExportError(
            "--to huggingface needs the transformers package: pip install transformers "
            "(s2s's export extra)"
        ) from None
    m = cfg.model
    if m.pre_norm:
        raise ExportError(
            "model.pre_norm=true has no MarianMT form (Marian is post-norm): "
            "export it with --to ctranslate2 or --to safetensors"
        )
    if m.positions != "sinusoid":
        raise ExportError(
            f"model.positions={m.positions} has no MarianMT form (Marian computes sinusoids): "
            "export it with --to ctranslate2 or --to safetensors"
        )
    for key, value in (("d_k", m.d_k), ("d_v", m.d_v)):
        if value is not None and value * m.heads != m.d_model:
            raise ExportError(
                f"model.{key}={value} has no MarianMT form (its heads have d_model / heads = "
                f"{m.d_model // m.heads} dimensions): export it with --to "
                f"{'ctranslate2 or --to ' if m.d_k == m.d_v else ''}safetensors"
            )
    shared = bool(task.shared_vocab)
    tied = model.out.weight is model.tgt_embed.weight
    (src_order, tgt_order), (pad, bos, eos) = orders, starts
    hf_cfg = MarianConfig(
        vocab_size=len(src_order),
        decoder_vocab_size=len(tgt_order),
        share_encoder_decoder_embeddings=shared,
        tie_word_embeddings=tied,
        **transformers_shape(model, m),
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        decoder_start_token_id=bos,
        forced_eos_token_id=None,
    )
    hf = MarianMTModel(hf_cfg).eval()
    state = marian_state_dict(model, src_order, tgt_order)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # not given: the tied output projection and the position tables, which Marian computes itself
    left = [
        k
        for k in missing
        if not (tied and k == "lm_head.weight")
        and not k.endswith("embed_positions.weight")
        and not (shared and k.endswith("embed_tokens.weight"))
    ]
    if left or unexpected:
        raise ExportError(f"MarianMT weights do not match: missing {left}, unexpected {unexpected}")
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=bos,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        num_beams=1,
        do_sample=False,
        suppress_tokens=sorted({pad, bos}),
        max_length=m.max_positions,
    )
    hf.save_pretrained(str(out))
