"""The training split in shards: the same pairs as one file, binarised by several processes, a
shard kept while its pairs stay, the vocabulary's sample, cleaning counted."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf
from s2s.core.data.batches import epoch_batches
from s2s.core.data.cache import MANIFEST
from s2s.core.data.nodes import prepare_data
from s2s.core.errors import DataError
from s2s.core.setup.settings import DataConfig
from s2s.plugins.demo import DemoTask

from cli_checks import fails, s2s, snapshot
from conftest import MULTI30K, corpus, free_port


def _demo(registry, **kw):
    cls = registry.get("demo")
    return cls(OmegaConf.merge(OmegaConf.structured(cls.Config), kw))


def _data(tmp_path, **kw):
    return OmegaConf.structured(DataConfig(cache_dir=str(tmp_path), **kw))


def _same_pairs(a, b):
    assert len(a) == len(b)
    assert np.array_equal(a.src_lens, b.src_lens) and np.array_equal(a.tgt_lens, b.tgt_lens)
    assert a.tokens == b.tokens
    idx = np.random.default_rng(0).permutation(len(a))[:300]
    for x, y in zip(a.batch(idx).values(), b.batch(idx).values()):
        assert (x == y).all() if hasattr(x, "all") else x == y


def test_shards_hold_the_pairs_of_one_file_and_workers_change_nothing(registry, tmp_path):
    """2,500 pairs in one shard, in shards of 1,000 binarised here, and by two processes: the
    same pairs, ids and batches; the manifest names each shard's pairs."""
    one = prepare_data(_demo(registry, train_size=2500), _data(tmp_path / "one"), quiet=True)
    assert len(one.splits["train"].parts) == 1
    here = prepare_data(
        _demo(registry, train_size=2500),
        _data(tmp_path / "here", shard_pairs=1000, workers=1),
        quiet=True,
    )
    two = prepare_data(
        _demo(registry, train_size=2500),
        _data(tmp_path / "two", shard_pairs=1000, workers=2),
        quiet=True,
    )
    for sharded in (here, two):
        assert [len(p) for p in sharded.splits["train"].parts] == [1000, 1000, 500]
        _same_pairs(one.splits["train"], sharded.splits["train"])
        shards = sharded.manifest["shards"]
        assert [(e["name"], e["first_pair"], e["read"]) for e in shards] == [
            ("train.00000", 0, 1000),
            ("train.00001", 1000, 1000),
            ("train.00002", 2000, 500),
        ]
    for name, digest in two.manifest["files"].items():
        assert here.manifest["files"][name] == digest, name


def _write(folder, pairs):
    folder.mkdir(parents=True, exist_ok=True)
    for side, lang in ((0, "en"), (1, "de")):
        (folder / f"train.{lang}").write_text("".join(p[side] + "\n" for p in pairs), "utf-8")


def _text_task(registry, folder):
    cls = registry.get("translation")
    cfg = {"source": "text", "data_dir": str(folder), "valid_prefix": "", "test_prefix": ""}
    cfg |= {"vocab_size": 400, "src_lang": "en", "tgt_lang": "de"}
    return cls(OmegaConf.merge(OmegaConf.structured(cls.Config), cfg))


def test_a_shard_added_or_replaced_leaves_the_others_as_they_were(registry, tmp_path):
    """Multi30k pairs in shards of 1,000: 1,000 more pairs appended are the only shard
    binarised (the others linked from the previous build, the vocabulary's sample unchanged);
    a range replaced re-binarises the shard holding it, nothing else."""
    en = (corpus(MULTI30K) / "train.en").read_text("utf-8").splitlines()
    de = (MULTI30K / "train.de").read_text("utf-8").splitlines()
    pairs = list(zip(en, de))
    text, cache = tmp_path / "text", tmp_path / "cache"
    data = _data(cache, shard_pairs=1000, vocab_sample=1000, workers=1)
    _write(text, pairs[:3000])
    first = prepare_data(_text_task(registry, text), data, quiet=True)
    before = first.manifest
    inode = {
        e["name"]: os.stat(first.directory / f"{e['name']}.src.bin").st_ino
        for e in before["shards"]
    }
    assert before["splits"]["train"]["shards_reused"] == 0
    _write(text, pairs[:4000])
    grown = prepare_data(_text_task(registry, text), data, quiet=True)
    assert grown.directory == first.directory
    after = grown.manifest
    assert after["splits"]["train"]["shards"] == 4
    assert after["splits"]["train"]["shards_reused"] == 3
    assert after["vocab"] == before["vocab"]  # the first 1,000 pairs: the same vocabulary
    for e in before["shards"]:  # the same files, not copies
        assert os.stat(grown.directory / f"{e['name']}.src.bin").st_ino == inode[e["name"]]
    assert after["shards"][3]["first_pair"] == 3000
    assert str(text / "train.en") in after["shards"][3]["inputs"]
    assert len(grown.splits["train"]) == 4000
    _write(text, pairs[:1500] + pairs[5000:5500] + pairs[2000:4000])  # shard 1 replaced
    replaced = prepare_data(_text_task(registry, text), data, quiet=True).manifest
    assert replaced["splits"]["train"]["shards_reused"] == 3
    changed = [
        a["name"] for a, b in zip(after["shards"], replaced["shards"]) if a["key"] != b["key"]
    ]
    assert changed == ["train.00001"]


