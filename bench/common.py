"""What every benchmark shares: machine facts, the fp32 matmul rate, peak RSS, JSON results.

Figures from a shared, noisy machine are compared within one run (ratios against the
`torch.mm` rate measured in the same run) and as medians of several repetitions.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from s2s.core.files import (
    atomic_write_text,  # s2s first: its CPU runtime defaults precede torch
)

REPO = Path(__file__).resolve().parent.parent  # the checkout the benchmarks belong to
# The real corpora beside the project, in the layout `python -m s2s.data_recipes ... --dir DIR`
# writes; benchmarks read them there (no download) and fall back on the presets' fetched copies.
SHARED = Path(
    os.environ.get("S2S_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data"
)
MULTI30K = SHARED / "multi30k"


def corpus_overrides(preset: str) -> list[str]:
    """Overrides that point a preset's Multi30k and treebank-sample task sections (each member's,
    in a multi-task preset) at the shared copies, where there are some."""
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    cfg = load_config(preset, registry=Registry.installed())
    sections = (
        {"task": cfg.task}
        if cfg.tasks is None
        else {f"tasks.{n}.task": m.task for n, m in cfg.tasks.items()}
    )
    out = []
    for prefix, task in sections.items():
        if task.name == "translation" and task.source == "multi30k" and MULTI30K.is_dir():
            out.append(f"{prefix}.data_dir={MULTI30K}")
        if (
            task.name == "parsing"
            and task.corpus == "nltk_sample"
            and (SHARED / "nltk_data").is_dir()
        ):
            out.append(f"{prefix}.nltk_data={SHARED / 'nltk_data'}")
    return out


#: the CPU flags that decide which matrix units fp32, bf16 and int8 products can use
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu() -> dict:
    """The CPU's model name and which of `CPU_FLAGS` it has (Linux's /proc/cpuinfo)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor(), "flags": None}
    first = info.split("\n\n")[0]  # the first processor's entry
    fields = {
        k.strip(): v.strip() for k, v in (x.split(":", 1) for x in first.splitlines() if ":" in x)
    }
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name"), "flags": [f for f in CPU_FLAGS if f in flags]}


