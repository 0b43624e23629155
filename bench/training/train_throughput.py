"""End-to-end training throughput: `s2s train multi30k_en_de` as a user runs it, fp32 against bf16.

    python -m bench.training.train_throughput                      # 3 rounds of fp32 and bf16 (~25 min)
    python -m bench.training.train_throughput --rounds 1 --warmup-updates 5 --seconds 20 --log-interval 5

Each run is a subprocess of the real command line, `python -m s2s.core.apps.cli train multi30k_en_de`
with `run.threads`, `run.precision` and the data from `task.data_dir` (the shared Multi30k copy);
its clock is the trainer's own: data, forward, loss, backward, optimiser step and logging, as
metrics.jsonl reports them. Validation and checkpoints are moved out of the way
(run.valid_interval, run.save_interval), since their share depends on how long a run is. The
first `--warmup-updates` are passed over; the steady state is the span of train records that
follows, for at least `--seconds` of training time, after which the run is stopped:
sentences/s = sentence pairs trained in that span / its seconds, target tokens/s the same for
target tokens (BOS + ids, as the trainer counts them).

Precisions alternate run by run (fp32, bf16, fp32, bf16, ...), so that a change in the machine's
load touches both alike; figures are medians over rounds, and the bf16 / fp32 ratio is the median
of the per-round ratios. Each run's peak resident memory is its process's VmHWM. Right before every run the fp32 and the bf16 `torch.mm` rates (1024 x
1024, the same threads) are probed: the run's model FLOP/s (sentences/s times the mean FLOPs of
one training pair of the corpus, s2s.core.nn.model.Transformer.flops) is reported against both. The isolated update of bench/training/train_step.py is a different figure.

`--peers fairseq` races fairseq on the same model, pairs and batches, interleaved with the s2s
runs (issue 27's race: 150-second runs, the first 20 updates left out):

    python -m bench.training.train_throughput --peers fairseq --rounds 2 --seconds 150 --warmup-updates 20 \
        --set task.vocab_size=10000 data.max_tokens=4096 --name train_race

`--baseline REV` races commit REV's `s2s train` too (a git worktree of it, in each of
`--baseline-precisions`), in the same rounds: this checkout's speed against the commit's, per
round, is each precision's `sentences_per_s_vs_PRECISION@REV`.

fairseq reads the s2s run's own subword ids (written as id strings, one joined dictionary), and
trains `--arch transformer` with the preset's layers, sizes, dropout, label smoothing, Adam and
peak learning rate, `--max-tokens` = data.max_tokens, fp32 on the CPU with the same threads
(OMP_NUM_THREADS); its sentences/s come from its `train_inner` log records (bsz x ups, timed
by their `wall` clock). fairseq is not a dependency: install it into its own environment
(bench/interop/fairseq_parsing.py says how) and give `--fairseq-bin`; without it the race runs s2s
alone and says so in one line.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import (
    MULTI30K,
    REPO,
    commit_tree,
    flop_formula,
    mm_rate,
    runtime_env,
    s2s_command,
    table,
    write,
)

PRESET = "multi30k_en_de"
FAIRSEQ_RECORD = re.compile(r"\| train_inner \| (\{.*\})")


def overrides(data_dir: str, cache_dir: str, threads: int, log_interval: int) -> list[str]:
    """What every timed run shares: the data, the threads, no validation or checkpoint in the span."""
    return [
        f"task.data_dir={data_dir}",
        f"data.cache_dir={cache_dir}",
        f"run.threads={threads}",
        "run.device=cpu",
        f"run.log_interval={log_interval}",
        "run.valid_interval=1000000000",
        "run.save_interval=1000000000",
        "optim.max_updates=1000000000",
    ]


def pair_flops(common: list[str]) -> tuple[float, dict]:
    """Prepare the data (as the runs will find it) and return the mean FLOPs of training one pair."""
    from s2s.core.data.idspace import join
    from s2s.core.data.members import Member, build_task
    from s2s.core.data.nodes import prepare_data
    from s2s.core.nn.model import Transformer
    from s2s.core.nn.optim import lrate
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    registry = Registry.installed()
    cfg = load_config(PRESET, common, registry=registry)
    task = build_task(cfg.task, registry)
    train = prepare_data(task, cfg.data, quiet=True).splits["train"]
    with torch.device("meta"):  # the run's model, its shapes only
        net = Transformer(cfg.model, *join([Member(task.name, task)]))
    total = net.flops(train.src_lens, train.tgt_lens)
    m = cfg.model
    o = cfg.optim
    model = {
        "layers": m.layers,
        "d_model": m.d_model,
        "d_ff": m.d_ff,
        "heads": m.heads,
        "dropout": m.dropout,
        "vocab": task.tgt_vocab_size,
        "max_tokens": cfg.data.max_tokens,
        "train_pairs": len(train.src_lens),
        "label_smoothing": o.label_smoothing,
        "warmup": o.warmup,
        "peak_lr": lrate(o.warmup, m.d_model, o.warmup, o.lr_scale),
    }
    return total / len(train.src_lens), model


def steady_state(records: list[dict], warmup: int) -> dict | None:
    """Sentences/s and target tokens/s over the train records after update `warmup`."""
    train = [r for r in records if r.get("kind") == "train"]
    before = [r for r in train if r["update"] <= warmup]
    span = [r for r in train if r["update"] > warmup]
    if not before or not span:
        return None
    start, elapsed = before[-1]["elapsed"], span[-1]["elapsed"] - before[-1]["elapsed"]
    if elapsed <= 0:
        return None
    times, previous = [], start
    for r in span:
        times.append(r["elapsed"] - previous)
        previous = r["elapsed"]
    tokens = sum(r["tgt_tokens_per_s"] * dt for r, dt in zip(span, times))
    return {
        "updates": span[-1]["update"] - before[-1]["update"],
        "seconds": round(elapsed, 1),
        "sentences_per_s": round(sum(r["sentences"] for r in span) / elapsed, 2),
        "tgt_tokens_per_s": round(tokens / elapsed, 1),
    }


def vm_hwm_mib(pid: int) -> float:
    """The peak resident memory of a live process so far (VmHWM), MiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def timed(cmd: list[str], log: Path, measure, seconds: float, env: dict | None = None) -> dict:
    """Run `cmd` (output to `log`) until `measure()` (None until there is a span) reports a span
    of `seconds`, then stop it: that span's figures, the wall time and the peak RSS."""
    t0, peak, measured = time.monotonic(), 0.0, None
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                if time.monotonic() - t0 > 4 * seconds + 600 and not measured:  # no span in sight
                    break
                peak = max(peak, vm_hwm_mib(proc.pid))
                measured = measure()
                if measured and measured["seconds"] >= seconds:
                    break
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    if not measured or measured["seconds"] < seconds:
        raise RuntimeError(
            f"{cmd[0]} gave no span of {seconds} s (it ended, or ran {4 * seconds + 600:.0f} s without one):\n{log.read_text()[-3000:]}"
        )
    warnings = [line for line in log.read_text().splitlines() if "WARNING" in line]
    return {
        **measured,
        "wall_s": round(time.monotonic() - t0, 1),
        "peak_rss_mib": round(peak),
        "command": " ".join(cmd[1:]),
        "warnings": warnings,
    }


