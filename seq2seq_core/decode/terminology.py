"""Terminology: when a source line holds a source term of a term list, its target term appears in
the output, as a constraint of the search (`s2s.core.contract.task.Constraint`).

A term list is a UTF-8 file of lines `source term<TAB>target term` (`read_terms`). A line's terms
are those whose source side occurs in the line as the task tokenises it (a run of the line's
source ids equal to the term's, at the start of the line or after a space: both spellings are
tried); their target sides are met by the task's target ids of the term in either of its two
spellings, inside a sentence (after a space) or at its start, which subword vocabularies
spell apart.

The constraint (`Terms`) tracks for every hypothesis and spelling how much of it the output
ends with and whether it has appeared. A hypothesis may end only once every term has appeared,
and may take a token only if the terms still missing fit in what remains of its length limit
afterwards: their shortest spellings, less what the most advanced spelling has already written
(finishing that one and then writing the others whole always fits, so the search can always
finish). Beam search divides its beam among hypotheses by the number of terms they have met
(`Terms.met`): dynamic beam allocation (Post and Vilar 2018), vectorised over the batch as Hu et
al. (2019) do (`s2s.core.decode.banks`). Every score is the model's own: a term is
written where the model's probabilities place it best, and the best output that holds every
term wins. A term abandoned half-way unwinds: its tokens count again only when it restarts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .. import textio
from ..errors import DataError
from ..contract.task import Constraint
from ..tokenizers import EOS, PAD


def read_terms(path: str | Path) -> list[tuple[str, str]]:
    """The (source term, target term) pairs of a term file; a line that is not two non-empty
    fields separated by one TAB is a DataError naming the file and line."""
    pairs = []
    for number, line in enumerate(textio.iter_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise DataError(
                f"{path}, line {number}: {line[:60]!r} is not `source term<TAB>target term` "
                "(one TAB, both sides non-empty)"
            )
        pairs.append((fields[0].strip(), fields[1].strip()))
    if not pairs:
        raise DataError(f"{path}: no terms (one `source term<TAB>target term` a line)")
    return pairs


def line_terms(task, sources: Sequence[str], pairs: Sequence[tuple[str, str]]):
    """For each (prepared) source line, the terms it holds: a list of (source term, target
    term, its target spellings: the ids of the term within a sentence and at its start, which
    subword vocabularies spell apart). `task` is a task or a run's member (its ids)."""
    head = len(task.encode_source([""])[0])  # a multi-task run's task token
    spellings = []
    for source_term, target_term in pairs:
        forms = {tuple(ids[head:]) for ids in task.encode_source([source_term, " " + source_term])}
        targets = target_spellings(task, target_term)
        spellings.append((source_term, target_term, [f for f in forms if f], targets))
    found = []
    for ids in task.encode_source(list(sources)):
        ids = tuple(ids[head:])
        here = []
        for source_term, target_term, forms, target in spellings:
            if any(_holds(ids, form) for form in forms):
                here.append((source_term, target_term, target))
        found.append(here)
    return found


def target_spellings(task, target_term: str) -> list["Spelling"]:
    """A target term's ids within a sentence (after a space) and, where a subword vocabulary
    spells it apart, at the output's start."""
    inside, start = (tuple(t) for t in task.encode_target([" " + target_term, target_term]))
    return [Spelling(inside)] + ([Spelling(start, first=True)] if start != inside else [])


def placeable(task, source: str, terms: Sequence[tuple], settings, max_positions: int) -> int:
    """How many of a line's terms (`line_terms`' triples, in order) fit its output's length
    limit together: the first k whose shortest spellings add up to at most int(max_len_a * |x|
    + max_len_b) (within the model's positions); the rest cannot be placed."""
    src = len(task.encode_source([source])[0]) + 1
    limit = max(0, min(int(settings.max_len_a * src + settings.max_len_b), max_positions - 1))
    total = 0
    for k, (_, _, targets) in enumerate(terms):
        total += min(len(x.ids) for x in targets)
        if total > limit:
            return k
    return len(terms)


def _holds(ids: tuple, part: tuple) -> bool:
    n = len(part)
    return any(ids[i : i + n] == part for i in range(len(ids) - n + 1))


@dataclass(frozen=True)
class Spelling:
    """A term's target ids in one spelling; `first`: a spelling that only begins an output (a
    word at the start of a sentence, which a subword vocabulary spells without its space)."""

    ids: tuple[int, ...]
    first: bool = False

    @staticmethod
    def of(x) -> "Spelling":
        return x if isinstance(x, Spelling) else Spelling(tuple(x))


#: where a term's spelling may begin (`Terms`' state)
ANYWHERE, START, LATER = 0, 1, 2


