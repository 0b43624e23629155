"""`s2s label RUN --input TEXT --output DIR`: a trained model's outputs for unlabelled text, as a
corpus to train on: a parser's silver treebank (self-training) or a reverse model's synthetic
parallel corpus (back-translation). docs/unlabelled.md walks through both."""

from __future__ import annotations

import contextlib
import sys

from ...files import readable
from .shared import (
    add_sampling_options,
    add_search_options,
    registry_of,
    sampling_of,
    search_overrides,
)


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "label",
        parents=[common],
        help="label raw text with a model: a silver treebank, a back-translated corpus",
        description="Decode every line of a text file with a trained run and write the outputs "
        "it is most confident of as a training corpus in the task's own format "
        "(docs/unlabelled.md). The same command resumes after a kill.",
    )
    s.add_argument("checkpoint", help="a run directory or a checkpoint file, as s2s generate")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. decode.max_sentences=64")
    s.add_argument("--input", required=True, help="the text: one sentence a line, UTF-8")
    s.add_argument(
        "--output",
        required=True,
        metavar="DIR",
        help="a folder of its own: label.json, labels.jsonl, summary.json and the corpus",
    )
    s.add_argument(
        "--name",
        default="synthetic",
        help="the corpus files' prefix: NAME.trees (parsing), NAME.SRC and NAME.TGT "
        "(translation; the run's languages)",
    )
    s.add_argument(
        "--keep",
        type=float,
        default=1.0,
        metavar="F",
        help="keep the fraction F of the labelled lines the model is most confident of (mean "
        "log-probability per token); default 1: all",
    )
    s.add_argument("--task", help="the member of a multi-task run to decode for")
    add_search_options(s)
    add_sampling_options(s)
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...decode.search import Wanted
    from ...inference.labelling import Labelling, label

    readable(args.input)
    job = Labelling(
        runs=[args.checkpoint, *args.ensemble],
        input=args.input,
        output=args.output,
        name=args.name,
        task=args.task,
        overrides=search_overrides(args),
        wanted=Wanted(1, sampling_of(args)),
        keep=args.keep,
        quiet=args.quiet,
    )
    with contextlib.redirect_stdout(sys.stderr):  # what plugins print is not the summary
        summary = label(job, registry_of(args))
    print(
        f"labelled {summary['labelled']} of {summary['lines']} lines ({summary['blank']} blank, "
        f"{summary['undecodable']} undecodable, {summary['no_output']} without output), kept "
        f"{summary['kept']}: {', '.join(f'{args.output}/{f}' for f in summary['files'])}"
    )
    return 0