def timed_run(
    precision: str,
    common: list[str],
    warmup: int,
    seconds: float,
    run_dir: Path,
    tree: Path | None = None,
) -> dict:
    """One `s2s train` subprocess (this checkout's, or `tree`'s: a commit's, from
    bench.common.commit_tree), stopped once its steady-state span is `seconds` long."""
    from s2s.core.runs.metrics import read_metrics

    cmd = [
        *s2s_command(tree),
        "train",
        "-q",
        PRESET,
        *common,
        f"run.dir={run_dir}",
        f"run.precision={precision}",
    ]
    metrics = run_dir / "metrics.jsonl"
    return timed(
        cmd,
        run_dir.with_suffix(".log"),
        lambda: steady_state(read_metrics(run_dir), warmup) if metrics.is_file() else None,
        seconds,
    )


def fairseq_data(common: list[str], directory: Path, fairseq_bin: Path) -> Path:
    """The run's training and dev pairs as s2s's subword ids (id strings), binarised by
    fairseq-preprocess with one joined dictionary: fairseq trains on the same sequences."""
    from s2s.core.data.members import build_task
    from s2s.core.data.nodes import prepare_data
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    registry = Registry.installed()
    cfg = load_config(PRESET, common, registry=registry)
    task = build_task(cfg.task, registry)
    prepare_data(task, cfg.data, quiet=True)  # the cached vocabulary of the s2s runs
    for split in ("train", "valid"):
        sources, targets = map(list, zip(*task.read_split(split)))
        for side, ids in (
            ("src", task.encode_source(sources)),
            ("tgt", task.encode_target(targets)),
        ):
            (directory / f"{split}.{side}").write_text(
                "".join(" ".join(map(str, row)) + "\n" for row in ids)
            )
    subprocess.run(
        [
            str(fairseq_bin / "fairseq-preprocess"),
            "--source-lang",
            "src",
            "--target-lang",
            "tgt",
            f"--trainpref={directory / 'train'}",
            f"--validpref={directory / 'valid'}",
            "--joined-dictionary",
            "--destdir",
            str(directory / "bin"),
            "--workers",
            "1",
        ],
        check=True,
        capture_output=True,
    )
    return directory / "bin"


