"""One parallel corpus (two aligned files) cut into train, valid and test files.

`python -m s2s.data_recipes split corpus.en corpus.de --dir my_data` writes
`my_data/{train,valid,test}.{en,de}`, the names the `own_translation` preset reads. The language
of each file is its last suffix (`corpus.en` -> en). `valid` and `test` lines (500 each unless
told) are drawn at random with a fixed seed, so that a corpus ordered by document or by length
gives held-out sets like the rest; each split keeps the corpus order. The files are streamed,
never held whole; the line counts of the two files are compared before anything is written, and
files already in `--dir` are never written over.
"""

from __future__ import annotations

import random
from contextlib import ExitStack
from pathlib import Path

from s2s.core import textio
from s2s.core.errors import DataError
from s2s.core.files import replacing

from .parallel_text import aligned_lines

SPLITS = ("train", "valid", "test")


def language(path: Path) -> str:
    """The language code a corpus file's name ends in: corpus.en -> en (corpus.en.gz too)."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    lang = Path(name).suffix.lstrip(".")
    if not lang:
        raise DataError(
            f"{path}: name the file after its language, e.g. corpus.en (the suffix is the language code)"
        )
    return lang


def split_corpus(
    source: str | Path,
    target: str | Path,
    directory: str | Path,
    valid: int = 500,
    test: int = 500,
    seed: int = 1,
) -> dict[str, int]:
    """Write DIRECTORY/{train,valid,test}.{src,tgt}; returns the lines of each split."""
    source, target, directory = Path(source), Path(target), Path(directory)
    langs = language(source), language(target)
    if langs[0] == langs[1]:
        raise DataError(
            f"{source} and {target} both end in .{langs[0]}: name each file after its language"
        )
    n = aligned_lines(source, target)
    if valid < 0 or test < 0 or valid + test >= n:
        raise DataError(
            f"{source} has {n} lines: too few for {valid} valid and {test} test lines and some to train on"
        )
    outputs = {(split, lang): directory / f"{split}.{lang}" for split in SPLITS for lang in langs}
    taken = [str(p) for p in outputs.values() if p.exists()]
    if taken:
        raise DataError(
            f"{taken[0]} exists already: split into an empty folder (nothing is written over)"
        )
    held = random.Random(seed).sample(range(n), valid + test)
    which = dict.fromkeys(held[:valid], "valid") | dict.fromkeys(held[valid:], "test")
    counts = dict.fromkeys(SPLITS, 0)
    directory.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        out = {key: stack.enter_context(replacing(path)) for key, path in outputs.items()}
        for i, (s, t) in enumerate(zip(textio.iter_lines(source), textio.iter_lines(target))):
            split = which.get(i, "train")
            out[split, langs[0]].write(s + "\n")
            out[split, langs[1]].write(t + "\n")
            counts[split] += 1
    return counts
