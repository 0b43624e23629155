"""Ensembles of seeds against the best single run (issue 40, benchmarks a and b), end to end.

    python -m bench.decoding.ensembles multi30k_en_de --updates 1076 --seeds 1 2 3 --precision bf16
    python -m bench.decoding.ensembles ptb_sample_parsing --updates 3400 --seeds 1 2 3 --name ensembles_ptb

Trains the preset once a seed with `s2s train PRESET run.seed=S optim.max_updates=U` (a run
directory that already finished is kept: rerunning only decodes), then decodes the test split
with `s2s generate` from the shell: each run alone, the first two seeds as an ensemble
(`--ensemble`) and all of them, and scores every output file with `s2s score PRESET`
(translation: sacreBLEU; parsing: EVALB F1 over every sentence, `f1_all`, with the count of
trees the scorer had to repair). Each decode is timed (a process each: start, load, tokenise, search, write);
the JSON gives each variant's figures, its sentences/s, and the ensembles' gains over the best
single run with their ratios to the target (+1.5).
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.common import corpus_overrides, write

TARGET = 1.5  # points over the best single run


def s2s(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *argv],
        check=True,
        capture_output=True,
        text=True,
    )


def train(preset: str, run_dir: Path, seed: int, args) -> float:
    """Train one seed unless its run finished; the seconds it took (0: kept)."""
    if (run_dir / "result.json").is_file():
        return 0.0
    start = time.perf_counter()
    s2s(
        "train",
        preset,
        "-q",
        f"run.dir={run_dir}",
        f"run.seed={seed}",
        f"optim.max_updates={args.updates}",
        f"run.precision={args.precision}",
        f"run.threads={args.threads}",
        *corpus_overrides(preset),
        *args.overrides,
    )
    return time.perf_counter() - start


def test_split(run_dir: Path, where: Path) -> tuple[Path, Path, int, str]:
    """The run's test sources and references as files (the prepared split's raw lines), their
    number, and the run's task name."""
    from s2s.core.data.members import build_members, data_config
    from s2s.core.data.nodes import prepare_data
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    registry = Registry.installed()
    cfg = load_config(run_dir / "config.yaml", [], registry=registry)
    member = build_members(cfg, registry)[0]
    sources, refs = prepare_data(member.task, data_config(cfg), quiet=True).texts("test")
    src, ref = where / "test.src.txt", where / "test.ref.txt"
    src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
    ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    return src, ref, len(sources), member.task.name


def decode(runs: list[Path], src: Path, ref: Path, out: Path, task: str, args) -> dict:
    """`s2s generate` with `runs` (more than one: an ensemble) and `s2s score` of its output
    with the preset's task settings. Parsing reads the test split's sources as they are (Penn
    Treebank tokens already: `task.tokenize=false`)."""
    pretokenised = ["task.tokenize=false"] if task == "parsing" else []
    ensemble = ["--ensemble", *map(str, runs[1:])] if len(runs) > 1 else []
    start = time.perf_counter()
    s2s(
        "generate",
        str(runs[0]),
        *ensemble,
        "--input",
        str(src),
        "--output",
        str(out),
        "-q",
        f"run.threads={args.threads}",
        *pretokenised,
    )
    seconds = time.perf_counter() - start
    score_args = ["--src", str(src)] if task == "parsing" else []
    scored = json.loads(
        s2s(
            "score", args.preset, "--ref", str(ref), "--hyp", str(out), *score_args, "--json"
        ).stdout
    )
    return {"runs": [r.name for r in runs], "seconds": round(seconds, 1), "score": scored}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("preset")
    p.add_argument("--updates", type=int, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--precision", default="bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dir", default="runs/ensembles")
    p.add_argument("--name", default="ensembles_multi30k")
    p.add_argument("overrides", nargs="*", default=[])
    args = p.parse_args()

    where = Path(args.dir) / args.preset
    where.mkdir(parents=True, exist_ok=True)
    runs = [where / f"seed{s}" for s in args.seeds]
    trained = {r.name: round(train(args.preset, r, s, args), 1) for r, s in zip(runs, args.seeds)}
    src, ref, n, task = test_split(runs[0], where)
    variants = [[r] for r in runs] + [runs[:2], runs]
    rows = []
    for variant in variants:
        name = "+".join(r.name for r in variant)
        row = decode(variant, src, ref, where / f"test.{name}.hyp.txt", task, args)
        row["sentences_per_s"] = round(n / row["seconds"], 2)
        rows.append(row)
        print(name, row["score"], row["sentences_per_s"], flush=True)
    # the primary figure (bleu); for parsing F1 over every sentence, error ones counted as missed
    metric = "f1_all" if "f1_all" in rows[0]["score"] else next(iter(rows[0]["score"]))
    singles = rows[: len(runs)]
    best = max(singles, key=lambda r: r["score"][metric])
    gains = {}
    for row in rows[len(runs) :]:
        gain = row["score"][metric] - best["score"][metric]
        gains["+".join(row["runs"])] = {
            metric: row["score"][metric],
            "gain": round(gain, 2),
            "target": TARGET,
            "ratio_to_target": round(gain / TARGET, 2),
            "met": gain >= TARGET,
            "speed_vs_best_single": round(row["sentences_per_s"] / best["sentences_per_s"], 3),
        }
    write(
        args.name,
        {
            "preset": args.preset,
            "updates": args.updates,
            "precision": args.precision,
            "seeds": args.seeds,
            "train_seconds": trained,
            "test_sentences": n,
            "metric": metric,
            "variants": rows,
            "best_single": best["runs"][0],
            "ensembles": gains,
            "command": "python -m bench.decoding.ensembles " + " ".join(sys.argv[1:]),
        },
    )
    print(json.dumps(gains, indent=1))


if __name__ == "__main__":
    main()
