"""Terminology: when a source line holds a source term of a term list, its target term appears in
the output, as a constraint of the search (`s2s.core.task.Constraint`).

A term list is a UTF-8 file of lines `source term<TAB>target term` (`read_terms`). A line's terms
are those whose source side occurs in the line as the task tokenises it (a run of the line's
source ids equal to the term's, at the start of the line or after a space: both spellings are
tried); their target sides are the task's target ids of the term written as a word inside a
sentence (with the space before it, which subword vocabularies spell apart).

The constraint (`Terms`) tracks for every hypothesis and term how much of the term the output
ends with and whether it has appeared. A hypothesis may end only once every term has appeared,
and may take a token only if the terms still missing fit in what remains of its length limit
afterwards: their lengths, less what the most advanced of them has already written (finishing
that one and then writing the others whole always fits, so the search can always finish). The
model's own probabilities rank everything else: a term the model would write anyway is written
where the model puts it, and one it would not is placed where the beam finds it best, at the
latest where the length limit leaves just room for it. This is the guarantee of constrained beam
search (Hokamp and Liu 2017; Post and Vilar 2018) without its allocation of the beam to
hypotheses by the number of constraints met: a beam here ranks all its hypotheses together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from .. import textio
from ..errors import DataError
from ..task import Constraint
from ..vocab import EOS, PAD


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
    term, target ids). `task` is a task or a run's member (its ids)."""
    head = len(task.encode_source([""])[0])  # a multi-task run's task token
    spellings = []
    for source_term, target_term in pairs:
        forms = {tuple(ids[head:]) for ids in task.encode_source([source_term, " " + source_term])}
        target = task.encode_target([" " + target_term])[0]
        spellings.append((source_term, target_term, [f for f in forms if f], target))
    found = []
    for ids in task.encode_source(list(sources)):
        ids = tuple(ids[head:])
        here = []
        for source_term, target_term, forms, target in spellings:
            if any(_holds(ids, form) for form in forms):
                here.append((source_term, target_term, target))
        found.append(here)
    return found


def placeable(task, source: str, terms: Sequence[tuple], settings, max_positions: int) -> int:
    """How many of a line's terms (`line_terms`' triples, in order) fit its output's length
    limit together: the first k whose target ids add up to at most int(max_len_a * |x| +
    max_len_b) (within the model's positions); the rest cannot be placed."""
    src = len(task.encode_source([source])[0]) + 1
    limit = max(0, min(int(settings.max_len_a * src + settings.max_len_b), max_positions - 1))
    total = 0
    for k, (_, _, target) in enumerate(terms):
        total += len(target)
        if total > limit:
            return k
    return len(terms)


def _holds(ids: tuple, part: tuple) -> bool:
    n = len(part)
    return any(ids[i : i + n] == part for i in range(len(ids) - n + 1))


class Terms(Constraint):
    """Every output holds each of its source's target terms (lists of target ids; see the
    module). State: (terms [n, T, L] ids, PAD-padded; lengths [n, T], 0 where a source has fewer
    terms; written [n, T]: how much of each term the output ends with; done [n, T])."""

    def __init__(self, terms: Sequence[Sequence[Sequence[int]]], vocab: int):
        self.terms, self.vocab = [[list(t) for t in ts] for ts in terms], vocab

    def initial(self, device) -> tuple:
        n = len(self.terms)
        T = max(1, max(map(len, self.terms)))
        L = max([1] + [len(t) for ts in self.terms for t in ts])
        ids = torch.full((n, T, L), PAD, dtype=torch.long)
        lengths = torch.zeros(n, T, dtype=torch.long)
        for row, ts in enumerate(self.terms):
            for j, t in enumerate(ts):
                ids[row, j, : len(t)] = torch.tensor(t, dtype=torch.long)
                lengths[row, j] = len(t)
        written = torch.zeros(n, T, dtype=torch.long)
        return ids.to(device), lengths.to(device), written.to(device), lengths.eq(0).to(device)

    @staticmethod
    def _after(state: tuple, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(written, done) [n, K, T] after each row takes each of its K tokens [n, K]."""
        ids, lengths, written, done = state
        L = ids.size(2)
        next_id = ids.gather(2, written.clamp(max=L - 1)[..., None])[..., 0]  # [n, T]
        t = tokens[:, :, None]  # [n, K, 1]
        grown = torch.where(
            t.eq(next_id[:, None, :]),
            written[:, None, :] + 1,
            t.eq(ids[:, None, :, 0]).long(),
        )
        done_after = done[:, None, :] | grown.ge(lengths[:, None, :])
        return torch.where(done[:, None, :], 0, grown), done_after

    @staticmethod
    def _need(lengths, written, done) -> torch.Tensor:
        """Tokens the missing terms still take at most: their lengths, less the most written."""
        missing = ~done
        return (lengths * missing).sum(-1) - (written * missing).amax(-1)

    def advance(self, state: tuple, tokens) -> tuple:
        ids, lengths, written, done = state
        written, done = self._after(state, tokens[:, None])
        return ids, lengths, written[:, 0], done[:, 0]

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        ids, lengths, written, done = state
        n = ids.size(0)
        # tokens that move a term on: each term's next token and its first
        L = ids.size(2)
        next_id = ids.gather(2, written.clamp(max=L - 1)[..., None])[..., 0]
        moving = torch.cat([next_id, ids[:, :, 0]], dim=1)  # [n, 2T]
        w, d = self._after(state, moving)
        ok = self._need(lengths[:, None, :], w, d).le(remaining[:, None] - 1)
        base = self._need(lengths, torch.zeros_like(written), done).le(remaining - 1)
        mask = base[:, None].expand(n, self.vocab).clone()
        mask.scatter_(1, moving, ok)  # a PAD among them (no such term) is banned anyway
        mask[:, EOS] = done.all(1)
        return mask
