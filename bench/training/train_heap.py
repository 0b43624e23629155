"""Where bf16 training's memory goes: glibc's heap under settings of the CPU runtime (issue 27).

    python -m bench.training.train_heap                          # the defaults against ideep's old cache, bf16 and fp32 (~10 min)
    python -m bench.training.train_heap --updates 40 --rounds 1  # a quick look

Each variant is a fresh process that builds the `multi30k_en_de` trainer with the race's
settings (bench/training/train_throughput.py: `task.vocab_size=10000 data.max_tokens=4096`, 2 threads)
and takes its first `--updates` updates in the epoch's order, with `--set` / variant environment
on top of s2s's runtime defaults (s2s.core.RUNTIME_ENV). Every `--every` updates it reads what
glibc holds (`mallinfo2`: bytes in use, bytes free inside the heap) and the process's resident
set; at the end its peak RSS and the seconds per update after the first 20. The variants run
in turn, round after round; the JSON gives each run and the medians.

The variants: `defaults` (bf16), `ideep_cache_1024` (bf16 with LRU_CACHE_CAPACITY=1024, torch's
own default, before s2s set it to 1), `fp32`. The figure is a diagnosis of the process's heap,
not a headline: the race (`python -m bench.training.train_throughput --peers fairseq ...`) is the end
to end comparison, peak RSS included.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import ctypes
import json
import statistics
import tempfile
import time

from bench.common import MULTI30K, child_json, runtime_env, table, write

VARIANTS = {
    "defaults": ("bf16", {}),
    "ideep_cache_1024": ("bf16", {"LRU_CACHE_CAPACITY": "1024"}),
    "fp32": ("fp32", {}),
}
RACE = ["task.vocab_size=10000", "data.max_tokens=4096"]


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_mib() -> dict:
    """glibc's view of the heap: bytes handed out and in use, bytes free inside it, mmapped blocks."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    m, mib = libc.mallinfo2(), 1 << 20
    return {
        "in_use_mib": round(m.uordblks / mib),
        "free_in_heap_mib": round(m.fordblks / mib),
        "mmapped_mib": round(m.hblkhd / mib),
    }


def rss_mib() -> dict:
    with open("/proc/self/status") as f:
        return {
            line.split(":")[0]: int(line.split()[1]) // 1024
            for line in f
            if line.startswith(("VmRSS", "VmHWM"))
        }


def child(precision: str, updates: int, every: int, run_dir: str, overrides: list[str]) -> None:
    """Take `updates` updates of the race's trainer; print its heap trace as JSON."""
    from s2s.core.data.batches import epoch_batches
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.training.trainer import Trainer

    registry = Registry.installed()
    cfg = load_config(
        "multi30k_en_de",
        [
            *RACE,
            f"task.data_dir={MULTI30K}",
            "run.threads=2",
            "run.device=cpu",
            "run.quiet=true",
            f"run.precision={precision}",
            f"run.dir={run_dir}",
            *overrides,
        ],
        registry=registry,
    )
    trainer = Trainer(cfg, registry, quiet=True)
    batches = epoch_batches(
        trainer.members[0].data.splits["train"], cfg.data.max_tokens, cfg.run.seed, 0
    )
    trace, t20 = [], None
    for i in range(updates):
        if i == 20:
            t20 = time.perf_counter()
        trainer.step([batches[i]])
        if (i + 1) % every == 0 or i + 1 == updates:
            rss = rss_mib()
            trace.append(
                {
                    "update": i + 1,
                    "rss_mib": rss["VmRSS"],
                    "peak_rss_mib": rss["VmHWM"],
                    **heap_mib(),
                }
            )
    seconds = (time.perf_counter() - t20) / (updates - 20) if t20 else None
    print(
        json.dumps(
            {"peak_rss_mib": rss_mib()["VmHWM"], "s_per_update_after_20": seconds, "trace": trace}
        )
    )


def run_child(name: str, args) -> dict:
    precision, env = VARIANTS[name]
    with tempfile.TemporaryDirectory(prefix="s2s-heap-") as tmp:
        found = child_json(
            "bench.training.train_heap",
            ["--child", precision, args.updates, args.every, tmp, *args.set],
            env,
        )
    return {
        "variant": name,
        "precision": precision,
        "env": env,
        **found,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=80)
    ap.add_argument("--every", type=int, default=20, help="read the heap every N updates")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for every run"
    )
    ap.add_argument("--name", default="train_heap")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.child:
        precision, updates, every, run_dir = args.child
        child(precision, int(updates), int(every), run_dir, args.set + rest)
        return {}
    if args.updates <= 20:
        ap.error("--updates must be more than 20 (the first 20 are left out of the time)")
    runs = [run_child(name, args) for _ in range(args.rounds) for name in args.variants]
    summary = []
    for name in args.variants:
        mine = [r for r in runs if r["variant"] == name]
        last = [r["trace"][-1] for r in mine]
        summary.append(
            {
                "variant": name,
                "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in mine),
                "s_per_update": round(
                    statistics.median(r["s_per_update_after_20"] for r in mine), 3
                ),
                "in_use_mib": statistics.median(x["in_use_mib"] for x in last),
                "free_in_heap_mib": statistics.median(x["free_in_heap_mib"] for x in last),
            }
        )
    result = {
        "benchmark": "bf16 training's heap under runtime settings (issue 27; a diagnosis, not a headline)",
        "runtime_env": runtime_env(),
        "preset": "multi30k_en_de",
        "overrides": RACE + args.set,
        "updates": args.updates,
        "rounds": args.rounds,
        "summary": summary,
        "runs": runs,
    }
    path = write(args.name, result)
    print(table(summary))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
