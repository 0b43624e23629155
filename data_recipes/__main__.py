"""Fetch corpora ahead of time: `python -m s2s.data_recipes multi30k treebank [--dir DIR]`.

Without --dir, Multi30k goes to the data cache (~/.cache/s2s/multi30k; S2S_DATA_HOME or
XDG_CACHE_HOME move it) and the treebank sample to NLTK's own download folder (the user's
nltk_data), where the presets find them. With --dir, they go to DIR/multi30k and
DIR/nltk_data, the layout the tests and benchmarks read through S2S_SHARED_DATA=DIR.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from s2s.core.errors import DataError

from . import multi30k, treebank


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m s2s.data_recipes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpora", nargs="+", choices=("multi30k", "treebank"))
    p.add_argument("--dir", type=Path, help="put them under DIR/multi30k and DIR/nltk_data instead")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        for name in dict.fromkeys(args.corpora):
            if name == "multi30k":
                where = multi30k.fetch(args.dir / "multi30k" if args.dir else None)
            else:
                where = treebank.fetch_sample(args.dir / "nltk_data" if args.dir else None)
            print(f"{name}: {where}")
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
