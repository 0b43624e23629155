"""A search step's self-attention in isolation (issue 45): equation 1 over a position-major
cache as batched products (`s2s.core.nn.attention.attention`, a small product a row and head)
against the cache read in order (`attention_in_order`), one thread, at several cache lengths,
for the base model's d_model 256 and the paper's parser's 1,024 (heads of 64).

    python -m bench.decoding.attention_order [--rows 504] [--repeats 5] [--name attention_order]

One query a row (504 rows: 24 sentences at beam 21) over keys and values laid out as
`DecoderCache` lays a layer's out ([positions, 2, rows, h, d], inside a buffer with room for more
positions); medians of `--repeats` timings of a few calls each. The figures are of this piece
alone (isolated): where the two cross over is what `MultiHeadAttention.step` decides by
(IN_ORDER_AFTER positions, and a cache larger than the CPU's). Writes
bench/decoding/results/NAME.json with the CPU's facts and its largest cache.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.common import write  # noqa: E402

POSITIONS = (16, 24, 32, 40, 64, 100)


def timed(fn, repeats: int, calls: int = 3) -> float:
    """Median seconds a call of fn() takes, over `repeats` stretches of `calls` calls."""
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls)
    return statistics.median(runs)


def compare(rows: int, d_model: int, positions: int, repeats: int) -> dict:
    """Both ways over one layer's cache of `positions` positions: seconds and the ratio."""
    from s2s.core.nn.attention import attention, attention_in_order

    h, d = d_model // 64, 64
    torch.manual_seed(0)
    cache = torch.randn(positions + 8, 2, rows, h, d)[:positions]
    q = torch.randn(rows, h, 1, d)
    keys, values = cache[:, 0].permute(1, 2, 0, 3), cache[:, 1].permute(1, 2, 0, 3)
    in_order = (q.view(rows * h, d), cache[:, 0].flatten(1, 2), cache[:, 1].flatten(1, 2))
    products = timed(lambda: attention(q, keys, values, None, False, 0.0), repeats)
    ordered = timed(lambda: attention_in_order(*in_order), repeats)
    return {
        "positions": positions,
        "cache_mib": round(cache.numel() * 4 / 2**20, 1),
        "products_ms": round(products * 1e3, 3),
        "in_order_ms": round(ordered * 1e3, 3),
        "in_order_speed": round(products / ordered, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=504)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--name", default="attention_order")
    args = p.parse_args()
    from s2s.core.nn.precision import cpu_last_level_cache

    torch.set_num_threads(1)
    result = {
        "command": " ".join(["python -m bench.decoding.attention_order", *sys.argv[1:]]),
        "rows": args.rows,
        "threads": 1,
        "last_level_cache_mib": cpu_last_level_cache() / 2**20,
        "measured": "isolated: one layer's self-attention step, no search around it",
    }
    with torch.inference_mode():
        for d_model in (256, 1024):
            rows = [compare(args.rows, d_model, t, args.repeats) for t in POSITIONS]
            result[f"d_model_{d_model}"] = rows
            for r in rows:
                print(d_model, r, flush=True)
    print(f"wrote {write(args.name, result)}")


if __name__ == "__main__":
    main()
