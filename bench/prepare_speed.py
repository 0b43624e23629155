"""Data preparation speed and memory (issue 6, benchmark c).

    python -m bench.prepare_speed               # 1,000,000 pairs (~2 min)
    python -m bench.prepare_speed --pairs 100000

Multi30k's 29,000 training pairs are repeated to `--pairs` lines and written as plain text files
to a temporary folder, next to Multi30k's own dev and test files; then the translation plugin
(the multi30k_en_de preset's task section: byte-level BPE, 8,000 shared tokens) and
`s2s.core.data.prepared.prepare_data` train the tokenizer and binarise every split, in a fresh process
whose peak RSS is the figure reported. Pairs/s counts training pairs over the whole `prepare_data`
call (reading, tokenizer training, binarising, writing); the tokenizer's share is timed apart.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import itertools
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, child_json, runtime_env, table, write


def make_corpus(directory: Path, pairs: int) -> None:
    """train.{en,de}: Multi30k's training pairs cycled to `pairs` lines; val and test as shipped."""
    for lang in ("en", "de"):
        lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        with open(directory / f"train.{lang}", "w", encoding="utf-8") as f:
            f.writelines(itertools.islice(itertools.cycle(lines), pairs))
        for split in ("val", "test_2016_flickr"):
            shutil.copy(MULTI30K / f"{split}.{lang}", directory / f"{split}.{lang}")


def child(data_dir: str, cache_dir: str) -> None:
    """Prepare in this (fresh) process; print timings and peak RSS as JSON."""
    from s2s.core.data.members import build_task
    from s2s.core.data.prepared import prepare_data
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    from bench.common import peak_rss_mib

    registry = Registry.installed()
    cfg = load_config(
        "multi30k_en_de",
        [f"task.data_dir={data_dir}", f"data.cache_dir={cache_dir}"],
        registry=registry,
    )
    task = build_task(cfg.task, registry)
    timings = {}
    build_vocab = task.build_vocab

    def timed_build_vocab(pairs):
        t0 = time.perf_counter()
        build_vocab(pairs)
        timings["tokenizer_s"] = time.perf_counter() - t0

    task.build_vocab = timed_build_vocab
    rss_before = peak_rss_mib()
    t0 = time.perf_counter()
    prepared = prepare_data(task, cfg.data, quiet=True)
    total = time.perf_counter() - t0
    train = prepared.splits["train"]
    info = json.loads((prepared.directory / "prepared.json").read_text())
    print(
        json.dumps(
            {
                "total_s": total,
                "tokenizer_s": timings["tokenizer_s"],
                "binarise_s": total - timings["tokenizer_s"],
                "train_pairs": len(train),
                "train_tokens": int(train.src_off[-1] + train.tgt_off[-1]),
                "vocab": task.src_vocab_size,
                "splits": info["splits"],
                "peak_rss_mib": peak_rss_mib(),
                "rss_after_imports_mib": rss_before,
            }
        )
    )


def run_child(data_dir: Path, cache_dir: Path) -> dict:
    return child_json("bench.prepare_speed", ["--child", data_dir, cache_dir])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument(
        "--repeats", type=int, default=1, help="fresh prepares (the median is reported)"
    )
    ap.add_argument("--name", default="prepare_speed")
    ap.add_argument("--child", nargs=2, metavar=("DATA_DIR", "CACHE_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return {}

    runs = []
    with tempfile.TemporaryDirectory(prefix="s2s-prepare-") as tmp:
        data_dir = Path(tmp) / "text"
        data_dir.mkdir()
        make_corpus(data_dir, args.pairs)
        text_mib = sum(p.stat().st_size for p in data_dir.glob("train.*")) / 2**20
        for i in range(args.repeats):
            runs.append(run_child(data_dir, Path(tmp) / f"cache{i}"))
    runs.sort(key=lambda r: r["total_s"])
    r = runs[len(runs) // 2]
    result = {
        "benchmark": "data preparation (issue 6c)",
        "runtime_env": runtime_env(),
        "pairs": args.pairs,
        "text_mib": round(text_mib, 1),
        "vocab": r["vocab"],
        "train_pairs_kept": r["train_pairs"],
        "train_tokens": r["train_tokens"],
        "total_s": round(r["total_s"], 2),
        "tokenizer_s": round(r["tokenizer_s"], 2),
        "binarise_s": round(r["binarise_s"], 2),
        "pairs_per_s": round(args.pairs / r["total_s"]),
        "tokenizer_pairs_per_s": round(args.pairs / r["tokenizer_s"]),
        "binarise_pairs_per_s": round(args.pairs / r["binarise_s"]),
        "peak_rss_mib": round(r["peak_rss_mib"], 1),
        "rss_after_imports_mib": round(r["rss_after_imports_mib"], 1),
        "target_s": 60,
        "repeats": [{k: v for k, v in x.items() if k.endswith("_s")} for x in runs],
    }
    path = write(args.name, result)
    print(
        table(
            [
                {
                    "pairs": args.pairs,
                    "total s": result["total_s"],
                    "tokenizer s": result["tokenizer_s"],
                    "binarise s": result["binarise_s"],
                    "pairs/s": result["pairs_per_s"],
                    "peak RSS MiB": result["peak_rss_mib"],
                    "target s": 60,
                }
            ]
        )
    )
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