def test_cleaning_counts_what_each_rule_dropped(registry, tmp_path, capsys):
    """Empty sides, copies, duplicates and over-long pairs dropped and counted in the manifest
    and in what `s2s prepare` prints; dev pairs never cleaned."""
    good = [(f"a house number {i}", f"ein Haus Nummer {i}") for i in range(40)]
    bad = [("", "leer"), ("same text", "same text"), good[0], good[1], (" x" * 300, "y")]
    text = tmp_path / "text"
    _write(text, good + bad)
    for lang in ("en", "de"):
        (text / f"valid.{lang}").write_text("same text\n", "utf-8")
    code, out, err = s2s(
        capsys,
        "prepare",
        "own_translation",
        f"task.data_dir={text}",
        "task.test_prefix=",
        "task.drop_empty=false",
        "task.vocab_size=400",
        "data.max_len=100",
        "data.clean=[empty,same,duplicate]",
        f"data.cache_dir={tmp_path / 'cache'}",
    )
    assert code == 0, err
    assert "train: 40 pairs" in out and "valid: 1 pairs" in out
    assert "cleaning: 5 dropped (empty 1, same 1, duplicate 2, max_len 1)" in out
    cache = next(p for p in (tmp_path / "cache").iterdir() if p.is_dir())
    manifest = json.loads((cache / MANIFEST).read_text())
    assert manifest["splits"]["train"]["dropped"] == {
        "empty": 1,
        "same": 1,
        "duplicate": 2,
        "max_len": 1,
        "len_ratio": 0,
        "duplicate_across_shards": 0,
    }


@pytest.mark.parametrize(
    "override, needle",
    [
        ("data.clean=[empty,langid]", "data.clean"),
        ("data.shard_pairs=10", "data.shard_pairs=10"),
        ("data.workers=-1", "data.workers=-1"),
        ("--node-rank=2", "--nodes 1 --node-rank 2"),
    ],
)
def test_bad_data_settings_fail_in_one_line(tmp_path, capsys, override, needle):
    before = snapshot(tmp_path)
    result = s2s(capsys, "prepare", "demo", override, f"data.cache_dir={tmp_path / 'c'}")
    fails(result, before, needle)


class _FailsInWorkers(DemoTask):
    """The demo task, whose sources cannot be encoded in any process but the one that made it."""

    def encode_source(self, lines):
        if os.getpid() != self.parent:
            raise DataError("a line this task cannot encode")
        return super().encode_source(lines)


def test_a_worker_process_that_fails_is_named_in_one_line_and_leaves_nothing(registry, tmp_path):
    task = _demo(registry, train_size=2500)
    task.__class__ = _FailsInWorkers
    task.parent = os.getpid()
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=r"worker process binarising train\.0000\d failed: "):
        prepare_data(task, _data(cache, shard_pairs=1000, workers=2), quiet=True)
    assert not cache.exists() or not any(p.is_dir() for p in cache.iterdir())


