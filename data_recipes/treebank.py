"""Penn Treebank trees for constituency parsing, read and preprocessed as parsing papers do.

Three sources, each yielding `nltk.Tree`s:

* `wsj_trees`: the user's own WSJ part of the Penn Treebank (LDC99T42), laid out as
  `<root>/parsed/mrg/wsj/00 .. 24/wsj_NNNN.mrg`; files are found and opened with nltk's
  `BracketParseCorpusReader`. The standard split: sections 02-21 train, 22 dev, 23 test.
* `sample_trees`: the NLTK 10% sample (`nltk.corpus.treebank`, files wsj_0001 .. wsj_0199)
  from a given nltk_data directory, or from the user's nltk_data, where it is fetched once with
  `nltk.download("treebank")` when absent; with this fixed split by file:
  wsj_0001-0179 train (3,669 trees), wsj_0180-0189 valid (127), wsj_0190-0199 test (118).
* `line_trees`: a file with one bracketed tree per line (e.g. silver trees, or gold.txt files
  in the form EVALB reads).

Malformed input (unbalanced brackets, a file without trees, a word beside phrases) raises
`DataError` naming the file and line; with `skip_malformed` the tree is skipped and counted in
a `ReadStats`. Tree boundaries follow nltk's reader: a tree starts at a line that begins with
"(", so a tree left open is reported without swallowing the trees after it.

`preprocess` applies the steps of `Preprocessing`, each a setting:
remove empty elements (-NONE-) and the phrases they leave empty; strip function tags and
co-indices (NP-SBJ-1 -> NP, PP-LOC=2 -> PP; labels starting with "-" such as -LRB- are kept);
give every tree the root bracket EVALB expects (`TOP`, which EVALB ignores).
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from nltk.tree import Tree
from s2s.core import files
from s2s.core import textio
from s2s.core.errors import DataError

WSJ_SPLIT = {"train": "02-21", "valid": "22", "test": "23"}
SAMPLE_SPLIT = {"train": (1, 179), "valid": (180, 189), "test": (190, 199)}
EMPTY_TAG = "-NONE-"

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_FUNCTION_TAG = re.compile(r"[-=]")


@dataclass(frozen=True)
class Preprocessing:
    remove_empty: bool = True  # drop -NONE- pre-terminals and phrases left without words
    strip_functions: bool = True  # NP-SBJ-1 -> NP (POS tags too; -LRB- / -RRB- kept)
    root_label: str = "TOP"  # label of the root bracket; "" = no wrapper (bare tree)


@dataclass
class ReadStats:
    """What reading skipped: malformed trees (with skip_malformed) and trees left empty."""

    malformed: int = 0
    empty: int = 0
    messages: list[str] = field(default_factory=list)

    def note(self, message: str, empty: bool = False) -> None:
        if empty:
            self.empty += 1
        else:
            self.malformed += 1
        if len(self.messages) < 20:
            self.messages.append(message)


# -- reading ----------------------------------------------------------------------------------
class _Malformed(Exception):
    def __init__(self, line: int, why: str):
        super().__init__(why)
        self.line, self.why = line, why


# Trees are read and preprocessed as light (label, children) pairs, words as str, and become
# nltk.Trees once at the end: building nltk.Trees node by node at every step is slow.
def _build(tokens: list[tuple[str, int]]) -> tuple:
    """A (label, children) tree from the tokens of one balanced bracketed expression."""
    stack: list[tuple[str, list, int]] = []
    root = None
    skip = False
    for i, (tok, line) in enumerate(tokens):
        if skip:
            skip = False
        elif tok == "(":
            label = ""
            if i + 1 < len(tokens) and tokens[i + 1][0] not in ("(", ")"):
                label, skip = tokens[i + 1][0], True
            stack.append((label, [], line))
        elif tok == ")":
            label, children, start = stack.pop()
            if not children:
                raise _Malformed(start, f"empty bracket ({label})")
            if len(children) > 1 and any(isinstance(c, str) for c in children):
                word = next(c for c in children if isinstance(c, str))
                raise _Malformed(start, f"word {word!r} beside other children in ({label} ...)")
            if stack:
                stack[-1][1].append((label, children))
            else:
                root = (label, children)
        else:
            stack[-1][1].append(tok)
    return root


def _rebuild(root, children, rebuild, leaf=lambda x: isinstance(x, str)):
    """`rebuild(node, results of its children)` bottom-up, without recursion (trees may be deep):
    leaves (words) are passed to `rebuild` as they are."""
    stack = [(root, iter(children(root)), [])]
    while True:
        node, todo, done = stack[-1]
        for child in todo:
            if leaf(child):
                done.append(child)
            else:
                stack.append((child, iter(children(child)), []))
                break
        else:
            stack.pop()
            value = rebuild(node, done)
            if not stack:
                return value
            stack[-1][2].append(value)


def _to_nltk(node) -> Tree:
    return _rebuild(node, lambda n: n[1], lambda n, kids: Tree(n[0], kids))


def _from_nltk(tree: Tree) -> tuple:
    return _rebuild(tree, list, lambda t, kids: (t.label(), kids))


def split_trees(lines: Iterable[str]) -> Iterator[tuple[int, tuple | _Malformed]]:
    """(first line, tree) for each bracketed tree, or (line, _Malformed) for a bad one."""
    tokens: list[tuple[str, int]] = []
    depth, start = 0, 0
    for lineno, line in enumerate(lines, 1):
        if depth and line.startswith("("):
            yield (
                start,
                _Malformed(
                    start,
                    f"tree opened on line {start} is not closed "
                    f"before the next tree on line {lineno}",
                ),
            )
            tokens, depth = [], 0
        for tok in _TOKEN.findall(line):
            if depth == 0:
                if tok == ")":
                    yield lineno, _Malformed(lineno, "closing bracket outside any tree")
                    continue
                if tok != "(":
                    yield lineno, _Malformed(lineno, f"text {tok!r} outside any tree")
                    continue
                start, tokens = lineno, []
            tokens.append((tok, lineno))
            if tok == "(":
                depth += 1
            elif tok == ")":
                depth -= 1
                if depth == 0:
                    try:
                        yield start, _build(tokens)
                    except _Malformed as e:
                        yield e.line, e
    if depth:
        yield (
            start,
            _Malformed(
                start,
                f"tree opened on line {start} is never closed ({depth} closing bracket(s) missing)",
            ),
        )


def _read(
    lines: Iterable[str], name: str, skip_malformed: bool, stats: ReadStats
) -> Iterator[tuple]:
    """The trees of one file as (label, children) tuples."""
    return (tree for _, tree in _read_numbered(lines, name, skip_malformed, stats))


def _read_numbered(
    lines: Iterable[str], name: str, skip_malformed: bool, stats: ReadStats
) -> Iterator[tuple[int, tuple]]:
    """(the line a tree starts on, the tree) for each tree of one file."""
    found = bad = 0
    for line, item in split_trees(lines):
        if isinstance(item, _Malformed):
            bad += 1
            message = f"{name}, line {line}: malformed tree: {item.why}"
            if not skip_malformed:
                raise DataError(message + " (task.skip_malformed=true skips such trees)")
            stats.note(message)
            continue
        found += 1
        yield line, item
    if not found and not bad:
        message = f"{name}: no trees in the file (empty file?)"
        if not skip_malformed:
            raise DataError(message)
        stats.note(message)


def read_trees(
    lines: Iterable[str], name: str, skip_malformed: bool = False, stats: ReadStats | None = None
) -> Iterator[Tree]:
    """The trees of one file (`lines` its text, `name` for messages), raw as written."""
    stats = stats if stats is not None else ReadStats()
    return map(_to_nltk, _read(lines, name, skip_malformed, stats))


# -- preprocessing ----------------------------------------------------------------------------
class EmptyLabel(ValueError):
    """A label that is nothing but function tags (`=2`): stripping them leaves no label."""


def strip_label(label: str) -> str:
    """NP-SBJ-1 -> NP, NP=2 -> NP; a label that starts with '-' (-LRB-, -NONE-) is kept; a
    label that stripping would leave empty (`=2`) is an EmptyLabel."""
    if label.startswith("-"):
        return label
    m = _FUNCTION_TAG.search(label)
    stripped = label[: m.start()] if m else label
    if label and not stripped:
        raise EmptyLabel(label)
    return stripped


def _is_preterminal(node) -> bool:
    return len(node[1]) == 1 and isinstance(node[1][0], str)


def _remove_empty(node):
    def keep(n, kids):
        kids = [k for k in kids if k is not None]
        return None if not kids or (n[0] == EMPTY_TAG and _is_preterminal(n)) else (n[0], kids)

    return _rebuild(node, lambda n: n[1], keep)


def _strip(node):
    return _rebuild(node, lambda n: n[1], lambda n, kids: (strip_label(n[0]), kids))


def _preprocess(tree, prep: Preprocessing):
    if prep.remove_empty:
        tree = _remove_empty(tree)
        if tree is None:
            return None
    if prep.strip_functions:
        tree = _strip(tree)
    label, children = tree
    if label == "":  # the blank outer bracket of the treebank files
        if prep.root_label:
            tree = (prep.root_label, children)
        elif len(children) == 1 and not _is_preterminal(tree):
            tree = children[0]
    elif prep.root_label and label != prep.root_label:
        tree = (prep.root_label, [tree])
    return tree


def preprocess(tree: Tree, prep: Preprocessing = Preprocessing()) -> Tree | None:
    """The tree as parsers train and are evaluated on it; None when no word is left."""
    out = _preprocess(_from_nltk(tree), prep)
    return None if out is None else _to_nltk(out)


def _trees(
    lines: Iterable[str],
    name: str,
    prep: Preprocessing | None,
    skip_malformed: bool,
    stats: ReadStats,
) -> Iterator[Tree]:
    for line, tree in _read_numbered(lines, name, skip_malformed, stats):
        if prep is not None:
            try:
                tree = _preprocess(tree, prep)
            except EmptyLabel as e:
                raise DataError(
                    f"{name}, line {line}: the label {e} is empty once its function tags are "
                    "stripped (task.strip_functions)"
                ) from None
            if tree is None:
                stats.note(f"{name}: a tree has no words after preprocessing", empty=True)
                continue
        yield _to_nltk(tree)


# -- sources ----------------------------------------------------------------------------------
def sections(spec: str) -> list[str]:
    """'02-21' -> ['02', ..., '21']; '22' -> ['22']; '02-05,07' -> ['02', ..., '05', '07']."""
    out = []
    for part in str(spec).split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise DataError(f"bad WSJ section range {spec!r}: use e.g. '02-21' or '22'") from None
        out += [f"{s:02d}" for s in range(a, b + 1)]
    return out


def wsj_dir(root: str | Path) -> Path:
    """The directory holding sections 00..24: <root>/parsed/mrg/wsj, or root itself."""
    if not str(root):
        raise DataError(
            "no WSJ treebank given: set task.wsj_root to your LDC99T42 copy "
            "(the directory holding parsed/mrg/wsj/00 .. 24)"
        )
    root = Path(root).expanduser()
    for candidate in (
        root / "parsed" / "mrg" / "wsj",
        root / "treebank_3" / "parsed" / "mrg" / "wsj",
        root,
    ):
        if (candidate / "00").is_dir() or any(candidate.glob("[0-2][0-9]")):
            return candidate
    raise DataError(
        f"{root}: no WSJ sections found; expected {root}/parsed/mrg/wsj/00 .. 24 "
        "with .mrg files (LDC99T42 layout)"
    )


def wsj_trees(
    root: str | Path,
    section_spec: str,
    prep: Preprocessing | None = Preprocessing(),
    skip_malformed: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[Tree]:
    """Trees of the given WSJ sections (e.g. '02-21'), file by file in section order."""
    from nltk.corpus.reader import BracketParseCorpusReader

    stats = stats if stats is not None else ReadStats()
    base = wsj_dir(root)
    wanted = sections(section_spec)
    for s in wanted:
        if not (base / s).is_dir():
            raise DataError(f"{base / s}: WSJ section {s} is missing")
    _allow(base)
    reader = BracketParseCorpusReader(str(base), r"\d\d/wsj_\d{4}\.mrg", encoding="utf8")
    ids = [f for f in reader.fileids() if f[:2] in wanted]
    for s in wanted:
        if not any(f[:2] == s for f in ids):
            raise DataError(f"{base / s}: no wsj_NNNN.mrg files in WSJ section {s}")
    for fid in ids:
        name = str(reader.abspath(fid))
        try:
            stream = reader.open(fid)
            try:
                text = stream.read()
            finally:
                stream.close()
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{name}: cannot read: {e}") from None
        yield from _trees(textio.split_lines(text), name, prep, skip_malformed, stats)


def _allow(directory: Path) -> None:
    """Let nltk's readers open files under `directory`: recent nltk releases read only below
    the entries of nltk.data.path (its path sandbox), so the configured directory is added."""
    import nltk

    if str(directory) not in nltk.data.path:
        nltk.data.path.append(str(directory))


SAMPLE_RESOURCE = "corpora/treebank/combined/"
FETCH_COMMAND = "python -m s2s.data_recipes treebank"


def fetch_sample(download_dir: str | Path | None = None) -> Path:
    """`nltk.download("treebank")` into `download_dir` (default: NLTK's choice, the user's
    nltk_data); returns the directory it went to. S2S_NLTK_INDEX_URL replaces NLTK's data index
    (a mirror, or a local server in the tests)."""
    from nltk.downloader import Downloader

    downloader = Downloader(server_index_url=os.environ.get("S2S_NLTK_INDEX_URL") or None)
    directory = str(Path(download_dir).expanduser()) if download_dir else downloader.download_dir
    try:  # nltk prints its errors too; the DataError below carries them
        ok = downloader.download(
            "treebank",
            download_dir=directory,
            quiet=True,
            raise_on_error=True,
            print_error_to=io.StringIO(),
        )
    except Exception as e:  # offline, a refused or broken index or archive: nltk raises many kinds
        raise DataError(
            f"nltk.download('treebank') into {directory} failed: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if not ok:
        raise DataError(f"nltk.download('treebank') into {directory} failed")
    return Path(directory)


def sample_reader(nltk_data: str | Path | None = None):
    """`nltk.corpus.treebank` (a BracketParseCorpusReader) read from `nltk_data`.

    Given a directory, the sample is read from there and nowhere else (an NLTK_DATA in the
    user's environment cannot substitute another copy). Without one it is looked up where NLTK
    looks (nltk.data.path: the user's nltk_data, NLTK_DATA) and, when absent, downloaded there
    once with `fetch_sample`. With S2S_SHARED_DATA=DIR set and no directory given, DIR/nltk_data is
    that directory.
    """
    import nltk
    from nltk.corpus.reader import BracketParseCorpusReader

    from . import shared_data

    if not nltk_data and shared_data():  # S2S_SHARED_DATA: the copy there, never a download
        nltk_data = shared_data() / "nltk_data"
    if nltk_data:
        directory = str(Path(nltk_data).expanduser())
        _allow(directory)
        try:
            root = nltk.data.find(SAMPLE_RESOURCE, paths=[directory])
        except LookupError:
            raise DataError(
                f"{directory}: the NLTK Penn Treebank sample (corpora/treebank.zip) is not "
                "there; set task.nltk_data to the directory holding corpora/treebank.zip, or "
                f"leave it empty to fetch it (`{FETCH_COMMAND}`)"
            ) from None
    else:
        try:
            root = nltk.data.find(SAMPLE_RESOURCE)
        except LookupError:
            try:
                _allow(fetch_sample())
                root = nltk.data.find(SAMPLE_RESOURCE)
            except (DataError, LookupError) as e:
                raise DataError(
                    f"the NLTK Penn Treebank sample is not in nltk_data and could not be "
                    f"fetched ({e}); run `{FETCH_COMMAND}` where there is network access, "
                    "or set task.nltk_data to a directory holding corpora/treebank.zip"
                ) from None
    return BracketParseCorpusReader(root, r"wsj_.*\.mrg", tagset="wsj", encoding="ascii")


def sample_files(split: str) -> list[str]:
    if split not in SAMPLE_SPLIT:
        raise DataError(
            f"unknown split {split!r} of the NLTK sample; known: {', '.join(SAMPLE_SPLIT)}"
        )
    lo, hi = SAMPLE_SPLIT[split]
    return [f"wsj_{i:04d}.mrg" for i in range(lo, hi + 1)]


def sample_trees(
    nltk_data: str | Path | None,
    split: str,
    prep: Preprocessing | None = Preprocessing(),
    skip_malformed: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[Tree]:
    """Trees of one split of the NLTK sample (see SAMPLE_SPLIT), in file order."""
    stats = stats if stats is not None else ReadStats()
    reader = sample_reader(nltk_data)
    present = set(reader.fileids())
    for fid in sample_files(split):
        name = str(reader.abspath(fid))
        if fid not in present:
            raise DataError(f"{name}: missing from the NLTK treebank sample")
        text = reader.open(fid).read()
        archive = getattr(reader.root, "zipfile", None)  # the sample usually stays in its .zip
        files.note_input(archive.filename if archive is not None else name)
        yield from _trees(textio.split_lines(text), name, prep, skip_malformed, stats)


def line_trees(
    path: str | Path,
    prep: Preprocessing | None = Preprocessing(),
    skip_malformed: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[Tree]:
    """Trees of a file with one bracketed tree per line (blank lines are ignored)."""
    stats = stats if stats is not None else ReadStats()
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path}: no such tree file")
    yield from _trees(textio.iter_lines(path), str(path), prep, skip_malformed, stats)


def leaves(tree: Tree) -> list[str]:
    """The words of `tree` left to right, without recursion (nltk's Tree.leaves recurses)."""
    words: list[str] = []
    stack = [iter([tree])]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
        elif isinstance(child, str):
            words.append(child)
        else:
            stack.append(iter(child))
    return words


def depth(tree: Tree) -> int:
    """The number of brackets on the longest path from the root to a word (a word alone: 0)."""
    deepest, stack = 0, [(tree, 0)]
    while stack:
        node, above = stack.pop()
        if not isinstance(node, str):
            deepest = max(deepest, above + 1)
            stack.extend((child, above + 1) for child in node)
    return deepest


def to_string(tree: Tree) -> str:
    """One line, "(TOP (S (NP (DT The) (NN dog)) ...))", the form EVALB reads (any depth)."""
    if isinstance(tree, str):
        return tree
    parts = ["(", tree.label()]
    stack = [iter(tree)]
    while stack:
        child = next(stack[-1], None)
        if child is None:
            stack.pop()
            parts.append(")")
        elif isinstance(child, str):
            parts += [" ", child]
        else:
            parts += [" (", child.label()]
            stack.append(iter(child))
    return "".join(parts)
