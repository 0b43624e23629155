"""Multi-node, rehearsed on one machine: two torchrun agents (`--nnodes 2`, one process each,
c10d rendezvous on 127.0.0.1, gloo) train the steps of one agent with 2 processes: the same
ranks, batches and dropout masks, so the same parameters (within 1e-5 relative; on CPU they come
out bit for bit). The run directory and data cache are shared, as on a shared file system.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, train_argv
from s2s.core.runs import checkpoint

pytestmark = pytest.mark.slow
UPDATES = 50


def _train(run_dir: Path, cache: Path) -> list[str]:
    every = ("run.save_interval=25", "run.valid_interval=25")
    return train_argv(run_dir, cache, f"optim.max_updates={UPDATES}", *every)


def _relative(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def test_two_agents_with_one_process_each_train_the_steps_of_one_agent_with_two(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cache = tmp_path / "cache"
    run = [sys.executable, "-m", "torch.distributed.run"]
    one = subprocess.run(
        [*run, "--standalone", "--nproc_per_node=2", *_train(tmp_path / "one", cache)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert one.returncode == 0, one.stderr[-3000:]

    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [
                *run,
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node-rank={node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                "--rdzv-id=s2s-rehearsal",
                *_train(tmp_path / "two", cache),
            ],
            env=env,
            stdout=open(tmp_path / f"node{node}.log", "w"),
            stderr=subprocess.STDOUT,
        )
        for node in (0, 1)
    ]
    for node, agent in enumerate(agents):
        assert agent.wait(timeout=240) == 0, (tmp_path / f"node{node}.log").read_text()[-3000:]

    a = checkpoint.load(checkpoint.listed(tmp_path / "one")[-1])
    b = checkpoint.load(checkpoint.listed(tmp_path / "two")[-1])
    assert a["update"] == b["update"] == UPDATES
    assert b["global_batch"] == {"max_tokens": 300, "update_freq": 1, "processes": 2}
    worst = max(_relative(b["model"][k], a["model"][k]) for k in a["model"])
    assert worst < 1e-5, f"parameters differ by {worst:.2e} relative"
    assert (tmp_path / "two" / "result.json").is_file()
