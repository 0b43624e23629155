"""What the size of oneDNN's primitive cache trades in bf16 training on a CPU (issue 45): kernel
compilations an update against peak memory. A piece in isolation, not a headline: the race
(`python -m bench.training.train_throughput --peers fairseq ...`) is the end-to-end figure.

    python -m bench.training.onednn_cache [--capacities 16 32 48 64 128] [--rounds 2] [--updates 30]

bf16 products on a CPU are oneDNN's; oneDNN compiles a kernel for each exact shape and keeps the
last ONEDNN_PRIMITIVE_CACHE_CAPACITY of them (s2s.core.RUNTIME_ENV; it is read when torch
loads, so each capacity runs in a process of its own). For each capacity, interleaved over
`--rounds`, a fresh process builds the preset's trainer in bf16, takes 10 updates, then
`--updates` more under oneDNN's trace (bench.training.train_profile.compiles: the compilations an update
and the milliseconds oneDNN reports for them) and reports its peak RSS; an fp32 process takes
the same updates (fp32 products are MKL's: no primitives) for the memory bf16 is held to.

A cached primitive also holds memory of its own. After the runs it is measured at the model's
shapes (2,560 rows, about an update's target tokens in the preset, times d_model -> d_ff,
d_ff -> d_model and d_model -> d_model), each shape in a process of its own: the growth of RSS
over 16 row counts of the shape, every primitive kept (capacity 1,024).
Writes bench/training/results/onednn_cache.json.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import child_json, peak_rss_mib, table, write  # noqa: E402

WARMUP = 10
CAPACITY = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
MODULE = "bench.training.onednn_cache"


def child(preset: str, precision: str, updates: int, threads: int) -> dict:
    """The trainer's compilations (bf16) and update time over `updates`, and the peak RSS."""
    import torch

    from bench.training.train_profile import compiles, trainer_for

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="s2s-onednn-cache-") as tmp:
        trainer = trainer_for(preset, precision, tmp, threads)
        try:
            for _ in range(WARMUP):
                trainer.step()
            t0 = time.perf_counter()
            found = compiles(trainer, updates)  # the trace slows an update: the time is indicative
            found["update_s_traced"] = round((time.perf_counter() - t0) / updates, 3)
        finally:
            trainer.close()
    return {**found, "peak_rss_mib": round(peak_rss_mib())}


def probe(rows: int, k: int, n: int, threads: int) -> dict:
    """MiB of RSS each cached bf16 product primitive [rows, k] x [k, n] adds, over 16 row
    counts from `rows` on (32 apart: 16 shapes, 16 primitives), beside the output's MiB at
    about the middle row count."""
    import torch

    torch.set_num_threads(threads)
    w = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(rows + 16 * 32, k, dtype=torch.bfloat16)
    before = int(Path("/proc/self/statm").read_text().split()[1])
    for i in range(16):
        torch.mm(x[: rows + 32 * i], w.t())  # its output freed at once; the primitive stays
    after = int(Path("/proc/self/statm").read_text().split()[1])
    mib = (after - before) * os.sysconf("SC_PAGE_SIZE") / 2**20 / 16
    return {
        "mib_per_primitive": round(mib, 2),
        "output_mib_bf16": round((rows + 256) * n * 2 / 2**20, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="multi30k_en_de")
    ap.add_argument("--capacities", type=int, nargs="+", default=[16, 32, 48, 64, 128])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--name", default="onednn_cache")
    ap.add_argument("--child", nargs=2, metavar=("PRECISION", "UPDATES"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--probe", type=int, nargs=3, metavar=("ROWS", "K", "N"), help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.child:
        found = child(args.preset, args.child[0], int(args.child[1]), args.threads)
        print(json.dumps(found))
        return
    if args.probe:
        print(json.dumps(probe(*args.probe, args.threads)))
        return

    runs: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for capacity in args.capacities:
            found = child_json(MODULE, ["--child", "bf16", args.updates], {CAPACITY: str(capacity)})
            runs.setdefault(f"bf16 capacity {capacity}", []).append(found)
            print(f"round {r + 1} bf16 capacity {capacity}: {found}", flush=True)
        found = child_json(MODULE, ["--child", "fp32", args.updates])
        runs.setdefault("fp32", []).append(found)
        print(f"round {r + 1} fp32: {found}", flush=True)
    summary = [
        {
            "run": name,
            **{
                key: statistics.median(f[key] for f in found)
                for key in ("compiles_per_step", "compile_ms_per_step", "peak_rss_mib")
            },
        }
        for name, found in runs.items()
    ]
    print(table(summary))
    primitives = {  # a process each: memory one shape freed would hide the next one's
        f"2560x{k}x{n}": child_json(MODULE, ["--probe", 2560, k, n], {CAPACITY: "1024"})
        for k, n in ((256, 1024), (1024, 256), (256, 256))
    }
    print("MiB a cached primitive:", primitives)
    result = {
        "command": " ".join(["python -m bench.training.onednn_cache", *sys.argv[1:]]),
        "preset": args.preset,
        "updates": args.updates,
        "measured": "a fresh process per run; peak RSS after 10 + `updates` updates; medians",
        "summary": summary,
        "runs": runs,
        "primitive_memory": primitives,
    }
    print(f"wrote {write(args.name, result)}")


if __name__ == "__main__":
    main()
