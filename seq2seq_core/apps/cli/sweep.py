"""`s2s sweep PRESET (--grid KEY=V1,V2 ... | --variants FILE) --budget-... --dir DIR`: train
variants of a preset to one budget, one after another (the same command resumes), then print
the table and the files written (results.md, results.json, a plot per varied setting)."""

from __future__ import annotations

from pathlib import Path

from ..summary import written_lines
from ..sweep.variants import Sweep, grid, grid_item, read_variants
from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "sweep",
        parents=[common],
        help="train variants of a preset to one budget; one table, plots",
        description="Train a grid or a list of variants of PRESET to one budget, each in DIR/NAME, "
        "one after another (the same command resumes); write DIR/results.md, .json, sweep_KEY.png.",
    )
    s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="common overrides, for every variant"
    )
    which = s.add_mutually_exclusive_group(required=True)  # the variants
    which.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        type=grid_item,
        help="vary KEY (repeatable: the cartesian product)",
    )
    which.add_argument(
        "--variants",
        metavar="FILE.yaml",
        help="a YAML list of override mappings, each optionally named",
    )
    budget = s.add_mutually_exclusive_group(required=True)
    budget.add_argument(
        "--budget-updates", type=int, metavar="N", help="optim.max_updates of every variant"
    )
    budget.add_argument(
        "--budget-minutes", type=float, metavar="M", help="run.max_minutes of every variant"
    )
    s.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="train each variant N times, run.seed 1..N (DIR/NAME/seedS); the table gives the "
        "mean, the seeds' spread and the pooled test figure's interval",
    )
    s.add_argument(
        "--dir",
        required=True,
        help="the sweep's folder: sweep.json, a run directory per variant, results",
    )
    s.add_argument(
        "--print-commands",
        action="store_true",
        help="print one `s2s train` line per variant; run nothing",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    variants = read_variants(args.variants) if args.variants else grid(args.grid)
    budget = (
        {"updates": args.budget_updates}
        if args.budget_updates is not None
        else {"minutes": args.budget_minutes}
    )
    plan = Sweep(
        args.preset,
        variants,
        budget,
        Path(args.dir),
        list(args.overrides),
        list(args.plugin or []),
        args.seeds,
    )
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ..sweep.results import best_lines, table
    from ..sweep.runner import commands
    from ..sweep.runner import run as run_sweep

    if args.print_commands:
        print("\n".join(commands(plan, registry_of(args))))
        return 0
    results = run_sweep(plan, registry_of(args), quiet=args.quiet)
    written = [Path(args.dir) / "results.md", Path(args.dir) / "results.json", *results["plots"]]
    print(
        table(results)
        + "\n".join(
            best_lines(results)
            + written_lines(
                written, f"the table is results.md; each variant's run directory is {args.dir}/NAME"
            )
        )
    )
    return 0
