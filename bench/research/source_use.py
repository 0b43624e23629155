"""Does a multi-task model read its source? Dev nll with the true sources against shuffled ones.

    python bench/research/source_use.py --preset multi30k_en_de_fr --member de --updates 300 \
        --variant post model.pre_norm=false --variant pre model.pre_norm=true

Each variant trains the preset for --updates updates (its own run directory under --dir, resumed
if it is there), then
scores the member's first 64 dev pairs (as its task reads them) in fp32, without label smoothing: the nll
per target token with each sentence's own source, and with the sources shuffled among the 64. A
model that reads its source scores worse with shuffled sources; equal figures mean the decoder
writes as a language model whatever the input (what post-norm multi-task runs did, issue 23;
docs/multitask.md). Writes bench/research/results/NAME.json (default source_use) with the machine's facts.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from s2s.core.inference import load_for_inference  # noqa: E402
from s2s.core.setup.config import load_config  # noqa: E402
from s2s.core.setup.registry import Registry  # noqa: E402
from s2s.core.training.trainer import train  # noqa: E402
from s2s.core.tokenizers import BOS, EOS, PAD  # noqa: E402

from bench.common import corpus_overrides, machine, write  # noqa: E402

PAIRS = 64


def padded(rows: list[list[int]], head: list[int], tail: list[int]) -> torch.Tensor:
    rows = [head + r + tail for r in rows]
    width = max(map(len, rows))
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def nll_true_and_shuffled(run_dir: str, reg, member: str) -> dict:
    """The member's dev nll per target token on its first PAIRS dev pairs (read by its task), its
    sources as they are and shuffled among them (seed 0)."""
    _, m, model = load_for_inference(run_dir, reg, ["decode.precision=fp32"], member)
    model = model.float()
    sources, targets = map(list, zip(*list(m.task.read_split("valid"))[:PAIRS]))
    src = padded(m.encode_source(sources), [], [EOS])
    tgt = m.task.encode_target(targets)
    tgt_in, tgt_out = m.ids.tgt(padded(tgt, [BOS], [])), m.ids.tgt(padded(tgt, [], [EOS]))
    shuffled = src[torch.randperm(len(sources), generator=torch.Generator().manual_seed(0))]
    n = float(tgt_out.ne(PAD).sum())
    with torch.no_grad():
        true, other = (float(model(s, tgt_in, tgt_out, 0.0)[1]) / n for s in (src, shuffled))
    return {
        "true_sources": round(true, 3),
        "shuffled_sources": round(other, 3),
        "gap": round(other - true, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default="multi30k_en_de_fr")
    p.add_argument("--member", default="de", help="the member scored")
    p.add_argument("--updates", type=int, default=300)
    p.add_argument(
        "--variant",
        nargs="+",
        action="append",
        required=True,
        metavar=("NAME", "KEY=VALUE"),
        help="a name and the settings of one variant (repeat for each)",
    )
    p.add_argument("--dir", default="runs/source_use")
    p.add_argument("--name", default="source_use")
    args = p.parse_args()
    reg = Registry.installed()
    result = {
        "command": " ".join(["python", *sys.argv]),
        "machine": machine(),
        "preset": args.preset,
        "member": args.member,
        "updates": args.updates,
        "pairs": PAIRS,
        "variants": {},
    }
    for name, *settings in args.variant:
        run_dir = f"{args.dir}/{name}"  # run again, the same command re-scores what it trained
        cfg = load_config(
            args.preset,
            [
                *corpus_overrides(args.preset),
                f"run.dir={run_dir}",
                "run.quiet=true",
                f"optim.max_updates={args.updates}",
                "run.valid_interval=1000000",
                "run.valid_max_sentences=8",
                "run.average_last=0",
                *settings,
            ],
            registry=reg,
        )
        train(cfg, reg, quiet=True)
        result["variants"][name] = {
            "settings": settings,
            **nll_true_and_shuffled(run_dir, reg, args.member),
        }
        print(name, result["variants"][name], flush=True)
        write(args.name, result)


if __name__ == "__main__":
    main()
