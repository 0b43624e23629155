"""A process that dies at the worst moments: while writing a checkpoint, in the middle of a
validation, and in the final averaging and test. Each time the same command, run again, finishes
the run to what a run never stopped reaches: the same parameters bit for bit on CPU, the same
result.json figures and test outputs. A full disk while saving leaves the previous checkpoint
intact and names the run directory.

Each death is a real SIGKILL of an `s2s train` process, placed by a driver that wraps one engine
function before calling the command line (`DIE_AT`): the run is otherwise the real command.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import demo_process_run
from s2s.core.setup.config import load_config
from s2s.core.runs import checkpoint
from s2s.core.training.trainer import train

pytestmark = pytest.mark.slow
UPDATES = 60

#: the driver: wraps the named moment so that its `nth` call kills the process (SIGKILL) partway
DRIVER = textwrap.dedent(
    """
    import os, signal, sys
    import s2s.core
    import torch
    from s2s.core.runs import checkpoint
    from s2s.core.training import trainer
    from s2s.core.apps.cli import main

    where, nth = sys.argv[1], int(sys.argv[2])
    calls = [0]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def counted():
        calls[0] += 1
        return calls[0] == nth

    if where == "save":  # half of the checkpoint's bytes written, then killed
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            if counted():
                f.write(b"PK\\x03\\x04 half a checkpoint")
                f.flush()
                die()
            return real_save(obj, f, *args, **kwargs)

        torch.save = save
    elif where == "validate":  # the dev search done, its record not yet written
        real_dev = trainer.evaluate_dev

        def evaluate_dev(*args, **kwargs):
            found = real_dev(*args, **kwargs)
            if counted():
                die()
            return found

        trainer.evaluate_dev = evaluate_dev
    elif where == "average":  # the average computed, not yet written
        real_average = checkpoint.average

        def average(*args, **kwargs):
            found = real_average(*args, **kwargs)
            if counted():
                die()
            return found

        checkpoint.average = average
    elif where == "test":  # in the test decode, before its outputs are written
        real_test = trainer.result.score_test_split

        def score_test_split(*args, **kwargs):
            if counted():
                die()
            return real_test(*args, **kwargs)

        trainer.result.score_test_split = score_test_split
    sys.exit(main(["train", "-q", "demo", *sys.argv[3:]]))
    """
)


def _overrides(run_dir, cache):
    return demo_process_run(
        run_dir,
        cache,
        f"optim.max_updates={UPDATES}",
        "run.save_interval=20",
        "run.valid_interval=20",
        "run.average_last=2",
    )


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    """The run never stopped, and the data cache every run of this module shares."""
    from s2s.core.setup.registry import Registry

    tmp = tmp_path_factory.mktemp("faults")
    registry = Registry.installed()
    train(
        load_config("demo", _overrides(tmp / "whole", tmp / "cache"), registry=registry),
        registry,
        quiet=True,
    )
    return tmp


def _run(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, **kw)


@pytest.mark.parametrize("where, nth", [("save", 2), ("validate", 2), ("average", 1), ("test", 1)])
def test_killed_at_a_bad_moment_the_same_command_finishes_the_same_run(
    where, nth, unbroken, tmp_path
):
    driver = tmp_path / "die.py"
    driver.write_text(DRIVER)
    run, cache = tmp_path / "run", unbroken / "cache"
    died = _run([sys.executable, str(driver), where, str(nth), *_overrides(run, cache)])
    assert died.returncode == -9, died.stderr[-3000:]
    assert not (run / "result.json").exists()
    again = _run(
        [sys.executable, "-m", "s2s.core.apps.cli", "train", "-q", "demo", *_overrides(run, cache)]
    )
    assert again.returncode == 0, again.stderr[-3000:]

    whole = unbroken / "whole"
    a = checkpoint.load(checkpoint.listed(whole)[-1])
    b = checkpoint.load(checkpoint.listed(run)[-1])
    assert a["update"] == b["update"] == UPDATES
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    for name in ("checkpoint_average.pt", "checkpoint_best.pt"):
        x, y = checkpoint.load(whole / name), checkpoint.load(run / name)
        assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"]), name
    ra, rb = (json.loads((d / "result.json").read_text()) for d in (whole, run))
    assert ra["test"] == rb["test"] and ra["checkpoint"] == rb["checkpoint"]
    assert (whole / "test.hyp.txt").read_text() == (run / "test.hyp.txt").read_text()
    assert not list(run.rglob("*.tmp*"))  # nothing half-written left behind


def test_a_full_disk_while_saving_keeps_the_previous_checkpoint_and_names_the_run(
    unbroken, tmp_path, monkeypatch
):
    from s2s.core.errors import TrainingError
    from s2s.core.setup.registry import Registry

    registry = Registry.installed()
    run = tmp_path / "run"
    cfg = load_config("demo", _overrides(run, unbroken / "cache"), registry=registry)
    real_save = torch.save

    def full(obj, f, *args, **kwargs):  # the disk fills while the second checkpoint is written
        if "checkpoint_00000040" in str(getattr(f, "name", "")):
            f.write(b"some bytes before the disk filled")
            raise OSError(28, "No space left on device")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(TrainingError) as e:
        train(cfg, registry, quiet=True)
    assert str(run) in str(e.value) and "No space left on device" in str(e.value)
    kept = checkpoint.listed(run)
    assert [checkpoint.load(p)["update"] for p in kept] == [20]  # the previous one, whole
    assert not list(run.rglob("*.tmp*"))
