"""The run directory before training: owned by one training at a time, s2s's own, writable,
with room for the checkpoints."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from ..errors import TrainingError, UsageError
from ..files import RUN_MARK as MARK
from ..files import no_such_run

LOCK = ".lock"


def claim(run_dir: Path):
    """Take `run_dir` for this training and return its lock, held until closed (or the process
    ends, however it ends: the kernel drops a flock with its process, so a killed run leaves
    nothing that blocks the next). A folder that holds files s2s did not write is refused, and
    so is one that another training holds."""
    check_run_dir(run_dir, need_bytes=0)
    ours = (run_dir / MARK).is_file() or (
        (run_dir / "config.yaml").is_file() and (run_dir / "checkpoints").is_dir()
    )
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in (LOCK, MARK))
    if not ours and others:
        raise TrainingError(
            f"run.dir {run_dir} holds files s2s did not write ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}): train in a new or empty folder"
        )
    lock = open(run_dir / LOCK, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise TrainingError(
            f"run.dir {run_dir} is being trained by {holder} (it holds {run_dir / LOCK}); "
            "wait for it to finish or train in another run.dir"
        ) from None
    lock.truncate(0)
    lock.write(f"process {os.getpid()} on {os.uname().nodename}\n")
    lock.flush()
    (run_dir / MARK).touch()
    return lock


def release(run_dir: Path, lock) -> None:
    """Let go of a run directory that `claim` took, as a run that failed before its first file:
    a folder holding nothing but the lock and the mark (one the claim made, or found empty) is
    removed, so a setup error (bad data, say) leaves nothing behind; any other is kept."""
    lock.close()
    left = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else None
    if left is not None and set(left) <= {LOCK, MARK}:
        for name in left:
            (run_dir / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            run_dir.rmdir()


def check_run_dir(run_dir: Path, need_bytes: int) -> None:
    """Fail before training when the run directory is unwritable or the disk too full."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise TrainingError(f"run directory {run_dir} is not writable: {e}") from None
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise TrainingError(
            f"run directory {run_dir}: {free / 2**20:.0f} MiB free, checkpoints "
            f"need about {need_bytes / 2**20:.0f} MiB (run.keep_last + 1 files)"
        )


def run_dir_of(path: str | Path) -> Path:
    """The run directory that `path` (a run directory, or a checkpoint file in one) belongs to."""
    p = Path(path)
    if not p.exists():
        raise no_such_run(p, "run directory or checkpoint file")
    run_dir = p if p.is_dir() else p.parent.parent if p.parent.name == "checkpoints" else p.parent
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(
            f"{p} holds no config.yaml: not a run directory of `s2s train`"
            if run_dir == p
            else f"{p}: not a checkpoint file in a run directory of `s2s train` ({run_dir} holds "
            "no config.yaml)"
        )
    return run_dir
