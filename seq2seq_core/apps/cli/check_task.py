"""`s2s check-task NAME [key=value ...]`: the conformance kit's checks of a task (the ones
`s2s.core.task_checks` gives a plugin's tests), one line each, and a last line counting them;
exit status 1 when one fails. NAME is a task (its defaults, with `task.KEY=VALUE` overrides) or a
preset (its task section): give the task small splits, the kit reads them whole."""

from __future__ import annotations

import time

from ...errors import CheckFailed
from .shared import registry_of


def add(subparsers, common) -> None:
    text = "check a task against the plugin contract (the conformance kit)"
    s = subparsers.add_parser("check-task", parents=[common], help=text, description=text)
    s.add_argument("name", help="a task name, or a preset (name or YAML file) of one task")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. task.train_size=200")
    s.add_argument("--skip", action="append", default=[], metavar="CHECK", help="leave a check out")
    s.add_argument(
        "--only", action="append", metavar="CHECK", help="run this check only (repeatable)"
    )
    s.set_defaults(func=run)


def run(args) -> int:
    from omegaconf import OmegaConf

    from ...contract.conformance import checks_of
    from ...setup.config import load_config, single_task

    registry = registry_of(args)
    if args.name in registry.names():
        cfg = load_config(None, [f"task.name={args.name}", *args.overrides], registry=registry)
    else:
        cfg = single_task(load_config(args.name, args.overrides, registry=registry), args.name)
    name = cfg.task.name
    config = {k: v for k, v in OmegaConf.to_container(cfg.task).items() if k != "name"}
    origin = registry.origin(name)
    plugin = (
        origin.removeprefix("plugin file ").removeprefix("--plugin ")
        if origin.startswith(("plugin file ", "--plugin "))
        else None
    )
    found = checks_of(registry.get(name), config, plugin, args.only, args.skip)
    start, failed, absent = time.perf_counter(), 0, 0
    for check in found:
        try:
            why_not = check()
        except CheckFailed as e:
            failed += 1
            print(f"FAIL  {check.name}: {e}", flush=True)
        else:
            absent += why_not is not None
            print(
                f"n/a   {check.name}: {why_not}" if why_not else f"ok    {check.name}", flush=True
            )
    print(
        f"task {name!r} ({origin}): {len(found) - failed - absent} of {len(found)} checks passed"
        + (f", {absent} not applicable" if absent else "")
        + f" in {time.perf_counter() - start:.1f} s"
    )
    return 1 if failed else 0
