"""How sure a figure is: bootstrap confidence intervals and paired significance tests of
corpus-level metrics, resampled by sentence.

A corpus metric (BLEU, chrF, EVALB's bracket F1) is a function of sums over sentences of a few
counts per sentence: n-gram matches and totals, hypothesis and reference lengths, matched, gold
and test brackets. A task that gives those counts (`Task.statistics`, a `SentenceStatistics`)
gets, for every figure they make:

* `intervals`: a confidence interval by the percentile bootstrap (Efron and Tibshirani 1993;
  Koehn 2004 for MT): resample the test set's sentences with replacement, recompute the corpus
  figure from the resample's summed counts, and take the (1 - level) / 2 and (1 + level) / 2
  quantiles of the resampled figures. The draws are numpy's `default_rng(seed).choice`, the
  ones sacreBLEU makes for the same seed and number of resamples, and the quantiles are taken
  at the indices sacreBLEU uses at 95%, so BLEU's and chrF's intervals are sacreBLEU's own.
* `compare`: two systems' outputs for one test set. The difference of each figure (B - A), its
  paired-bootstrap interval (both systems resampled with the same sentences), and a two-sided
  p-value of "no difference": by approximate randomisation (the default; Noreen 1989, Riezler
  and Maxwell 2005: swap each sentence's two outputs with probability 1/2, and count how often
  the shuffled systems differ at least as much as the real ones), or by the paired bootstrap
  (Berg-Kirkpatrick et al. 2012: how often a resample's difference lies at least |d| away from
  the observed d). Randomisation is the default because it asks exactly "could the labels A and
  B be swapped?", needs no assumption that the test set stands for a population, and Riezler and
  Maxwell found the bootstrap's p-values too small (rejecting more often than the level) on test
  sets of the size parsing has here (118 sentences). Both count ties as "at least as much", so
  a system against itself has difference 0 and p = 1 (sacreBLEU counts only strictly greater
  differences, which gives it 1 / (trials + 1) there); both add one to the count and the trials
  (Davison and Hinkley 1997), so a p-value is never 0.

Each answer repeats for a seed (default 12345, sacreBLEU's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .checks import SEED_MAX, shown, whole_number_problem

SEED = 12345  # sacreBLEU's default (SACREBLEU_SEED)
RESAMPLES = 1000  # bootstrap resamples (sacreBLEU's default)
TRIALS = 10000  # approximate-randomisation trials (sacreBLEU's default)
LEVEL = 0.95
TESTS = ("ar", "bootstrap")  # approximate randomisation, paired bootstrap


@dataclass(frozen=True)
class SentenceStatistics:
    """A metric's counts, one row a sentence, and what makes its corpus figures.

    `figures` takes summed rows, an array [R, columns] (one sum per resample), and returns
    each figure's R values: {name: array [R]}, the primary figure first. The figures of the
    column sums of all rows are the task's own corpus figures."""

    rows: np.ndarray  # [sentences, columns]
    figures: Callable[[np.ndarray], dict[str, np.ndarray]]

    def of(self, totals: np.ndarray) -> dict[str, np.ndarray]:
        return self.figures(np.atleast_2d(totals))

    def corpus(self) -> dict[str, float]:
        """Every figure of the whole test set."""
        return {k: float(v[0]) for k, v in self.of(self.rows.sum(0)).items()}


def joined(parts: list[SentenceStatistics]) -> SentenceStatistics:
    """Several metrics' statistics over one test set as one (their figures side by side)."""
    widths = [p.rows.shape[1] for p in parts]
    edges = np.cumsum([0, *widths])

    def figures(totals: np.ndarray) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for part, lo, hi in zip(parts, edges[:-1], edges[1:]):
            found.update(part.figures(totals[:, lo:hi]))
        return found

    return SentenceStatistics(np.concatenate([p.rows for p in parts], axis=1), figures)


