"""The `s2s` command line: the top parser with the options every command takes, then one module
per command, each owning its options (`add`) and its work (`run`), in the order `s2s --help`
lists them. `main` parses, sets up logging and ends every error as one line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from ...errors import explain
from . import (
    attention,
    average,
    check_task,
    export,
    generate,
    imports,
    label,
    new_task,
    plot,
    prepare,
    quickstart,
    rerank,
    score,
    serve,
    sweep,
    tasks,
    train,
)

#: what `s2s --help` says above the commands
DESCRIPTION = (
    "The `s2s` command: tasks, check-task, new-task, prepare, train, generate, label, score, "
    "rerank, average, export, import, plot, sweep, attention, serve, quickstart."
)


class ConsoleFormat(logging.Formatter):
    """The console's log lines: "12:01:05 train update 100: loss ...", the level named only for
    warnings and errors ("12:01:05 WARNING ...")."""

    def __init__(self):
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if record.levelno >= logging.WARNING:
            stamp, _, message = line.partition(" ")
            line = f"{stamp} {record.levelname} {message}"
        return line


def _add_common_options(parser: argparse.ArgumentParser, default) -> None:
    """--plugin, -q and -v. They go on the top parser (`s2s -v train`, default None) and on
    `common`, every command's parent (`s2s train -v`), whose default SUPPRESS leaves a value
    given before the command as it is."""
    switch = False if default is None else default  # -q and -v: off, or left as given
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
        default=switch,
        help="no progress bars; log lines only",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=switch,
        help="debug logging, and the traceback of an error",
    )


def build_parser() -> argparse.ArgumentParser:
    """The `s2s` parser: the common options, then each command's subparser, in the order
    `s2s --help` lists them."""
    parser = argparse.ArgumentParser(prog="s2s", description=DESCRIPTION)
    _add_common_options(parser, None)
    common = argparse.ArgumentParser(add_help=False)
    _add_common_options(common, argparse.SUPPRESS)
    subparsers = parser.add_subparsers(dest="command", required=True)
    tasks.add(subparsers, common)
    check_task.add(subparsers, common)
    new_task.add(subparsers, common)
    prepare.add(subparsers, common)
    train.add(subparsers, common)
    generate.add(subparsers, common)
    label.add(subparsers, common)
    score.add(subparsers, common)
    rerank.add(subparsers, common)
    average.add(subparsers, common)
    export.add(subparsers, common)
    imports.add(subparsers, common)
    plot.add(subparsers, common)
    sweep.add(subparsers, common)
    attention.add(subparsers, common)
    serve.add(subparsers, common)
    quickstart.add(subparsers, common)
    return parser


def main(argv=None) -> int:
    """Run `s2s ARGV` (default: sys.argv); the exit status. An error ends as one line,
    `s2s COMMAND: error: ...`, with its traceback under -v. Output read by a program that
    stops early (`s2s tasks | head`) ends the command quietly, with the status of a process
    that SIGPIPE ended (141)."""
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
    console = logging.StreamHandler()
    console.setFormatter(ConsoleFormat())
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[console])
    try:
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe is found here, not at exit as "Exception ignored"
        return code
    except BrokenPipeError:
        # the reader is gone: no more output, and none at exit when Python flushes stdout
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(f"s2s {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 -- every error ends as one line; -v adds the traceback
        if args.verbose:
            traceback.print_exc()
        message, code = explain(e, args.command)
        print(f"s2s {args.command}: error: {message}", file=sys.stderr)
        return code