def test_pairs_repeated_across_shards_are_dropped_once_and_counted(registry, tmp_path):
    """Shards of 1,000 pairs, later ones repeating pairs of earlier ones (one of them twice in
    its shard): training reads exactly the corpus without its repeats, in order, each repeat
    counted once; shards appended list only their own repeats, the others' lists kept; a shard
    replaced lists again the repeats of the shards after it, none of them binarised again."""
    en = (corpus(MULTI30K) / "train.en").read_text("utf-8").splitlines()
    de = (MULTI30K / "train.de").read_text("utf-8").splitlines()
    unique = list(dict.fromkeys((s.strip(), t.strip()) for s, t in zip(en, de) if s and t))
    fresh = iter(unique[1000:])
    pairs = unique[:1000]
    pairs += unique[:5] + [next(fresh) for _ in range(995)]  # shard 1: 5 pairs of shard 0
    pairs += unique[10:13] + pairs[1500:1502] + [unique[10]]  # shard 2: 5 repeats, one twice
    pairs += [next(fresh) for _ in range(994)]
    text, cache = tmp_path / "text", tmp_path / "cache"
    data = _data(cache, shard_pairs=1000, vocab_sample=1000, workers=1, clean=["duplicate"])
    _write(text, pairs)
    first = prepare_data(_text_task(registry, text), data, quiet=True)
    dropped = first.manifest["splits"]["train"]["dropped"]
    assert (dropped["duplicate"], dropped["duplicate_across_shards"]) == (1, 10)
    assert [e["dropped"]["duplicate_across_shards"] for e in first.manifest["shards"]] == [0, 5, 5]
    train = first.splits["train"]
    assert len(train) == first.manifest["splits"]["train"]["pairs"] == 3000 - 11
    counted = first.manifest["splits"]["train"]
    assert (counted["src_tokens"], counted["tgt_tokens"]) == train.tokens
    _write(tmp_path / "once", list(dict.fromkeys(pairs)))
    alone = _data(tmp_path / "c1", vocab_sample=1000)  # the same vocabulary, one shard
    once = prepare_data(_text_task(registry, tmp_path / "once"), alone, quiet=True).splits["train"]
    _same_pairs(once, train)

    batches = epoch_batches(train, max_tokens=2000, seed=1, epoch=3)  # each pair once an epoch
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(len(train)))
    same = epoch_batches(once, max_tokens=2000, seed=1, epoch=3)
    assert len(batches) == len(same) and all(map(np.array_equal, batches, same))

    lists = {
        e["name"]: os.stat(first.directory / f"{e['name']}.dup.npy").st_ino
        for e in first.manifest["shards"]
    }
    pairs += pairs[1000:1004] + [next(fresh) for _ in range(996)]  # shard 3: 4 of shard 0
    _write(text, pairs)
    grown = prepare_data(_text_task(registry, text), data, quiet=True)
    after = grown.manifest
    assert after["splits"]["train"]["shards_reused"] == 3
    assert [e["dropped"]["duplicate_across_shards"] for e in after["shards"]] == [0, 5, 5, 4]
    assert after["splits"]["train"]["dropped"]["duplicate_across_shards"] == 14
    for name, inode in lists.items():  # the earlier shards' lists: not computed again
        assert os.stat(grown.directory / f"{name}.dup.npy").st_ino == inode
    assert len(grown.splits["train"]) == 4000 - 15

    inode = {
        f"{e['name']}.{kind}": os.stat(grown.directory / f"{e['name']}.{kind}.npy").st_ino
        for e in after["shards"]
        for kind in ("src.off", "dup")
    }
    _write(text, pairs[:1000] + [next(fresh) for _ in range(1000)] + pairs[2000:])
    replaced = prepare_data(_text_task(registry, text), data, quiet=True)  # shard 1 replaced
    now = replaced.manifest
    assert now["splits"]["train"]["shards_reused"] == 3
    assert [e["dropped"]["duplicate_across_shards"] for e in now["shards"]] == [0, 0, 3, 4]
    assert len(replaced.splits["train"]) == 4000 - 8  # shard 2's 2 repeats of shard 1 kept now
    # shards 0, 2 and 3 not binarised again; the lists of 2 and 3 made again from the hashes
    kept = {n for n, i in inode.items() if os.stat(replaced.directory / f"{n}.npy").st_ino == i}
    assert kept == {"train.00000.src.off", "train.00000.dup"} | {
        f"train.0000{i}.src.off" for i in (2, 3)
    }


def _prepare_argv(text, cache, *extra):
    """`s2s prepare` of 2 nodes' Multi30k corpus, after `python -m`."""
    argv = ["s2s.core.apps.cli", "prepare", "own_translation", f"task.data_dir={text}"]
    argv += ["task.test_prefix=", "task.vocab_size=400", "data.shard_pairs=1000"]
    argv += ["data.vocab_sample=1000", "data.workers=1", "data.clean=[duplicate]"]
    return [*argv, f"data.cache_dir={cache}", *extra, "--nodes", "2"]