def sacrebleu_statistics(name: str, metric, hypotheses, references) -> SentenceStatistics:
    """A sacreBLEU metric (`sacrebleu.metrics.BLEU()`, `CHRF()`, ...) as statistics: its own
    per-sentence sufficient statistics, and its own score of summed ones (the computation its
    bootstrap uses), as figure `name`."""
    stats = metric._extract_corpus_statistics(list(hypotheses), [list(references)])
    rows = np.array(stats, dtype=np.float64)

    def figures(totals: np.ndarray) -> dict[str, np.ndarray]:
        return {name: np.array([metric._compute_score_from_stats(t).score for t in totals])}

    return SentenceStatistics(rows, figures)


def f_measure(matched, gold, test) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(precision, recall, F1) in percent of summed counts (arrays): 0 where a denominator is
    0, as EVALB prints."""
    matched, gold, test = (np.asarray(x, dtype=np.float64) for x in (matched, gold, test))
    recall = np.where(gold > 0, 100.0 * matched / np.maximum(gold, 1), 0.0)
    precision = np.where(test > 0, 100.0 * matched / np.maximum(test, 1), 0.0)
    both = recall + precision
    f1 = np.where(both > 0, 2 * precision * recall / np.where(both > 0, both, 1), 0.0)
    return precision, recall, f1


@dataclass(frozen=True)
class Resampling:
    """How intervals and tests are drawn; the defaults repeat sacreBLEU's."""

    resamples: int = RESAMPLES
    level: float = LEVEL
    seed: int = SEED
    test: str = "ar"  # the p-value's test: "ar" (approximate randomisation) or "bootstrap"
    trials: int = TRIALS  # approximate-randomisation trials

    def problem(self) -> str | None:
        """What is wrong with these settings, as the command-line option names it, or None."""
        if not 100 <= self.resamples <= 100_000:
            return f"--resamples {self.resamples}: from 100 to 100000"
        if not 0 < self.level < 1:
            return f"--level {self.level}: a confidence level between 0 and 1 (e.g. 0.95)"
        if self.test not in TESTS:
            return f"--test {self.test}: one of {', '.join(TESTS)}"
        if not 100 <= self.trials <= 1_000_000:
            return f"--trials {self.trials}: from 100 to 1000000"
        problem = whole_number_problem(self.seed, 0, SEED_MAX)
        if problem:
            return f"--seed {shown(self.seed)}: {problem}"
        return None

    def describe(self) -> str:
        """One line on how the intervals were drawn (printed under them)."""
        return (
            f"{self.level:.0%} percentile bootstrap, {self.resamples} resamples of the "
            f"sentences, seed {self.seed}"
        )

    def as_dict(self) -> dict:
        return {"method": "percentile bootstrap", **vars(self)}


def resample_indices(sentences: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, sentences] sentence indices drawn with replacement, as sacreBLEU draws them
    (`numpy.random.default_rng(seed).choice`)."""
    rng = np.random.default_rng(seed)
    return rng.choice(sentences, size=(resamples, sentences), replace=True)


def resampled_totals(rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """[R, columns]: the column sums of each resample's rows, as a product of each resample's
    counts of every sentence with the rows (no [R, sentences, columns] array is made)."""
    r, n = indices.shape
    flat = (indices + n * np.arange(r)[:, None]).ravel()
    counts = np.bincount(flat, minlength=r * n).reshape(r, n)
    return counts.astype(np.float64) @ rows.astype(np.float64)


def bounds(values: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of resampled values: the sorted values at index
    floor(R (1 - level) / 2) and the one as far from the top (sacreBLEU's n // 40 at 95%)."""
    ordered = np.sort(values)
    low = int(len(ordered) * (1 - level) / 2 + 1e-9)
    return float(ordered[low]), float(ordered[len(ordered) - low - 1])


@dataclass(frozen=True)
class Interval:
    """A figure of the whole test set, its interval, and the mean of its resampled values."""

    value: float
    low: float
    high: float
    mean: float

    def as_dict(self) -> dict:
        return {k: round(v, 4) for k, v in vars(self).items()}


def intervals(stats: SentenceStatistics, how: Resampling = Resampling()) -> dict[str, Interval]:
    """Each figure's confidence interval (see the module)."""
    indices = resample_indices(len(stats.rows), how.resamples, how.seed)
    drawn = stats.of(resampled_totals(stats.rows, indices))
    whole = stats.corpus()
    return {
        name: Interval(whole[name], *bounds(values, how.level), float(values.mean()))
        for name, values in drawn.items()
    }


