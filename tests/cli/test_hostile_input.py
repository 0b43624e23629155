"""The fifth round of hostile input (issue 63), through the real command line: outputs through
links and special files written, never replaced.

Each failure is asserted as the other fault tests assert it (`cli_checks.fails`): exit 2, one
line naming the option, file or value, no traceback, nothing on disk changed. One tiny demo run is
trained per module.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cli_checks import fails, s2s, snapshot
from conftest import TINY_MODEL
from s2s.core.apps.cli import main

SOURCES = "the cat sees a dog\na big man holds the ball\nevery bird likes the tree\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny demo run (two rolling checkpoints) and a source file."""
    root = tmp_path_factory.mktemp("hostile")
    run = root / "run"
    argv = ["train", "demo", "-q", *TINY_MODEL, "run.quiet=true", "task.train_size=200"]
    argv += ["task.valid_size=10", "task.test_size=10", "optim.max_updates=2"]
    argv += ["run.valid_interval=2", "run.save_interval=1", "decode.precision=fp32"]
    assert main([*argv, f"run.dir={run}", f"data.cache_dir={root / 'cache'}"]) == 0
    src = root / "src.txt"
    src.write_text(SOURCES, encoding="utf-8")
    return {"root": root, "run": run, "src": src}


def cli(*args, stdout=subprocess.PIPE, cwd=None) -> subprocess.CompletedProcess:
    """`python -m s2s.core.apps.cli ARGS` in a subprocess (where stdout itself is under test)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        timeout=300,
        env=env,
        cwd=cwd,
    )


# -- 1. one writer: links followed, special files written in place ----------------------------
def test_generate_output_through_a_link_writes_the_links_target(world, capsys, tmp_path):
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old\n")
    os.chmod(real, 0o640)
    link.symlink_to("real.txt")
    code, _, err = s2s(
        capsys, "generate", world["run"], "--input", world["src"], "-q", "--output", link
    )
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert len(real.read_text().splitlines()) == 3
    assert stat.S_IMODE(real.stat().st_mode) == 0o640  # the user's file, its permissions kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


def test_average_output_through_a_link_writes_the_links_target(world, capsys, tmp_path):
    real, link = tmp_path / "avg.pt", tmp_path / "link.pt"
    real.write_bytes(b"old")
    link.symlink_to(real)
    checkpoints = sorted((world["run"] / "checkpoints").glob("checkpoint_*.pt"))
    code, _, err = s2s(capsys, "average", *checkpoints, "--output", link)
    assert code == 0, err
    assert link.is_symlink() and real.stat().st_size > 1000


def test_average_through_a_link_to_a_rolling_checkpoint_is_refused(world, capsys, tmp_path):
    """The checks on what an average may replace apply to the file a link leads to."""
    checkpoints = sorted((world["run"] / "checkpoints").glob("checkpoint_*.pt"))
    link = tmp_path / "average.pt"
    link.symlink_to(checkpoints[-1])
    before = snapshot(world["run"], tmp_path)
    result = s2s(capsys, "average", checkpoints[0], "--output", link)
    fails(result, before, "rolling checkpoint")


def test_generate_output_to_a_fifo_is_written_in_place(world, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    result = cli("generate", world["run"], "--input", world["src"], "-q", "--output", fifo)
    reader.join(60)
    assert result.returncode == 0, result.stderr.decode()
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert len(got[0].splitlines()) == 3


@pytest.mark.parametrize("name", ["/dev/fd/1", "{link}"])
def test_generate_output_to_a_name_of_stdout_writes_through_it(world, tmp_path, name):
    """`--output /dev/stdout > out.txt` (here /dev/fd/1, and a link to /dev/stdout: the same
    path through the code, which never writes /dev/stdout itself in a test) appends to what the
    shell opened, and no link is replaced: not /dev/stdout, not the user's."""
    link = tmp_path / "stdout"
    link.symlink_to("/dev/stdout")
    out = tmp_path / "out.txt"
    out.write_text("before\n")
    with open(out, "a") as f:  # `>> out.txt`
        result = cli(
            "generate",
            world["run"],
            "--input",
            world["src"],
            "-q",
            "--output",
            name.format(link=link),
            stdout=f,
        )
    assert result.returncode == 0, result.stderr.decode()
    lines = out.read_text().splitlines()
    assert lines[0] == "before" and len(lines) == 4
    assert link.is_symlink() and os.readlink(link) == "/dev/stdout"
    assert Path("/dev/stdout").is_symlink()
    from s2s.core.files import descriptor_of, replaced_file

    assert descriptor_of("/dev/stdout") == 1 and replaced_file("/dev/stderr") is None
