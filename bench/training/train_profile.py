"""Where a CPU training update spends its time (issue 45): the update of a preset as `s2s train`
takes it, `Trainer.step`, under torch.profiler, each operator's own time gathered into the parts
of a step (matrix products, attention, softmax and loss, layer norm, dropout, copies and casts,
the optimiser, ...), beside the torch.mm rates of this CPU in fp32 and bf16 at the model's own
shapes, measured in the same run.

    python -m bench.training.train_profile [--preset multi30k_en_de] [--precisions bf16 fp32] [--steps 8]
                                  [--tree REV]   # commit REV's s2s (a git worktree)

Per precision: the update's wall time unprofiled (median of `--steps`) and its model FLOPs
(`s2s.core.nn.model.Transformer.flops`) as a rate, against the mm rates; then 3 updates under
the profiler, the operators' own CPU time by part (ms an update; the profiler adds its own
overhead, so the parts are for proportions); then `--steps` updates under oneDNN's trace of
the products it compiles (a kernel for each new shape: bf16 products are oneDNN's), counted
and timed by oneDNN an update. The CPU's model and flags (AMX, AVX-512 BF16) are
in the JSON: machines of this kind differ. Writes bench/training/results/train_profile.json.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.common import TREE, corpus_overrides, in_tree, machine, mm_rate, write  # noqa: E402
from bench.training.gpu_step import by_part  # noqa: E402


def trainer_for(preset: str, precision: str, tmp: str, threads: int):
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.training.trainer import Trainer

    registry = Registry.installed()
    overrides = [
        *corpus_overrides(preset),
        f"run.dir={tmp}/run-{precision}",
        f"run.precision={precision}",
        f"run.threads={threads}",
        "run.device=cpu",
        "run.quiet=true",
    ]
    return Trainer(load_config(preset, overrides, registry=registry), registry, quiet=True)


@contextlib.contextmanager
def onednn_trace(path: Path):
    """Within: oneDNN's trace of the primitives it creates, written to `path` (oneDNN prints to
    the process's standard output, so file descriptor 1 is pointed there meanwhile)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(path, "w") as f:
            os.dup2(f.fileno(), 1)
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
                yield
            ctypes.CDLL(None).fflush(None)  # C's buffered output, before the file closes
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def compiles(trainer, steps: int) -> dict:
    """oneDNN's kernel compilations in `steps` updates (a primitive created on a cache miss):
    how many an update and the milliseconds oneDNN reports for them."""
    stream = trainer.streams[0]
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "onednn.txt"
        with onednn_trace(trace):
            for _ in range(steps):
                trainer.step([stream.next()])
        misses = [line for line in trace.read_text().splitlines() if "create:cache_miss" in line]
    ms = sum(float(line.rsplit(",", 1)[1]) for line in misses)
    return {
        "compiles_per_step": round(len(misses) / steps, 1),
        "compile_ms_per_step": round(ms / steps, 1),
    }


def profile(trainer, steps: int, profiled: int = 3) -> dict:
    """The update's time unprofiled (median of `steps`), then `profiled` updates by part."""
    stream, train = trainer.streams[0], trainer.members[0].data.splits["train"]
    for _ in range(3):
        trainer.step([stream.next()])
    times, flops, tokens = [], 0.0, 0
    for _ in range(steps):
        idx = stream.next()
        t0 = time.perf_counter()
        trainer.step([idx])
        times.append(time.perf_counter() - t0)
        flops += trainer.model.flops(train.src_lens[idx], train.tgt_lens[idx])
        tokens += int(train.tgt_lens[idx].sum())
    step = statistics.median(times)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(profiled):
            trainer.step([stream.next()])
    parts, top = by_part(prof, profiled, cuda=False)
    parts = {k: us / 1000 for k, us in parts.items()}  # ms an update
    top = [(us / 1000, name, n) for us, name, n in top]
    busy = sum(parts.values())
    return {
        **compiles(trainer, steps),
        "step_s": round(step, 4),
        "tgt_tokens_per_step": tokens // steps,
        "model_gflop_per_step": round(flops / steps / 1e9, 2),
        "achieved_gflop_s": round(flops / steps / step / 1e9, 1),
        "profiled_ms_per_step": round(busy, 1),
        "parts_ms": {k: round(v, 1) for k, v in sorted(parts.items(), key=lambda x: -x[1])},
        "parts_share": {
            k: round(v / busy, 3) for k, v in sorted(parts.items(), key=lambda x: -x[1])
        },
        "top": [{"ms": round(ms, 2), "op": name, "calls": n} for ms, name, n in top[:15]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="multi30k_en_de")
    p.add_argument("--precisions", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tree", metavar="REV", help="profile commit REV's s2s instead of this tree's")
    p.add_argument("--name", default="train_profile")
    args = p.parse_args()
    if args.tree and os.environ.get(TREE) != args.tree:
        return in_tree(args.tree, "bench.training.train_profile")
    torch.set_num_threads(args.threads)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="s2s-train-profile-") as tmp:
        for precision in args.precisions:
            trainer = trainer_for(args.preset, precision, tmp, args.threads)
            try:
                found = profile(trainer, args.steps)
                cfg = trainer.cfg.model
            finally:
                trainer.close()
            runs[precision] = found
            print(precision, {k: found[k] for k in ("step_s", "achieved_gflop_s", "parts_ms")})
    tokens = runs[args.precisions[0]]["tgt_tokens_per_step"]
    shapes = {"tokens x d x d_ff": (tokens, cfg.d_model, cfg.d_ff), "1024^3": (1024, 1024, 1024)}
    rates = {
        name: {
            str(dtype).split(".")[-1]: round(mm_rate(dtype=dtype, shape=shape) / 1e9, 1)
            for dtype in (torch.float32, torch.bfloat16)
        }
        for name, shape in shapes.items()
    }
    for precision, found in runs.items():
        dtype = "bfloat16" if precision == "bf16" else "float32"
        found["of_mm_rate"] = {
            name: round(found["achieved_gflop_s"] / r[dtype], 3) for name, r in rates.items()
        }
    result = {
        "command": " ".join(["python -m bench.training.train_profile", *sys.argv[1:]]),
        "machine": machine(),
        "preset": args.preset,
        "tree": args.tree or "this",
        "mm_gflop_s": rates,
        "mm_shapes": {k: list(v) for k, v in shapes.items()},
        "runs": runs,
        "measured": "Trainer.step of the preset; parts under torch.profiler (for proportions)",
    }
    print("mm GFLOP/s:", rates)
    for precision, found in runs.items():
        print(precision, "of the mm rate:", found["of_mm_rate"])
    print(f"wrote {write(args.name, result)}")


if __name__ == "__main__":
    main()
