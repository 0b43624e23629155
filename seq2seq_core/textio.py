"""The one way s2s reads text: lines end at "\\n" only, as the files and sacreBLEU define them.

Python's `str.splitlines` (and text-mode iteration of some streams) also ends a line at \\r,
\\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028 and \\u2029, so one such character inside a sentence
would shift every later line against its reference. Here a file is read as bytes, split at
b"\\n", a trailing "\\r" (Windows line ends) is stripped, and each line is decoded on its own, so
invalid UTF-8 is reported with its file and line. A UTF-8 byte-order mark at the start is dropped.
A file whose lines end in "\r" alone (old Mac line ends: no "\n" at all, a "\r" inside) is a
`DataError` saying so, not one long line.
Files ending in `.gz` are decompressed; a corrupt one is a `DataError` naming the file.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from .errors import DataError


def open_binary(path: str | Path) -> BinaryIO:
    """`path` opened for reading bytes (decompressed when it ends in .gz); errors name the path."""
    path = Path(path)
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"file {path} does not exist") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None


def decode_line(raw: bytes, name: str, number: int) -> str:
    """One line's bytes (without its "\\n") as text; a trailing "\\r" is stripped."""
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{name}, line {number}: invalid UTF-8 (byte {e.start + 1})") from None
    return line.removeprefix("\ufeff") if number == 1 else line


def raw_lines(path: str | Path) -> Iterator[bytes]:
    """The lines of `path` as bytes, without their "\\n"; a last line without one counts."""
    name = str(path)
    with open_binary(path) as f:
        try:
            for number, raw in enumerate(f, 1):  # a binary stream splits at b"\n" only
                if number == 1 and not raw.endswith(b"\n") and b"\r" in raw.rstrip(b"\r"):
                    raise DataError(
                        f"{name}: its lines end in a carriage return alone (CR, old Mac line "
                        "ends), which s2s does not read as line ends (only LF or CRLF): convert "
                        f"it first, e.g. tr '\\r' '\\n' < {name}"
                    )
                yield raw[:-1] if raw.endswith(b"\n") else raw
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{name}: cannot read ({e}): a damaged or truncated file?") from None


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of `path` as text, lazily (see the module docstring)."""
    name = str(path)
    for number, raw in enumerate(raw_lines(path), 1):
        yield decode_line(raw, name, number)


def read_lines(path: str | Path) -> list[str]:
    """All lines of `path` as text."""
    return list(iter_lines(path))


def split_lines(text: str) -> list[str]:
    """Text already in memory, split the same way: at "\\n", a trailing "\\r" stripped."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]
