"""`s2s prepare PRESET [key=value ...]`: train the vocabulary and binarise the data of a preset
ahead of training, then print each split's size and the vocabularies."""

from __future__ import annotations

from .shared import config_of


def add(subparsers, common) -> None:
    text = "train the vocabulary and binarise the data"
    s = subparsers.add_parser("prepare", parents=[common], help=text, description=text)
    s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="override any config field")
    s.set_defaults(func=run)


def run(args) -> int:
    from ...data.members import build_task
    from ...data.prepared import prepare_data

    cfg, reg = config_of(args)
    task = build_task(cfg.task, reg)
    prepared = prepare_data(task, cfg.data, quiet=args.quiet)
    for name, split in prepared.splits.items():
        print(
            f"{name}: {len(split)} pairs, {int(split.src_lens.sum())} source and "
            f"{int(split.tgt_lens.sum())} target tokens"
        )
    print(
        f"vocabulary: source {task.src_vocab_size}, target {task.tgt_vocab_size}"
        f"{' (shared)' if task.shared_vocab else ''}; prepared in {prepared.directory}"
    )
    return 0
