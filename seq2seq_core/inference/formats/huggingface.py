"""Hugging Face: a run s2s trained as a `transformers` MarianMTModel with a
PreTrainedTokenizerFast over the task's `tokenizers` vocabulary (`s2s export --to huggingface`),
and such an export imported back as the run again (`read_export`, `s2s import`).

Marian lays sinusoids out as [sin | cos] halves where we interleave them (PE(pos, 2i) = sin,
PE(pos, 2i+1) = cos); the export permutes the d_model dimensions of every weight by the same fixed
permutation (`common.permutation`: even dimensions first, then odd), which is exact because layer
norms, attention and the tied output projection are equivariant under it. Marian computes its
position table itself (in float64, then rounded), which differs from our float32 one by up to
3e-5 at position 1023. Marian has no pre-norm form, no learned positions and heads of d_model /
heads dimensions only: model.pre_norm=true, model.positions=learned and model.d_k / model.d_v
other than that are refused. An imported OPUS-MT model goes back in its own form (`marian`).
"""

from __future__ import annotations

from pathlib import Path

from ...tokenizers import BOS, EOS, PAD, SPECIALS, UNK
from ...errors import DataError, ImportModelError
from ...files import sha256
from ...nn.model import Transformer
from .common import (
    MARKER,
    Imported,
    from_marian_state,
    read_json,
    read_weights,
    save_marian_model,
    shown,
    tokenizers_of,
)


def to_huggingface(model: Transformer, cfg, task, out: Path) -> None:
    """A MarianMTModel (config.json, model.safetensors, generation_config.json) in s2s's own ids,
    and its tokenizer (tokenizer.json; target_tokenizer/ for a separate target vocabulary)."""
    orders = (list(range(task.src_vocab_size)), list(range(task.tgt_vocab_size)))
    save_marian_model(model, cfg, task, out, orders, (PAD, BOS, EOS))
    src, tgt = tokenizers_of(task)
    hf_tokenizer(src, source=True).save_pretrained(str(out))
    if not task.shared_vocab:
        hf_tokenizer(tgt, source=False).save_pretrained(str(out / "target_tokenizer"))


def hf_tokenizer(tokenizer, source: bool):
    """A PreTrainedTokenizerFast over a copy of the task's tokenizer; the source one appends
    </s> as the engine does, and neither splits specials out of text (the engine does not)."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(tokenizer.to_str())
    if source:
        tok.post_processor = processors.TemplateProcessing(
            single=f"$A {SPECIALS[EOS]}", special_tokens=[(SPECIALS[EOS], EOS)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIALS[PAD],
        bos_token=SPECIALS[BOS],
        eos_token=SPECIALS[EOS],
        unk_token=SPECIALS[UNK],
        split_special_tokens=True,
    )


def _same(vocab) -> list[int]:
    """Each id's row in an export of s2s's own: itself."""
    return list(range(len(vocab)))


def read_export(folder: Path) -> Imported:
    """An `s2s export --to huggingface` of a run s2s trained: the MarianMTModel in s2s's own
    ids, its `tokenizers` vocabulary (tokenizer.json; target_tokenizer/ for a separate target
    one), and the run's task, model and decode sections, which the export's s2s_export.json
    keeps: the run again, every weight bit for bit."""
    from ...tokenizers.subwords import Subwords

    marker = read_json(folder / MARKER)
    saved = marker.get("config")
    if marker.get("format") != "huggingface" or not isinstance(saved, dict):
        raise ImportModelError(
            f"{folder / MARKER}: not a Hugging Face export of s2s (format "
            f"{marker.get('format')!r}); import the folder `s2s export --to huggingface` wrote"
        )
    for key in ("task", "model", "decode"):
        if not isinstance(saved.get(key), dict):
            raise ImportModelError(
                f"{folder / MARKER}: config.{key} is {shown(saved.get(key))}, not the run's "
                f"{key} section (a JSON object)"
            )
    task = saved["task"]
    if task.get("name") != "translation" or task.get("tokenizer") not in ("bpe", "wordpiece"):
        raise ImportModelError(
            f"{folder / MARKER}: an export of task {task.get('name')!r} (tokenizer "
            f"{task.get('tokenizer')!r}); s2s imports back exports of translation's subword "
            "vocabularies (bpe, wordpiece)"
        )
    if not (folder / "tokenizer.json").is_file():
        raise ImportModelError(f"{folder / 'tokenizer.json'} is missing: the export's vocabulary")
    try:
        src = Subwords.load(folder / "tokenizer.json")
        target = folder / "target_tokenizer" / "tokenizer.json"
        tgt = Subwords.load(target) if target.is_file() else src
    except DataError as e:
        raise ImportModelError(
            f"{e}: s2s imports back exports of subword vocabularies (translation)"
        ) from None
    weights_file, weights = read_weights(folder)
    config = {k: dict(saved[k]) for k in ("task", "model", "decode")}
    files = [folder / "config.json", weights_file, folder / "tokenizer.json", folder / MARKER]
    origin = {
        "format": "s2s-huggingface",
        "source": str(folder),
        "revision": "",
        "files": {f.name: sha256(f) for f in files},
    }
    return Imported(
        config,
        origin,
        src,
        tgt,
        lambda model: from_marian_state(model, weights, _same(src), _same(tgt), weights_file),
        weights_file,
        folder / "config.json",
    )
