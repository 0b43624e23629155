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


def trace(argv: list[str]) -> list[tuple[str, str]]:
    """(file, function) of every engine function in the order of its first call, up to the first update."""
    from s2s.core import cli

    seen, order = set(), []

    def hook(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        path = Path(code.co_filename)
        if path.parent != ENGINE or code in seen:
            return
        # module and class bodies run at import; comprehensions, lambdas and nested functions are
        # read as part of the function that holds them
        if not code.co_flags & inspect.CO_OPTIMIZED or code.co_name.startswith("<") \
                or "<locals>" in code.co_qualname:
            seen.add(code)
            return
        seen.add(code)
        order.append((path.name, code.co_qualname))
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
        import s2s.core.cli as cli

        explain = cli.explain
        cli.explain = lambda e, command: (_ for _ in ()).throw(e)
        try:
            order = trace(argv)
        finally:
            cli.explain = explain
    runs = stays(order)
    entered: dict[str, int] = {}
    returns = 0
    for file, _ in runs:
        returns += file in entered
        entered[file] = entered.get(file, 0) + 1
    result = {"command": f"s2s train {' '.join(args)}", "functions": len(order), "stays": len(runs),
              "files": len(entered), "returns": returns,
              "per_file": {f: {"stays": n, "functions": sorted({fn for file, fns in runs if file == f for fn in fns})}
                           for f, n in sorted(entered.items(), key=lambda kv: -kv[1])},
              "path": [f"{file}: {', '.join(fns)}" for file, fns in runs]}
    for line in result["path"]:
        print(line)
    print(f"\n{len(runs)} stays in {len(entered)} files, {returns} returns to a file already left")
    write("code_path", result)


if __name__ == "__main__":
    main()
