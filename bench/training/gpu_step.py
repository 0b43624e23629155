"""The GPU smoke check's measurements (bench/training/gpu_check.sh runs it): the base model's update
through the engine's own path in bf16, fp16 and fp32 with TF32, the loss alone, syncs per step.

What is timed is `s2s.core.training.trainer.Trainer.step` as `s2s train` takes it, with run.precision set
(s2s.core.nn.precision: bf16 casts the fp32 weights once per pass, fp16 is autocast with loss
scaling, fp32 runs its products in TF32 from Ampere on): batches built ahead in pinned memory,
forward, the chunked label-smoothed loss, backward, the finiteness check, fused Adam. Attention
is held to the fused kernels (flash, memory-efficient, cuDNN): a fall-back to the math kernel
raises, and fails the check. The model is the base one (N=6, d_model 512, d_ff 2048, h=8,
dropout 0.1); the data a synthetic task registered here, a shared vocabulary of 37,000 words,
one token each, pairs of random words of `--length` tokens with EOS, so that a batch is the
paper's ~25k source and ~25k target tokens (1,000 pairs of 25 + 25) with no padding.

Per precision: step time (median of `--steps`), tokens/s, model-FLOPs utilisation against the
bf16 torch.mm rate of this card measured in the same run (8192^2 products; FLOPs from
`s2s.core.nn.model.Transformer.flops`), peak memory, and the host syncs per step counted with
torch.cuda.set_sync_debug_mode("warn"). The loss alone (25k rows, 37k vocabulary, bf16): its
chunks, its CUDA kernel launches counted by torch.profiler, and its time. JSON with the
machine's facts goes to bench/training/results/gpu_check.json (S2S_GPU_CHECK_RESULTS=DIR elsewhere).

    python bench/training/gpu_step.py [--steps 10] [--precisions bf16 fp16 fp32]
    python bench/training/gpu_step.py --dry-run     # every step up to the CUDA calls, on CPU, tiny sizes
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402
from s2s.core.files import atomic_write_text  # noqa: E402
from s2s.core.contract.task import Task, TaskConfig  # noqa: E402
from s2s.core.tokenizers import SPECIALS, WordTokenizer  # noqa: E402

TINY = {"model.layers": 1, "model.d_model": 64, "model.d_ff": 128, "model.heads": 2}


@dataclass
class SyntheticConfig(TaskConfig):
    vocab_size: int = 37_000  # the shared vocabulary, specials included
    pairs: int = 1000  # training pairs
    length: int = 25  # tokens a side, EOS included
    seed: int = 0


class SyntheticTask(Task):
    """Pairs of random words from a fixed list, a word a token: no tokenizer to train, no padding."""

    name = "gpu_step_synthetic"
    Config = SyntheticConfig
    splits = ("train", "valid")

    def words(self) -> list[str]:
        return [f"w{i}" for i in range(self.cfg.vocab_size - len(SPECIALS))]

    def read_split(self, split: str):
        cfg, words = self.cfg, self.words()
        rng = random.Random(2 * cfg.seed + (split == "valid"))
        for _ in range(cfg.pairs if split == "train" else 8):
            yield tuple(" ".join(rng.choices(words, k=cfg.length - 1)) for _ in range(2))

    def build_vocab(self, pairs) -> None:
        self.src_vocab = self.tgt_vocab = WordTokenizer(self.words())

    def score(self, hypotheses, references, sources=None):
        raise NotImplementedError("gpu_step times training updates only")


def bf16_mm_rate(device: torch.device, n: int = 8192, seconds: float = 2.0) -> float:
    """Sustained bf16 torch.mm FLOP/s on `device` (2 n^3 per product)."""
    if device.type != "cuda":
        from bench.common import mm_rate

        return mm_rate(n=256, repeats=3, seconds=0.3, dtype=torch.bfloat16)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    a @ b
    torch.cuda.synchronize()
    reps = max(10, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (start.elapsed_time(end) / 1000)


def build_trainer(args, tmp: str, run_precision: str):
    """The Trainer of a run on the synthetic task in `run_precision`, batches of `--tokens` a side."""
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.training.trainer import Trainer

    registry = Registry.installed()
    registry.register(SyntheticTask, "bench/training/gpu_step.py")
    overrides = [
        f"task.name={SyntheticTask.name}",
        f"task.vocab_size={args.vocab}",
        f"task.pairs={args.tokens // args.length}",
        f"task.length={args.length}",
        f"data.max_tokens={args.tokens}",
        f"data.cache_dir={tmp}/cache",
        f"run.dir={tmp}/run-{run_precision}",
        f"run.device={args.device}",
        f"run.precision={run_precision}",
        "run.quiet=true",
        "run.keep_last=1",
    ]
    overrides += [f"{k}={v}" for k, v in TINY.items()] if args.dry_run else []
    return Trainer(load_config(None, overrides, registry=registry), registry, quiet=True)


def fused_attention(device: torch.device):
    """Attention held to the fused kernels on CUDA: a fall-back to the math kernel raises."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    )


