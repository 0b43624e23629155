"""Files written whole or not at all, and their content hashes.

Whatever s2s writes (config, results, checkpoints, vocabularies, outputs) goes through
`replacing`: a temporary name beside the target, fsync, one rename, so that a crash or a full
disk leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import IO, Iterator


def temporary_name(path: Path) -> Path:
    """The name `replacing` writes `path` under until it is complete (hidden, per process)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


@contextlib.contextmanager
def replacing(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file open for writing that replaces `path` when the block ends without error; on an
    error the temporary file is removed and `path` is left as it was."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):  # the rename itself survives a power cut
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole (`replacing`)."""
    with replacing(path) as f:
        f.write(text)


def sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fingerprint(path: str | Path) -> dict:
    """Size, modification time and content hash of a file (what a cache built from it keeps)."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256(path)}
