"""Prepared data: ids binarised into memory-mapped files (batched by `s2s.core.data.batches`).

`prepare_data` reads each split through the task, trains its vocabulary on the training pairs,
encodes the pairs in chunks and appends the ids to flat int32 files; only the per-pair lengths
are held in memory (8 bytes a pair), so a corpus of tens of millions of pairs never sits in
Python lists. The result is cached under a key derived from the task section and the length
filters, and written to a temporary folder renamed into place once complete.

The cache cannot lie: its manifest (`prepared.json`) holds the SHA-256 of every file in it and the
fingerprint (size, mtime, content hash) of every file the task read while preparing, by any reader
(`s2s.core.files.recording`). Both are checked when the cache is opened; a damaged cache, or one
whose inputs changed since, is rebuilt with a message saying why. Temporary folders left by killed
runs on this machine are removed.

One process of a machine builds a missing cache (holding a lock file beside it), the others wait
and read it: without shared storage each node's processes would all build it at once.

`token_batches` groups pairs of similar length so that a batch holds about `max_tokens` source
and `max_tokens` target tokens, padding included (section 5.1: "sentence pairs were batched
together by approximate sequence length").
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import logging
import os
import shutil
import socket
import weakref
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from .. import files
from . import textio
from ..errors import DataError, plugin_error
from ..files import atomic_write_text
from ..contract.task import Task
from ..contract.vocab import BOS, EOS, PAD, SPECIALS

log = logging.getLogger("s2s")
CHUNK = 20_000  # pairs encoded per call to the tokenizer
FORMAT = 2  # bump when the on-disk layout changes
MANIFEST = "prepared.json"


def cache_key(task: Task, data_cfg) -> str:
    spec = {
        "format": FORMAT,
        "task": task.name,
        "cfg": OmegaConf.to_container(task.cfg, resolve=True)
        if OmegaConf.is_config(task.cfg)
        else task.cfg,
        "max_len": data_cfg.max_len,
        "max_len_ratio": data_cfg.max_len_ratio,
    }
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Split:
    """One binarised split: ids of pair i are at src_off[i]:src_off[i+1] of the int32 file open
    as `src` (they end with EOS), likewise for tgt.

    The id files stay open from `load` on, and ids are read through these descriptors, never
    by name: a cache rebuilt meanwhile (by another `s2s prepare`) is switched in beside them,
    and what a reader loaded stays what it reads."""

    src: int  # file descriptors of {name}.src.bin / {name}.tgt.bin
    tgt: int
    src_off: np.ndarray
    tgt_off: np.ndarray

    @classmethod
    def load(cls, directory: Path, name: str) -> "Split":
        fds = [os.open(directory / f"{name}.{side}.bin", os.O_RDONLY) for side in ("src", "tgt")]
        split = cls(
            *fds,
            np.load(directory / f"{name}.src.off.npy"),
            np.load(directory / f"{name}.tgt.off.npy"),
        )
        for fd in fds:
            weakref.finalize(split, os.close, fd)  # closed with the split
        return split

    def __len__(self) -> int:
        return len(self.src_off) - 1

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_off)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_off)

    def batch(self, indices: Sequence[int]) -> dict:
        """Padded tensors: src [B,S] (ids+EOS), tgt_in [B,T] (BOS+ids), tgt_out [B,T] (ids+EOS)."""
        srcs, tgts = _read(self.src, self.src_off, indices), _read(self.tgt, self.tgt_off, indices)
        B, S, T = len(indices), max(len(s) for s in srcs), max(len(t) for t in tgts)
        src = np.full((B, S), PAD, dtype=np.int64)
        tgt_in = np.full((B, T), PAD, dtype=np.int64)
        tgt_out = np.full((B, T), PAD, dtype=np.int64)
        for b, (s, t) in enumerate(zip(srcs, tgts)):
            src[b, : len(s)] = s
            tgt_out[b, : len(t)] = t
            tgt_in[b, 0] = BOS
            tgt_in[b, 1 : len(t)] = t[:-1]
        ntokens = int(sum(len(t) for t in tgts))
        return {
            "src": torch.from_numpy(src),
            "tgt_in": torch.from_numpy(tgt_in),
            "tgt_out": torch.from_numpy(tgt_out),
            "ntokens": ntokens,
        }


def _read(fd: int, off: np.ndarray, indices: Sequence[int]) -> list[np.ndarray]:
    """The int32 ids off[i]:off[i+1] of the file open as `fd`, for each i: read, not mapped
    (mapped pages count in the process's RSS, so an epoch of random batches would end up
    holding the whole corpus)."""
    return [
        np.frombuffer(os.pread(fd, 4 * int(off[i + 1] - off[i]), 4 * int(off[i])), np.int32)
        for i in indices
    ]


@dataclass
class Prepared:
    """A task's prepared splits, and the text of its evaluation splits, as they were when opened."""

    directory: Path
    splits: dict  # name -> Split
    pairs: dict  # name -> number of pairs
    _texts: dict = field(default_factory=dict)

    @classmethod
    def open(
        cls, directory: Path, names: Sequence[str], fit: tuple[int, bool] | None = None
    ) -> "Prepared":
        """The splits `names` in `directory`; with `fit` (model.max_positions, whether each source
        gets a task token), a dev or test pair too long for the model fails now, naming its line."""
        splits = {s: Split.load(directory, s) for s in names}
        for name, split in splits.items():
            if fit is None or name == "train":  # training pairs are filtered by data.max_len
                continue
            positions, extra = fit
            too_long = np.flatnonzero(
                np.maximum(split.src_lens + extra, split.tgt_lens) > positions
            )
            if len(too_long):
                i = int(too_long[0])
                source = textio.read_lines(directory / f"{name}.src.txt")[i]
                shown = source if len(source) <= 60 else source[:57] + "..."
                raise DataError(
                    f"{name} split, the pair {shown!r} (line {i + 1} of the prepared copy "
                    f"{directory / f'{name}.src.txt'}): "
                    f"{int(split.src_lens[i]) + extra} source / {int(split.tgt_lens[i])} target "
                    "tokens (with </s>"
                    f"{' and the task token' if extra else ''}) do not fit "
                    f"model.max_positions={positions} "
                    f"({len(too_long)} such pair(s) in {name}); raise model.max_positions or "
                    "shorten them"
                )
        pairs = {s: len(split) for s, split in splits.items()}
        texts = {
            s: (
                textio.read_lines(directory / f"{s}.src.txt"),
                textio.read_lines(directory / f"{s}.ref.txt"),
            )
            for s in names
            if (directory / f"{s}.src.txt").is_file()
        }
        return cls(directory, splits, pairs, texts)

    def texts(self, split: str) -> tuple[list[str], list[str]]:
        """The raw source and reference lines of an evaluation split."""
        return self._texts[split]


