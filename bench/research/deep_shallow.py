"""A deep encoder with a 1-layer decoder against the balanced 3 + 3 of multi30k_en_de, at the same
parameter count, number of updates, seed and data (issue 76; Kasai et al. 2021, "Deep Encoder,
Shallow Decoder: Reevaluating Non-autoregressive Machine Translation": a deep encoder with a
1-layer decoder matches a balanced model in BLEU and decodes far faster).

    python -m bench.research.deep_shallow --updates 400 --valid-interval 400 --rounds 3
        # its result: bench/research/results/deep_shallow.json
    python -m bench.research.deep_shallow --updates 20 --valid-interval 10 --rounds 1 \
        --name deep_shallow_check --dir runs/deep_shallow_check   # the script, in minutes

The encoder's depth E is the one whose model (E encoder layers, --decoder-layers decoder layers,
the preset's d_model, d_ff, heads and vocabulary size) has the parameter count nearest the
preset's 3 + 3 (--encoder-layers sets it instead). Both runs are `s2s train multi30k_en_de` from
the shell on the shared Multi30k copy, fp32, run.threads=2, --updates updates, run.seed=1,
validating every --valid-interval updates; the second adds model.encoder_layers=E
model.decoder_layers=1. Figures of each: the parameter count of the trained model (and the ratio
deep-shallow / balanced), the run's own test BLEU (result.json: the checkpoint it selected on dev),
then `s2s generate RUN --input test_2016_flickr.en --beam 4` and `s2s score RUN` of its output
(sacreBLEU, with the paired test of the two outputs; the outputs' mean words), and beam-4
decoding speed: --rounds rounds of `s2s generate` of the 1,000 test lines from the shell, the
two models interleaved (A B A B ...), the process's wall time (startup and loading included)
and the same less the median time of a 1-line `s2s generate` of that model (the fixed cost),
medians and the ratio, with the load average before and after the rounds.
Writes bench/research/results/NAME.json (deep_shallow).
A run that finished (its result.json) is not trained again, so the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import MULTI30K, REPO, corpus_overrides, write  # noqa: E402

S2S = [sys.executable, "-m", "s2s.core.apps.cli"]
PRESET = "multi30k_en_de"
TEST = "test_2016_flickr"


def s2s(*args: str, log: Path, stdout: Path | None = None) -> float:
    """Run `s2s ARGS` from the shell, its log (and its output, unless `stdout`) appended to `log`;
    the seconds it took. A failure stops the benchmark, naming the log."""
    t0 = time.monotonic()
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"\n$ s2s {' '.join(args)}\n")
        f.flush()
        out = open(stdout, "w", encoding="utf-8") if stdout else f
        try:
            done = subprocess.run([*S2S, *args], stdout=out, stderr=f, cwd=REPO)
        finally:
            if stdout:
                out.close()
    if done.returncode:
        sys.exit(f"s2s {args[0]} failed ({done.returncode}): see {log}")
    return time.monotonic() - t0


def parameters(encoder_layers: int | None, decoder_layers: int | None, overrides) -> int:
    """The parameter count of the preset's model with these depths (None: the preset's), at the
    preset's vocabulary size (shared and tied, as the preset trains it)."""
    from s2s.core.nn.model import Transformer
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    given = {"encoder_layers": encoder_layers, "decoder_layers": decoder_layers}
    depths = [f"model.{k}={v}" for k, v in given.items() if v]
    cfg = load_config(PRESET, [*overrides, *depths], registry=Registry.installed())
    size = cfg.task.vocab_size
    return Transformer(cfg.model, size, size, shared_vocab=True).num_parameters()


def trained_parameters(run: Path) -> int:
    """The parameter count of a trained run's model (its real vocabulary's size)."""
    from s2s.core.inference.loading import load_for_inference
    from s2s.core.setup.registry import Registry

    return load_for_inference(run, Registry.installed(), ["run.device=cpu"])[2].num_parameters()


