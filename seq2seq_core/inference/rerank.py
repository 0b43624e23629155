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
    for run in scorers.forward:  # a <unk> the search wrote is scored as the unknown token
        columns.append([s.score for s in run.score(lines, texts, searched=True)])
    for run in scorers.reverse:
        columns.append([s.score for s in run.score(texts, lines)])
    rows = [[] for _ in candidates]
    for k, (i, _) in enumerate(flat):
        rows[i].append([column[k] for column in columns])
    return rows


#: a task's settings that say what it writes from what, when it has them: a scorer agrees with
#: the reranked run on `SAME`, and on `LANGUAGES` (a reverse scorer: the two swapped)
SAME = ("mode",)
LANGUAGES = ("src_lang", "tgt_lang")


def unlike(run, other, reverse: bool = False) -> str | None:
    """How the scorer `other` (a `Run`) does another job than `run`, whose candidates it
    scores, or None: another task, another mode, other languages (a reverse scorer translates
    the other way: its languages swapped). Scores of another job rank candidates by nothing
    they are."""
    a, b = run.task, other.task
    if a.name != b.name:
        return f"a run of task {b.name!r}, not {a.name!r}"
    for key in SAME:
        x, y = getattr(a.cfg, key, None), getattr(b.cfg, key, None)
        if x != y:
            return f"its task.{key} is {y!r}, not {x!r}"
    src, tgt = (getattr(a.cfg, key, None) for key in LANGUAGES)
    got = tuple(getattr(b.cfg, key, None) for key in LANGUAGES)
    codes = _codes(run), _codes(other)
    if all(codes):  # multilingual models: the languages chosen (decode.src_lang, tgt_lang)
        (src, tgt), got = codes
    wanted = (tgt, src) if reverse else (src, tgt)
    if got != wanted:
        kind = "a reverse scorer" if reverse else "a scorer"
        return f"it translates {got[0]} to {got[1]}; {kind} of {src} to {tgt} translates " + (
            f"{wanted[0]} to {wanted[1]}"
        )
    return None


def _codes(run) -> tuple[str, str] | None:
    """The (source, target) language codes a multilingual model's vocabularies are set to
    (NLLB-200's eng_Latn, as decode.src_lang / tgt_lang chose them), or None."""
    task = run.task
    codes = tuple(getattr(getattr(task, side, None), "lang", None) for side in VOCABS)
    return codes if all(codes) else None


VOCABS = ("src_vocab", "tgt_vocab")


def too_long(sources: Sequence[str], run, scorers: Scorers) -> str | None:
    """ "line N: ..." for the first source line that does not fit a model's positions (`run`'s
    and each forward scorer's as a source, each reverse scorer's as a target), or None: checked
    before the search, which would otherwise fail on it at the end."""
    from ..decode.batched import prepared_sources

    sides = [(run, "source")] + [(r, "source") for r in scorers.forward]
    sides += [(r, "target") for r in scorers.reverse]
    for model_run, side in sides:
        if side == "source":
            ids = model_run.task.encode_source(prepared_sources(model_run.member, sources))
        else:
            ids = model_run.task.encode_target(list(sources))
        limit = model_run.model.max_positions
        for i, seq in enumerate(ids):
            if len(seq) + 1 > limit:
                return (
                    f"line {i + 1}: {len(seq) + 1} {side} tokens do not fit "
                    f"model.max_positions={limit} of {model_run.cfg.run.dir}"
                )
    return None


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