def _checked_pairs(task: Task, split: str, pairs):
    """read_split's pairs, each a (str, str) pair, else an error naming the plugin and
    read_split."""
    for i, pair in enumerate(pairs, 1):
        if not (
            isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(isinstance(x, str) for x in pair)
        ):
            raise plugin_error(
                task,
                "read_split",
                f"yielded {type(pair).__name__} {pair!r:.60} as pair {i} of "
                f"split {split!r}, not a (str, str) pair",
            )
        yield pair


def _with_eos(ids: list, lens: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The kept sequences of `ids` (lengths lens - 1), each followed by EOS, as one int32 array."""
    flat = np.fromiter(chain.from_iterable(ids), np.int32, int(lens.sum() - len(lens)))
    ends = np.cumsum(lens)  # one past each sequence's EOS in the output
    out = np.full(ends[-1] if len(ends) else 0, EOS, np.int32)
    is_id = np.ones(len(out), bool)
    is_id[ends - 1] = False
    out[is_id] = flat
    return out if keep.all() else out[np.repeat(keep, lens)]


def _binarise(task: Task, split: str, directory: Path, data_cfg, progress) -> dict:
    """Encode the pairs of `split` into directory/{split}.*; return counts of what was kept.
    Beside the dev and test splits their text is kept too (what validation and the test score
    against)."""
    keep_text = split != "train"
    pairs = _checked_pairs(task, split, task.read_split(split))
    kept = dropped = 0
    src_lens, tgt_lens = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    text = (
        [open(directory / f"{split}.{side}.txt", "w", encoding="utf-8") for side in ("src", "ref")]
        if keep_text
        else []
    )
    with (
        open(directory / f"{split}.src.bin", "wb") as fs,
        open(directory / f"{split}.tgt.bin", "wb") as ft,
    ):
        while True:
            chunk = list(islice(pairs, CHUNK))
            if not chunk:
                break
            srcs, tgts = [p[0] for p in chunk], [p[1] for p in chunk]
            s_ids, t_ids = task.encode_source(srcs), task.encode_target(tgts)
            ls = np.fromiter((len(s) + 1 for s in s_ids), np.int64, len(s_ids))
            lt = np.fromiter((len(t) + 1 for t in t_ids), np.int64, len(t_ids))
            keep = np.ones(len(chunk), bool)
            if not keep_text:  # length filters apply to training data only
                keep &= (ls <= data_cfg.max_len) & (lt <= data_cfg.max_len)
                if data_cfg.max_len_ratio:
                    keep &= np.maximum(ls, lt) / np.minimum(ls, lt) <= data_cfg.max_len_ratio
            idx = np.flatnonzero(keep)
            fs.write(_with_eos(s_ids, ls, keep).tobytes())
            ft.write(_with_eos(t_ids, lt, keep).tobytes())
            src_lens.append(ls[idx])
            tgt_lens.append(lt[idx])
            for j in idx:
                if keep_text:
                    text[0].write(srcs[j].replace("\n", " ") + "\n")
                    text[1].write(tgts[j].replace("\n", " ") + "\n")
            kept += len(idx)
            dropped += len(chunk) - len(idx)
            progress.update(len(chunk))
    for f in text:
        f.close()
    if kept == 0:
        raise DataError(
            f"task {task.name!r}: split {split!r} has no usable pairs (all empty or filtered)"
        )
    np.save(directory / f"{split}.src.off.npy", np.cumsum(np.concatenate(src_lens)))
    np.save(directory / f"{split}.tgt.off.npy", np.cumsum(np.concatenate(tgt_lens)))
    return {"pairs": kept, "filtered": dropped}


@contextlib.contextmanager
def _collector_paused():
    """Tokenising makes millions of short-lived lists of ids. They hold no reference cycles, so
    reference counting frees them; the cyclic collector would only scan them over and over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _problem(directory: Path) -> str | None:
    """Why the cache in `directory` cannot be used as it is (None: it can)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
        digests, inputs = manifest["files"], manifest["inputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return (
            f"its manifest {directory / MANIFEST} is missing or unreadable (an older or damaged "
            "cache)"
        )
    if manifest.get("format") != FORMAT:
        return f"it was written in format {manifest.get('format')}, this version reads {FORMAT}"
    present = {p.name for p in directory.iterdir() if p.name != MANIFEST}
    if present != set(digests):
        return (
            f"its files differ from its manifest ({', '.join(sorted(present ^ set(digests))[:3])})"
        )
    for name, digest in digests.items():
        if files.sha256(directory / name) != digest:
            return f"{directory / name} is damaged (its checksum differs from the manifest's)"
    for path, was in inputs.items():
        if not Path(path).is_file():
            return f"its input {path} is gone"
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) != (was["size"], was["mtime_ns"]) and (
            st.st_size != was["size"] or files.sha256(path) != was["sha256"]
        ):
            return f"its input {path} changed since the cache was built"
    return None


def prepare_data(
    task: Task, data_cfg, quiet: bool = False, fit: tuple[int, bool] | None = None
) -> Prepared:
    """Vocabulary plus binarised splits for `task`, from the cache when already prepared (`fit`:
    see `Prepared.open`); else built under the machine's lock, or read once its holder built it."""
    root = Path(data_cfg.cache_dir)
    directory = root / f"{task.name}-{cache_key(task, data_cfg)}"
    if directory.is_dir() and _problem(directory) is None:
        task.load_vocab(directory)
        return Prepared.open(directory, task.splits, fit)
    created = not root.exists()
    try:  # the lock: a file beside the cache
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{directory.name}.lock", "a")
    except OSError as e:
        raise DataError(f"data.cache_dir {root} is not writable: {e.strerror or e}") from None
    try:
        with lock:
            fcntl.flock(
                lock, fcntl.LOCK_EX
            )  # waits while another process of this machine builds it
            why = _problem(directory) if directory.is_dir() else "missing"
            if why is None:  # built meanwhile by the process that held the lock
                task.load_vocab(directory)
                return Prepared.open(directory, task.splits, fit)
            if why != "missing":
                log.warning("prepared data %s is rebuilt: %s", directory, why)
            _build_into(task, data_cfg, root, directory, quiet)
    finally:
        if not directory.exists():  # a failed preparation leaves no trace
            Path(lock.name).unlink(missing_ok=True)
            if created and not any(root.iterdir()):
                root.rmdir()
    return Prepared.open(directory, task.splits, fit)


def _build_into(task: Task, data_cfg, root: Path, directory: Path, quiet: bool) -> None:
    """Build the cache in a temporary folder of `root` and switch it in as `directory`."""
    try:
        files.remove_stale_temporaries(root)
        tmp = root / f".{directory.name}.tmp{socket.gethostname()}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise DataError(f"data.cache_dir {root} is not writable: {e.strerror or e}") from None
    try:
        _build(task, data_cfg, tmp, quiet)
        if directory.exists():  # stale or damaged: switched aside, never rewritten under a reader
            aside = root / f".{directory.name}.old.tmp{socket.gethostname()}-{os.getpid()}"
            os.replace(directory, aside)
            os.replace(tmp, directory)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, directory)
    except OSError as e:
        raise DataError(
            f"cannot write the prepared data into {root} (data.cache_dir): "
            f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _build(task: Task, data_cfg, tmp: Path, quiet: bool) -> None:
    """Prepare into the folder `tmp`, manifest last."""
    from ..progress import progress

    log.info("preparing %s into %s", task.name, tmp.parent)
    stats = {}
    with _collector_paused(), files.recording(exclude=[tmp.parent]) as inputs:
        task.build_vocab(_checked_pairs(task, "train", task.read_split("train")))
        if task.src_vocab is None or task.tgt_vocab is None:
            raise plugin_error(task, "build_vocab", "set no src_vocab / tgt_vocab")
        for side, size in (("source", task.src_vocab_size), ("target", task.tgt_vocab_size)):
            if size <= len(SPECIALS):
                raise plugin_error(
                    task,
                    "build_vocab",
                    f"made a {side} vocabulary of {size} tokens "
                    f"(no words beyond the {len(SPECIALS)} specials)",
                )
        task.save_vocab(tmp)
        for split in task.splits:
            with progress(quiet, desc=f"binarise {split}", unit=" pairs", leave=False) as bar:
                stats[split] = _binarise(task, split, tmp, data_cfg, bar)
            log.info(
                "%s: %d pairs kept, %d filtered by length",
                split,
                stats[split]["pairs"],
                stats[split]["filtered"],
            )
    digests = {p.name: files.sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    atomic_write_text(
        tmp / MANIFEST,
        json.dumps(
            {
                "format": FORMAT,
                "task": task.name,
                "splits": stats,
                "src_vocab": task.src_vocab_size,
                "tgt_vocab": task.tgt_vocab_size,
                "files": digests,
                "inputs": {path: files.fingerprint(path) for path in sorted(inputs)},
            },
            indent=1,
        ),
    )
