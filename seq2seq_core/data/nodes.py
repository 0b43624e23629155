"""Who prepares a task's cache (`prepare_data`): the processes of one machine, and several
machines sharing data.cache_dir.

A valid cache is opened (`s2s.core.data.cache`). Else one process of a machine builds it
(`s2s.core.data.build`), holding a lock file beside it, and the others wait and read it: without
shared storage each node's processes would all build it at once. With storage shared, several
machines can build one cache together (`shards.Nodes`): node 0 as above, publishing its
vocabulary in `.{cache}.nodes/` beside the cache, the others (`_help`, no lock: file locks may
span machines) binarising their shards there, then waiting for node 0 to switch the cache in.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import time
from itertools import islice
from pathlib import Path

from ..errors import DataError
from ..files import atomic_write_text
from ..contract.task import Task
from . import shards
from .build import build_into, checked_pairs, collector_paused, sample_hash
from .cache import Prepared, cache_key, manifest_id, problem
from .shards import Nodes

log = logging.getLogger("s2s")


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
    if directory.is_dir() and problem(directory) is None:
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
            why = problem(directory) if directory.is_dir() else "missing"
            if why is None:  # built meanwhile by the process that held the lock
                task.load_vocab(directory)
                return Prepared.open(directory, task.splits, fit)
            if why != "missing":
                log.warning("prepared data %s is rebuilt: %s", directory, why)
            build_into(task, data_cfg, root, directory, quiet, nodes)
    finally:
        if not directory.exists():  # a failed preparation leaves no trace
            Path(lock.name).unlink(missing_ok=True)
            if created and not any(root.iterdir()):
                root.rmdir()
    return Prepared.open(directory, task.splits, fit)


def _help(task: Task, data_cfg, directory: Path, nodes: Nodes, quiet: bool) -> None:
    """Node `nodes.rank` > 0: wait for node 0's vocabulary (one whose sample is this corpus's),
    binarise this node's training shards (`shards.binarise_share`), then wait for node 0 to
    switch the cache in as `directory`; each wait up to nodes.wait_minutes."""
    from ..progress import progress

    shared = directory.parent / f".{directory.name}.nodes"
    was, samples = manifest_id(directory), {}
    try:
        said = _wait(
            lambda: _node0_vocabulary(task, shared, samples) or manifest_id(directory) != was,
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
        with collector_paused(), progress(quiet, desc="binarise train", unit=" pairs") as bar:
            pairs = checked_pairs(task, "train", task.read_split("train"))
            shards.binarise_share(task, pairs, shared, data_cfg, old, vocab_sha, nodes, bar)
    except Exception as e:
        with contextlib.suppress(OSError):
            atomic_write_text(
                shared / f"node{nodes.rank}.failed", f"node {nodes.rank}: {type(e).__name__}: {e}"
            )
        raise
    _wait(
        lambda: manifest_id(directory) != was and problem(directory) is None,
        nodes,
        f"node {nodes.rank}: node 0 wrote no prepared data into {directory}",
    )


def _node0_vocabulary(task: Task, shared: Path, samples: dict) -> dict | None:
    """Node 0's published vocabulary if it was trained on this corpus's sample (not one left by
    an earlier run), else None; `samples` keeps the hash of each sample size already read."""
    try:
        said = json.loads((shared / "vocab.json").read_text(encoding="utf-8"))
        n = said["vocab"]["sample_pairs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if n not in samples:
        pairs = checked_pairs(task, "train", task.read_split("train"))
        samples[n] = sample_hash(islice(pairs, n))
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
