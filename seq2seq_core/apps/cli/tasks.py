"""`s2s tasks`: list the tasks and where each comes from (an entry point or --plugin), then the
presets and where each comes from (built in, a plugin's `s2s.presets` entry point, or the
`presets/` folder beside a --plugin file)."""

from __future__ import annotations

from ...setup.config import presets
from .shared import registry_of


def add(subparsers, common) -> None:
    text = "list the tasks and the presets, and where each comes from"
    s = subparsers.add_parser("tasks", parents=[common], help=text, description=text)
    s.set_defaults(func=run)


def run(args) -> int:
    reg = registry_of(args)
    width = max(len(n) for n in reg.names()) if reg.names() else 4
    for name in reg.names():
        print(f"{name:<{width}}  {reg.origin(name)}")

    found = presets(reg)
    width = max(map(len, found), default=4)
    print("\npresets:")
    for name, places in found.items():
        if len(places) == 1:
            print(f"{name:<{width}}  {places[0][1]}")
        else:  # a name two places give: `s2s train NAME` refuses it, naming both
            where = " and ".join(f"{origin} ({path})" for path, origin in places)
            print(f"{name:<{width}}  two places, rename one: {where}")
    return 0
