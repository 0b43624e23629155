"""Reranking an n-best list with other models (Ng et al. 2019; noisy channel: Yee et al. 2019).

Each candidate y of a source x gets features: the search's score of the run that found it
(f_0, its log-probability over the length penalty), and for each other run its own score of y
after x (another seed, an ensemble member, a right-to-left model: `Run.score`), and for each
reverse run (one that translates the other way) its score of x after y, the channel model
log p(x | y) over its length penalty. The candidate with the highest f_0 + sum_i w_i f_i wins.

`tune` chooses the weights on a dev set: every feature is computed once, then coordinate
ascent (each weight in turn set to the grid value that most improves the task's corpus metric
against the references, all others held; rounds until no weight moves) from all-zero weights,
which is the search's own choice. "Improves" is in the direction the task's score declares
(`Score.higher_is_better`): BLEU is raised, an error rate lowered. Only dev data is read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from ..contract.task import better

log = logging.getLogger("s2s")

#: the values coordinate ascent tries for each weight
GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


@dataclass(frozen=True)
class Scorers:
    """The runs that score candidates: `forward` ones (the same direction, `Run`s) and
    `reverse` ones (source and target swapped), in the order of their weights."""

    forward: Sequence = ()
    reverse: Sequence = ()

    def __len__(self) -> int:
        return len(self.forward) + len(self.reverse)


def features(sources: Sequence[str], candidates: Sequence[Sequence], scorers: Scorers):
    """For each line, one row per candidate (an `Output`): [f_0, f_1, ...]: its search score,
    then each scorer's normalised score (forward: of the candidate after the source; reverse:
    of the source after the candidate). Each scorer scores all candidates of all lines in one
    call (batched)."""
    flat = [(i, out) for i, outs in enumerate(candidates) for out in outs]
    columns = [[out.score for _, out in flat]]
    lines = [sources[i] for i, _ in flat]
    texts = [out.text for _, out in flat]
    for run in scorers.forward:
        columns.append([s.score for s in run.score(lines, texts)])
    for run in scorers.reverse:
        columns.append([s.score for s in run.score(texts, lines)])
    rows = [[] for _ in candidates]
    for k, (i, _) in enumerate(flat):
        rows[i].append([column[k] for column in columns])
    return rows


def choose(rows: Sequence[Sequence[Sequence[float]]], weights: Sequence[float]) -> list[int]:
    """The index of each line's best candidate under f_0 + sum_i w_i f_i (the first on a tie)."""
    chosen = []
    for cands in rows:
        totals = [f[0] + sum(w * x for w, x in zip(weights, f[1:])) for f in cands]
        chosen.append(max(range(len(totals)), key=lambda k: (totals[k], -k)) if totals else 0)
    return chosen


def tune(
    rows, candidates, references: Sequence[str], metric, higher_is_better: bool = True
) -> tuple[list[float], float]:
    """The weights (one a scorer) coordinate ascent over `GRID` finds on dev, and the corpus
    figure they give; `metric(hypotheses, references)` is the task's primary figure, better
    higher or lower as `higher_is_better` says (its `Score.higher_is_better`)."""
    k = len(rows[0][0]) - 1 if rows and rows[0] else 0
    weights = [0.0] * k

    def figure(ws):
        picked = choose(rows, ws)
        return metric([cands[j].text for cands, j in zip(candidates, picked)], references)

    best = figure(weights)
    moved = True
    while moved:
        moved = False
        for i in range(k):
            for value in GRID:
                trial = weights[:i] + [value] + weights[i + 1 :]
                score = figure(trial)
                if better(score, best + (1e-9 if higher_is_better else -1e-9), higher_is_better):
                    best, weights, moved = score, trial, True
            log.info("rerank tuning: weights %s, dev %.2f", weights, best)
    return weights, best
