"""Data preparation speed and memory at scale: sharded, parallel prepare (issues 6c and 65).

    python -m bench.data.prepare_speed                                   # 1M and 4.5M pairs, 1 and 2
                                                                    # workers, + 1M added (~15 min)
    python -m bench.data.prepare_speed --pairs 20000 40000 --add 20000 --shard-pairs 10000 --vocab-sample 10000

Multi30k's 29,000 training pairs are cycled to each `--pairs` count and written as plain text
files to a temporary folder, next to Multi30k's own dev and test files (a synthetic corpus with
Multi30k's word statistics). The translation plugin (the multi30k_en_de preset's task section:
byte-level BPE, 8,000 shared tokens) and `s2s.core.data.nodes.prepare_data` train the tokenizer
on the first `data.vocab_sample` pairs (1M) and binarise every split, the training split in
shards of `--shard-pairs` pairs binarised by `data.workers` processes, each prepare in a fresh
process. Peak RSS is the prepare's process's, and apart its largest worker's.

Then `--add` pairs are appended to the largest corpus (the cycle continued) and it is prepared
again with the most workers into the same cache: the shards of the pairs already there are
taken from the previous build, only the appended pairs' shards are binarised. Last, that cache
is opened as training opens it (its checksums verified) and the first epoch's batches are made:
the data's share of the time between the prepare's end and training's first update.

The machine is shared: its load average is recorded before each prepare.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import itertools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, child_json, runtime_env, table, write


def make_corpus(directory: Path, pairs: int, start: int = 0, append: bool = False) -> None:
    """train.{en,de}: Multi30k's training pairs cycled to `pairs` lines, from line `start` of the
    cycle (appended to the files with `append`); val and test as shipped."""
    for lang in ("en", "de"):
        lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        cycle = itertools.islice(itertools.cycle(lines), start % len(lines), None)
        with open(directory / f"train.{lang}", "a" if append else "w", encoding="utf-8") as f:
            f.writelines(itertools.islice(cycle, pairs))
        for split in ("val", "test_2016_flickr"):
            shutil.copy(MULTI30K / f"{split}.{lang}", directory / f"{split}.{lang}")


def _config(data_dir: str, cache_dir: str, workers: int, shard_pairs: int, sample: int):
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    registry = Registry.installed()
    cfg = load_config(
        "multi30k_en_de",
        [
            f"task.data_dir={data_dir}",
            f"data.cache_dir={cache_dir}",
            f"data.workers={workers}",
            f"data.shard_pairs={shard_pairs}",
            f"data.vocab_sample={sample}",
        ],
        registry=registry,
    )
    return cfg, registry


def child(
    data_dir: str, cache_dir: str, workers: str, shard_pairs: str, sample: str, reopen: str
) -> None:
    """Prepare in this (fresh) process; print timings and peak RSS as JSON. With `reopen`: open
    the prepared cache as training does and make the first epoch's batches, timed."""
    import resource

    from s2s.core.data.batches import epoch_batches
    from s2s.core.data.members import build_task
    from s2s.core.data.nodes import prepare_data

    from bench.common import peak_rss_mib

    cfg, registry = _config(data_dir, cache_dir, int(workers), int(shard_pairs), int(sample))
    task = build_task(cfg.task, registry)
    if reopen == "1":
        t0 = time.perf_counter()
        prepared = prepare_data(task, cfg.data, quiet=True)
        opened = time.perf_counter() - t0
        train = prepared.splits["train"]
        batches = epoch_batches(train, cfg.data.max_tokens, cfg.run.seed, 0)
        planned = time.perf_counter() - t0 - opened
        t1 = time.perf_counter()
        built = sum(len(train.batch(b)["src"]) for b in batches[:300])  # training's first reads
        print(
            json.dumps(
                {
                    "open_s": opened,
                    "first_epoch_batches_s": planned,
                    "batch_pairs_per_s": built / (time.perf_counter() - t1),
                    "batches": len(batches),
                    "train_pairs": len(prepared.splits["train"]),
                    "peak_rss_mib": peak_rss_mib(),
                }
            )
        )
        return
    timings = {"tokenizer_s": 0.0}
    build_vocab = type(task).build_vocab

    def timed_build_vocab(self, pairs):
        t0 = time.perf_counter()
        build_vocab(self, pairs)
        timings["tokenizer_s"] = time.perf_counter() - t0

    # timed on the class, not the instance: the task must still pickle for the workers (an
    # instance attribute made the add-a-shard run of prepare_shards.json binarise in one process)
    type(task).build_vocab = timed_build_vocab
    rss_before = peak_rss_mib()

    def cpu():
        return sum(
            u.ru_utime + u.ru_stime
            for u in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        )

    cpu0, t0 = cpu(), time.perf_counter()
    prepared = prepare_data(task, cfg.data, quiet=True)
    total = time.perf_counter() - t0
    made = prepared.manifest["splits"]["train"]
    print(
        json.dumps(
            {
                "total_s": total,
                "tokenizer_s": timings["tokenizer_s"],
                "binarise_s": total - timings["tokenizer_s"],
                "cpu_s": cpu() - cpu0,  # this process's and its workers' CPU time
                "train_pairs": made["pairs"],
                "train_tokens": made["src_tokens"] + made["tgt_tokens"],
                "shards": made["shards"],
                "shards_reused": made["shards_reused"],
                "vocab": task.src_vocab_size,
                "peak_rss_mib": peak_rss_mib(),
                "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                / 1024,
                "rss_after_imports_mib": rss_before,
            }
        )
    )