def machine() -> dict:
    return {
        "cpu": cpu(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def rate(product, flop: float, repeats: int = 5, seconds: float = 1.0) -> float:
    """Median FLOP/s of calling `product()` (`flop` FLOPs a call) for `seconds` in `repeats`
    stretches, after one call."""
    product()
    rates = []
    for _ in range(repeats):
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / repeats:
            product()
            count += 1
        rates.append(flop * count / (time.perf_counter() - t0))
    return statistics.median(rates)


def mm_rate(
    n: int = 1024,
    repeats: int = 5,
    seconds: float = 1.0,
    dtype: torch.dtype = torch.float32,
    shape: tuple[int, int, int] | None = None,
) -> float:
    """Median torch.mm FLOP/s in `dtype` with the current thread count, of n x n products or of
    [m, k] x [k, n] ones for `shape` = (m, k, n) (2mkn a product)."""
    m, k, n = shape or (n, n, n)
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    return rate(lambda: torch.mm(a, b), 2 * m * k * n, repeats, seconds)


def search_layer_rate(shape: tuple[int, int, int], repeats: int = 5, seconds: float = 1.0):
    """Median FLOP/s of an fp32 linear layer as search runs it on a CPU
    (s2s.core.nn.precision.RowPaddedLinear: oneDNN's product, without a gradient) on [m, k]
    inputs, k -> n features, for `shape` = (m, k, n); None where this s2s has no such layer
    (a commit before it)."""
    try:
        from s2s.core.nn.precision import RowPaddedLinear, onednn_linear
    except ImportError:
        return None
    if not onednn_linear():
        return None
    m, k, n = shape
    layer, x = RowPaddedLinear(k, n, bias=False), torch.randn(m, k)
    with torch.inference_mode():
        return rate(lambda: layer(x), 2 * m * k * n, repeats, seconds)


def read_rate(mib: int = 512, repeats: int = 5, seconds: float = 1.0) -> float:
    """Median bytes/s of summing an fp32 tensor of `mib` MiB (larger than any CPU cache: a read
    from memory) with the current thread count: what a pass over a search's key and value cache
    can read at most."""
    x = torch.ones(mib * 2**20 // 4)
    return rate(lambda: x.sum(), x.numel() * 4, repeats, seconds)


def flop_formula() -> str:
    """What the results' FLOPs count, for their JSON: s2s.core.nn.model.Transformer.flops's docstring
    on one line, its formula's lines as "expression (what it counts)" separated by semicolons."""
    import inspect
    import re

    from s2s.core.nn.model import Transformer

    text = []
    for para in inspect.getdoc(Transformer.flops).split("\n\n"):
        if para.startswith("    "):
            rows = (re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in para.splitlines())
            para = "; ".join(r[0] + "".join(f" ({c})" for c in r[1:]) for r in rows) + "."
        text.append(" ".join(para.split()))
    return "s2s.core.nn.model.Transformer.flops: " + " ".join(text)


def runtime_env() -> dict:
    """The environment that sets how the CPU runtime behaves: s2s's defaults (s2s.core.RUNTIME_ENV)
    as they are in effect, OpenMP's own settings, and the malloc parameters s2s set
    (s2s.core.MALLOC_SET)."""
    from s2s.core import MALLOC_SET, RUNTIME_ENV

    env = {k: os.environ.get(k) for k in (*RUNTIME_ENV, "OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    return {**env, "malloc_set_by_s2s": MALLOC_SET}


def child_json(module: str, args, env: dict | None = None) -> dict:
    """Run `python -m module *args` from the checkout, in a process of its own (with `env` added
    to the environment), and return the JSON object its last line of output prints."""
    out = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def results_of(script: str) -> Path:
    """The results folder of a benchmark script: bench/JOB/results, beside the script."""
    return Path(script).resolve().parent / "results"


def write(name: str, result: dict) -> Path:
    """Writes bench/JOB/results/NAME.json beside the calling benchmark, with the machine's facts."""
    caller = sys._getframe(1).f_globals["__file__"]
    folder = results_of(caller)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    atomic_write_text(path, json.dumps({"machine": machine(), **result}, indent=1) + "\n")
    return path


def table(rows: list[dict]) -> str:
    """A small fixed-width table of dict rows, for the terminal."""
    if not rows:
        return ""
    keys = list(rows[0])
    cells = [
        [f"{r.get(k):.4g}" if isinstance(r.get(k), float) else str(r.get(k)) for k in keys]
        for r in rows
    ]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(keys)] + [line(c) for c in cells])


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def commit_tree(rev: str):
    """Within: a folder whose `s2s` package is commit `rev`'s (a git worktree of it, its folders
    linked under the installed names), for `s2s_command`; the worktree is removed on leaving."""
    with tempfile.TemporaryDirectory(prefix="s2s-commit-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        try:
            pkg = Path(tmp) / "pkg" / "s2s"
            pkg.mkdir(parents=True)
            for name, folder in (
                ("core", "seq2seq_core"),
                ("plugins", "plugins"),
                ("data_recipes", "data_recipes"),
                ("tasks", "tasks"),
            ):
                (pkg / name).symlink_to(tree / folder)
            yield pkg.parent
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True
            )


#: set in the process that runs a benchmark on another commit's tree (`in_tree`)
TREE = "S2S_BENCH_TREE"


def in_tree(rev: str, module: str) -> None:
    """The benchmark `module`'s command (this process's arguments) run again with commit `rev`'s
    s2s package first on sys.path; `module`'s main() checks TREE to run there itself."""
    with commit_tree(rev) as path:
        code = f"import sys; sys.path.insert(0, {str(path)!r}); from {module} import main; main()"
        subprocess.run(
            [sys.executable, "-c", code, *sys.argv[1:]],
            cwd=REPO,
            env={**os.environ, TREE: rev},
            check=True,
        )


def s2s(*args) -> subprocess.CompletedProcess:
    """`s2s ARGS` of this checkout from the shell, its output captured; a failure raises."""
    command = [*s2s_command(), *map(str, args)]
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd=REPO)


def s2s_command(tree: Path | None = None) -> list[str]:
    """The `s2s` command line as a process: this checkout's, or (`tree`, from `commit_tree`) a
    commit's."""
    head = "" if tree is None else f"sys.path.insert(0, {str(tree)!r}); "
    return [
        sys.executable,
        "-c",
        f"import sys; {head}from s2s.core.apps.cli import main; sys.exit(main())",
    ]
