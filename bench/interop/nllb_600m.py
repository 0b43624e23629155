"""A real-size import: an NLLB-shaped model of 615M parameters built here, imported by `s2s
import`, decoded by `s2s generate` in fp32 and bf16.

The model is transformers' M2M100ForConditionalGeneration with facebook/nllb-200-distilled-600M's
config.json (`NLLB_600M`: 12 + 12 layers, d_model 1,024, FFN 4,096, 16 heads, 256,206 embedding
rows, scaled embeddings, ReLU, every embedding tied), built on the meta device and filled with
random weights drawn by torch (N(0, 0.1) for matrices and embeddings, `STD`; biases zero, layer
norms one; the embedding rows the tokenizer does not name zero, so that the search picks named
pieces rather than rows whose text is empty), which takes seconds where transformers' own init
takes minutes; saved as one model.safetensors (fp32, as the hub's checkpoint). The tokenizer is
`build_m2m100`'s (tests/core/inference/m2m100_fixture.py: a sentencepiece BPE model trained on
Multi30k's English, German and French training sides, NLLB's 202 language codes after the
pieces): the importer takes the embedding rows beyond the tokenizer's as rows no token names.

`python -m bench.interop.nllb_600m` then runs, each in a process of its own, measured by
GNU time (wall seconds, peak RSS: the high-water mark of the process's resident memory):
`s2s import` of the folder (and with `--before REF`, the importer of git revision REF, taken
with `git archive`, on the same folder); `s2s generate` of test_2016_flickr's first 100 English
lines into German, greedy, at most `--max-len` tokens, in fp32 and in bf16. It writes
bench/interop/results/nllb_600m.json: the weights' size on disk, each import's time and peak
RSS and their ratio (the target: under 2), each decoding's time and peak RSS, the lines
produced and their mean length in words, and how many of the 100 lines fp32 and bf16 give
alike. The multi-GB files live in a temporary folder, deleted at the end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import MULTI30K, REPO, write

#: facebook/nllb-200-distilled-600M's config.json on the hub (its numbers; transformers' names)
NLLB_600M = dict(
    activation_dropout=0.0,
    activation_function="relu",
    attention_dropout=0.1,
    bos_token_id=0,
    d_model=1024,
    decoder_attention_heads=16,
    decoder_ffn_dim=4096,
    decoder_layerdrop=0,
    decoder_layers=12,
    decoder_start_token_id=2,
    dropout=0.1,
    encoder_attention_heads=16,
    encoder_ffn_dim=4096,
    encoder_layerdrop=0,
    encoder_layers=12,
    eos_token_id=2,
    init_std=0.02,
    max_length=200,
    max_position_embeddings=1024,
    pad_token_id=1,
    scale_embedding=True,
    vocab_size=256206,
)
LINES = 100
#: the weights' spread: wide (nllb_import's 0.1, not transformers' init_std 0.02), so that the
#: layers rather than the scaled input embedding decide each output; at 0.02 every line repeated
#: its input token, the forced language code, whose text is empty
STD = 0.1
SRC, TGT = "eng_Latn", "deu_Latn"


def build(folder: Path, lines: list[str], seed: int = 1) -> dict:
    """NLLB-200-distilled-600M's shape with random weights and a Multi30k tokenizer in `folder`;
    returns the parameter count and the seconds spent drawing and saving."""
    import torch
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    from tests.core.inference.m2m100_fixture import build_m2m100

    # its tokenizer files (the small model it saves is replaced)
    build_m2m100(folder, lines, "nllb", 8000, d_model=16, encoder_layers=1, decoder_layers=1)
    named = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    t0 = time.perf_counter()
    config = M2M100Config(**NLLB_600M)
    with torch.device("meta"):  # shapes only: transformers' init is not run
        hf = M2M100ForConditionalGeneration(config)
    hf = hf.to_empty(device="cpu")
    hf.tie_weights()  # to_empty gives each module its own tensor: one embedding matrix again
    assert hf.lm_head.weight is hf.model.shared.weight is hf.model.encoder.embed_tokens.weight
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():  # a tied matrix once
            if name.endswith("layer_norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.normal_(0.0, STD, generator=generator)
        hf.model.shared.weight[config.pad_token_id].zero_()
        # the rows no token names (all but the tokenizer's first `named`) zero: their logit 0
        # loses to the named pieces' best, so that outputs are text, not unnamed rows
        hf.model.shared.weight[named:].zero_()
    hf.generation_config = GenerationConfig(
        decoder_start_token_id=2, bos_token_id=0, eos_token_id=2, pad_token_id=1, max_length=200
    )
    drawn = time.perf_counter()
    hf.save_pretrained(str(folder))
    params = sum(p.numel() for p in hf.parameters())
    return {
        "parameters": params,
        "std": STD,
        "rows_named_by_the_tokenizer": named,
        "draw_seconds": round(drawn - t0, 1),
        "save_seconds": round(time.perf_counter() - drawn, 1),
    }


def measured(command: list[str], stdout, env: dict | None = None) -> dict:
    """Run `command` (nice'd) under GNU time and return its wall seconds and peak RSS (time's
    %M: the high-water mark of the command's resident memory). Not os.wait4 on a child of this
    process: a child's ru_maxrss starts from the memory of the process it was forked from, here
    the builder's gigabytes."""
    with tempfile.NamedTemporaryFile("r") as report, tempfile.TemporaryFile() as err:
        timed = ["/usr/bin/time", "-f", "%e %M", "-o", report.name, "nice", "-n", "10"]
        done = subprocess.run([*timed, *command], stdout=stdout, stderr=err, cwd=REPO, env=env)
        if done.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(command)} failed:\n{err.read().decode()[-3000:]}")
        seconds, kib = report.read().split()[-2:]
    return {"seconds": round(float(seconds), 1), "peak_rss_gb": round(int(kib) * 1024 / 1e9, 3)}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "s2s.core.apps.cli", *args]


