"""Shared fixtures: real data locations, a registry, a tiny config maker.

Real corpora are read from ../shared/data beside the project (S2S_SHARED_DATA overrides it), in
the layout `python -m s2s.data_recipes multi30k treebank --dir DIR` writes; tests pass that
location explicitly (`task.data_dir=...`), so they never download. A test whose corpus is not
there is skipped through `corpus`, and the run ends with one line saying how to get them.
"""

from __future__ import annotations

import s2s.core  # noqa: E402,F401  before torch: the CPU runtime defaults (s2s.core.RUNTIME_ENV)

import os
import sys
from pathlib import Path

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread beats two on a shared 2-core machine

#: the repository's root (tests live in folders below tests/, by what they test)
ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(
    os.environ.get("S2S_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data"
)
MULTI30K = SHARED / "multi30k"
NLTK_DATA = SHARED / "nltk_data"
_NO_CORPUS = "real corpus not found: "


def needs(path: Path):
    """A skipif marker for tests that read `path` (under the shared data)."""
    return pytest.mark.skipif(not path.exists(), reason=f"{_NO_CORPUS}{path}")


def corpus(path: Path) -> Path:
    """`path` (under the shared data), or skip the calling test."""
    if not path.exists():
        pytest.skip(f"{_NO_CORPUS}{path}")
    return path


#: what to do about a skip's cause, by the reason's text before its first colon
_REMEDIES = {
    _NO_CORPUS.rstrip(
        ": "
    ): f"in {SHARED}; get them with `python -m s2s.data_recipes multi30k treebank "
    "--dir DIR` and set S2S_SHARED_DATA=DIR",
    "needs a CUDA device": "the -m gpu tests; `bash bench/training/gpu_check.sh` runs them on a GPU machine",
    "no chromium / chromedriver installed": "the page's browser tests; .ci/run installs Debian's",
    "placeholder the parser cannot take": "documented commands with a placeholder (FILE, DIR): nothing to parse",
    "a preset file of the reader's own": "documented commands on a YAML file the reader writes",
}


def pytest_terminal_summary(terminalreporter):
    """Every skip counted under its cause, with what would run it: the counts add up to
    pytest's own skipped figure (`-rs` lists them one by one)."""
    causes: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else "skipped"
        cause = reason.removeprefix("Skipped: ").split(":")[0].split(" (")[0].strip()
        causes[cause] = causes.get(cause, 0) + 1
    if causes:
        terminalreporter.write_line(f"{sum(causes.values())} skipped, by cause (-rs lists each):")
    for cause, count in sorted(causes.items(), key=lambda item: -item[1]):
        remedy = _REMEDIES.get(cause)
        terminalreporter.write_line(f"  {count:>3}  {cause}" + (f": {remedy}" if remedy else ""))


#: the smallest model any preset trains in a test, on one thread: each test file adds its run's
#: length and logging to it
TINY_MODEL = [
    "model.layers=1",
    "model.d_model=32",
    "model.d_ff=64",
    "model.heads=2",
    "run.threads=1",
]


@pytest.fixture(autouse=True)
def one_thread():
    """Tests use tiny models: one thread is as fast, and much faster on a shared, busy machine.

    Restored after each test, since a training run sets its own `run.threads`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def registry():
    from s2s.core.setup.registry import Registry

    return Registry.installed()


@pytest.fixture
def tiny(tmp_path):
    """Overrides that make any preset tiny and keep its files under tmp_path."""

    def make(*extra: str) -> list[str]:
        return [
            *TINY_MODEL,
            f"run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "run.log_interval=5",
            "run.quiet=true",
            *extra,
        ]

    return make


def tiny_run(tmp: Path, preset: str, *extra: str) -> Path:
    """A preset trained as a 2-layer, d_model 32 model in tmp (its run and cache folders there),
    on one thread; `extra` overrides the rest. Returns the run directory."""
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.training.trainer import train

    registry = Registry.installed()
    cfg = load_config(
        preset,
        [
            "model.layers=2",
            "model.d_model=32",
            "model.d_ff=64",
            "model.heads=2",
            "run.log_interval=5",
            "run.quiet=true",
            "run.threads=1",
            "run.device=cpu",
            f"run.dir={tmp / 'run'}",
            f"data.cache_dir={tmp / 'cache'}",
            *extra,
        ],
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    return Path(cfg.run.dir)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory) -> Path:
    """One tiny demo run per session (`tiny_run`'s model, 200 updates on 1,000 pairs, a
    checkpoint every 100 and their average, positions up to 64): the trained model that the
    exporters and the server are tested on. It searches in fp32 (decode.precision), whatever
    the CPU: the exporters' outputs are compared with its own token for token."""
    return tiny_run(
        tmp_path_factory.mktemp("demo"),
        "demo",
        "task.train_size=1000",
        "task.valid_size=20",
        "task.test_size=150",
        "optim.max_updates=200",
        "optim.warmup=50",
        "run.log_interval=50",
        "run.valid_interval=200",
        "run.save_interval=100",
        "run.average_last=2",
        "model.max_positions=64",
        "data.max_len=64",
        "decode.precision=fp32",
    )


def task_keys(preset: str, *settings: str) -> list[str]:
    """Overrides `KEY=VALUE` of the task section: `task.KEY=VALUE` for a single-task preset,
    `tasks.MEMBER.task.KEY=VALUE` for every member of a multi-task one."""
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    cfg = load_config(preset, registry=Registry.installed())
    prefixes = ["task."] if cfg.tasks is None else [f"tasks.{m}.task." for m in cfg.tasks]
    return [p + s for p in prefixes for s in settings]


def demo_process_run(run_dir: Path, cache: Path, *extra: str, preset: str = "demo") -> list[str]:
    """Overrides of a tiny run of `preset` (demo or multitask_demo: 1 layer, d_model 32, 400
    training pairs, batches of 300 tokens, one thread, the CPU) in `run_dir` with its data in
    `cache`: what the tests that start `s2s train` as processes (resume, restarts, faults, two
    agents) train; `extra` sets the rest."""
    return [
        *TINY_MODEL,
        f"run.dir={run_dir}",
        f"data.cache_dir={cache}",
        *task_keys(preset, "train_size=400", "valid_size=6", "test_size=4"),
        "data.max_tokens=300",
        "run.device=cpu",
        *extra,
    ]


#: the `s2s` console script installed beside this Python: what torchrun starts (`--no-python s2s`,
#: docs/training-at-scale.md)
S2S = str(Path(sys.executable).with_name("s2s"))


def train_argv(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    """`--no-python s2s train -q demo` with `demo_process_run`'s overrides: what follows
    torchrun's options in a test that trains in processes, as docs/training-at-scale.md has it."""
    return [
        "--no-python",
        S2S,
        "train",
        "-q",
        "demo",
        *demo_process_run(run_dir, cache, *extra),
    ]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multi30k_slice(dest: Path, sizes: dict) -> Path:
    """The first sizes[split] EN-DE lines of each shared Multi30k split, written under `dest`."""
    dest.mkdir()
    for split, n in sizes.items():
        for lang in ("en", "de"):
            lines = (MULTI30K / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:n]
            (dest / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dest


#: a tiny demo run: one layer of width 64, 150 updates (about 6 s on one thread)
TINY_DEMO = [
    "model.layers=1",
    "model.d_model=64",
    "model.d_ff=128",
    "model.heads=2",
    "optim.max_updates=150",
    "optim.warmup=50",
    "run.valid_interval=150",
    "run.save_interval=150",
    "run.threads=1",
    "task.train_size=2000",
    "task.valid_size=50",
    "task.test_size=50",
]


UNTRAINED = [
    "optim.max_updates=1",
    "run.valid_interval=1",
    "run.save_interval=1",
    "optim.lr_scale=1e-9",
]


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory) -> dict[str, Path]:
    """Tiny demo runs trained once per session through the command line: "a" and "b" (seeds 1
    and 2, one shape), "trained" (600 updates: test BLEU about 99, outputs end before their
    length limit), "narrow" (width 32, another shape), "untrained" (one update at a
    near-zero rate: its initial weights), "parser" (task.mode=parse: other target words); each name to
    its run directory. They search in fp32 (decode.precision), so that a test's outputs are the
    same on a CPU with bf16 units and without."""
    import subprocess
    import sys

    where = tmp_path_factory.mktemp("demo_runs")
    runs = {
        "a": ["run.seed=1"],
        "trained": [
            "run.seed=5",
            "optim.max_updates=600",
            "optim.warmup=100",
            "run.valid_interval=600",
            "run.save_interval=600",
        ],
        "b": ["run.seed=2"],
        "narrow": ["run.seed=3", "model.d_model=32", "model.d_ff=64"],
        "untrained": ["run.seed=4", *UNTRAINED],
        "parser": ["task.mode=parse", *UNTRAINED],
    }
    for name, extra in runs.items():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "s2s.core.apps.cli",
                "train",
                "demo",
                "-q",
                *TINY_DEMO,
                "decode.precision=fp32",  # searches compared token for token, on any CPU
                *extra,
                f"run.dir={where / name}",
                f"data.cache_dir={where / 'cache'}",
            ],
            check=True,
            capture_output=True,
        )
    return {name: where / name for name in runs}
