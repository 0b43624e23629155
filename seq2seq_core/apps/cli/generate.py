"""`s2s generate CHECKPOINT [key=value ...]`: decode source lines (stdin or --input) with a
trained run into the task's output lines (stdout or --output), exactly one out per line in."""

from __future__ import annotations

import contextlib
import logging
import sys

from ...errors import UsageError
from ...files import output_file, readable
from .shared import (
    add_sampling_options,
    add_search_options,
    registry_of,
    sampling_of,
    search_overrides,
)

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
    add_search_options(s)
    s.add_argument(
        "--nbest",
        type=int,
        default=1,
        metavar="N",
        help="the N best outputs of each line (at most the beam; with --sampling: N drawn), "
        "as one JSON object a line with their scores (docs/decoding.md)",
    )
    s.add_argument(
        "--mbr",
        choices=["chrf", "bleu", "task"],
        help="minimum Bayes risk: of the --nbest N outputs (the beam's or, with --sampling, "
        "drawn), write the one with the best expected UTILITY against the others: chrF, "
        "BLEU, or the task's own metric (an error rate: the lowest expected error) "
        "(docs/decoding.md)",
    )
    s.add_argument(
        "--mbr-method",
        choices=["pairwise", "aggregate"],
        help="how --mbr computes the expected utility: pairwise, the exact mean of the N^2 "
        "sentence scores (the default), or aggregate, reference aggregation's N scores against "
        "the averaged references, an approximation (docs/decoding.md)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="one JSON object a line with each output's search score and the model's "
        "log-probability, also for a single output",
    )
    add_sampling_options(s)
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
        "--line-terms",
        dest="line_terms",
        metavar="FILE",
        help="terminology per line: for each input line, the target terms all its outputs "
        "hold, TAB-separated (an empty line for none)",
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
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...decode.search import Wanted
    from ...inference.generate import Asked, Job, generate_file

    overrides = search_overrides(args)
    asked = _asked(args, Asked, Wanted)
    for path in (args.input, args.prefixes, args.terms, args.line_terms, args.score_targets):
        if path:
            readable(path)
    if args.output:
        output_file(
            args.output,
            "--output",
            [
                ("the input file", args.input),
                ("--prefixes", args.prefixes),
                ("--terms", args.terms),
                ("--line-terms", args.line_terms),
                ("--score-targets", args.score_targets),
            ],
        )
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


def _asked(args, Asked, Wanted):
    """What the options ask beyond the single best; a value out of range is a UsageError
    naming its option."""
    if args.nbest < 1:
        raise UsageError(f"--nbest {args.nbest}: must be 1 or more")
    sampling = sampling_of(args)
    searching = args.sampling or args.nbest > 1 or args.prefixes or args.terms or args.line_terms
    if args.score_targets and searching:
        raise UsageError(
            "--score-targets scores given outputs: it takes no --nbest, --sampling, --prefixes, "
            "--terms or --line-terms"
        )
    if args.mbr and args.nbest < 2:
        raise UsageError(f"--mbr {args.mbr} chooses among candidates: give --nbest 2 or more")
    if args.mbr_method and not args.mbr:
        raise UsageError(f"--mbr-method {args.mbr_method} computes --mbr: give --mbr chrf or bleu")
    if args.sampling and (args.terms or args.line_terms):
        from ...decode.terminology import SAMPLING_REFUSED

        raise UsageError(
            f"--sampling with {'--terms' if args.terms else '--line-terms'}: {SAMPLING_REFUSED}"
        )
    if args.mbr and args.score_targets:
        raise UsageError("--mbr chooses among outputs: not with --score-targets")
    if args.pretty and ((args.nbest > 1 and not args.mbr) or args.json or args.score_targets):
        raise UsageError(
            "--pretty shows one output a line: not with --nbest, --json or --score-targets"
        )
    return Asked(
        wanted=Wanted(args.nbest, sampling, mbr=args.mbr, mbr_method=args.mbr_method or "pairwise"),
        json=args.json,
        pretty=args.pretty,
        prefixes=args.prefixes,
        terms=args.terms,
        line_terms=args.line_terms,
        targets=args.score_targets,
    )
