"""The training split binarised in shards, by all cores, each shard kept while its pairs stay.

The training pairs are read once, in order, and cut into shards of `data.shard_pairs` pairs. Each
shard's text is written aside (hashed as it is written), then cleaned (`s2s.core.data.cleaning`),
encoded and binarised into `train.NNNNN.*` by one of `data.workers` processes (0: one per core
this process may use; a corpus of one shard is binarised in this process). A worker is `python -m
s2s.core.data.shards` given the pickled task: it imports only what binarising needs, encodes in
one thread, and does not depend on how the calling program was started (no `__main__` guard
needed); one that fails is named with its shard and its last line of error, in one line. The
manifest names each shard's inputs: the files of the split, the range of pairs it holds and
their hash.

A shard is content-addressed: its key is the hash of its pairs, the vocabulary and the cleaning
settings. When the corpus changes (pairs appended, a range replaced), the cache is rebuilt aside
as always, but every shard whose key the previous build holds is taken from it (a hard link, its
checksum verified) rather than binarised again; so is the vocabulary when its sample (the first
`data.vocab_sample` pairs) is unchanged. Appending a corpus of whole shards to one whose last
shard is full re-binarises only the new shards. With the `duplicate` rule each shard also keeps
its pairs' hashes, from which the pairs repeated across shards are listed once all are there
(`cleaning.across_shards`).

Several machines sharing the cache folder can binarise one corpus's shards (`Nodes`): node 0
builds the cache as above, taking the other nodes' shards from `.{cache}.nodes/`, where they
leave them (`binarise_share`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

import numpy as np

from .. import files
from ..errors import DataError
from ..tokenizers import EOS
from .cleaning import Cleaner, across_shards, save_hashes, summary

log = logging.getLogger("s2s")
CHUNK = 20_000  # pairs encoded per call to the tokenizer


def with_eos(ids: list, lens: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The kept sequences of `ids` (lengths lens - 1), each followed by EOS, as one int32 array."""
    flat = np.fromiter(chain.from_iterable(ids), np.int32, int(lens.sum() - len(lens)))
    ends = np.cumsum(lens)  # one past each sequence's EOS in the output
    out = np.full(ends[-1] if len(ends) else 0, EOS, np.int32)
    is_id = np.ones(len(out), bool)
    is_id[ends - 1] = False
    out[is_id] = flat
    return out if keep.all() else out[np.repeat(keep, lens)]


def workers(data_cfg) -> int:
    """The processes that binarise shards: data.workers, or one per core this process may use."""
    if data_cfg.workers:
        return data_cfg.workers
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- a shard's text, written aside losslessly (a pair's "\n" or "\\" escaped) ---------------------
def _escaped(line: str) -> str:
    if "\\" in line or "\n" in line:
        line = line.replace("\\", "\\\\").replace("\n", "\\n")
    return line + "\n"


def _unescaped(line: str) -> str:
    line = line[:-1] if line.endswith("\n") else line
    if "\\" not in line:
        return line
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c == "\\" and i + 1 < len(line):
            out.append("\n" if line[i + 1] == "n" else line[i + 1])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _text_chunks(prefix: Path):
    with (
        open(f"{prefix}.src.txt", encoding="utf-8", newline="\n") as fs,
        open(f"{prefix}.tgt.txt", encoding="utf-8", newline="\n") as ft,
    ):
        while True:
            srcs = [_unescaped(x) for x in islice(fs, CHUNK)]
            tgts = [_unescaped(x) for x in islice(ft, CHUNK)]
            if not srcs:
                return
            yield srcs, tgts


