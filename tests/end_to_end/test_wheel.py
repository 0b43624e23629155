"""A real package: the built wheel, installed into a fresh venv, runs `s2s` from outside the repository.

Only what the package is built from is copied (pyproject.toml, README.md and the four folders it
maps under `s2s`), the wheel is built offline from that copy, and installed with --no-deps into a
new venv that sees the dependencies of the environment running the tests (its site-packages, and
the system's). The commands then run in tmp_path, so nothing is found through the checkout.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SOURCES = ("pyproject.toml", "README.md", "seq2seq_core", "plugins", "data_recipes", "tasks")


def _run(cmd: list, cwd: Path, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repository(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(GOMP_SPINCOUNT="1000", PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            tmp_path / "dist",
            src,
        ],
        tmp_path,
        env,
    )
    wheel = next((tmp_path / "dist").glob("s2s-*.whl"))

    venv = tmp_path / "venv"
    _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
        tmp_path,
        env,
    )
    python = venv / "bin" / "python"
    venv_site = Path(
        _run(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env
        ).stdout.strip()
    )
    if (
        sys.prefix != sys.base_prefix
    ):  # the tests run in a venv: its dependencies (and pip) are there
        (venv_site / "outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([python, "-m", "pip", "install", "--no-deps", "-q", wheel], tmp_path, env)

    where = _run(
        [
            python,
            "-c",
            "import s2s.core, s2s.tasks; print(s2s.core.__file__); print(s2s.tasks.__file__)",
        ],
        tmp_path,
        env,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), (
        where
    )  # the wheel's copy, not the checkout's
    s2s = venv / "bin" / "s2s"
    tasks = _run([s2s, "tasks"], tmp_path, env).stdout
    assert "demo" in tasks and "translation" in tasks and "parsing" in tasks
    assert (
        "multi30k_en_de" in tasks and "ptb_sample_parsing" in tasks and "wmt14_en_de_base" in tasks
    )
    trained = _run(
        [
            s2s,
            "train",
            "demo",
            "optim.max_updates=5",
            "model.layers=1",
            "model.d_model=32",
            "model.d_ff=64",
            "model.heads=2",
            "run.threads=1",
            "run.log_interval=5",
            "run.valid_interval=5",
            f"run.dir={tmp_path / 'run'}",
            "decode.beam=1",
        ],
        tmp_path,
        env,
    )
    assert (
        "trained demo to update 5" in trained.stdout
        and (tmp_path / "run" / "result.json").is_file()
    )
    assert (
        "train update 5:" in trained.stderr and "\r" not in trained.stderr
    )  # a log, not a terminal