@contextlib.contextmanager
def counted_syncs(device: torch.device):
    """A list that receives one entry per synchronising CUDA call made inside (None off CUDA)."""
    if device.type != "cuda":
        yield None
        return
    found = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(0)
    found.extend(
        str(w.message).splitlines()[0]
        for w in caught
        if "synchroniz" in str(w.message) and "debug mode is a prototype" not in str(w.message)
    )


#: kernel (CUDA) or operator (CPU) name fragments, lower-cased, and the part of a step they are;
#: the first that matches names it (attention first: its Hopper kernels use wgmma), else "other"
PARTS = (
    ("attention kernels", ("flash", "fmha", "attention", "sdpa")),
    (
        "matrix products",
        (
            "gemm",
            "xmma",
            "cutlass",
            "nvjet",
            "wgmma",
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::linear",
            "_linear_pointwise",  # oneDNN's (s2s.core.nn.precision.RowPaddedLinear)
            "linear_dynamic",  # int8 (torch.ao dynamic quantisation)
        ),
    ),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("softmax and loss", ("softmax", "nll", "cross_entropy", "logsumexp")),
    ("layer norm", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli", "philox")),
    ("copies and casts", ("copy", "cast", "memcpy", "memset", "fill", "to_copy")),
    # a search's choices: the best extensions, the rows they continue, the moved hypotheses
    ("search bookkeeping", ("topk", "sort", "gather", "index", "scatter", "where", "amax")),
    ("reductions", ("reduce", "sum", "norm")),
    ("elementwise", ("elementwise", "vectorized", "aten::add", "aten::mul", "aten::relu")),
)


def part_of(name: str) -> str:
    low = name.lower()
    return next((part for part, keys in PARTS if any(k in low for k in keys)), "other")


def by_part(prof, steps: int, cuda: bool) -> tuple[dict, list]:
    """A profile's time per step by part (`part_of`), in microseconds: the device's kernel time
    (CUDA) or the operators' own CPU time; and every kernel or operator's (us, name, calls),
    longest first."""
    parts, kernels = {}, []
    for e in prof.key_averages():
        own = e.self_device_time_total if cuda else e.self_cpu_time_total
        if own <= 0 or (cuda and e.device_type != torch.autograd.DeviceType.CUDA):
            continue
        us = own / steps
        parts[part_of(e.key)] = parts.get(part_of(e.key), 0.0) + us
        kernels.append((us, e.key[:120], e.count // steps))
    return parts, sorted(kernels, reverse=True)


def profile_steps(args, tmp: str, run_precision: str, sync, steps: int = 3) -> dict:
    """Where a step's time goes: `steps` updates under torch.profiler, the device's kernel time
    (CUDA) or the operators' own time (CPU) by part, and the wall time the device was idle."""
    device = torch.device(args.device)
    trainer = build_trainer(args, tmp, run_precision)
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if cuda else []
    )
    try:
        stream = trainer.streams[0]
        with fused_attention(device):
            for _ in range(args.warmup_steps):
                trainer.step([stream.next()])
            sync()
            with torch.profiler.profile(activities=activities) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    trainer.step([stream.next()])
                sync()
                wall = (time.perf_counter() - t0) / steps
    finally:
        trainer.close()
    parts, kernels = by_part(prof, steps, cuda)
    busy = sum(parts.values())
    return {
        "precision": run_precision,
        "profiled_steps": steps,
        "step_wall_ms": round(1000 * wall, 2),
        "busy_ms": round(busy / 1000, 2),
        "busy_counts": "CUDA kernel time" if cuda else "CPU operators' self time",
        "idle_fraction": round(max(0.0, 1 - busy / 1e6 / wall), 3) if cuda else None,
        "parts_ms": {k: round(v / 1000, 2) for k, v in sorted(parts.items(), key=lambda x: -x[1])},
        "top": [
            {"ms": round(us / 1000, 3), "name": name, "calls": n} for us, name, n in kernels[:15]
        ],
        "measured": "under torch.profiler, which adds its own overhead to the wall time",
    }


def time_steps(args, tmp: str, run_precision: str, sync) -> dict:
    """Median step time and the figures of `--steps` updates through Trainer.step."""
    device = torch.device(args.device)
    trainer = build_trainer(args, tmp, run_precision)
    try:
        stream, train = trainer.streams[0], trainer.members[0].data.splits["train"]
        with fused_attention(device):
            for _ in range(args.warmup_steps):
                trainer.step([stream.next()])
            with counted_syncs(device) as syncs:
                trainer.step([stream.next()])
            sync()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times, flops, tokens, src_tokens, out = [], 0, 0, 0, None
            for _ in range(args.steps):
                idx = stream.next()
                t0 = time.perf_counter()
                out = trainer.step([idx])
                sync()
                times.append(time.perf_counter() - t0)
                if out is None:  # a non-finite loss or gradient: the update was skipped
                    raise SystemExit(
                        f"gpu_step: {run_precision}: non-finite loss or gradient, update skipped"
                    )
                flops += trainer.model.flops(train.src_lens[idx], train.tgt_lens[idx])
                tokens += int(train.tgt_lens[idx].sum())
                src_tokens += int(train.src_lens[idx].sum())
        seconds, steps = statistics.median(times), args.steps
        return {
            "precision": trainer.precision,
            "asked": run_precision,
            "path": "s2s.core.training.trainer.Trainer.step",
            "parameters": trainer.n_params,
            "pairs": len(idx),
            "src_tokens": src_tokens // steps,
            "tgt_tokens": tokens // steps,
            "step_s": round(seconds, 4),
            "step_s_all": [round(t, 4) for t in times],
            "tgt_tokens_per_s": round(tokens / steps / seconds),
            "src_tgt_tokens_per_s": round((src_tokens + tokens) / steps / seconds),
            "model_tflop_per_step": round(flops / steps / 1e12, 4),
            "achieved_tflop_s": round(flops / steps / seconds / 1e12, 2),
            "achieved_flop_s": flops / steps / seconds,
            "syncs_per_step": None if syncs is None else len(syncs),
            "sync_calls": syncs,
            "tf32": bool(torch.backends.cuda.matmul.allow_tf32) if device.type == "cuda" else None,
            "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda"
            else None,
            "loss_per_token": round(float(out["loss_sum"] / out["ntokens"]), 3),
        }
    finally:
        trainer.close()


def loss_alone(args, sync) -> dict:
    """The chunked loss on a batch's decoder states, forward and backward, in bf16: its chunks,
    its CUDA kernel launches (torch.profiler) and its median time over 5 runs."""
    from s2s.core.nn.loss import chunk_rows, label_smoothed_loss

    device, d = torch.device(args.device), (64 if args.dry_run else 512)
    n, vocab = args.tokens, args.vocab
    h = torch.randn(n, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (0.05 * torch.randn(vocab, d, device=device)).bfloat16().requires_grad_()
    target = torch.randint(4, vocab, (n,), device=device)

    def run():
        loss, _ = label_smoothed_loss(h, w, target, 0.1)
        loss.backward()

    run()
    sync()
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    with torch.profiler.profile(activities=activities) as prof:
        run()
        sync()
    events = prof.events()
    launches = sum(
        1 for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC")
    )
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    rows = chunk_rows(n, vocab, device)
    return {
        "rows": n,
        "vocab": vocab,
        "d_model": d,
        "dtype": "bf16",
        "chunk_rows": rows,
        "chunks": -(-n // rows),
        "kernel_launches": launches if device.type == "cuda" else None,
        "ops_recorded": len(events),
        "seconds": round(statistics.median(times), 4),
        "measured": "the loss alone (fwd + bwd), in isolation",
    }


def machine(device: torch.device) -> dict:
    facts = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
        )
    return facts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument(
        "--precisions",
        nargs="+",
        default=["bf16", "fp16", "fp32"],
        choices=["bf16", "fp16", "fp32"],
    )
    p.add_argument("--vocab", type=int, default=37000)
    p.add_argument("--tokens", type=int, default=25000, help="source (and target) tokens per batch")
    p.add_argument("--length", type=int, default=25, help="tokens per sentence, EOS included")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="on CPU: a 1-layer d_model 64 model, 1,000 words, "
        "400-token batches, 2 steps, every step up to the CUDA calls",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile 3 updates of each precision: the device's time by part of the step",
    )
    args = p.parse_args()
    if args.dry_run:
        args.device, args.steps, args.warmup_steps, args.vocab, args.tokens, args.length = (
            "cpu",
            2,
            1,
            1000,
            400,
            10,
        )
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_step: no CUDA device", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    loss = loss_alone(args, sync)
    print(
        f"loss alone: {loss['rows']} rows x {loss['vocab']} words in {loss['chunks']} chunk(s) of "
        f"{loss['chunk_rows']} rows, {loss['kernel_launches']} kernel launches, {1000 * loss['seconds']:.1f} ms"
    )
    steps = []
    with tempfile.TemporaryDirectory(prefix="s2s-gpu-step-") as tmp:
        for run_precision in args.precisions:
            steps.append(time_steps(args, tmp, run_precision, sync))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        profiles = [profile_steps(args, tmp, r, sync) for r in args.precisions if args.profile]
    for prof in profiles:
        print(
            f"{prof['precision']:>4} profiled: step {prof['step_wall_ms']} ms, busy "
            f"{prof['busy_ms']} ms ({prof['busy_counts']}), idle {prof['idle_fraction']}; "
            + ", ".join(f"{k} {v}" for k, v in prof["parts_ms"].items())
        )
    rate = bf16_mm_rate(device)
    for r in steps:
        r["mfu_vs_measured_bf16_mm"] = round(r["achieved_flop_s"] / rate, 4)
        print(
            f"{r['asked']:>4} ({r['precision']}, Trainer.step): {r['pairs']} pairs = {r['src_tokens']} + "
            f"{r['tgt_tokens']} tokens, step {1000 * r['step_s']:.1f} ms, {r['tgt_tokens_per_s']:,} target tokens/s, "
            f"{r['achieved_tflop_s']} TFLOP/s, MFU {100 * r['mfu_vs_measured_bf16_mm']:.1f}% of the bf16 mm rate, "
            f"syncs/step {r['syncs_per_step']}, peak {r['peak_memory_gib']} GiB"
        )
    result = {
        "command": " ".join(["python", "bench/training/gpu_step.py", *sys.argv[1:]]),
        "dry_run": args.dry_run,
        "machine": machine(device),
        "model": "tiny" if args.dry_run else "base",
        "vocab": args.vocab,
        "bf16_mm_tflop_s": round(rate / 1e12, 2),
        "flop_count": "s2s.core.nn.model.Transformer.flops",
        "loss": loss,
        "steps": steps,
        "profiles": profiles,
    }
    where = Path(
        os.environ.get("S2S_GPU_CHECK_RESULTS") or Path(__file__).resolve().parent / "results"
    )
    out = where / ("gpu_check_dry_run.json" if args.dry_run else "gpu_check.json")
    where.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=1) + "\n")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
