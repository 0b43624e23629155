"""The `s2s` command: tasks, prepare, train, generate, score, average, plot, quickstart."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

# torch's OpenMP threads otherwise spin long at every barrier; on a shared CPU that collapsed
# training throughput 3.4x (bench/train_throughput.py). Set before torch is first imported.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")
from pathlib import Path

from omegaconf import OmegaConf

log = logging.getLogger("s2s")


def _registry(args):
    from .registry import Registry

    return Registry.installed(args.plugin or [])


def _config(args, registry):
    from .config import load_config

    return load_config(args.preset, args.overrides, registry=registry)


def cmd_tasks(args) -> int:
    reg = _registry(args)
    width = max(len(n) for n in reg.names()) if reg.names() else 4
    for name in reg.names():
        print(f"{name:<{width}}  {reg.origin(name)}")
    from .config import preset_names

    print(f"\npresets (tasks/): {', '.join(preset_names())}")
    return 0


def cmd_prepare(args) -> int:
    from .data import prepare
    from .train import build_task

    reg = _registry(args)
    cfg = _config(args, reg)
    task = build_task(cfg, reg)
    prepared = prepare(task, cfg.data, quiet=args.quiet)
    for name, split in prepared.splits.items():
        print(f"{name}: {len(split)} pairs, {int(split.src_lens.sum())} source and "
              f"{int(split.tgt_lens.sum())} target tokens")
    print(f"vocabulary: source {task.src_vocab_size}, target {task.tgt_vocab_size}"
          f"{' (shared)' if task.shared_vocab else ''}; prepared in {prepared.directory}")
    return 0


def cmd_train(args) -> int:
    from .train import train

    reg = _registry(args)
    cfg = _config(args, reg)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    result = train(cfg, reg, quiet=args.quiet)
    print(json.dumps(result))
    return 0


def load_for_inference(path: str, registry, overrides=()):
    """(cfg, task, model) from a run directory or a checkpoint file inside one."""
    from . import checkpoint, precision
    from .config import load_config
    from .train import build_model, build_task, resolve_device

    p = Path(path)
    run_dir = p if p.is_dir() else p.parent.parent if p.parent.name == "checkpoints" else p.parent
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} holds no config.yaml: not a run directory of `s2s train`")
    # checked against today's schema: settings added since the run was trained take their defaults
    cfg = load_config(run_dir / "config.yaml", list(overrides), registry=registry)
    task = build_task(cfg, registry)
    task.load_vocab(run_dir)
    if p.is_dir():
        avg = run_dir / "checkpoint_average.pt"
        state = checkpoint.load(avg) if avg.is_file() else checkpoint.load_latest(run_dir)[0]
        if state is None:
            raise FileNotFoundError(f"{run_dir} holds no checkpoint")
    else:
        state = checkpoint.load(p)
    model = build_model(cfg, task)
    model.load_state_dict(state["model"])
    device = resolve_device(cfg.run.device)
    model.to(device).eval()
    return cfg, task, precision.for_inference(model, precision.resolve(cfg.decode.precision, device, "decode.precision"))


def cmd_generate(args) -> int:
    from tqdm import tqdm

    from .evaluate import decode_settings, translate

    reg = _registry(args)
    overrides = list(args.overrides)
    for key in ("beam", "alpha", "max_len_a", "max_len_b"):
        if getattr(args, key) is not None:
            overrides.append(f"decode.{key}={getattr(args, key)}")
    cfg, task, model = load_for_inference(args.checkpoint, reg, overrides)
    stream = open(args.input, encoding="utf-8") if args.input else sys.stdin
    sources = [line.rstrip("\n") for line in stream]
    device = next(model.parameters()).device
    with tqdm(total=len(sources), desc="generate", unit=" sent", disable=args.quiet, file=sys.stderr) as bar:
        hyps = translate(model, task, sources, decode_settings(task, cfg.decode), device,
                         cfg.decode.max_sentences, progress=bar)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    for h in hyps:
        out.write(h + "\n")
    out.flush()
    return 0


def read_lines(path: str) -> list[str]:
    from .task import DataError

    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"file {path} does not exist") from None
    except UnicodeDecodeError as e:
        line = Path(path).read_bytes()[:e.start].count(b"\n") + 1
        raise DataError(f"{path}, line {line}: invalid UTF-8") from None


def cmd_score(args) -> int:
    from .config import ConfigError, load_config, preset_names

    reg = _registry(args)
    name = args.task
    if name not in reg.names():
        if name in preset_names():
            cfg = load_config(name, [], registry=reg)
        else:
            raise ConfigError(f"{name!r} is neither a task ({', '.join(reg.names())}) nor a preset "
                              f"({', '.join(preset_names())})")
        from .train import build_task

        task = build_task(cfg, reg)
    else:
        task_cls = reg.get(name)
        task = task_cls(OmegaConf.structured(task_cls.Config))
    refs, hyps = read_lines(args.ref), read_lines(args.hyp)
    srcs = read_lines(args.src) if args.src else None
    if len(refs) != len(hyps):
        raise ValueError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}: "
                         "a partial score is no score")
    score = task.score(hyps, refs, srcs)
    print(json.dumps(score.as_dict()) if args.json else str(score))
    return 0


def cmd_average(args) -> int:
    from . import checkpoint

    if args.last:
        if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
            raise ValueError("--last K takes one run directory")
        paths = checkpoint.listed(Path(args.inputs[0]))[-args.last:]
        if len(paths) < args.last:
            log.warning("only %d checkpoints in %s", len(paths), args.inputs[0])
    else:
        paths = [Path(p) for p in args.inputs]
    output = Path(args.output or (Path(args.inputs[0]) / "checkpoint_average.pt" if args.last else "checkpoint_average.pt"))
    checkpoint.atomic_save(checkpoint.average(paths), output)
    print(f"averaged {len(paths)} checkpoints into {output}")
    return 0


def cmd_plot(args) -> int:
    from .plot import plot_run

    for path in plot_run(Path(args.run_dir), Path(args.output) if args.output else None):
        print(path)
    return 0


def cmd_quickstart(args) -> int:
    """Train the demo end to end and compare its held-out score with the copy baseline."""
    import time

    from .evaluate import decode_settings, translate
    from .train import train

    reg = _registry(args)
    args.preset = "demo"
    cfg = _config(args, reg)
    t0 = time.time()
    train(cfg, reg, quiet=args.quiet)
    cfg, task, model = load_for_inference(cfg.run.dir, reg)
    from .data import prepare

    sources, refs = prepare(task, cfg.data, quiet=True).texts("test")
    hyps = translate(model, task, sources, decode_settings(task, cfg.decode), next(model.parameters()).device)
    trained = task.score(hyps, refs, sources)
    baseline = task.score(sources, refs, sources)
    elapsed = time.time() - t0
    print(f"\ndemo ({cfg.task.mode}) on {len(sources)} held-out sentences, {elapsed:.0f} s:")
    print(f"  trained model  {trained}")
    print(f"  copy baseline  {baseline}")
    print(json.dumps({"trained": trained.as_dict(), "copy_baseline": baseline.as_dict(),
                      "seconds": round(elapsed, 1)}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="s2s", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--plugin", action="append", metavar="MODULE:CLASS|FILE.py",
                        help="load a task plugin under development (repeatable)")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars; log lines only")
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("tasks", parents=[common], help="list the tasks and where they come from")
    s.set_defaults(func=cmd_tasks)

    for name, func, text in (("prepare", cmd_prepare, "train the vocabulary and binarise the data"),
                             ("train", cmd_train, "train (or resume) a preset")):
        s = sub.add_parser(name, parents=[common], help=text, description=text)
        s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
        s.add_argument("overrides", nargs="*", metavar="key=value", help="override any config field")
        if name == "train":
            s.add_argument("--print-config", action="store_true", help="print the merged config and exit")
        s.set_defaults(func=func)

    s = sub.add_parser("generate", parents=[common], help="decode lines with a trained model",
                       description="Read source lines (stdin or --input), write the task's output lines.")
    s.add_argument("checkpoint", help="a run directory (averaged or newest checkpoint) or a checkpoint file")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. decode.max_sentences=64 run.device=cpu")
    s.add_argument("--input", help="source file (default: stdin)")
    s.add_argument("--output", help="output file (default: stdout)")
    s.add_argument("--beam", type=int)
    s.add_argument("--alpha", type=float)
    s.add_argument("--max-len-a", dest="max_len_a", type=float)
    s.add_argument("--max-len-b", dest="max_len_b", type=int)
    s.set_defaults(func=cmd_generate)

    s = sub.add_parser("score", parents=[common], help="score hypotheses with a task's metric")
    s.add_argument("task", help="a task name (translation, parsing, ...) or a preset name")
    s.add_argument("--ref", required=True)
    s.add_argument("--hyp", required=True)
    s.add_argument("--src")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_score)

    s = sub.add_parser("average", parents=[common], help="average checkpoints (section 6.1)")
    s.add_argument("inputs", nargs="+", help="a run directory with --last, or checkpoint files")
    s.add_argument("--last", type=int, help="average the last K checkpoints of the run directory")
    s.add_argument("--output", help="default: RUN_DIR/checkpoint_average.pt")
    s.set_defaults(func=cmd_average)

    s = sub.add_parser("plot", parents=[common], help="draw a run's learning curves as PNG files",
                       description="Loss, learning rate and dev metric against updates and training time, "
                                   "from RUN_DIR/metrics.jsonl.")
    s.add_argument("run_dir", help="a run directory of `s2s train` (it may still be training)")
    s.add_argument("--output", help="folder for the PNG files (default: RUN_DIR/plots)")
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser("quickstart", parents=[common], help="train and score the offline demo")
    s.add_argument("overrides", nargs="*", metavar="key=value")
    s.set_defaults(func=cmd_quickstart)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow options (`s2s train demo -q model.layers=2`)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from .config import ConfigError
    from .registry import RegistryError
    from .task import DataError

    try:
        return args.func(args)
    except (ConfigError, RegistryError, DataError, FileNotFoundError, ValueError, RuntimeError) as e:
        if args.verbose:
            raise
        print(f"s2s {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
