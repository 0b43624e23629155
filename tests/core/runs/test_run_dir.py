"""A run directory is owned (issue 24): one training at a time, only s2s's own files, finished
runs protected; and a prepared cache is never rewritten under the training that reads it.

Through the real command line: exit code, one line naming the file, no traceback, and every
file that was there before unchanged.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from s2s.core.apps.cli import main
from s2s.core.data.members import build_task
from s2s.core.data.nodes import prepare_data
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from conftest import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "run.quiet=true",
    "task.train_size=200",
    "task.valid_size=10",
    "task.test_size=10",
    "run.valid_interval=2",
    "run.save_interval=1",
]


def _hashes(root: Path) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fails(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def test_a_second_training_on_one_run_dir_exits_naming_the_lock_and_a_killed_holder_blocks_nothing(
    tmp_path,
):
    run, cache = tmp_path / "run", tmp_path / "cache"
    argv = [
        sys.executable,
        "-m",
        "s2s.core.apps.cli",
        "train",
        "demo",
        "-q",
        *TINY,
        f"run.dir={run}",
        f"data.cache_dir={cache}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [*argv, "optim.max_updates=100000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):  # the holder has trained a first checkpoint: well inside its run
            if list((run / "checkpoints").glob("checkpoint_*.pt")) or first.poll() is not None:
                break
            time.sleep(0.1)
        assert first.poll() is None, first.stderr.read()
        second = subprocess.run(
            [*argv, "optim.max_updates=3"], env=env, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2, second.stderr
        assert "Traceback" not in second.stderr and str(run / ".lock") in second.stderr, (
            second.stderr
        )
        assert f"process {first.pid}" in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    kept = sorted(run.glob("checkpoints/checkpoint_*.pt"))[-1]
    third = subprocess.run(
        [*argv, f"optim.max_updates={int(kept.stem.split('_')[1]) + 2}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert third.returncode == 0, third.stderr[-2000:]
    assert "resumed from" in third.stderr


def test_a_folder_holding_other_files_is_refused_and_left_as_it_was(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my: own config\n")
    (mine / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = _hashes(mine)
    _fails(
        capsys,
        [
            "train",
            "demo",
            "-q",
            *TINY,
            "optim.max_updates=2",
            f"run.dir={mine}",
            f"data.cache_dir={tmp_path / 'cache'}",
        ],
        str(mine),
        "s2s did not write",
        "config.yaml",
    )
    assert _hashes(mine) == before


def test_a_finished_run_without_its_checkpoints_is_an_error_not_a_fresh_start(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [
        "train",
        "demo",
        "-q",
        *TINY,
        "optim.max_updates=2",
        f"run.dir={run}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    assert main(argv) == 0
    capsys.readouterr()
    for p in (run / "checkpoints").glob("checkpoint_*.pt"):
        p.unlink()
    before = _hashes(run)
    _fails(
        capsys, [*argv, "optim.max_updates=4"], str(run), "no readable checkpoint", "result.json"
    )
    assert _hashes(run) == before


def test_a_prepare_that_rebuilds_the_cache_leaves_a_reader_its_batches(tmp_path):
    """A training reads its batches through the files it opened at load; `s2s prepare` after
    the corpus changed rebuilds the same cache and switches the new folder in beside them."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the a cat dog sees holds big small man bird tree ball likes every".split()
    rng = np.random.default_rng(0)

    def write(n_train: int):
        for split, n in (("train", n_train), ("valid", 8), ("test", 8)):
            lines = [" ".join(rng.choice(words, size=rng.integers(2, 8))) for _ in range(n)]
            (corpus / f"{split}.en").write_text("".join(line + "\n" for line in lines))
            (corpus / f"{split}.de").write_text("".join(line.upper() + "\n" for line in lines))

    write(60)
    registry = Registry.installed()
    cfg = load_config(
        None,
        [
            "task.name=translation",
            "task.source=text",
            f"task.data_dir={corpus}",
            "task.vocab_size=300",
            f"data.cache_dir={tmp_path / 'cache'}",
        ],
        registry=registry,
    )
    reader = prepare_data(build_task(cfg.task, registry), cfg.data, quiet=True)
    train = reader.splits["train"]
    indices = np.arange(len(train))
    before, sources = train.batch(indices), reader.texts("valid")

    write(90)  # the corpus changes while the training runs, and someone prepares again
    rebuilt = prepare_data(build_task(cfg.task, registry), cfg.data, quiet=True)
    assert rebuilt.directory == reader.directory and len(rebuilt.splits["train"]) == 90

    after = train.batch(indices)
    for key in ("src", "tgt_in", "tgt_out"):
        assert (before[key] == after[key]).all()
    assert reader.texts("valid") == sources != rebuilt.texts("valid")
