"""What several commands share: the tasks installed (with any `--plugin`), a preset's config
merged with the command line's overrides, and the search and sampling options of the commands
that decode files (`s2s generate`, `s2s label`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ...errors import ConfigError, UsageError
from ...setup.config import load_config, preset_path
from ...setup.registry import Registry


def registry_of(args):
    """The tasks the command may use: the installed entry points and each `--plugin` given."""
    return Registry.installed(args.plugin or [])


def config_of(args):
    """(config, registry) of a command that takes PRESET [key=value ...]. A run that trained
    before in the run directory the preset names (a resume), whose config.yaml is the preset, or
    that run.init_from names loads its tasks from where it recorded them, without --plugin."""
    registry = registry_of(args)
    registry.not_a_preset(args.preset)  # `s2s train translation`: name its presets
    for run_dir in _run_dirs(args.preset, args.overrides):
        if (run_dir / "task_origins.json").is_file():  # checkpoint.ORIGINS (torch only then)
            from ...runs.checkpoint import task_origins

            registry.adopt(task_origins(run_dir), run_dir)
    return load_config(args.preset, args.overrides, registry=registry), registry


def _run_dirs(preset: str, overrides) -> list[Path]:
    """The run directories a PRESET [key=value ...] command may continue or start from: the
    folder of a run's config.yaml given as the preset, run.dir and run.init_from (each the last
    override's, else the preset's; a checkpoint file's run directory). Read as plain YAML: the
    config itself needs the tasks these may hold."""
    found = [Path(preset).parent] if Path(preset).name == "config.yaml" else []
    try:
        run = (yaml.safe_load(preset_path(preset).read_text(encoding="utf-8")) or {}).get("run")
    except (ConfigError, OSError, yaml.YAMLError, AttributeError):
        run = None  # load_config names what is wrong with the preset
    for key in ("dir", "init_from"):
        given = [o.partition("=")[2] for o in overrides if o.startswith(f"run.{key}=")]
        value = given[-1] if given else run.get(key) if isinstance(run, dict) else None
        if isinstance(value, str) and value:
            path = Path(value)
            found += [path, path.parent, path.parent.parent] if path.suffix == ".pt" else [path]
    return found


def add_search_options(s) -> None:
    """--beam, --alpha, --max-len-a, --max-len-b, --src-lang, --tgt-lang (the decode
    section's) and --ensemble."""
    s.add_argument(
        "--beam",
        type=int,
        metavar="N",
        help="beam size (decode.beam; 1 = greedy); default: the task's",
    )
    s.add_argument(
        "--alpha",
        type=float,
        metavar="A",
        help="length penalty alpha (decode.alpha); default: the task's",
    )
    s.add_argument(
        "--max-len-a",
        dest="max_len_a",
        type=float,
        metavar="A",
        help="an output has at most "
        "int(A * source tokens + B) tokens (decode.max_len_a); default: the task's",
    )
    s.add_argument(
        "--max-len-b",
        dest="max_len_b",
        type=int,
        metavar="B",
        help="see --max-len-a (decode.max_len_b)",
    )
    add_language_options(s)
    s.add_argument(
        "--ensemble",
        nargs="+",
        default=[],
        metavar="RUN",
        help="decode with these runs (or checkpoints) too, as one model: the average of their "
        "next-token probabilities at every step; same task and vocabularies, any shape",
    )


def add_language_options(s) -> None:
    """--src-lang, --tgt-lang: a multilingual model's languages (decode.src_lang, tgt_lang)."""
    for side, example in (("src", "eng_Latn"), ("tgt", "fra_Latn")):
        s.add_argument(
            f"--{side}-lang",
            dest=f"{side}_lang",
            metavar="LANG",
            help=f"a multilingual model's {'source' if side == 'src' else 'target'} language "
            f"(decode.{side}_lang), as its tokenizer names it (NLLB-200: {example}; M2M100: "
            f"{example[:2]}); default: the import's",
        )


def search_overrides(args) -> list[str]:
    """The command's key=value overrides with the search options given as decode.KEY=VALUE."""
    overrides = list(args.overrides)
    for key in ("beam", "alpha", "max_len_a", "max_len_b", "src_lang", "tgt_lang"):
        if getattr(args, key) is not None:
            overrides.append(f"decode.{key}={getattr(args, key)}")
    return overrides


def add_sampling_options(s) -> None:
    """--sampling and what shapes the draws: --temperature, --top-k, --top-p, --epsilon,
    --seed."""
    s.add_argument(
        "--sampling",
        action="store_true",
        help="draw outputs from the model's distribution instead of searching for the best",
    )
    s.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        metavar="T",
        help="with --sampling: divide the log-probabilities by T (< 1 sharper, > 1 flatter)",
    )
    s.add_argument(
        "--top-k",
        dest="top_k",
        type=int,
        default=0,
        metavar="K",
        help="with --sampling: draw among the K most probable tokens only (0: all)",
    )
    s.add_argument(
        "--top-p",
        dest="top_p",
        type=float,
        default=1.0,
        metavar="P",
        help="with --sampling: draw among the fewest most probable tokens whose probability "
        "reaches P (nucleus sampling; 1: all)",
    )
    s.add_argument(
        "--epsilon",
        type=float,
        default=0.0,
        metavar="E",
        help="with --sampling: draw among the tokens of probability E or more (epsilon "
        "sampling; 0: all)",
    )
    s.add_argument(
        "--seed",
        type=int,
        default=0,
        help="with --sampling: the same seed, input and settings draw the same outputs",
    )


def sampling_of(args):
    """The `Sampling` the options ask for, or None; a value out of range, or a sampling option
    without --sampling, is a UsageError naming the option."""
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ...decode.sampling import Sampling

    if args.sampling:
        sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed, args.epsilon)
        problem = sampling.problem()
        if problem:
            raise UsageError(f"--{problem}")
        return sampling
    for option, value, default in (
        ("--temperature", args.temperature, 1.0),
        ("--top-k", args.top_k, 0),
        ("--top-p", args.top_p, 1.0),
        ("--epsilon", args.epsilon, 0.0),
        ("--seed", args.seed, 0),
    ):
        if value != default:
            raise UsageError(f"{option} {value}: only with --sampling (it draws outputs)")
    return None
