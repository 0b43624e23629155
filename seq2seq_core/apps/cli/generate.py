"""`s2s generate CHECKPOINT [key=value ...]`: decode source lines (stdin or --input) with a
trained run into the task's output lines (stdout or --output), exactly one out per line in."""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

from ...errors import UsageError
from .shared import registry_of

log = logging.getLogger("s2s")


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "generate",
        parents=[common],
        help="decode lines with a trained model",
        description="Read source lines (stdin or --input), write the task's output lines.",
    )
    s.add_argument(
        "checkpoint",
        help="a run directory (the checkpoint its result.json names, which `s2s train` "
        "tested; else checkpoint_average.pt; else the newest checkpoint) or a checkpoint file "
        "(e.g. an average made with `s2s average`)",
    )
    s.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="e.g. decode.max_sentences=64 run.device=cpu",
    )
    s.add_argument("--input", help="source file (default: stdin)")
    s.add_argument("--output", help="output file (default: stdout)")
    s.add_argument(
        "--task",
        help="the member of a multi-task run to decode for (its tokenisation, "
        "constraint and post-processing)",
    )
    s.add_argument(
        "--beam",
        type=int,
        metavar="N",
        help="beam size (decode.beam; 1 = greedy); default: the task's",
    )
    s.add_argument(
        "--alpha",
        type=float,
        metavar="A",
        help="length penalty alpha (decode.alpha); default: the task's",
    )
    s.add_argument(
        "--max-len-a",
        dest="max_len_a",
        type=float,
        metavar="A",
        help="an output has at most "
        "int(A * source tokens + B) tokens (decode.max_len_a); default: the task's",
    )
    s.add_argument(
        "--max-len-b",
        dest="max_len_b",
        type=int,
        metavar="B",
        help="see --max-len-a (decode.max_len_b)",
    )
    s.add_argument(
        "--pretty",
        action="store_true",
        help="each output as the task displays it for a person "
        "(parsing: an indented tree), a blank line after each, instead of one line per input line",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    """Stream source lines to output lines, exactly one out per line in (`inference.generate_lines`).

    With --output, a regular file appears complete at the end (`files.replacing`); a device or
    a pipe is written as it goes. The output may not be the input. While plugins run (loading,
    encoding, search, post-processing) sys.stdout is stderr, so that what a plugin prints never
    lands among the output lines; the output goes to the real stdout.
    """
    from ...files import readable, writable
    from ...inference.generate import generate_file

    overrides = list(args.overrides)
    for key in ("beam", "alpha", "max_len_a", "max_len_b"):
        if getattr(args, key) is not None:
            overrides.append(f"decode.{key}={getattr(args, key)}")
    if args.input:
        readable(args.input)
    if args.output:
        writable(args.output)
        if args.input and Path(args.output).exists() and Path(args.output).samefile(args.input):
            raise UsageError(
                f"--output {args.output} is the input file: write the output elsewhere"
            )
    stdout = sys.stdout  # the output's, whatever plugins print meanwhile
    with contextlib.redirect_stdout(sys.stderr):
        number, bad = generate_file(
            args.checkpoint,
            registry_of(args),
            overrides,
            args.task,
            args.input,
            args.output,
            stdout,
            "--beam" if args.beam is not None else "decode.beam",
            args.quiet,
            pretty=args.pretty,
        )
    if bad:
        log.warning(
            "%s: %d of %d line(s) could not be decoded and got an empty output line",
            args.input or "<stdin>",
            bad,
            number,
        )
    return 0
