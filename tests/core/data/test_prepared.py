"""Binarised data and token-count batches."""

import os

import numpy as np
import pytest
from omegaconf import OmegaConf
from s2s.core.data.batches import epoch_batches, token_batches
from s2s.core.data.nodes import prepare_data
from s2s.core.errors import DataError
from s2s.core.setup.settings import DataConfig
from s2s.core.tokenizers import BOS, EOS, PAD


def test_batches_respect_max_tokens_and_cover_every_pair_once():
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 60, 5000), rng.integers(1, 60, 5000)
    batches = token_batches(src, tgt, max_tokens=1000, seed=3)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(5000))
    for b in batches:
        assert len(b) == 1 or (src[b].max() * len(b) <= 1000 and tgt[b].max() * len(b) <= 1000)
    padding = sum(tgt[b].max() * len(b) - tgt[b].sum() for b in batches) / tgt.sum()
    assert padding < 0.05  # grouping by length keeps padding small
    assert all(np.array_equal(a, b) for a, b in zip(batches, token_batches(src, tgt, 1000, seed=3)))


def test_an_epochs_batches_are_one_list_for_any_number_of_processes():
    """Every pair of the split in exactly one batch, the same list for the same (seed, epoch),
    another order for another epoch; how processes share it is the schedule's
    (tests/core/training/test_schedule.py)."""
    from s2s.core.data.cache import Split

    lens = np.random.default_rng(1).integers(1, 30, 999)
    off = np.concatenate([[0], np.cumsum(lens)])
    split = Split(np.zeros(off[-1], np.int32), np.zeros(off[-1], np.int32), off, off)
    first = epoch_batches(split, 200, seed=1, epoch=0)
    assert sorted(np.concatenate(first).tolist()) == list(range(999))
    again = epoch_batches(split, 200, seed=1, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, epoch_batches(split, 200, 1, 1)))


def _demo(registry, **kw):
    cls = registry.get("demo")
    return cls(OmegaConf.merge(OmegaConf.structured(cls.Config), kw))


def test_prepare_binarises_and_caches(registry, tmp_path):
    task = _demo(registry, train_size=300, valid_size=20, test_size=20)
    cfg = OmegaConf.structured(DataConfig(cache_dir=str(tmp_path)))
    prepared = prepare_data(task, cfg, quiet=True)
    train = prepared.splits["train"]
    assert len(train) == 300
    pairs = list(task.read_split("train"))
    b = train.batch([0, 1])
    src0 = task.encode_source([pairs[0][0]])[0] + [EOS]
    tgt0 = task.encode_target([pairs[0][1]])[0]
    assert b["src"][0, : len(src0)].tolist() == src0
    assert b["tgt_in"][0, : len(tgt0) + 1].tolist() == [BOS] + tgt0
    assert b["tgt_out"][0, : len(tgt0) + 1].tolist() == tgt0 + [EOS]
    assert (b["src"][0, len(src0) :] == PAD).all()
    sources, refs = prepared.texts("test")
    assert len(sources) == len(refs) == 20
    # cached: a second prepare reads the folder instead of rebuilding it
    stamp = (prepared.directory / "prepared.json").stat().st_mtime_ns
    again = prepare_data(
        _demo(registry, train_size=300, valid_size=20, test_size=20), cfg, quiet=True
    )
    assert again.directory == prepared.directory
    assert (again.directory / "prepared.json").stat().st_mtime_ns == stamp
    # another task setting: another folder
    other = prepare_data(
        _demo(registry, train_size=200, valid_size=20, test_size=20), cfg, quiet=True
    )
    assert other.directory != prepared.directory


def test_failed_prepare_leaves_no_half_written_folder(registry, tmp_path):
    task = _demo(registry, train_size=50, valid_size=0, test_size=5)  # an empty valid split
    cfg = OmegaConf.structured(DataConfig(cache_dir=str(tmp_path)))
    with pytest.raises(DataError, match="valid"):
        prepare_data(task, cfg, quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_a_killed_preparation_s_folder_is_removed_on_its_machine_only(tmp_path):
    """The cache's temporaries carry HOST-PID (the cache may be shared by machines): one whose
    process is gone on this machine is removed; another machine's, or a live one's, stays."""
    import socket
    import subprocess
    import sys

    from s2s.core.files import remove_stale_temporaries

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead = int(done.stdout)
    host = socket.gethostname()
    mine = tmp_path / f".demo-abc.tmp{host}-{dead}"
    theirs = tmp_path / f".demo-abc.tmpother-machine-{dead}"
    alive = tmp_path / f".demo-abc.tmp{host}-{os.getpid()}"
    for folder in (mine, theirs, alive):
        folder.mkdir()
    assert remove_stale_temporaries(tmp_path) == [mine]
    assert theirs.is_dir() and alive.is_dir()
