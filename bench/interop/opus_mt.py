"""An OPUS-MT-shaped model built here, imported by `s2s import`, decoded by both toolkits.

The model is `build_opus_mt`'s (tests/core/inference/opus_mt_fixture.py, which the import's tests
build theirs with): transformers' MarianMTModel with OPUS-MT's configuration and random weights,
and MarianTokenizer's files, sentencepiece models trained on Multi30k's training side.

`python -m bench.interop.opus_mt` imports it and decodes Multi30k's test_2016_flickr (1,000 sources)
with `s2s generate` and with transformers' `generate`, greedy and beam 4, in fp32, and writes
bench/interop/results/import_opus_mt.json: the lines whose outputs differ (the target is 0), the lines
whose ids differ from MarianTokenizer's (0), and each side's time. --encoder-layers and
--decoder-layers give the stacks depths of their own (OPUS-MT's distilled students are 6 + 2):

    python -m bench.interop.opus_mt --encoder-layers 6 --decoder-layers 2 --train-steps 200
        # import_opus_mt_6_2.json

--train-steps N trains the drawn model N Adam steps in transformers (32 Multi30k pairs a step,
teacher forcing, its own loss) before the import: a random 6 + 2 draw either ends its outputs at
once or runs them to the 512-token maximum (its </s> logit hardly depends on the prefix), which
makes every comparison trivial or very slow; a few steps give sentence-length outputs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, write
from tests.core.inference.opus_mt_fixture import (
    build_opus_mt,
    hf_generate,
    marian_ids,
    s2s_generate,
    s2s_ids,
)


def briefly_trained(folder: Path, src: list[str], tgt: list[str], steps: int) -> None:
    """The MarianMTModel in `folder` trained `steps` Adam steps (learning rate 1e-3, 32 random
    pairs a step, seed 1) with transformers' own loss, saved back in its place."""
    import random

    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tok = MarianTokenizer.from_pretrained(str(folder))
    model = MarianMTModel.from_pretrained(str(folder)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rng = random.Random(1)
    torch.manual_seed(1)
    for step in range(steps):
        pairs = rng.sample(range(len(src)), 32)
        batch = tok([src[i] for i in pairs], text_target=[tgt[i] for i in pairs],
                    return_tensors="pt", padding=True)  # fmt: skip
        batch["labels"][batch["labels"] == tok.pad_token_id] = -100
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    model.eval().save_pretrained(str(folder))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000, help="test sources (1,000: all)")
    parser.add_argument("--encoder-layers", type=int, default=2)
    parser.add_argument("--decoder-layers", type=int, help="default: --encoder-layers")
    parser.add_argument("--train-steps", type=int, default=0, help="see the module's doc")
    parser.add_argument("--name", help="default: import_opus_mt, import_opus_mt_E_D for E + D")
    args = parser.parse_args()
    enc, dec = args.encoder_layers, args.decoder_layers or args.encoder_layers
    name = args.name or (
        "import_opus_mt" if (enc, dec) == (2, 2) else f"import_opus_mt_{enc}_{dec}"
    )
    src = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()
    test = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    test = test[: args.lines]
    with tempfile.TemporaryDirectory(prefix="s2s-opus-mt-") as tmp:
        folder = build_opus_mt(
            Path(tmp) / "opus-mt-en-de", src, tgt, layers=enc, decoder_layers=dec
        )
        if args.train_steps:
            briefly_trained(folder, src, tgt, args.train_steps)
        run = Path(tmp) / "run"
        subprocess.run(
            [sys.executable, "-m", "s2s.core.apps.cli", "import", str(folder), "--output",
             str(run)], check=True, cwd=REPO,
        )  # fmt: skip
        input_file = Path(tmp) / "test.en"
        input_file.write_text("\n".join(test) + "\n", encoding="utf-8")
        ids_differ = sum(a != b for a, b in zip(marian_ids(folder, test), s2s_ids(run, test)))
        result = {
            "lines": len(test),
            "encoder_layers": enc,
            "decoder_layers": dec,
            "train_steps": args.train_steps,
            "ids_differing": ids_differ,
            "decoding": {},
        }
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
                "mean_output_words": round(sum(len(o.split()) for o in ours) / len(ours), 2),
                "s2s_generate_seconds": round(t1 - t0, 2),
                "transformers_generate_seconds": round(t2 - t1, 2),
            }
            print(beam, result["decoding"][f"beam{beam}"], flush=True)
    result["command"] = "python -m bench.interop.opus_mt " + " ".join(sys.argv[1:])
    write(name, result)


if __name__ == "__main__":
    main()
