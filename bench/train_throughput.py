"""End-to-end training throughput: `s2s train multi30k_en_de` as a user runs it, fp32 against bf16.

    python -m bench.train_throughput                      # 3 rounds of fp32 and bf16 (~25 min)
    python -m bench.train_throughput --rounds 1 --warmup-updates 5 --seconds 20 --log-interval 5

Each run is a subprocess of the real command line, `python -m s2s.core.cli train multi30k_en_de`
with `run.threads`, `run.precision` and the data from `task.data_dir` (the shared Multi30k copy);
its clock is the trainer's own: data, forward, loss, backward, optimiser step and logging, as
metrics.jsonl reports them. Validation and checkpoints are moved out of the way
(run.valid_interval, run.save_interval), since their share depends on how long a run is. The
first `--warmup-updates` are passed over; the steady state is the span of train records that
follows, for at least `--seconds` of training time, after which the run is stopped:
sentences/s = sentence pairs trained in that span / its seconds, target tokens/s the same for
target tokens (BOS + ids, as the trainer counts them).

Precisions alternate run by run (fp32, bf16, fp32, bf16, ...), so that a change in the machine's
load touches both alike; figures are medians over rounds, and the bf16 / fp32 ratio is the median
of the per-round ratios. Right before every run the fp32 and the bf16 `torch.mm` rates (1024 x
1024, the same threads) are probed: the run's model FLOP/s (sentences/s times the mean FLOPs of
one training pair of the corpus, s2s.core.model.Transformer.flops) is reported against both. The isolated update of bench/train_step.py is a different figure.
"""
from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import MULTI30K, flop_formula, mm_rate, runtime_env, table, write

REPO = Path(__file__).resolve().parent.parent
PRESET = "multi30k_en_de"


def overrides(data_dir: str, cache_dir: str, threads: int, log_interval: int) -> list[str]:
    """What every timed run shares: the data, the threads, no validation or checkpoint in the span."""
    return [f"task.data_dir={data_dir}", f"data.cache_dir={cache_dir}", f"run.threads={threads}",
            "run.device=cpu", f"run.log_interval={log_interval}", "run.valid_interval=1000000000",
            "run.save_interval=1000000000", "optim.max_updates=1000000000"]


def pair_flops(common: list[str]) -> tuple[float, dict]:
    """Prepare the data (as the runs will find it) and return the mean FLOPs of training one pair."""
    from s2s.core.config import load_config
    from s2s.core.data import prepare
    from s2s.core.registry import Registry
    from s2s.core.idspace import join
    from s2s.core.members import Member, build_task
    from s2s.core.model import Transformer

    registry = Registry.installed()
    cfg = load_config(PRESET, common, registry=registry)
    task = build_task(cfg.task, registry)
    train = prepare(task, cfg.data, quiet=True).splits["train"]
    with torch.device("meta"):  # the run's model, its shapes only
        net = Transformer(cfg.model, *join([Member(task.name, task)]))
    total = net.flops(train.src_lens, train.tgt_lens)
    m = cfg.model
    model = {"layers": m.layers, "d_model": m.d_model, "d_ff": m.d_ff, "heads": m.heads,
             "vocab": task.tgt_vocab_size, "max_tokens": cfg.data.max_tokens, "train_pairs": len(train.src_lens)}
    return total / len(train.src_lens), model


def steady_state(records: list[dict], warmup: int) -> dict | None:
    """Sentences/s and target tokens/s over the train records after update `warmup`."""
    train = [r for r in records if r.get("kind") == "train"]
    before = [r for r in train if r["update"] <= warmup]
    span = [r for r in train if r["update"] > warmup]
    if not before or not span:
        return None
    start, elapsed = before[-1]["elapsed"], span[-1]["elapsed"] - before[-1]["elapsed"]
    if elapsed <= 0:
        return None
    times, previous = [], start
    for r in span:
        times.append(r["elapsed"] - previous)
        previous = r["elapsed"]
    tokens = sum(r["tgt_tokens_per_s"] * dt for r, dt in zip(span, times))
    return {"updates": span[-1]["update"] - before[-1]["update"], "seconds": round(elapsed, 1),
            "sentences_per_s": round(sum(r["sentences"] for r in span) / elapsed, 2),
            "tgt_tokens_per_s": round(tokens / elapsed, 1)}


