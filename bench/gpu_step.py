"""Time a base-model training step at the paper's batch size in bf16 on one GPU.

The step is the Trainer's: Transformer base (N=6, d_model=512, d_ff=2048, h=8, dropout 0.1,
shared 37k vocabulary as for EN-DE), bf16 autocast, label-smoothed loss divided by the batch's
target tokens, Adam with the warm-up schedule. The batch is the paper's, ~25k source and ~25k
target tokens (1000 pairs of 25 + 25 tokens, no padding). Printed: step time, tokens/s and
model-FLOPs utilisation (MFU) against the bf16 matmul rate of this card measured in the same
run (torch.mm of 8192x8192 bf16 matrices), so the figure says how much of what the card can
actually deliver the step uses, not a ratio to a datasheet.

Model FLOPs count the matrix products of the forward pass, 2*m*n*k each, times 3 for forward
and backward: per layer the Q, K, V, O projections and the FFN, both attention products (QK^T
and AV, the causal one counted whole), and the output projection over the vocabulary.

    python bench/gpu_step.py [--steps 10] [--vocab 37000] [--tokens 25000] [--length 25]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from s2s.core.config import ModelConfig, OptimConfig  # noqa: E402
from s2s.core.model import Transformer  # noqa: E402
from s2s.core.optim import adam, lrate  # noqa: E402
from s2s.core.vocab import BOS, EOS  # noqa: E402


def bf16_mm_rate(n: int = 8192, seconds: float = 2.0) -> float:
    """Sustained bf16 torch.mm FLOP/s on the current device (2 n^3 per product)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
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


def step_flops(cfg, vocab: int, pairs: int, src_len: int, tgt_len: int) -> float:
    """Forward + backward matmul FLOPs of one training step (3x the forward's)."""
    d, f, n = cfg.d_model, cfg.d_ff, cfg.layers
    S, T = pairs * src_len, pairs * tgt_len  # source and target tokens
    mm = lambda rows, k, cols: 2 * rows * k * cols  # noqa: E731
    enc = n * (4 * mm(S, d, d) + mm(S, d, f) + mm(S, f, d) + 2 * pairs * mm(src_len, d, src_len))
    dec = n * (4 * mm(T, d, d) + mm(T, d, f) + mm(T, f, d) + 2 * pairs * mm(tgt_len, d, tgt_len)  # self-attention
               + 2 * mm(T, d, d) + 2 * mm(S, d, d) + 2 * pairs * mm(tgt_len, d, src_len))  # attention to the source
    out = mm(T, d, vocab)
    return 3.0 * (enc + dec + out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--vocab", type=int, default=37000)
    p.add_argument("--tokens", type=int, default=25000, help="source (and target) tokens per batch")
    p.add_argument("--length", type=int, default=25, help="tokens per sentence, EOS included")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_step: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True  # what a user's run would do for any fp32 matmul left

    cfg = OmegaConf.structured(ModelConfig)  # the base model's defaults
    model = Transformer(cfg, args.vocab, args.vocab, shared_vocab=True).to(device)
    optimizer = adam(model.parameters(), OmegaConf.structured(OptimConfig))
    pairs, L = args.tokens // args.length, args.length
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(4, args.vocab, (pairs, L), generator=gen)
    src = words.clone()
    src[:, -1] = EOS
    tgt_out = torch.randint(4, args.vocab, (pairs, L), generator=gen)
    tgt_out[:, -1] = EOS
    tgt_in = torch.cat([torch.full((pairs, 1), BOS), tgt_out[:, :-1]], dim=1)
    src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
    ntokens = tgt_out.numel()

    def step(i: int) -> float:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss, _ = model(src, tgt_in, tgt_out, 0.1)
        (loss / ntokens).backward()
        for group in optimizer.param_groups:
            group["lr"] = lrate(i + 1, cfg.d_model, 4000)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup_steps):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(args.steps):
        loss = step(args.warmup_steps + i)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / args.steps
    loss_per_token = loss.item() / ntokens

    rate = bf16_mm_rate()
    flops = step_flops(cfg, args.vocab, pairs, L, L)
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "model": "base", "parameters": model.num_parameters(), "pairs": pairs,
        "src_tokens": pairs * L, "tgt_tokens": ntokens, "step_s": round(seconds, 4),
        "tgt_tokens_per_s": round(ntokens / seconds), "src_tgt_tokens_per_s": round(2 * ntokens / seconds),
        "model_tflop_per_step": round(flops / 1e12, 3), "achieved_tflop_s": round(flops / seconds / 1e12, 1),
        "bf16_mm_tflop_s": round(rate / 1e12, 1), "mfu_vs_measured_mm": round(flops / seconds / rate, 3),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
        "loss_per_token": round(loss_per_token, 3),
    }
    print(f"base model, bf16, {pairs} pairs = {pairs * L} + {ntokens} tokens per step on {result['device']}")
    print(f"  step {seconds * 1000:.1f} ms   {result['tgt_tokens_per_s']:,} target tokens/s   "
          f"{result['achieved_tflop_s']} TFLOP/s of {result['bf16_mm_tflop_s']} (bf16 mm)   "
          f"MFU {100 * result['mfu_vs_measured_mm']:.1f}%   peak memory {result['peak_memory_gib']} GiB")
    print(json.dumps(result))
    return 0 if torch.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
