"""Terminology by dynamic beam allocation at equal beams: terms at beam k against the same
search without terms at beam k, so that the gain is the terms', not a wider beam's.

    python -m bench.decoding.terminology --run RUN

The protocol of Dinu et al. (2019) and Post and Vilar (2018): a line's terms are those of a
term list whose source side is in the source and whose target side is in the reference. The
term list is bench.decoding.decode_beyond's (English and German words of Multi30k's training data that
align reliably, by Dice coefficient); a word is a 13a token of at least 4 letters. On the lines
of Multi30k test_2016_flickr (or `--split val`) that hold a term in both, `s2s generate` runs at
each of `--beams` (4 and 8) without terms and with `--line-terms` (each line's target terms),
the four runs interleaved `--repeats` times. Figures on those lines: sacreBLEU and chrF of each
run, each terms run paired by `s2s score` against the unconstrained run of its beam (bootstrap
intervals, approximate randomisation p), the share of terms in each output, and the wall time
per line (median of the repeats). The machine is shared with other jobs: times are noisy.
Writes bench/decoding/results/NAME.json with the machine's facts.
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
from bench.decoding.decode_beyond import term_list, words


def line_terms(sources: list[str], refs: list[str]) -> list[list[str]]:
    """Each line's target terms: a term list's pairs whose source word is in the source and
    whose target word is in the reference."""
    terms = term_list()
    return [
        [d for e, d, _ in terms if e in words(src) and d in words(ref)]
        for src, ref in zip(sources, refs)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, type=Path)
    parser.add_argument("--split", default="test_2016_flickr", help="or val, to tune on")
    parser.add_argument("--beams", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--name", default="terminology")
    args = parser.parse_args()
    sources = (MULTI30K / f"{args.split}.en").read_text(encoding="utf-8").splitlines()
    refs = (MULTI30K / f"{args.split}.de").read_text(encoding="utf-8").splitlines()
    terms = line_terms(sources, refs)
    picked = [i for i, t in enumerate(terms) if t]
    result = {
        "command": "python -m bench.decoding.terminology " + " ".join(sys.argv[1:]),
        "run": str(args.run),
        "split": args.split,
        "protocol": "terms in source and reference (Dinu et al. 2019), 13a words of 4+ letters",
        "lines": len(sources),
        "lines_with_terms": len(picked),
        "terms": sum(len(terms[i]) for i in picked),
        "timing": "machine shared with other jobs (2 cores, other helpers' tests and training): "
        "wall times are noisy; medians of the repeats, the runs interleaved",
    }
    with tempfile.TemporaryDirectory(prefix="s2s-terms-") as tmp:
        where = Path(tmp)
        (where / "src.en").write_text("".join(sources[i] + "\n" for i in picked), encoding="utf-8")
        (where / "ref.de").write_text("".join(refs[i] + "\n" for i in picked), encoding="utf-8")
        (where / "terms.tsv").write_text(
            "".join("\t".join(terms[i]) + "\n" for i in picked), encoding="utf-8"
        )
        terms_file = ["--line-terms", str(where / "terms.tsv")]
        variants = {}
        for k in args.beams:
            variants[f"beam{k}"] = ["--beam", str(k)]
            variants[f"beam{k}_terms"] = ["--beam", str(k), *terms_file]
        seconds = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, options in variants.items():
                t0 = time.perf_counter()
                s2s("generate", args.run, "--input", where / "src.en",
                    "--output", where / f"{name}.de", "-q", *options)  # fmt: skip
                seconds[name].append(time.perf_counter() - t0)
                print(name, round(seconds[name][-1], 1), "s", flush=True)
        outputs = {
            name: (where / f"{name}.de").read_text(encoding="utf-8").splitlines()
            for name in variants
        }
        scores, compared = {}, {}
        for k in args.beams:
            pair = [f"beam{k}", f"beam{k}_terms"]
            hyps = [x for name in pair for x in ("--hyp", where / f"{name}.de")]
            scored = s2s("score", "own_translation", "--ref", where / "ref.de", *hyps, "--json")
            found = json.loads(scored.stdout)
            scores |= dict(zip(pair, found["systems"]))
            (comparison,) = found["comparisons"]
            compared[pair[1]] = {
                "against": pair[0],
                **{m: comparison["figures"][m] for m in ("bleu", "chrf")},
            }
            result["resampling"] = found.get("resampling")
    wanted = [(k, d) for k, i in enumerate(picked) for d in terms[i]]
    result["systems"] = {
        name: {
            "beam": int(options[1]),
            "terms": "--line-terms" in options,
            "bleu": scores[name]["bleu"],
            "chrf": scores[name]["chrf"],
            "terms_in_output": sum(d in words(outputs[name][k]) for k, d in wanted),
            "term_share": round(
                sum(d in words(outputs[name][k]) for k, d in wanted) / len(wanted), 4
            ),
            "seconds": [round(x, 2) for x in seconds[name]],
            "ms_per_line": round(1000 * statistics.median(seconds[name]) / len(picked), 1),
        }
        for name, options in variants.items()
    }
    result["terms_against_the_same_beam"] = compared
    result["speed_ratio_same_beam"] = {
        f"beam{k}_terms": round(
            statistics.median(seconds[f"beam{k}"]) / statistics.median(seconds[f"beam{k}_terms"]),
            3,
        )
        for k in args.beams
    }
    print(f"wrote {write(args.name, result)}")  # with the machine's facts
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
