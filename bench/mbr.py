"""MBR decoding against beam search on a trained translation run, end to end from the shell.

    python -m bench.mbr --run runs/multi30k_en_de

Three `s2s generate` runs over the run's test sources (Multi30k test_2016_flickr, 1,000
sentences): beam 4 (the task's search), MBR with chrF over 32 epsilon samples (`--sampling
--epsilon 0.02 --nbest 32 --mbr chrf`, Freitag et al. 2023's candidates) and MBR with chrF over
the beam-16 n-best list (`--beam 16 --nbest 16 --mbr chrf`). Each output file is scored against
the references by `s2s score --hyp BEAM --hyp A --hyp B` (paired bootstrap against beam 4:
differences in chrF and BLEU with their intervals and p-values), and each run's wall time per
sentence is recorded. Writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, machine, s2s, write

VARIANTS = {
    "beam4": [],
    "mbr_chrf_epsilon32": ["--sampling", "--epsilon", "0.02", "--nbest", "32", "--seed", "1",
                           "--mbr", "chrf"],
    "mbr_chrf_beam16": ["--beam", "16", "--nbest", "16", "--mbr", "chrf"],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--name", default="mbr")
    args = parser.parse_args()
    source, refs = MULTI30K / "test_2016_flickr.en", MULTI30K / "test_2016_flickr.de"
    lines = len(source.read_text(encoding="utf-8").splitlines())
    result = {"command": f"python -m bench.mbr --run {args.run}", "run": str(args.run)}
    with tempfile.TemporaryDirectory(prefix="s2s-mbr-") as tmp:
        hyps, seconds = {}, {}
        for name, options in VARIANTS.items():
            hyps[name] = Path(tmp) / f"{name}.hyp"
            t0 = time.perf_counter()
            s2s("generate", args.run, "--input", source, "--output", hyps[name], "-q", *options)
            seconds[name] = time.perf_counter() - t0
            print(name, round(seconds[name], 1), "s", flush=True)
        scored = s2s("score", "own_translation", "--ref", refs,
                     *[x for h in hyps.values() for x in ("--hyp", h)], "--json")  # fmt: skip
        scores = json.loads(scored.stdout)
    names = {str(h): n for n, h in hyps.items()}
    result["systems"] = {
        names[s["hyp"]]: {
            "bleu": s["bleu"],
            "chrf": s["chrf"],
            "seconds": round(seconds[names[s["hyp"]]], 1),
            "ms_per_sentence": round(1000 * seconds[names[s["hyp"]]] / lines, 1),
        }
        for s in scores["systems"]
    }
    result["against_beam4"] = {
        names[c["b"]]: {k: c["figures"][k] for k in ("chrf", "bleu")}
        for c in scores["comparisons"]
        if names[c["a"]] == "beam4"
    }
    result["resampling"] = scores.get("resampling")
    result["machine"] = machine()
    write(args.name, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
