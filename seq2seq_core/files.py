"""Files written whole or not at all, their content hashes, and the files a piece of code reads.

Whatever s2s writes (config, results, checkpoints, vocabularies, outputs) goes through
`replacing`: a temporary name beside the target, fsync, one rename, so that a crash or a full
disk leaves the old file or the new one, never half of one. The target is what the name stands
for: a symbolic link is followed (its target is replaced, the link stays), and a file that is not
a regular one (a device, a FIFO, /dev/stdout) is written in place, as it goes, never replaced.

`recording` finds every file opened for reading inside it, by whatever reader (`open`, gzip,
numpy, nltk; Python's audit hook sees them all), so the prepared-data cache fingerprints the
files a task's data came from without the task having to list them.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import sys
import sysconfig
from pathlib import Path
from typing import IO, Iterable, Iterator

from .errors import UsageError

_recorders: list[set] = []
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def temporary_name(path: Path) -> Path:
    """The name `replacing` writes `path` under until it is complete (hidden, per process)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


#: names of this process's open files: written through the descriptor, never reopened
_DESCRIPTORS = re.compile(
    r"/dev/(?:std(?P<std>out|err)|fd/(?P<fd>\d+))|/proc/self/fd/(?P<proc>\d+)"
)


def descriptor_of(path: str | Path) -> int | None:
    """The open file descriptor that `path` (or a link it leads through) names, as /dev/stdout,
    /dev/fd/N and /proc/self/fd/N do, or None: writing through it keeps what the shell made of it
    (a pipe, a file opened to append), where opening the name again would truncate a redirected
    file, and replacing it would replace the system's link."""
    if os.name == "nt":
        return None
    name = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on links followed
        m = _DESCRIPTORS.fullmatch(name)
        if m:
            return {"out": 1, "err": 2}[m["std"]] if m["std"] else int(m["fd"] or m["proc"])
        if not os.path.islink(name):
            return None
        name = os.path.abspath(os.path.join(os.path.dirname(name), os.readlink(name)))
    return None


def replaced_file(path: str | Path) -> Path | None:
    """The regular file that writing `path` replaces, links followed (a link's target, which
    may not exist yet), or None when `path` is written in place: a descriptor's name
    (`descriptor_of`), a device, a FIFO, a socket."""
    if descriptor_of(path) is not None:
        return None
    target = Path(os.path.realpath(path))
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return target
    return target if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else None


@contextlib.contextmanager
def _named(tmp: Path, path: str | Path) -> Iterator[None]:
    """An OSError about the temporary file `tmp`, or one of the system's naming no file (a full
    disk while writing), raised as one about `path`, the file the user named: no message names a
    temporary."""
    try:
        yield
    except OSError as e:
        named = e.filename is not None and Path(os.fsdecode(e.filename)) == tmp
        if not named and (e.filename is not None or e.errno is None):
            raise  # about another file, or no error of the system's
        raise OSError(e.errno, e.strerror, str(path)) from None


