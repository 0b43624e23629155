"""Per-update dev curves of finished runs, side by side: at every validation the dev nll, the
task's figure and the sentences it left out, with the training nll of the log record just
before (dropout on), as `s2s train` wrote them to each run's metrics.jsonl.

    python bench/research/dev_curves.py --name dev_curves_ptb_vinyals tied=runs/bench_ptb_vinyals_tied untied=runs/bench_ptb_vinyals

Each LABEL=RUN_DIR names one run; the JSON keeps each run's curve and the overrides it was
trained with (its config.yaml), the table prints one row per update that every run validated.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from s2s.core.runs.metrics import read_metrics  # noqa: E402

from bench.common import table, write  # noqa: E402

LEFT_OUT = ("error_sentences", "skipped_sentences", "repaired")


def curve(run_dir: str) -> list[dict]:
    """One point per validation: update, dev nll, primary figure and left-out counts, train nll."""
    points, train_nll = [], None
    for r in read_metrics(run_dir):
        if r["kind"] == "train":
            train_nll = r["nll"]
        elif r["kind"] == "valid":
            figures = {k: r[k] for k in ("f1_all", "bleu", "select", "accuracy") if k in r}
            points.append(
                {
                    "update": r["update"],
                    "dev_nll": round(r["nll"], 4),
                    **figures,
                    **{k: r[k] for k in LEFT_OUT if k in r},
                    "train_nll": None if train_nll is None else round(train_nll, 4),
                }
            )
    return points


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    ap.add_argument("--name", required=True, help="results file bench/research/results/NAME.json")
    args = ap.parse_args(argv)
    runs = {}
    for spec in args.runs:
        label, sep, run_dir = spec.partition("=")
        if not sep or not (Path(run_dir) / "metrics.jsonl").is_file():
            sys.exit(f"{spec}: expected LABEL=RUN_DIR of a run with a metrics.jsonl")
        config = (Path(run_dir) / "config.yaml").read_text(encoding="utf-8")
        runs[label] = {"run_dir": run_dir, "config": config, "curve": curve(run_dir)}
    common = set.intersection(*({p["update"] for p in r["curve"]} for r in runs.values()))
    rows = []
    for update in sorted(common):
        row = {"update": update}
        for label, r in runs.items():
            p = next(p for p in r["curve"] if p["update"] == update)
            row.update({f"{label} {k}": v for k, v in p.items() if k not in ("update", *LEFT_OUT)})
        rows.append(row)
    print(table(rows))
    print(write(args.name, {"benchmark": "per-update dev curves", "runs": runs, "table": rows}))


if __name__ == "__main__":
    main()
