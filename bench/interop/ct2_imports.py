"""Imports exported to CTranslate2: an OPUS-MT, a fairseq and an NLLB import, each decoded by
`s2s generate` and by CTranslate2 over its `s2s export --to ctranslate2`.

The three models are built here with random weights at small sizes, by the builders the tests
use (tests/core/inference/): OPUS-MT's with `build_opus_mt` (opus_mt_fixture.py, MarianMTModel,
d_model 32, 2 + 2 layers, sentencepiece models of 400 pieces trained on 2,000 lines of
Multi30k's EN and DE training sides), NLLB's with `build_m2m100` (m2m100_fixture.py,
M2M100ForConditionalGeneration, d_model 64, 2 + 2 layers, a sentencepiece model of 1,000 pieces
trained on EN, DE and FR), fairseq's with `build_fairseq` (fairseq_fixture.py: the layout of
fairseq's hub archives: model.pt, a joined dict.en.txt / dict.de.txt, Moses tokenisation and 400
BPE merges learnt with subword-nmt on 2,000 EN and DE training lines; d_model 32, 2 + 2 layers).
Weights are drawn wider than the toolkits' init so that the models' choices are not near-ties
that float rounding decides, and </s> is favoured so that most outputs end before the length
limit.

`python -m bench.interop.ct2_imports` imports each (`s2s import`), exports it (`s2s export --to
ctranslate2`), and decodes Multi30k's 1,000 test_2016_flickr sources (EN->DE; the NLLB import
also DE->FR with --src-lang / --tgt-lang, one export for both directions) in fp32: `s2s generate
--beam 1` against CTranslate2's greedy search through `s2s.core.inference.deployed` (the lines
that differ: the target is 0), and `s2s generate --beam 4` against CTranslate2's beam 4 (BLEU
of each against the references and their difference, the target within 0.1; BLEU of
CTranslate2's lines against s2s's and the lines that differ; and the same against `s2s generate
--beam 4 decode.stop=beam`, CTranslate2's own stopping rule), each one's seconds. The weights
are random: BLEU against the references is near 0 and says only that both decode alike (and
BLEU is 0 over outputs shorter than 4 words, equal or not: the lines that differ are the
figure that counts). Writes
bench/interop/results/ct2_imports.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, write

THREADS = 1  # CTranslate2's and s2s's: one core each, the same for both


def s2s(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *map(str, args)],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip


def generate(run: Path, source: Path, beam: int, langs: list[str], *more: str) -> list[str]:
    """`s2s generate RUN --input FILE --beam B [--src-lang S --tgt-lang T] [key=value ...]` in
    fp32, one thread."""
    return s2s(
        "generate", run, "--input", source, "--beam", beam, *langs, "decode.precision=fp32",
        "run.device=cpu", f"run.threads={THREADS}", *more,
    ).stdout.splitlines()  # fmt: skip


def ct2_lines(export: Path, run: Path, lines: list[str], beam: int, langs: dict) -> list[str]:
    """CTranslate2's lines for `lines`, decoded over `export` as `s2s generate --beam B` would
    (`deployed.decode_ctranslate2`), in the direction `langs` names (or the run's own)."""
    import ctranslate2

    from s2s.core.inference import load_run
    from s2s.core.inference.deployed import decode_ctranslate2, languages

    loaded = load_run(run, [f"decode.beam={beam}", "run.device=cpu", "decode.precision=fp32"])
    decoder = loaded.decoder
    translator = ctranslate2.Translator(str(export), intra_threads=THREADS)
    ids = decode_ctranslate2(translator, decoder, lines, **langs)
    task = decoder.task
    with languages(task, **langs):
        return [task.postprocess(task.decode_target(h), s) for h, s in zip(ids, lines)]


def bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000, help="test sources (1,000: all)")
    args = parser.parse_args()
    read = lambda name: (MULTI30K / name).read_text(encoding="utf-8").splitlines()  # noqa: E731
    train = {lang: read(f"train.{lang}") for lang in ("en", "de", "fr")}
    test = {lang: read(f"test_2016_flickr.{lang}")[: args.lines] for lang in ("en", "de", "fr")}
    result = {
        "command": f"python -m bench.interop.ct2_imports --lines {args.lines}",
        "lines": args.lines,
        "precision": "fp32",
        "threads": THREADS,
        "note": "random weights: BLEU against the references is near 0 and says only that "
        "CTranslate2 and s2s decode alike, not that either translates; BLEU is 0 over outputs "
        "shorter than 4 words, equal or not: the lines differing are the figures that count",
        "complete": False,
        "imports": {},
    }
    with tempfile.TemporaryDirectory(prefix="s2s-ct2-imports-") as tmp:
        tmp = Path(tmp)
        from tests.core.inference.fairseq_fixture import build_fairseq
        from tests.core.inference.m2m100_fixture import build_m2m100
        from tests.core.inference.opus_mt_fixture import build_opus_mt

        t0 = time.perf_counter()
        folders = {
            "opus_mt": build_opus_mt(
                tmp / "opus-mt",
                train["en"][:2000],
                train["de"][:2000],
                vocab_size=400,
                d_model=32,
                eos_bias=4.0,
            ),
            "fairseq": build_fairseq(
                tmp / "fairseq",
                train["en"][:2000],
                train["de"][:2000],
                merges=400,
                d_model=32,
                eos_scale=4.0,
            ),
            "nllb": build_m2m100(
                tmp / "nllb", train["en"] + train["de"] + train["fr"], "nllb", eos_scale=4.0
            ),
        }
        result["build_seconds"] = round(time.perf_counter() - t0, 1)
        cases = [  # (import, direction, the run's languages, what decodes that direction)
            ("opus_mt", "en-de", [], {}),
            ("fairseq", "en-de", [], {}),
            ("nllb", "en-de", [], {}),
            ("nllb", "de-fr", ["--src-lang", "deu_Latn", "--tgt-lang", "fra_Latn"],
             {"src_lang": "deu_Latn", "tgt_lang": "fra_Latn"}),
        ]  # fmt: skip
        for name, folder in folders.items():
            langs = ["--src-lang", "eng_Latn", "--tgt-lang", "deu_Latn"] if name == "nllb" else []
            t0 = time.perf_counter()
            s2s("import", folder, "--output", tmp / f"run_{name}", *langs)
            t1 = time.perf_counter()
            s2s(
                "export",
                tmp / f"run_{name}",
                "--to",
                "ctranslate2",
                "--output",
                tmp / f"ct2_{name}",
            )
            result["imports"][name] = {
                "import_seconds": round(t1 - t0, 2),
                "export_seconds": round(time.perf_counter() - t1, 2),
            }
        for name, direction, cli_langs, langs in cases:
            run, export = tmp / f"run_{name}", tmp / f"ct2_{name}"
            src, tgt = direction.split("-")
            source = tmp / f"test.{src}"
            source.write_text("\n".join(test[src]) + "\n", encoding="utf-8")
            refs, entry = test[tgt], {}
            outputs = {}
            for beam in (1, 4):
                t0 = time.perf_counter()
                ours = generate(run, source, beam, cli_langs)
                t1 = time.perf_counter()
                theirs = ct2_lines(export, run, test[src], beam, langs)
                t2 = time.perf_counter()
                outputs[beam] = ours, theirs
                entry[f"s2s_beam{beam}_seconds"] = round(t1 - t0, 2)
                entry[f"ct2_beam{beam}_seconds"] = round(t2 - t1, 2)
            (g_ours, g_theirs), (b_ours, b_theirs) = outputs[1], outputs[4]
            differ = [i for i, (a, b) in enumerate(zip(g_ours, g_theirs)) if a != b]
            entry["greedy_lines_differing"] = len(differ) + abs(len(g_ours) - len(g_theirs))
            entry["greedy_first_differing"] = differ[:5]
            entry["mean_greedy_output_words"] = round(
                sum(len(o.split()) for o in g_ours) / max(1, len(g_ours)), 2
            )
            entry["beam4_bleu_s2s"] = bleu(b_ours, refs)
            entry["beam4_bleu_ct2"] = bleu(b_theirs, refs)
            entry["beam4_bleu_difference"] = round(
                entry["beam4_bleu_ct2"] - entry["beam4_bleu_s2s"], 2
            )
            entry["beam4_bleu_ct2_against_s2s"] = bleu(b_theirs, b_ours)
            entry["beam4_lines_differing"] = sum(a != b for a, b in zip(b_ours, b_theirs))
            # CTranslate2's stopping rule (a sentence ends once `beam` hypotheses have): what is
            # left is the length penalty and the forced code's score
            t0 = time.perf_counter()
            alike = generate(run, source, 4, cli_langs, "decode.stop=beam")
            entry["s2s_beam4_stop_beam_seconds"] = round(time.perf_counter() - t0, 2)
            entry["beam4_stop_beam_bleu_s2s"] = bleu(alike, refs)
            entry["beam4_bleu_ct2_against_s2s_stop_beam"] = bleu(b_theirs, alike)
            entry["beam4_stop_beam_lines_differing"] = sum(a != b for a, b in zip(alike, b_theirs))
            result["imports"][name][direction] = entry
            print(name, direction, entry, flush=True)
            write("ct2_imports", result)
    result["complete"] = True
    print(f"wrote {write('ct2_imports', result)}")


if __name__ == "__main__":
    main()