@contextlib.contextmanager
def replacing(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file open for writing that replaces `path` when the block ends without error; on an
    error the temporary file is removed and `path` is left as it was. A symbolic link is
    followed: its target is replaced (keeping its permissions) and the link stays. A device, a
    FIFO or a descriptor's name (/dev/stdout) is written in place as the block writes."""
    text = {} if "b" in mode else {"encoding": "utf-8"}
    fd = descriptor_of(path)
    target = replaced_file(path)
    if target is None:
        opened = open(os.dup(fd), mode, **text) if fd is not None else open(path, mode, **text)
        with opened as f:
            yield f
        return
    tmp = temporary_name(target)
    try:
        with _named(tmp, path), open(tmp, mode, **text) as f:
            with contextlib.suppress(OSError):  # the replaced file's permissions, not the umask's
                os.chmod(f.fileno(), stat.S_IMODE(target.stat().st_mode))
            yield f
            f.flush()
            os.fsync(f.fileno())
        with _named(tmp, path):
            os.replace(tmp, target)
        with contextlib.suppress(OSError):  # the rename itself survives a power cut
            fd = os.open(target.parent, os.O_RDONLY)
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


def _on_open(event: str, args: tuple) -> None:
    if event != "open" or not _recorders:
        return
    path, _mode, flags = args
    if (
        isinstance(path, int) or (flags or 0) & _WRITING
    ):  # a file descriptor, or a file being written
        return
    for seen in _recorders:
        seen.add(os.fsdecode(path))


def note_input(path: str | Path) -> None:
    """Tell an active `recording()` about a file read through a handle opened before it began."""
    for seen in _recorders:
        seen.add(os.fsdecode(path))


@contextlib.contextmanager
def recording(exclude: Iterable[Path] = ()) -> Iterator[set]:
    """The set of regular files opened for reading inside the block, as resolved paths (filled
    when the block ends): Python's own files (modules, the standard library, installed
    packages) and anything under `exclude` left out."""
    if not hasattr(_on_open, "installed"):
        sys.addaudithook(
            _on_open
        )  # for the life of the process; it returns at once when nothing records
        _on_open.installed = True
    seen: set = set()
    found: set = set()
    _recorders.append(seen)
    try:
        yield found
    finally:
        _recorders.remove(seen)
        skip = [
            Path(p).resolve()
            for p in (
                *exclude,
                sys.prefix,
                sys.base_prefix,
                sys.exec_prefix,
                *sysconfig.get_paths().values(),
            )
        ]
        for name in seen:
            path = Path(name).resolve()
            if (
                path.is_file()
                and path.suffix not in (".py", ".pyc", ".so")
                and not any(path.is_relative_to(s) for s in skip)
            ):
                found.add(str(path))


def fingerprint(path: str | Path) -> dict:
    """Size, modification time and content hash of a file (what a cache built from it keeps)."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256(path)}


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove what killed s2s processes left in `folder`: `.NAME.tmpPID` files (`replacing`) and
    folders (`s2s export`), `.NAME.tmpHOST-PID` folders (the data cache, which machines may
    share: only this machine's), `.write_probePID` files, each only when process PID is gone
    (os.kill(PID, 0) finds none). A temporary of a live process, and anything else, stays.
    Returns what was removed; one that cannot be removed is left (and logged)."""
    import logging
    import re
    import shutil

    import socket

    stale = re.compile(r"\..+\.tmp(?:(?P<host>.*)-)?(?P<pid>\d+)|\.write_probe(?P<probe>\d+)")
    removed: list[Path] = []
    folder = Path(folder)
    if os.name == "nt" or not folder.is_dir():  # os.kill(pid, 0) ends the process on Windows
        return removed
    for path in folder.iterdir():
        m = stale.fullmatch(path.name)
        if not m or m["host"] not in (None, "", socket.gethostname()):
            continue  # not a temporary, or one of another machine, whose processes we cannot see
        pid = int(m["pid"] or m["probe"])
        try:
            if pid <= 0:
                continue
            os.kill(pid, 0)
            continue  # alive (or reused): not ours to remove
        except ProcessLookupError:
            pass
        except OSError:  # PermissionError: a live process of another user
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
            logging.getLogger("s2s").info(
                "removed %s, left by process %d, which is gone", path, pid
            )
        except OSError as e:
            logging.getLogger("s2s").warning("cannot remove the stale temporary %s: %s", path, e)
    return removed


def _file_above(path: Path) -> Path | None:
    """The nearest folder above `path` that is there, when it is a file and no folder (a path
    below a regular file, which no folder can be made at), else None."""
    above = Path(os.path.abspath(path)).parent
    while not above.exists() and above != above.parent:
        above = above.parent
    return above if above.exists() and not above.is_dir() else None


def writable(path: str, option: str = "output") -> None:
    """Fail before any work when the output file cannot be written (what is there stays): the
    file a link leads to, in the folder it lies in; a device or a FIFO in place."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {p} is a directory")
    if descriptor_of(p) is not None:
        return
    target = replaced_file(p)
    if target is None:  # a device, a FIFO: written in place
        if not os.access(p, os.W_OK):
            raise UsageError(f"{option} {p}: not writable")
        return
    parent = target.parent
    if not parent.is_dir():
        blocked = _file_above(target)
        if blocked is not None:
            raise UsageError(f"{option} {p}: {blocked} is a file, not a folder")
        if p.is_symlink():
            raise UsageError(
                f"{option} {p}: the link leads to {target}, whose folder does not exist"
            )
        raise UsageError(f"{option} {p}: folder {p.parent} does not exist")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise UsageError(f"{option} {p}: not writable")


RUN_MARK = ".s2s-run"  # in every run directory s2s trains: the folder is s2s's to write

#: the folders of a run directory that training writes and reads back (no output goes there)
RUN_FOLDERS = ("checkpoints", "tensorboard")


def run_of(path: str | Path) -> Path | None:
    """The run directory `path` lies in (a folder above it that s2s trained in), or None."""
    for folder in Path(path).resolve().parents:
        if (folder / RUN_MARK).is_file() or (
            (folder / "config.yaml").is_file() and (folder / "checkpoints").is_dir()
        ):
            return folder
    return None


def not_a_run_file(path: str, option: str, replaces: Iterable[str] = ()) -> None:
    """Fail before any work when the output `path` is a file a run directory already holds (a
    checkpoint, config.yaml, result.json, a vocabulary, a test output): a command's output
    never replaces what a run owns. A new file in a run directory is allowed, and so is a file
    whose name is in `replaces` (the command's own earlier output there, as RUN_DIR/
    checkpoint_average.pt is `s2s average`'s), links followed."""
    target = replaced_file(path) or Path(path)
    run = run_of(target)
    if run is None or not target.exists():
        return
    if target.name in replaces and target.parent == run:
        return
    raise UsageError(
        f"{option} {path} is a file of run directory {run}: s2s never writes over a run's "
        "files; write the output elsewhere"
    )


def output_file(
    path: str | Path,
    option: str = "--output",
    inputs: Iterable[tuple[str, str | Path | None]] = (),
    replaces: Iterable[str] = (),
) -> None:
    """The one check of a file a command writes, made before any work by every command that
    writes one (generate, rerank, average): it can be written (`writable`: not a folder, not
    below a regular file, in a folder this user may write), it is no file of a run directory
    (`not_a_run_file`, `replaces` aside), and it is none of the command's `inputs`
    ((option, path) pairs; a path may be None), links followed. Each refusal is a UsageError
    naming `option` and the file; what is there stays."""
    writable(str(path), option)
    not_a_run_file(str(path), option, tuple(replaces))
    target = replaced_file(path)
    if target is None or not target.exists():
        return
    for name, given in inputs:
        if given is not None and Path(given).exists() and target.samefile(given):
            raise UsageError(f"{option} {path} is {name}: write the output elsewhere")


def output_folder(path: str | Path, option: str = "--output") -> None:
    """The one check of a folder a command writes files into (label, attention, export, plot,
    sweep), made before any work: not a file, not below one, made (when absent) in a folder this
    user may write, and neither a run directory nor one of its training folders
    (`RUN_FOLDERS`). Which files in it may be replaced is `own_outputs`'s to say."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{option} {folder} is a file, not a folder")
    blocked = _file_above(folder)
    if blocked is not None:
        raise UsageError(f"{option} {folder}: {blocked} is a file, not a folder")
    above = folder
    while not above.exists() and above != above.parent:
        above = above.parent
    if not os.access(above, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {folder}: {above} is not a folder this user can write in")
    if folder.is_dir():
        run = run_of(folder / "x")
        if run == folder.resolve():
            raise UsageError(
                f"{option} {folder} is a run directory: write into a folder of its own"
            )
        if run is not None and folder.resolve().parent == run and folder.name in RUN_FOLDERS:
            raise UsageError(
                f"{option} {folder} is the {folder.name} folder of run directory {run}, which "
                "training writes: write into a folder of its own"
            )


OUTPUTS_MARK = ".s2s-outputs"  # in a folder s2s writes named files into: the names it wrote


def own_outputs(folder: str | Path, names, option: str) -> None:
    """Fail before any work when writing the files `names` into `folder` would replace a file
    that s2s did not write there (one not listed in the folder's OUTPUTS_MARK): a command's
    output replaces only its own earlier output, never a file of the user's. A folder that is a
    run directory's own (its plots) is s2s's."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    if run_of(folder / "x") == folder.resolve():
        raise UsageError(f"{option} {folder} is a run directory: write into a folder of its own")
    if folder.name == "plots" and run_of(folder) == folder.resolve().parent:
        return  # RUN_DIR/plots: s2s plot's own folder in a run
    mark = folder / OUTPUTS_MARK
    ours = set(mark.read_text(encoding="utf-8").splitlines()) if mark.is_file() else set()
    for name in names:
        if (folder / name).exists() and name not in ours:
            raise UsageError(
                f"{option} {folder}: {name} is there and s2s did not write it; write into an "
                "empty folder or one holding only s2s's earlier output"
            )


def record_outputs(folder: str | Path, names) -> None:
    """Add `names` to the files s2s wrote into `folder` (`own_outputs`)."""
    mark = Path(folder) / OUTPUTS_MARK
    ours = set(mark.read_text(encoding="utf-8").splitlines()) if mark.is_file() else set()
    atomic_write_text(mark, "".join(f"{n}\n" for n in sorted(ours | set(map(str, names)))))


def readable(path: str) -> None:
    """Fail before any work when the input file cannot be read."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"input {p}: {'is a directory' if p.is_dir() else 'no such file'}")
    if not os.access(p, os.R_OK):
        raise UsageError(f"input {p}: not readable")


def no_such_run(path: str | Path, what: str = "run directory") -> UsageError:
    """The error for a run directory that is not there, with the nearest of its would-be
    siblings that is one (`runs/demoo`: did you mean runs/demo?)."""
    import difflib

    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    runs = (
        [p.name for p in parent.iterdir() if (p / "config.yaml").is_file()]
        if parent.is_dir()
        else []
    )
    near = difflib.get_close_matches(path.name, runs, n=1)
    hint = f" (did you mean {parent / near[0]}?)" if near else ""
    return UsageError(f"{path}: no such {what}{hint}")
