"""fairseq Transformer checkpoints with their dictionaries and BPE codes.

What maps and what is refused: docs/pretrained.md, "fairseq's Transformer checkpoints"."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ...tokenizers.moses_bpe import MosesBPE, read_fairseq_dictionary
from ...errors import DataError, ImportModelError
from ...files import sha256
from ...tokenizers import BOS
from .common import ImportJob, Imported, layer_weights

#: checkpoint names looked for in a folder: fairseq's hub archives' and fairseq-train's
FAIRSEQ_CHECKPOINTS = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")
#: the architectures whose layers s2s holds (pre-norm where the options say so)
FAIRSEQ_ARCHS = (
    "transformer",
    "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big",
    "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big",
    "transformer_wmt_en_de_big_t2t",
    "transformer_iwslt_de_en",
)
#: options a checkpoint may hold only at these values (what s2s's Transformer does)
FAIRSEQ_FIXED = {
    "activation_fn": "relu",
    "no_scale_embedding": False,
    "layernorm_embedding": False,
    "no_token_positional_embeddings": False,
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "adaptive_softmax_cutoff": None,
    "cross_self_attention": False,
    "no_cross_attention": False,
    "encoder_layerdrop": 0,
    "decoder_layerdrop": 0,
    "tie_adaptive_weights": False,
    "quant_noise_pq": 0,
    "checkpoint_activations": False,
}
BPE_CODES = ("bpecodes", "codes", "code", "bpe.codes")


def checkpoint_in(folder: Path) -> Path | None:
    return next((folder / n for n in FAIRSEQ_CHECKPOINTS if (folder / n).is_file()), None)


def read(job: ImportJob) -> Imported:
    """A fairseq Transformer checkpoint (a .pt file, or a folder holding model.pt or
    checkpoint_best.pt / checkpoint_last.pt) with its dict.SRC.txt, dict.TGT.txt and the
    subword-nmt codes it was trained with (bpecodes) beside it, as fairseq's hub archives hold
    them; text is Moses-tokenised (sacremoses) before BPE, as `--tokenizer moses --bpe
    subword_nmt` does."""
    import argparse

    path = Path(job.source)
    if path.is_dir():
        path = checkpoint_in(path)
    if not path.is_file():
        raise ImportModelError(f"{path} is missing: no fairseq checkpoint there")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- truncated files and foreign pickles raise many kinds
        raise ImportModelError(
            f"{path} is unreadable as a fairseq checkpoint: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}"
        ) from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise ImportModelError(f"{path}: holds no model state ('model')")
    cfg = saved.get("cfg") or {}
    args = cfg.get("model") if isinstance(cfg, dict) else None
    args = args if args is not None else saved.get("args")
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    if not isinstance(args, dict):
        raise ImportModelError(f"{path}: holds no model configuration ('cfg' or 'args')")
    task = cfg.get("task") if isinstance(cfg.get("task"), dict) else args
    src_lang = job.src_lang or (task or {}).get("source_lang")
    tgt_lang = job.tgt_lang or (task or {}).get("target_lang")
    if not src_lang or not tgt_lang:
        raise ImportModelError(
            f"{path}: the languages are not recorded (task.source_lang, target_lang): give "
            "--src-lang and --tgt-lang"
        )
    folder = path.parent
    codes_file = next((folder / n for n in BPE_CODES if (folder / n).is_file()), None)
    bpe = (cfg.get("bpe") or {}) if isinstance(cfg, dict) else {}
    if str(bpe.get("_name", "subword_nmt")) not in ("subword_nmt", "None"):
        raise ImportModelError(
            f"{path}: bpe {bpe.get('_name')!r} is not supported (subword_nmt after Moses is)"
        )
    if codes_file is None:
        raise ImportModelError(
            f"{folder}: no BPE codes ({' or '.join(BPE_CODES)}): put the subword-nmt codes the "
            "model was trained with beside the checkpoint, as fairseq's archives hold them"
        )
    dict_files = [folder / f"dict.{lang}.txt" for lang in (src_lang, tgt_lang)]
    try:
        codes = codes_file.read_text(encoding="utf-8")
        src_vocab, tgt_vocab = (
            MosesBPE.of_fairseq(lang, codes, read_fairseq_dictionary(f))
            for lang, f in zip((src_lang, tgt_lang), dict_files)
        )
    except (DataError, OSError, UnicodeDecodeError) as e:
        raise ImportModelError(str(e)) from None
    except Exception as e:  # noqa: BLE001 -- subword-nmt's errors on malformed codes
        raise ImportModelError(f"{codes_file}: not subword-nmt BPE codes ({e})") from None
    config = _fairseq_config(args, path, src_vocab, tgt_vocab, src_lang, tgt_lang)
    origin = {
        "format": "fairseq",
        "source": job.source,
        "revision": "",
        "files": {f.name: sha256(f) for f in [path, *dict_files, codes_file]},
    }
    weights = saved["model"]
    return Imported(
        config,
        origin,
        src_vocab,
        tgt_vocab,
        lambda model: _fairseq_state(model, weights, args, src_vocab, tgt_vocab, path),
        path,
        path,
    )


def _fairseq_config(args: dict, path: Path, src_vocab, tgt_vocab, src_lang, tgt_lang) -> dict:
    """The run's config as a dict from a fairseq checkpoint's model arguments."""
    arch = args.get("arch") or args.get("_name")
    if arch not in FAIRSEQ_ARCHS:
        raise ImportModelError(
            f"{path}: arch {arch!r} is not supported (one of {', '.join(FAIRSEQ_ARCHS)})"
        )
    for key, value in FAIRSEQ_FIXED.items():
        if key in args and args[key] not in (value, None if value is False else value):
            raise ImportModelError(f"{path}: {key}={args[key]!r} is not supported ({value!r} is)")

    def same(a, b):
        if args.get(a) != args.get(b):
            raise ImportModelError(
                f"{path}: {a}={args.get(a)} but {b}={args.get(b)}: s2s's stacks are alike"
            )
        return args.get(a)

    d = same("encoder_embed_dim", "decoder_embed_dim")
    if args.get("decoder_output_dim", d) != d or args.get("decoder_input_dim", d) != d:
        raise ImportModelError(f"{path}: decoder_input_dim / decoder_output_dim other than {d}")
    pre_norm = same("encoder_normalize_before", "decoder_normalize_before")
    share_all = bool(args.get("share_all_embeddings"))
    if (src_vocab.id_space == tgt_vocab.id_space) != share_all:
        raise ImportModelError(
            f"{path}: share_all_embeddings={share_all} with "
            f"{'one' if src_vocab.id_space == tgt_vocab.id_space else 'two'} dictionaries: "
            "s2s shares embeddings exactly when the dictionaries are one"
        )
    max_positions = min(
        int(args.get("max_source_positions", 1024)), int(args.get("max_target_positions", 1024))
    )
    return {
        "task": {
            "name": "translation",
            "source": "text",
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "tokenizer": MosesBPE.KIND,
            "vocab_size": len(tgt_vocab),
            "shared_vocab": share_all,
        },
        "model": {
            "layers": int(same("encoder_layers", "decoder_layers")),
            "d_model": int(d),
            "d_ff": int(same("encoder_ffn_embed_dim", "decoder_ffn_embed_dim")),
            "heads": int(same("encoder_attention_heads", "decoder_attention_heads")),
            "dropout": float(args.get("dropout", 0.1)),
            "attention_dropout": float(args.get("attention_dropout", 0.0)),
            "pre_norm": bool(pre_norm),
            "max_positions": max_positions,
            "positions": "learned",  # fairseq's own sinusoids, as a table (_fairseq_positions)
            "activation": "relu",
            "output_bias": True,  # zero but s2s's BOS row: -inf
            "tie_output": bool(share_all or args.get("share_decoder_input_output_embed")),
        },
        # fairseq-generate's defaults: beam 5, lenpen 1, 1 to 200 tokens, its stopping rule
        "decode": {
            "beam": 5,
            "alpha": 1.0,
            "length_penalty": "power",
            "stop": "beam",
            "min_len": 1,
            "max_len_a": 0.0,
            "max_len_b": min(200, max_positions - 1),
        },
        "data": {"max_len": min(256, max_positions)},
        "run": {},
    }


def _fairseq_positions(n: int, d: int, padding_idx: int = 1) -> torch.Tensor:
    """fairseq's sinusoidal table for s2s's positions 0..n-1, which are its padding_idx + 1 ..:
    [sin | cos] halves at frequencies 10000^(-i / (d/2 - 1)), computed in float32 as fairseq
    computes them (Vaswani et al.'s frequencies are 10000^(-2i / d))."""
    half = d // 2
    scale = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    pos = torch.arange(padding_idx + 1 + n, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(pos), torch.cos(pos)], dim=1)
    if d % 2:
        table = torch.cat([table, torch.zeros(table.size(0), 1)], dim=1)
    return table[padding_idx + 1 :]


