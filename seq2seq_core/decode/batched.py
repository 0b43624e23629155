"""Batched decoding, shared by validation, the test at the end of a run, `s2s generate` and the
server: source lines encoded by the task, searched in batches of similar length, decoded back to
text (`hypotheses`), post-processed (`decode_sources`). Input typed by a person goes through the
task's `prepare_source` first (`prepared_sources`); words the vocabulary lacks are named
(`unknown_words`).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import torch

from ..data.prepared import chunks
from ..errors import plugin_error
from ..task import DecodeDefaults, Task
from ..vocab import EOS, PAD, UNK
from .search import search, sentences_per_batch

log = logging.getLogger("s2s")


def source_batch(ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Source rows as the model takes them: ids + EOS, right-padded with PAD, [B, S]."""
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD, dtype=torch.long)
    for row, seq in enumerate(ids):
        src[row, : len(seq) + 1] = torch.tensor(list(seq) + [EOS])
    return src


def prepared_sources(task: Task, lines: Sequence[str]) -> list[str]:
    """Input lines as the task's sources (`Task.prepare_source`: parsing tokenises raw text);
    `task` is a task or a run's member, which serves as one."""
    out = task.prepare_source(list(lines))
    if (
        not isinstance(out, list)
        or len(out) != len(lines)
        or not all(isinstance(x, str) for x in out)
    ):
        raise plugin_error(
            task,
            "prepare_source",
            f"returned {type(out).__name__}, not a list of {len(lines)} str (one a line)",
        )
    return out


def unknown_words(task: Task, source: str, ids: Sequence[int]) -> list[str]:
    """The words of a (prepared) source line that its ids `ids` read as <unk>: the vocabulary
    never saw them, so the model cannot know what they mean."""
    if UNK not in ids:
        return []
    return [w for w in dict.fromkeys(source.split()) if UNK in task.encode_source([w])[0]]


def decode_sources(
    model,
    task: Task,
    sources: Sequence[str],
    settings: DecodeDefaults,
    device,
    max_sentences: int = 0,
    progress=None,
    raw: bool = False,
) -> list[str]:
    """The task's output line for every source line, in input order: `hypotheses`, post-processed.
    `raw`: the lines are input as a person types it (`s2s generate`, the server), made into
    sources first (`prepared_sources`); else they are sources already (a split's, say)."""
    sources = prepared_sources(task, sources) if raw else sources
    hyps = hypotheses(model, task, sources, settings, device, max_sentences, progress)
    out = [task.postprocess(h, s) for h, s in zip(hyps, sources)]
    for line in out:
        if not isinstance(line, str):
            raise plugin_error(task, "postprocess", f"returned {type(line).__name__}, not a str")
    return out


@torch.no_grad()
def hypotheses(
    model,
    task: Task,
    sources: Sequence[str],
    settings: DecodeDefaults,
    device,
    max_sentences: int = 0,
    progress=None,
) -> list[str]:
    """The decoded target string (before post-processing) for every source line, in input order.

    On a CPU with n > 1 intra-op threads, n batches are searched at once, each on one thread:
    a step's operations are small (a few hundred rows), and splitting each of them over threads
    pays a synchronisation per operation that independent batches do not. On a GPU batches go
    one after the other.
    """
    if not sources:
        return []
    was_training = model.training
    model.eval()
    ids = task.encode_source(list(sources))
    if not hasattr(ids, "__len__") or len(ids) != len(sources):
        got = f"{len(ids)} id lists" if hasattr(ids, "__len__") else type(ids).__name__
        raise plugin_error(
            task,
            "encode_source",
            f"returned {got} for {len(sources)} lines, not one id list a line",
        )
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)

    def search_batch(batch: list[int]) -> list[str]:
        src = source_batch([ids[i] for i in batch])
        hyps = search(
            model,
            src.to(device),
            beam=settings.beam,
            alpha=settings.alpha,
            max_len_a=settings.max_len_a,
            max_len_b=settings.max_len_b,
            stop=settings.stop,
            constraint=task.constraint([sources[i] for i in batch]),
        )
        lines = [task.decode_target(h.tokens) for h in hyps]
        for line in lines:
            if not isinstance(line, str):
                raise plugin_error(
                    task, "decode_target", f"returned {type(line).__name__}, not a str"
                )
        return lines

    batches = list(chunks(order, sentences_per_batch(max_sentences, device)))
    threads = torch.get_num_threads()
    workers = min(threads, len(batches)) if torch.device(device).type == "cpu" else 1
    try:
        if workers > 1:
            torch.set_num_threads(1)
        with ThreadPoolExecutor(workers) as pool:
            for batch, lines in zip(batches, pool.map(search_batch, batches)):
                for i, line in zip(batch, lines):
                    out[i] = line
                if progress is not None:
                    progress.update(len(batch))
    finally:
        torch.set_num_threads(threads)
        model.train(was_training)
    return out
