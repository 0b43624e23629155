"""Plain parallel text: one file per language per split, `{prefix}.{lang}` (plain or gzipped).

Line i of the source file translates line i of the target file. Files are read through
`s2s.core.textio` (lines end at "\n" only; a bad byte is reported with its file and line); the
line counts of the two files are compared before the first pair is yielded, so a misaligned corpus
fails before any work is done. Surrounding whitespace is stripped; pairs with an empty side are
dropped and counted (or kept, when `drop_empty` is off).
"""

from __future__ import annotations

import logging
import zlib
from pathlib import Path
from typing import Iterator

from s2s.core import textio
from s2s.core.errors import DataError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def find_file(data_dir: str | Path, prefix: str, lang: str) -> Path:
    """`{data_dir}/{prefix}.{lang}`, or the same name with `.gz`; the plain file wins."""
    plain = Path(data_dir) / f"{prefix}.{lang}"
    for path in (plain, plain.with_name(plain.name + ".gz")):
        if path.is_file():
            return path
    raise DataError(f"file {plain} does not exist (nor {plain.name}.gz)")


def count_lines(path: Path) -> int:
    """Lines in `path` (a last line without a newline counts), read in 1 MiB chunks."""
    lines, last = 0, b"\n"
    with textio.open_binary(path) as f:
        try:
            while chunk := f.read(_CHUNK):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{path}: cannot read ({e}): a damaged or truncated file?") from None
    return lines + (last != b"\n")


def read_parallel(
    src: str | Path, tgt: str | Path, drop_empty: bool = True
) -> Iterator[tuple[str, str]]:
    """Yield the (source, target) pairs of two aligned files, lazily.

    Raises `DataError` at once when a file is missing or the line counts differ (naming both
    files and both counts), and while iterating at the first line that is not UTF-8.
    """
    src, tgt = Path(src), Path(tgt)
    if aligned_lines(src, tgt) == 0:
        raise DataError(f"parallel files {src} and {tgt} are empty")
    return _pairs(src, tgt, drop_empty)


def aligned_lines(src: Path, tgt: Path) -> int:
    """The line count of two parallel files; a DataError when one is missing or the counts differ."""
    for path in (src, tgt):
        if not path.is_file():
            raise DataError(f"file {path} does not exist")
    n_src, n_tgt = count_lines(src), count_lines(tgt)
    if n_src != n_tgt:
        raise DataError(
            f"parallel files differ in length: {src} has {n_src} lines, {tgt} has {n_tgt}"
        )
    return n_src


def _pairs(src: Path, tgt: Path, drop_empty: bool) -> Iterator[tuple[str, str]]:
    dropped = 0
    for s, t in zip(textio.iter_lines(src), textio.iter_lines(tgt)):
        s, t = s.strip(), t.strip()
        if drop_empty and not (s and t):
            dropped += 1
            continue
        yield s, t
    if dropped:
        log.warning("%s / %s: dropped %d pairs with an empty side", src, tgt, dropped)


def read_split(
    data_dir: str | Path, prefix: str, src_lang: str, tgt_lang: str, drop_empty: bool = True
) -> Iterator[tuple[str, str]]:
    """The pairs of `{data_dir}/{prefix}.{src_lang}` and `.{tgt_lang}` (either may be gzipped)."""
    return read_parallel(
        find_file(data_dir, prefix, src_lang), find_file(data_dir, prefix, tgt_lang), drop_empty
    )