def _fairseq_state(model, w, args, src_vocab, tgt_vocab, path) -> dict:
    """fairseq's Transformer weights under s2s's names, rows in s2s's id order (BOS: a copy of
    </s>'s row, the decoder's start)."""
    taken = set()

    def get(name):
        if name not in w:
            raise ImportModelError(f"{path}: {name!r} is missing")
        taken.add(name)
        return w[name].float()

    def rows(table, vocab):
        index = torch.tensor([i if i >= 0 else 2 for i in vocab.source_ids])  # BOS: </s>'s
        if table.size(0) != len(vocab) - 1:
            raise ImportModelError(
                f"{path}: an embedding has {table.size(0)} rows but its dictionary "
                f"{len(vocab) - 1} tokens"
            )
        return table[index].clone()

    state = {}

    def linear(ours, theirs):
        state[f"{ours}.weight"], state[f"{ours}.bias"] = (
            get(f"{theirs}.weight"),
            get(f"{theirs}.bias"),
        )

    state["src_embed.weight"] = rows(get("encoder.embed_tokens.weight"), src_vocab)
    state["tgt_embed.weight"] = rows(get("decoder.embed_tokens.weight"), tgt_vocab)
    for ours, theirs, _ in layer_weights(model):
        linear(ours, theirs)
    if model.encoder[0].res1.pre_norm:
        linear("enc_norm", "encoder.layer_norm")
        linear("dec_norm", "decoder.layer_norm")
    if model.out.weight is model.tgt_embed.weight:
        state["out.weight"] = state["tgt_embed.weight"]
        taken.add("decoder.output_projection.weight")
    else:
        state["out.weight"] = rows(get("decoder.output_projection.weight"), tgt_vocab)
    state["out.bias"] = torch.zeros(len(tgt_vocab))
    state["out.bias"][BOS] = -torch.inf  # a copy of </s> as input; never written
    state["pos_embed.weight"] = _fairseq_positions(model.max_positions, model.d_model)
    skipped = {k for k in w if k.endswith(("embed_positions._float_tensor", ".version"))}
    left = sorted(set(w) - taken - skipped)
    if left:
        raise ImportModelError(f"{path}: {left[0]!r} has no place in the Transformer s2s imports")
    return state
