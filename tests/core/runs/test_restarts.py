"""torchrun's restarts: a worker killed under `torchrun --max-restarts` makes torchrun start the
group again, and s2s resumes from the newest checkpoint on its own, to the parameters of a run
never stopped (bit for bit on CPU: the same processes, so the same path); metrics.jsonl marks each
restart. A run directory that another training holds stops every attempt with one line naming
its lock. torchrun runs with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which its restarts need
(`s2s.core.runs.distributed.SHARED_STORE`).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import train_argv
from s2s.core.runs import checkpoint, directory

pytestmark = pytest.mark.slow
UPDATES = 150


def _torchrun(run_dir: Path, cache: Path, log: Path, restarts: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--max-restarts={restarts}",
        *train_argv(
            run_dir,
            cache,
            f"optim.max_updates={UPDATES}",
            "run.save_interval=20",
            "run.valid_interval=100",
            "run.log_interval=1",
        ),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _workers(pid: int) -> list[int]:
    """The processes whose parent is `pid` (torchrun's workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return out


def _wait_for_update(proc, run_dir: Path, update: int, log: Path) -> None:
    deadline = time.time() + 180
    while max((r["update"] for r in _records(run_dir)), default=0) < update:
        assert proc.poll() is None, "torchrun ended early:\n" + log.read_text()[-3000:]
        assert time.time() < deadline, "no progress:\n" + log.read_text()[-3000:]
        time.sleep(0.05)


def test_a_worker_killed_twice_under_max_restarts_resumes_to_the_unbroken_run(tmp_path):
    cache = tmp_path / "cache"
    whole = _torchrun(tmp_path / "whole", cache, tmp_path / "whole.log", restarts=0)
    assert whole.wait(timeout=240) == 0, (tmp_path / "whole.log").read_text()[-3000:]

    run, log = tmp_path / "broken", tmp_path / "broken.log"
    proc = _torchrun(run, cache, log, restarts=2)
    try:
        for at in (30, 90):  # past a checkpoint (every 20 updates), twice
            _wait_for_update(proc, run, at, log)
            victim = _workers(proc.pid)[-1]  # rank 1 one time, rank 0 the other
            os.kill(victim, signal.SIGKILL)
            time.sleep(1.0)
        assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    restarts = [r for r in _records(run) if r["kind"] == "restart"]
    assert [r["restarts"] for r in restarts] == [1, 2], restarts
    assert all(r["update"] % 20 == 0 for r in restarts)  # each resumed from a checkpoint
    a = checkpoint.load(checkpoint.listed(tmp_path / "whole")[-1])
    b = checkpoint.load(checkpoint.listed(run)[-1])
    assert a["update"] == b["update"] == UPDATES
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert (run / "result.json").is_file() and not list(run.rglob("*.tmp*"))
    updates = [r["update"] for r in _records(run) if r["kind"] == "train"]
    assert updates == list(range(1, UPDATES + 1))  # the redone updates replaced their records


def test_a_run_directory_another_training_holds_stops_every_attempt_naming_the_lock(tmp_path):
    run = tmp_path / "held"
    run.mkdir()
    lock = directory.claim(run)
    try:
        log = tmp_path / "held.log"
        proc = _torchrun(run, tmp_path / "cache", log, restarts=1)
        assert proc.wait(timeout=240) != 0
        said = [line for line in log.read_text().splitlines() if "s2s train: error" in line]
        assert said and all(f"holds {run / '.lock'}" in line for line in said), said
        assert not any("Traceback" in line for line in said)
    finally:
        lock.close()
