"""Terminology by dynamic beam allocation, measured by the standard protocol, end to end.

    python -m bench.terminology --run runs/multi30k_en_de

The protocol of Dinu et al. (2019) and Post and Vilar (2018): a line's terms are those of a
term list whose source side is in the source and whose target side is in the reference. The
term list is bench.decoding.decode_beyond's (English and German words of Multi30k's training data that
align reliably, by Dice coefficient); a word is a 13a token of at least 4 letters. On the lines
of Multi30k test_2016_flickr (or `--split val`) that hold a term in both, `s2s generate` runs
without terms, and with `--line-terms` (each line's target terms) at the run's beam and at each
`--terms-beam` (8 by default: dynamic beam allocation shares the beam among its banks; Post and
Vilar's runs used beams of 10 and more), interleaved `--repeats` times. Figures on those lines:
sacreBLEU and chrF, paired by `s2s score` against the unconstrained output (bootstrap intervals,
approximate randomisation p), the share of terms in each output, and the wall time per line
(medians, as speed ratios to the unconstrained run). Writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, machine, s2s, write
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
    parser.add_argument(
        "--terms-beam",
        type=int,
        nargs="*",
        default=[8],
        help="beams of further variants with terms (the run's own beam is always measured)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="terminology")
    args = parser.parse_args()
    sources = (MULTI30K / f"{args.split}.en").read_text(encoding="utf-8").splitlines()
    refs = (MULTI30K / f"{args.split}.de").read_text(encoding="utf-8").splitlines()
    terms = line_terms(sources, refs)
    picked = [i for i, t in enumerate(terms) if t]
    result = {
        "command": "python -m bench.terminology " + " ".join(sys.argv[1:]),
        "run": str(args.run),
        "split": args.split,
        "protocol": "terms in source and reference (Dinu et al. 2019), 13a words of 4+ letters",
        "lines": len(sources),
        "lines_with_terms": len(picked),
        "terms": sum(len(terms[i]) for i in picked),
    }
    with tempfile.TemporaryDirectory(prefix="s2s-terms-") as tmp:
        where = Path(tmp)
        (where / "src.en").write_text("".join(sources[i] + "\n" for i in picked), encoding="utf-8")
        (where / "ref.de").write_text("".join(refs[i] + "\n" for i in picked), encoding="utf-8")
        (where / "terms.tsv").write_text(
            "".join("\t".join(terms[i]) + "\n" for i in picked), encoding="utf-8"
        )
        terms_file = ["--line-terms", str(where / "terms.tsv")]
        variants = {"unconstrained": [], "terms": terms_file}
        variants |= {f"terms_beam{k}": [*terms_file, "--beam", str(k)] for k in args.terms_beam}
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
        hyps = [x for name in variants for x in ("--hyp", where / f"{name}.de")]
        scored = s2s("score", "own_translation", "--ref", where / "ref.de", *hyps, "--json")
        scores = json.loads(scored.stdout)
    wanted = [(k, d) for k, i in enumerate(picked) for d in terms[i]]
    result["systems"] = {
        name: {
            "bleu": system["bleu"],
            "chrf": system["chrf"],
            "terms_in_output": sum(d in words(outputs[name][k]) for k, d in wanted),
            "seconds": [round(x, 2) for x in seconds[name]],
            "ms_per_line": round(1000 * statistics.median(seconds[name]) / len(picked), 1),
        }
        for name, system in zip(variants, scores["systems"])
    }
    for system in result["systems"].values():
        system["term_share"] = round(system["terms_in_output"] / len(wanted), 4)
    names = {str(where / f"{name}.de"): name for name in variants}
    result["against_unconstrained"] = {
        names[c["b"]]: {k: c["figures"][k] for k in ("bleu", "chrf")}
        for c in scores["comparisons"]
        if names[c["a"]] == "unconstrained"
    }
    plain = statistics.median(seconds["unconstrained"])
    result["speed_ratio"] = {
        name: round(plain / statistics.median(seconds[name]), 3) for name in variants
    }
    result["targets"] = "BLEU >= unconstrained + 1.0, every term present, speed >= 0.5x"
    result["resampling"] = scores.get("resampling")
    result["machine"] = machine()
    write(args.name, result)
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
