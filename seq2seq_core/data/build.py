"""The prepared-data cache built, by one process into a folder of its own (`build_into`).

The task reads each split; its vocabulary is trained on the first data.vocab_sample training pairs
(or taken over from the previous build when that sample is the same); the pairs are encoded in
chunks and appended to flat int32 files: the training split in shards, cleaned and binarised by
worker processes (`s2s.core.data.shards`) without the pairs repeated across shards
(`s2s.core.data.cleaning.across_shards`), the dev and test splits here, whole and never filtered.
The build is written into a temporary folder, manifest last (`s2s.core.data.cache`), and renamed
into place once complete; a rebuild takes over the previous build's unchanged shards and
vocabulary. Temporary folders left by killed runs on this machine are removed. With several
nodes, node 0 publishes its vocabulary for the others as soon as it is trained (`_publish`).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from itertools import islice
from pathlib import Path

import numpy as np

from .. import files
from ..errors import DataError, plugin_error
from ..files import atomic_write_text
from ..contract.task import Task
from ..tokenizers import SPECIALS
from . import shards
from .cache import FORMAT, MANIFEST
from .cleaning import summary
from .shards import CHUNK, Nodes, with_eos

log = logging.getLogger("s2s")


def checked_pairs(task: Task, split: str, pairs):
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
    pairs = checked_pairs(task, split, task.read_split(split))
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
def collector_paused():
    """Tokenising makes millions of short-lived lists of ids. They hold no reference cycles, so
    reference counting frees them; the cyclic collector would only scan them over and over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_into(
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


def sample_hash(pairs) -> tuple[int, str]:
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
        return islice(checked_pairs(task, "train", task.read_split("train")), limit)

    if old and where is not None and old.get("sample_pairs") is not None:
        n, digest = sample_hash(sample())
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
    with collector_paused(), files.recording(exclude=[tmp.parent]) as inputs:
        vocab = _vocabulary(task, data_cfg, tmp, before.get("vocab"), old)
        vocab_sha = hashlib.sha256(json.dumps(vocab["files"], sort_keys=True).encode()).hexdigest()
        if shared is not None:
            _publish(tmp, vocab, vocab_sha, shared, started)
        digests = dict(vocab["files"])
        for split in task.splits:
            with progress(quiet, desc=f"binarise {split}", unit=" pairs", leave=False) as bar:
                if split == "train":
                    with files.recording(exclude=[tmp.parent]) as read:
                        pairs = checked_pairs(task, split, task.read_split(split))
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
