"""Which member each update trains, and each member's stream of training batches.

Every batch is of one member, and update u trains one member, drawn with
probability p_k proportional to weight_k * n_k^(1/T) (n_k training pairs, T =
multitask.temperature) from a generator seeded with (run.seed, u): every process draws the same
member, and a resumed run draws what the unbroken run would have. Each member's batches come in
its own stream of epochs (`Stream`), whose position the checkpoint keeps.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data.batches import epoch_batches


def probabilities(members: list, temperature: float) -> np.ndarray:
    """p_k proportional to weight_k * n_k^(1/T), n_k = member k's training pairs (members:
    `s2s.core.data.members.Member`)."""
    sizes = np.array([m.data.pairs["train"] for m in members], dtype=np.float64)
    weights = np.array([m.weight for m in members], dtype=np.float64)
    p = weights * sizes ** (1.0 / temperature)
    return p / p.sum()


def draw(p: np.ndarray, seed: int, update: int) -> int:
    """The member that update `update` (counted from 1) trains: a function of (seed, update)
    only."""
    if len(p) == 1:
        return 0
    return int(np.random.default_rng([seed, update]).choice(len(p), p=p))


class Stream:
    """One member's training batches from a position (epoch, batches taken in it), epoch after
    epoch."""

    def __init__(self, member, max_tokens: int, seed: int, rank: int, world: int):
        self.member, self.max_tokens, self.seed, self.rank, self.world = (
            member,
            max_tokens,
            seed,
            rank,
            world,
        )
        self.epoch, self.pos, self._batches = 0, 0, None

    def next(self) -> np.ndarray:
        if self._batches is None:
            train = self.member.data.splits["train"]
            shard = (self.rank, self.world)
            self._batches = epoch_batches(train, self.max_tokens, self.seed, self.epoch, shard)
        if self.pos == len(self._batches):
            self.epoch, self.pos = self.epoch + 1, 0
            self._batches = None
            return self.next()
        self.pos += 1
        return self._batches[self.pos - 1]

    def state(self) -> list[int]:
        return [self.epoch, self.pos]

    def restore(self, state: Sequence[int]) -> None:
        self.epoch, self.pos = int(state[0]), int(state[1])
        self._batches = None
