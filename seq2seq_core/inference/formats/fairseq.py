"""fairseq Transformer checkpoints with their dictionaries and BPE codes.

What maps and what is refused: docs/pretrained.md, "fairseq's Transformer checkpoints"."""

from __future__ import annotations

from pathlib import Path

import torch

from ...tokenizers.moses_bpe import MosesBPE, read_fairseq_dictionary
from ...errors import DataError, ImportModelError
from ...files import sha256
from ...tokenizers import BOS
from ...nn.model import offset_sinusoids
from .common import Fields, ImportJob, Imported, checked_weight, layer_weights, torch_file

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
            saved = torch_file(path)  # mapped: tensors read where used, one at a time
    except Exception as e:  # noqa: BLE001 -- truncated files and foreign pickles raise many kinds
        raise ImportModelError(
            f"{path} is unreadable as a fairseq checkpoint: {type(e).__name__}: "
            f"{(str(e).splitlines() or [''])[0][:200]}"
        ) from None
    if not isinstance(saved, dict) or not isinstance(saved.get("model"), dict):
        raise ImportModelError(f"{path}: holds no model state ('model')")
    if "cfg" not in saved and "args" not in saved and {"config", "update"} <= set(saved):
        raise ImportModelError(
            f"{path} is a checkpoint of s2s, not of fairseq: its run directory is a run as it "
            "is (s2s generate RUN_DIR --input FILE); import reads models trained elsewhere"
        )
    cfg = saved.get("cfg") or {}
    cfg = cfg if isinstance(cfg, dict) else {}
    args = cfg.get("model")
    args = args if args is not None else saved.get("args")
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    if not isinstance(args, dict):
        raise ImportModelError(f"{path}: holds no model configuration ('cfg' or 'args')")
    task = Fields(f"{path}: task", cfg.get("task") if isinstance(cfg.get("task"), dict) else args)
    src_lang = job.src_lang or task.str("source_lang", None)
    tgt_lang = job.tgt_lang or task.str("target_lang", None)
    if not src_lang or not tgt_lang:
        raise ImportModelError(
            f"{path}: the languages are not recorded (task.source_lang, target_lang): give "
            "--src-lang and --tgt-lang"
        )
    folder = path.parent
    codes_file = next((folder / n for n in BPE_CODES if (folder / n).is_file()), None)
    bpe = cfg.get("bpe") if isinstance(cfg.get("bpe"), dict) else {}
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
        codes = _bpe_codes(codes_file)
        src_vocab, tgt_vocab = (
            MosesBPE.of_fairseq(lang, codes, read_fairseq_dictionary(f))
            for lang, f in zip((src_lang, tgt_lang), dict_files)
        )
    except (DataError, OSError, UnicodeDecodeError) as e:
        raise ImportModelError(str(e)) from None
    except Exception as e:  # noqa: BLE001 -- subword-nmt's errors on codes it cannot use
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


