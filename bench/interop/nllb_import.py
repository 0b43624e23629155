"""An NLLB-shaped and an M2M100-shaped model built here, imported by `s2s import`, decoded by both
toolkits.

The models are `build_m2m100`'s (tests/core/inference/m2m100_fixture.py, which the import's
tests build theirs with): transformers' M2M100ForConditionalGeneration (NLLB's layout with its
202 language codes, M2M100's with its 100) at d_model 64, 2 + 2 layers, with random weights
drawn wide (std 0.1), and the tokenizer's files: a sentencepiece BPE model of 1,000 pieces
trained on Multi30k's English, German and French training sides. Random weights alone decode
one token over and over, so the models are then trained a few hundred updates (`UPDATES`) on
Multi30k's pairs in both directions and their outputs are sentences (about 11 words).

`python -m bench.interop.nllb_import` imports both and decodes Multi30k's test_2016_flickr
(1,000 sources) in two directions (English to German, German to French) with `s2s generate
--src-lang --tgt-lang` and with transformers' `generate(forced_bos_token_id=...)`, greedy and
beam 4, in fp32 (transformers' in batches of sources of one token length: no padding), and
writes bench/interop/results/nllb_import.json: the lines whose outputs differ (the target is
0), the lines whose ids differ from NllbTokenizer's / M2M100Tokenizer's (0), and each side's
time.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, machine, write
from tests.core.inference.m2m100_fixture import (
    build_m2m100,
    hf_generate,
    hf_ids,
    s2s_generate,
    s2s_ids,
)

#: the languages of each layout's codes used here (NLLB's FLORES-200 codes, M2M100's ISO ones)
CODES = {
    "nllb": {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn"},
    "m2m100": {"en": "en", "de": "de", "fr": "fr"},
}
DIRECTIONS = (("en", "de"), ("de", "fr"))
UPDATES = 300  # training updates of the models built here (`build_m2m100`'s pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000, help="test sources (1,000: all)")
    args = parser.parse_args()
    import torch

    # one thread for transformers' side (training the models, generate) as `s2s generate` is
    # given (run.threads=1): on a shared machine two threads ran 3x slower, and it is fair
    torch.set_num_threads(1)
    text = {
        lang: (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        for lang in ("en", "de", "fr")
    }
    train = text["en"] + text["de"] + text["fr"]
    test = {
        lang: (MULTI30K / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()
        for lang in ("en", "de")
    }
    test = {lang: lines[: args.lines] for lang, lines in test.items()}
    result = {
        "command": f"python -m bench.interop.nllb_import --lines {args.lines}",
        "precision": "fp32",
        "threads": 1,  # torch threads of each side
        "machine": machine(),
        "lines": args.lines,
        "complete": False,  # written after every decoding: a long run's figures so far
        "weights": f"drawn at random (std 0.1), then {UPDATES} Adam updates on Multi30k's "
        "en-de and de-fr training pairs (batches of 32), so that outputs are sentences",
        "transformers_batches": "sources of one token length each (no padding): its output "
        "for a line can change with the padding of its batch; s2s generate decodes the file "
        "as it is",
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="s2s-nllb-") as tmp:
        for layout, codes in CODES.items():
            pairs = {(codes[a], codes[b]): (text[a], text[b]) for a, b in DIRECTIONS}
            folder = build_m2m100(Path(tmp) / layout, train, layout, pairs=pairs, updates=UPDATES)
            run = Path(tmp) / f"run_{layout}"
            first, second = DIRECTIONS[0]
            subprocess.run(
                [sys.executable, "-m", "s2s.core.apps.cli", "import", str(folder), "--output",
                 str(run), "--src-lang", codes[first], "--tgt-lang", codes[second]],
                check=True, cwd=REPO,
            )  # fmt: skip
            rows = json.loads((folder / "config.json").read_text())["vocab_size"]
            entry = {"ids_differing": {}, "decoding": {}}
            entry["shape"] = {"vocab_rows": rows, "d_model": 64, "layers": "2 + 2"}
            for src, tgt in DIRECTIONS:
                lines, s, t = test[src], codes[src], codes[tgt]
                pairs = zip(hf_ids(folder, lines, s), s2s_ids(run, lines, s))
                entry["ids_differing"][src] = sum(a != b for a, b in pairs)
                source = Path(tmp) / f"test.{src}"
                source.write_text("\n".join(lines) + "\n", encoding="utf-8")
                for beam in (1, 4):
                    t0 = time.perf_counter()
                    ours = s2s_generate(run, source, s, t, beam)
                    t1 = time.perf_counter()
                    theirs = hf_generate(folder, lines, s, t, beam)
                    t2 = time.perf_counter()
                    if layout == "m2m100":  # M2M100Tokenizer's decode keeps the codes' text
                        theirs = [re.sub(r"__[a-z]+__", "", h).strip() for h in theirs]
                    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
                    entry["decoding"][f"{src}-{tgt} beam{beam}"] = {
                        "outputs_differing": len(differ) + abs(len(ours) - len(theirs)),
                        "first_differing": differ[:5],
                        "mean_output_words": round(
                            sum(len(o.split()) for o in ours) / len(ours), 2
                        ),
                        "s2s_generate_seconds": round(t1 - t0, 2),
                        "transformers_generate_seconds": round(t2 - t1, 2),
                    }
                    print(layout, src, tgt, beam, entry["decoding"][f"{src}-{tgt} beam{beam}"],
                          flush=True)  # fmt: skip
                    result["models"][layout] = entry
                    write("nllb_import", result)

    result["complete"] = True
    print(f"wrote {write('nllb_import', result)}")


if __name__ == "__main__":
    main()
