"""Multi-task against single-task training at an equal wall-clock budget (bench/research/budget.py's rows).

    python bench/research/multitask_budget.py --minutes 30       # ~100 minutes: three 30-minute runs

Trains ptb_sample_parsing_multi30k (one model, parsing and Multi30k EN-DE) and the two
single-task presets it takes its members from, ptb_sample_parsing and multi30k_en_de, each for
the same budget on the same threads, one after the other, and scores each task's test split as
bench/research/budget.py does: parsing F1 over all sentences (f1_all; error and skipped sentences count as
missed) and EVALB against the gold trees, sacreBLEU on test_2016_flickr. The multi-task run
spends its budget on both tasks (member_updates says how it was shared). Writes
bench/research/results/multitask_budget.json, with `comparison`: each task's figure single vs multi.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV), as `s2s train` has them

import argparse
import json
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from s2s.core.setup.registry import Registry  # noqa: E402

from bench.research.budget import budget_row  # noqa: E402
from bench.common import machine, write  # noqa: E402

MULTI = "ptb_sample_parsing_multi30k"
SINGLE = {"parse": "ptb_sample_parsing", "translate": "multi30k_en_de"}


def figures(entry: dict, task: str) -> dict:
    """The figures a task is compared by, from one task's part of a budget row."""
    if task == "parse":
        gold = entry["gold_evalb"]
        return {
            "f1_all": entry["test"]["f1_all"],
            "gold_f1": gold["f1"],
            "gold_f1_all": gold["f1_all"],
            "error_sentences": gold["error_sentences"],
            "skipped_sentences": gold["skipped_sentences"],
            "repaired": entry["test"]["repaired"],
            "decode_sentences_per_s": entry["decode_sentences_per_s"],
        }
    return {
        "bleu": entry["test"]["bleu"],
        "chrf": entry["test"]["chrf"],
        "decode_sentences_per_s": entry["decode_sentences_per_s"],
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument(
        "--note", default="", help="what else ran on the machine meanwhile, for the record"
    )
    p.add_argument(
        "--order", nargs="+", default=[MULTI, *SINGLE.values()], help="the presets, in run order"
    )
    args = p.parse_args()
    torch.set_num_threads(2)  # decoding; training uses the presets' run.threads (2)
    reg = Registry.installed()
    rows, result = {}, {"minutes": args.minutes, "note": args.note, "machine": machine()}
    for preset in args.order:
        run_args = argparse.Namespace(preset=preset, overrides=[])
        rows[preset] = budget_row(
            run_args, reg, args.minutes, f"runs/bench_multitask_{preset}", None
        )
        print(json.dumps(rows[preset])[:2000])
        result["runs"] = rows
        write("multitask_budget", result)
        if MULTI in rows:
            result["comparison"] = {
                task: {
                    "single": figures(rows[single], task) if single in rows else None,
                    "multi": figures(rows[MULTI]["tasks"][task], task),
                    "updates_single": rows[single]["updates"] if single in rows else None,
                    "updates_multi": rows[MULTI]["tasks"][task]["updates"],
                }
                for task, single in SINGLE.items()
            }
        print(f"wrote {write('multitask_budget', result)}")  # after each run


if __name__ == "__main__":
    main()
