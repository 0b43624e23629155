"""Decoding beyond the single best, measured on a trained translation run (issue 40, c d e).

    python -m bench.decoding.decode_beyond --run runs/ensembles/multi30k_en_de/seed1

Every figure is `s2s generate` from the shell on the run's test split (Multi30k test_2016_flickr,
1,000 sentences), scored with sacreBLEU:

(c) Terminology (`--split val` to tune on). A term list derived from the training data: English and German words of at
    least 4 letters (tokens of the 13a tokeniser, case kept: German nouns are capitalised) that occur in at least 20 training
    pairs and align reliably, Dice coefficient 2|both| / (|en| + |de|) of their sentence sets at
    least 0.7, each English word its best German word only. Applied to the test sentences whose
    source holds a source term (`--terms`): the share of those sentences' target terms that appear
    in the output as words, and as text (the term's tokens, perhaps followed by more of a longer
    word: "Zauns" for "Zaun"; target: 100%), and sacreBLEU on those sentences with and without the terms
    (target: not below the unconstrained output's minus 0.5).
(d) n-best. `--beam 8 --nbest 8`: the oracle BLEU of the list (each sentence's hypothesis with the
    best sentence BLEU against its reference, then corpus BLEU), against the first hypothesis's;
    what reranking could reach.
(e) Sampling. `--sampling --nbest 4` against beam 4, the same threads, interleaved, medians of
    `--repeats`: sentences/s (input sentences; four outputs each when sampling), and how varied
    the samples are: pairwise BLEU (each sample against each other sample of its sentence as the
    reference, corpus BLEU averaged over the 12 ordered pairs; 100 = all alike).
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from bench.common import MULTI30K, results_of, write


def s2s(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *argv],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


def timed_generate(run: str, src: Path, out: Path, threads: int, *options: str) -> float:
    start = time.perf_counter()
    s2s(
        "generate",
        run,
        "--input",
        str(src),
        "--output",
        str(out),
        "-q",
        f"run.threads={threads}",
        *options,
    )
    return time.perf_counter() - start


TOKENIZE = Tokenizer13a()


def words(line: str) -> set[str]:
    tokens = TOKENIZE(line).split()
    return {t for t in tokens if len(t) >= 4 and t.isalpha()}


def term_list(min_pairs: int = 20, min_dice: float = 0.7) -> list[tuple[str, str, float]]:
    """(English word, German word, Dice) pairs that align reliably in Multi30k's training data."""
    en = [words(x) for x in (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()]
    de = [words(x) for x in (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()]
    count_en, count_de, both = Counter(), Counter(), Counter()
    for e, d in zip(en, de):
        count_en.update(e)
        count_de.update(d)
        both.update(itertools.product(e, d))
    best: dict[str, tuple[str, float]] = {}
    for (e, d), n in both.items():
        if n < min_pairs:
            continue
        dice = 2 * n / (count_en[e] + count_de[d])
        if dice >= min_dice and dice > best.get(e, ("", 0.0))[1]:
            best[e] = (d, dice)
    return sorted((e, d, round(x, 3)) for e, (d, x) in best.items())


def bleu(hyps: list[str], refs: list[str]) -> float:
    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default="runs/decode_beyond")
    p.add_argument("--name", default="decode_beyond_multi30k")
    p.add_argument(
        "--split",
        default="test_2016_flickr",
        help="val to tune on (the term bonus), test to report",
    )
    p.add_argument(
        "--parts",
        nargs="+",
        default=["terms", "nbest", "sampling"],
        choices=["terms", "nbest", "sampling"],
        help="what to measure; the others keep their figures in the result file",
    )
    args = p.parse_args()
    where = Path(args.dir)
    where.mkdir(parents=True, exist_ok=True)
    src_lines = (MULTI30K / f"{args.split}.en").read_text(encoding="utf-8").splitlines()
    refs = (MULTI30K / f"{args.split}.de").read_text(encoding="utf-8").splitlines()
    src = where / "test.en"
    src.write_text("".join(s + "\n" for s in src_lines), encoding="utf-8")
    plain_out = where / "plain.de"
    timed_generate(args.run, src, plain_out, args.threads)
    plain = plain_out.read_text(encoding="utf-8").splitlines()
    result = {
        "run": args.run,
        "split": args.split,
        "sentences": len(src_lines),
        "bleu_plain": bleu(plain, refs),
    }
    previous = results_of(__file__) / f"{args.name}.json"
    if previous.is_file():  # the parts not measured now keep their figures
        kept = json.loads(previous.read_text(encoding="utf-8"))
        kept.pop("machine", None)
        result = {**kept, **result}
    if "terms" in args.parts:
        result["terminology"] = terminology(args, where, src_lines, refs, plain)
    if "nbest" in args.parts:
        result["nbest"] = oracle(args, where, src, refs)
    if "sampling" in args.parts:
        result["sampling"] = sampling(args, where, src, src_lines, refs)
    result["command"] = "python -m bench.decoding.decode_beyond " + " ".join(sys.argv[1:])
    write(args.name, result)


def terminology(args, where: Path, src_lines: list[str], refs: list[str], plain: list[str]) -> dict:
    """(c): the term list, the sentences that hold terms, what appears, BLEU with and without."""
    terms = term_list()
    (where / "terms.tsv").write_text("".join(f"{e}\t{d}\n" for e, d, _ in terms), encoding="utf-8")
    held = [[(e, d) for e, d, _ in terms if e in words(s)] for s in src_lines]
    picked = [i for i, t in enumerate(held) if t]
    sub_src = where / "terms_test.en"
    sub_src.write_text("".join(src_lines[i] + "\n" for i in picked), encoding="utf-8")
    termed_out = where / "terms.de"
    timed_generate(args.run, sub_src, termed_out, args.threads, "--terms", str(where / "terms.tsv"))
    termed = termed_out.read_text(encoding="utf-8").splitlines()
    wanted = [(d, termed[k]) for k, i in enumerate(picked) for _, d in held[i]]
    placed = sum(d in words(out) for d, out in wanted)
    as_text = sum(d in out for d, out in wanted)  # the term's tokens, perhaps inside a longer word
    already = sum(d in words(plain[i]) for i in picked for _, d in held[i])
    sub_refs, sub_plain = [refs[i] for i in picked], [plain[i] for i in picked]
    found = {
        "terms": len(terms),
        "term_examples": terms[:12],
        "sentences_with_terms": len(picked),
        "target_terms": len(wanted),
        "target_terms_in_unconstrained_output": already,
        "target_terms_in_output": placed,
        "share_in_output": round(placed / len(wanted), 4),
        "target_terms_in_output_as_text": as_text,
        "share_as_text": round(as_text / len(wanted), 4),
        "bleu_unconstrained": bleu(sub_plain, sub_refs),
        "bleu_with_terms": bleu(termed, sub_refs),
        "target": "100% of target terms; BLEU >= unconstrained - 0.5",
    }
    found["bleu_difference"] = round(found["bleu_with_terms"] - found["bleu_unconstrained"], 2)
    found["missing"] = [
        {"line": picked[k] + 1, "term": d, "output": termed[k]}
        for k, i in enumerate(picked)
        for _, d in held[i]
        if d not in words(termed[k])
    ][:20]
    print(json.dumps(found, indent=1, ensure_ascii=False), flush=True)
    return found


def oracle(args, where: Path, src: Path, refs: list[str]) -> dict:
    """(d): the oracle BLEU of the 8-best list against its first hypothesis's."""
    nbest_out = where / "nbest8.jsonl"
    timed_generate(args.run, src, nbest_out, args.threads, "--beam", "8", "--nbest", "8")
    lists = [
        [o["output"] for o in json.loads(x)["outputs"]]
        for x in nbest_out.read_text(encoding="utf-8").splitlines()
    ]
    oracle = [
        max(outs, key=lambda h: sacrebleu.sentence_bleu(h, [ref]).score)
        for outs, ref in zip(lists, refs)
    ]
    found = {
        "beam": 8,
        "n": 8,
        "bleu_first": bleu([outs[0] for outs in lists], refs),
        "bleu_oracle": bleu(oracle, refs),
        "mean_list_length": round(statistics.mean(map(len, lists)), 2),
    }
    print(json.dumps(found, indent=1), flush=True)
    return found


def sampling(args, where: Path, src: Path, src_lines: list[str], refs: list[str]) -> dict:
    """(e): sampling 4 a sentence against beam 4, interleaved: speed and variety."""
    times = {"beam4": [], "sampling4": []}
    for r in range(args.repeats):
        times["beam4"].append(timed_generate(args.run, src, where / "beam4.de", args.threads))
        times["sampling4"].append(
            timed_generate(
                args.run,
                src,
                where / "samples.jsonl",
                args.threads,
                "--sampling",
                "--nbest",
                "4",
                "--seed",
                str(r),
            )
        )
    samples = [
        [o["output"] for o in json.loads(x)["outputs"]]
        for x in (where / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    pairwise = statistics.mean(
        sacrebleu.corpus_bleu([s[i] for s in samples], [[s[j] for s in samples]]).score
        for i, j in itertools.permutations(range(4), 2)
    )
    rate = {k: round(len(src_lines) / statistics.median(v), 2) for k, v in times.items()}
    found = {
        "seconds": {k: [round(x, 1) for x in v] for k, v in times.items()},
        "sentences_per_s": rate,
        "sampling_vs_beam4": round(rate["sampling4"] / rate["beam4"], 3),
        "outputs_per_s_sampling": round(4 * rate["sampling4"], 2),
        "pairwise_bleu_among_4_samples": round(pairwise, 2),
        "bleu_first_sample": bleu([s[0] for s in samples], refs),
        "note": "process wall time: start, load, tokenise, search, write; same threads",
    }
    print(json.dumps(found, indent=1), flush=True)
    return found


if __name__ == "__main__":
    main()
