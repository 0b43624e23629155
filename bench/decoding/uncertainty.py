"""How sure the figures are (issue 42): each seed's test figure with its 95% interval, the
seeds' spread, and paired tests between runs, from `s2s score` on the shell; and the cost of an
interval.

    python -m bench.decoding.ensembles multi30k_en_de --updates 1076 --seeds 1 2 3 --precision bf16
    python -m bench.decoding.ensembles ptb_sample_parsing --updates 3400 --seeds 1 2 3 --name ensembles_ptb
    python -m bench.decoding.uncertainty

reads the test outputs those two wrote (runs/ensembles/PRESET/test.seed*.hyp.txt, the
references and sources beside them) and writes bench/decoding/results/uncertainty.json:

* `spread`: for each preset, each seed's primary test figure (sacreBLEU; parsing: f1_all) with
  its 95% percentile-bootstrap interval (`s2s score --ci`), their mean and sample standard
  deviation;
* `paired`: `s2s score --hyp A --hyp B` for seed against seed (what two runs of one setting
  differ by) and for the ensemble of three against the best single run: the difference, its
  paired 95% interval and the approximate-randomisation p-value;
* `cost`: seconds for an interval of 1,000 resamples over 3,000 sentences (three copies of the
  Multi30k test outputs), `s2s score --ci` end to end against `s2s score` without it (the
  difference is what the interval costs), medians of 3, interleaved; and the library's
  `intervals` alone on the same statistics (a piece in isolation, labelled so).
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import write

RUNS = Path("runs/ensembles")
PRESETS = {"multi30k_en_de": "bleu", "ptb_sample_parsing": "f1_all"}


def score(preset: str, *argv: str) -> dict:
    """`s2s score PRESET ... --json` from the shell: its JSON object."""
    done = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", "score", preset, *argv, "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def files(preset: str) -> tuple[list[str], dict[str, Path]]:
    """The reference (and source) options of a preset's outputs, and its output files by name."""
    d = RUNS / preset
    where = ["--ref", str(d / "test.ref.txt")]
    if (d / "test.src.txt").is_file():
        where += ["--src", str(d / "test.src.txt")]
    outputs = {p.name[len("test.") : -len(".hyp.txt")]: p for p in sorted(d.glob("test.*.hyp.txt"))}
    return where, outputs


def spread(preset: str, figure: str) -> dict:
    where, outputs = files(preset)
    seeds = {name: p for name, p in outputs.items() if "+" not in name}
    rows = {}
    for name, path in seeds.items():
        found = score(preset, *where, "--hyp", str(path), "--ci")
        rows[name] = {"value": found[figure], "interval": found["intervals"][figure]}
    values = [r["value"] for r in rows.values()]
    return {
        "figure": figure,
        "runs": rows,
        "mean": round(statistics.mean(values), 2),
        "sd": round(statistics.stdev(values), 2),
        "range": round(max(values) - min(values), 2),
    }


def paired(preset: str, figure: str, best: str) -> list[dict]:
    where, outputs = files(preset)
    seeds = [name for name in outputs if "+" not in name]
    pairs = [(a, b) for i, a in enumerate(seeds) for b in seeds[i + 1 :]]
    pairs.append((best, "seed1+seed2+seed3"))
    out = []
    for a, b in pairs:
        found = score(preset, *where, "--hyp", str(outputs[a]), "--hyp", str(outputs[b]))
        d = found["comparisons"][0]["figures"][figure]
        out.append({"b_against_a": f"{b} against {a}", **d, "significant_at_0.05": d["p"] < 0.05})
    return out


def cost(repeats: int = 3) -> dict:
    """`s2s score --ci` against `s2s score` on 3,000 sentences, interleaved, medians."""
    from s2s.core.contract.resampling import Resampling, intervals
    from s2s.plugins.translation import metrics

    where, outputs = files("multi30k_en_de")
    refs = Path(where[1]).read_text(encoding="utf-8").splitlines() * 3
    hyps = outputs["seed1"].read_text(encoding="utf-8").splitlines() * 3
    with tempfile.TemporaryDirectory() as tmp:
        ref, hyp = Path(tmp) / "ref.txt", Path(tmp) / "hyp.txt"
        ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
        hyp.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        times = {"score": [], "score --ci": []}
        for _ in range(repeats):
            for name, extra in (("score", []), ("score --ci", ["--ci"])):
                start = time.perf_counter()
                score("multi30k_en_de", "--ref", str(ref), "--hyp", str(hyp), *extra)
                times[name].append(time.perf_counter() - start)
    stats = metrics.statistics(hyps, refs, "de")
    alone = []
    for _ in range(repeats):
        start = time.perf_counter()
        intervals(stats, Resampling())
        alone.append(time.perf_counter() - start)
    medians = {k: round(statistics.median(v), 2) for k, v in times.items()}
    return {
        "sentences": len(refs),
        "resamples": 1000,
        "figures": ["bleu", "bleu_tok", "chrf"],
        "end_to_end_s": medians,
        "interval_costs_s": round(medians["score --ci"] - medians["score"], 2),
        "target_s": 5.0,
        "met": medians["score --ci"] - medians["score"] < 5.0,
        "library_intervals_alone_s (a piece in isolation)": round(statistics.median(alone), 3),
    }


def main() -> None:
    spreads, pairs = {}, {}
    for preset, figure in PRESETS.items():
        spreads[preset] = spread(preset, figure)
        best = max(spreads[preset]["runs"], key=lambda n: spreads[preset]["runs"][n]["value"])
        pairs[preset] = paired(preset, figure, best)
        print(preset, json.dumps(spreads[preset]), json.dumps(pairs[preset]), flush=True)
    found = cost()
    print(json.dumps(found))
    path = write(
        "uncertainty",
        {
            "command": "python -m bench.decoding.uncertainty",
            "runs": {
                "multi30k_en_de": "bf16, 1,076 updates (the 10-minute budget), seeds 1-3, "
                "test_2016_flickr (1,000 sentences)",
                "ptb_sample_parsing": "3,400 updates (the 10-minute budget), seeds 1-3, "
                "118 test sentences",
            },
            "resampling": {"resamples": 1000, "level": 0.95, "seed": 12345, "test": "ar"},
            "spread": spreads,
            "paired": pairs,
            "cost": found,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
