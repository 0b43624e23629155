"""Where a CPU search spends its time (issue 45): beam search of a trained run in each precision,
as `s2s generate` searches (the model `decode.precision` gives, sentences sorted by length, 128
at a time, one thread), its rate against the torch.mm rates of this CPU at a search step's
shape, and its operators' own time under torch.profiler gathered into the parts of a search
(matrix products, attention, softmax, copies and casts, the beam's bookkeeping, ...).

    python -m bench.search_profile --run RUN_DIR [--precisions fp32 bf16] [--sentences 512]

Per precision: sentences/s unprofiled (median of `--repeats`), the search's model FLOPs a
second (`Transformer.flops` per decoder row and source token, as bench/decode_speed.py counts
them) as a fraction of the fp32 and bf16 mm rates, then one profiled pass by part (the profiler
adds its own overhead: the parts are for proportions). The CPU's model and flags are in the
JSON. Writes bench/results/search_profile.json.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import MULTI30K, mm_rate, write  # noqa: E402
from bench.gpu_step import by_part  # noqa: E402

SHAPE = (512, 256, 1024)  # a beam-4 step of 128 sentences through multi30k_en_de's FFN


def profiled(model, task, sources, settings) -> tuple[dict, list]:
    """One search of `sources` (sorted by length, 128 to a batch, in this thread) under
    torch.profiler: (share of the operators' own time by part, the longest operators)."""
    from s2s.core.decode.batched import source_batch
    from s2s.core.decode.search import search

    ids = sorted(task.encode_source(sources), key=len)
    batches = [source_batch(ids[j : j + 128]) for j in range(0, len(ids), 128)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for batch in batches:
            search(model, batch, settings)
    parts, top = by_part(prof, 1, cuda=False)
    busy = sum(parts.values())
    share = {k: round(v / busy, 3) for k, v in sorted(parts.items(), key=lambda x: -x[1])}
    return share, [{"ms": round(us / 1000, 1), "op": op, "calls": n} for us, op, n in top[:12]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a trained multi30k_en_de run directory")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="search_profile")
    args = p.parse_args()
    from s2s.core.inference import load_run

    torch.set_num_threads(1)
    sources = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    sources = sources[: args.sentences]
    runs = {}
    for precision in args.precisions:
        loaded = load_run(args.run, ["run.device=cpu", f"decode.precision={precision}"])
        model, task, settings = loaded.model, loaded.task, loaded.settings
        rates({"warm-up": settings}, model, task, sources[:128])
        found = rates({"beam": settings}, model, task, sources, args.repeats)["beam"]
        found["parts_share"], found["top"] = profiled(model, task, sources, settings)
        runs[precision] = found
        print(precision, found["sentences_per_s"], found["parts_share"])
    mm = {
        str(d).split(".")[-1]: round(mm_rate(dtype=d, shape=SHAPE) / 1e9, 1)
        for d in (torch.float32, torch.bfloat16)
    }
    for found in runs.values():
        found["of_mm_rate"] = {k: round(found["model_gflops_per_s"] / v, 3) for k, v in mm.items()}
    result = {
        "command": " ".join(["python -m bench.search_profile", *sys.argv[1:]]),
        "run": args.run,
        "sentences": len(sources),
        "threads": 1,
        "mm_gflop_s": mm,
        "mm_shape": list(SHAPE),
        "runs": runs,
        "measured": "rates: s2s generate's path (bench.decode_speed.rates); parts: search() "
        "under torch.profiler, for proportions",
    }
    print("mm GFLOP/s:", mm)
    print(f"wrote {write(args.name, result)}")


def rates(variants: dict, model, task, sources, repeats: int = 1) -> dict:
    """bench.decode_speed.rates with 128 sentences a batch: each variant's rate and FLOPs."""
    from bench.decode_speed import rates as measured

    return measured(model, task, sources, variants, repeats, 128)[0]


if __name__ == "__main__":
    main()
