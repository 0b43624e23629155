"""Reranking a run's n-best lists with a second run, the weights tuned on dev only.

    python -m bench.decoding.rerank --run runs/seed1 [--with runs/seed2] [--reverse runs/de_en]

`s2s rerank RUN --input val.en --nbest 8 --with OTHER --reverse REV --tune-ref val.de` (a second
run of the same direction, a reverse run for noisy channel) chooses the weights on
Multi30k's val (1,014 sentences); `s2s rerank ... --weights W` then writes test_2016_flickr's
outputs with them; `s2s generate RUN` (the task's beam 4) is the baseline, and `s2s score
--hyp BEAM --hyp RERANKED` the paired test. Writes bench/decoding/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, machine, s2s, write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--with", dest="other", nargs="*", default=[], type=Path)
    parser.add_argument("--reverse", nargs="*", default=[], type=Path)
    parser.add_argument("--nbest", type=int, default=8)
    parser.add_argument("--name", default="rerank")
    args = parser.parse_args()
    common = [args.run, "--nbest", args.nbest, "-q"]
    common += ["--with", *args.other] if args.other else []
    common += ["--reverse", *args.reverse] if args.reverse else []
    t0 = time.perf_counter()
    tuned = json.loads(
        s2s(
            "rerank", *common, "--input", MULTI30K / "val.en", "--tune-ref", MULTI30K / "val.de"
        ).stdout
    )
    tuning = time.perf_counter() - t0
    weights = ",".join(map(str, tuned["weights"]))
    source, refs = MULTI30K / "test_2016_flickr.en", MULTI30K / "test_2016_flickr.de"
    with tempfile.TemporaryDirectory(prefix="s2s-rerank-") as tmp:
        beam, reranked = Path(tmp) / "beam4.hyp", Path(tmp) / "reranked.hyp"
        s2s("generate", args.run, "--input", source, "--output", beam, "-q")
        s2s("rerank", *common, "--input", source, "--weights", weights, "--output", reranked)
        scored = json.loads(
            s2s("score", "own_translation", "--ref", refs, "--hyp", beam, "--hyp", reranked,
                "--json").stdout
        )  # fmt: skip
    result = {
        "command": " ".join(["python -m bench.decoding.rerank", *sys.argv[1:]]),
        "dev": tuned,
        "tuning_seconds": round(tuning, 1),
        "test": {
            "beam4_bleu": scored["systems"][0]["bleu"],
            "reranked_bleu": scored["systems"][1]["bleu"],
            "against_beam4": scored["comparisons"][0]["figures"],
        },
        "resampling": scored.get("resampling"),
        "machine": machine(),
    }
    write(args.name, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