def binarise_shard(task, text: str, out: str, data_cfg: dict) -> dict:
    """Clean, encode and binarise the pairs of the text files `{text}.src.txt` / `.tgt.txt` into
    `{out}.src.bin`, `.tgt.bin`, `.src.off.npy`, `.tgt.off.npy` (and `.hash.npy`, the kept
    pairs' hashes, with the `duplicate` rule); the text files are removed. Returns its counts and
    its files' SHA-256 (run in a worker process, or in this one)."""
    cleaner = Cleaner(data_cfg)
    src_lens, tgt_lens = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    hs, ht = hashlib.sha256(), hashlib.sha256()
    read = 0
    with open(f"{out}.src.bin", "wb") as fs, open(f"{out}.tgt.bin", "wb") as ft:
        for srcs, tgts in _text_chunks(Path(text)):
            read += len(srcs)
            keep = cleaner.text(srcs, tgts)
            if not keep.all():
                srcs = [s for s, k in zip(srcs, keep) if k]
                tgts = [t for t, k in zip(tgts, keep) if k]
            s_ids, t_ids = task.encode_source(srcs), task.encode_target(tgts)
            ls = np.fromiter((len(s) + 1 for s in s_ids), np.int64, len(s_ids))
            lt = np.fromiter((len(t) + 1 for t in t_ids), np.int64, len(t_ids))
            keep = cleaner.lengths(ls, lt, np.ones(len(srcs), bool))
            for f, h, block in (
                (fs, hs, with_eos(s_ids, ls, keep)),
                (ft, ht, with_eos(t_ids, lt, keep)),
            ):
                data = block.tobytes()
                f.write(data)
                h.update(data)
            src_lens.append(ls[keep])
            tgt_lens.append(lt[keep])
    for side in ("src", "tgt"):
        os.unlink(f"{text}.{side}.txt")
    offsets = {
        "src": np.cumsum(np.concatenate(src_lens)),
        "tgt": np.cumsum(np.concatenate(tgt_lens)),
    }
    for side, off in offsets.items():
        np.save(f"{out}.{side}.off.npy", off)
    saved = [f"{out}.src.off.npy", f"{out}.tgt.off.npy"]
    if cleaner.hashes is not None:
        save_hashes(f"{out}.hash.npy", cleaner.hashes)
        saved.append(f"{out}.hash.npy")
    name = Path(out).name
    digests = {f"{name}.src.bin": hs.hexdigest(), f"{name}.tgt.bin": ht.hexdigest()}
    for path in saved:
        digests[Path(path).name] = files.sha256(path)
    return {
        "read": read,
        "pairs": int(len(offsets["src"]) - 1),
        "src_tokens": int(offsets["src"][-1]),
        "tgt_tokens": int(offsets["tgt"][-1]),
        "dropped": cleaner.dropped,
        "files": digests,
    }


def _shard_key(text_sha: str, vocab_sha: str, data_cfg: dict) -> str:
    spec = {
        "text": text_sha,
        "vocab": vocab_sha,
        **{k: data_cfg[k] for k in ("max_len", "max_len_ratio", "clean")},
    }
    return hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _reusable(old: Path | None, entry: dict | None) -> bool:
    """Whether the previous build's shard `entry` is whole (its files' checksums hold)."""
    if old is None or entry is None:
        return False
    return all(
        (old / name).is_file() and files.sha256(old / name) == digest
        for name, digest in entry["files"].items()
    )


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(source, target)


