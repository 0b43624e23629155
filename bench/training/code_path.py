"""How often one `s2s train` returns to an engine file it had already left, before its first update.

A reader follows the run from the `s2s train` command, reading each engine function the first
time it is called. This script records that order with a profile hook (the first call of every
function in seq2seq_core/ and its wings, in call order, up to the first call of `Trainer.step`),
groups consecutive functions of one file into a stay, and counts the stays in a file that had an
earlier stay: the returns. A file holds one job when its stays are few; the table lists each
file's stays and the functions read in it.

    python -m bench.training.code_path [PRESET] [key=value ...]       # default: demo, a throw-away run.dir

Writes bench/training/results/code_path.json.
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
        if not path.is_relative_to(ENGINE) or code in seen:
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
        called_from = Path(caller.co_filename).resolve() if caller is not None else None
        here = str(path.relative_to(ENGINE))
        by_own_file = called_from == path  # read on in the file the reader came back up to
        order.append((here, code.co_qualname, inside, by_own_file))
        if code.co_name == "step" and path.name == "trainer.py":
            raise _FirstUpdate

    sys.setprofile(hook)
    try:
        cli.main(["train", *argv])
    except _FirstUpdate:
        pass
    finally:
        sys.setprofile(None)
    return order


def stays(order: list[tuple]) -> list[tuple[str, list[str], bool]]:
    """(file, functions, entered from its own file) of each run of consecutive first calls in
    one file; `entered from its own file`: the stay's first function was called by a function
    of the same file, i.e. the reader came back up the call stack to the file they were in."""
    out: list[tuple[str, list[str], bool]] = []
    for file, fn, by_own_file in order:
        if out and out[-1][0] == file:
            out[-1][1].append(fn)
        else:
            out.append((file, [fn], by_own_file))
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
        "a stay: consecutive functions of one file; a return: a stay in a file that had one before; "
        "a jump back: a return whose first function was called from another file (not the reader "
        "coming back up the call stack to the file they were reading)",
        "engine": summary([(f, fn, own) for f, fn, inside, own in order if not inside]),
        "with_plugin_interface": summary([(f, fn, own) for f, fn, _, own in order]),
    }
    for line in result["engine"]["path"]:
        print(line)
    for key, what in (
        ("engine", "engine path (the plugin's methods left to the plugin)"),
        ("with_plugin_interface", "every engine function, Task and WordTokenizer methods included"),
    ):
        r = result[key]
        print(
            f"{what}: {r['stays']} stays in {r['files']} files, {r['returns']} returns to a file "
            f"already left, {r['jumps_back']} of them not up the call stack"
        )
    write("code_path", result)


def summary(order: list[tuple[str, str, bool]]) -> dict:
    """returns: stays in a file that had an earlier stay; jumps_back: those of them the reader
    was sent to by a call from another file (not a way back up the call stack)."""
    runs = stays(order)
    entered: dict[str, int] = {}
    returns = jumps_back = 0
    for file, _, by_own_file in runs:
        returns += file in entered
        jumps_back += file in entered and not by_own_file
        entered[file] = entered.get(file, 0) + 1
    return {
        "functions": len(order),
        "stays": len(runs),
        "files": len(entered),
        "returns": returns,
        "jumps_back": jumps_back,
        "per_file": {
            f: {
                "stays": n,
                "functions": sorted({fn for file, fns, _ in runs if file == f for fn in fns}),
            }
            for f, n in sorted(entered.items(), key=lambda kv: -kv[1])
        },
        "path": [f"{file}: {', '.join(fns)}" for file, fns, _ in runs],
    }


if __name__ == "__main__":
    main()
