"""`s2s train PRESET [key=value ...]`: train (or resume) a preset, then say what the run reached:
the tested checkpoint, its figures, the files written and the next commands (or, with --json,
result.json's object on one line)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import OmegaConf

from ..summary import train_lines
from .shared import config_of


def add(subparsers, common) -> None:
    text = "train (or resume) a preset"
    s = subparsers.add_parser("train", parents=[common], help=text, description=text)
    s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="override any config field")
    s.add_argument("--print-config", action="store_true", help="print the merged config and exit")
    s.add_argument(
        "--json",
        action="store_true",
        help="end with result.json's object on one line instead of the summary for a person",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    cfg, reg = config_of(args)  # a bad setting fails here, before torch is even imported
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...training.trainer import train

    result = train(cfg, reg, quiet=args.quiet)
    if args.json:
        print(json.dumps(result))
    elif int(os.environ.get("RANK", 0)) == 0:  # under torchrun, one summary
        print("\n".join(train_lines(result, Path(cfg.run.dir), args.preset)))
    return 0
