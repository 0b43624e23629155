"""Training on a WMT-sized corpus against a small one: does `s2s train` start as soon and train as
fast when its cache holds 36M pairs instead of 1M (issue 65)?

    python -m bench.data.train_at_scale                              # 1M and 36M pairs (~30 min)
    python -m bench.data.train_at_scale --pairs 20000 200000 --shard-pairs 10000 --seconds 10

For each `--pairs` count, Multi30k's training pairs are cycled to that many lines
(`bench.data.prepare_speed.make_corpus`) and `s2s prepare multi30k_en_de` binarises them from the
shell (shards of `--shard-pairs`, the vocabulary trained on the first `--vocab-sample` pairs),
timed. Then `s2s train` runs on each cache in turn, `--rounds` times interleaved (1M, 36M, 1M,
...), each from the shell as a user runs it (`bench.training.train_throughput.timed_run`: bf16, the
preset's model, no validation or checkpoint in the span), and is stopped once `--seconds` of
training follow its first `--warmup-updates`:

* start-up: from the command's start to its first update (the wall clock when the first train
  record appears, less the trainer's own clock in it): opening the cache, making the epoch's
  batches, building the model;
* sentences/s over the span (`steady_state`), and the ratio of the large corpus's to the small
  one's, per round, median over rounds;
* the training process's peak resident memory (VmHWM).

The corpora and caches live in a temporary folder, or in `--keep DIR`, reused when present (the
large corpus's prepare is the long part of a run).
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import machine, runtime_env, s2s_command, table, write
from bench.data.prepare_speed import make_corpus
from bench.training.train_throughput import overrides, steady_state, timed, vm_hwm_mib

PRESET = "multi30k_en_de"


def prepared(directory: Path, pairs: int, args) -> dict:
    """The corpus of `pairs` pairs in `directory`, prepared by `s2s prepare` from the shell:
    the prepare's wall time and peak RSS (None where `--keep` already held it)."""
    data, cache = directory / "data", directory / "cache"
    done = directory / "prepared.json"
    if done.is_file():
        return json.loads(done.read_text())
    data.mkdir(parents=True, exist_ok=True)
    make_corpus(data, pairs)
    cmd = [
        *s2s_command(),
        "prepare",
        PRESET,
        f"task.data_dir={data}",
        f"data.cache_dir={cache}",
        f"data.shard_pairs={args.shard_pairs}",
        f"data.vocab_sample={args.vocab_sample}",
    ]
    t0, peak = time.monotonic(), 0.0
    with open(directory / "prepare.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            peak = max(peak, vm_hwm_mib(proc.pid))
            time.sleep(0.5)
    if proc.returncode:
        raise RuntimeError(
            f"s2s prepare failed:\n{(directory / 'prepare.log').read_text()[-2000:]}"
        )
    facts = {
        "pairs": pairs,
        "prepare_s": round(time.monotonic() - t0, 1),
        "prepare_peak_rss_mib": round(peak),
        "command": " ".join(cmd[1:]),
    }
    done.write_text(json.dumps(facts))
    return facts


def trained(directory: Path, args, round_: int) -> dict:
    """One `s2s train` on the corpus in `directory`: the span's figures and the start-up."""
    from s2s.core.runs.metrics import read_metrics

    run_dir = directory / f"run_{round_}"
    common = overrides(str(directory / "data"), str(directory / "cache"), 2, args.log_interval)
    cmd = [
        *s2s_command(),
        "train",
        "-q",
        PRESET,
        *common,
        f"data.shard_pairs={args.shard_pairs}",
        f"data.vocab_sample={args.vocab_sample}",
        f"run.dir={run_dir}",
        "run.precision=bf16",
    ]
    metrics, seen = run_dir / "metrics.jsonl", {}
    t0 = time.monotonic()

    def measure():
        if not metrics.is_file():
            return None
        records = [r for r in read_metrics(run_dir) if r.get("kind") == "train"]
        if records and "start_up_s" not in seen:
            seen["start_up_s"] = round(time.monotonic() - t0 - records[0]["elapsed"], 1)
        return steady_state(records, args.warmup_updates)

    run = timed(cmd, directory / f"train_{round_}.log", measure, args.seconds)
    return {**run, **seen}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, nargs=2, default=[1_000_000, 36_000_000])
    ap.add_argument("--shard-pairs", type=int, default=1_000_000)
    ap.add_argument("--vocab-sample", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-updates", type=int, default=10)
    ap.add_argument("--log-interval", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=60.0, help="training seconds timed per run")
    ap.add_argument("--keep", help="a folder for the corpora and caches, reused when present")
    ap.add_argument("--name", default="train_at_scale")
    args = ap.parse_args(argv)
    small, large = args.pairs
    with contextlib.ExitStack() as stack:
        work = Path(args.keep or stack.enter_context(tempfile.TemporaryDirectory(prefix="s2s-")))
        dirs = {n: work / f"pairs_{n}" for n in (small, large)}
        prepares = {n: prepared(d, n, args) for n, d in dirs.items()}
        runs = {n: [] for n in dirs}
        for r in range(args.rounds):
            for n, d in dirs.items():
                run = trained(d, args, r)
                runs[n].append(run)
                print(json.dumps({"pairs": n, "round": r, **run}), flush=True)
    ratios = [b["sentences_per_s"] / a["sentences_per_s"] for a, b in zip(runs[small], runs[large])]
    med = lambda n, key: statistics.median(x[key] for x in runs[n])  # noqa: E731
    summary = {
        n: {
            **prepares[n],
            "start_up_s_median": med(n, "start_up_s"),
            "sentences_per_s_median": med(n, "sentences_per_s"),
            "peak_rss_mib_median": med(n, "peak_rss_mib"),
        }
        for n in dirs
    }
    result = {
        "machine": {**machine(), "runtime_env": runtime_env()},
        "benchmark": "s2s train on a 36M-pair cache against a 1M-pair one (issue 65)",
        "preset": PRESET,
        "settings": vars(args),
        "summary": summary,
        "checks": {
            "sentences_per_s_large_vs_small_median": round(statistics.median(ratios), 3),
            "per_round": [round(x, 3) for x in ratios],
            "large_start_up_s": summary[large]["start_up_s_median"],
        },
        "runs": {str(n): rs for n, rs in runs.items()},
    }
    print(
        table(
            [
                {"pairs": n, **{k: v for k, v in s.items() if k != "command"}}
                for n, s in summary.items()
            ]
        )
    )
    print(json.dumps(result["checks"]))
    write(args.name, result)
    return result


if __name__ == "__main__":
    main()
