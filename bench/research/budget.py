"""Train a preset for a fixed wall-clock budget on this machine, then decode and score the test set.

    python bench/research/budget.py multi30k_en_de --minutes 10 60      # scores after 10 and after 60 minutes
    python bench/research/budget.py ptb_sample_parsing --minutes 20
    python bench/research/budget.py multi30k_en_de --minutes 10 60 --precisions fp32 bf16   # equal budgets
    python bench/research/budget.py ptb_sample_parsing --minutes 10 --seeds 3   # the spread of 3 seeds

With --precisions each precision trains in its own run directory (RUN_DIR_fp32, RUN_DIR_bf16, ...)
with run.precision set, and the runs take turns budget by budget (fp32 to 10 minutes, bf16 to 10
minutes, fp32 on to 60, bf16 on to 60), so that the machine's load touches them alike; every row
of the JSON names its precision.

The budget counts the training loop's wall time, validation included (`run.max_minutes`, kept
across resumes): the run trains until the first budget, is evaluated on the test split with the
task's decoding defaults, then resumes until the next budget. Writes bench/research/results/budget_PRESET.json with, per budget: updates, the checkpoint selected on dev,
target tokens/s, validation's seconds and share of the budget (the `valid` records' `seconds`: all of
them, and those that began inside the budget, without the last one that follows it), the
test score and its figures, decoding sentences/s and peak RSS. For parsing
it also scores a right-branching baseline on the same sentences against the same gold trees, and
decodes the test set with and without the tree constraint (`search`): EVALB F1, all-sentences
F1 (f1_all), error / skipped / repaired counts and beam-21 speed of each. The constraint only
changes the search, so one run per linearisation scheme gives both:

    python bench/research/budget.py ptb_sample_parsing --minutes 10 30 task.scheme=vinyals
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from s2s.core.data.members import decode_settings  # noqa: E402
from s2s.core.decode.batched import Decoder  # noqa: E402
from s2s.core.inference import load_for_inference  # noqa: E402
from s2s.core.contract.resampling import scored  # noqa: E402
from s2s.core.setup.config import load_config  # noqa: E402
from s2s.core.setup.registry import Registry  # noqa: E402
from s2s.core.runs.metrics import read_metrics  # noqa: E402
from s2s.core.training.trainer import train  # noqa: E402

from bench.common import corpus_overrides, peak_rss_mib, write  # noqa: E402


def right_branching(words: list[str], tags: list) -> str:
    """(TOP (S w1 (S w2 ... ))) with placeholder tags, punctuation tagged from the word."""
    leaves = [f"({t or 'XX'} {w})" for w, t in zip(words, tags)]
    tree = f"(S {leaves[-1]})"
    for leaf in reversed(leaves[:-1]):
        tree = f"(S {leaf} {tree})"
    return f"(TOP {tree})"


GOLD_FIGURES = (
    "f1",
    "precision",
    "recall",
    "complete_match",
    "error_sentences",
    "skipped_sentences",
    "valid_sentences",
)


def gold_figures(gold: list[str], trees: list[str]) -> dict:
    """EVALB against the real gold trees, and the F1 over all sentences (s2s.plugins.parsing.evalb)."""
    from s2s.plugins.parsing.evalb import evalb

    result = evalb(gold, trees)
    return {
        **{k: result.summary[k] for k in GOLD_FIGURES},
        "f1_all": round(result.all_sentences["f1_all"], 2),
    }


def gold_scores(task, trees: list[str], sources: list[str]) -> dict:
    """Parsing only: EVALB against the real gold trees, and the right-branching baseline."""
    from s2s.plugins.parsing.linearise import punctuation_tags

    gold = list(task.references("test"))
    baseline = [right_branching(s.split(), punctuation_tags(s.split())) for s in sources]
    return {
        "gold_evalb": gold_figures(gold, trees),
        "right_branching": gold_figures(gold, baseline),
    }


def searches(task, model, sources: list[str], settings, max_sentences: int, searched=None) -> dict:
    """Parsing only: the test set searched with and without the tree constraint (the same model:
    the constraint changes the search, not training): EVALB and all-sentences F1 against the
    gold trees, error / skipped / repaired counts and sentences/s of each. `searched`: what the
    search serves, `task` or its multi-task member."""
    gold = list(task.references("test"))
    out, was = {}, task.cfg.constrained
    try:
        for constrained in (True, False):
            task.cfg.constrained = constrained
            t0 = time.time()
            hyps = Decoder(
                model, searched or task, settings, torch.device("cpu"), max_sentences
            ).generate(sources, postprocess=False)
            trees, repaired = task.rebuild(hyps, sources)
            seconds = time.time() - t0
            out["constrained" if constrained else "unconstrained"] = {
                **gold_figures(gold, trees),
                "repaired": repaired,
                "decode_sentences_per_s": round(len(sources) / seconds, 2),
            }
    finally:
        task.cfg.constrained = was
    out["constrained_speed_ratio"] = round(
        out["constrained"]["decode_sentences_per_s"]
        / out["unconstrained"]["decode_sentences_per_s"],
        3,
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("preset")
    p.add_argument("--minutes", type=float, nargs="+", default=[10.0])
    p.add_argument("--run-dir", default=None)
    p.add_argument(
        "--note", default="", help="what else ran on the machine meanwhile, for the record"
    )
    p.add_argument(
        "--name",
        default=None,
        help="results file bench/research/results/NAME.json (default budget_PRESET)",
    )
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=["fp32", "bf16", "auto"],
        help="train each in its own run directory at the same budgets (default: the preset's)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train each setting N times (run.seed 1..N, RUN_DIR_seedS), taking turns budget by "
        "budget; the JSON gives each run's test figure with its 95%% interval and, per budget, "
        "the seeds' mean and standard deviation",
    )
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args()
    if args.seeds < 1:
        p.error(f"--seeds {args.seeds}: at least 1")
    torch.set_num_threads(2)  # decoding; training uses the preset's run.threads unless overridden
    run_dir = args.run_dir or f"runs/bench_{args.preset}"
    reg = Registry.installed()
    results = []
    seeds = range(1, args.seeds + 1) if args.seeds > 1 else [None]
    for minutes in sorted(args.minutes):
        for precision in args.precisions or [None]:
            for seed in seeds:
                results.append(budget_row(args, reg, minutes, run_dir, precision, seed))
                print(json.dumps(results[-1]))
                path = write(
                    args.name or f"budget_{args.preset}",
                    {
                        "preset": args.preset,
                        "overrides": args.overrides,
                        "note": args.note,
                        "seeds": args.seeds,
                        "results": results,
                        "over_seeds": over_seeds(results) if args.seeds > 1 else None,
                    },
                )  # after each budget
                print(f"wrote {path}")


def over_seeds(results: list[dict]) -> list[dict]:
    """For each budget and precision: each seed's primary test figure, their mean and sample
    standard deviation."""
    import statistics

    groups: dict[tuple, list] = {}
    for row in results:
        if "test" in row:
            groups.setdefault((row["minutes"], row["precision"]), []).append(row)
    out = []
    for (minutes, precision), rows in groups.items():
        name = next(iter(rows[0]["test"]))
        values = [r["test"][name] for r in rows]
        out.append(
            {
                "minutes": minutes,
                "precision": precision,
                "figure": name,
                "seeds": [r["seed"] for r in rows],
                "values": values,
                "intervals": [r["test"].get("intervals", {}).get(name) for r in rows],
                "mean": round(statistics.mean(values), 2),
                "sd": round(statistics.stdev(values), 2) if len(values) > 1 else None,
            }
        )
    return out


def budget_row(
    args, reg, minutes: float, run_dir: str, precision: str | None, seed: int | None
) -> dict:
    """Train (or resume) to `minutes`, then decode and score the test split (of every member)."""
    if precision is not None:
        run_dir = f"{run_dir}_{precision}"
    if seed is not None:
        run_dir = f"{run_dir}_seed{seed}"
    extra = [] if precision is None else [f"run.precision={precision}"]
    extra += [] if seed is None else [f"run.seed={seed}"]
    cfg = load_config(
        args.preset,
        [
            *corpus_overrides(args.preset),
            f"run.dir={run_dir}",
            f"run.max_minutes={minutes}",
            "run.quiet=true",
            "optim.max_updates=1000000",
            *extra,
            *args.overrides,
        ],
        registry=reg,
    )
    t0 = time.time()
    train(cfg, reg, quiet=True)
    records = read_metrics(run_dir)
    trains = [r for r in records if r["kind"] == "train"]
    speeds = [r["tgt_tokens_per_s"] for r in trains]
    valids = [r for r in records if r["kind"] == "valid"]
    validating = sum(
        r.get("seconds", 0.0) for r in valids
    )  # all, the last (after the budget ran out) included
    inside = sum(
        r.get("seconds", 0.0) for r in valids if r["elapsed"] - r.get("seconds", 0.0) < 60 * minutes
    )
    row = {
        "minutes": minutes,
        "seed": cfg.run.seed,
        "precision": str(cfg.run.precision),
        "run_dir": run_dir,
        "updates": records[-1]["update"],
        "tgt_tokens_per_s_median": sorted(speeds)[len(speeds) // 2] if speeds else None,
        "validations": len(valids),
        "validation_s": round(validating, 1),
        "validation_share": round(validating / (60 * minutes), 4),
        "validation_in_budget_s": round(inside, 1),
        "validation_in_budget_share": round(inside / (60 * minutes), 4),
    }
    result = json.loads((Path(run_dir) / "result.json").read_text())
    row["selection"] = {
        k: result[k] for k in ("checkpoint", "dev_select", "best_update") if k in result
    }
    if cfg.tasks is None:
        row.update(test_scores(run_dir, reg, None))
    else:
        trained = result["member_updates"]
        row["tasks"] = {
            name: {"updates": trained[name], **test_scores(run_dir, reg, name)}
            for name in cfg.tasks
        }
    row.update(peak_rss_mib=round(peak_rss_mib(), 1), wall_s=round(time.time() - t0, 1))
    return row


def test_scores(run_dir: str, reg, name: str | None) -> dict:
    """The test split of the run's task (of member `name` of a multi-task run) decoded with its
    decoding defaults and scored; for parsing also against the gold trees, and both searches."""
    cfg_run, task, model = load_for_inference(run_dir, reg, task=name)  # task: the run's member
    own = task.task
    # read through the task: preparing it again here would train a vocabulary of its own for a
    # member that shares one (multitask.shared_vocab prepares it beneath the joint vocabulary)
    sources, refs = map(list, zip(*own.read_split("test")))
    t1 = time.time()
    hyps = Decoder(
        model,
        task,
        decode_settings(own, cfg_run.decode),
        torch.device("cpu"),
        cfg_run.decode.max_sentences,
    ).generate(sources, postprocess=False)
    decode_s = time.time() - t1
    score = scored(task, hyps, refs, sources)  # each figure with its 95% interval
    row = {
        "test": score.as_dict(),
        "test_sentences": len(sources),
        "decode_sentences_per_s": round(len(sources) / decode_s, 2),
        "decoding": asdict(decode_settings(own, cfg_run.decode)),
    }
    if own.name == "parsing":
        row.update(gold_scores(own, own.rebuild(hyps, sources)[0], sources))
        row["search"] = searches(
            own,
            model,
            sources,
            decode_settings(own, cfg_run.decode),
            cfg_run.decode.max_sentences,
            searched=task,
        )
    return row


if __name__ == "__main__":
    main()
