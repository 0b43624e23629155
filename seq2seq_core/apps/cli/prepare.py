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
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...data.cleaning import summary
    from ...data.members import build_members, prepare_members
    from ...runs.distributed import Group

    cfg, reg = config_of(args)
    members = build_members(cfg, reg)  # a multi-task preset: each member, as training prepares it
    prepare_members(members, cfg, Group("cpu"), quiet=args.quiet)
    for m in members:
        prepared, task = m.data, m.task
        head = f"{m.name} " if len(members) > 1 else ""
        made = prepared.manifest.get("splits", {})
        for name, split in prepared.splits.items():
            source, target = split.tokens
            print(f"{head}{name}: {len(split)} pairs, {source} source and {target} target tokens")
            if "dropped" in made.get(name, {}):  # the training split: its shards, its cleaning
                print(
                    f"{head}{name}: {made[name]['shards']} shard(s) "
                    f"({made[name]['shards_reused']} kept from the previous build); "
                    f"cleaning: {summary(made[name]['dropped'])}"
                )
        print(
            f"{head}vocabulary: source {task.src_vocab_size}, target {task.tgt_vocab_size}"
            f"{' (shared)' if task.shared_vocab else ''}; prepared in {prepared.directory}"
        )
    return 0
