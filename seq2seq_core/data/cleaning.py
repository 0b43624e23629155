"""Cleaning of training pairs: each rule drops pairs and counts what it dropped, never silently.

Rules on the text, chosen by `data.clean`: `empty` (a side is empty once stripped), `same` (the
source equals the target, a copied or untranslated line), `duplicate` (the pair was seen before in
its shard). Rules on the tokens, always on: `max_len` (a side longer than `data.max_len` tokens with
its </s>) and `len_ratio` (the longer side over `data.max_len_ratio` times the shorter; 0: off).
A pair dropped by several rules counts under the first, in the order of `RULES`. Dev and test
splits are never cleaned: they are what the run is scored on.

Shards are binarised independently of each other (so that one can be added or replaced alone),
so `duplicate` has a second, cheap step once they are all there (`across_shards`): each shard
keeps the sorted 64-bit hashes of the pairs it kept (`{shard}.hash.npy`), and the pairs of a
shard whose hash an earlier shard holds are listed in `{shard}.dup.npy`, which training skips;
they count as `duplicate_across_shards`. Memory holds two shards' hashes at a time, never the
corpus's. A shard's list depends only on the shards up to it: appending shards computes only
theirs. Two different pairs share a 64-bit hash with a chance of about n^2 / 2^65 in a corpus
of n pairs (3e-5 for 36M): then one of them is dropped.

No language-identification rule: none of the well-kept libraries for it (fastText's lid model,
langid, lingua) is a dependency of s2s.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..setup.settings import CLEAN_RULES

#: every rule in the order a pair is checked (and counted)
RULES = (*CLEAN_RULES, "max_len", "len_ratio", "duplicate_across_shards")


def pair_hashes(srcs: list[str], tgts: list[str]) -> np.ndarray:
    """A 64-bit hash of each (source, target) pair, the same in every process and run."""
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(f"{len(s)}:{s}{t}".encode(), digest_size=8).digest(), "little"
            )
            for s, t in zip(srcs, tgts)
        ),
        np.uint64,
        len(srcs),
    )


class Cleaner:
    """The rules of a data section applied to one shard, chunk by chunk (`text`, then `lengths`);
    `dropped` counts them, `hashes` are the kept pairs' (with `duplicate`, else None)."""

    def __init__(self, data_cfg):
        self.rules = set(data_cfg.get("clean") or ())
        self.max_len = data_cfg["max_len"]
        self.ratio = data_cfg["max_len_ratio"]
        self.dropped = dict.fromkeys(RULES, 0)
        self._seen: set = set()
        self._kept: list[np.ndarray] | None = [] if "duplicate" in self.rules else None
        self._chunk: np.ndarray | None = None  # the hashes of the pairs `text` kept

    def text(self, srcs: list[str], tgts: list[str]) -> np.ndarray:
        """Which pairs of a chunk the text rules keep."""
        keep = np.ones(len(srcs), bool)
        if not self.rules:
            return keep
        hashes = pair_hashes(srcs, tgts) if self._kept is not None else None
        for j, (s, t) in enumerate(zip(srcs, tgts)):
            if "empty" in self.rules and not (s.strip() and t.strip()):
                rule = "empty"
            elif "same" in self.rules and s.strip() == t.strip():
                rule = "same"
            elif hashes is not None and (h := int(hashes[j])) in self._seen:
                rule = "duplicate"
            else:
                if hashes is not None:
                    self._seen.add(h)
                continue
            keep[j] = False
            self.dropped[rule] += 1
        self._chunk = None if hashes is None else hashes[keep]
        return keep

    def lengths(self, ls: np.ndarray, lt: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """`keep` narrowed by the token rules (lengths with </s>), each counted."""
        long = keep & ((ls > self.max_len) | (lt > self.max_len))
        self.dropped["max_len"] += int(long.sum())
        keep = keep & ~long
        if self.ratio:
            skewed = keep & (np.maximum(ls, lt) / np.minimum(ls, lt) > self.ratio)
            self.dropped["len_ratio"] += int(skewed.sum())
            keep = keep & ~skewed
        if self._kept is not None:
            self._kept.append(self._chunk[keep])
        return keep

    @property
    def hashes(self) -> np.ndarray | None:
        """The hashes of the pairs kept so far, in their order (None: no `duplicate` rule)."""
        return None if self._kept is None else np.concatenate([np.zeros(0, np.uint64), *self._kept])


def save_hashes(path: str | Path, hashes: np.ndarray) -> None:
    """A shard's hashes as `across_shards` reads them: row 0 sorted, row 1 each one's pair."""
    order = np.argsort(hashes, kind="stable")
    np.save(path, np.stack([hashes[order], order.astype(np.uint64)]))


def across_shards(folder: Path, names: list[str], start: int) -> list[int]:
    """Write `{name}.dup.npy` for each shard of `names[start:]` in `folder`: its pairs (indices,
    sorted) whose hash an earlier shard of `names` holds. Returns how many each one has."""
    counts = []
    for k in range(start, len(names)):
        hashes, at = np.load(folder / f"{names[k]}.hash.npy")
        seen = np.zeros(len(hashes), bool)
        for earlier in names[:k]:
            other = np.load(folder / f"{earlier}.hash.npy", mmap_mode="r")[0]
            if len(other) and len(hashes):
                i = np.minimum(np.searchsorted(other, hashes), len(other) - 1)
                seen |= other[i] == hashes
        repeated = np.sort(at[seen]).astype(np.int64)
        np.save(folder / f"{names[k]}.dup.npy", repeated)
        counts.append(len(repeated))
    return counts


def summary(dropped: dict) -> str:
    """'12 dropped (duplicate 10, same 2)', or 'none dropped'."""
    total = sum(dropped.values())
    if not total:
        return "none dropped"
    return f"{total} dropped ({', '.join(f'{k} {v}' for k, v in dropped.items() if v)})"
