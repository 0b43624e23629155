"""Runs that stop and go on: SIGKILL and resume, damaged checkpoints, non-finite updates,
time-based checkpoints, the checks made before training, and watching a run.

The SIGKILL tests start real `python -m s2s.core.apps.cli train` processes (one, or two gloo
processes given the environment torchrun gives its workers), kill them with SIGKILL once
metrics.jsonl shows update KILL_AT, re-run the same command, and require the checkpoint of the
last update to equal, bit for bit, that of a run never stopped. Dropout is on and validation
runs in between, so the data position and every batch's dropout masks must both come back
exactly. A run killed at one process count resumes at another with the same global batch
(processes x optim.update_freq), to the unbroken run's parameters within the reduction's rounding.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import s2s.core.nn.model as model_mod
import s2s.core.training.trainer as train_mod
import torch
from conftest import demo_process_run, free_port
from omegaconf import OmegaConf
from s2s.core.apps.cli import main
from s2s.core.data.members import build_task
from s2s.core.errors import ConfigError, TrainingError
from s2s.core.setup.config import load_config
from s2s.core.runs import checkpoint, directory
from s2s.core.training.trainer import train

UPDATES, KILL_AT = 100, 30
AUGMENT = ("data.augment_case=0.3", "data.augment_punct=0.3", "data.augment_typos=0.2")
#: the demo's 20,000 pairs in 4 shards, 70 of them repeats of an earlier shard's (skipped)
REPEATS = ("data.clean=[duplicate]", "data.shard_pairs=5000")


def _overrides(run_dir, cache, run_precision="fp32", preset="demo", extra=()):
    return demo_process_run(
        run_dir,
        cache,
        f"run.precision={run_precision}",
        "optim.warmup=20",
        f"optim.max_updates={UPDATES}",
        "run.log_interval=1",
        "run.valid_interval=30",
        "run.save_interval=20",
        "run.keep_last=2",
        *extra,
        preset=preset,
    )


def _launch(run_dir, cache, world, log_name, run_precision="fp32", preset="demo", extra=()):
    """`s2s train` in `world` processes, each with the variables torchrun sets for its workers."""
    cmd = [
        sys.executable,
        "-m",
        "s2s.core.apps.cli",
        "train",
        "-q",
        preset,
        *_overrides(run_dir, cache, run_precision, preset, extra),
    ]
    port = free_port()
    procs = []
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
        log = open(run_dir.parent / f"{log_name}.rank{rank}.log", "w")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _logs(run_dir, log_name):
    return "".join(p.read_text() for p in sorted(run_dir.parent.glob(f"{log_name}.rank*.log")))


def _finish(procs, run_dir, log_name, timeout=180):
    for p in procs:
        p.wait(timeout=timeout)
    assert all(p.returncode == 0 for p in procs), _logs(run_dir, log_name)[-4000:]


def _last_update(run_dir) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    updates = [0]
    for line in path.read_text().splitlines():
        try:
            updates.append(json.loads(line)["update"])
        except (ValueError, KeyError):
            pass  # a line being written
    return max(updates)


def _kill_after(procs, run_dir, log_name, k):
    deadline = time.time() + 180
    while _last_update(run_dir) < k:
        assert all(p.poll() is None for p in procs), (
            "the run ended early:\n" + _logs(run_dir, log_name)[-4000:]
        )
        assert time.time() < deadline, "no progress:\n" + _logs(run_dir, log_name)[-4000:]
        time.sleep(0.005)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * len(procs)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The demo data, prepared once for every run of this module."""
    from s2s.core.data.nodes import prepare_data
    from s2s.core.setup.registry import Registry

    path = tmp_path_factory.mktemp("cache")
    registry = Registry.installed()
    cfg = load_config("demo", _overrides(path / "unused", path), registry=registry)
    prepare_data(build_task(cfg.task, registry), cfg.data, quiet=True)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "world, run_precision, preset, extra",
    [
        (1, "fp32", "demo", ()),
        (2, "fp32", "demo", ()),
        (1, "bf16", "demo", ()),
        (1, "fp32", "multitask_demo", ()),
        (2, "fp32", "multitask_demo", ()),
        (1, "fp32", "demo", AUGMENT),
        (2, "fp32", "demo", AUGMENT),
        (2, "fp32", "demo", REPEATS),
    ],
)
def test_sigkill_then_resume_is_bitwise_identical_to_an_uninterrupted_run(
    world, run_precision, preset, extra, cache, tmp_path, registry
):
    """bf16 too: the bf16 casts of the fp32 parameters are recomputed from them, bit for bit. And
    a multi-task run: its draws of members and every member's data position come back too. And
    with source noise on (case, punctuation, typos): each pair's noise comes back too. And with
    the pairs repeated across shards skipped."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    for d in (whole, broken):
        d.mkdir()
    if (
        world == 1
    ):  # the uninterrupted run: in this process (one thread, as the others) saves a start-up
        train(
            load_config(
                preset, _overrides(whole, cache, run_precision, preset, extra), registry=registry
            ),
            registry,
            quiet=True,
        )
    else:
        _finish(_launch(whole, cache, world, "whole", run_precision, preset, extra), whole, "whole")

    _kill_after(
        _launch(broken, cache, world, "killed", run_precision, preset, extra),
        broken,
        "killed",
        KILL_AT,
    )
    killed_at = _last_update(broken)
    saved = [checkpoint.load(p)["update"] for p in checkpoint.listed(broken)]
    assert not (broken / "result.json").exists() and killed_at < UPDATES and max(saved) < UPDATES
    _finish(
        _launch(broken, cache, world, "resumed", run_precision, preset, extra), broken, "resumed"
    )  # the same command again
    assert f"resumed from {checkpoint.listed(broken)[0].parent}" in _logs(broken, "resumed")

    a = checkpoint.load(checkpoint.listed(whole)[-1])
    b = checkpoint.load(checkpoint.listed(broken)[-1])
    assert a["update"] == b["update"] == UPDATES
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), (
            f"{k} differs after a kill at update {killed_at}"
        )
    for i, sa in a["optimizer"]["state"].items():
        for key, value in sa.items():
            assert torch.equal(value, b["optimizer"]["state"][i][key]), (i, key)
    assert a["streams"] == b["streams"]  # (epoch, batches taken in it) of each member
    assert all(epoch >= 1 for epoch, _ in a["streams"].values())
    vocab = (
        {"vocab.json"}
        if preset == "demo"
        else {"vocab/translate/vocab.json", "vocab/parse/vocab.json"}
    )
    assert a["global_batch"] == {"max_tokens": 300, "update_freq": 1, "processes": world}
    assert a["tokenizer"]["files"].keys() == vocab

    def figures(run_dir):  # what was logged, without the clock
        return [
            {
                k: v
                for k, v in json.loads(line).items()
                if k not in ("elapsed", "tgt_tokens_per_s", "seconds")
            }
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]

    # the updates redone after the kill replaced their first records: one record per update
    assert figures(broken) == figures(whole)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _pairs_seen(run_dir) -> int:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(r["sentences"] for r in records if r["kind"] == "train")


@pytest.mark.slow
@pytest.mark.parametrize("written, resumed", [(2, 1), (1, 2), (2, 2)])
def test_a_run_killed_at_one_process_count_resumes_at_another_with_the_same_global_batch(
    written, resumed, cache, tmp_path, registry
):
    """2 processes with update_freq 1 and 1 process with update_freq 2 train the same two
    batches an update, with the same dropout masks (dropout on): a checkpoint of either
    continues in the other to the parameters of a run never stopped, within the reduction's
    rounding, having seen the same pairs. Adam's eps is 1e-6 here: at the paper's 1e-9 Adam
    scales gradients that are rounding noise (~1e-10) up to lr-sized steps
    (tests/core/training/test_distributed.py says more)."""
    freq = {1: "optim.update_freq=2", 2: "optim.update_freq=1"}
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    for d in (whole, broken):
        d.mkdir()
    extra = ["optim.eps=1e-6"]
    cfg = load_config("demo", _overrides(whole, cache, extra=[freq[1], *extra]), registry=registry)
    train(cfg, registry, quiet=True)
    procs = _launch(broken, cache, written, "killed", extra=[freq[written], *extra])
    _kill_after(procs, broken, "killed", KILL_AT)
    _finish(
        _launch(broken, cache, resumed, "resumed", extra=[freq[resumed], *extra]), broken, "resumed"
    )
    log = _logs(broken, "resumed")
    assert "resumed from" in log and "approximate" not in log
    a = checkpoint.load(checkpoint.listed(whole)[-1])
    b = checkpoint.load(checkpoint.listed(broken)[-1])
    assert a["update"] == b["update"] == UPDATES and a["streams"] == b["streams"]
    worst = max(_relative(b["model"][k], a["model"][k]) for k in a["model"])
    assert worst < 1e-5, f"parameters differ by {worst:.2e} relative"
    assert _pairs_seen(broken) == _pairs_seen(whole) > 0


def test_a_resume_whose_global_batch_differs_is_refused_in_one_line(registry, tiny):
    """processes x update_freq or max_tokens other than the checkpoint's: the data position
    counts other batches; the error says which product changed and how to keep it."""
    train(_cfg(registry, tiny, "optim.max_updates=4"), registry, quiet=True)
    for change, said in (
        ("optim.update_freq=2", "now 2 of 300"),
        ("data.max_tokens=200", "now 1 of 200"),
    ):
        cfg = _cfg(registry, tiny, "optim.max_updates=8", change)
        with pytest.raises(TrainingError) as e:
            train(cfg, registry, quiet=True)
        message = str(e.value)
        assert "\n" not in message and said in message, message
        assert "updates of 1 batches of data.max_tokens=300" in message
        assert "optim.update_freq=1 on 1" in message


def _cfg(registry, tiny, *extra):
    return load_config(
        "demo",
        tiny(
            "task.train_size=400",
            "task.valid_size=6",
            "task.test_size=4",
            "data.max_tokens=300",
            "optim.warmup=5",
            "run.valid_interval=1000",
            "run.threads=1",
            "decode.beam=2",
            *extra,
        ),
        registry=registry,
    )


def test_damaged_latest_checkpoint_is_named_set_aside_and_training_resumes_from_the_one_before(
    registry, tiny, caplog
):
    cfg = _cfg(registry, tiny, "optim.max_updates=8", "run.save_interval=4")
    train(cfg, registry, quiet=True)
    latest = checkpoint.listed(cfg.run.dir)[-1]
    good = checkpoint.load(latest)
    blob = bytearray(latest.read_bytes())
    for i in range(
        len(blob) // 2, len(blob) // 2 + 16
    ):  # flipped bytes: torch.load alone would not notice
        blob[i] ^= 0xFF
    latest.write_bytes(bytes(blob))
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint_00000008.pt is damaged"):
        checkpoint.load(latest)

    caplog.set_level(logging.INFO, logger="s2s")
    result = train(cfg, registry, quiet=True)  # the same run again: resumes from update 4
    assert "checkpoint_00000008.pt is damaged" in caplog.text and "CRC" in caplog.text
    assert "resumed from" in caplog.text and "checkpoint_00000004.pt" in caplog.text
    assert (latest.parent / "checkpoint_00000008.pt.damaged").is_file()
    assert result["update"] == 8
    redone = checkpoint.load(latest)
    for k in good["model"]:  # and the redone updates 5..8 are the ones the damaged file held
        assert torch.equal(good["model"][k], redone["model"][k]), k


class _FakeWriter:
    """Stands in for torch.utils.tensorboard.SummaryWriter (tensorboard is not a dependency)."""

    made: list = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        _FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def close(self):
        self.closed = True


def test_nonfinite_updates_are_skipped_counted_and_stop_training_after_max_nonfinite(
    registry, tiny, monkeypatch, caplog
):
    """Training calls 3 and 8, 9, 10 give NaN: one skip, then 3 in a row stop the run."""
    calls, real = [0], model_mod.label_smoothed_loss

    def loss(*args):
        out = real(*args)
        if torch.is_grad_enabled():  # training, not validation
            calls[0] += 1
            if calls[0] == 3 or calls[0] >= 8:
                return out[0] * float("nan"), out[1]
        return out

    monkeypatch.setattr(model_mod, "label_smoothed_loss", loss)
    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=_FakeWriter)
    )
    _FakeWriter.made.clear()
    cfg = _cfg(
        registry,
        tiny,
        "optim.max_updates=20",
        "run.save_interval=2",
        "run.keep_last=5",
        "run.max_nonfinite=3",
        "run.log_interval=1",
    )
    with pytest.raises(
        TrainingError,
        match=r"3 non-finite updates in a row after update 6 .*"
        r"checkpoint_00000006\.pt",
    ):
        train(cfg, registry, quiet=True)
    assert (
        "update 3: non-finite loss or gradient, update skipped (1 in a row, 1 in all)"
        in caplog.text
    )

    paths = checkpoint.listed(cfg.run.dir)
    assert [p.name for p in paths] == [f"checkpoint_0000000{u}.pt" for u in (2, 4, 6)]
    last = checkpoint.load(paths[-1])
    assert last["skipped_updates"] == 1 and last["nonfinite_in_row"] == 0
    assert all(torch.isfinite(v).all() for v in last["model"].values())
    records = [json.loads(line) for line in open(f"{cfg.run.dir}/metrics.jsonl")]
    assert [r["update"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert records[-1] == {
        **records[-1],
        "kind": "stopped",
        "update": 6,
        "in_a_row": 3,
        "skipped": 4,
    }

    (writer,) = _FakeWriter.made  # the TensorBoard events mirror metrics.jsonl
    assert writer.purge_step == 1 and writer.closed
    assert ("train/loss", records[0]["loss"], 1) in writer.scalars
    assert [s for s in writer.scalars if s[0] == "stopped/skipped"] == [("stopped/skipped", 4, 6)]


def test_checkpoints_every_m_minutes_and_learning_curves(registry, tiny, monkeypatch, tmp_path):
    """run.save_minutes=2.5 with a clock that advances one minute per training step: saves at
    updates 3 and 6, and at the end (7); run.save_interval is out of the way."""
    steps, real_step = [0], train_mod.Trainer.step

    def step(self):
        steps[0] += 1
        return real_step(self)

    monkeypatch.setattr(train_mod.Trainer, "step", step)
    monkeypatch.setattr(train_mod, "clock", lambda: 60.0 * steps[0])
    cfg = _cfg(
        registry,
        tiny,
        "optim.max_updates=7",
        "run.save_interval=1000",
        "run.save_minutes=2.5",
        "run.valid_interval=3",
        "run.log_interval=1",
    )
    train(cfg, registry, quiet=True)
    assert [checkpoint.load(p)["update"] for p in checkpoint.listed(cfg.run.dir)] == [3, 6, 7]

    assert main(["plot", cfg.run.dir, "--output", str(tmp_path / "plots")]) == 0
    for name in ("loss", "lr", "bleu"):
        assert (tmp_path / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_full_disk_fails_before_training(registry, tiny, monkeypatch):
    cfg = _cfg(registry, tiny, "optim.max_updates=2")
    monkeypatch.setattr(
        directory.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=1000)
    )
    with pytest.raises(TrainingError, match=r"0 MiB free, checkpoints need about \d+ MiB"):
        train(cfg, registry, quiet=True)
    assert not (Path(cfg.run.dir) / "metrics.jsonl").exists() and not checkpoint.listed(cfg.run.dir)


def test_precision_outside_fp32_bf16_fp16_fails_when_the_config_is_loaded(registry):
    with pytest.raises(ConfigError, match=r"run\.precision.*fp32, bf16, fp16"):
        load_config("demo", ["run.precision=fp8"], registry=registry)
    cfg = load_config("demo", ["run.precision=bf16"], registry=registry)
    assert cfg.run.precision == "bf16" and "precision: bf16" in OmegaConf.to_yaml(cfg)
