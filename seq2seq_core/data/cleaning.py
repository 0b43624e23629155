"""Cleaning of training pairs: each rule drops pairs and counts what it dropped, never silently.

Rules on the text, chosen by `data.clean`: `empty` (a side is empty once stripped), `same` (the
source equals the target, a copied or untranslated line), `duplicate` (the pair was seen before in
its shard: shards stay independent of each other, so a pair repeated in two shards is kept
twice). Rules on the tokens, always on: `max_len` (a side longer than `data.max_len` tokens with
its </s>) and `len_ratio` (the longer side over `data.max_len_ratio` times the shorter; 0: off).
A pair dropped by several rules counts under the first, in the order of `RULES`. Dev and test
splits are never cleaned: they are what the run is scored on.

No language-identification rule: none of the well-kept libraries for it (fastText's lid model,
langid, lingua) is a dependency of s2s.
"""

from __future__ import annotations

import numpy as np

from ..setup.settings import CLEAN_RULES

#: every rule in the order a pair is checked (and counted)
RULES = (*CLEAN_RULES, "max_len", "len_ratio")


class Cleaner:
    """The rules of a data section applied chunk by chunk to one shard; `dropped` counts them."""

    def __init__(self, data_cfg):
        self.rules = set(data_cfg.get("clean") or ())
        self.max_len = data_cfg["max_len"]
        self.ratio = data_cfg["max_len_ratio"]
        self.dropped = dict.fromkeys(RULES, 0)
        self._seen: set = set()

    def text(self, srcs: list[str], tgts: list[str]) -> np.ndarray:
        """Which pairs of a chunk the text rules keep."""
        keep = np.ones(len(srcs), bool)
        if not self.rules:
            return keep
        for j, (s, t) in enumerate(zip(srcs, tgts)):
            if "empty" in self.rules and not (s.strip() and t.strip()):
                rule = "empty"
            elif "same" in self.rules and s.strip() == t.strip():
                rule = "same"
            elif "duplicate" in self.rules and (h := hash((s, t))) in self._seen:
                rule = "duplicate"
            else:
                if "duplicate" in self.rules:
                    self._seen.add(h)
                continue
            keep[j] = False
            self.dropped[rule] += 1
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
        return keep


def summary(dropped: dict) -> str:
    """'12 dropped (duplicate 10, same 2)', or 'none dropped'."""
    total = sum(dropped.values())
    if not total:
        return "none dropped"
    return f"{total} dropped ({', '.join(f'{k} {v}' for k, v in dropped.items() if v)})"
