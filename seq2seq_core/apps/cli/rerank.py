"""`s2s rerank RUN --input F --nbest N --with RUN2 --reverse RUN3 (--weights W | --tune-ref R)`:
an n-best list rescored by other runs and a reverse run (noisy channel), the weights tuned on a
dev set (docs/decoding.md, "Reranking"); a multilingual model's direction with --src-lang and
--tgt-lang (the reverse runs' swapped)."""

from __future__ import annotations

import contextlib
import json
import math
import sys

from ...errors import UsageError
from ...files import atomic_write_text, output_file
from ...textio import read_lines
from .shared import add_language_options


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "rerank",
        parents=[common],
        help="rerank a run's n-best lists with other runs (and reverse runs: noisy channel)",
        description="Each line's --nbest N outputs of RUN are scored by the --with runs (the "
        "same direction) and the --reverse runs (target to source: log p(source | output)); "
        "the output with the highest search score + sum of weight x score is written. "
        "--tune-ref REFS chooses the weights on the input (a dev set) by coordinate ascent on "
        "the task's metric and prints them as JSON.",
    )
    s.add_argument("run", help="the run whose n-best lists are reranked")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="RUN's overrides")
    s.add_argument("--input", required=True, help="source lines")
    s.add_argument("--output", help="output file (default: stdout)")
    s.add_argument("--nbest", type=int, default=8, metavar="N", help="candidates a line (8)")
    s.add_argument("--with", dest="forward", nargs="+", default=[], metavar="RUN_DIR")
    s.add_argument("--reverse", nargs="+", default=[], metavar="RUN_DIR")
    add_language_options(s)  # RUN's and --with's; --reverse's swapped
    how = s.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--weights", help="one weight a scorer, comma-separated: --with's, then --reverse's"
    )
    how.add_argument(
        "--tune-ref",
        help="references of --input: tune the weights, print them (and with --output, write "
        "the output they choose)",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    """Rerank --input's n-best lists. Everything that can be checked is, before any search:
    the options (finite weights, one a scorer), the output (`files.output_file`: never an
    input, never a run's file), --nbest against the target vocabulary, each scorer's task and
    direction against RUN's, each input line against every model's positions. Errors name the
    user's files, never a temporary one."""
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...inference import load_run
    from ...contract.task import checked_score
    from ...inference.rerank import Scorers, choose, features, too_long, tune, unlike

    if args.nbest < 2:
        raise UsageError(f"--nbest {args.nbest}: reranking needs 2 or more candidates")
    k = len(args.forward) + len(args.reverse)
    if k == 0:
        raise UsageError("give the runs that rescore: --with RUN_DIR and/or --reverse RUN_DIR")
    weights = None
    if args.weights is not None:
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            raise UsageError(f"--weights {args.weights}: comma-separated numbers") from None
        if len(weights) != k:
            raise UsageError(
                f"--weights {args.weights}: {len(weights)} weight(s) for {k} scorer(s)"
            )
        if not all(map(math.isfinite, weights)):
            raise UsageError(f"--weights {args.weights}: each weight a finite number")
    if args.output:
        output_file(
            args.output, "--output", [("--input", args.input), ("--tune-ref", args.tune_ref)]
        )
    lines = read_lines(args.input)
    references = read_lines(args.tune_ref) if args.tune_ref else None
    if references is not None and len(references) != len(lines):
        raise UsageError(
            f"--tune-ref {args.tune_ref} has {len(references)} line(s), --input {len(lines)}"
        )
    plugins = args.plugin or []
    # a multilingual model's direction: RUN and --with translate src -> tgt, --reverse back;
    # each run checks the names against its codes as it loads (the nearest named)
    langs = {"src_lang": args.src_lang, "tgt_lang": args.tgt_lang}
    ahead = [f"decode.{k}={v}" for k, v in langs.items() if v is not None]
    back = [
        f"decode.{k}={v}" for k, v in zip(("tgt_lang", "src_lang"), langs.values()) if v is not None
    ]
    with contextlib.redirect_stdout(sys.stderr):
        main = load_run(
            args.run, [*args.overrides, *ahead, f"decode.beam={args.nbest}"], plugins=plugins
        )
        vocab = main.task.tgt_vocab_size
        if args.nbest > vocab:
            raise UsageError(
                f"--nbest {args.nbest}: above the target vocabulary of {args.run} ({vocab} "
                "tokens); a beam search keeps at most that many candidates"
            )
        forward = [load_run(r, ahead, plugins=plugins) for r in args.forward]
        reverse = [load_run(r, back, plugins=plugins) for r in args.reverse]
        for option, paths, runs in (
            ("--with", args.forward, forward),
            ("--reverse", args.reverse, reverse),
        ):
            for path, other in zip(paths, runs):
                problem = unlike(main, other, reverse=option == "--reverse")
                if problem:
                    raise UsageError(f"{option} {path}: {problem} (RUN {args.run})")
        problem = too_long(lines, main, Scorers(forward, reverse))
        if problem:
            raise UsageError(f"--input {args.input}, {problem}")
        candidates = main.outputs(lines, n=args.nbest)
        rows = features(lines, candidates, Scorers(forward, reverse))
    if references is not None:

        def score(hyps):  # the task's primary figure, as checked wherever a score comes in
            return checked_score(main.task, main.task.score(hyps, references))

        searched = score([c[0].text for c in candidates])
        higher = searched.higher_is_better
        metric = lambda hyps, refs: score(hyps).value  # noqa: E731
        weights, figure = tune(rows, candidates, references, metric, higher)
        found = {"weights": weights, "dev": figure, "search": searched.value}
        print(json.dumps({**found, "metric": searched.name, "higher_is_better": higher}))
        if not args.output:
            return 0
    picked = [cands[j].text for cands, j in zip(candidates, choose(rows, weights))]
    text = "".join(line.replace("\n", " ") + "\n" for line in picked)
    if args.output:
        atomic_write_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0
