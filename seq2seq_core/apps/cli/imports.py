"""`s2s import SOURCE --output RUN_DIR`: an OPUS-MT model (a folder in Hugging Face's MarianMTModel
layout, or a hub name), an `s2s export --to huggingface`, or a fairseq Transformer checkpoint as an
s2s run directory that every command takes (docs/pretrained.md)."""

from __future__ import annotations

import shlex

from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "import",
        parents=[common],
        help="make a run directory of a pretrained model (OPUS-MT / MarianMTModel, fairseq)",
        description="Import a pretrained model as a run directory: generate, serve, score, "
        "export, attention, label and run.init_from then use it as any run. SOURCE is an OPUS-MT "
        "model (MarianMTModel): a folder with config.json, model.safetensors or pytorch_model.bin "
        "and MarianTokenizer's source.spm, target.spm and vocab.json, or a hub name "
        "(Helsinki-NLP/opus-mt-en-de), "
        "downloaded and cached by huggingface_hub; or a fairseq Transformer checkpoint (a .pt "
        "file, or a folder with model.pt or checkpoint_best.pt) with dict.SRC.txt, dict.TGT.txt "
        "and its subword-nmt bpecodes beside it.",
    )
    s.add_argument("source", help="a model folder, or a hub name OWNER/NAME")
    s.add_argument("--output", required=True, help="the run directory to write (must not exist)")
    s.add_argument("--src-lang", help="the source language (default: the tokenizer's config)")
    s.add_argument("--tgt-lang", help="the target language (default: the tokenizer's config)")
    s.add_argument(
        "--revision", help="the hub revision (branch, tag or commit) of a hub name (not a folder)"
    )
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...inference.formats import ImportJob, import_model

    job = ImportJob(args.source, args.output, args.src_lang, args.tgt_lang, args.revision)
    out = import_model(job, registry_of(args))
    # a next step that runs as printed: the lines to translate on stdin (or --input FILE)
    print(f"imported {args.source} into {out}: next: s2s generate {shlex.quote(str(out))}")
    return 0
