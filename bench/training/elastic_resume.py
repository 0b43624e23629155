"""Resume across kills and process counts, as a SIGKILL campaign (issue 44).

    python -m bench.training.elastic_resume [--same 20] [--across 10] [--updates 100] [--seed 0]
    python -m bench.training.elastic_resume --same 0 --across 0 --torchrun     # only torchrun's parts

A tiny demo model (1 layer, d_model 32, dropout 0.1, validation every 30 updates, a checkpoint
every 20) trains `--updates` updates through the real command line, `python -m s2s.core.apps.cli
train`, in 1 process or in 2 gloo processes given the environment torchrun gives its workers.
Every run is killed with SIGKILL once metrics.jsonl shows an update drawn at random (between the
first checkpoint and the end), then the same command is run again (at the same or another process
count) and its final checkpoint is compared with that of a run never stopped:

* `--same` kills, alternating 1 and 2 processes, each resumed at its own count: the final
  parameters and Adam's moments must be bit for bit those of the unbroken run;
* `--across` kills at 2 processes resumed at 1 with optim.update_freq 2, and as many at 1
  (update_freq 2) resumed at 2: parameters within 1e-5 relative (the largest difference is
  recorded), and the same number of training pairs seen (metrics.jsonl's `sentences`).

With `--torchrun`, two more, through torchrun itself (gloo, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1):
* restarts: 2 processes under `--max-restarts 2`, one worker SIGKILLed twice (after updates 30
  and 70): the run must finish, with two restart records, to the unbroken 2-process run's
  parameters;
* two agents (`--nnodes 2 --nproc_per_node 1`, c10d rendezvous on 127.0.0.1) against one agent
  with 2 processes, 50 updates: parameters within 1e-5 relative.

Adam's eps is 1e-6 (not the paper's 1e-9, which scales rounding noise in gradients that should be
0 up to lr-sized steps; tests/core/training/test_distributed.py says more). Writes
bench/training/results/elastic_resume.json with every kill's update, outcome and the machine's facts.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from s2s.core.runs import checkpoint  # noqa: E402

from bench.common import free_port, machine, write  # noqa: E402


def overrides(run_dir: Path, cache: Path, updates: int, update_freq: int) -> list[str]:
    return [
        "model.layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.heads=2",
        "model.dropout=0.1",
        f"run.dir={run_dir}",
        f"data.cache_dir={cache}",
        "task.train_size=400",
        "task.valid_size=6",
        "task.test_size=4",
        "data.max_tokens=300",
        "optim.warmup=20",
        "optim.eps=1e-6",
        f"optim.update_freq={update_freq}",
        f"optim.max_updates={updates}",
        "run.log_interval=1",
        "run.valid_interval=30",
        "run.save_interval=20",
        "run.keep_last=2",
        "run.threads=1",
        "run.device=cpu",
    ]


def launch(args: list[str], world: int, log: Path) -> list[subprocess.Popen]:
    """`s2s train -q demo ARGS` in `world` processes, with the variables torchrun sets."""
    cmd = [sys.executable, "-m", "s2s.core.apps.cli", "train", "-q", "demo", *args]
    port, procs = free_port(), []
    for rank in range(world):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if world > 1:
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        out = open(f"{log}.rank{rank}", "w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def finish(procs: list[subprocess.Popen], log: Path) -> None:
    for p in procs:
        p.wait(timeout=600)
    if any(p.returncode for p in procs):
        raise SystemExit(f"a run failed: see {log}.rank*")


def last_update(run_dir: Path) -> int:
    found = [0]
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            found.append(json.loads(line)["update"])
        except (ValueError, KeyError):
            pass  # a line being written
    return max(found)


def kill_at(procs: list[subprocess.Popen], run_dir: Path, update: int) -> int:
    """SIGKILL every process once metrics.jsonl shows `update`; the update it had reached."""
    deadline = time.time() + 600
    while last_update(run_dir) < update:
        if any(p.poll() is not None for p in procs) or time.time() > deadline:
            raise SystemExit(f"the run ended or stalled before update {update}: {run_dir}")
        time.sleep(0.002)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()
    return last_update(run_dir)


def torchrun(args: list[str], log: Path, *options: str) -> subprocess.Popen:
    """`torchrun OPTIONS --no-python s2s train -q demo ARGS` (the console script beside this
    Python), gloo, restarts that connect."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", *options]
    cmd += ["--no-python", str(Path(sys.executable).with_name("s2s")), "train", "-q", "demo", *args]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def workers(pid: int) -> list[int]:
    """The processes whose parent is `pid`: torchrun's workers."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def torchrun_parts(tmp: Path, cache: Path, updates: int) -> dict:
    """A worker SIGKILLed twice under --max-restarts 2; two agents against one."""
    whole = tmp / "tr_whole"
    standalone = ("--standalone", "--nproc_per_node=2")
    if torchrun(overrides(whole, cache, updates, 1), tmp / "tr_whole.log", *standalone).wait():
        raise SystemExit(f"torchrun failed: {tmp / 'tr_whole.log'}")
    broken = tmp / "tr_restarts"
    proc = torchrun(
        overrides(broken, cache, updates, 1), tmp / "tr.log", *standalone, "--max-restarts=2"
    )
    killed = []
    for at in (30, 70):
        deadline = time.time() + 600
        while last_update(broken) < at and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        victim = workers(proc.pid)[-1]
        os.kill(victim, signal.SIGKILL)
        killed.append(last_update(broken))
        time.sleep(1.0)
    code = proc.wait(timeout=600)
    records = [json.loads(x) for x in (broken / "metrics.jsonl").read_text().splitlines()]
    restarts = {
        "returncode": code,
        "killed_at": killed,
        "restart_records": [r for r in records if r["kind"] == "restart"],
        **compare(whole, broken),
    }
    endpoint = f"127.0.0.1:{free_port()}"
    two = tmp / "tr_two_agents"
    agents = [
        torchrun(
            overrides(two, cache, 50, 1),
            tmp / f"agent{node}.log",
            "--nnodes=2",
            "--nproc_per_node=1",
            f"--node-rank={node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=s2s-bench",
        )
        for node in (0, 1)
    ]
    one = tmp / "tr_one_agent"
    codes = [a.wait(timeout=600) for a in agents]
    codes.append(torchrun(overrides(one, cache, 50, 1), tmp / "one.log", *standalone).wait())
    return {"restarts": restarts, "two_agents": {"returncodes": codes, **compare(one, two)}}


def pairs_seen(run_dir: Path) -> int:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(r["sentences"] for r in records if r["kind"] == "train")


def compare(whole: Path, broken: Path) -> dict:
    a = checkpoint.load(checkpoint.listed(whole)[-1])
    b = checkpoint.load(checkpoint.listed(broken)[-1])

    def rel(x, y):
        return ((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-30)).item()

    moments = [
        (sa[key], b["optimizer"]["state"][i][key])
        for i, sa in a["optimizer"]["state"].items()
        for key in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "updates": [a["update"], b["update"]],
        "bitwise": all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        and all(torch.equal(x, y) for x, y in moments),
        "max_relative": max(rel(b["model"][k], a["model"][k]) for k in a["model"]),
        "pairs": [pairs_seen(whole), pairs_seen(broken)],
        "streams_equal": a["streams"] == b["streams"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--same", type=int, default=20, help="kills resumed at the same count")
    p.add_argument("--across", type=int, default=10, help="kills each way, 2->1 and 1->2")
    p.add_argument("--updates", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--torchrun", action="store_true", help="also torchrun's restarts and two agents"
    )
    args = p.parse_args()
    rng = random.Random(args.seed)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="s2s-elastic-") as tmp:
        tmp = Path(tmp)
        cache = tmp / "cache"
        unbroken = {}  # (processes, update_freq) -> run dir
        for world, freq in ((1, 1), (2, 1), (1, 2)):
            d = tmp / f"whole_{world}x{freq}"
            finish(
                launch(overrides(d, cache, args.updates, freq), world, tmp / d.name), tmp / d.name
            )
            unbroken[world, freq] = d
        plan = [("same", w, w) for w in [1, 2] * (args.same // 2)]
        plan += [("across", 2, 1)] * args.across + [("across", 1, 2)] * args.across
        freq = {("same", 1): 1, ("same", 2): 1, ("across", 1): 2, ("across", 2): 1}
        kills = []
        for n, (kind, written, resumed) in enumerate(plan):
            d = tmp / f"kill{n}"
            at = rng.randint(21, args.updates - 1)
            f_w, f_r = freq[kind, written], freq[kind, resumed]
            reached = kill_at(
                launch(overrides(d, cache, args.updates, f_w), written, tmp / f"{d.name}.a"), d, at
            )
            finish(
                launch(overrides(d, cache, args.updates, f_r), resumed, tmp / f"{d.name}.b"),
                tmp / f"{d.name}.b",
            )
            row = {
                "kind": kind,
                "written_by": written,
                "resumed_by": resumed,
                "killed_at": reached,
                **compare(unbroken[written, f_w], d),
            }
            kills.append(row)
            print(json.dumps(row), flush=True)
        torchrun_found = torchrun_parts(tmp, cache, args.updates) if args.torchrun else None
        print(json.dumps(torchrun_found), flush=True)
    same = [k for k in kills if k["kind"] == "same"]
    across = [k for k in kills if k["kind"] == "across"]
    result = {
        "command": " ".join(["python -m bench.training.elastic_resume", *sys.argv[1:]]),
        "machine": machine(),
        "seconds": round(time.time() - t0, 1),
        "same": {
            "kills": len(same),
            "bitwise": sum(k["bitwise"] for k in same),
            "pairs_equal": sum(k["pairs"][0] == k["pairs"][1] for k in same),
        },
        "across": {
            "kills": len(across),
            "within_1e-5": sum(k["max_relative"] < 1e-5 for k in across),
            "max_relative": max((k["max_relative"] for k in across), default=None),
            "pairs_equal": sum(k["pairs"][0] == k["pairs"][1] for k in across),
            "streams_equal": sum(k["streams_equal"] for k in across),
        },
        "kills_detail": kills,
        "torchrun": torchrun_found,
    }
    print(json.dumps({k: result[k] for k in ("same", "across", "seconds")}))
    name = "elastic_resume" if kills else "elastic_resume_torchrun"
    print(f"wrote {write(name, result)}")


if __name__ == "__main__":
    main()
