"""Fetch corpora ahead of time, or split your own: `python -m s2s.data_recipes ...`.

    python -m s2s.data_recipes multi30k treebank [--dir DIR]
    python -m s2s.data_recipes split corpus.en corpus.de --dir my_data [--valid 500 --test 500]

Without --dir, Multi30k goes to the data cache (~/.cache/s2s/multi30k; S2S_DATA_HOME or
XDG_CACHE_HOME move it) and the treebank sample to NLTK's own download folder (the user's
nltk_data), where the presets find them. With --dir, they go to DIR/multi30k and
DIR/nltk_data, the layout the tests and benchmarks read through S2S_SHARED_DATA=DIR. Each corpus
is fetched on its own: one that fails is reported and the next is fetched; the exit status is 2
when any failed, and a folder that a failed fetch created and left empty is removed.

`split` cuts one parallel corpus (two aligned files named after their languages) into
DIR/{train,valid,test}.{lang}, the files the `own_translation` preset reads (data_recipes.split).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from s2s.core.errors import DataError

from . import multi30k, shared_data, treebank
from .split import split_corpus


def _created(path: Path) -> list[Path]:
    """The folders from `path` up that do not exist yet (the deepest first)."""
    path = Path(path).absolute()
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders (deepest first) a failed fetch created and left empty."""
    for folder in folders:
        try:
            folder.rmdir()  # only an empty folder goes
        except OSError:
            return


def fetch(names: list[str], directory: Path | None) -> int:
    """Fetch each corpus in `names`, going on past one that fails; 2 when any failed, else 0."""
    failed = []
    for name in dict.fromkeys(names):
        target = (
            (directory / ("multi30k" if name == "multi30k" else "nltk_data")) if directory else None
        )
        # the folders a fetch may create (nltk's own download folder aside)
        new = (
            _created(target)
            if target
            else _created(multi30k.default_dir())
            if name == "multi30k" and not shared_data()
            else []
        )
        try:
            where = multi30k.fetch(target) if name == "multi30k" else treebank.fetch_sample(target)
        except DataError as e:
            _remove_empty(new)
            failed.append(name)
            print(f"{name}: error: {e}", file=sys.stderr)
            continue
        except OSError as e:  # a file in the way, a read-only or full disk
            _remove_empty(new)
            failed.append(name)
            print(f"{name}: error: {e.filename or target}: {e.strerror or e}", file=sys.stderr)
            continue
        print(f"{name}: {where}")
    if failed:
        print(
            f"failed: {', '.join(failed)} ({len(failed)} of {len(dict.fromkeys(names))})",
            file=sys.stderr,
        )
    return 2 if failed else 0


def split(argv) -> int:
    p = argparse.ArgumentParser(
        prog="python -m s2s.data_recipes split",
        description="Cut a parallel corpus into DIR/{train,valid,test}.{lang} "
        "(valid and test lines drawn at random with a fixed seed).",
    )
    p.add_argument(
        "source", type=Path, help="the source side, named after its language (corpus.en)"
    )
    p.add_argument("target", type=Path, help="the target side, line by line aligned (corpus.de)")
    p.add_argument(
        "--dir",
        type=Path,
        required=True,
        help="the folder to write (files there are never written over)",
    )
    p.add_argument("--valid", type=int, default=500, help="lines of the dev set (default 500)")
    p.add_argument("--test", type=int, default=500, help="lines of the test set (default 500)")
    p.add_argument("--seed", type=int, default=1, help="which lines are held out (default 1)")
    args = p.parse_args(argv)
    new = _created(args.dir)
    try:
        counts = split_corpus(args.source, args.target, args.dir, args.valid, args.test, args.seed)
    except DataError as e:
        _remove_empty(new)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file in the way, a read-only or full disk: the path, in one line
        _remove_empty(new)
        where = e.filename or args.dir
        print(f"error: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(", ".join(f"{name} {n} lines" for name, n in counts.items()) + f" in {args.dir}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["split"]:
        return split(argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m s2s.data_recipes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("corpora", nargs="+", choices=("multi30k", "treebank"))
    p.add_argument("--dir", type=Path, help="put them under DIR/multi30k and DIR/nltk_data instead")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return fetch(args.corpora, args.dir)


if __name__ == "__main__":
    sys.exit(main())
