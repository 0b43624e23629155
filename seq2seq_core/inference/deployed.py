"""Decoding with an exported model (CTranslate2, Hugging Face) the way `s2s generate` does.

With the task's settings and `s2s generate`'s per-sentence maximum length int(a*|x| + b) (|x|
with its EOS), its fewest tokens (decode.min_len: fairseq's 1), its ending at the maximum
length (decode.stop=transformers takes one more token there, as transformers' `generate`), PAD
and BOS never generated, and a multilingual import's languages (the source's code starts the
source, the target's is forced as the first output: CTranslate2's target_prefix). Greedy search
gives the same tokens as `s2s generate --beam 1`; beam search in those tools scores hypotheses
with their own length penalty and stopping rule (and CTranslate2 scores a target prefix's
tokens, s2s scores the forced code 0), so beam outputs may differ. docs/export.md shows both in
use.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch

from ..decode.batched import Decoder
from ..decode.search import sentences_per_batch
from ..tokenizers import BOS, EOS, PAD, SPECIALS
from ..tokenizers.pieces import Pieces, choose_languages, start_ids
from .formats.common import task_tokens


def decode_ctranslate2(
    translator,
    like: Decoder,
    sources: Sequence[str],
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> list[list[int]]:
    """Target ids (no specials; a multilingual model's start with the target's code, as `s2s
    generate`'s) for each source line, decoded by a ctranslate2.Translator over an export as
    `like` decodes: its task, its settings (beam, length penalty, length limits), its batch size
    and `s2s generate`'s maximum lengths, within its model's positions; with `src_lang` /
    `tgt_lang` (a multilingual import's language names, as --src-lang / --tgt-lang take them) in
    that direction instead of the task's own, so that one export serves every direction. One
    batch decodes to its longest sentence's limit; greedy search is prefix-consistent, so
    cutting each sentence at its own limit gives what a search with that limit gives."""
    task, settings, max_positions = like.task, like.settings, like.model.max_positions
    max_batch_size = sentences_per_batch(like.max_sentences, like.device)
    src_tokens, tgt_tokens = task_tokens(task)
    tgt_ids = {t: i for i, t in enumerate(tgt_tokens)}
    with languages(task, src_lang, tgt_lang):
        ids = task.encode_source(list(sources))  # a multilingual model's: its code first
        prefix = [tgt_tokens[t] for t in start_ids(task)]  # the target's code, or none
    # at the maximum length s2s ends with EOS, or (stop=transformers) takes one more token there
    extra = 1 if settings.stop == "transformers" else 0
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[list[int]] = [[] for _ in ids]
    for start in range(0, len(order), max_batch_size):
        batch = order[start : start + max_batch_size]
        limits = [max_len(len(ids[i]) + 1, settings, max_positions) + extra for i in batch]
        results = translator.translate_batch(
            [[src_tokens[t] for t in ids[i]] for i in batch],
            target_prefix=[prefix] * len(batch) if prefix else None,
            beam_size=settings.beam,
            length_penalty=settings.alpha,
            max_decoding_length=max(limits) + 1,
            min_decoding_length=settings.min_len,
            max_input_length=0,
            suppress_sequences=[[SPECIALS[PAD]], [SPECIALS[BOS]]],
        )
        for i, limit, r in zip(batch, limits, results):
            out[i] = [tgt_ids[t] for t in r.hypotheses[0]][:limit]
    return out


@contextmanager
def languages(task, src_lang: str | None = None, tgt_lang: str | None = None):
    """`task` decoding from `src_lang` into `tgt_lang` (None: its own) for the `with` block,
    its own languages again after it; a name the model lacks is one ConfigError naming the
    nearest (`choose_languages`)."""
    own = getattr(task, "task", task)  # a run's member serves as its task
    sides = [v for v in (own.src_vocab, own.tgt_vocab) if isinstance(v, Pieces)]
    before = [v.lang for v in sides]
    try:
        choose_languages([own], src_lang or "", tgt_lang or "")
        yield task
    finally:
        for vocab, lang in zip(sides, before):
            vocab.lang = lang


def max_len(src_len: int, settings, max_positions: int | None = None) -> int:
    """The engine's maximum output length for a source of src_len tokens (EOS included)."""
    n = int(settings.max_len_a * src_len + settings.max_len_b)
    return max(0, n if max_positions is None else min(n, max_positions - 1))


def decode_huggingface(
    hf_model, task, sources: Sequence[str], settings, max_batch_size: int = 64
) -> list[list[int]]:
    """Target ids (no specials) for each source line, greedy, with `s2s generate`'s maximum
    lengths (a batch decodes to its longest limit; each sentence is cut at its own)."""
    ids = task.encode_source(list(sources))
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[list[int]] = [[] for _ in ids]
    positions = hf_model.config.max_position_embeddings
    for start in range(0, len(order), max_batch_size):
        batch = order[start : start + max_batch_size]
        limits = [max_len(len(ids[i]) + 1, settings, positions) for i in batch]
        width = max(len(ids[i]) for i in batch) + 1
        src = torch.full((len(batch), width), PAD, dtype=torch.long)
        for row, i in enumerate(batch):
            src[row, : len(ids[i]) + 1] = torch.tensor(ids[i] + [EOS])
        with torch.inference_mode():
            gen = hf_model.generate(
                input_ids=src,
                attention_mask=src.ne(PAD),
                num_beams=1,
                do_sample=False,
                max_length=max(limits) + 2,
                min_length=0,
            )  # the start token counts
        for i, limit, row in zip(batch, limits, gen.tolist()):
            hyp = row[1:]
            hyp = hyp[: hyp.index(EOS)] if EOS in hyp else hyp
            out[i] = [t for t in hyp if t != PAD][:limit]
    return out
