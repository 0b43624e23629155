"""`s2s average`: average checkpoints' weights element by element (section 6.1), a run's last K
or the files given, into one checkpoint that `s2s generate` and `s2s export` take."""

from __future__ import annotations

from pathlib import Path

from ...files import no_such_run


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "average",
        parents=[common],
        help="average checkpoints (section 6.1)",
        description="Average checkpoints' weights element by element (section 6.1): a run's "
        "last K, or the files given.",
    )
    s.add_argument("inputs", nargs="+", help="a run directory with --last, or checkpoint files")
    s.add_argument("--last", type=int, help="average the last K checkpoints of the run directory")
    s.add_argument(
        "--output",
        help="default: RUN_DIR/checkpoint_average.pt (with --last), else ./checkpoint_average.pt; "
        "never one of the inputs or a rolling checkpoints/checkpoint_NNNNNNNN.pt",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...runs import checkpoint

    if args.last is not None and len(args.inputs) == 1 and not Path(args.inputs[0]).exists():
        raise no_such_run(args.inputs[0])

    paths, output = checkpoint.average_files(args.inputs, args.last, args.output)
    print(f"averaged {len(paths)} checkpoints into {output}")
    return 0
