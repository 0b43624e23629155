"""`s2s score`'s work: a task named on the command line (a task with its defaults, or a preset's
single task), and its metric over files of output and reference lines. A partial score is no
score: the files must have as many lines; a plugin's answer is checked where it comes in.

With `--ci`, each figure the task's per-sentence statistics make gets its confidence interval;
with several `--hyp` files, each after the first is compared with the first (`s2s.core.
resampling`: the difference, its interval and a p-value)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .. import textio
from ..data.members import build_task
from ..errors import ConfigError, DataError, UsageError
from ..runs.checkpoint import task_origins
from ..contract.resampling import Difference, Resampling, compare, with_intervals
from ..setup.config import load_config, preset_names, single_task
from ..contract.task import Score, Task, checked_score

log = logging.getLogger("s2s")


def task_named(name: str, overrides, registry):
    """The task `name` stands for, with the command line's `overrides`: a task's defaults
    (`translation task.tgt_lang=fr`), else a run directory's one task (as it was trained, its
    plugin loaded from where the run recorded it), else a preset's (by name or YAML file); else a
    ConfigError naming them."""
    if name in registry.names():  # the task's defaults, with the overrides (e.g. task.tgt_lang=fr)
        cfg = load_config(None, [f"task.name={name}", *overrides], registry=registry)
    elif (Path(name) / "config.yaml").is_file():  # a run directory of `s2s train`
        registry.adopt(task_origins(name), name)
        cfg = load_config(Path(name) / "config.yaml", overrides, registry=registry)
        cfg = single_task(cfg, f"run {name!r}")
    elif name in preset_names(registry) or Path(name).is_file():
        cfg = single_task(load_config(name, overrides, registry=registry), f"preset {name!r}")
    else:
        raise ConfigError(
            f"{name!r} is neither a task ({', '.join(registry.names())}), a run directory nor a "
            f"preset ({', '.join(preset_names(registry))})"
        )
    return build_task(cfg.task, registry)


def score_files(task, ref, hyp, src=None) -> Score:
    """`task`'s score of the lines of `hyp` against those of `ref` (with the source lines of
    `src`, for a metric that reads them); a DataError when the two files differ in length."""
    refs, (hyps,), srcs = _read(ref, [hyp], src)
    return checked_score(task, task.score(hyps, refs, srcs))  # a plugin's answer, checked


def _read(ref, hyps: list, src) -> tuple[list[str], list[list[str]], list[str] | None]:
    """The lines of the reference, each hypothesis file and the source file; a DataError when
    the reference has no lines or a hypothesis file's line count differs from it."""
    refs = textio.read_lines(ref)  # lines end at "\n" only
    if not refs:  # no figure means anything over no sentences (and a metric may fail on none)
        raise DataError(f"{ref} is empty: no reference lines to score against")
    outputs = []
    for hyp in hyps:
        lines = textio.read_lines(hyp)
        if len(refs) != len(lines):
            raise DataError(
                f"{hyp} has {len(lines)} lines but {ref} has {len(refs)}: a partial score is "
                "no score"
            )
        outputs.append(lines)
    return refs, outputs, textio.read_lines(src) if src else None