def _prepare_on_node(text, cache, rank, *extra):
    """`s2s prepare` as node `rank` of 2, started in a process of its own; returns what waits
    for it: (exit code, stdout, stderr). Its output goes to files beside the cache: a pipe
    left unread while the other node is waited for could fill and stall it."""
    said = [open(f"{cache}.node{rank}.{kind}", "w+", encoding="utf-8") for kind in ("out", "err")]
    proc = subprocess.Popen(
        [sys.executable, "-m", *_prepare_argv(text, cache, *extra), "--node-rank", str(rank)],
        stdout=said[0],
        stderr=said[1],
    )

    def finished():
        try:
            code = proc.wait(timeout=300)
        finally:
            proc.kill()  # a node left waiting (the test failed) stops with it
        for f in said:
            f.seek(0)
        out, err = (f.read() for f in said)
        for f in said:
            f.close()
        return code, out, err

    return finished


def _node_corpus(folder):
    """3,510 Multi30k pairs, the last 10 repeating pairs of the first shard; a dev pair."""
    en = (corpus(MULTI30K) / "train.en").read_text("utf-8").splitlines()
    de = (MULTI30K / "train.de").read_text("utf-8").splitlines()
    pairs = list(zip(en, de))[:3500]
    _write(folder, pairs + pairs[100:110])
    for lang in ("en", "de"):
        (folder / f"valid.{lang}").write_text("a house\n", "utf-8")
    return pairs


@pytest.mark.slow
def test_two_nodes_prepare_one_corpus_as_one_node_does(registry, tmp_path, capsys):
    """Two processes playing two nodes on one cache folder: node 1 binarises shards 1 and 3,
    node 0 the vocabulary, shards 0 and 2 and the manifest; the cache's files are those one
    node makes alone, repeats across shards counted in both nodes' output. Node 0 alone waits
    run.wait_minutes, then names the shard missing in one line."""
    text = tmp_path / "text"
    pairs = _node_corpus(text)
    helper = _prepare_on_node(text, tmp_path / "cache", 1)  # first: it waits for the vocabulary
    node0 = _prepare_on_node(text, tmp_path / "cache", 0)
    (code0, out0, err0), (code1, out1, err1) = node0(), helper()
    assert code0 == 0 and code1 == 0, err0 + err1
    assert out0 == out1 and "duplicate_across_shards 10" in out0
    assert "node 1: 2 training shard(s) binarised" in err1
    code, alone, err = s2s(
        capsys, "prepare", "own_translation", f"task.data_dir={text}", "task.test_prefix=",
        "task.vocab_size=400", "data.shard_pairs=1000", "data.vocab_sample=1000",
        "data.workers=1", "data.clean=[duplicate]", f"data.cache_dir={tmp_path / 'one'}",
    )  # fmt: skip
    assert code == 0, err
    assert alone.replace(str(tmp_path / "one"), str(tmp_path / "cache")) == out0
    built = {}
    for cache in ("cache", "one"):
        folder = next(p for p in (tmp_path / cache).iterdir() if p.is_dir())
        built[cache] = json.loads((folder / MANIFEST).read_text())["files"]
        assert [p.name for p in (tmp_path / cache).iterdir() if ".nodes" in p.name] == []
    assert built["cache"] == built["one"]

    _write(text, pairs)  # changed: shard 3 is another node's, and nobody binarises it
    code, _, err = _prepare_on_node(text, tmp_path / "cache", 0, "run.wait_minutes=0.02")()
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "shard train.00003 (training pairs 3000 to 3499)" in errors[0]
    assert "node 1 of 2" in errors[0] and "run.wait_minutes=0.02" in errors[0]


@pytest.mark.slow
def test_two_torchrun_agents_prepare_as_nodes_by_their_group_rank(tmp_path):
    """`torchrun --nnodes 2` (one process a node, c10d rendezvous on 127.0.0.1): `s2s prepare
    --nodes 2` takes each node's rank from GROUP_RANK; the cache is the one two nodes make."""
    text = tmp_path / "text"
    _node_corpus(text)
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"]
            + [f"--node-rank={node}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
            + ["--rdzv-id=s2s-prepare", "-m", *_prepare_argv(text, tmp_path / "cache")],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=open(tmp_path / f"node{node}.out", "w"),
            stderr=open(tmp_path / f"node{node}.log", "w"),
        )
        for node in (0, 1)
    ]
    try:
        codes = [agent.wait(timeout=300) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    said = [(tmp_path / f"node{node}.log").read_text() for node in (0, 1)]
    assert codes == [0, 0], said[0][-3000:] + said[1][-3000:]
    # c10d's rendezvous, not --node-rank, numbers the nodes (GROUP_RANK): either may be node 1
    assert sum("node 1: 2 training shard(s) binarised" in log for log in said) == 1
    for node in (0, 1):
        assert "duplicate_across_shards 10" in (tmp_path / f"node{node}.out").read_text()
