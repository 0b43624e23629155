"""The pass that lists pairs repeated across shards, timed alone (a piece in isolation, not a
user's end-to-end figure): `s2s.core.data.cleaning.across_shards` over `--shards` shards of
`--pairs` random 64-bit pair hashes each, every list computed, then one appended shard's.

    python -m bench.data.dedup_pass                   # 36 shards of 1M pairs: WMT14 EN-FR's size

The pass reads each earlier shard's sorted hashes once per later shard, so its time grows with
the square of the shard count; an appended shard reads every earlier shard once.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.common import machine, write
from s2s.core.data.cleaning import across_shards, save_hashes


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=36)
    ap.add_argument("--pairs", type=int, default=1_000_000, help="pairs a shard")
    ap.add_argument("--name", default="dedup_pass")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    names = [f"train.{i:05d}" for i in range(args.shards)]
    with tempfile.TemporaryDirectory(prefix="s2s-dedup-") as folder:
        folder = Path(folder)
        for name in names:
            hashes = rng.integers(0, 2**63, args.pairs, dtype=np.uint64)
            save_hashes(folder / f"{name}.hash.npy", hashes)
        t0 = time.perf_counter()
        across_shards(folder, names, 0)
        every = time.perf_counter() - t0
        t0 = time.perf_counter()
        across_shards(folder, names, len(names) - 1)
        appended = time.perf_counter() - t0
    result = {
        "machine": machine(),
        "benchmark": "the list of pairs repeated across shards, a piece in isolation (issue 65)",
        "settings": vars(args),
        "every_list_s": round(every, 2),
        "one_appended_shard_s": round(appended, 2),
    }
    print(result["every_list_s"], result["one_appended_shard_s"])
    write(args.name, result)
    return result


if __name__ == "__main__":
    main()
