"""Where a CPU search spends its time (issue 45): beam search of a trained run in each precision,
as `s2s generate` searches (the model `decode.precision` gives, sentences sorted by length, one
search's rows to a batch, the task's constraint, one thread), its rate against the torch.mm
rates of this CPU at a search step's shape (and an fp32 search layer's own: oneDNN's product,
not torch.mm's MKL), and its operators' own time under torch.profiler gathered into the parts
of a search (matrix products, attention, softmax, copies and casts, the beam's bookkeeping, ...).

    python -m bench.decoding.search_profile --run RUN_DIR [--precisions fp32 bf16] [--sentences 512]
    python -m bench.decoding.search_profile --parsing-run PARSER_RUN_DIR --precisions fp32
    python -m bench.decoding.search_profile --run RUN_DIR --tree REV --name search_profile_REV
                                                 # commit REV's s2s (a git worktree), the same way

`--run`: a multi30k_en_de run, the first `--sentences` of test_2016_flickr; `--parsing-run`: a
ptb_sample_parsing run, its test split at the preset's beam (21) with the tree constraint.
Per precision: sentences/s unprofiled (median of `--repeats`), the search's model FLOPs a
second (`Transformer.flops` per decoder row and source token, as bench/decoding/decode_speed.py counts
them) as a fraction of the fp32 and bf16 mm rates, then one profiled pass by part (the profiler
adds its own overhead: the parts are for proportions). The profiled pass also puts each of the
two kinds of work against its own limit: the linear layers' FLOPs in their products' time
against the search layer's rate, and the bytes attention reads (every key and value of the
cache and of the encoder output, once a step and layer) in the decoder steps' time in equation
1 (an unprofiled search) against the rate at which one thread reads memory
(`bench.common.read_rate`, this run). The
CPU's model and flags are in the JSON. Writes bench/decoding/results/search_profile.json.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.common import (  # noqa: E402
    MULTI30K,
    TREE,
    in_tree,
    mm_rate,
    read_rate,
    search_layer_rate,
    write,
)
from bench.decoding.decode_speed import parsing_job, rates  # noqa: E402
from bench.training.gpu_step import by_part  # noqa: E402

SHAPE = (512, 256, 1024)  # a beam-4 step of 128 sentences through multi30k_en_de's FFN


def profiled(model, task, sources, settings) -> tuple[dict, list, dict]:
    """One search of `sources` as `s2s generate` batches them (sorted by length, at most one
    search's rows at once, the task's constraint), in this thread, under torch.profiler: (share
    of the operators' own time by part, the longest operators, the two limits: the linear
    layers' FLOPs in their products' own time, and attention's reads in its time in a second,
    unprofiled search, `attention_read`)."""
    from s2s.core.decode.batched import source_batch
    from s2s.core.decode.search import search, sentences_per_batch, sentences_per_search

    ids = task.encode_source(sources)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    size = sentences_per_search(settings.beam, sentences_per_batch(0, "cpu"), "cpu")
    batches = [order[j : j + size] for j in range(0, len(order), size)]

    def searches():  # a constraint for each search: one carries a search's state
        for b in batches:
            constraint = task.constraint([sources[i] for i in b])
            search(model, source_batch([ids[i] for i in b]), settings, constraint)

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        searches()
    rows, read, attention_s = attention_read(model, searches)
    parts, top = by_part(prof, 1, cuda=False)
    busy = sum(parts.values())
    share = {k: round(v / busy, 3) for k, v in sorted(parts.items(), key=lambda x: -x[1])}
    # the linear layers' products: every matrix product but attention's batched ones
    linear_us = parts.get("matrix products", 0.0) - sum(
        us for us, op, _ in top if op == "aten::bmm"
    )
    flop = model.flops(sum(len(x) + 1 for x in ids), rows, backward=False, attention=False)
    limits = {
        "linear_gflop": round(flop / 1e9, 2),
        "linear_products_s": round(linear_us / 1e6, 3),
        "linear_gflop_s": round(flop / linear_us / 1e3, 1),
        "attention_gb_read": round(read / 1e9, 2),
        "attention_s": round(attention_s, 3),
        "attention_gb_s": round(read / attention_s / 1e9, 1),
    }
    top = [{"ms": round(us / 1000, 1), "op": op, "calls": n} for us, op, n in top[:12]]
    return share, top, limits


def attention_read(model, searches) -> tuple[int, int, float]:
    """Run `searches()` unprofiled, counting the decoder rows of its steps, the bytes their
    attention reads (`attention_bytes`) and the seconds the steps spend in equation 1 (the
    attention functions of s2s.core.nn.attention, products and softmax)."""
    from s2s.core.nn import attention as module

    rows, read, spent, stepping = [0], [0], [0.0], [False]
    step = model.decode_step

    def counted(tokens, cache):
        rows[0] += tokens.size(0)
        read[0] += attention_bytes(model, cache, tokens.size(0))
        stepping[0] = True
        try:
            return step(tokens, cache)
        finally:
            stepping[0] = False

    def timed(fn):
        def run(*args, **kwargs):
            if not stepping[0]:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            spent[0] += time.perf_counter() - t0
            return out

        return run

    names = [n for n in ("attention", "attention_in_order") if hasattr(module, n)]
    originals = {n: getattr(module, n) for n in names}
    model.decode_step = counted
    try:
        for n in names:
            setattr(module, n, timed(originals[n]))
        searches()
    finally:
        del model.decode_step
        for n in names:
            setattr(module, n, originals[n])
    return rows[0], read[0], spent[0]


def attention_bytes(model, cache, rows: int) -> int:
    """The bytes a decoder step's attention reads at least: the keys and values of the steps
    done and this one (self-attention, each row its own) and of the source positions (each
    sentence's, shared by its rows), in every layer, in the activations' dtype."""
    att = model.decoder[0].self_attn
    per_position = len(model.decoder) * att.h * (att.d_k + att.d_v) * model.pe.element_size()
    sentences, source = cache.memory_mask.size(0), cache.memory_mask.size(-1)
    return per_position * (rows * (cache.step + 1) + sentences * source)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", help="a trained multi30k_en_de run directory")
    p.add_argument("--parsing-run", help="a trained ptb_sample_parsing run directory")
    p.add_argument(
        "--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "int8"]
    )
    p.add_argument("--sentences", type=int, default=512, help="of test_2016_flickr (--run)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tree", metavar="REV", help="profile commit REV's s2s instead of this tree's")
    p.add_argument("--name", default="search_profile")
    args = p.parse_args()
    if not (args.run or args.parsing_run):
        p.error("give --run, --parsing-run or both")
    if args.tree and os.environ.get(TREE) != args.tree:
        return in_tree(args.tree, "bench.decoding.search_profile")
    from s2s.core.inference import load_run

    torch.set_num_threads(1)
    jobs = {}
    if args.run:
        sources = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
        jobs["translation"] = (args.run, sources[: args.sentences], [])
    if args.parsing_run:
        run, sources, _, own = parsing_job(args.parsing_run)
        jobs["parsing"] = (run, sources, own)
    mm = {
        str(d).split(".")[-1]: round(mm_rate(dtype=d, shape=SHAPE) / 1e9, 1)
        for d in (torch.float32, torch.bfloat16)
    }
    layer = search_layer_rate(SHAPE)  # oneDNN's fp32 product, which fp32 search takes
    if layer is not None:
        mm["float32_search_layer"] = round(layer / 1e9, 1)
    read = round(read_rate() / 1e9, 1)
    result = {
        "command": " ".join(["python -m bench.decoding.search_profile", *sys.argv[1:]]),
        "tree": args.tree or "this",
        "threads": 1,
        "mm_gflop_s": mm,
        "mm_shape": list(SHAPE),
        "read_gb_s": read,
    }
    for job, (run, sources, own) in jobs.items():
        runs = {}
        for precision in args.precisions:
            loaded = load_run(run, ["run.device=cpu", f"decode.precision={precision}", *own])
            model, task, settings = loaded.model, loaded.task, loaded.settings
            rates(model, task, sources[:128], {"warm-up": settings}, 1, 0)
            found = rates(model, task, sources, {"beam": settings}, args.repeats, 0)[0]["beam"]
            found["parts_share"], found["top"], limits = profiled(model, task, sources, settings)
            found["of_mm_rate"] = {
                k: round(found["model_gflops_per_s"] / v, 3) for k, v in mm.items()
            }
            if layer is not None:
                limits["linear_of_search_layer_rate"] = round(
                    limits["linear_gflop_s"] / mm["float32_search_layer"], 3
                )
            limits["attention_of_read_rate"] = round(limits["attention_gb_s"] / read, 3)
            found["limits"] = limits
            runs[precision] = found
            print(job, precision, found["sentences_per_s"], found["parts_share"], limits)
        result[job] = {"run": run, "sentences": len(sources), "runs": runs}
    result["measured"] = (
        "rates: s2s generate's path (bench.decoding.decode_speed.rates); parts and limits: search() "
        "under torch.profiler, operators' own time"
    )
    print("mm GFLOP/s:", mm, "read GB/s:", read)
    print(f"wrote {write(args.name, result)}")


if __name__ == "__main__":
    main()
