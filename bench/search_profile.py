"""Where a CPU search spends its time (issue 45): beam search of a trained run in each precision,
as `s2s generate` searches (the model `decode.precision` gives, sentences sorted by length, 128
at a time, one thread), its rate against the torch.mm rates of this CPU at a search step's
shape (and an fp32 search layer's own: oneDNN's product, not torch.mm's MKL), and its
operators' own time under torch.profiler gathered into the parts of a search (matrix products,
attention, softmax, copies and casts, the beam's bookkeeping, ...).

    python -m bench.search_profile --run RUN_DIR [--precisions fp32 bf16] [--sentences 512]
    python -m bench.search_profile --run RUN_DIR --tree REV --name search_profile_REV
                                                 # commit REV's s2s (a git worktree), the same way

Per precision: sentences/s unprofiled (median of `--repeats`), the search's model FLOPs a
second (`Transformer.flops` per decoder row and source token, as bench/decode_speed.py counts
them) as a fraction of the fp32 and bf16 mm rates, then one profiled pass by part (the profiler
adds its own overhead: the parts are for proportions). The CPU's model and flags are in the
JSON. Writes bench/results/search_profile.json.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import MULTI30K, mm_rate, search_layer_rate, write  # noqa: E402
from bench.decode_speed import rates  # noqa: E402
from bench.gpu_step import by_part  # noqa: E402

#: set in the process that profiles another commit's tree (`--tree`)
TREE = "S2S_BENCH_TREE"
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
    p.add_argument(
        "--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "int8"]
    )
    p.add_argument("--sentences", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tree", metavar="REV", help="profile commit REV's s2s instead of this tree's")
    p.add_argument("--name", default="search_profile")
    args = p.parse_args()
    if args.tree and os.environ.get(TREE) != args.tree:
        return in_tree(args.tree)
    from s2s.core.inference import load_run

    torch.set_num_threads(1)
    sources = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    sources = sources[: args.sentences]
    runs = {}
    for precision in args.precisions:
        loaded = load_run(args.run, ["run.device=cpu", f"decode.precision={precision}"])
        model, task, settings = loaded.model, loaded.task, loaded.settings
        rates(model, task, sources[:128], {"warm-up": settings}, 1, 128)
        found = rates(model, task, sources, {"beam": settings}, args.repeats, 128)[0]["beam"]
        found["parts_share"], found["top"] = profiled(model, task, sources, settings)
        runs[precision] = found
        print(precision, found["sentences_per_s"], found["parts_share"])
    mm = {
        str(d).split(".")[-1]: round(mm_rate(dtype=d, shape=SHAPE) / 1e9, 1)
        for d in (torch.float32, torch.bfloat16)
    }
    layer = search_layer_rate(SHAPE)  # oneDNN's fp32 product, which fp32 search takes
    if layer is not None:
        mm["float32_search_layer"] = round(layer / 1e9, 1)
    for found in runs.values():
        found["of_mm_rate"] = {k: round(found["model_gflops_per_s"] / v, 3) for k, v in mm.items()}
    result = {
        "command": " ".join(["python -m bench.search_profile", *sys.argv[1:]]),
        "run": args.run,
        "tree": args.tree or "this",
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


def in_tree(rev: str) -> None:
    """This script's command run again with commit `rev`'s s2s package first on sys.path."""
    import subprocess

    from bench.common import REPO, commit_tree

    with commit_tree(rev) as path:
        code = (
            f"import sys; sys.path.insert(0, {str(path)!r}); "
            "from bench.search_profile import main; main()"
        )
        subprocess.run(
            [sys.executable, "-c", code, *sys.argv[1:]],
            cwd=REPO,
            env={**os.environ, TREE: rev},
            check=True,
        )


if __name__ == "__main__":
    main()
