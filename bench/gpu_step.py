"""Time the Trainer's update of a base model at the paper's batch size in bf16 on one GPU.

What is timed is the engine's own update, `s2s.core.train.Trainer.step` with run.precision=bf16
(s2s.core.precision: fp32 master weights, forward and backward in bf16), as `s2s train` takes it:
the batch gathered from the binarised split, forward, label-smoothed loss (0.1) divided by the
batch's target tokens, backward, the finiteness check, Adam with the warm-up schedule. The model
is the base one (ModelConfig's defaults: N=6, d_model 512, d_ff 2048, h=8, dropout 0.1); the
data a synthetic task registered here, a shared vocabulary of 37,000 words, one token each, and
pairs of random words, every side `--length` tokens with EOS, so that the batch is the paper's
~25k source and ~25k target tokens (1,000 pairs of 25 + 25 tokens) with no padding. Printed:
step time, tokens/s and model-FLOPs utilisation (MFU) against the bf16 matmul rate of this card
measured in the same run (torch.mm of 8192x8192 bf16 matrices), so the figure says how much of
what the card can actually deliver the step uses, not a ratio to a datasheet. Model FLOPs are
the model's own count, `s2s.core.model.Transformer.flops`, on the batch's lengths.

    python bench/gpu_step.py [--steps 10] [--vocab 37000] [--tokens 25000] [--length 25]
    python bench/gpu_step.py --device cpu --tiny      # a dry run of the same path, seconds on CPU
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)
import torch  # noqa: E402

from s2s.core.task import Task, TaskConfig  # noqa: E402
from s2s.core.vocab import SPECIALS, WordTokenizer  # noqa: E402

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

        return mm_rate(n=min(n, 512), repeats=3, seconds=min(seconds, 0.5), dtype=torch.bfloat16)
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
    return 2 * n ** 3 * reps / (start.elapsed_time(end) / 1000)


def build_trainer(args, tmp: str):
    """The Trainer of a run on the synthetic task: bf16, batches of `--tokens` tokens a side."""
    from s2s.core.config import load_config
    from s2s.core.registry import Registry
    from s2s.core.train import Trainer

    registry = Registry.installed()
    registry.register(SyntheticTask, "bench/gpu_step.py")
    overrides = [f"task.name={SyntheticTask.name}", f"task.vocab_size={args.vocab}",
                 f"task.pairs={args.tokens // args.length}", f"task.length={args.length}",
                 f"data.max_tokens={args.tokens}", f"data.cache_dir={tmp}/cache", f"run.dir={tmp}/run",
                 f"run.device={args.device}", "run.precision=bf16", "run.quiet=true", "run.keep_last=1"]
    overrides += [f"{k}={v}" for k, v in TINY.items()] if args.tiny else []
    return Trainer(load_config(None, overrides, registry=registry), registry, quiet=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=37000)
    p.add_argument("--tokens", type=int, default=25000, help="source (and target) tokens per batch")
    p.add_argument("--length", type=int, default=25, help="tokens per sentence, EOS included")
    p.add_argument("--device", default="cuda", help="cuda (the benchmark), or cpu for a dry run")
    p.add_argument("--tiny", action="store_true",
                   help="a dry run: a 1-layer d_model 64 model, 1,000 words, 400-token batches, 2 steps")
    args = p.parse_args()
    if args.tiny:
        args.steps, args.warmup_steps, args.vocab, args.tokens, args.length = 2, 1, 1000, 400, 10
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_step: no CUDA device", file=sys.stderr)
        return 2
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    with tempfile.TemporaryDirectory(prefix="s2s-gpu-step-") as tmp:
        trainer = build_trainer(args, tmp)
        try:
            stream, train = trainer.streams[0], trainer.members[0].data.splits["train"]
            for _ in range(args.warmup_steps):
                trainer.step([stream.next()])
            sync()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            flops = tokens = src_tokens = 0
            out = None
            t0 = time.perf_counter()
            for _ in range(args.steps):
                idx = stream.next()
                out = trainer.step([idx])
                if out is None:  # a non-finite loss or gradient: the update was skipped
                    break
                flops += trainer.model.flops(train.src_lens[idx], train.tgt_lens[idx])
                tokens += int(train.tgt_lens[idx].sum())
                src_tokens += int(train.src_lens[idx].sum())
            sync()
            seconds = (time.perf_counter() - t0) / args.steps
        finally:
            trainer.close()
    if out is None:
        print("gpu_step: non-finite loss or gradient, update skipped", file=sys.stderr)
        return 1

    rate = bf16_mm_rate(device)
    steps, cfg = args.steps, trainer.cfg.model
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "path": "s2s.core.train.Trainer.step", "precision": trainer.precision,
        "model": "tiny" if args.tiny else "base", "layers": cfg.layers, "d_model": cfg.d_model, "vocab": args.vocab,
        "parameters": trainer.n_params, "pairs": len(idx), "src_tokens": src_tokens // steps,
        "tgt_tokens": tokens // steps, "step_s": round(seconds, 4),
        "tgt_tokens_per_s": round(tokens / steps / seconds),
        "src_tgt_tokens_per_s": round((src_tokens + tokens) / steps / seconds),
        "model_tflop_per_step": round(flops / steps / 1e12, 3),
        "achieved_tflop_s": round(flops / steps / seconds / 1e12, 1),
        "bf16_mm_tflop_s": round(rate / 1e12, 1), "mfu_vs_measured_mm": round(flops / steps / seconds / rate, 3),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 1) if device.type == "cuda" else None,
        "loss_per_token": round(float(out["loss_sum"] / out["ntokens"]), 3),
        "flop_count": "s2s.core.model.Transformer.flops",
    }
    print(f"{result['model']} model, {trainer.precision}, {len(idx)} pairs = {result['src_tokens']} + "
          f"{result['tgt_tokens']} tokens per step on {result['device']} (Trainer.step)")
    memory = f"   peak memory {result['peak_memory_gib']} GiB" if device.type == "cuda" else ""
    print(f"  step {seconds * 1000:.1f} ms   {result['tgt_tokens_per_s']:,} target tokens/s   "
          f"{result['achieved_tflop_s']} TFLOP/s of {result['bf16_mm_tflop_s']} (bf16 mm)   "
          f"MFU {100 * result['mfu_vs_measured_mm']:.1f}%{memory}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