@dataclass(frozen=True)
class Difference:
    """B against A on one figure: both figures, B - A, its interval and the test's p-value."""

    a: float
    b: float
    difference: float
    low: float
    high: float
    p: float

    def as_dict(self) -> dict:
        return {k: round(v, 4) if k != "p" else round(v, 6) for k, v in vars(self).items()}

    def better(self, higher_is_better: bool = True) -> str | None:
        """Which system is better on this figure, "a" or "b" (None: the same figure), in the
        direction its `Score.higher_is_better` declares: of two error rates, the lower. The
        difference stays B - A either way; this is what reads it."""
        from .task import better

        if better(self.b, self.a, higher_is_better):
            return "b"
        return "a" if better(self.a, self.b, higher_is_better) else None


def compare(
    a: SentenceStatistics, b: SentenceStatistics, how: Resampling = Resampling()
) -> dict[str, Difference]:
    """Each figure's difference B - A with its paired-bootstrap interval and p-value (see the
    module). `a` and `b` are one metric's statistics over the same sentences."""
    if a.rows.shape != b.rows.shape:
        raise ValueError(f"statistics of {len(a.rows)} and {len(b.rows)} sentences")
    whole_a, whole_b = a.corpus(), b.corpus()
    observed = {k: whole_b[k] - whole_a[k] for k in whole_a}
    indices = resample_indices(len(a.rows), how.resamples, how.seed)
    drawn_a = a.of(resampled_totals(a.rows, indices))
    drawn_b = b.of(resampled_totals(b.rows, indices))
    diffs = {k: drawn_b[k] - drawn_a[k] for k in drawn_a}
    if how.test == "ar":
        p = _randomised_p(a, b, observed, how)
    else:  # shifted to the null: how often |d* - d| >= |d|
        p = {
            k: (np.sum(np.abs(v - observed[k]) >= abs(observed[k]) - 1e-9) + 1) / (len(v) + 1)
            for k, v in diffs.items()
        }
    return {
        k: Difference(whole_a[k], whole_b[k], observed[k], *bounds(diffs[k], how.level), p[k])
        for k in whole_a
    }


def _randomised_p(a, b, observed: dict, how: Resampling, chunk: int = 2000) -> dict[str, float]:
    """Approximate randomisation: each trial swaps each sentence's two rows with probability
    1/2; the p-value of a figure is (trials whose |difference| >= the observed one + 1) /
    (trials + 1)."""
    rng = np.random.default_rng(how.seed)
    rows_a, rows_b = a.rows.astype(np.float64), b.rows.astype(np.float64)
    total = rows_a.sum(0) + rows_b.sum(0)
    hits = dict.fromkeys(observed, 0)
    for lo in range(0, how.trials, chunk):
        swap = rng.integers(2, size=(min(chunk, how.trials - lo), len(rows_a))).astype(np.float64)
        # a shuffled A takes B's row where swapped: A's total + swap @ (B - A); B the rest
        shuffled_a = rows_a.sum(0) + swap @ (rows_b - rows_a)
        fa, fb = a.of(shuffled_a), b.of(total - shuffled_a)
        for k in hits:
            hits[k] += int(np.sum(np.abs(fb[k] - fa[k]) >= abs(observed[k]) - 1e-9))
    return {k: (h + 1) / (how.trials + 1) for k, h in hits.items()}


def scored(task, hypotheses, references, sources=None, how: Resampling = Resampling()):
    """`task`'s checked score of the hypotheses with each figure's interval (`Score.intervals`)
    where the task gives per-sentence statistics; without them, the score alone."""
    from .task import checked_score

    score = checked_score(task, task.score(hypotheses, references, sources))
    return with_intervals(score, task.statistics(hypotheses, references, sources), how)


def with_intervals(score, stats: SentenceStatistics | None, how: Resampling = Resampling()):
    """`score` with each figure's interval (`Score.intervals`) from the per-sentence statistics
    `stats` of the same outputs (None: the score as it is)."""
    if stats is not None:
        found = intervals(stats, how)
        score.intervals = {k: v.as_dict() for k, v in found.items()}
    return score