def old_importer(ref: str, tmp: Path) -> tuple[list[str], dict]:
    """The command and environment that run `s2s import` with git revision `ref`'s
    seq2seq_core (taken with `git archive`) in place of this checkout's."""
    root = tmp / "before"
    root.mkdir()
    archive = subprocess.run(
        ["git", "archive", ref, "seq2seq_core"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    boot = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('s2s.core', {str(root)!r} + "
        f"'/seq2seq_core/__init__.py', submodule_search_locations=[{str(root)!r} + "
        "'/seq2seq_core'])\n"
        "module = importlib.util.module_from_spec(spec); sys.modules['s2s.core'] = module\n"
        "spec.loader.exec_module(module)\n"
        "from s2s.core.apps.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return [sys.executable, "-c", boot], dict(os.environ)


def bf16_generate() -> list[str]:
    """`s2s generate` that decodes in bf16 on this CPU: where the CPU has no native bf16 (no
    avx512_bf16 or amx_bf16), s2s computes in fp32 by design (decode.precision=bf16 falls back
    with a warning: emulated bf16 is slower), so the benchmark adds avx512_bf16 to the flags s2s
    reads (`precision.cpu_flags`) and torch emulates bf16's arithmetic."""
    boot = (
        "import sys\n"
        "from s2s.core.nn import precision\n"
        "flags = precision.cpu_flags() | {'avx512_bf16'}\n"
        "precision.cpu_flags = lambda: flags\n"
        "from s2s.core.apps.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return [sys.executable, "-c", boot]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="also import with this git revision's importer")
    parser.add_argument("--max-len", type=int, default=32, help="tokens a line at most")
    parser.add_argument("--tmp", default=None, help="where the multi-GB files go (deleted)")
    args = parser.parse_args()
    from s2s.core.nn.precision import cpu_has_bf16

    native = cpu_has_bf16()
    train = []
    for lang in ("en", "de", "fr"):
        train += (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    test = (MULTI30K / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:LINES]
    result = {
        "command": "python -m bench.interop.nllb_600m"
        + (f" --before {args.before}" if args.before else ""),
        "shape": "facebook/nllb-200-distilled-600M's config.json: 12 + 12 layers, d_model "
        "1024, FFN 4096, 16 heads, 256206 embedding rows; random weights",
        "bf16_native": native,
        "bf16": "computed in bf16" + ("" if native else ", emulated by torch (`bf16_generate`)"),
    }
    with tempfile.TemporaryDirectory(prefix="s2s-nllb600m-", dir=args.tmp) as tmp:
        tmp = Path(tmp)
        folder = tmp / "nllb-600m"
        result["build"] = build(folder, train)
        weights = folder / "model.safetensors"
        size = weights.stat().st_size
        result["weights_on_disk_gb"] = round(size / 1e9, 3)
        print(result, flush=True)
        imports = {"after": (cli(), None)}
        if args.before:
            command, env = old_importer(args.before, tmp)
            imports = {f"before ({args.before})": (command, env), **imports}
        result["import"] = {}
        for label, (command, env) in imports.items():
            run = tmp / f"run-{label.split()[0]}"
            with open(os.devnull, "wb") as null:
                got = measured(
                    [*command, "import", str(folder), "--output", str(run), "--src-lang", SRC,
                     "--tgt-lang", TGT],
                    null, env,
                )  # fmt: skip
            got["peak_rss_over_weights"] = round(got["peak_rss_gb"] * 1e9 / size, 2)
            result["import"][label] = got
            print(label, got, flush=True)
        source = tmp / "test.en"
        source.write_text("\n".join(test) + "\n", encoding="utf-8")
        outputs, result["generate"] = {}, {}
        for precision in ("fp32", "bf16"):
            out = tmp / f"out.{precision}"
            with open(out, "wb") as f:
                got = measured(
                    [*(cli() if precision == "fp32" or native else bf16_generate()),
                     "generate", str(tmp / "run-after"), "--input", str(source), "--src-lang",
                        SRC, "--tgt-lang", TGT, "decode.beam=1", f"decode.precision={precision}",
                        "decode.max_len_a=0", f"decode.max_len_b={args.max_len}",
                        "run.device=cpu"],
                    f,
                )  # fmt: skip
            outputs[precision] = out.read_text(encoding="utf-8").splitlines()
            lengths = [len(line.split()) for line in outputs[precision]]
            got["lines_out"] = len(outputs[precision])
            got["nonempty_lines"] = sum(n > 0 for n in lengths)
            got["mean_output_words"] = round(sum(lengths) / max(1, len(lengths)), 1)
            chars = sum(len(line) for line in outputs[precision])
            got["mean_output_characters"] = round(chars / max(1, len(lengths)), 1)
            result["generate"][precision] = got
            print(precision, got, flush=True)
            write("nllb_600m", result)
        pairs = zip(outputs["fp32"], outputs["bf16"])
        result["fp32_bf16_lines_equal"] = sum(a == b for a, b in pairs)
        result["max_len_b"] = args.max_len
    print(f"wrote {write('nllb_600m', result)}")


if __name__ == "__main__":
    main()