class _Pool:
    """Shard jobs run by worker processes, at most `n` at once, each `python -m
    s2s.core.data.shards` with the pickled task (so that nothing depends on how the calling
    program was started, and a worker imports only what binarising needs); in this process when
    `n` is 1 or there are not two jobs to share."""

    def __init__(self, task, n: int, tmp: Path):
        self.task, self.n, self.tmp = task, n, tmp
        self.pickled: Path | None = None
        self.waiting: list = []  # the first job, held until a second one comes
        self.running: dict = {}  # shard index -> (process, out prefix)
        self.done: dict = {}  # shard index -> its counts

    def submit(self, index: int, *job) -> None:
        if self.n <= 1:
            self.done[index] = binarise_shard(self.task, *job)
            return
        if self.pickled is None and not self.waiting:
            self.waiting = [(index, job)]
            return
        if self.pickled is None:
            log.info("training shards binarised by %d worker processes", self.n)
            self.pickled = self.tmp / ".task.pickle"
            self.pickled.write_bytes(pickle.dumps(self.task))
            for i, j in self.waiting:
                self._start(i, j)
            self.waiting = []
        while len(self.running) >= self.n:  # no more text written aside than the workers take
            self._collect(all_of_them=False)
        self._start(index, job)

    def _start(self, index: int, job) -> None:
        text, out, cfg = job
        env = {
            **os.environ,
            "TOKENIZERS_PARALLELISM": "false",  # one thread each (`_work`)
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),  # what this process imports
        }
        with open(f"{out}.json", "wb") as said, open(f"{out}.log", "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(self.pickled), text, out, json.dumps(cfg)],
                stdout=said,
                stderr=log_file,
                env=env,
            )
        self.running[index] = (proc, out)

    def _collect(self, all_of_them: bool) -> None:
        while self.running:
            for index, (proc, out) in list(self.running.items()):
                if proc.poll() is None:
                    continue
                del self.running[index]
                result = Path(f"{out}.json").read_text(encoding="utf-8", errors="replace")
                said = Path(f"{out}.log").read_text(encoding="utf-8", errors="replace")
                os.unlink(f"{out}.json")
                os.unlink(f"{out}.log")
                if proc.returncode != 0:
                    last = (said.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
                    raise DataError(
                        f"the worker process binarising {Path(out).name} failed: {last}"
                    )
                self.done[index] = json.loads(result.strip().splitlines()[-1])
                if not all_of_them:
                    return
            if self.running:
                time.sleep(0.05)

    def finish(self) -> dict:
        for index, job in self.waiting:  # one job: no process to start
            self.done[index] = binarise_shard(self.task, *job)
        self._collect(all_of_them=True)
        return self.done

    def close(self) -> None:
        for proc, out in self.running.values():  # an error elsewhere: they stop too
            proc.kill()
            proc.wait()
        if self.pickled is not None:
            self.pickled.unlink(missing_ok=True)


def _work(argv: list[str]) -> int:
    """A worker process: binarise one shard (`_Pool`), print its counts as JSON."""
    from ..tokenizers import subwords
    from ..errors import S2SError

    subwords.THREADS = 1  # the workers are one per core already
    pickled, text, out, cfg = argv
    try:
        task = pickle.loads(Path(pickled).read_bytes())
        print(json.dumps(binarise_shard(task, text, out, json.loads(cfg))))
    except S2SError as e:
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


def _parallel(task, n: int) -> int:
    """`n` workers if the task can be sent to them (a plugin loaded from a file may not be)."""
    if n <= 1:
        return 1
    module = type(task).__module__
    try:
        pickle.dumps(task)
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"no module {module!r} to import")
    except Exception as e:  # noqa: BLE001 -- whatever pickling a plugin's object raises
        log.warning(
            "task %r cannot be sent to worker processes (%s: %s): its training shards are "
            "binarised in this process",
            task.name,
            type(e).__name__,
            e,
        )
        return 1
    return n


def _repeats_across_shards(
    tmp: Path, entries: list, old: Path | None, was_built: dict
) -> tuple[int, int]:
    """The pairs of each shard that an earlier shard holds (`cleaning.across_shards`), counted in
    its entry: taken from the previous build for the leading shards it has unchanged (a shard's
    list depends only on the shards up to it), computed for the others. Returns their source
    and target tokens (an entry's tokens are its files')."""
    names = [e["name"] for e in entries]
    before = was_built.get("shards", [])
    start = 0
    while (
        start < min(len(entries), len(before))
        and entries[start]["key"] == before[start]["key"]
        and _reusable(old, {"files": _dup_file(was_built, before[start]["name"])})
    ):
        _link(old / f"{before[start]['name']}.dup.npy", tmp / f"{names[start]}.dup.npy")
        entries[start]["dropped"]["duplicate_across_shards"] = before[start]["dropped"][
            "duplicate_across_shards"
        ]
        start += 1
    counts = across_shards(tmp, names, start)
    for entry, count in zip(entries[start:], counts):
        entry["dropped"]["duplicate_across_shards"] = count
    if start < len(entries):
        log.info("train: pairs repeated across shards listed for %d shard(s)", len(counts))
    tokens = [0, 0]
    for name in names:
        repeated = np.load(tmp / f"{name}.dup.npy")
        for i, kind in enumerate(("src", "tgt")):
            off = np.load(tmp / f"{name}.{kind}.off.npy", mmap_mode="r")
            tokens[i] += int((off[repeated + 1] - off[repeated]).sum())
    return tokens[0], tokens[1]


def _dup_file(manifest: dict, name: str) -> dict:
    """The previous build's list of repeats of shard `name` and its digest (None: it had none)."""
    file = f"{name}.dup.npy"
    return {file: manifest.get("files", {}).get(file)}


