"""The isolated training step: its throughput and model-FLOPs utilisation (issue 6, benchmark a).

    python -m bench.training.train_step            # both presets, default settings (~5 min)
    python -m bench.training.train_step --steps 300 --base-steps 100

This times one update in isolation, not what `s2s train` delivers end to end (data, logging,
the loop): that is bench/training/train_throughput.py's figure. What is timed is the trainer's own
update: `Trainer.step` (batches from the memory-mapped corpus, forward, label-smoothed loss,
backward, finiteness check, the optimiser step and `zero_grad`), as `Trainer.run` takes it, on 2
CPU threads in fp32 (`--precision bf16`: the trainer's bf16 path, s2s.core.nn.precision). The
multi30k_en_de preset trains on its own data and batch (4,096 tokens); the base preset (6+6
layers, d_model 512, a 37,000-token BPE vocabulary) has no WMT14 copy here, so it trains on
Multi30k with the same vocabulary size and a reduced batch.

FLOPs of one update: the model's own count, `s2s.core.nn.model.Transformer.flops` (its docstring
gives the formula, the JSON's flop_formula repeats it), per sentence pair on its real tokens.
MFU = counted FLOPs per second / the fp32 `torch.mm` rate (1024 x 1024 products, same threads).
The machine is shared, so the `torch.mm` rate is probed right before every timed update and each
update's MFU is taken against its own probe; the figures are medians over updates. Variants
(eager; `torch.compile` with dynamic shapes; attention through the unfused math backend of
`scaled_dot_product_attention` instead of its fused kernel) are interleaved update by update on
the same batches.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import (
    MULTI30K,
    flop_formula,
    mm_rate,
    peak_rss_mib,
    runtime_env,
    table,
    write,
)

REPO = Path(__file__).resolve().parents[2]


def mm_probe() -> float:
    """A short fp32 torch.mm rate sample (about 0.1 s) for the update that follows."""
    return mm_rate(repeats=1, seconds=0.1)


PRESETS = {
    # name: (preset, overrides)
    "multi30k_en_de": ("multi30k_en_de", [f"task.data_dir={MULTI30K}"]),
    "wmt14_en_de_base": (
        "wmt14_en_de_base",
        [
            "task.source=text",
            f"task.data_dir={MULTI30K}",
            "task.train_prefix=train",
            "task.valid_prefix=val",
            "task.test_prefix=test_2016_flickr",
        ],
    ),
}


def build_trainer(
    name: str, max_tokens: int, threads: int, run_dir: str, cache_dir: str, precision: str = "fp32"
):
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.training.trainer import Trainer

    registry = Registry.installed()
    preset, overrides = PRESETS[name]
    cfg = load_config(
        preset,
        overrides
        + [
            f"run.dir={run_dir}",
            f"data.cache_dir={cache_dir}",
            f"data.max_tokens={max_tokens}",
            f"run.threads={threads}",
            "run.quiet=true",
            "run.device=cpu",
            f"run.precision={precision}",
        ],
        registry=registry,
    )
    return Trainer(cfg, registry, quiet=True)


def one_update(trainer, batch) -> None:
    """Trainer.run's update, without logging, validation and checkpoints."""
    trainer.step([batch])  # optimiser step, zero_grad


