"""The prepared-data cache read: a task's splits as ids in memory-mapped files (batched by
`s2s.core.data.batches`), as `s2s.core.data.build` wrote them.

A cache is a folder named after the task and a key derived from the task section and the data
settings (`cache_key`). It holds each split's ids as flat int32 files with per-pair offsets
(memory-mapped for the training split's shards, `Shards`, so a corpus of tens of millions of
pairs never sits in Python lists), the text of the dev and test splits, the vocabulary, and a
manifest (`prepared.json`) written last.

The cache cannot lie: the manifest holds the SHA-256 of every file in it and the fingerprint
(size, mtime, content hash) of every file the task read while preparing, by any reader
(`s2s.core.files.recording`). `problem` checks both when the cache is opened; a damaged cache,
or one whose inputs changed since, is rebuilt with a message saying why (`s2s.core.data.nodes`).
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from .. import files
from .. import textio
from ..errors import DataError
from ..contract.task import Task
from ..tokenizers import BOS, PAD

FORMAT = 4  # bump when the on-disk layout changes (4: pairs repeated across shards listed)
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
        "clean": sorted(data_cfg.clean),
        "shard_pairs": data_cfg.shard_pairs,
        "vocab_sample": data_cfg.vocab_sample,
    }
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class Split:
    """One binarised split: ids of pair i are at src_off[i]:src_off[i+1] of the int32 file open
    as `src` (they end with EOS), likewise for tgt; with `keep` (a shard holding pairs repeated
    from earlier shards), pair i is the file's pair keep[i].

    The id files stay open from `load` on, and ids are read through these descriptors, never
    by name: a cache rebuilt meanwhile (by another `s2s prepare`) is switched in beside them,
    and what a reader loaded stays what it reads."""

    src: int  # file descriptors of {name}.src.bin / {name}.tgt.bin
    tgt: int
    src_off: np.ndarray
    tgt_off: np.ndarray
    keep: np.ndarray | None = None

    @classmethod
    def load(cls, directory: Path, name: str, mapped: bool = False) -> "Split":
        """`mapped`: the offsets memory-mapped, not read (a shard of a large split), and the
        shard's pairs repeated from earlier shards (`{name}.dup.npy`, if any) left out."""
        fds = [os.open(directory / f"{name}.{side}.bin", os.O_RDONLY) for side in ("src", "tgt")]
        mode = "r" if mapped else None
        split = cls(
            *fds,
            np.load(directory / f"{name}.src.off.npy", mmap_mode=mode),
            np.load(directory / f"{name}.tgt.off.npy", mmap_mode=mode),
        )
        for fd in fds:
            weakref.finalize(split, os.close, fd)  # closed with the split
        repeats = directory / f"{name}.dup.npy"
        if mapped and repeats.is_file() and len(dropped := np.load(repeats)):
            split.keep = np.setdiff1d(np.arange(len(split.src_off) - 1), dropped, True)
        return split

    def __len__(self) -> int:
        return len(self.src_off) - 1 if self.keep is None else len(self.keep)

    @property
    def src_lens(self) -> np.ndarray:
        lens = np.diff(self.src_off)
        return lens if self.keep is None else lens[self.keep]

    @property
    def tgt_lens(self) -> np.ndarray:
        lens = np.diff(self.tgt_off)
        return lens if self.keep is None else lens[self.keep]

    @property
    def tokens(self) -> tuple[int, int]:
        """Source and target tokens, </s> included."""
        if self.keep is not None:
            return int(self.src_lens.sum()), int(self.tgt_lens.sum())
        return int(self.src_off[-1]), int(self.tgt_off[-1])

    def ids(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The source and target ids (each ending with EOS) of the pairs `indices`."""
        if self.keep is not None:
            indices = self.keep[np.asarray(indices, np.int64)]
        return _read(self.src, self.src_off, indices), _read(self.tgt, self.tgt_off, indices)

    def batch(self, indices: Sequence[int]) -> dict:
        """Padded tensors: src [B,S] (ids+EOS), tgt_in [B,T] (BOS+ids), tgt_out [B,T] (ids+EOS)."""
        return padded(*self.ids(indices))


class Shards:
    """A split binarised in shards (`s2s.core.data.shards`), read as one: pair i of the split is
    pair i - start of the shard holding it."""

    def __init__(self, parts: list[Split]):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])
        self._lens = None

    @classmethod
    def load(cls, directory: Path, name: str) -> "Shards":
        names = sorted(p.name[: -len(".src.bin")] for p in directory.glob(f"{name}.*.src.bin"))
        return cls([Split.load(directory, n, mapped=True) for n in names])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _both_lens(self) -> tuple[np.ndarray, np.ndarray]:
        if self._lens is None:
            self._lens = tuple(
                # int32: half the memory of int64 lengths (288 MB at 36M pairs)
                np.concatenate([getattr(p, f"{side}_lens") for p in self.parts], dtype=np.int32)
                for side in ("src", "tgt")
            )
        return self._lens

    @property
    def src_lens(self) -> np.ndarray:
        return self._both_lens()[0]

    @property
    def tgt_lens(self) -> np.ndarray:
        return self._both_lens()[1]

    @property
    def tokens(self) -> tuple[int, int]:
        both = [p.tokens for p in self.parts]
        return sum(s for s, _ in both), sum(t for _, t in both)

    def ids(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        indices = np.asarray(indices, np.int64)
        which = np.searchsorted(self.starts, indices, side="right") - 1
        srcs, tgts = [None] * len(indices), [None] * len(indices)
        for k in np.unique(which):
            at = np.flatnonzero(which == k)
            s, t = self.parts[k].ids(indices[at] - self.starts[k])
            for j, a in enumerate(at):
                srcs[a], tgts[a] = s[j], t[j]
        return srcs, tgts

    def batch(self, indices: Sequence[int]) -> dict:
        return padded(*self.ids(indices))


def padded(srcs: list[np.ndarray], tgts: list[np.ndarray]) -> dict:
    """The batch of pairs (see `Split.batch`)."""
    B, S, T = len(srcs), max(len(s) for s in srcs), max(len(t) for t in tgts)
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
        splits = {
            s: Shards.load(directory, s) if s == "train" else Split.load(directory, s)
            for s in names
        }
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
                    f"{directory / f'{name}.src.txt'}): {int(split.src_lens[i]) + extra} source / "
                    f"{int(split.tgt_lens[i])} target tokens (with "
                    f"</s>{' and the task token' if extra else ''}) do not fit "
                    f"model.max_positions={positions} ({len(too_long)} such pair(s) in {name}); "
                    "raise model.max_positions or shorten them"
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

    @property
    def manifest(self) -> dict:
        """The folder's manifest: each split's counts (`splits`), the shards, the vocabulary."""
        return json.loads((self.directory / MANIFEST).read_text(encoding="utf-8"))

    def texts(self, split: str) -> tuple[list[str], list[str]]:
        """The raw source and reference lines of an evaluation split."""
        return self._texts[split]


def problem(directory: Path) -> str | None:
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


def manifest_id(directory: Path):
    """What tells one build of `directory` from another (None: there is none)."""
    try:
        st = os.stat(directory / MANIFEST)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns
