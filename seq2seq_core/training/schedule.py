"""Which member each update trains, and each member's stream of training batches.

Every batch is of one member, and update u trains one member, drawn with
probability p_k proportional to weight_k * n_k^(1/T) (n_k training pairs, T =
multitask.temperature) from a generator seeded with (run.seed, u): every process draws the same
member, and a resumed run draws what the unbroken run would have.

Each member's batches form one sequence, epoch after epoch (`Stream`), that does not depend on
the number of processes: an update takes its next `Share.slots` = processes x optim.update_freq
batches, and process r trains slots r * update_freq ... (r + 1) * update_freq - 1 of them. The
position in the sequence is the same on every process; the checkpoint keeps it, so a run resumes
at the same pairs with any process count whose processes x update_freq is the run's. The dropout
masks of a batch are drawn from a seed of (run.seed, update, slot) (`dropout_seed`), not from a
process's stream: the same batch gets the same masks whichever process trains it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..data.batches import epoch_batches, taken


def probabilities(members: list, temperature: float, stage: int = 0) -> np.ndarray:
    """p_k proportional to weight_k * n_k^(1/T), n_k = member k's training pairs (members:
    `s2s.core.data.members.Member`), weight_k its weight in `stage` (0: `weight`)."""
    sizes = np.array([m.data.pairs["train"] for m in members], dtype=np.float64)
    weights = np.array(
        [m.weight if stage == 0 else m.stage_weights[stage - 1] for m in members],
        dtype=np.float64,
    )
    p = weights * sizes ** (1.0 / temperature)
    return p / p.sum()


class Mix:
    """Each stage's probabilities (multitask.stages: the updates at which stage 1, 2, ...
    begins), and the member an update trains: a function of (seed, update) only."""

    def __init__(self, members: list, temperature: float, stages=()):
        self.stages = list(stages)
        self.p = [probabilities(members, temperature, s) for s in range(len(self.stages) + 1)]

    def stage(self, update: int) -> int:
        return bisect.bisect_left(self.stages, update)

    def draw(self, seed: int, update: int) -> int:
        return draw(self.p[self.stage(update)], seed, update)


def draw(p: np.ndarray, seed: int, update: int) -> int:
    """The member that update `update` (counted from 1) trains: a function of (seed, update)
    only."""
    if len(p) == 1:
        return 0
    return int(np.random.default_rng([seed, update]).choice(len(p), p=p))


def dropout_seed(seed: int, update: int, slot: int) -> int:
    """The seed of the random numbers (dropout) of the batch in `slot` of update `update`."""
    return int(np.random.SeedSequence([seed, update, slot]).generate_state(1, np.uint64)[0] >> 1)


@dataclass(frozen=True)
class Share:
    """This process's part of every update: of the `slots` = world x per_process batches an
    update takes, the `per_process` (optim.update_freq) from slot rank x per_process on."""

    rank: int = 0
    world: int = 1
    per_process: int = 1

    @property
    def slots(self) -> int:
        return self.world * self.per_process

    @property
    def mine(self) -> range:
        return range(self.rank * self.per_process, (self.rank + 1) * self.per_process)


class Stream:
    """One member's training batches as one sequence, epoch after epoch, read alike by every
    process; its position is (epoch, batches taken in it)."""

    def __init__(self, member, max_tokens: int, seed: int, share: Share = Share()):
        self.member, self.max_tokens, self.seed, self.share = member, max_tokens, seed, share
        self.epoch, self.pos, self._batches = 0, 0, None

    def next(self) -> np.ndarray:
        """The next batch of the sequence (index arrays of the member's training split)."""
        if self._batches is None:
            train = self.member.data.splits["train"]
            self._batches = epoch_batches(train, self.max_tokens, self.seed, self.epoch)
        if self.pos >= len(self._batches):  # beyond: an older checkpoint's approximate position
            self.epoch, self.pos = self.epoch + 1, 0
            self._batches = None
            return self.next()
        self.pos += 1
        return taken(self._batches[self.pos - 1], self.epoch)

    def update_batches(self) -> list[np.ndarray]:
        """This process's batches of the next update (its `Share` of the next `slots`)."""
        taken = [self.next() for _ in range(self.share.slots)]
        return [taken[slot] for slot in self.share.mine]

    def state(self) -> list[int]:
        return [self.epoch, self.pos]

    def restore(self, state: Sequence[int]) -> None:
        self.epoch, self.pos = int(state[0]), int(state[1])
        self._batches = None
