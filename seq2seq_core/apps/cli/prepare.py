"""`s2s prepare PRESET [key=value ...]`: train the vocabulary and binarise the data of a preset
ahead of training, then print each split's size and the vocabularies; with `--nodes N`, on each
of N machines sharing data.cache_dir, which prepare it together (`s2s.core.data.shards.Nodes`)."""

from __future__ import annotations


from .shared import config_of


def add(subparsers, common) -> None:
    text = "train the vocabulary and binarise the data"
    s = subparsers.add_parser("prepare", parents=[common], help=text, description=text)
    s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="override any config field")
    s.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="machines sharing data.cache_dir that prepare the corpus together, each running this "
        "command; node 0 trains the vocabulary and writes the manifest (default 1)",
    )
    s.add_argument(
        "--node-rank",
        type=int,
        metavar="R",
        help="this machine's place among them, 0 to N-1 (default: torchrun's GROUP_RANK, else 0)",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...data.cleaning import summary
    from ...data.members import build_members, prepare_members
    from ...data.shards import Nodes
    from ...errors import ConfigError
    from ...runs.distributed import Group, env_int

    rank = args.node_rank if args.node_rank is not None else env_int("GROUP_RANK")
    if args.nodes < 1 or not 0 <= rank < args.nodes:
        raise ConfigError(
            f"--nodes {args.nodes} --node-rank {rank}: the rank goes from 0 to the nodes less one"
        )
    cfg, reg = config_of(args)
    members = build_members(cfg, reg)  # a multi-task preset: each member, as training prepares it
    nodes = Nodes(rank, args.nodes, cfg.run.wait_minutes)
    # under torchrun, its processes: the others wait run.wait_minutes for those that prepare
    group = Group("cpu", cfg.run.timeout_minutes, cfg.run.wait_minutes)
    prepare_members(members, cfg, group, quiet=args.quiet, nodes=nodes)
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
    group.close()  # together: a gloo process leaving its group alone can abort at exit
    return 0