@dataclass(frozen=True)
class Nodes:
    """The machines preparing one corpus into a data.cache_dir they share, and this one's rank:
    node 0 trains the vocabulary and publishes it, every node binarises the training shards i
    with i % count == rank (each by its own `data.workers`), node 0 takes the others' (waiting
    up to `wait_minutes`: run.wait_minutes) and writes the manifest. Every node reads the whole
    training split (reading is cheap beside encoding) and writes aside only its shards' text."""

    rank: int = 0
    count: int = 1
    wait_minutes: float = 720.0

    def mine(self, index: int) -> bool:
        return index % self.count == self.rank


def _settings(data_cfg) -> dict:
    """The data settings a shard's binarising depends on (part of its key)."""
    return {
        "max_len": data_cfg.max_len,
        "max_len_ratio": data_cfg.max_len_ratio,
        "clean": list(data_cfg.clean),
    }


def _previous_build(old: Path | None) -> dict:
    """The manifest of the previous build `old` ({}: none, or unreadable)."""
    if old is None:
        return {}
    try:
        manifest = json.loads((old / "prepared.json").read_text(encoding="utf-8"))
        return {"shards": list(manifest.get("shards", [])), "files": dict(manifest["files"])}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _cut(pairs, folder: Path, shard_pairs: int, written, progress):
    """The training `pairs` cut into shards: yields (index, first pair, pairs, text hash, text
    prefix), the text of the shards `written(index)` written aside under `folder` (the others
    only hashed: prefix None)."""
    start, index = 0, 0
    while True:
        text = folder / f".train.{index:05d}"
        h, n = hashlib.sha256(), 0
        outs = (
            [open(f"{text}.src.txt", "wb"), open(f"{text}.tgt.txt", "wb")]
            if written(index)
            else None
        )
        try:
            while n < shard_pairs:
                chunk = list(islice(pairs, min(CHUNK, shard_pairs - n)))
                if not chunk:
                    break
                src = "".join(_escaped(s) for s, _ in chunk).encode()
                tgt = "".join(_escaped(t) for _, t in chunk).encode()
                h.update(len(src).to_bytes(8, "little") + src + tgt)
                if outs:
                    outs[0].write(src)
                    outs[1].write(tgt)
                n += len(chunk)
                progress.update(len(chunk))
        finally:
            for f in outs or ():
                f.close()
        if n == 0:
            if outs:
                _remove_text(text)
            return
        yield index, start, n, h.hexdigest(), text if outs else None
        start += n
        index += 1


def _remove_text(text: Path) -> None:
    for side in ("src", "tgt"):
        os.unlink(f"{text}.{side}.txt")


def binarise_share(task, pairs, shared: Path, data_cfg, old, vocab_sha: str, nodes, progress):
    """What node `nodes.rank` > 0 does: binarise its shards of the training `pairs` into the
    folder `shared` of the cache, each as `{key}.*` with `{key}.done` (its counts) written last;
    shards the previous build `old` holds are left to node 0, which links them."""
    cfg, previous = _settings(data_cfg), _previous_build(old)
    previous = {e["key"]: e for e in previous.get("shards", [])}
    work = shared / f"node{nodes.rank}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    pool = _Pool(task, _parallel(task, workers(data_cfg)), work)
    keys = {}
    try:
        for index, _, _, text_sha, text in _cut(
            pairs, work, data_cfg.shard_pairs, nodes.mine, progress
        ):
            if text is None:
                continue
            key = _shard_key(text_sha, vocab_sha, cfg)
            if _reusable(old, previous.get(key)):
                _remove_text(text)
                continue
            keys[index] = key
            pool.submit(index, str(text), str(shared / key), cfg)
        done = pool.finish()
    finally:
        pool.close()
    for index, key in keys.items():
        files.atomic_write_text(shared / f"{key}.done", json.dumps(done[index]))
    shutil.rmtree(work, ignore_errors=True)
    log.info("node %d: %d training shard(s) binarised", nodes.rank, len(keys))


