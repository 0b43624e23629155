"""Every command `s2s train` prints as a next step runs as printed and succeeds, for the three
ways a task reaches a run: a built-in preset (`s2s train demo`), a YAML preset file of a plugin
module (`--plugin spelled_mod:Spelled`) and a `--plugin FILE.py` task. The hints carry no
`--plugin`: the run recorded where its task came from (RUN_DIR/task_origins.json), and the
test split's sources and references are written beside its hypotheses (test.src.txt,
test.ref.txt), which the generate and score hints read."""

from __future__ import annotations

import json
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import TINY_MODEL

pytestmark = pytest.mark.slow

#: a character-level variant of the demo task: its tokens are the characters of a line (a space
#: is "_"), so that a character the training data lacks is an unknown piece of a word
PLUGIN = """
from s2s.core import DecodeDefaults
from s2s.core.tokenizers import WordTokenizer
from s2s.plugins.demo import DemoTask


class Chars(WordTokenizer):
    def encode(self, lines):
        return super().encode([" ".join(line.replace(" ", "_")) for line in lines])

    def decode(self, ids):
        return super().decode(ids).replace(" ", "").replace("_", " ")


class Spelled(DemoTask):
    name = "spelled"
    contract_version = "1.1"
    Vocab = Chars
    decoding = DecodeDefaults(beam=2, alpha=0.6, max_len_a=1.5, max_len_b=10)

    def build_vocab(self, pairs):
        self.src_vocab = self.tgt_vocab = Chars.train(
            " ".join(side.replace(" ", "_")) for pair in pairs for side in pair
        )
"""

TINY = [
    *TINY_MODEL,
    "task.train_size=200",
    "task.valid_size=6",
    "task.test_size=6",
    "optim.max_updates=4",
    "optim.warmup=2",
    "run.valid_interval=2",
    "run.save_interval=2",
    "run.average_last=2",
    "run.device=cpu",
    "data.cache_dir=cache",
]


def s2s(*argv, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *map(str, argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        **kwargs,
    )


def hints(stdout: str) -> list[list[str]]:
    """The commands after "next:", each as its arguments (the comment after # dropped)."""
    lines = stdout.splitlines()
    return [shlex.split(line, comments=True) for line in lines[lines.index("next:") + 1 :]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served(argv: list[str], cwd: Path) -> None:
    """Start a `s2s serve` hint, wait until it answers /health, then stop it with Ctrl-C
    (SIGINT): it shuts down and exits 130, the status of every interrupted s2s command. The
    one change to the line as printed is a free --port (other tests may hold 8000)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "s2s.core.apps.cli", *argv[1:], "--port", str(port)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C's default action, as in a terminal (a suite started in the background of a
        # shell without job control inherits SIGINT ignored, and would pass that on)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "s2s serve never answered /health"
                time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as a person stops it
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]  # s2s's Ctrl-C status


def run_hints(stdout: str, cwd: Path) -> list[str]:
    """Run every hint of `stdout` from `cwd`, each exiting 0 (serve: answering, then stopped);
    returns the commands run (their second word)."""
    ran = []
    for argv in hints(stdout):
        assert argv[0] == "s2s" and "--plugin" not in argv, argv
        if argv[1] == "serve":
            served(argv, cwd)
        else:
            out = s2s(*argv[1:], cwd=cwd)
            assert out.returncode == 0, (argv, out.stderr[-2000:])
        ran.append(argv[1])
    return ran


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hints")
    (root / "spelled_mod.py").write_text(PLUGIN)
    (root / "plug").mkdir()
    (root / "plug" / "spelled_file.py").write_text(PLUGIN)
    (root / "spelled.yaml").write_text("task:\n  name: spelled\n")
    return root


@pytest.mark.parametrize(
    "how, plugin, preset",
    [
        ("built-in", [], "demo"),
        ("module preset", ["--plugin", "spelled_mod:Spelled"], "spelled.yaml"),
        ("file", ["--plugin", "plug/spelled_file.py"], "spelled.yaml"),
    ],
)
def test_every_printed_hint_runs_as_printed(folder, how, plugin, preset):
    run = f"runs/{how.replace(' ', '_')}"
    out = s2s("train", "-q", *plugin, preset, *TINY, f"run.dir={run}", cwd=folder)
    assert out.returncode == 0, out.stderr[-2000:]
    origins = json.loads((folder / run / "task_origins.json").read_text())
    task = "demo" if how == "built-in" else "spelled"
    kind = {"built-in": "entry point", "module preset": "module", "file": "file"}[how]
    assert origins[task]["kind"] == kind, origins
    refs = (folder / run / "test.ref.txt").read_text().splitlines()
    assert len(refs) == 6 == len((folder / run / "test.hyp.txt").read_text().splitlines())
    assert run_hints(out.stdout, folder) == ["generate", "score", "plot", "export", "serve"]
    # score's hint gives the run's own test figures back
    again = s2s(*hints(out.stdout)[1][1:], "--json", cwd=folder)
    result = json.loads((folder / run / "result.json").read_text())
    primary = next(iter(result["test"]))
    assert json.loads(again.stdout)[primary] == pytest.approx(result["test"][primary], abs=0.01)


def test_a_plugin_file_run_resumes_transfers_and_moves_without_plugin(folder):
    """The --plugin FILE.py run of a tiny training: resumed and used as run.init_from without
    --plugin; once its file moved, one line says to pass --plugin NEW_PATH, which then works."""
    run = "runs/file_again"
    first = ["--plugin", "plug/spelled_file.py", "spelled.yaml", *TINY, f"run.dir={run}"]
    assert s2s("train", "-q", *first, cwd=folder).returncode == 0
    more = s2s("train", "spelled.yaml", *TINY, f"run.dir={run}", "optim.max_updates=6", cwd=folder)
    assert more.returncode == 0 and "resumed from" in more.stderr, more.stderr[-2000:]
    assert json.loads((folder / run / "result.json").read_text())["update"] == 6
    tuned = ["spelled.yaml", *TINY, "run.dir=runs/tuned", f"run.init_from={run}"]
    out = s2s("train", "-q", *tuned, cwd=folder)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder / "moved").mkdir()
    (folder / "plug" / "spelled_file.py").rename(folder / "moved" / "spelled_file.py")
    try:
        lost = s2s("generate", run, "--input", f"{run}/test.src.txt", "-q", cwd=folder)
        where = (folder / "plug" / "spelled_file.py").resolve()
        assert lost.returncode == 2 and lost.stderr.startswith(
            f"s2s generate: error: {run} was trained with the plugin file {where} (sha256 "
        )
        assert "which is missing: pass --plugin NEW_PATH" in lost.stderr
        assert len(lost.stderr.splitlines()) == 1 and "did you mean" not in lost.stderr
        found = s2s(
            "generate",
            run,
            "--input",
            f"{run}/test.src.txt",
            "--plugin",
            "moved/spelled_file.py",
            "-q",
            cwd=folder,
        )
        assert found.returncode == 0 and len(found.stdout.splitlines()) == 6, found.stderr
    finally:
        (folder / "moved" / "spelled_file.py").rename(folder / "plug" / "spelled_file.py")
