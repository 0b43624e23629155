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
        "--ensemble",
        nargs="+",
        default=[],
        metavar="RUN",
        help="decode with these runs (or checkpoints) too, as one model: the average of their "
        "next-token probabilities at every step; same task and vocabularies, any shape",
    )
    s.add_argument(
        "--nbest",
        type=int,
        default=1,
        metavar="N",
        help="the N best outputs of each line (at most the beam; with --sampling: N drawn), "
        "as one JSON object a line with their scores (docs/decoding.md)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line with each output's search score and the model's "
        "log-probability, also for a single output",
    )
    s.add_argument(
        "--sampling",
        action="store_true",
        help="draw outputs from the model's distribution instead of searching for the best",
    )
    s.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        metavar="T",
        help="with --sampling: divide the log-probabilities by T (< 1 sharper, > 1 flatter)",
    )
    s.add_argument(
        "--top-k",
        dest="top_k",
        type=int,
        default=0,
        metavar="K",
        help="with --sampling: draw among the K most probable tokens only (0: all)",
    )
    s.add_argument(
        "--top-p",
        dest="top_p",
        type=float,
        default=1.0,
        metavar="P",
        help="with --sampling: draw among the fewest most probable tokens whose probability "
        "reaches P (nucleus sampling; 1: all)",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=0,
        help="with --sampling: the same seed, input and settings draw the same outputs",
    )
    s.add_argument(
        "--prefixes",
        metavar="FILE",
        help="a target prefix for each input line (one a line, an empty line for none): "
        "each output starts with it, as the task tokenises it",
    )
    s.add_argument(
        "--terms",
        metavar="FILE",
        help="terminology: lines `source term<TAB>target term`; when an input line holds a "
        "source term, its target term appears in every output (docs/decoding.md)",
    )
    s.add_argument(
        "--score-targets",
        dest="score_targets",
        metavar="FILE",
        help="instead of searching, the model's log-probability of these target lines, one "
        "a line of input (JSON: per token, the sum, and the sum over the length penalty)",
    )
    s.add_argument(
        "--pretty",
        action="store_true",
        help="each output as the task displays it for a person "
        "(parsing: an indented tree), a blank line after each, instead of one line per input line",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    """Stream source lines to output lines, exactly one out per line in
    (`inference.generate_lines`).

    With --output, a regular file appears complete at the end (`files.replacing`); a device or
    a pipe is written as it goes. The output may not be the input, nor a file of a run read
    here. While plugins run (loading, encoding, search, post-processing) sys.stdout is stderr,
    so that what a plugin prints never lands among the output lines; the output goes to the
    real stdout. Options are checked before any model is loaded.
    """
    from ...decode.batched import Wanted
    from ...decode.search import Sampling
    from ...files import not_a_run_file, readable, writable
    from ...inference.generate import Asked, Job, generate_file

    overrides = list(args.overrides)
    for key in ("beam", "alpha", "max_len_a", "max_len_b"):
        if getattr(args, key) is not None:
            overrides.append(f"decode.{key}={getattr(args, key)}")
    asked = _asked(args, Asked, Wanted, Sampling)
    for path in (args.input, args.prefixes, args.terms, args.score_targets):
        if path:
            readable(path)
    if args.output:
        writable(args.output)
        not_a_run_file(args.output, "--output")
        for path, option in (
            (args.input, "the input file"),
            (args.prefixes, "--prefixes"),
            (args.terms, "--terms"),
            (args.score_targets, "--score-targets"),
        ):
            if path and Path(args.output).exists() and Path(args.output).samefile(path):
                raise UsageError(f"--output {args.output} is {option}: write the output elsewhere")
    job = Job(
        runs=[args.checkpoint, *args.ensemble],
        input=args.input,
        output=args.output,
        task=args.task,
        overrides=overrides,
        quiet=args.quiet,
        asked=asked,
        beam_setting="--beam" if args.beam is not None else "decode.beam",
    )
    stdout = sys.stdout  # the output's, whatever plugins print meanwhile
    with contextlib.redirect_stdout(sys.stderr):
        counts = generate_file(job, registry_of(args), stdout)
    name = args.input or "<stdin>"
    if counts.undecodable:
        log.warning(
            "%s: %d of %d line(s) could not be decoded and got an empty output line",
            name,
            counts.undecodable,
            counts.lines,
        )
    if counts.without_output:
        log.warning(
            "%s: for %d of %d line(s) the search found no output within the length limit "
            "(an empty output line each; a larger decode.max_len_b may find one)",
            name,
            counts.without_output,
            counts.lines,
        )
    return 0


def _asked(args, Asked, Wanted, Sampling):
    """What the options ask beyond the single best; a value out of range is a UsageError
    naming its option."""
    if args.nbest < 1:
        raise UsageError(f"--nbest {args.nbest}: must be 1 or more")
    sampling = None
    if args.sampling:
        sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
        problem = sampling.problem()
        if problem:
            raise UsageError(f"--{problem}")
    else:
        for option, value, default in (
            ("--temperature", args.temperature, 1.0),
            ("--top-k", args.top_k, 0),
            ("--top-p", args.top_p, 1.0),
            ("--seed", args.seed, 0),
        ):
            if value != default:
                raise UsageError(f"{option} {value}: only with --sampling (it draws outputs)")
    if args.score_targets and (args.sampling or args.nbest > 1 or args.prefixes or args.terms):
        raise UsageError(
            "--score-targets scores given outputs: it takes no --nbest, --sampling, --prefixes "
            "or --terms"
        )
    if args.pretty and (args.nbest > 1 or args.json or args.score_targets):
        raise UsageError(
            "--pretty shows one output a line: not with --nbest, --json or --score-targets"
        )
    return Asked(
        wanted=Wanted(args.nbest, sampling),
        json=args.json,
        pretty=args.pretty,
        prefixes=args.prefixes,
        terms=args.terms,
        targets=args.score_targets,
    )