def _take_from_nodes(waiting: dict, entries: list, shared: Path, tmp: Path, nodes, done) -> None:
    """Move the shards other nodes binarised (`waiting`: index -> key) into `tmp`, waiting for
    each up to nodes.wait_minutes in all; a node that failed is named at once."""
    deadline = time.monotonic() + 60 * nodes.wait_minutes
    for index, key in waiting.items():
        name, marker = entries[index]["name"], shared / f"{key}.done"
        while not marker.is_file():
            for failed in sorted(shared.glob("node*.failed")):
                raise DataError(failed.read_text(encoding="utf-8").strip())
            if time.monotonic() > deadline:
                raise DataError(
                    f"shard {name} (training pairs {entries[index]['first_pair']} to "
                    f"{entries[index]['first_pair'] + entries[index]['read'] - 1}) never came "
                    f"from node {index % nodes.count} of {nodes.count}: no {marker} after "
                    f"run.wait_minutes={nodes.wait_minutes:g} (is `s2s prepare --nodes "
                    f"{nodes.count} --node-rank {index % nodes.count}` running there?)"
                )
            time.sleep(0.2)
        said = json.loads(marker.read_text(encoding="utf-8"))
        for file, digest in said["files"].items():
            if files.sha256(shared / file) != digest:
                raise DataError(f"{shared / file}, from node {index % nodes.count}, is damaged")
            os.replace(shared / file, tmp / file.replace(key, name, 1))
        done[index] = {
            **said,
            "files": {f.replace(key, name, 1): d for f, d in said["files"].items()},
        }


def build_train(
    task,
    pairs,
    tmp: Path,
    data_cfg,
    old: Path | None,
    vocab_sha: str,
    progress,
    nodes: Nodes,
    shared: Path | None,
):
    """Binarise the training `pairs` into shards of `tmp`; shards of the previous build `old`
    with the same key are linked instead, and with several `nodes` (this is node 0) the other
    nodes' shards are taken from `shared`. Returns the split's counts and the shards' entries."""
    cfg, was_built = _settings(data_cfg), _previous_build(old)
    previous = {e["key"]: e for e in was_built.get("shards", [])}
    pool = _Pool(task, _parallel(task, workers(data_cfg)), tmp)
    entries, reused, waiting = [], 0, {}
    try:
        for index, start, n, text_sha, text in _cut(
            pairs, tmp, data_cfg.shard_pairs, nodes.mine, progress
        ):
            name = f"train.{index:05d}"
            key = _shard_key(text_sha, vocab_sha, cfg)
            entry = {
                "name": name,
                "key": key,
                "first_pair": start,
                "read": n,
                "text_sha256": text_sha,
            }
            if _reusable(old, previous.get(key)):
                if text is not None:
                    _remove_text(text)
                was = previous[key]
                for file in was["files"]:
                    _link(old / file, tmp / file.replace(was["name"], name, 1))
                pool.done[index] = {
                    **{k: was[k] for k in ("read", "pairs", "src_tokens", "tgt_tokens")},
                    "dropped": dict(was["dropped"]),
                    "files": {f.replace(was["name"], name, 1): d for f, d in was["files"].items()},
                }
                reused += 1
            elif text is None:
                waiting[index] = key
            else:
                pool.submit(index, str(text), str(tmp / name), cfg)
            entries.append(entry)
        done = pool.finish()
    finally:
        pool.close()
    if waiting:
        _take_from_nodes(waiting, entries, shared, tmp, nodes, done)
    for i, entry in enumerate(entries):
        entry.update(done[i])
    if reused:
        log.info("train: %d of %d shards taken from the previous build", reused, len(entries))
    repeated = (0, 0)
    if "duplicate" in cfg["clean"]:
        repeated = _repeats_across_shards(tmp, entries, old, was_built)
    dropped = (
        {k: sum(e["dropped"][k] for e in entries) for k in entries[0]["dropped"]} if entries else {}
    )
    kept = sum(e["pairs"] - e["dropped"]["duplicate_across_shards"] for e in entries)
    if kept == 0:
        raise DataError(
            f"task {task.name!r}: split 'train' has no usable pairs (all empty or filtered: "
            f"{summary(dropped)})"
        )
    stats = {
        "pairs": kept,
        "filtered": sum(dropped.values()),
        "dropped": dropped,
        "shards": len(entries),
        "shards_reused": reused,
        "src_tokens": sum(e["src_tokens"] for e in entries) - repeated[0],
        "tgt_tokens": sum(e["tgt_tokens"] for e in entries) - repeated[1],
    }
    return stats, entries


if __name__ == "__main__":
    sys.exit(_work(sys.argv[1:]))