def run_child(data_dir: Path, cache_dir: Path, workers: int, args, reopen=False):
    load = os.getloadavg()[0]
    out = child_json(
        "bench.data.prepare_speed",
        [
            "--child",
            data_dir,
            cache_dir,
            workers,
            args.shard_pairs,
            args.vocab_sample,
            "1" if reopen else "0",
        ],
    )
    return {"load_avg_1m_before": round(load, 2), **out}


def _row(r: dict) -> dict:
    pairs = r["train_pairs"]
    return {
        "pairs": pairs,
        "workers": r["workers"],
        "total s": round(r["total_s"], 1),
        "vocab s": round(r["tokenizer_s"], 1),
        "binarise s": round(r["binarise_s"], 1),
        "us/pair": round(1e6 * r["total_s"] / pairs, 1),
        "binarise us/pair": round(1e6 * r["binarise_s"] / pairs, 1),
        "cpu s": round(r["cpu_s"], 1),
        "shards (kept)": f"{r['shards']} ({r['shards_reused']})",
        "RSS MiB": round(r["peak_rss_mib"]),
        "worker RSS MiB": round(r["worker_peak_rss_mib"]),
        "load": r["load_avg_1m_before"],
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_500_000])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shard-pairs", type=int, default=500_000)
    ap.add_argument("--add", type=int, default=1_000_000, help="pairs appended (0: none)")
    ap.add_argument("--name", default="prepare_shards")
    ap.add_argument("--vocab-sample", type=int, default=1_000_000)
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return {}

    runs, opened = [], {}
    with tempfile.TemporaryDirectory(prefix="s2s-prepare-") as tmp:
        for pairs in sorted(args.pairs):
            data_dir = Path(tmp) / f"text{pairs}"
            data_dir.mkdir()
            make_corpus(data_dir, pairs)
            for workers in sorted(args.workers):
                cache = Path(tmp) / f"cache{pairs}-{workers}"
                r = run_child(data_dir, cache, workers, args)
                runs.append({"case": "fresh", "workers": workers, **r})
                print(table([_row(runs[-1])]), flush=True)
                if workers == max(args.workers):
                    opened[pairs] = run_child(data_dir, cache, workers, args, reopen=True)
                    print(opened[pairs], flush=True)
                if pairs != max(args.pairs) or workers != max(args.workers):
                    shutil.rmtree(cache)
            if pairs != max(args.pairs):
                shutil.rmtree(data_dir)
        added = {}
        if args.add:
            pairs, workers = max(args.pairs), max(args.workers)
            data_dir, cache = Path(tmp) / f"text{pairs}", Path(tmp) / f"cache{pairs}-{workers}"
            make_corpus(data_dir, args.add, start=pairs, append=True)
            r = run_child(data_dir, cache, workers, args)
            runs.append({"case": f"{args.add} pairs added", "workers": workers, **r})
            print(table([_row(runs[-1])]), flush=True)
            added = runs[-1]
            opened[pairs + args.add] = run_child(data_dir, cache, workers, args, reopen=True)
            print(opened[pairs + args.add], flush=True)

    fresh = [r for r in runs if r["case"] == "fresh"]

    def find(pairs, workers):
        return next(r for r in fresh if r["train_pairs"] == pairs and r["workers"] == workers)

    lo, hi = min(args.pairs), max(args.pairs)
    w1, wn = min(args.workers), max(args.workers)
    checks = {
        # time per pair, largest corpus over smallest, with the most workers (target <= 1.10)
        "us_per_pair_ratio": round(
            (find(hi, wn)["total_s"] / hi) / (find(lo, wn)["total_s"] / lo), 3
        ),
        # peak RSS, largest corpus over smallest (target <= 1.2)
        "peak_rss_ratio": round(find(hi, wn)["peak_rss_mib"] / find(lo, wn)["peak_rss_mib"], 3),
        "worker_rss_ratio": round(
            find(hi, wn)["worker_peak_rss_mib"] / max(1, find(lo, wn)["worker_peak_rss_mib"]), 3
        ),
        # the most workers over one, whole prepare and its binarising part (target >= 1.8)
        "speedup_total": {
            p: round(find(p, w1)["total_s"] / find(p, wn)["total_s"], 2) for p in args.pairs
        },
        "speedup_binarise": {
            p: round(find(p, w1)["binarise_s"] / find(p, wn)["binarise_s"], 2) for p in args.pairs
        },
    }
    if added:
        checks["added_shards_binarised"] = added["shards"] - added["shards_reused"]
        checks["added_shards_kept"] = added["shards_reused"]
        checks["added_s"] = round(added["total_s"], 1)
    # the data's part of training's start, and its first batches read (pairs/s), by corpus size
    checks["reopen_s"] = {p: round(o["open_s"], 2) for p, o in opened.items()}
    checks["first_epoch_batches_s"] = {
        p: round(o["first_epoch_batches_s"], 2) for p, o in opened.items()
    }
    checks["batch_pairs_per_s"] = {p: round(o["batch_pairs_per_s"]) for p, o in opened.items()}
    result = {
        "benchmark": "sharded, parallel data preparation (issue 65)",
        "runtime_env": runtime_env(),
        "pairs": args.pairs,
        "workers": args.workers,
        "shard_pairs": args.shard_pairs,
        "vocab_sample": args.vocab_sample,
        "added_pairs": args.add,
        "checks": checks,
        "runs": runs,
        "reopened": opened,
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    path = write(args.name, result)
    print(table([_row(r) for r in runs]))
    print(json.dumps(checks, indent=1))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
