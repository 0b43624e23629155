"""`s2s score TASK --ref FILE --hyp FILE [--hyp FILE ...] [--ci]`: score output lines against
reference lines with a task's metric (translation: BLEU, chrF; parsing: EVALB; TASK a task, a
preset or a run directory, whose task is the run's as trained, its plugin loaded from where the
run recorded it: `s2s score RUN --ref RUN/test.ref.txt --hyp RUN/test.hyp.txt`) and print the
figures (or one JSON object); with `--ci` each figure's confidence interval, with several
`--hyp` files each compared with the first: the difference, its interval and a p-value."""

from __future__ import annotations

import contextlib
import json
import sys

from ...errors import UsageError
from ...contract.resampling import LEVEL, RESAMPLES, SEED, TESTS, TRIALS, Resampling
from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "score",
        parents=[common],
        help="score hypotheses with a task's metric",
        description="Score output lines against reference lines with the task's metric "
        "(translation: BLEU, chrF; parsing: EVALB).",
    )
    s.add_argument(
        "task",
        help="a task name (translation, parsing, ...), a run directory (its task as trained) or "
        "a preset (a name or a YAML file)",
    )
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="e.g. task.tgt_lang=fr (French rules)"
    )
    s.add_argument(
        "--ref",
        required=True,
        metavar="FILE",
        help="the reference lines (parsing: one tree a line)",
    )
    s.add_argument(
        "--hyp",
        required=True,
        action="append",
        metavar="FILE",
        help="the output lines to score, as many as --ref; several: each compared with the "
        "first (difference, interval, p-value)",
    )
    s.add_argument(
        "--src", metavar="FILE", help="the source lines, for a task whose metric reads them"
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    r = s.add_argument_group("confidence intervals and paired tests (docs/uncertainty.md)")
    r.add_argument(
        "--ci", action="store_true", help="each figure's confidence interval (bootstrap)"
    )
    r.add_argument(
        "--resamples",
        type=int,
        default=RESAMPLES,
        metavar="N",
        help=f"bootstrap resamples of the sentences (100 to 100000; default {RESAMPLES})",
    )
    r.add_argument(
        "--level",
        type=float,
        default=LEVEL,
        help=f"the intervals' confidence level (default {LEVEL})",
    )
    r.add_argument("--seed", type=int, default=SEED, help=f"the resampling's seed (default {SEED})")
    r.add_argument(
        "--test",
        choices=TESTS,
        default="ar",
        help="the paired test's p-value: approximate randomisation (default) or the paired "
        "bootstrap",
    )
    r.add_argument(
        "--trials",
        type=int,
        default=TRIALS,
        metavar="N",
        help=f"approximate-randomisation trials (default {TRIALS})",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ..scoring import resampled_report, score_files, task_named

    how = Resampling(args.resamples, args.level, args.seed, args.test, args.trials)
    resampled = args.ci or len(args.hyp) > 1
    defaults = Resampling()
    if not resampled and how != defaults:
        changed = next(k for k, v in vars(how).items() if v != getattr(defaults, k))
        raise UsageError(f"--{changed}: only with --ci or several --hyp files")
    task = task_named(args.task, args.overrides, registry_of(args))
    with contextlib.redirect_stdout(sys.stderr):  # what the plugin prints is not the score's line
        if resampled:
            found = resampled_report(task, args.ref, args.hyp, args.src, how)
        else:
            found = score_files(task, args.ref, args.hyp[0], args.src)
    print(json.dumps(found.as_dict()) if args.json else "\n".join(found.lines()))
    return 0