def timed_run(precision: str, common: list[str], warmup: int, seconds: float, run_dir: Path) -> dict:
    """One `s2s train` subprocess, stopped once its steady-state span is `seconds` long."""
    cmd = [sys.executable, "-m", "s2s.core.cli", "train", "-q", PRESET, *common,
           f"run.dir={run_dir}", f"run.precision={precision}"]
    log = run_dir.with_suffix(".log")
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        measured = None
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                if (run_dir / "metrics.jsonl").is_file():
                    from s2s.core.runlog import read_metrics

                    measured = steady_state(read_metrics(run_dir), warmup)
                    if measured and measured["seconds"] >= seconds:
                        break
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    if not measured or measured["seconds"] < seconds:
        raise RuntimeError(f"run {run_dir} ended before its span was measured:\n{log.read_text()[-3000:]}")
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    return {**measured, "wall_s": round(time.monotonic() - t0, 1), "command": " ".join(cmd[1:]),
            "warnings": warnings}


def main(argv=None) -> dict:

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "auto"])
    ap.add_argument("--rounds", type=int, default=3, help="runs of each precision, interleaved")
    ap.add_argument("--warmup-updates", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=120.0, help="training seconds timed per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-interval", type=int, default=25)
    ap.add_argument("--data-dir", default=str(MULTI30K))
    ap.add_argument("--cache-dir", default=str(REPO / ".cache" / "s2s"))
    ap.add_argument("--name", default="train_throughput")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    common = overrides(args.data_dir, args.cache_dir, args.threads, args.log_interval)
    flops_per_pair, model = pair_flops(common)

    runs = {p: [] for p in args.precisions}
    with tempfile.TemporaryDirectory(prefix="s2s-throughput-") as tmp:
        for r in range(args.rounds):
            for p in args.precisions:
                mm = {"fp32": mm_rate(repeats=3, seconds=0.6), "bf16": mm_rate(repeats=3, seconds=0.6,
                                                                              dtype=torch.bfloat16)}
                run = timed_run(p, common, args.warmup_updates, args.seconds, Path(tmp) / f"{p}_{r}")
                gflops = run["sentences_per_s"] * flops_per_pair / 1e9
                run.update(round=r, mm_gflops={k: round(v / 1e9, 1) for k, v in mm.items()},
                           model_gflops_per_s=round(gflops, 1),
                           of_mm={k: round(gflops * 1e9 / v, 4) for k, v in mm.items()})
                runs[p].append(run)
                print(json.dumps({"precision": p, **{k: v for k, v in run.items() if k != "command"}}), flush=True)

    summary = {}
    for p, rs in runs.items():
        med = lambda key: statistics.median(x[key] for x in rs)  # noqa: E731
        summary[p] = {"sentences_per_s_median": med("sentences_per_s"), "tgt_tokens_per_s_median": med("tgt_tokens_per_s"),
                      "model_gflops_per_s_median": med("model_gflops_per_s"),
                      "of_fp32_mm_median": statistics.median(x["of_mm"]["fp32"] for x in rs),
                      "of_bf16_mm_median": statistics.median(x["of_mm"]["bf16"] for x in rs)}
    base = args.precisions[0]
    for p in args.precisions[1:]:  # per-round ratios: each pair of runs ran next to each other
        ratios = [b["sentences_per_s"] / a["sentences_per_s"] for a, b in zip(runs[base], runs[p])]
        summary[p][f"sentences_per_s_vs_{base}_median"] = round(statistics.median(ratios), 3)
        summary[p][f"sentences_per_s_vs_{base}_all"] = [round(x, 3) for x in ratios]
    result = {"benchmark": "end-to-end training throughput: s2s train multi30k_en_de, interleaved precisions",
              "preset": PRESET, "model": model, "threads": args.threads, "rounds": args.rounds,
              "warmup_updates": args.warmup_updates, "timed_seconds_per_run": args.seconds,
              "flops_per_training_pair": round(flops_per_pair), "flop_formula": flop_formula(),
              "runtime_env": runtime_env(), "targets": {"bf16_sentences_per_s_vs_fp32": 1.8},
              "summary": summary, "runs": runs}
    path = write(args.name, result)
    print(table([{"precision": p, "sent/s": s["sentences_per_s_median"], "tok/s": s["tgt_tokens_per_s_median"],
                  "GFLOP/s": s["model_gflops_per_s_median"], "of fp32 mm": s["of_fp32_mm_median"],
                  "of bf16 mm": s["of_bf16_mm_median"], f"vs {base}": s.get(f"sentences_per_s_vs_{base}_median", 1.0)}
                 for p, s in summary.items()]))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
