"""Constraints the engine adds to a task's own (`s2s.core.contract.task.Constraint`): a target
prefix forced on each output (`Prefix`), and two constraints at once (`Both`), so that a forced
prefix or a terminology list works beside the parser's tree constraint, through the same hook.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..contract.task import Constraint
from ..tokenizers import PAD


class Prefix(Constraint):
    """Each output starts with its source's prefix (target ids, possibly none), token for
    token; after it the search is free. The prefix's tokens are scored with the model's own
    log-probabilities, as every other token, so an output's score is that of the whole output;
    but the first `free` tokens of every prefix (a multilingual model's target language code)
    score 0, as transformers' forced_bos_token_id scores it.

    State: (prefix ids [n, P], PAD-padded; prefix lengths [n]; tokens written [n])."""

    def __init__(self, prefixes: Sequence[Sequence[int]], vocab: int, free: int = 0):
        self.prefixes, self.vocab = [list(p) for p in prefixes], vocab  # vocab: target ids
        self.free = free

    def initial(self, device) -> tuple:
        width = max(1, max(map(len, self.prefixes)))
        ids = torch.full((len(self.prefixes), width), PAD, dtype=torch.long)
        for row, p in enumerate(self.prefixes):
            ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
        lengths = torch.tensor([len(p) for p in self.prefixes], dtype=torch.long)
        return ids.to(device), lengths.to(device), torch.zeros_like(lengths, device=device)

    def advance(self, state: tuple, tokens) -> tuple:
        ids, lengths, written = state
        return ids, lengths, written + 1

    def _forced(self, state: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows still in their prefix [n] bool, the token each must take [n, 1])."""
        ids, lengths, written = state
        token = ids.gather(1, written.clamp(max=ids.size(1) - 1)[:, None])
        return written.lt(lengths), token

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        forced, token = self._forced(state)
        n = forced.size(0)
        mask = torch.ones(n, self.vocab, dtype=torch.bool, device=forced.device)
        mask[forced] = False
        mask[forced, token[forced, 0]] = True
        return mask

    def score(self, state: tuple, logp: torch.Tensor, remaining) -> torch.Tensor:
        forced, token = self._forced(state)
        if not bool(forced.any()):
            return logp
        chosen = logp.gather(1, token)
        if self.free:
            chosen = chosen.masked_fill(state[2].lt(self.free)[:, None], 0.0)
        out = logp.masked_fill(forced[:, None], -torch.inf)
        return out.scatter_(1, token, torch.where(forced[:, None], chosen, out.gather(1, token)))


class Both(Constraint):
    """What two constraints both allow: `first` scores, then `second` narrows its answer.
    The state is the first's tensors followed by the second's."""

    def __init__(self, first: Constraint, second: Constraint):
        self.first, self.second, self.split = first, second, 0

    def initial(self, device) -> tuple:
        a = tuple(self.first.initial(device))
        self.split = len(a)
        return a + tuple(self.second.initial(device))

    def _parts(self, state: tuple) -> tuple[tuple, tuple]:
        return state[: self.split], state[self.split :]

    def advance(self, state: tuple, tokens) -> tuple:
        a, b = self._parts(state)
        return tuple(self.first.advance(a, tokens)) + tuple(self.second.advance(b, tokens))

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        a, b = self._parts(state)
        return self.first.allowed(a, remaining) & self.second.allowed(b, remaining)

    def score(self, state: tuple, logp: torch.Tensor, remaining) -> torch.Tensor:
        a, b = self._parts(state)
        return self.second.score(b, self.first.score(a, logp, remaining), remaining)

    @property
    def banked(self) -> bool:
        return banked(self.first) or banked(self.second)

    def _banked(self, state: tuple) -> list[tuple[Constraint, tuple]]:
        pairs = zip((self.first, self.second), self._parts(state))
        return [(c, s) for c, s in pairs if banked(c)]

    def candidates(self, state: tuple) -> torch.Tensor:
        return torch.cat([c.candidates(s) for c, s in self._banked(state)], dim=1)

    def met(self, state: tuple, tokens) -> torch.Tensor:
        return sum(c.met(s, tokens) for c, s in self._banked(state))


def banked(constraint) -> bool:
    """Whether beam search allocates its beam by the constraint's `met` counts (a plugin's
    constraint need not subclass `Constraint`: without the attribute it is not banked)."""
    return getattr(constraint, "banked", False)


def joined(first: Constraint | None, second: Constraint | None) -> Constraint | None:
    """Both constraints, either one, or None."""
    if first is None or second is None:
        return first if second is None else second
    return Both(first, second)
