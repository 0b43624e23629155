"""Peak RSS of training as the corpus grows (issue 6, benchmark d).

    python -m bench.training.train_rss                   # 100,000 vs 1,000,000 pairs (~4 min)
    python -m bench.training.train_rss --sizes 100000 1000000 3000000

Multi30k's training pairs are repeated to each size and prepared (tokenizer, binarised shards)
in a process of their own; then, for each size, a fresh process builds the multi30k_en_de
trainer on that prepared corpus (reading the cache: the memory-mapped ids and the per-pair
lengths), makes the first epoch's batches and takes updates on the largest of them (most padded
target, then source tokens: the worst case of any update, so that runs compare); its peak RSS is
the figure. The corpus lives on disk, so the
peak should not depend on its size beyond the per-pair lengths (8 bytes a pair).
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.common import child_json, runtime_env, table, write
from bench.data.prepare_speed import make_corpus
from bench.data.prepare_speed import run_child as run_prepare


def child(data_dir: str, cache_dir: str, run_dir: str, updates: int, threads: int) -> None:
    """Build the trainer on the prepared corpus and take `updates` updates; print RSS as JSON."""
    from s2s.core.data.batches import epoch_batches
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.training.trainer import Trainer

    from bench.common import peak_rss_mib

    registry = Registry.installed()
    cfg = load_config(
        "multi30k_en_de",
        [
            f"task.data_dir={data_dir}",
            f"data.cache_dir={cache_dir}",
            f"run.dir={run_dir}",
            f"run.threads={threads}",
            "run.quiet=true",
            "run.device=cpu",
        ],
        registry=registry,
    )
    rss_imports = peak_rss_mib()
    trainer = Trainer(cfg, registry, quiet=True)
    rss_built = peak_rss_mib()
    # the epoch's largest batches (padded target, then source tokens): the worst case of any update
    train = trainer.members[0].data.splits["train"]
    batches = epoch_batches(train, cfg.data.max_tokens, cfg.run.seed, 0)
    src_lens, tgt_lens = train.src_lens, train.tgt_lens
    size = [(len(b) * int(tgt_lens[b].max()), len(b) * int(src_lens[b].max())) for b in batches]
    largest = sorted(range(len(batches)), key=size.__getitem__)[-updates:]
    del src_lens, tgt_lens
    t0 = time.perf_counter()
    for i in largest:
        trainer.step([batches[i]])
    print(
        json.dumps(
            {
                "pairs": len(train),
                "updates": updates,
                "s_per_update": (time.perf_counter() - t0) / updates,
                "rss_after_imports_mib": rss_imports,
                "rss_after_trainer_mib": rss_built,
                "peak_rss_mib": peak_rss_mib(),
            }
        )
    )


def run_child(*args) -> dict:
    return child_json("bench.training.train_rss", ["--child", *args])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--updates", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="train_rss")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        data_dir, cache_dir, run_dir, updates, threads = args.child
        child(data_dir, cache_dir, run_dir, int(updates), int(threads))
        return {}

    rows = []
    with tempfile.TemporaryDirectory(prefix="s2s-rss-") as tmp:
        for size in args.sizes:
            data_dir, cache_dir = Path(tmp) / f"text{size}", Path(tmp) / f"cache{size}"
            data_dir.mkdir()
            make_corpus(data_dir, size)
            run_prepare(data_dir, cache_dir)
            for f in data_dir.glob("train.*"):  # the text is no longer needed
                f.unlink()
            r = run_child(data_dir, cache_dir, Path(tmp) / f"run{size}", args.updates, args.threads)
            rows.append(
                {
                    "corpus_pairs": size,
                    **{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()},
                }
            )
    base = rows[0]["peak_rss_mib"]
    for r in rows:
        r["peak_vs_smallest"] = round(r["peak_rss_mib"] / base, 4)
    result = {
        "benchmark": "training peak RSS vs corpus size (issue 6d)",
        "runtime_env": runtime_env(),
        "preset": "multi30k_en_de",
        "target": "peak RSS with 1M pairs within 10% of 100k",
        "runs": rows,
        "within_10_percent": all(r["peak_vs_smallest"] <= 1.10 for r in rows),
    }
    path = write(args.name, result)
    print(
        table(
            [
                {
                    "pairs": r["corpus_pairs"],
                    "peak RSS MiB": r["peak_rss_mib"],
                    "after trainer MiB": r["rss_after_trainer_mib"],
                    "vs smallest": r["peak_vs_smallest"],
                }
                for r in rows
            ]
        )
    )
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
