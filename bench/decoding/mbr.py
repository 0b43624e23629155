"""MBR decoding's expected utility computed exactly (every pair) and by reference aggregation,
on the same candidates of a trained translation run.

    python -m bench.decoding.mbr --run RUN

One `s2s generate --sampling --epsilon 0.02 --nbest N --seed 1 --json` over the first `--lines`
test sources (Multi30k test_2016_flickr) gives each line's N candidates (Freitag et al. 2023's
epsilon samples), timed. Of each line's candidates, each method of `s2s.core.decode.mbr` (the
code `s2s generate --mbr U --mbr-method M` runs) chooses one, for the utilities chrF and BLEU,
timed in this process. Figures: for each utility, how many lines both methods choose the same
candidate for (agreement), how far the aggregated utilities are from the exact ones (largest
and mean absolute difference over all candidates), the exact expected utility that the
aggregated choice gives up (mean over lines), corpus chrF and BLEU of each method's choices by
`s2s score` (paired against pairwise: bootstrap intervals, approximate randomisation p), and
the milliseconds a sentence of the candidates and of each method; beam 4's output beside them
(`s2s generate RUN --beam 4`, its chrF, BLEU and time). The machine is shared with
other jobs: times are noisy. Writes bench/decoding/results/NAME.json with the machine's facts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, s2s, write
from s2s.core.decode.mbr import METHODS, UTILITIES, expected_utilities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--nbest", type=int, default=32, help="candidates a line")
    parser.add_argument("--lines", type=int, default=1000, help="the first LINES test lines")
    parser.add_argument("--name", default="mbr")
    args = parser.parse_args()
    sources = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    refs = (MULTI30K / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    sources, refs = sources[: args.lines], refs[: args.lines]
    sampling = ["--sampling", "--epsilon", "0.02", "--nbest", str(args.nbest), "--seed", "1"]
    result = {
        "command": "python -m bench.decoding.mbr " + " ".join(sys.argv[1:]),
        "run": str(args.run),
        "lines": len(sources),
        "candidates": f"s2s generate RUN {' '.join(sampling)} --json",
        "timing": "machine shared with other jobs (2 cores, other helpers' tests and training): "
        "wall times are noisy",
    }
    with tempfile.TemporaryDirectory(prefix="s2s-mbr-") as tmp:
        where = Path(tmp)
        (where / "src.en").write_text("".join(x + "\n" for x in sources), encoding="utf-8")
        (where / "ref.de").write_text("".join(x + "\n" for x in refs), encoding="utf-8")
        t0 = time.perf_counter()
        s2s("generate", args.run, "--input", where / "src.en", "--output", where / "cand.jsonl",
            "-q", "--json", *sampling)  # fmt: skip
        candidates_s = time.perf_counter() - t0
        print("candidates", round(candidates_s, 1), "s", flush=True)
        t0 = time.perf_counter()
        s2s("generate", args.run, "--input", where / "src.en", "--output", where / "beam4.de",
            "-q", "--beam", "4")  # fmt: skip
        beam_s = time.perf_counter() - t0
        scored = s2s("score", "own_translation", "--ref", where / "ref.de",
                     "--hyp", where / "beam4.de", "--json")  # fmt: skip
        beam = json.loads(scored.stdout)
        result["beam4"] = {
            "bleu": beam["bleu"],
            "chrf": beam["chrf"],
            "ms_per_sentence": round(1000 * beam_s / len(sources), 1),
        }
        lines = [
            [o["output"] for o in json.loads(x)["outputs"]]
            for x in (where / "cand.jsonl").read_text(encoding="utf-8").splitlines()
        ]
        result["candidates_ms_per_sentence"] = round(1000 * candidates_s / len(lines), 1)
        result["distinct_candidates_per_line"] = round(
            statistics.mean(len(set(c)) for c in lines), 2
        )
        result["utilities"] = {}
        for utility in UTILITIES:
            found, seconds = {}, {}
            for method in METHODS:
                t0 = time.perf_counter()
                found[method] = [expected_utilities(c, utility, method) for c in lines]
                seconds[method] = time.perf_counter() - t0
                print(utility, method, round(seconds[method], 1), "s", flush=True)
            chosen = {
                method: [max(range(len(u)), key=u.__getitem__) for u in found[method]]
                for method in METHODS
            }
            exact, aggregated = found["pairwise"], found["aggregate"]
            gaps = [abs(a - b) for e, g in zip(exact, aggregated) for a, b in zip(e, g)]
            lost = [e[p] - e[a] for e, p, a in zip(exact, chosen["pairwise"], chosen["aggregate"])]
            same = sum(
                c[p] == c[a] for c, p, a in zip(lines, chosen["pairwise"], chosen["aggregate"])
            )
            for method in METHODS:
                text = "".join(c[i] + "\n" for c, i in zip(lines, chosen[method]))
                (where / f"{utility}_{method}.de").write_text(text, encoding="utf-8")
            hyps = [x for m in METHODS for x in ("--hyp", where / f"{utility}_{m}.de")]
            scored = s2s("score", "own_translation", "--ref", where / "ref.de", *hyps, "--json")
            scores = json.loads(scored.stdout)
            (comparison,) = scores["comparisons"]
            result["resampling"] = scores.get("resampling")
            result["utilities"][utility] = {
                "same_choice": same,
                "same_choice_share": round(same / len(lines), 4),
                "utility_gap_max": round(max(gaps), 2),
                "utility_gap_mean": round(statistics.mean(gaps), 3),
                "exact_utility_lost_mean": round(statistics.mean(lost), 3),
                "exact_utility_lost_max": round(max(lost), 2),
                "systems": {
                    m: {
                        "bleu": s["bleu"],
                        "chrf": s["chrf"],
                        "utility_ms_per_sentence": round(1000 * seconds[m] / len(lines), 2),
                        "ms_per_sentence": round(
                            1000 * (candidates_s + seconds[m]) / len(lines), 1
                        ),
                    }
                    for m, s in zip(METHODS, scores["systems"])
                },
                "aggregate_against_pairwise": {
                    k: comparison["figures"][k] for k in ("chrf", "bleu")
                },
            }
    print(f"wrote {write(args.name, result)}")  # with the machine's facts
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
