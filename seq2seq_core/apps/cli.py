"""The `s2s` command: tasks, prepare, train, generate, score, average, export, plot, sweep, attention, serve, quickstart."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from ..errors import UsageError, explain
from .sweep import grid_item

log = logging.getLogger("s2s")


def _registry(args):
    from ..setup.registry import Registry

    return Registry.installed(args.plugin or [])


def _config(args):
    """(config, registry) of a command that takes PRESET [key=value ...]."""
    from ..setup.config import load_config
    from ..setup.registry import Registry

    registry = Registry.installed(args.plugin or [])
    registry.not_a_preset(args.preset)  # `s2s train translation`: name its presets
    return load_config(args.preset, args.overrides, registry=registry), registry


def cmd_tasks(args) -> int:
    reg = _registry(args)
    width = max(len(n) for n in reg.names()) if reg.names() else 4
    for name in reg.names():
        print(f"{name:<{width}}  {reg.origin(name)}")
    from ..setup.config import preset_names

    print(f"\npresets (tasks/): {', '.join(preset_names())}")
    return 0


def cmd_prepare(args) -> int:
    from ..data.members import build_task
    from ..data.prepared import prepare_data

    cfg, reg = _config(args)
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


def cmd_train(args) -> int:
    cfg, reg = _config(args)  # a bad setting fails here, before torch is even imported
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    from ..training.trainer import train

    result = train(cfg, reg, quiet=args.quiet)
    if args.json:
        print(json.dumps(result))
    elif int(os.environ.get("RANK", 0)) == 0:  # under torchrun, one summary
        from .summary import train_lines

        print("\n".join(train_lines(result, Path(cfg.run.dir), args.preset)))
    return 0


def cmd_generate(args) -> int:
    """Stream source lines to output lines, exactly one out per line in (`inference.generate_lines`).

    With --output, a regular file appears complete at the end (`files.replacing`); a device or
    a pipe is written as it goes. The output may not be the input. While plugins run (loading,
    encoding, search, post-processing) sys.stdout is stderr, so that what a plugin prints never
    lands among the output lines; the output goes to the real stdout.
    """
    from ..files import readable, writable
    from ..inference.generate import generate_file

    overrides = list(args.overrides)
    for key in ("beam", "alpha", "max_len_a", "max_len_b"):
        if getattr(args, key) is not None:
            overrides.append(f"decode.{key}={getattr(args, key)}")
    if args.input:
        readable(args.input)
    if args.output:
        writable(args.output)
        if args.input and Path(args.output).exists() and Path(args.output).samefile(args.input):
            raise UsageError(
                f"--output {args.output} is the input file: write the output elsewhere"
            )
    stdout = sys.stdout  # the output's, whatever plugins print meanwhile
    with contextlib.redirect_stdout(sys.stderr):
        number, bad = generate_file(
            args.checkpoint,
            _registry(args),
            overrides,
            args.task,
            args.input,
            args.output,
            stdout,
            "--beam" if args.beam is not None else "decode.beam",
            args.quiet,
            pretty=args.pretty,
        )
    if bad:
        log.warning(
            "%s: %d of %d line(s) could not be decoded and got an empty output line",
            args.input or "<stdin>",
            bad,
            number,
        )
    return 0


def cmd_score(args) -> int:
    from .. import textio
    from ..data.members import build_task
    from ..errors import ConfigError, DataError
    from ..setup.config import load_config, preset_names, single_task

    reg = _registry(args)
    name = args.task
    if name in reg.names():  # the task's defaults, with the overrides (e.g. task.tgt_lang=fr)
        cfg = load_config(None, [f"task.name={name}", *args.overrides], registry=reg)
    elif name in preset_names():
        cfg = single_task(load_config(name, args.overrides, registry=reg), f"preset {name!r}")
    else:
        raise ConfigError(
            f"{name!r} is neither a task ({', '.join(reg.names())}) nor a preset "
            f"({', '.join(preset_names())})"
        )
    task = build_task(cfg.task, reg)
    refs, hyps = textio.read_lines(args.ref), textio.read_lines(args.hyp)  # lines end at "\n" only
    srcs = textio.read_lines(args.src) if args.src else None
    if len(refs) != len(hyps):
        raise DataError(
            f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}: "
            "a partial score is no score"
        )
    from ..task import checked_score

    with contextlib.redirect_stdout(sys.stderr):  # what the plugin prints is not the score's line
        result = task.score(hyps, refs, srcs)
    score = checked_score(task, result)  # a plugin's answer, checked where it comes in
    print(json.dumps(score.as_dict()) if args.json else "\n".join(score.lines()))
    return 0


def cmd_average(args) -> int:
    from ..files import no_such_run
    from ..training import checkpoint

    if args.last is not None and len(args.inputs) == 1 and not Path(args.inputs[0]).exists():
        raise no_such_run(args.inputs[0])

    paths, output = checkpoint.average_files(args.inputs, args.last, args.output)
    print(f"averaged {len(paths)} checkpoints into {output}")
    return 0


def cmd_export(args) -> int:
    from ..inference.export import export
    from .summary import export_lines

    out = export(args.run_dir, args.to, args.output, _registry(args), args.quantization, args.force)
    print("\n".join(export_lines(args.run_dir, args.to, out)))
    return 0


def cmd_plot(args) -> int:
    from .plot import plot_run
    from .summary import written_lines

    paths = plot_run(Path(args.run_dir), Path(args.output) if args.output else None)
    print(
        "\n".join(
            written_lines(paths, "open them in an image viewer; run again as the run goes on")
        )
    )
    return 0


def cmd_sweep(args) -> int:
    from . import sweep

    variants = sweep.read_variants(args.variants) if args.variants else sweep.grid(args.grid)
    budget = (
        {"updates": args.budget_updates}
        if args.budget_updates is not None
        else {"minutes": args.budget_minutes}
    )
    plan = sweep.Sweep(
        args.preset, variants, budget, Path(args.dir), list(args.overrides), list(args.plugin or [])
    )
    if args.print_commands:
        print("\n".join(sweep.commands(plan, _registry(args))))
        return 0
    from .summary import written_lines

    results = sweep.run(plan, _registry(args), quiet=args.quiet)
    written = [Path(args.dir) / "results.md", Path(args.dir) / "results.json", *results["plots"]]
    print(
        sweep.table(results)
        + "\n".join(
            written_lines(
                written, f"the table is results.md; each variant's run directory is {args.dir}/NAME"
            )
        )
    )
    return 0


def cmd_attention(args) -> int:
    from .attention_maps import draw_attention

    stdout = sys.stdout  # the paths written; what a plugin prints meanwhile goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        paths = draw_attention(
            args.run_dir,
            _registry(args),
            args.input,
            args.output,
            args.task,
            args.layer,
            args.head,
            args.beam,
            args.overrides,
        )
    from .summary import written_lines

    use = (
        "a PNG per input line, attention and layer; each line's weights as JSON (docs/attention.md)"
    )
    stdout.write("\n".join(written_lines(paths, use)) + "\n")
    return 0


def cmd_serve(args) -> int:
    from .serve import serve

    serve(
        args.run_dir,
        _registry(args),
        args.task,
        args.host,
        args.port,
        args.threads,
        args.precision,
        args.overrides,
        args.quiet,
    )
    return 0


def cmd_quickstart(args) -> int:
    """Train the demo end to end and compare its held-out score with the copy baseline."""
    import time

    from ..data.members import decode_settings
    from ..decode.batched import decode_sources
    from ..inference import load_for_inference
    from ..training.trainer import train

    args.preset = "demo"
    cfg, reg = _config(args)
    t0 = time.time()
    train(cfg, reg, quiet=args.quiet)
    cfg, member, model = load_for_inference(cfg.run.dir, reg)
    from ..data.prepared import prepare_data

    sources, refs = prepare_data(member.task, cfg.data, quiet=True).texts("test")
    hyps = decode_sources(
        model, member, sources, decode_settings(member, cfg.decode), next(model.parameters()).device
    )
    trained = member.score(hyps, refs, sources)
    baseline = member.score(sources, refs, sources)
    elapsed = time.time() - t0
    print(f"\ndemo ({cfg.task.mode}) on {len(sources)} held-out sentences, {elapsed:.0f} s:")
    print(f"  trained model  {trained}")
    print(f"  copy baseline  {baseline}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="s2s", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    for parser, default in (
        (p, None),
        (common, argparse.SUPPRESS),
    ):  # `s2s -v train` and `s2s train -v`
        parser.add_argument(
            "--plugin",
            action="append",
            metavar="MODULE:CLASS|FILE.py",
            default=default,
            help="load a task plugin under development (repeatable; also from the current folder)",
        )
        parser.add_argument(
            "-q",
            "--quiet",
            action="store_true",
            default=default or False,
            help="no progress bars; log lines only",
        )
        parser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=default or False,
            help="debug logging, and the traceback of an error",
        )
    sub = p.add_subparsers(dest="command", required=True)

    text = "list the tasks and where they come from (entry point or --plugin), and the presets"
    s = sub.add_parser("tasks", parents=[common], help=text, description=text)
    s.set_defaults(func=cmd_tasks)

    for name, func, text in (
        ("prepare", cmd_prepare, "train the vocabulary and binarise the data"),
        ("train", cmd_train, "train (or resume) a preset"),
    ):
        s = sub.add_parser(name, parents=[common], help=text, description=text)
        s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
        s.add_argument(
            "overrides", nargs="*", metavar="key=value", help="override any config field"
        )
        if name == "train":
            s.add_argument(
                "--print-config", action="store_true", help="print the merged config and exit"
            )
            s.add_argument(
                "--json",
                action="store_true",
                help="end with result.json's object on one line "
                "instead of the summary for a person",
            )
        s.set_defaults(func=func)

    s = sub.add_parser(
        "generate",
        parents=[common],
        help="decode lines with a trained model",
        description="Read source lines (stdin or --input), write the task's output lines.",
    )
    s.add_argument(
        "checkpoint",
        help="a run directory (the checkpoint its result.json names, which `s2s train` "
        "tested; else checkpoint_average.pt; else the newest checkpoint) or a checkpoint file "
        "(e.g. an average made with `s2s average`)",
    )
    s.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="e.g. decode.max_sentences=64 run.device=cpu",
    )
    s.add_argument("--input", help="source file (default: stdin)")
    s.add_argument("--output", help="output file (default: stdout)")
    s.add_argument(
        "--task",
        help="the member of a multi-task run to decode for (its tokenisation, "
        "constraint and post-processing)",
    )
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
    s.add_argument(
        "--pretty",
        action="store_true",
        help="each output as the task displays it for a person "
        "(parsing: an indented tree), a blank line after each, instead of one line per input line",
    )
    s.set_defaults(func=cmd_generate)

    s = sub.add_parser(
        "score",
        parents=[common],
        help="score hypotheses with a task's metric",
        description="Score "
        "output lines against reference lines with the task's metric (translation: BLEU, chrF; parsing: EVALB).",
    )
    s.add_argument("task", help="a task name (translation, parsing, ...) or a preset name")
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="e.g. task.tgt_lang=fr (French rules)"
    )
    s.add_argument(
        "--ref",
        required=True,
        metavar="FILE",
        help="the reference lines (parsing: one tree a line)",
    )
    s.add_argument(
        "--hyp", required=True, metavar="FILE", help="the output lines to score, as many as --ref"
    )
    s.add_argument(
        "--src", metavar="FILE", help="the source lines, for a task whose metric reads them"
    )
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=cmd_score)

    s = sub.add_parser(
        "average",
        parents=[common],
        help="average checkpoints (section 6.1)",
        description="Average "
        "checkpoints' weights element by element (section 6.1): a run's last K, or the files given.",
    )
    s.add_argument("inputs", nargs="+", help="a run directory with --last, or checkpoint files")
    s.add_argument("--last", type=int, help="average the last K checkpoints of the run directory")
    s.add_argument(
        "--output",
        help="default: RUN_DIR/checkpoint_average.pt (with --last), else "
        "./checkpoint_average.pt; never one of the inputs or a rolling checkpoints/checkpoint_NNNNNNNN.pt",
    )
    s.set_defaults(func=cmd_average)

    s = sub.add_parser(
        "export",
        parents=[common],
        help="write a trained model for CTranslate2, Hugging Face or safetensors",
        description="Export the model `s2s generate RUN_DIR` uses: the checkpoint RUN_DIR/result.json "
        "names (the one `s2s train` tested), else checkpoint_average.pt, else the newest "
        "checkpoint. The folder gets s2s_export.json, which lets --force replace it later.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train`")
    s.add_argument("--to", required=True, choices=["ctranslate2", "huggingface", "safetensors"])
    s.add_argument("--output", required=True, help="the folder to write")
    s.add_argument(
        "--quantization", help="ctranslate2 only: int8, int8_float32, int16, float16, bfloat16, ..."
    )
    s.add_argument(
        "--force",
        action="store_true",
        help="replace an --output that holds a previous export "
        "(s2s_export.json) and nothing else; any other non-empty folder is refused",
    )
    s.set_defaults(func=cmd_export)

    s = sub.add_parser(
        "plot",
        parents=[common],
        help="draw a run's learning curves as PNG files",
        description="Loss, learning rate and dev metric against updates and training time, "
        "from RUN_DIR/metrics.jsonl.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train` (it may still be training)")
    s.add_argument("--output", help="folder for the PNG files (default: RUN_DIR/plots)")
    s.set_defaults(func=cmd_plot)

    s = sub.add_parser(
        "sweep",
        parents=[common],
        help="train variants of a preset to one budget; one table, plots",
        description="Train a grid or a list of variants of PRESET to one budget, each in DIR/NAME, "
        "one after another (the same command resumes); write DIR/results.md, .json, sweep_KEY.png.",
    )
    s.add_argument("preset", help="a preset name from tasks/ or a YAML file")
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="common overrides, for every variant"
    )
    which, budget = (
        s.add_mutually_exclusive_group(required=True),
        s.add_mutually_exclusive_group(required=True),
    )
    which.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2",
        type=grid_item,
        help="vary KEY (repeatable: the cartesian product)",
    )
    which.add_argument(
        "--variants",
        metavar="FILE.yaml",
        help="a YAML list of override mappings, each optionally named",
    )
    budget.add_argument(
        "--budget-updates", type=int, metavar="N", help="optim.max_updates of every variant"
    )
    budget.add_argument(
        "--budget-minutes", type=float, metavar="M", help="run.max_minutes of every variant"
    )
    s.add_argument(
        "--dir",
        required=True,
        help="the sweep's folder: sweep.json, a run directory per variant, results",
    )
    s.add_argument(
        "--print-commands",
        action="store_true",
        help="print one `s2s train` line per variant; run nothing",
    )
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser(
        "attention",
        parents=[common],
        help="draw a run's attention weights for input lines (PNG, JSON)",
        description="Decode each line as `s2s generate` does, run the model over (source, hypothesis) "
        "and draw every attention's weights, tokens on both axes. See docs/attention.md.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train` (or a checkpoint file in one)")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. run.device=cpu")
    s.add_argument("--input", required=True, help="source lines")
    s.add_argument("--output", required=True, help="the folder for the PNG and JSON files")
    for flag, meta, text in (
        ("--task", "MEMBER", "the member of a multi-task run"),
        ("--layer", "L", "only layer L (from 1)"),
        ("--head", "H", "a page for head H alone (from 1); default: all heads on a page"),
        ("--beam", "N", "the search's beam"),
    ):
        s.add_argument(flag, metavar=meta, type=str if flag == "--task" else int, help=text)
    s.set_defaults(func=cmd_attention)

    s = sub.add_parser(
        "serve",
        parents=[common],
        help="serve a run over HTTP: JSON requests and a page (docs/serve.md)",
        description='Serve the model `s2s generate RUN_DIR` uses: POST /generate {"text": [...]} '
        "answers its output lines, GET / is a page to try it. See docs/serve.md.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train` (or a checkpoint file in one)")
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="e.g. decode.beam=1 run.device=cpu"
    )
    s.add_argument(
        "--task",
        metavar="MEMBER",
        help="the member a request gets when it names none (a multi-task "
        'run serves every member; requests choose with "task")',
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    s.add_argument(
        "--port", type=int, default=8000, help="default 8000; 0: any free port (printed)"
    )
    s.add_argument(
        "--threads", type=int, metavar="N", help="torch threads for decoding (default: run.threads)"
    )
    s.add_argument(
        "--precision",
        choices=["fp32", "bf16", "int8"],
        help="the model searched with (decode.precision)",
    )
    s.set_defaults(func=cmd_serve)

    text = "train the offline demo (no download), then print its held-out BLEU next to the copy baseline's"
    s = sub.add_parser("quickstart", parents=[common], help=text, description=text)
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="override any field of the demo preset"
    )
    s.set_defaults(func=cmd_quickstart)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may follow options (`s2s train demo -q model.layers=2`)
    if (
        extra
        and hasattr(args, "overrides")
        and all("=" in e and not e.startswith("-") for e in extra)
    ):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from ..training.runlog import ConsoleFormat

    console = logging.StreamHandler()
    console.setFormatter(ConsoleFormat())
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[console])
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"s2s {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 -- every error ends as one line; -v adds the traceback
        if args.verbose:
            import traceback

            traceback.print_exc()
        message, code = explain(e, args.command)
        print(f"s2s {args.command}: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
