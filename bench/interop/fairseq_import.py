"""A fairseq Transformer trained here for a few hundred updates, imported by `s2s import`, decoded
by both toolkits, then fine-tuned in s2s.

    python -m bench.interop.fairseq_import --fairseq-bin /work/venvs/fairseq/bin

fairseq is not a dependency of s2s: build fairseq-fixed 0.12.3.1 into a separate environment as
bench/interop/fairseq_parsing.py says, with sacremoses and subword-nmt beside it, and point
--fairseq-bin at its bin directory. Steps, all on Multi30k EN-DE (train, val, test_2016_flickr):
the text Moses-tokenised (sacremoses: dashes split, characters escaped, as fairseq's `--tokenizer
moses`), BPE codes learnt jointly with subword-nmt and applied; `fairseq-preprocess
--joined-dictionary`; `fairseq-train --arch transformer --share-all-embeddings` at a small size
for --updates updates; the checkpoint, its dictionaries and bpecodes in one folder, as
fairseq's hub archives hold them. Then `fairseq-interactive --tokenizer moses --bpe subword_nmt`
(beam 5, lenpen 1) and `s2s generate` of the import read the raw test sources, and their lines,
their sacreBLEU and the lines that differ are compared. Last, `s2s train finetune_translation
run.init_from=IMPORT` on Multi30k for --finetune-updates updates: the dev loss before and after,
and the test BLEU of both against each other (`s2s score --hyp A --hyp B`, a paired test).
Writes bench/interop/results/import_fairseq.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, machine, write

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def run(cmd, **kw) -> subprocess.CompletedProcess:
    print("$", " ".join(map(str, cmd))[:300], flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, capture_output=True, text=True, **kw)


def s2s(*args) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "s2s.core.apps.cli", *args], cwd=REPO)


def prepare_text(tmp: Path, merges: int) -> Path:
    """Moses-tokenised, BPE'd Multi30k (train/valid/test .en/.de) and the codes, in tmp/bpe."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    out = tmp / "bpe"
    out.mkdir()
    tokenised = {}
    for split, name in SPLITS.items():
        for lang in ("en", "de"):
            tok = MosesTokenizer(lang)
            lines = (MULTI30K / f"{name}.{lang}").read_text(encoding="utf-8").splitlines()
            tokenised[split, lang] = [
                tok.tokenize(x, aggressive_dash_splits=True, return_str=True, escape=True)
                for x in lines
            ]
    joint = tokenised["train", "en"] + tokenised["train", "de"]
    with open(out / "bpecodes", "w", encoding="utf-8") as codes:
        learn_bpe(joint, codes, merges)
    with open(out / "bpecodes", encoding="utf-8") as codes:
        bpe = BPE(codes, separator="@@")
    for (split, lang), lines in tokenised.items():
        text = "\n".join(bpe.process_line(x) for x in lines) + "\n"
        (out / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return out


def interactive(bin_dir: Path, folder: Path, data: Path, source: Path, beam: int) -> list[str]:
    """fairseq-interactive's detokenised hypotheses (D- lines), in input order."""
    done = run(
        [bin_dir / "fairseq-interactive", data, "--path", folder / "model.pt",
         "--source-lang", "en", "--target-lang", "de", "--tokenizer", "moses", "--bpe",
         "subword_nmt", "--bpe-codes", folder / "bpecodes", "--beam", beam, "--lenpen", 1.0,
         "--buffer-size", 100, "--batch-size", 50, "--cpu", "--input", source],
        env={**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},  # fairseq's own pickles
    )  # fmt: skip
    found = {}
    for line in done.stdout.splitlines():
        m = re.match(r"^D-(\d+)\t[^\t]*\t?(.*)$", line)
        if m:
            found[int(m.group(1))] = m.group(2)
    return [found[i] for i in range(len(found))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fairseq-bin", required=True, type=Path)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--finetune-updates", type=int, default=500)
    parser.add_argument("--merges", type=int, default=6000)
    parser.add_argument("--name", default="import_fairseq")
    parser.add_argument("--keep", type=Path, help="keep the work folder here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="s2s-fairseq-"))
    result = {"command": " ".join(["python -m bench.interop.fairseq_import", *sys.argv[1:]])}
    try:
        bpe = prepare_text(tmp, args.merges)
        data = tmp / "bin"
        fs = args.fairseq_bin
        run([fs / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
             "--trainpref", bpe / "train", "--validpref", bpe / "valid", "--testpref",
             bpe / "test", "--destdir", data, "--joined-dictionary", "--workers", 2])  # fmt: skip
        t0 = time.perf_counter()
        run([fs / "fairseq-train", data, "--arch", "transformer", "--share-all-embeddings",
             "--encoder-layers", 2, "--decoder-layers", 2, "--encoder-embed-dim", 256,
             "--decoder-embed-dim", 256, "--encoder-ffn-embed-dim", 1024,
             "--decoder-ffn-embed-dim", 1024, "--encoder-attention-heads", 4,
             "--decoder-attention-heads", 4, "--optimizer", "adam", "--adam-betas",
             "(0.9, 0.98)", "--lr", 1e-3, "--lr-scheduler", "inverse_sqrt", "--warmup-updates",
             100, "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
             "--dropout", 0.1, "--max-tokens", 2048, "--max-update", args.updates,
             "--no-epoch-checkpoints", "--save-dir", tmp / "ckpt", "--cpu", "--seed", 1,
             "--num-workers", 0, "--log-format", "simple"])  # fmt: skip
        result["fairseq_train_seconds"] = round(time.perf_counter() - t0, 1)
        folder = tmp / "fairseq-model"
        folder.mkdir()
        shutil.copy(tmp / "ckpt" / "checkpoint_last.pt", folder / "model.pt")
        for name in ("dict.en.txt", "dict.de.txt"):
            shutil.copy(data / name, folder / name)
        shutil.copy(bpe / "bpecodes", folder / "bpecodes")
        imported = tmp / "run"
        s2s("import", folder, "--output", imported, "--src-lang", "en", "--tgt-lang", "de")
        test_src = MULTI30K / "test_2016_flickr.en"
        refs = MULTI30K / "test_2016_flickr.de"
        theirs = interactive(fs, folder, data, test_src, 5)
        hyp_ours = tmp / "s2s.hyp"
        s2s("generate", imported, "--input", test_src, "--output", hyp_ours,
            "decode.precision=fp32", "run.device=cpu")  # fmt: skip
        ours = hyp_ours.read_text(encoding="utf-8").splitlines()
        hyp_theirs = tmp / "fairseq.hyp"
        hyp_theirs.write_text("\n".join(theirs) + "\n", encoding="utf-8")
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        result["lines"] = len(ours)
        result["outputs_differing"] = len(differ) + abs(len(ours) - len(theirs))
        result["first_differing"] = [{"line": i, "s2s": ours[i], "fairseq": theirs[i]}
                                     for i in differ[:3]]  # fmt: skip
        scored = {}
        for name, hyp in (("s2s", hyp_ours), ("fairseq", hyp_theirs)):
            done = s2s("score", "own_translation", "--ref", refs, "--hyp", hyp, "--json")
            scored[name] = json.loads(done.stdout)["bleu"]
        result["bleu"] = scored
        print(json.dumps(result, indent=1), flush=True)
        # fine-tuning the import in s2s
        ft_data = tmp / "ft"
        ft_data.mkdir()
        for split, name in SPLITS.items():
            for lang in ("en", "de"):
                shutil.copy(MULTI30K / f"{name}.{lang}", ft_data / f"{split}.{lang}")
        ft = tmp / "ft_run"
        t0 = time.perf_counter()
        s2s("train", "finetune_translation", f"run.init_from={imported}",
            f"task.data_dir={ft_data}", f"run.dir={ft}", f"optim.max_updates={args.finetune_updates}",
            "optim.warmup=100", "optim.lr_scale=0.5", "run.valid_interval=250",
            "run.save_interval=250", "run.valid_max_sentences=0", "run.max_minutes=0",
            "run.precision=fp32", "-q")  # fmt: skip
        result["finetune_seconds"] = round(time.perf_counter() - t0, 1)
        before = s2s("train", "finetune_translation", f"run.init_from={imported}",
                     f"task.data_dir={ft_data}", f"run.dir={tmp / 'ft0'}", "optim.max_updates=1",
                     "optim.lr_scale=1e-12", "run.valid_interval=1", "run.precision=fp32",
                     "-q")  # fmt: skip
        del before
        valid = lambda d: [
            json.loads(x)
            for x in (d / "metrics.jsonl").read_text().splitlines()
            if '"kind": "valid"' in x
        ]  # noqa: E731  fmt: skip
        result["dev_loss"] = {
            "import": valid(tmp / "ft0")[-1]["loss"],
            "fine_tuned": valid(ft)[-1]["loss"],
        }
        paired = s2s("score", "own_translation", "--ref", refs, "--hyp", hyp_ours, "--hyp",
                     ft / "test.hyp.txt", "--json")  # fmt: skip
        result["finetune_test"] = json.loads(paired.stdout)
        result["machine"] = machine()
        write(args.name, result)
        print(json.dumps(result, indent=1))
    except subprocess.CalledProcessError as e:
        print(e.stdout[-3000:], e.stderr[-3000:], file=sys.stderr)
        raise
    finally:
        if args.keep:
            shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
