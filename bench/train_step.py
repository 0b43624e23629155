"""The isolated training step: its throughput and model-FLOPs utilisation (issue 6, benchmark a).

    python -m bench.train_step            # both presets, default settings (~5 min)
    python -m bench.train_step --steps 300 --base-steps 100

This times one update in isolation, not what `s2s train` delivers end to end (data, logging,
the loop): that is bench/train_throughput.py's figure. What is timed is the trainer's own
update: `Trainer.train_step` (batches from the memory-mapped
corpus, forward, label-smoothed loss, backward, finiteness check) then the optimiser step and
`zero_grad`, as `Trainer.run` does them, on 2 CPU threads in fp32 (`--precision bf16`: the
trainer's bf16 path, s2s.core.precision). The multi30k_en_de preset
trains on its own data and batch (4,096 tokens); the base preset (6+6 layers, d_model 512, a
37,000-token BPE vocabulary) has no WMT14 copy here, so it trains on Multi30k with the same
vocabulary size and a reduced batch.

FLOPs of one update, counted per sentence pair on its real tokens (padding is waste, not work);
S = source tokens (EOS included), T = target tokens (BOS + ids = ids + EOS), N layers per stack,
d = d_model, V = target vocabulary:

    forward  = 2 * (S * P_src + T * P_tgt) + A
    P_src    = N * (4 d^2 + 2 d d_ff)             encoder: Q, K, V, O projections and the FFN
             + N * 2 d^2                          decoder: encoder-decoder K, V (computed from the source)
    P_tgt    = N * (4 d^2 + 2 d^2 + 2 d d_ff)     decoder: self-attention Q, K, V, O; cross Q, O; FFN
             + d V                                the output projection (tied with the embeddings)
    A        = N * 4 S^2 d                        encoder self-attention (Q K^T and A V)
             + N * 2 T (T + 1) d                  decoder self-attention, the T (T+1) / 2 causal pairs
             + N * 4 T S d                        encoder-decoder attention
    update   = 3 * forward                        (the backward pass costs twice the forward)

Embedding look-ups, biases, LayerNorm, softmax, dropout, the loss and Adam count as 0 FLOPs.
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

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.common import MULTI30K, mm_rate, peak_rss_mib, runtime_env, table, write

REPO = Path(__file__).resolve().parent.parent
FLOP_FORMULA = (
    "update = 3 * forward; forward = 2 * (S * P_src + T * P_tgt) + A, per pair on real tokens; "
    "P_src = N (4 d^2 + 2 d d_ff) + N 2 d^2 (encoder + encoder-decoder K,V); "
    "P_tgt = N (6 d^2 + 2 d d_ff) + d V (decoder self Q,K,V,O + cross Q,O + FFN + output projection); "
    "A = N (4 S^2 d + 2 T (T+1) d + 4 T S d) (attention scores and weighted values, causal pairs only); "
    "embeddings, biases, norms, softmax, dropout, loss and Adam count 0")


def update_flops(src_lens: np.ndarray, tgt_lens: np.ndarray, layers: int, d: int, d_ff: int, vocab: int) -> float:
    """FLOPs of one training update over pairs with these real lengths (the docstring's formula)."""
    S, T = src_lens.astype(np.float64), tgt_lens.astype(np.float64)
    p_src = layers * (4 * d * d + 2 * d * d_ff) + layers * 2 * d * d
    p_tgt = layers * (6 * d * d + 2 * d * d_ff) + d * vocab
    attn = layers * (4 * S * S * d + 2 * T * (T + 1) * d + 4 * T * S * d)
    return float(3 * (2 * (S * p_src + T * p_tgt) + attn).sum())


def mm_probe() -> float:
    """A short fp32 torch.mm rate sample (about 0.1 s) for the update that follows."""
    return mm_rate(repeats=1, seconds=0.1)


PRESETS = {
    # name: (preset, overrides)
    "multi30k_en_de": ("multi30k_en_de", [f"task.data_dir={MULTI30K}"]),
    "wmt14_en_de_base": ("wmt14_en_de_base", [
        "task.source=text", f"task.data_dir={MULTI30K}", "task.train_prefix=train",
        "task.valid_prefix=val", "task.test_prefix=test_2016_flickr"]),
}


def build_trainer(name: str, max_tokens: int, threads: int, run_dir: str, cache_dir: str, precision: str = "fp32"):
    from s2s.core.config import load_config
    from s2s.core.registry import Registry
    from s2s.core.train import Trainer

    registry = Registry.installed()
    preset, overrides = PRESETS[name]
    cfg = load_config(preset, overrides + [
        f"run.dir={run_dir}", f"data.cache_dir={cache_dir}", f"data.max_tokens={max_tokens}",
        f"run.threads={threads}", "run.quiet=true", "run.device=cpu", f"run.precision={precision}"], registry=registry)
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
    return [{"op": e.key, "share": round(e.self_cpu_time_total / total, 4), "calls": e.count // updates}
            for e in rows]


def bench_preset(name: str, max_tokens: int, steps: int, variants: list[str], threads: int,
                 cache_dir: str, profile: bool, precision: str = "fp32") -> dict:
    with tempfile.TemporaryDirectory(prefix="s2s-bench-") as run_dir:
        trainer = build_trainer(name, max_tokens, threads, run_dir, cache_dir, precision)
        mcfg = trainer.cfg.model
        train = trainer.members[0].data.splits["train"]
        src_lens, tgt_lens = train.src_lens, train.tgt_lens
        vocab = trainer.members[0].task.tgt_vocab_size
        flops_of = lambda idx: update_flops(src_lens[idx], tgt_lens[idx], mcfg.layers, mcfg.d_model,  # noqa: E731
                                            mcfg.d_ff, vocab)
        eager = trainer.ddp  # the model as the run's precision computes it (one process: no DDP)
        models, contexts = {}, {}
        for v in variants:
            models[v] = torch.compile(eager, dynamic=True) if v == "compile" else eager
            contexts[v] = (lambda: sdpa_kernel(SDPBackend.MATH)) if v == "math_attention" else contextlib.nullcontext
        stream = trainer.streams[0]
        setup = {}
        for v in variants:
            trainer.ddp = models[v]
            t0 = time.perf_counter()
            with contexts[v]():
                for _ in range(3 if v == "compile" else 1):  # compile: the forward, the backward, a new shape
                    one_update(trainer, stream.next())
            setup[v] = round(time.perf_counter() - t0, 1)

        runs = {v: {"time": [], "mfu": [], "cpu": 0.0, "tokens": 0, "flops": 0.0, "padded": 0, "real": 0}
                for v in variants}
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
    result = {"preset": name, "layers": mcfg.layers, "d_model": mcfg.d_model, "d_ff": mcfg.d_ff,
              "heads": mcfg.heads, "vocab": vocab, "parameters": trainer.n_params, "max_tokens": max_tokens,
              "precision": trainer.precision,
              "timed_updates": steps, "threads": threads, "mm_rate_gflops_median": round(mm / 1e9, 1),
              "variants": {}}
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
            "warmup_s": setup[v]}
    for v in runs:  # per-update time ratios against eager, on the same batches
        if v != "eager" and "eager" in runs:
            result["variants"][v]["speedup_vs_eager_median"] = round(statistics.median(
                e / c for e, c in zip(runs["eager"]["time"], runs[v]["time"])), 3)
    if prof:
        result["profile_eager"] = prof
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument("--steps", type=int, default=16, help="timed updates per variant, multi30k_en_de")
    ap.add_argument("--base-steps", type=int, default=6, help="timed updates per variant, base")
    ap.add_argument("--max-tokens", type=int, default=4096, help="multi30k_en_de batch (the preset's)")
    ap.add_argument("--base-max-tokens", type=int, default=2048, help="base batch (reduced from 25,000)")
    ap.add_argument("--variants", default="eager,compile,math_attention",
                    help="comma-separated: eager, compile (torch.compile, dynamic shapes), math_attention "
                         "(scaled_dot_product_attention's unfused math backend instead of the fused kernel)")
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
        presets.append(bench_preset(
            name, args.base_max_tokens if base else args.max_tokens, args.base_steps if base else args.steps,
            (args.base_variants if base else args.variants).split(","), args.threads, args.cache_dir,
            not args.no_profile, args.precision))
    result = {"benchmark": "isolated training step (issue 6a), not end to end", "flop_formula": FLOP_FORMULA,
              "mfu_reference": "fp32 torch.mm of 1024x1024 matrices, same threads, probed before every update",
              "runtime_env": runtime_env(), "mm_rate_gflops_start": round(mm_start / 1e9, 1),
              "peak_rss_mib": round(peak_rss_mib(), 1),
              "targets": {"multi30k_en_de": 0.5, "wmt14_en_de_base": 0.6}, "presets": presets}
    path = write(args.name, result)
    rows = [{"preset": p["preset"], "variant": v, "tok/s": r["tgt_tokens_per_s"], "GFLOP/s": r["model_gflops_per_s"],
             "mm GFLOP/s": p["mm_rate_gflops_median"], "MFU": r["mfu_median"], "target": result["targets"][p["preset"]],
             "s/update": r["s_per_update"], "warm-up s": r["warmup_s"]}
            for p in presets for v, r in p["variants"].items()]
    print(table(rows))
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
