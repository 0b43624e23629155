"""`s2s new-task NAME [--dir D]`: write a task plugin package to start from (`s2s.core.apps.
scaffold`) into D/NAME, and say how to install, check and train it."""

from __future__ import annotations

from pathlib import Path

from .shared import registry_of


def add(subparsers, common) -> None:
    text = "write a new task plugin package (task, preset, tests) that trains out of the box"
    s = subparsers.add_parser("new-task", parents=[common], help=text, description=text)
    s.add_argument("name", help="the task's name: lower-case letters, digits and _")
    s.add_argument(
        "--dir", default=".", metavar="D", help="write the package into D/NAME (default: here)"
    )
    s.set_defaults(func=run)


def run(args) -> int:
    from ..scaffold import new_task

    folder = new_task(args.name, Path(args.dir), registry_of(args).names())
    name = args.name
    print(f"wrote the package of task {name!r} into {folder}")
    print("next:")
    # a path pip reads as a folder: a bare NAME would be looked up on PyPI (someone else's package)
    local = folder if folder.is_absolute() else f"./{folder}"
    print(f"  pip install {local}     # or pip install -e {local}")
    print(f"  s2s check-task {name}_tiny     # the conformance kit")
    print(f"  s2s train {name}_tiny     # a tiny model of the generated data")
    print(f"  without installing: add --plugin {folder / name / 'task.py'} to check-task and train")
    return 0
