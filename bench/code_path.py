"""How often one `s2s train` returns to an engine file it had already left, before its first update.

A reader follows the run from `cli.cmd_train`, reading each engine function the first time it is
called. This script records that order with a profile hook (the first call of every function in
seq2seq_core/, in call order, up to the first call of `Trainer.step`), groups consecutive
functions of one file into a stay, and counts the stays in a file that had an earlier stay: the
returns. A file holds one job when its stays are few; the table lists each file's stays and the
functions read in it.

    python -m bench.code_path [PRESET] [key=value ...]       # default: demo, a throw-away run.dir

Writes bench/results/code_path.json.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults, as `s2s train` has them

import inspect
import sys
import tempfile
from pathlib import Path

from bench.common import write

ENGINE = Path(s2s.core.__file__).resolve().parent


class _FirstUpdate(Exception):
    pass


PLUGINS = ENGINE.parent / "plugins"
#: the classes of the plugin interface whose methods a task inherits: what they run is the plugin's
INTERFACE = ("Task.", "WordTokenizer.", "Constraint.")


def _plugin(code) -> bool:
    path = Path(code.co_filename).resolve()
    return path.is_relative_to(PLUGINS) or (
        path.parent == ENGINE and code.co_qualname.startswith(INTERFACE)
    )


def trace(argv: list[str]) -> list[tuple[str, str, bool]]:
    """(file, function, called by the plugin) of every engine function in the order of its first
    call, up to the first update. A function counts as the plugin's when it is a method of the
    plugin interface a task inherits (`Task`, `WordTokenizer`) or runs inside one."""
    from s2s.core.apps import cli

    seen, order = set(), []

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        path = Path(code.co_filename).resolve()
        if path.parent != ENGINE or code in seen:
            return
        # module and class bodies run at import; comprehensions, lambdas and nested functions are
        # read as part of the function that holds them
        if (
            not code.co_flags & inspect.CO_OPTIMIZED
            or code.co_name.startswith("<")
            or "<locals>" in code.co_qualname
        ):
            seen.add(code)
            return
        caller = frame.f_back.f_code if frame.f_back is not None else None
        if caller is not None and not caller.co_flags & inspect.CO_OPTIMIZED:
            return  # called by a module or class body: import-time work, not the run's path
        seen.add(code)
        f, inside = frame, False
        while f is not None and not inside:
            inside, f = _plugin(f.f_code), f.f_back
        order.append((path.name, code.co_qualname, inside))
        if code.co_name == "step" and path.name == "train.py":
            raise _FirstUpdate

    sys.setprofile(hook)
    try:
        cli.main(["train", *argv])
    except _FirstUpdate:
        pass
    finally:
        sys.setprofile(None)
    return order


def stays(order: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for file, fn in order:
        if out and out[-1][0] == file:
            out[-1][1].append(fn)
        else:
            out.append((file, [fn]))
    return out


def main() -> None:
    args = sys.argv[1:] or ["demo"]
    with tempfile.TemporaryDirectory() as tmp:
        argv = [args[0], "-q", f"run.dir={tmp}/run", f"data.cache_dir={tmp}/cache", *args[1:]]
        # the profile hook raises out of cli.main, whose error handler would print it: go round it
        import s2s.core.apps.cli as cli

        explain = cli.explain
        cli.explain = lambda e, command: (_ for _ in ()).throw(e)
        try:
            order = trace(argv)
        finally:
            cli.explain = explain
    result = {
        "command": f"s2s train {' '.join(args)}",
        "measure": "first calls of engine functions (seq2seq_core/), in call order, up to Trainer.step; module "
        "and class bodies (and what they call at import), comprehensions, lambdas and nested "
        "functions belong to what holds them; "
        "a stay: consecutive functions of one file; a return: a stay in a file that had one before",
        "engine": summary([(f, fn) for f, fn, inside in order if not inside]),
        "with_plugin_interface": summary([(f, fn) for f, fn, _ in order]),
    }
    for line in result["engine"]["path"]:
        print(line)
    for key, what in (
        ("engine", "engine path (the plugin's methods left to the plugin)"),
        ("with_plugin_interface", "every engine function, Task and WordTokenizer methods included"),
    ):
        r = result[key]
        print(
            f"{what}: {r['stays']} stays in {r['files']} files, {r['returns']} returns to a file already left"
        )
    write("code_path", result)


def summary(order: list[tuple[str, str]]) -> dict:
    runs = stays(order)
    entered: dict[str, int] = {}
    returns = 0
    for file, _ in runs:
        returns += file in entered
        entered[file] = entered.get(file, 0) + 1
    return {
        "functions": len(order),
        "stays": len(runs),
        "files": len(entered),
        "returns": returns,
        "per_file": {
            f: {
                "stays": n,
                "functions": sorted({fn for file, fns in runs if file == f for fn in fns}),
            }
            for f, n in sorted(entered.items(), key=lambda kv: -kv[1])
        },
        "path": [f"{file}: {', '.join(fns)}" for file, fns in runs],
    }


if __name__ == "__main__":
    main()
