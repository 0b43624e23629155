"""Noise on the source side of training pairs, applied on the fly as batches are built.

Three kinds, each with its probability in the data section: `augment_case` (the source written
all upper case or all lower case, equally likely), `augment_punct` (its punctuation removed),
`augment_typos` (each word of three characters or more given one typo: two neighbouring
characters swapped, one dropped, or one doubled). The model learns to read such input; targets
are never touched, so it still writes well-formed text.

What happens to a pair follows from (run.seed, the epoch, the pair's index in its split) alone:
not from the process, the update or the batch it lands in. So a resumed run, with any number of
processes, sees exactly the sources the unbroken run saw, and each epoch the same pair is noised
anew. A source is decoded to text with the task's source vocabulary, noised, and encoded again;
one that would grow beyond data.max_len tokens stays as it was.
"""

from __future__ import annotations

import random
import unicodedata

import numpy as np

from ..tokenizers import EOS

KINDS = ("augment_case", "augment_punct", "augment_typos")


class Augment:
    """The source noise of a data section, for one task (its vocabulary decodes and encodes)."""

    def __init__(self, data_cfg, seed: int):
        self.case = float(data_cfg.augment_case)
        self.punct = float(data_cfg.augment_punct)
        self.typos = float(data_cfg.augment_typos)
        self.max_len = int(data_cfg.max_len)
        self.seed = int(seed)

    @classmethod
    def of(cls, data_cfg, seed: int) -> "Augment | None":
        """The data section's noise, or None when it asks for none."""
        if not any(data_cfg.get(k) for k in KINDS):
            return None
        return cls(data_cfg, seed)

    def rng(self, epoch: int, index: int) -> random.Random:
        return random.Random((self.seed * 1_000_003 + epoch) * 2**40 + int(index))

    def text(self, line: str, rng: random.Random) -> str:
        """`line` with noise drawn from `rng` (always the same draws, so each kind's choice is
        independent of the others' probabilities)."""
        case, punct = rng.random(), rng.random()
        if punct < self.punct:
            line = "".join(c for c in line if not unicodedata.category(c).startswith("P"))
            line = " ".join(line.split())
        if self.typos > 0:
            line = " ".join(self._typo(w, rng) for w in line.split(" "))
        if case < self.case:
            line = line.upper() if rng.random() < 0.5 else line.lower()
        return line

    def _typo(self, word: str, rng: random.Random) -> str:
        if len(word) < 3 or rng.random() >= self.typos:
            return word
        i = rng.randrange(len(word) - 1)
        kind = rng.randrange(3)
        if kind == 0:  # neighbours swapped
            return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
        if kind == 1:  # one dropped
            return word[:i] + word[i + 1 :]
        return word[: i + 1] + word[i:]  # one doubled

    def sources(self, task, srcs: list[np.ndarray], indices, epoch: int) -> list[np.ndarray]:
        """The source ids (each ending with EOS) of the pairs `indices` in `epoch`, noised."""
        out = list(srcs)
        lines, where = [], []
        for j, (ids, index) in enumerate(zip(srcs, indices)):
            text = task.src_vocab.decode(ids[:-1].tolist())
            noised = self.text(text, self.rng(epoch, index))
            if noised != text:
                lines.append(noised)
                where.append(j)
        if lines:
            for j, ids in zip(where, task.encode_source(lines)):
                if len(ids) + 1 <= self.max_len:
                    out[j] = np.array([*ids, EOS], np.int32)
        return out