@dataclass
class Report:
    """What `s2s score` found: each file's score (and intervals) and each later file's
    comparison with the first."""

    hyps: list[str]
    scores: list[Score]  # each with its intervals
    compared: list[dict[str, Difference]]  # each file after the first against the first
    how: Resampling

    def as_dict(self) -> dict:
        if len(self.scores) == 1:  # one file: its score, as without resampling
            return {**self.scores[0].as_dict(), "resampling": self.how.as_dict()}
        return {
            "systems": [{"hyp": h, **s.as_dict()} for h, s in zip(self.hyps, self.scores)],
            "comparisons": [
                {
                    "a": self.hyps[0],
                    "b": other,
                    "figures": {k: d.as_dict() for k, d in differences.items()},
                    # on the primary figure, in its direction: "a", "b" or null (the same)
                    "better": differences[score.name].better(score.higher_is_better),
                    "higher_is_better": score.higher_is_better,
                }
                for other, differences, score in zip(self.hyps[1:], self.compared, self.scores[1:])
            ],
            "resampling": self.how.as_dict(),
        }

    def lines(self) -> list[str]:
        """For a person: each file's figures with their intervals, then each comparison as a
        table of A, B, B - A with its interval and p-value, and which of the two is better on
        the primary figure, in the direction its score declares ("B is better than A on ter
        (lower is better), p = 0.0012")."""
        how = self.how
        if len(self.scores) == 1:
            return [*self.scores[0].lines(), how.describe()]
        out = []
        for letter, hyp, score in zip(LETTERS, self.hyps, self.scores):
            i = score.intervals[score.name]
            out.append(
                f"{letter}: {hyp}  {score.name} {score.value:.2f} [{i['low']:.2f}, {i['high']:.2f}]"
            )
        for letter, differences, score in zip(LETTERS[1:], self.compared, self.scores[1:]):
            width = max(len(k) for k in differences)
            head = f"{'':<{width}}  {'A':>7}  {letter:>7}  {letter + ' - A':>7}  "
            out += ["", f"{letter} against A"]
            out.append(head + f"{f'{how.level:.0%} interval':<18}  p")
            for k, d in differences.items():
                interval = f"[{d.low:+.2f}, {d.high:+.2f}]"
                out.append(
                    f"{k:<{width}}  {d.a:7.2f}  {d.b:7.2f}  {d.difference:+7.2f}  "
                    f"{interval:<18}  {d.p:.4f}"
                )
            out.append(_verdict(letter, score, differences[score.name], how))
        test = (
            f"approximate randomisation, {how.trials} trials"
            if how.test == "ar"
            else f"paired bootstrap, {how.resamples} resamples"
        )
        return [*out, "", f"p: {test}, seed {how.seed}; intervals: {how.describe()}, paired"]


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _verdict(letter: str, score: Score, d: Difference, how: Resampling) -> str:
    """Which of A and system `letter` is better on the primary figure, read in its direction,
    and whether the test finds the difference significant at 1 - how.level."""
    alpha = 1 - how.level
    winner = d.better(score.higher_is_better)
    if winner is None:
        return f"A and {letter} have the same {score.name}"
    first, second = (letter, "A") if winner == "b" else ("A", letter)
    sure = "" if d.p < alpha else f", not significant at the {alpha:.2g} level"
    return (
        f"{first} is better than {second} on {score.name} ({score.direction}), p = {d.p:.4f}{sure}"
    )


def resampled_report(task, ref, hyps: list, src, how: Resampling) -> Report:
    """Each hypothesis file's score and the intervals of its figures, and each file after the
    first compared with the first; a UsageError before any work when the task gives no
    per-sentence statistics or `how` is out of range."""
    problem = how.problem()
    if problem:
        raise UsageError(problem)
    none = UsageError(
        f"task {task.name!r} gives no per-sentence statistics (Task.statistics): its figures "
        "have no interval or paired test (docs/uncertainty.md)"
    )
    if getattr(type(task), "statistics", Task.statistics) is Task.statistics:
        raise none
    refs, outputs, srcs = _read(ref, hyps, src)
    for hyp in hyps[1:]:
        if _same_file(hyp, hyps[0]):
            log.warning("--hyp %s is the same file as %s: difference 0, p = 1", hyp, hyps[0])
    scores, statistics = [], []
    for lines in outputs:
        stats = task.statistics(lines, refs, srcs)
        if stats is None:
            raise none
        statistics.append(stats)
        score = checked_score(task, task.score(lines, refs, srcs))
        scores.append(with_intervals(score, stats, how))
    compared = [compare(statistics[0], other, how) for other in statistics[1:]]
    return Report([str(h) for h in hyps], scores, compared, how)


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
