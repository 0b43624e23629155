"""`s2s plot RUN_DIR`: draw a run's learning curves (loss, learning rate, dev metric against
updates and training time) from RUN_DIR/metrics.jsonl as PNG files, while it trains or after."""

from __future__ import annotations

from pathlib import Path

from ..summary import written_lines


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "plot",
        parents=[common],
        help="draw a run's learning curves as PNG files",
        description="Loss, learning rate and dev metric against updates and training time, "
        "from RUN_DIR/metrics.jsonl.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train` (it may still be training)")
    s.add_argument("--output", help="folder for the PNG files (default: RUN_DIR/plots)")
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports matplotlib: here, when the command runs, not at start-up
    # (tests/test_house.py)
    from ..plot import plot_run

    paths = plot_run(Path(args.run_dir), Path(args.output) if args.output else None)
    print(
        "\n".join(
            written_lines(paths, "open them in an image viewer; run again as the run goes on")
        )
    )
    return 0
