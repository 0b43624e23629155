"""Batches of a prepared split: pairs packed by padded size (`token_batches`, the paper's ~25k
source + ~25k target tokens a batch), an epoch's batches in training order (`epoch_batches`), and
fixed-size chunks of any sequence (`chunks`: the sentences decoded together)."""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from .cache import Split


def token_batches(
    src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int, shuffle: bool = True
) -> list[np.ndarray]:
    """Index arrays of batches whose padded source and target sizes stay within max_tokens.

    Pairs are sorted by (target, source) length, ties broken at random, packed greedily in that
    order, and the batches shuffled; with the same seed the batches are the same.
    """
    n = len(src_lens)
    rng = np.random.default_rng(seed)
    # int32 indices below 2^31 pairs: half the memory of the epoch's order (a 36M-pair corpus:
    # 144 MB, which every batch is a view of), the same draws
    index = np.int32 if n < 2**31 else np.int64
    order = (rng.permutation(n) if shuffle else np.arange(n)).astype(index)
    order = order[np.lexsort((src_lens[order], tgt_lens[order]))]
    s_sorted, t_sorted = src_lens[order], tgt_lens[order]
    # A batch is the longest run from `start` whose size times its longest source and target
    # stays within max_tokens (at least one pair). Targets are sorted, so the run is shorter than
    # max_tokens // (its first target length) + 1: only that window is looked at.
    count = np.arange(1, max_tokens + 2)
    batches, start = [], 0
    while start < n:
        end = min(n, start + max_tokens // max(1, int(t_sorted[start])) + 1)
        ok = (np.maximum.accumulate(s_sorted[start:end]) * count[: end - start] <= max_tokens) & (
            np.maximum.accumulate(t_sorted[start:end]) * count[: end - start] <= max_tokens
        )
        size = max(1, int(ok.argmin()) if not ok.all() else end - start)
        batches.append(order[start : start + size])
        start += size
    if shuffle:
        rng.shuffle(batches)
    return batches


class Taken(np.ndarray):
    """A training batch's indices, with the epoch they were taken in (`taken`): what a pair's
    augmentation is seeded with (`s2s.core.data.augment`)."""

    def __array_finalize__(self, obj):
        self.epoch = getattr(obj, "epoch", None)


def taken(indices: np.ndarray, epoch: int) -> Taken:
    out = np.asarray(indices).view(Taken)
    out.epoch = epoch
    return out


def epoch_batches(split: Split, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Every batch of `epoch`, in the order training takes them: one list, the same for any
    number of processes (`s2s.core.training.schedule.Stream` shares each update's batches out)."""
    return token_batches(split.src_lens, split.tgt_lens, max_tokens, seed=seed * 1_000_003 + epoch)


def chunks(items: Sequence, size: int) -> Iterator[Sequence]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
