"""`s2s new-task`, as a plugin author meets it: in a fresh virtual environment holding s2s
installed from a copy of this repository (not editable), the scaffold writes a package that
installs (as a wheel would, and editable), lists its task and preset, passes `s2s check-task`,
trains its preset, and the score command printed after training runs; the same with
`--plugin FILE.py` and no install. A name the scaffold cannot take is refused in one line,
nothing written."""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch (s2s.core.RUNTIME_ENV)

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from s2s.core.apps.cli import main
from s2s.core.contract.conformance import CHECKS

SOURCES = ("pyproject.toml", "README.md", "seq2seq_core", "plugins", "data_recipes", "tasks")
#: a short training of the scaffold's preset (its own length is about a minute on two cores)
SHORT = [
    "optim.max_updates=40",
    "optim.warmup=10",
    "run.valid_interval=40",
    "run.save_interval=40",
    "run.threads=1",
    "task.train_size=2000",
]


def _run(cmd: list, cwd: Path, env: dict, timeout: int = 300) -> str:
    out = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"{shlex.join(map(str, cmd))} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh virtual environment (the tests' dependencies visible) with s2s installed from a
    copy of the repository, not editable; (its bin folder, the environment to run it in)."""
    tmp = tmp_path_factory.mktemp("scaffold")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    folder = tmp / "venv"
    _run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", folder], tmp, env
    )
    python = folder / "bin" / "python"
    purelib = _run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp, env
    )
    if sys.prefix != sys.base_prefix:
        # the tests run in a venv: its dependencies (and pip) are there, after the base Python's
        # (whose setuptools builds wheels where a venv's may be too old to)
        outer = [*site.getsitepackages([sys.base_prefix]), *site.getsitepackages()]
        (Path(purelib.strip()) / "outer.pth").write_text("\n".join(outer) + "\n")
    pip = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q"]
    _run([*pip, src], tmp, env)
    where = _run([python, "-c", "import s2s.core; print(s2s.core.__file__)"], tmp, env)
    assert Path(where.strip()).is_relative_to(folder), where  # the installed copy
    return folder / "bin", env, pip


def _hint(printed: str, command: str) -> list[str]:
    """The argv of the `s2s COMMAND ...` line printed under "next:"."""
    line = next(x for x in printed.splitlines() if x.strip().startswith(f"s2s {command} "))
    return shlex.split(line.split("#")[0])[1:]


def _score_hint_runs(printed: str, run_dir: Path, bin_: Path, env: dict, work: Path):
    """The score hint run exactly as printed (no --plugin added: the run remembers where its
    task came from), against the test references written beside the outputs: it scores them."""
    assert (run_dir / "test.ref.txt").is_file()
    scored = _run([bin_ / "s2s", *_hint(printed, "score")], work, env)
    assert re.search(r"^accuracy\s+\d", scored, re.M), scored


@pytest.mark.slow
def test_a_scaffolded_package_installs_checks_trains_and_scores(venv, tmp_path):
    bin_, env, pip = venv
    s2s = bin_ / "s2s"
    printed = _run([s2s, "new-task", "numwords", "--dir", tmp_path], tmp_path, env)
    assert f"pip install {tmp_path / 'numwords'}" in printed
    _run([*pip, tmp_path / "numwords"], tmp_path, env)  # as a wheel: not editable
    listed = _run([s2s, "tasks"], tmp_path, env)
    assert re.search(
        r"^numwords\s+entry point numwords = numwords.task:NumwordsTask", listed, re.M
    ), listed
    assert re.search(r"^numwords_tiny\s+entry point numwords = numwords.presets", listed, re.M)

    checked = _run([s2s, "check-task", "numwords_tiny", "task.train_size=2000"], tmp_path, env)
    assert re.search(r"(\d+) of (\d+) checks passed, (\d+) not applicable", checked), checked

    run_dir = tmp_path / "run"
    trained = _run(
        [s2s, "train", "numwords_tiny", *SHORT, f"run.dir={run_dir}"], tmp_path, env, timeout=600
    )
    assert "test figures:" in trained, trained
    _score_hint_runs(trained, run_dir, bin_, env, tmp_path)

    # the package's own tests: the kit, one test a check
    tested = subprocess.run(
        [bin_ / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path / "numwords",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert tested.returncode == 0, tested.stdout[-2000:]
    passed, skipped = map(
        int, re.search(r"^(\d+) passed, (\d+) skipped", tested.stdout, re.M).groups()
    )
    assert passed + skipped == len(CHECKS) and skipped == 2, tested.stdout[-2000:]  # data made


@pytest.mark.slow
def test_an_editable_install_finds_the_preset(venv, tmp_path):
    bin_, env, pip = venv
    _run([bin_ / "s2s", "new-task", "editable_one", "--dir", tmp_path], tmp_path, env)
    _run([*pip, "-e", tmp_path / "editable_one"], tmp_path, env)
    shown = _run([bin_ / "s2s", "train", "editable_one_tiny", "--print-config"], tmp_path, env)
    assert "name: editable_one" in shown


@pytest.mark.slow
def test_a_scaffolded_task_as_a_plugin_file_checks_trains_and_scores(venv, tmp_path):
    bin_, env, _ = venv
    s2s = bin_ / "s2s"
    _run([s2s, "new-task", "wordsum", "--dir", tmp_path], tmp_path, env)
    plugin = ["--plugin", str(tmp_path / "wordsum" / "wordsum" / "task.py")]
    listed = _run([s2s, "tasks", *plugin], tmp_path, env)
    assert re.search(r"^wordsum_tiny\s+plugin file ", listed, re.M), listed
    checked = _run(
        [s2s, "check-task", "wordsum_tiny", "task.train_size=2000", *plugin], tmp_path, env
    )
    assert re.search(r"(\d+) of (\d+) checks passed, (\d+) not applicable", checked), checked
    run_dir = tmp_path / "run"
    trained = _run(
        [s2s, "train", "wordsum_tiny", *SHORT, f"run.dir={run_dir}", *plugin],
        tmp_path,
        env,
        timeout=600,
    )
    _score_hint_runs(trained, run_dir, bin_, env, tmp_path)


def test_a_name_the_scaffold_cannot_take_is_refused_in_one_line(tmp_path, capsys):
    for name, says in (
        ("Bad-Name", "a lower-case letter"),
        ("json", "a module named 'json' is importable"),
        ("demo", "a task named 'demo' is installed"),
    ):
        assert main(["new-task", name, "--dir", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err, err
    (tmp_path / "mine").mkdir()
    assert main(["new-task", "mine", "--dir", str(tmp_path)]) == 2
    assert "exists" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [tmp_path / "mine"]  # nothing written