def mean_words(path: Path) -> float:
    """Mean whitespace-separated words of an output file's lines: decoding speed follows output
    length, so a speed ratio is read with it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return round(sum(len(line.split()) for line in lines) / max(1, len(lines)), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=1000, help="training updates of each run")
    parser.add_argument("--valid-interval", type=int, default=500)
    parser.add_argument("--decoder-layers", type=int, default=1)
    parser.add_argument("--encoder-layers", type=int, help="default: the count-matching depth")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds (A B each)")
    parser.add_argument("--dir", type=Path, default=REPO / "runs" / "deep_shallow")
    parser.add_argument("--name", default="deep_shallow")
    parser.add_argument("--cache-dir", type=Path, default=REPO / "runs" / "deep_shallow_cache")
    parser.add_argument("overrides", nargs="*", help="key=value for both runs")
    args = parser.parse_args()
    args.dir = args.dir.resolve()
    args.dir.mkdir(parents=True, exist_ok=True)
    log = args.dir / "log.txt"

    balanced = parameters(None, None, args.overrides)
    candidates = {e: parameters(e, args.decoder_layers, args.overrides) for e in range(1, 25)}
    depth = args.encoder_layers or min(candidates, key=lambda e: abs(candidates[e] - balanced))
    print(f"balanced {balanced:,} parameters; deep-shallow {depth} + {args.decoder_layers}: "
          f"{candidates[depth]:,}", flush=True)  # fmt: skip
    common = [
        *corpus_overrides(PRESET),
        f"optim.max_updates={args.updates}",
        "run.max_minutes=0",
        f"run.valid_interval={args.valid_interval}",
        f"run.save_interval={args.valid_interval}",
        "run.precision=fp32",
        "run.threads=2",
        "run.seed=1",
        "run.quiet=true",
        f"data.cache_dir={args.cache_dir.resolve()}",
        *args.overrides,
    ]
    runs = {
        "balanced": [],
        "deep_shallow": [
            f"model.encoder_layers={depth}",
            f"model.decoder_layers={args.decoder_layers}",
        ],  # fmt: skip
    }
    result = {
        "preset": PRESET,
        "updates": args.updates,
        "overrides": common,
        "command": "python -m bench.research.deep_shallow " + " ".join(sys.argv[1:]),
        "depths": {
            "balanced": "preset's model.layers (3 + 3)",
            "deep_shallow": f"{depth} + {args.decoder_layers}",
        },  # fmt: skip
        "parameters_at_preset_vocab": {
            "balanced": balanced,
            "deep_shallow_by_encoder_depth": candidates,
        },
        "runs": {},
    }
    src, ref = MULTI30K / f"{TEST}.en", MULTI30K / f"{TEST}.de"
    for name, extra in runs.items():
        run = args.dir / name
        if not (run / "result.json").is_file():
            seconds = s2s("train", PRESET, f"run.dir={run}", *common, *extra, log=log)
            result["runs"].setdefault(name, {})["train_seconds"] = round(seconds, 1)
            print(f"{name}: trained in {seconds:.0f} s", flush=True)
        trained = json.loads((run / "result.json").read_text())
        test = trained["test"]
        result["runs"].setdefault(name, {}).update(
            {
                "parameters": trained_parameters(run),
                "update": trained.get("update"),
                "run_test": {k: v for k, v in test.items() if isinstance(v, (int, float))},
                "dev_select": trained.get("dev_select"),
            }
        )
        write(args.name, result)
    counts = {n: result["runs"][n]["parameters"] for n in runs}
    result["parameter_ratio_deep_shallow_to_balanced"] = round(
        counts["deep_shallow"] / counts["balanced"], 4
    )

    # beam 4 outputs of each, scored with the paired test
    hyps = {}
    for name in runs:
        hyps[name] = args.dir / f"{name}.{TEST}.de"
        s2s("generate", str(args.dir / name), "--input", str(src), "--beam", "4",
            "run.device=cpu", log=log, stdout=hyps[name])  # fmt: skip
    scores = args.dir / "scores.json"
    s2s("score", str(args.dir / "balanced"), "--ref", str(ref), "--hyp", str(hyps["balanced"]),
        "--hyp", str(hyps["deep_shallow"]), "--json", log=log, stdout=scores)  # fmt: skip
    result["generate_score"] = {
        "commands": [
            f"s2s generate RUN --input {TEST}.en --beam 4 run.device=cpu > RUN.{TEST}.de",
            f"s2s score runs/balanced --ref {TEST}.de --hyp balanced.{TEST}.de "
            f"--hyp deep_shallow.{TEST}.de --json",
        ],
        "scores": json.loads(scores.read_text()),
        "mean_output_words": {n: mean_words(hyps[n]) for n in runs},
    }
    write(args.name, result)

    # beam-4 speed: interleaved rounds, last
    one = args.dir / "one_line.en"
    one.write_text(src.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    lines = sum(1 for _ in open(src, encoding="utf-8"))
    timing = {"load_avg_before": os.getloadavg(), "rounds": args.rounds, "lines": lines}
    walls = {n: [] for n in runs}
    fixed = {n: [] for n in runs}
    for _ in range(args.rounds):
        for name in runs:
            sink = args.dir / f"{name}.timed.de"
            common_gen = ("--beam", "4", "run.device=cpu")
            fixed[name].append(s2s("generate", str(args.dir / name), "--input", str(one),
                                   *common_gen, log=log, stdout=sink))  # fmt: skip
            walls[name].append(s2s("generate", str(args.dir / name), "--input", str(src),
                                   *common_gen, log=log, stdout=sink))  # fmt: skip
    timing["load_avg_after"] = os.getloadavg()
    for name in runs:
        wall, base = statistics.median(walls[name]), statistics.median(fixed[name])
        timing[name] = {
            "wall_seconds": [round(w, 2) for w in walls[name]],
            "one_line_seconds": [round(w, 2) for w in fixed[name]],
            "sentences_per_s_process": round(lines / wall, 2),
            "sentences_per_s_less_fixed_cost": round(lines / (wall - base), 2),
        }
    timing["speed_ratio_deep_shallow_to_balanced"] = {
        k: round(timing["deep_shallow"][k] / timing["balanced"][k], 3)
        for k in ("sentences_per_s_process", "sentences_per_s_less_fixed_cost")
    }
    result["beam4_speed"] = timing
    path = write(args.name, result)
    print(json.dumps({k: result[k] for k in ("parameter_ratio_deep_shallow_to_balanced",
                                             "beam4_speed")}, indent=1))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
