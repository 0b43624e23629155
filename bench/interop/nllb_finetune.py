"""Fine-tuning an NLLB-shaped import on one direction: does it learn that direction and keep the
others?

    python -m bench.interop.nllb_finetune [--updates 300] [--lr-scale 0.5] [--name NAME]

Builds the NLLB-shaped model `bench.interop.nllb_import` builds (`build_m2m100`, in
tests/core/inference/m2m100_fixture.py: transformers' M2M100ForConditionalGeneration at a small
size, sentencepiece on Multi30k's EN/DE/FR, a few hundred updates on en-de and de-fr pairs),
imports it (`s2s import --src-lang eng_Latn
--tgt-lang deu_Latn`), and fine-tunes the import on Multi30k EN->DE with `s2s train
finetune_translation run.init_from=IMPORT` for --updates updates (fp32, one thread). Writes
bench/interop/results/nllb_finetune.json: the dev loss (val, 1,014 pairs) of the import and of
the fine-tune, EN->DE test_2016_flickr BLEU (greedy) before and after, and the other direction
the fine-tune never saw, DE->FR (`--src-lang deu_Latn --tgt-lang fra_Latn`): its BLEU before and
after, its empty outputs, and the share of its output words that are French (in Multi30k's
French training side and not in its German one): whether the outputs stay decodable and in the
language the code asks for.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, write
from bench.interop.nllb_import import CODES, DIRECTIONS, UPDATES
from tests.core.inference.m2m100_fixture import build_m2m100

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
CODE = CODES["nllb"]


def s2s(*argv) -> subprocess.CompletedProcess:
    """`s2s ARGV` from the shell, its output captured; a failure shows its error."""
    done = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *map(str, argv)],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    if done.returncode:
        sys.exit(f"s2s {' '.join(map(str, argv))} failed:\n{done.stderr[-2000:]}")
    return done


def valid_loss(run: Path) -> float:
    """The last dev loss metrics.jsonl records."""
    lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(x) for x in lines if '"kind": "valid"' in x][-1]["loss"]


def translate(run: Path, src: str, tgt: str, out: Path) -> dict:
    """Greedy outputs of Multi30k's test_2016_flickr in direction src -> tgt (two-letter
    names), their BLEU against its references, the empty ones and the share of French words."""
    s2s("generate", run, "--input", MULTI30K / f"test_2016_flickr.{src}", "--output", out,
        "--src-lang", CODE[src], "--tgt-lang", CODE[tgt], "decode.beam=1",
        "decode.precision=fp32", "run.device=cpu", "run.threads=1")  # fmt: skip
    scored = s2s("score", "own_translation", f"task.tgt_lang={tgt}", "--ref",
                 MULTI30K / f"test_2016_flickr.{tgt}", "--hyp", out, "--json")  # fmt: skip
    outputs = out.read_text(encoding="utf-8").splitlines()
    words = [w for line in outputs for w in line.lower().split()]
    return {
        "bleu": round(json.loads(scored.stdout)["bleu"], 2),
        "empty_outputs": sum(not line.strip() for line in outputs),
        "french_word_share": round(sum(w in FRENCH for w in words) / max(1, len(words)), 3),
        "first_output": outputs[0] if outputs else "",
    }


def vocabulary(lang: str) -> set[str]:
    """The lower-cased words of Multi30k's training side in `lang`."""
    text = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").lower()
    return set(text.split())


FRENCH: set[str] = set()  # French training words that are not German ones (main sets it)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300, help="fine-tuning updates (300)")
    parser.add_argument("--lr-scale", type=float, default=0.5, help="optim.lr_scale (0.5)")
    parser.add_argument("--name", default="nllb_finetune", help="the results file's name")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # building the model, as bench.interop.nllb_import builds it
    FRENCH.update(vocabulary("fr") - vocabulary("de"))
    text = {
        lang: (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        for lang in ("en", "de", "fr")
    }
    result = {
        "command": f"python -m bench.interop.nllb_finetune --updates {args.updates} "
        f"--lr-scale {args.lr_scale} --name {args.name}",
        "model": f"NLLB-shaped, d_model 64, 2 + 2 layers, built and trained {UPDATES} updates "
        "on en-de and de-fr as bench.interop.nllb_import builds it",
        "finetune": f"s2s train finetune_translation run.init_from=IMPORT on Multi30k EN->DE, "
        f"{args.updates} updates, warm-up 100, lr_scale {args.lr_scale}, fp32",
        "precision": "fp32",
    }
    with tempfile.TemporaryDirectory(prefix="s2s-nllb-ft-") as tmp:
        tmp = Path(tmp)
        pairs = {(CODE[a], CODE[b]): (text[a], text[b]) for a, b in DIRECTIONS}
        train = text["en"] + text["de"] + text["fr"]
        folder = build_m2m100(tmp / "nllb", train, "nllb", pairs=pairs, updates=UPDATES)
        imported = tmp / "import"
        s2s("import", folder, "--output", imported, "--src-lang", CODE["en"], "--tgt-lang",
            CODE["de"])  # fmt: skip
        data = tmp / "data"
        data.mkdir()
        for split, name in SPLITS.items():
            for lang in ("en", "de"):
                shutil.copy(MULTI30K / f"{name}.{lang}", data / f"{split}.{lang}")
        common = [f"run.init_from={imported}", f"task.data_dir={data}", "run.precision=fp32",
                  "run.threads=1", "run.valid_max_sentences=0", "run.max_minutes=0",
                  f"data.cache_dir={tmp / 'cache'}", "-q"]  # fmt: skip
        # the import's dev loss: one update at a learning rate too small to move a weight
        s2s("train", "finetune_translation", *common, f"run.dir={tmp / 'ft0'}",
            "optim.max_updates=1", "optim.lr_scale=1e-12", "run.valid_interval=1")  # fmt: skip
        tuned = tmp / "ft"
        t0 = time.perf_counter()
        s2s("train", "finetune_translation", *common, f"run.dir={tuned}",
            f"optim.max_updates={args.updates}", "optim.warmup=100",
            f"optim.lr_scale={args.lr_scale}", f"run.valid_interval={args.updates}",
            f"run.save_interval={args.updates}")  # fmt: skip
        result["finetune_seconds"] = round(time.perf_counter() - t0, 1)
        result["dev_loss"] = {"import": valid_loss(tmp / "ft0"), "fine_tuned": valid_loss(tuned)}
        for name, run in (("import", imported), ("fine_tuned", tuned)):
            result[name] = {
                f"{a}-{b}": translate(run, a, b, tmp / f"{name}.{a}-{b}.txt")
                for a, b in (("en", "de"), ("de", "fr"))
            }
        same = (tuned / "pieces.tgt.json").read_bytes() == (
            imported / "pieces.tgt.json"
        ).read_bytes()
        result["languages_kept"] = same  # the fine-tune's vocabulary and codes are the import's
    print(json.dumps(result, indent=1))
    print(f"wrote {write(args.name, result)}")


if __name__ == "__main__":
    main()