class Terms(Constraint):
    """Every output holds each of its source's target terms, a term in any of its spellings
    (`Spelling`s, or lists of target ids; see the module). State, S spellings a row: (ids
    [n, S, L], PAD-padded; lengths [n, S], 0 where a row has fewer; same [n, S, S]: spellings
    of one term; first [n, S]: the first spelling of its term; place [n, S]: where a spelling may
    begin (ANYWHERE; START: only as the output's first tokens; LATER: not there, the spelling
    inside a sentence of a term that has one for the start); step [n]: tokens written;
    written [n, S]: how much of each spelling the output ends with; seen [n, S]: the spellings
    that have appeared)."""

    def __init__(self, terms: Sequence[Sequence[Sequence]], vocab: int):
        self.terms = [[[Spelling.of(x) for x in t] for t in ts] for ts in terms]
        self.vocab = vocab

    def initial(self, device) -> tuple:
        n = len(self.terms)
        S = max([1] + [sum(len(t) for t in ts) for ts in self.terms])
        L = max([1] + [len(x.ids) for ts in self.terms for t in ts for x in t])
        ids = torch.full((n, S, L), PAD, dtype=torch.long)
        lengths = torch.zeros(n, S, dtype=torch.long)
        place = torch.full((n, S), ANYWHERE, dtype=torch.long)
        term = torch.arange(S).repeat(n, 1) + S  # each empty slot a term of its own
        for row, ts in enumerate(self.terms):
            slot = 0
            for k, spellings in enumerate(ts):
                has_start = any(x.first for x in spellings)
                for x in spellings:
                    ids[row, slot, : len(x.ids)] = torch.tensor(x.ids, dtype=torch.long)
                    lengths[row, slot], term[row, slot] = len(x.ids), k
                    place[row, slot] = START if x.first else LATER if has_start else ANYWHERE
                    slot += 1
        same = term[:, :, None].eq(term[:, None, :])
        first = same.long().argmax(-1).eq(torch.arange(S))
        seen = lengths.eq(0)  # an empty slot is a term met
        written, step = torch.zeros_like(lengths), torch.zeros(n, dtype=torch.long)
        state = (ids, lengths, same, first, place, step, written, seen)
        return tuple(x.to(device) for x in state)

    @staticmethod
    def _after(state: tuple, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(written, seen) [n, K, S] after each row takes each of its K tokens [n, K]."""
        ids, lengths, _, _, place, step, written, seen = state
        L = ids.size(2)
        next_id = ids.gather(2, written.clamp(max=L - 1)[..., None])[..., 0]  # [n, S]
        t = tokens[:, :, None]  # [n, K, 1]
        may_begin = place.ne(torch.where(step.eq(0), LATER, START)[:, None])  # [n, S]
        grown = torch.where(
            t.eq(next_id[:, None, :]) & written[:, None, :].gt(0),
            written[:, None, :] + 1,
            (t.eq(ids[:, None, :, 0]) & may_begin[:, None, :]).long(),
        )
        seen_after = seen[:, None, :] | grown.ge(lengths[:, None, :])
        return torch.where(seen[:, None, :], 0, grown), seen_after

    @staticmethod
    def _met(same: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """[n, K, S]: whether each spelling's term has appeared (in any spelling)."""
        return (same[:, None, :, :] & seen[:, :, None, :]).any(-1)

    def _need(self, state: tuple, written: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """[n, K]: tokens the missing terms still take at most, after a token that leaves
        `written` and `seen` [n, K, S]: each one's shortest spelling that can still begin (a
        first-only one no longer can), less what the most advanced spelling of a missing term
        saves (finishing it, then writing the others whole, always fits)."""
        _, lengths, same, first, place = state[:5]
        never = 1 << 20  # the length of a spelling that can no longer begin
        usable = place.ne(START)[:, None, :] | written.gt(0)  # [n, K, S]
        ways = torch.where(usable, lengths[:, None, :], never)  # [n, K, S]
        shortest = torch.where(same[:, None], ways[:, :, None, :], never).amin(-1)
        missing = ~self._met(same, seen)
        whole = (shortest * (first[:, None, :] & missing)).sum(-1)
        saved = (shortest - lengths[:, None, :] + written) * (missing & written.gt(0))
        return whole - saved.amax(-1).clamp(min=0)

    def advance(self, state: tuple, tokens) -> tuple:
        written, seen = self._after(state, tokens[:, None])
        return (*state[:5], state[5] + 1, written[:, 0], seen[:, 0])

    def candidates(self, state: tuple) -> torch.Tensor:
        """[n, 2S]: the tokens that move a spelling on, each spelling's next token and its first
        one (a PAD for an empty slot)."""
        ids, written = state[0], state[6]
        next_id = ids.gather(2, written.clamp(max=ids.size(2) - 1)[..., None])[..., 0]
        return torch.cat([next_id, ids[:, :, 0]], dim=1)

    def _moving(self, state: tuple):
        """The tokens that move a spelling on (`candidates`), and (written, seen) [n, 2S, S]
        after each."""
        moving = self.candidates(state)
        return (moving, *self._after(state, moving))

    def _mask(self, state: tuple, remaining, moves) -> torch.Tensor:
        ids, _, same, _, _, _, written, seen = state
        moving, w, d = moves
        ok = self._need(state, w, d).le(remaining[:, None] - 1)
        fresh = torch.zeros_like(written)[:, None, :]  # any other token: nothing in progress
        base = self._need(state, fresh, seen[:, None, :])[:, 0].le(remaining - 1)
        mask = base[:, None].expand(ids.size(0), self.vocab).clone()
        mask.scatter_(1, moving, ok)  # a PAD among them (an empty slot) is banned anyway
        mask[:, EOS] = self._met(same, seen[:, None, :])[:, 0].all(1)
        return mask

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        return self._mask(state, remaining, self._moving(state))

    banked = True

    def met(self, state: tuple, tokens) -> torch.Tensor:
        """[n, K]: the terms each row has met after each of its tokens [n, K] (a term begun is
        not yet met; the beam's banks, `s2s.core.decode.banks`, are these counts)."""
        _, seen = self._after(state, tokens)
        lengths, same, first = state[1:4]
        real = first & lengths.gt(0)  # a term's first spelling, no empty slot
        return (self._met(same, seen) & real[:, None, :]).sum(-1)
