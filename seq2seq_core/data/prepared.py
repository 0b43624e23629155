"""Prepared data: ids binarised into memory-mapped files (batched by `s2s.core.data.batches`).

`prepare_data` reads each split through the task, trains its vocabulary on the first
data.vocab_sample training pairs, encodes the pairs in chunks and appends the ids to flat int32
files: the training split in shards, cleaned and binarised by worker processes
(`s2s.core.data.shards`), read back as one split (`Shards`) without the pairs repeated across
shards (`s2s.core.data.cleaning.across_shards`), the dev and test splits here, whole.
Only per-pair offsets are kept (memory-mapped for the shards), so a corpus of tens of millions
of pairs never sits in Python lists. The result is cached under a key derived from the task
section and the data settings, and written to a temporary folder renamed into place once
complete; a rebuild takes over the previous build's unchanged shards and vocabulary.

The cache cannot lie: its manifest (`prepared.json`) holds the SHA-256 of every file in it and the
fingerprint (size, mtime, content hash) of every file the task read while preparing, by any reader
(`s2s.core.files.recording`). Both are checked when the cache is opened; a damaged cache, or one
whose inputs changed since, is rebuilt with a message saying why. Temporary folders left by killed
runs on this machine are removed.

One process of a machine builds a missing cache (holding a lock file beside it), the others wait
and read it: without shared storage each node's processes would all build it at once. With
storage shared, several machines can build one cache together (`shards.Nodes`): node 0 as above,
publishing its vocabulary in `.{cache}.nodes/` beside the cache, the others (`_help`, no lock:
file locks may span machines) binarising their shards there.

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
import time
import weakref
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from .. import files
from .. import textio
from ..errors import DataError, plugin_error
from ..files import atomic_write_text
from ..contract.task import Task
from ..tokenizers import BOS, PAD, SPECIALS
from . import shards
from .cleaning import summary
from .shards import CHUNK, Nodes, with_eos

log = logging.getLogger("s2s")
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

    @property
    def manifest(self) -> dict:
        """The folder's manifest: each split's counts (`splits`), the shards, the vocabulary."""
        return json.loads((self.directory / MANIFEST).read_text(encoding="utf-8"))

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


def _binarise(task: Task, split: str, directory: Path, progress) -> dict:
    """Encode the pairs of the dev or test split `split` into directory/{split}.*, their text
    beside them (what validation and the test score against); return its counts. They are never
    cleaned or filtered: the run is scored on all of them."""
    pairs = _checked_pairs(task, split, task.read_split(split))
    kept = 0
    src_lens, tgt_lens = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    text = [
        open(directory / f"{split}.{side}.txt", "w", encoding="utf-8") for side in ("src", "ref")
    ]
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
            fs.write(with_eos(s_ids, ls, keep).tobytes())
            ft.write(with_eos(t_ids, lt, keep).tobytes())
            src_lens.append(ls)
            tgt_lens.append(lt)
            for s, t in chunk:
                text[0].write(s.replace("\n", " ") + "\n")
                text[1].write(t.replace("\n", " ") + "\n")
            kept += len(chunk)
            progress.update(len(chunk))
    for f in text:
        f.close()
    if kept == 0:
        raise DataError(
            f"task {task.name!r}: split {split!r} has no usable pairs (all empty or filtered)"
        )
    np.save(directory / f"{split}.src.off.npy", np.cumsum(np.concatenate(src_lens)))
    np.save(directory / f"{split}.tgt.off.npy", np.cumsum(np.concatenate(tgt_lens)))
    return {"pairs": kept, "filtered": 0}


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
    task: Task,
    data_cfg,
    quiet: bool = False,
    fit: tuple[int, bool] | None = None,
    nodes: Nodes = Nodes(),
) -> Prepared:
    """Vocabulary plus binarised splits for `task`, from the cache when already prepared (`fit`:
    see `Prepared.open`); else built under the machine's lock, or read once its holder built it;
    with several `nodes`, built by all of them."""
    root = Path(data_cfg.cache_dir)
    directory = root / f"{task.name}-{cache_key(task, data_cfg)}"
    if directory.is_dir() and _problem(directory) is None:
        task.load_vocab(directory)
        return Prepared.open(directory, task.splits, fit)
    if nodes.rank:
        _help(task, data_cfg, directory, nodes, quiet)
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
            _build_into(task, data_cfg, root, directory, quiet, nodes)
    finally:
        if not directory.exists():  # a failed preparation leaves no trace
            Path(lock.name).unlink(missing_ok=True)
            if created and not any(root.iterdir()):
                root.rmdir()
    return Prepared.open(directory, task.splits, fit)


def _build_into(
    task: Task, data_cfg, root: Path, directory: Path, quiet: bool, nodes: Nodes
) -> None:
    """Build the cache in a temporary folder of `root` and switch it in as `directory`."""
    try:
        files.remove_stale_temporaries(root)
        tmp = root / f".{directory.name}.tmp{socket.gethostname()}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise DataError(f"data.cache_dir {root} is not writable: {e.strerror or e}") from None
    try:
        shared = root / f".{directory.name}.nodes" if nodes.count > 1 else None
        old = directory if directory.is_dir() else None
        _build(task, data_cfg, tmp, quiet, old, nodes, shared)
        if directory.exists():  # stale or damaged: switched aside, never rewritten under a reader
            aside = root / f".{directory.name}.old.tmp{socket.gethostname()}-{os.getpid()}"
            os.replace(directory, aside)
            os.replace(tmp, directory)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.replace(tmp, directory)
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
    except OSError as e:
        raise DataError(
            f"cannot write the prepared data into {root} (data.cache_dir): "
            f"{e.strerror or e}{f' ({e.filename})' if e.filename else ''}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sample_hash(pairs) -> tuple[int, str]:
    """The number of `pairs` and their SHA-256, hashed chunk by chunk (`_hashed`'s hash)."""
    h, n = hashlib.sha256(), 0
    for _ in _hashed(pairs, h):
        n += 1
    return n, h.hexdigest()


def _hashed(pairs, h):
    """`pairs`, passed through, each chunk of them added to the hash `h`."""
    pairs = iter(pairs)
    while chunk := list(islice(pairs, CHUNK)):
        for side in (0, 1):
            h.update("".join(shards._escaped(p[side]) for p in chunk).encode())
        yield from chunk


def _vocabulary(task: Task, data_cfg, tmp: Path, old: dict | None, where: Path | None) -> dict:
    """Train the vocabulary on the first data.vocab_sample training pairs (all: 0) and save it in
    `tmp`, or take the previous build's (`old`, in the folder `where`) when its sample is the same.
    Returns what the manifest says of it."""
    limit = data_cfg.vocab_sample or None

    def sample():
        return islice(_checked_pairs(task, "train", task.read_split("train")), limit)

    if old and where is not None and old.get("sample_pairs") is not None:
        n, digest = _sample_hash(sample())
        if (n, digest) == (old["sample_pairs"], old["sample_sha256"]) and all(
            (where / f).is_file() and files.sha256(where / f) == old["files"][f]
            for f in old["files"]
        ):
            for f in old["files"]:
                shutil.copy2(where / f, tmp / f)
            task.load_vocab(tmp)
            log.info("the vocabulary's sample is unchanged: its vocabulary is reused")
            return old
    h = hashlib.sha256()
    counted = [0]

    def counting(pairs):
        for pair in pairs:
            counted[0] += 1
            yield pair

    task.build_vocab(counting(_hashed(sample(), h)))
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
    return {  # what the task read of the sample (an imported vocabulary reads none of it)
        "sample_pairs": counted[0],
        "sample_sha256": h.hexdigest(),
        "files": {p.name: files.sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()},
    }


def _build(
    task: Task,
    data_cfg,
    tmp: Path,
    quiet: bool,
    old: Path | None,
    nodes: Nodes,
    shared: Path | None,
) -> None:
    """Prepare into the folder `tmp`, manifest last; `old`: the previous build of the same cache
    (stale), whose unchanged shards and vocabulary are taken over; `shared`: where the other
    `nodes` find the vocabulary and leave their shards."""
    from ..progress import progress

    log.info("preparing %s into %s", task.name, tmp.parent)
    started = time.time()
    before = {}
    if old is not None:
        try:
            before = json.loads((old / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = {}
    stats, entries = {}, []
    with _collector_paused(), files.recording(exclude=[tmp.parent]) as inputs:
        vocab = _vocabulary(task, data_cfg, tmp, before.get("vocab"), old)
        vocab_sha = hashlib.sha256(json.dumps(vocab["files"], sort_keys=True).encode()).hexdigest()
        if shared is not None:
            _publish(tmp, vocab, vocab_sha, shared, started)
        digests = dict(vocab["files"])
        for split in task.splits:
            with progress(quiet, desc=f"binarise {split}", unit=" pairs", leave=False) as bar:
                if split == "train":
                    with files.recording(exclude=[tmp.parent]) as read:
                        pairs = _checked_pairs(task, split, task.read_split(split))
                        stats[split], entries = shards.build_train(
                            task, pairs, tmp, data_cfg, old, vocab_sha, bar, nodes, shared
                        )
                    for e in entries:  # the files its pairs came from, and which pairs they are
                        e["inputs"] = sorted(read)
                    for e in entries:
                        digests.update(e["files"])
                    log.info(
                        "train: %d pairs kept, %s, in %d shard(s)",
                        stats[split]["pairs"],
                        summary(stats[split]["dropped"]),
                        len(entries),
                    )
                else:
                    stats[split] = _binarise(task, split, tmp, bar)
                    log.info("%s: %d pairs", split, stats[split]["pairs"])
    for p in sorted(tmp.iterdir()):
        if p.is_file() and p.name not in digests:
            digests[p.name] = files.sha256(p)
    atomic_write_text(
        tmp / MANIFEST,
        json.dumps(
            {
                "format": FORMAT,
                "task": task.name,
                "splits": stats,
                "src_vocab": task.src_vocab_size,
                "tgt_vocab": task.tgt_vocab_size,
                "vocab": vocab,
                "shards": entries,
                "files": dict(sorted(digests.items())),
                "inputs": {path: files.fingerprint(path) for path in sorted(inputs)},
            },
            indent=1,
        ),
    )


def _publish(tmp: Path, vocab: dict, vocab_sha: str, shared: Path, started: float) -> None:
    """Node 0's vocabulary for the other nodes: its files in `shared`/vocab-SHA, then
    `shared`/vocab.json naming them. Failures other nodes reported before this build `started`
    (an earlier try's) are removed."""
    shared.mkdir(exist_ok=True)
    for failed in shared.glob("node*.failed"):
        if failed.stat().st_mtime < started:
            failed.unlink(missing_ok=True)
    folder = shared / f"vocab-{vocab_sha[:16]}"
    if not folder.is_dir():
        aside = shared / f".{folder.name}.tmp{socket.gethostname()}-{os.getpid()}"
        shutil.rmtree(aside, ignore_errors=True)
        aside.mkdir()
        for name in vocab["files"]:
            shutil.copy2(tmp / name, aside / name)
        os.replace(aside, folder)
    atomic_write_text(shared / "vocab.json", json.dumps({"vocab": vocab, "folder": folder.name}))


def _help(task: Task, data_cfg, directory: Path, nodes: Nodes, quiet: bool) -> None:
    """Node `nodes.rank` > 0: wait for node 0's vocabulary (one whose sample is this corpus's),
    binarise this node's training shards (`shards.binarise_share`), then wait for node 0 to
    switch the cache in as `directory`; each wait up to nodes.wait_minutes."""
    from ..progress import progress

    shared = directory.parent / f".{directory.name}.nodes"
    was, samples = _manifest_id(directory), {}
    try:
        said = _wait(
            lambda: _node0_vocabulary(task, shared, samples) or _manifest_id(directory) != was,
            nodes,
            f"node {nodes.rank}: no vocabulary for this corpus from node 0 in {shared}",
        )
        if said is True:  # node 0 was done without this node (every shard of it kept)
            return
        task.load_vocab(shared / said["folder"])
        vocab_sha = hashlib.sha256(
            json.dumps(said["vocab"]["files"], sort_keys=True).encode()
        ).hexdigest()
        old = directory if directory.is_dir() else None
        with _collector_paused(), progress(quiet, desc="binarise train", unit=" pairs") as bar:
            pairs = _checked_pairs(task, "train", task.read_split("train"))
            shards.binarise_share(task, pairs, shared, data_cfg, old, vocab_sha, nodes, bar)
    except Exception as e:
        with contextlib.suppress(OSError):
            atomic_write_text(
                shared / f"node{nodes.rank}.failed", f"node {nodes.rank}: {type(e).__name__}: {e}"
            )
        raise
    _wait(
        lambda: _manifest_id(directory) != was and _problem(directory) is None,
        nodes,
        f"node {nodes.rank}: node 0 wrote no prepared data into {directory}",
    )


def _manifest_id(directory: Path):
    """What tells one build of `directory` from another (None: there is none)."""
    try:
        st = os.stat(directory / MANIFEST)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _node0_vocabulary(task: Task, shared: Path, samples: dict) -> dict | None:
    """Node 0's published vocabulary if it was trained on this corpus's sample (not one left by
    an earlier run), else None; `samples` keeps the hash of each sample size already read."""
    try:
        said = json.loads((shared / "vocab.json").read_text(encoding="utf-8"))
        n = said["vocab"]["sample_pairs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if n not in samples:
        pairs = _checked_pairs(task, "train", task.read_split("train"))
        samples[n] = _sample_hash(islice(pairs, n))
    return said if samples[n] == (n, said["vocab"]["sample_sha256"]) else None


def _wait(ready, nodes: Nodes, what: str):
    """`ready()`'s first true value, asked every second up to nodes.wait_minutes; else an error
    saying `what` was missing."""
    deadline = time.monotonic() + 60 * nodes.wait_minutes
    while not (value := ready()):
        if time.monotonic() > deadline:
            raise DataError(f"{what} after run.wait_minutes={nodes.wait_minutes:g}")
        time.sleep(1)
    return value
