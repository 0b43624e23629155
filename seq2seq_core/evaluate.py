"""Evaluation: validation loss, and turning source lines into the task's output lines.

`translate` is what `s2s generate`, validation and test evaluation share: encode the sources,
decode them in batches of similar length with the task's defaults (overridden by the decode
section), turn ids back into text and apply the task's post-processing.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields, replace
from typing import Sequence

import numpy as np
import torch

from .data import Split, chunks, token_batches
from .decoding import generate
from .task import DecodeDefaults, Task
from .vocab import EOS, PAD


def decode_settings(task: Task, decode_cfg) -> DecodeDefaults:
    """The task's decoding defaults with any field the decode section sets."""
    chosen = {f.name: getattr(decode_cfg, f.name) for f in fields(DecodeDefaults)}
    return replace(task.decoding, **{k: v for k, v in chosen.items() if v is not None})


@torch.no_grad()
def valid_loss(model, split: Split, max_tokens: int, eps: float, device, autocast) -> dict:
    """Label-smoothed loss and NLL per target token on a whole split (no dropout)."""
    was_training = model.training
    model.eval()
    loss_sum = nll_sum = 0.0
    ntokens = 0
    for idx in token_batches(split.src_lens, split.tgt_lens, max_tokens, seed=0, shuffle=False):
        b = split.batch(idx)
        with autocast():
            loss, nll = model(b["src"].to(device), b["tgt_in"].to(device), b["tgt_out"].to(device), eps)
        loss_sum += loss.item()
        nll_sum += nll.item()
        ntokens += b["ntokens"]
    model.train(was_training)
    return {"loss": loss_sum / ntokens, "nll": nll_sum / ntokens, "ppl": float(np.exp(nll_sum / ntokens))}


def source_batch(ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Source rows as the model takes them: ids + EOS, right-padded with PAD, [B, S]."""
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD, dtype=torch.long)
    for row, seq in enumerate(ids):
        src[row, :len(seq) + 1] = torch.tensor(list(seq) + [EOS])
    return src


@torch.no_grad()
def translate(model, task: Task, sources: Sequence[str], settings: DecodeDefaults, device,
              max_sentences: int = 128, progress=None) -> list[str]:
    """The task's output line for every source line, in input order.

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
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)

    def search(batch: list[int]) -> list[str]:
        src = source_batch([ids[i] for i in batch])
        hyps = generate(model, src.to(device), beam=settings.beam, alpha=settings.alpha,
                        max_len_a=settings.max_len_a, max_len_b=settings.max_len_b, stop=settings.stop,
                        constraint=task.constraint([sources[i] for i in batch]))
        return [task.postprocess(task.decode_target(h.tokens), sources[i]) for i, h in zip(batch, hyps)]

    batches = list(chunks(order, max_sentences))
    threads = torch.get_num_threads()
    workers = min(threads, len(batches)) if torch.device(device).type == "cpu" else 1
    try:
        if workers > 1:
            torch.set_num_threads(1)
        with ThreadPoolExecutor(workers) as pool:
            for batch, lines in zip(batches, pool.map(search, batches)):
                for i, line in zip(batch, lines):
                    out[i] = line
                if progress is not None:
                    progress.update(len(batch))
    finally:
        if workers > 1:
            torch.set_num_threads(threads)
        model.train(was_training)
    return out