def _bpe_codes(path: Path) -> str:
    """subword-nmt's codes file checked as subword-nmt's BPE reads it (an optional "#version:
    X.Y" line, then two symbols a line up to the last line), so that a malformed line is one line
    naming the file and the line, not subword-nmt's own exit (two lines on stderr, then the
    process ends)."""
    text = path.read_text(encoding="utf-8")
    first, _, rest = text.partition("\n")
    offset, body = 1, text
    if first.startswith("#version:"):
        version = first.split()[-1].split(".")
        if not all(part.isdigit() for part in version):
            raise ImportModelError(f"{path}, line 1: {first[:40]!r} is no version number")
        offset, body = 2, rest
    for number, line in enumerate(body.rstrip("\n").split("\n"), offset):
        if len(line.strip("\r\n ").split(" ")) != 2:
            raise ImportModelError(
                f"{path}, line {number}: {line[:40]!r} is not two symbols separated by a space: "
                "not subword-nmt BPE codes"
            )
    return text


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

    f = Fields(f"{path}: args", args)  # the one reader of the checkpoint's values

    def same(a, b, read=lambda key: f.int(key, minimum=1)):
        if read(a) != read(b):
            raise ImportModelError(
                f"{path}: {a}={read(a)} but {b}={read(b)}: s2s's stacks are alike"
            )
        return read(a)

    d = same("encoder_embed_dim", "decoder_embed_dim")
    if f.int("decoder_output_dim", d) != d or f.int("decoder_input_dim", d) != d:
        raise ImportModelError(f"{path}: decoder_input_dim / decoder_output_dim other than {d}")
    pre_norm = same(
        "encoder_normalize_before", "decoder_normalize_before", lambda k: f.bool(k, False)
    )
    share_all = f.bool("share_all_embeddings", False)
    if (src_vocab.id_space == tgt_vocab.id_space) != share_all:
        raise ImportModelError(
            f"{path}: share_all_embeddings={share_all} with "
            f"{'one' if src_vocab.id_space == tgt_vocab.id_space else 'two'} dictionaries: "
            "s2s shares embeddings exactly when the dictionaries are one"
        )
    max_positions = min(
        f.int("max_source_positions", 1024, minimum=2),
        f.int("max_target_positions", 1024, minimum=2),
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
            "layers": same("encoder_layers", "decoder_layers"),
            "d_model": d,
            "d_ff": same("encoder_ffn_embed_dim", "decoder_ffn_embed_dim"),
            "heads": same("encoder_attention_heads", "decoder_attention_heads"),
            "dropout": f.float("dropout", 0.1, minimum=0.0),
            "attention_dropout": f.float("attention_dropout", 0.0, minimum=0.0),
            "pre_norm": bool(pre_norm),
            "max_positions": max_positions,
            "positions": "learned",  # fairseq's own sinusoids, as a table (offset_sinusoids)
            "activation": "relu",
            "output_bias": True,  # zero but s2s's BOS row: -inf
            "output_bias_fixed": True,  # as the source keeps it: never trained
            "tie_output": share_all or f.bool("share_decoder_input_output_embed", False),
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


def _fairseq_state(model, w, args, src_vocab, tgt_vocab, path) -> dict:
    """fairseq's Transformer weights under s2s's names, rows in s2s's id order (BOS: a copy of
    </s>'s row, the decoder's start)."""
    taken = set()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}

    def get(name, shape):
        if name not in w:
            raise ImportModelError(f"{path}: {name!r} is missing")
        taken.add(name)
        return checked_weight(path, name, w[name], shape)

    def rows(name, vocab):
        table = w.get(name)
        if isinstance(table, torch.Tensor) and table.dim() == 2 and table.size(0) != len(vocab) - 1:
            raise ImportModelError(
                f"{path}: {name!r} has {table.size(0)} rows but its dictionary "
                f"{len(vocab) - 1} tokens"
            )
        table = get(name, (len(vocab) - 1, model.d_model))
        index = torch.tensor([i if i >= 0 else 2 for i in vocab.source_ids])  # BOS: </s>'s
        return table[index]  # indexing copies

    state = {}

    def linear(ours, theirs):
        state[f"{ours}.weight"] = get(f"{theirs}.weight", shapes[f"{ours}.weight"])
        state[f"{ours}.bias"] = get(f"{theirs}.bias", shapes[f"{ours}.bias"])

    state["src_embed.weight"] = rows("encoder.embed_tokens.weight", src_vocab)
    state["tgt_embed.weight"] = rows("decoder.embed_tokens.weight", tgt_vocab)
    for ours, theirs, _ in layer_weights(model):
        linear(ours, theirs)
    if model.encoder[0].res1.pre_norm:
        linear("enc_norm", "encoder.layer_norm")
        linear("dec_norm", "decoder.layer_norm")
    if model.out.weight is model.tgt_embed.weight:
        state["out.weight"] = state["tgt_embed.weight"]
        taken.add("decoder.output_projection.weight")
    else:
        state["out.weight"] = rows("decoder.output_projection.weight", tgt_vocab)
    state["out.bias"] = torch.zeros(len(tgt_vocab))
    state["out.bias"][BOS] = -torch.inf  # a copy of </s> as input; never written
    state["pos_embed.weight"] = offset_sinusoids(model.max_positions, model.d_model)
    skipped = {k for k in w if k.endswith(("embed_positions._float_tensor", ".version"))}
    left = sorted(set(w) - taken - skipped)
    if left:
        raise ImportModelError(f"{path}: {left[0]!r} has no place in the Transformer s2s imports")
    return state
