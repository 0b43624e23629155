"""fairseq on the ptb_sample_parsing pairs, for the per-update comparison in docs/parsing.md, "Learning speed".

    python bench/interop/fairseq_parsing.py --fairseq-bin /work/venvs/fairseq/bin --updates 1000

Writes the 3,669 / 127 / 118 pairs of ParsingTask.read_split (vinyals scheme) as fairseq's
text files, binarises them with fairseq-preprocess (every word its own id, as fairseq does by
default) and trains the preset's model with fairseq-train: 2+2 layers, d_model 256, d_ff 1024,
4 heads, dropout 0.3, label smoothing 0.1, Adam (0.9, 0.98), peak lr 1.6e-3 after 400 warm-up
updates (inverse square root), 2,048-token batches, fp32, dev loss at every epoch's end (about
150 updates) and every 500 updates. fairseq
logs losses in bits; bench/interop/results/fairseq_ptb_vinyals.json has them in nats, with the commands.
fairseq is not a dependency of s2s: build the fairseq-fixed 0.12.3.1 sdist into a separate
environment (`pip install --no-deps --no-build-isolation .` with wheel, cython, hydra-core 1.3.2,
omegaconf 2.3.0, bitarray, scikit-learn) and point --fairseq-bin at its bin directory.
`--log FILE` reads the figures from a finished fairseq-train log instead of training.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import SHARED, write  # noqa: E402

BITS = math.log(2)  # nats per bit


def write_pairs(directory: Path) -> None:
    from omegaconf import OmegaConf
    from s2s.plugins.parsing import ParsingConfig, ParsingTask

    task = ParsingTask(
        OmegaConf.structured(
            ParsingConfig(
                corpus="nltk_sample", scheme="vinyals", nltk_data=str(SHARED / "nltk_data")
            )
        )
    )
    for split in ("train", "valid", "test"):
        pairs = list(task.read_split(split))
        (directory / f"{split}.src").write_text("".join(s + "\n" for s, _ in pairs))
        (directory / f"{split}.tgt").write_text("".join(t + "\n" for _, t in pairs))


def commands(fairseq_bin: Path, directory: Path, updates: int) -> list[list[str]]:
    preprocess = [
        str(fairseq_bin / "fairseq-preprocess"),
        "--source-lang",
        "src",
        "--target-lang",
        "tgt",
        *(f"--{s}pref={directory / s}" for s in ("train", "valid", "test")),
        "--destdir",
        str(directory / "bin"),
        "--workers",
        "1",
    ]
    train = [
        str(fairseq_bin / "fairseq-train"),
        str(directory / "bin"),
        "--arch",
        "transformer",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--encoder-embed-dim",
        "256",
        "--decoder-embed-dim",
        "256",
        "--encoder-ffn-embed-dim",
        "1024",
        "--decoder-ffn-embed-dim",
        "1024",
        "--encoder-attention-heads",
        "4",
        "--decoder-attention-heads",
        "4",
        "--dropout",
        "0.3",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9,0.98)",
        "--lr",
        "1.6e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "400",
        "--max-tokens",
        "2048",
        "--max-update",
        str(updates),
        "--log-interval",
        "100",
        "--log-format",
        "json",
        "--no-save",
        "--num-workers",
        "0",
        "--cpu",
        "--seed",
        "1",
        "--validate-interval-updates",
        "500",
        "--skip-invalid-size-inputs-valid-test",
    ]
    return [preprocess, train]


def figures(log: str) -> dict:
    """Train records (every 100 updates) and valid records, losses converted to nats."""
    train, valid = [], []
    for line in log.splitlines():
        if not line.rstrip().endswith("}") or not any(
            f"| {k} |" in line for k in ("train_inner", "valid")
        ):
            continue
        r = json.loads(line[line.index("{") :])
        if "nll_loss" in r and "num_updates" in r:
            train.append(
                {
                    "update": int(r["num_updates"]),
                    "nll": round(float(r["nll_loss"]) * BITS, 4),
                    "loss": round(float(r["loss"]) * BITS, 4),
                    "sentences_per_batch": float(r["bsz"]),
                    "target_tokens_per_batch": float(r["wpb"]),
                    "updates_per_s": float(r["ups"]),
                }
            )
        elif "valid_nll_loss" in r:
            valid.append(
                {
                    "update": int(r["valid_num_updates"]),
                    "dev_nll": round(float(r["valid_nll_loss"]) * BITS, 4),
                }
            )
    return {"train": train, "valid": valid}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--fairseq-bin", type=Path, default=Path(sys.executable).parent)
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument(
        "--log", type=Path, help="a finished fairseq-train log to read instead of training"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cmds = commands(args.fairseq_bin, Path(tmp), args.updates)
        if args.log:
            log = args.log.read_text()
        else:
            write_pairs(Path(tmp))
            env = {**os.environ, "OMP_NUM_THREADS": "2"}
            subprocess.run(cmds[0], check=True, capture_output=True, env=env)
            log = subprocess.run(
                cmds[1],
                check=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            ).stdout
    result = {
        "benchmark": "fairseq on the ptb_sample_parsing pairs (vinyals), per update",
        "commands": [" ".join(c).replace(tmp, "DIR") for c in cmds],
        "units": "nats per target token",
        **figures(log),
    }
    print(json.dumps(result["valid"]))
    print(write("fairseq_ptb_vinyals", result))


if __name__ == "__main__":
    main()
