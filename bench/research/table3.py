"""Table 3 of the paper at small scale: variations of the Transformer on Multi30k EN-DE, each
trained for the same wall-clock budget on this machine, through `s2s sweep`.

    python bench/research/table3.py                      # 9 variants x 6 minutes (about 70 minutes in all)
    python bench/research/table3.py --minutes 3 --only base A1 A4

The base is the `multi30k_en_de` preset (N=3, d_model 256, d_ff 1024, P_drop 0.3, label
smoothing 0.1) with h=8 heads (d_k = d_v = 32); every row changes one thing of it, as the
paper's rows change one thing of its base model: (A) heads 1 and 4 at constant computation
(d_k = d_model/h), (B) a halved d_k (16), (C) a smaller (d_model 128, d_ff 512) and a larger
(N=4) model, (D) no dropout, no label smoothing, (E) learned positional embeddings. The paper
trains each row for the same number of steps (100k); here each row gets the same minutes, so a
bigger model takes fewer updates (the table shows them). The sweep runs in-process, one variant
after another in SWEEP_DIR (default runs/table3): the same command resumes it. A row whose
setting this build of s2s does not have (an unknown config key) is skipped and listed.

Writes bench/research/results/NAME.json (default table3): the machine, the command, the budget and every
row's parameters, updates, dev perplexity per target token (the final model's, on val), dev
sacreBLEU (of the model tested, selected on val), test sacreBLEU and tokenised BLEU
(test_2016_flickr), and prints a Markdown table with the paper's direction for each row.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import shlex
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from s2s.core.apps.sweep import runner  # noqa: E402
from s2s.core.apps.sweep.variants import Sweep, Variant  # noqa: E402
from s2s.core.errors import ConfigError  # noqa: E402
from s2s.core.setup.config import load_config  # noqa: E402
from s2s.core.setup.registry import Registry  # noqa: E402

from bench.common import corpus_overrides, write  # noqa: E402

PRESET = "multi30k_en_de"
BASE = ["model.heads=8", "run.threads=2"]  # the preset with the paper's 8 heads: d_k = 256 / 8 = 32

# name, Table 3 group, overrides of the base, what the paper found (newstest2013: base PPL 4.92, BLEU 25.8)
ROWS = [
    ("base", "base", [], "reference: PPL 4.92, BLEU 25.8"),
    ("A1", "(A)", ["model.heads=1"], "worse: 1 head 0.9 BLEU below the best (24.9), PPL 5.29"),
    (
        "A4",
        "(A)",
        ["model.heads=4"],
        "slightly worse: 25.5 BLEU, PPL 5.00; too many heads (32) also worse: 25.4",
    ),
    ("B", "(B)", ["model.d_k=16"], "worse: smaller d_k hurts (d_k 16: 25.1 BLEU, PPL 5.16)"),
    (
        "C-small",
        "(C)",
        ["model.d_model=128", "model.d_ff=512"],
        "worse: bigger is better (d_model 256: 24.5 BLEU, PPL 5.75)",
    ),
    (
        "C-large",
        "(C)",
        ["model.layers=4"],
        "better: bigger is better (N 8: PPL 4.88; d_model 1024: 26.0 BLEU, PPL 4.66)",
    ),
    (
        "D-dropout0",
        "(D)",
        ["model.dropout=0"],
        "worse: dropout helps (P_drop 0: 24.6 BLEU, PPL 5.77)",
    ),
    (
        "D-ls0",
        "(D)",
        ["optim.label_smoothing=0"],
        "lower PPL (4.67) but lower BLEU (25.3): smoothing hurts PPL, helps BLEU",
    ),
    ("E-learned", "(E)", ["model.positions=learned"], "about equal: learned 25.7 BLEU, PPL 4.92"),
]


def available(rows: list, common: list[str], registry) -> tuple[list, list]:
    """The rows this build can train, and the skipped ones with the reason (an unknown key)."""
    kept, skipped = [], []
    for row in rows:
        try:
            load_config(PRESET, [*common, *row[2]], registry=registry)
            kept.append(row)
        except ConfigError as e:
            if "unknown config key" not in str(e):
                raise
            skipped.append({"row": row[0], "overrides": row[2], "reason": str(e)})
            print(f"skipped {row[0]}: {e}", file=sys.stderr)
    return kept, skipped


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--minutes", type=float, default=6.0, help="training minutes per variant (run.max_minutes)"
    )
    p.add_argument("--dir", default="runs/table3", help="the sweep's folder (resumable)")
    p.add_argument("--only", nargs="+", choices=[r[0] for r in ROWS], help="these rows only")
    p.add_argument("--name", default="table3", help="results file bench/research/results/NAME.json")
    p.add_argument(
        "overrides", nargs="*", help="common overrides, for every row (e.g. a smaller data set)"
    )
    args = p.parse_intermixed_args()
    torch.set_num_threads(2)
    registry = Registry.installed()
    common = [*corpus_overrides(PRESET), *BASE, *args.overrides]
    rows, skipped = available(
        [r for r in ROWS if not args.only or r[0] in args.only], common, registry
    )
    plan = Sweep(
        PRESET,
        [Variant(name, overrides) for name, _, overrides, _ in rows],
        {"minutes": args.minutes},
        Path(args.dir),
        common,
    )
    results = runner.run(plan, registry, quiet=True)
    out = []
    for (name, group, overrides, paper), row in zip(rows, results["rows"]):
        test = json.loads((Path(row["run_dir"]) / "result.json").read_text()).get("test", {})
        out.append(
            {
                "row": name,
                "group": group,
                "changes": " ".join(overrides) or "-",
                "params": row["params"],
                "updates": row["updates"],
                "dev_ppl": row["dev_ppl"],
                "dev_bleu": row["dev_metric"],
                "test_bleu": test.get("bleu"),
                "test_bleu_tok": test.get("bleu_tok"),
                "checkpoint": row["checkpoint"],
                "paper": paper,
            }
        )
    table = markdown(out)
    path = write(
        args.name,
        {
            "command": shlex.join(["python", "bench/research/table3.py", *sys.argv[1:]]),
            "preset": PRESET,
            "common_overrides": common,
            "budget": {"minutes_per_variant": args.minutes},
            "sweep_dir": args.dir,
            "rows": out,
            "skipped": skipped,
            "table": table,
        },
    )
    print(table)
    print(f"wrote {path} (the sweep's own table and plots: {args.dir}/results.md, sweep_*.png)")


def markdown(rows: list[dict]) -> str:
    def cell(v, digits=2):
        return (
            "-"
            if v is None
            else f"{v:,}"
            if isinstance(v, int)
            else f"{v:.{digits}f}"
            if isinstance(v, float)
            else str(v)
        )

    head = [
        "",
        "row",
        "changes",
        "params",
        "updates",
        "dev PPL",
        "dev BLEU",
        "test BLEU",
        "test BLEU (tok)",
        "the paper (Table 3)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r["group"],
                    r["row"],
                    f"`{r['changes']}`" if r["changes"] != "-" else "-",
                    cell(r["params"]),
                    cell(r["updates"]),
                    cell(r["dev_ppl"]),
                    cell(r["dev_bleu"]),
                    cell(r["test_bleu"]),
                    cell(r["test_bleu_tok"]),
                    r["paper"],
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
