"""`s2s tasks`: list the tasks and where each comes from (an entry point or --plugin), then the
presets of tasks/."""

from __future__ import annotations

from ...setup.config import preset_names
from .shared import registry_of


def add(subparsers, common) -> None:
    text = "list the tasks and where they come from (entry point or --plugin), and the presets"
    s = subparsers.add_parser("tasks", parents=[common], help=text, description=text)
    s.set_defaults(func=run)


def run(args) -> int:
    reg = registry_of(args)
    width = max(len(n) for n in reg.names()) if reg.names() else 4
    for name in reg.names():
        print(f"{name:<{width}}  {reg.origin(name)}")

    print(f"\npresets (tasks/): {', '.join(preset_names())}")
    return 0
