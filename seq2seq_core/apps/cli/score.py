"""`s2s score TASK --ref FILE --hyp FILE`: score output lines against reference lines with a
task's metric (translation: BLEU, chrF; parsing: EVALB) and print the figures (or one JSON
object)."""

from __future__ import annotations

import contextlib
import json
import sys

from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "score",
        parents=[common],
        help="score hypotheses with a task's metric",
        description="Score output lines against reference lines with the task's metric "
        "(translation: BLEU, chrF; parsing: EVALB).",
    )
    s.add_argument("task", help="a task name (translation, parsing, ...) or a preset name")
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
        "--hyp", required=True, metavar="FILE", help="the output lines to score, as many as --ref"
    )
    s.add_argument(
        "--src", metavar="FILE", help="the source lines, for a task whose metric reads them"
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=run)


def run(args) -> int:
    from ..scoring import score_files, task_named

    task = task_named(args.task, args.overrides, registry_of(args))
    with contextlib.redirect_stdout(sys.stderr):  # what the plugin prints is not the score's line
        score = score_files(task, args.ref, args.hyp, args.src)
    print(json.dumps(score.as_dict()) if args.json else "\n".join(score.lines()))
    return 0
