"""An OPUS-MT-shaped model built here, imported by `s2s import`, decoded by both toolkits.

The model is `build_opus_mt`'s (tests/core/inference/opus_mt_fixture.py, which the import's tests
build theirs with): transformers' MarianMTModel with OPUS-MT's configuration and random weights,
and MarianTokenizer's files, sentencepiece models trained on Multi30k's training side.

`python -m bench.interop.opus_mt` imports it and decodes Multi30k's test_2016_flickr (1,000 sources)
with `s2s generate` and with transformers' `generate`, greedy and beam 4, in fp32, and writes
bench/interop/results/import_opus_mt.json: the lines whose outputs differ (the target is 0), the lines
whose ids differ from MarianTokenizer's (0), and each side's time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, machine, write
from tests.core.inference.opus_mt_fixture import (
    build_opus_mt,
    hf_generate,
    marian_ids,
    s2s_generate,
    s2s_ids,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000, help="test sources (1,000: all)")
    parser.add_argument("--name", default="import_opus_mt")
    args = parser.parse_args()
    src = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()
    test = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    test = test[: args.lines]
    with tempfile.TemporaryDirectory(prefix="s2s-opus-mt-") as tmp:
        folder = build_opus_mt(Path(tmp) / "opus-mt-en-de", src, tgt)
        run = Path(tmp) / "run"
        subprocess.run(
            [sys.executable, "-m", "s2s.core.apps.cli", "import", str(folder), "--output",
             str(run)], check=True, cwd=REPO,
        )  # fmt: skip
        input_file = Path(tmp) / "test.en"
        input_file.write_text("\n".join(test) + "\n", encoding="utf-8")
        ids_differ = sum(a != b for a, b in zip(marian_ids(folder, test), s2s_ids(run, test)))
        result = {"lines": len(test), "ids_differing": ids_differ, "decoding": {}}
        for beam in (1, 4):
            t0 = time.perf_counter()
            ours = s2s_generate(run, input_file, beam)
            t1 = time.perf_counter()
            theirs = hf_generate(folder, test, beam)
            t2 = time.perf_counter()
            differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
            result["decoding"][f"beam{beam}"] = {
                "outputs_differing": len(differ) + abs(len(ours) - len(theirs)),
                "first_differing": differ[:5],
                "s2s_generate_seconds": round(t1 - t0, 2),
                "transformers_generate_seconds": round(t2 - t1, 2),
            }
            print(beam, result["decoding"][f"beam{beam}"], flush=True)
    result["command"] = f"python -m bench.interop.opus_mt --lines {args.lines}"
    result["machine"] = machine()
    write(args.name, result)


if __name__ == "__main__":
    main()
