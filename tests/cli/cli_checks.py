"""What the command-line fault tests share: a snapshot of what is on disk, a CLI call, and the
check of a clean one-line failure that changed nothing."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from s2s.core.apps.cli import main


def snapshot(*paths: Path) -> dict:
    """sha256 of every file and the name of every folder under `paths` (hidden ones included)."""
    out = {}
    for root in map(Path, paths):
        if root.is_file():
            out[str(root)] = hashlib.sha256(root.read_bytes()).hexdigest()
        elif root.is_dir():
            out[str(root)] = "folder"
            for p in sorted(root.rglob("*")):
                out[str(p)] = (
                    hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
                )
        else:
            out[str(root)] = "missing"
    return out


def s2s(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `s2s ARGV` run in-process."""
    capsys.readouterr()
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def fails(result, before: dict, *needles, code: int = 2) -> str:
    """A clean one-line failure (exit `code`) naming `needles`, with everything on disk unchanged.
    `result`: (exit code, stdout, stderr) of `s2s` in-process, or a finished subprocess."""
    if isinstance(result, subprocess.CompletedProcess):
        got, err = result.returncode, result.stderr.decode("utf-8", "replace")
    else:
        got, _, err = result
    assert "Traceback" not in err, err
    assert got == code, (got, err)
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, err
    for needle in map(str, needles):
        assert needle in errors[0], (needle, errors[0])
    assert snapshot(*before) == before, "a file on disk changed"
    return errors[0]