def profile_update(trainer, stream, updates: int = 2, top: int = 12) -> list[dict]:
    """Share of the update's time per operator (torch.profiler, self time), the biggest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(updates):
            one_update(trainer, stream.next())
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [
        {"op": e.key, "share": round(e.self_cpu_time_total / total, 4), "calls": e.count // updates}
        for e in rows
    ]


def bench_preset(
    name: str,
    max_tokens: int,
    steps: int,
    variants: list[str],
    threads: int,
    cache_dir: str,
    profile: bool,
    precision: str = "fp32",
) -> dict:
    with tempfile.TemporaryDirectory(prefix="s2s-bench-") as run_dir:
        trainer = build_trainer(name, max_tokens, threads, run_dir, cache_dir, precision)
        mcfg = trainer.cfg.model
        train = trainer.members[0].data.splits["train"]
        src_lens, tgt_lens = train.src_lens, train.tgt_lens
        vocab = trainer.members[0].task.tgt_vocab_size
        flops_of = lambda idx: trainer.model.flops(src_lens[idx], tgt_lens[idx])  # noqa: E731
        eager = trainer.ddp  # the model as the run's precision computes it (one process: no DDP)
        models, contexts = {}, {}
        for v in variants:
            models[v] = torch.compile(eager, dynamic=True) if v == "compile" else eager
            contexts[v] = (
                (lambda: sdpa_kernel(SDPBackend.MATH))
                if v == "math_attention"
                else contextlib.nullcontext
            )
        stream = trainer.streams[0]
        setup = {}
        for v in variants:
            trainer.ddp = models[v]
            t0 = time.perf_counter()
            with contexts[v]():
                for _ in range(
                    3 if v == "compile" else 1
                ):  # compile: the forward, the backward, a new shape
                    one_update(trainer, stream.next())
            setup[v] = round(time.perf_counter() - t0, 1)

        runs = {
            v: {
                "time": [],
                "mfu": [],
                "cpu": 0.0,
                "tokens": 0,
                "flops": 0.0,
                "padded": 0,
                "real": 0,
            }
            for v in variants
        }
        probes = []
        for _ in range(steps):
            idx = stream.next()
            flops = flops_of(idx)
            for v in variants:
                trainer.ddp = models[v]
                rate = mm_probe()
                probes.append(rate)
                t0, c0 = time.perf_counter(), time.process_time()
                with contexts[v]():
                    one_update(trainer, idx)
                dt = time.perf_counter() - t0
                r = runs[v]
                r["time"].append(dt)
                r["cpu"] += time.process_time() - c0
                r["mfu"].append(flops / dt / rate)
                r["tokens"] += int(tgt_lens[idx].sum())
                r["flops"] += flops
                r["real"] += int(src_lens[idx].sum() + tgt_lens[idx].sum())
                r["padded"] += len(idx) * int(src_lens[idx].max() + tgt_lens[idx].max())
        trainer.ddp = eager
        prof = profile_update(trainer, stream) if profile else None

    mm = statistics.median(probes)
    result = {
        "preset": name,
        "layers": mcfg.layers,
        "d_model": mcfg.d_model,
        "d_ff": mcfg.d_ff,
        "heads": mcfg.heads,
        "vocab": vocab,
        "parameters": trainer.n_params,
        "max_tokens": max_tokens,
        "precision": trainer.precision,
        "timed_updates": steps,
        "threads": threads,
        "mm_rate_gflops_median": round(mm / 1e9, 1),
        "variants": {},
    }
    for v, r in runs.items():
        total = sum(r["time"])
        result["variants"][v] = {
            "tgt_tokens_per_s": round(r["tokens"] / total, 1),
            # had the process had its threads' cores to itself: tokens per CPU-second times threads
            "tgt_tokens_per_s_own_cores": round(r["tokens"] * threads / r["cpu"], 1),
            "s_per_update": round(statistics.median(r["time"]), 3),
            "model_gflops_per_s": round(r["flops"] / total / 1e9, 1),
            "mfu_median": round(statistics.median(r["mfu"]), 4),
            "mfu_aggregate": round(r["flops"] / total / mm, 4),
            "padding_share": round(1 - r["real"] / r["padded"], 4),
            "warmup_s": setup[v],
        }
    for v in runs:  # per-update time ratios against eager, on the same batches
        if v != "eager" and "eager" in runs:
            result["variants"][v]["speedup_vs_eager_median"] = round(
                statistics.median(e / c for e, c in zip(runs["eager"]["time"], runs[v]["time"])), 3
            )
    if prof:
        result["profile_eager"] = prof
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument(
        "--steps", type=int, default=16, help="timed updates per variant, multi30k_en_de"
    )
    ap.add_argument("--base-steps", type=int, default=6, help="timed updates per variant, base")
    ap.add_argument(
        "--max-tokens", type=int, default=4096, help="multi30k_en_de batch (the preset's)"
    )
    ap.add_argument(
        "--base-max-tokens", type=int, default=2048, help="base batch (reduced from 25,000)"
    )
    ap.add_argument(
        "--variants",
        default="eager,compile,math_attention",
        help="comma-separated: eager, compile (torch.compile, dynamic shapes), math_attention "
        "(scaled_dot_product_attention's unfused math backend instead of the fused kernel)",
    )
    ap.add_argument("--base-variants", default="eager")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="run.precision")
    ap.add_argument("--cache-dir", default=str(REPO / ".cache" / "s2s"))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--name", default="train_step")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    mm_start = mm_rate()
    presets = []
    for name in args.presets:
        base = name != "multi30k_en_de"
        presets.append(
            bench_preset(
                name,
                args.base_max_tokens if base else args.max_tokens,
                args.base_steps if base else args.steps,
                (args.base_variants if base else args.variants).split(","),
                args.threads,
                args.cache_dir,
                not args.no_profile,
                args.precision,
            )
        )
    result = {
        "benchmark": "isolated training step (issue 6a), not end to end",
        "flop_formula": flop_formula(),
        "mfu_reference": "fp32 torch.mm of 1024x1024 matrices, same threads, probed before every update",
        "runtime_env": runtime_env(),
        "mm_rate_gflops_start": round(mm_start / 1e9, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "targets": {"multi30k_en_de": 0.5, "wmt14_en_de_base": 0.6},
        "presets": presets,
    }
    path = write(args.name, result)
    rows = [
        {
            "preset": p["preset"],
            "variant": v,
            "tok/s": r["tgt_tokens_per_s"],
            "GFLOP/s": r["model_gflops_per_s"],
            "mm GFLOP/s": p["mm_rate_gflops_median"],
            "MFU": r["mfu_median"],
            "target": result["targets"][p["preset"]],
            "s/update": r["s_per_update"],
            "warm-up s": r["warmup_s"],
        }
        for p in presets
        for v, r in p["variants"].items()
    ]
    print(table(rows))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