def fairseq_state(log: Path, warmup: int) -> dict | None:
    """Sentences/s and target tokens/s of fairseq's train_inner records after update `warmup`."""
    records = [
        json.loads(m.group(1))
        for m in map(FAIRSEQ_RECORD.search, log.read_text().splitlines())
        if m
    ]
    before = [r for r in records if int(r["num_updates"]) <= warmup]
    span = [r for r in records if int(r["num_updates"]) > warmup]
    if not before or not span:
        return None
    elapsed = float(span[-1]["wall"]) - float(before[-1]["wall"])
    if elapsed <= 0:
        return None
    updates = [int(r["num_updates"]) for r in (before[-1], *span)]
    done = [b - a for a, b in zip(updates, updates[1:])]  # updates each record covers
    return {
        "updates": updates[-1] - updates[0],
        "seconds": round(elapsed, 1),
        "sentences_per_s": round(sum(float(r["bsz"]) * n for r, n in zip(span, done)) / elapsed, 2),
        "tgt_tokens_per_s": round(
            sum(float(r["wpb"]) * n for r, n in zip(span, done)) / elapsed, 1
        ),
    }


def fairseq_run(
    fairseq_bin: Path,
    data: Path,
    model: dict,
    threads: int,
    log_interval: int,
    warmup: int,
    seconds: float,
    log: Path,
) -> dict:
    """One fairseq-train subprocess on the race's model and batches, timed as the s2s runs are."""
    m = model
    cmd = [
        str(fairseq_bin / "fairseq-train"),
        str(data),
        "--arch",
        "transformer",
        "--share-all-embeddings",
        *(
            f"--{side}-{key}={value}"
            for side in ("encoder", "decoder")
            for key, value in (
                ("layers", m["layers"]),
                ("embed-dim", m["d_model"]),
                ("ffn-embed-dim", m["d_ff"]),
                ("attention-heads", m["heads"]),
            )
        ),
        f"--dropout={m['dropout']}",
        "--criterion=label_smoothed_cross_entropy",
        f"--label-smoothing={m['label_smoothing']}",
        "--optimizer=adam",
        "--adam-betas=(0.9,0.98)",
        "--adam-eps=1e-9",
        f"--lr={m['peak_lr']}",
        "--lr-scheduler=inverse_sqrt",
        f"--warmup-updates={m['warmup']}",
        f"--max-tokens={m['max_tokens']}",
        "--max-update=1000000000",
        f"--log-interval={log_interval}",
        "--log-format=json",
        "--no-save",
        "--disable-validation",
        "--num-workers=0",
        "--cpu",
        "--seed=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return timed(cmd, log, lambda: fairseq_state(log, warmup), seconds, env)


def main(argv=None) -> dict:

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16", "auto"]
    )
    ap.add_argument("--rounds", type=int, default=3, help="runs of each precision, interleaved")
    ap.add_argument("--warmup-updates", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=120.0, help="training seconds timed per run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--log-interval",
        type=int,
        default=10,
        help="updates per train record (divides --warmup-updates)",
    )
    ap.add_argument("--data-dir", default=str(MULTI30K))
    ap.add_argument("--cache-dir", default=str(REPO / ".cache" / "s2s"))
    ap.add_argument("--name", default="train_throughput")
    ap.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="settings of every s2s run (the race's model)",
    )
    ap.add_argument(
        "--peers",
        nargs="+",
        default=[],
        choices=["fairseq"],
        help="other tools raced on the same model",
    )
    ap.add_argument(
        "--fairseq-bin", default="", help="the bin directory holding fairseq-train (default: PATH)"
    )
    ap.add_argument(
        "--baseline",
        metavar="REV",
        help="also race commit REV's s2s train in each of --baseline-precisions",
    )
    ap.add_argument(
        "--baseline-precisions", nargs="+", default=["bf16"], choices=["fp32", "bf16", "auto"]
    )
    args = ap.parse_args(argv)
    if (
        args.warmup_updates % args.log_interval
    ):  # the span starts at a record: update `warmup` must have one
        ap.error(
            f"--warmup-updates {args.warmup_updates} is not a multiple of --log-interval {args.log_interval}"
        )
    torch.set_num_threads(args.threads)
    common = [*overrides(args.data_dir, args.cache_dir, args.threads, args.log_interval), *args.set]
    flops_per_pair, model = pair_flops(common)
    fairseq_bin = (
        Path(args.fairseq_bin)
        if args.fairseq_bin
        else Path(shutil.which("fairseq-train") or ".").parent
    )
    peers = list(args.peers)
    if "fairseq" in peers and not (fairseq_bin / "fairseq-train").is_file():
        print(
            f"fairseq-train is not in {fairseq_bin if args.fairseq_bin else 'PATH'}: the race runs s2s alone",
            flush=True,
        )
        peers.remove("fairseq")

    olds = [f"{p}@{args.baseline}" for p in args.baseline_precisions] if args.baseline else []
    runs = {p: [] for p in [*args.precisions, *olds, *peers]}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="s2s-throughput-"))
        base = stack.enter_context(commit_tree(args.baseline)) if args.baseline else None
        fairseq_bin_data = fairseq_data(common, Path(tmp), fairseq_bin) if peers else None
        for r in range(args.rounds):
            for p in runs:
                # 1024^3, and the model's own feed-forward product over a batch's tokens
                shape = (model["max_tokens"], model["d_model"], model["d_ff"])
                mm = {
                    "fp32": mm_rate(repeats=3, seconds=0.6),
                    "bf16": mm_rate(repeats=3, seconds=0.6, dtype=torch.bfloat16),
                    "fp32_model_shape": mm_rate(repeats=3, seconds=0.6, shape=shape),
                    "bf16_model_shape": mm_rate(
                        repeats=3, seconds=0.6, dtype=torch.bfloat16, shape=shape
                    ),
                }
                if p == "fairseq":
                    run = fairseq_run(
                        fairseq_bin,
                        fairseq_bin_data,
                        model,
                        args.threads,
                        args.log_interval,
                        args.warmup_updates,
                        args.seconds,
                        Path(tmp) / f"fairseq_{r}.log",
                    )
                else:
                    precision, _, rev = p.partition("@")
                    run = timed_run(
                        precision,
                        common,
                        args.warmup_updates,
                        args.seconds,
                        Path(tmp) / f"{precision}{'_base' if rev else ''}_{r}",
                        base if rev else None,
                    )
                gflops = run["sentences_per_s"] * flops_per_pair / 1e9
                run.update(
                    round=r,
                    mm_gflops={k: round(v / 1e9, 1) for k, v in mm.items()},
                    model_gflops_per_s=round(gflops, 1),
                    of_mm={k: round(gflops * 1e9 / v, 4) for k, v in mm.items()},
                )
                runs[p].append(run)
                print(
                    json.dumps(
                        {"precision": p, **{k: v for k, v in run.items() if k != "command"}}
                    ),
                    flush=True,
                )

    summary = {}
    for p, rs in runs.items():
        med = lambda key: statistics.median(x[key] for x in rs)  # noqa: E731
        summary[p] = {
            "sentences_per_s_median": med("sentences_per_s"),
            "tgt_tokens_per_s_median": med("tgt_tokens_per_s"),
            "peak_rss_mib_median": med("peak_rss_mib"),
            "model_gflops_per_s_median": med("model_gflops_per_s"),
            "of_fp32_mm_median": statistics.median(x["of_mm"]["fp32"] for x in rs),
            "of_bf16_mm_median": statistics.median(x["of_mm"]["bf16"] for x in rs),
            "of_bf16_mm_model_shape_median": statistics.median(
                x["of_mm"]["bf16_model_shape"] for x in rs
            ),
        }
    base = "fairseq" if peers else args.precisions[0]
    for p in [
        q for q in runs if q != base
    ]:  # per-round ratios: each pair of runs ran next to each other
        ratios = [b["sentences_per_s"] / a["sentences_per_s"] for a, b in zip(runs[base], runs[p])]
        summary[p][f"sentences_per_s_vs_{base}_median"] = round(statistics.median(ratios), 3)
        summary[p][f"sentences_per_s_vs_{base}_all"] = [round(x, 3) for x in ratios]
    for old in olds:  # this checkout against the commit, per round
        p = old.partition("@")[0]
        if p in runs:
            ratios = [
                b["sentences_per_s"] / a["sentences_per_s"] for a, b in zip(runs[old], runs[p])
            ]
            summary[p][f"sentences_per_s_vs_{old}_median"] = round(statistics.median(ratios), 3)
            summary[p][f"sentences_per_s_vs_{old}_all"] = [round(x, 3) for x in ratios]
    targets = {"bf16_sentences_per_s_vs_fp32": 1.8}
    if peers:  # issue 27's race: bf16 at 2x fairseq's sentences/s, in no more memory than fp32
        targets = {"bf16_sentences_per_s_vs_fairseq": 2.0, "bf16_peak_rss_vs_fp32": 1.0}
    if "bf16" in summary and "fp32" in summary:
        summary["bf16"]["peak_rss_vs_fp32_median"] = round(
            statistics.median(
                b["peak_rss_mib"] / a["peak_rss_mib"] for a, b in zip(runs["fp32"], runs["bf16"])
            ),
            3,
        )
    result = {
        "benchmark": "end-to-end training throughput: s2s train multi30k_en_de, interleaved precisions"
        + (" and " + ", ".join(peers) if peers else ""),
        "command": " ".join(["python", "-m", "bench.training.train_throughput", *sys.argv[1:]]),
        "settings": args.set,
        "preset": PRESET,
        "model": model,
        "threads": args.threads,
        "rounds": args.rounds,
        "warmup_updates": args.warmup_updates,
        "timed_seconds_per_run": args.seconds,
        "flops_per_training_pair": round(flops_per_pair),
        "flop_formula": flop_formula(),
        "runtime_env": runtime_env(),
        "targets": targets,
        "summary": summary,
        "runs": runs,
    }
    path = write(args.name, result)
    print(
        table(
            [
                {
                    "run": p,
                    "sent/s": s["sentences_per_s_median"],
                    "tok/s": s["tgt_tokens_per_s_median"],
                    "peak MiB": s["peak_rss_mib_median"],
                    "GFLOP/s": s["model_gflops_per_s_median"],
                    "of fp32 mm": s["of_fp32_mm_median"],
                    "of bf16 mm": s["of_bf16_mm_median"],
                    f"vs {base}": s.get(f"sentences_per_s_vs_{base}_median", 1.0),
                }
                for p, s in summary.items()
            ]
        )
    )
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
