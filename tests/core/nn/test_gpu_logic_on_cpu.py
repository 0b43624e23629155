"""The GPU path's logic, proven on CPU (issue 28): the loss's chunks, fp16's projection, the
precision a compute capability gets, LOCAL_RANK, one cache builder a machine, rank 0's long
phases under a short collective timeout, and the GPU check's dry run.

The figures these choices are for (launches, syncs, tokens/s, MFU) need a GPU:
`bash bench/training/gpu_check.sh` measures them there (tests/core/nn/test_gpu.py holds the `-m gpu` tests).
"""

import json
import logging
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, free_port, task_keys
from omegaconf import OmegaConf
from s2s.core.data.members import build_task
from s2s.core.errors import ConfigError
from s2s.core.nn import precision
from s2s.core.nn.loss import MIN_ROWS, chunk_rows, label_smoothed_loss
from s2s.core.nn.model import Transformer
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from s2s.core.setup.settings import DataConfig, ModelConfig
from s2s.core.runs import distributed
from torch.utils._python_dispatch import TorchDispatchMode

CUDA = torch.device("cuda")
GiB = 2**30


class Ops(TorchDispatchMode):
    """Every aten op run inside, with the largest tensor any of them returned."""

    def __init__(self):
        super().__init__()
        self.names, self.largest, self.mm_dtypes = set(), 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.names.add(func.__name__.split(".")[0])
        if func.__name__.split(".")[0] in ("mm", "addmm"):
            self.mm_dtypes.append(args[-1].dtype)
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


# -- finding 1: the loss's chunks ------------------------------------------------------------
def test_the_loss_takes_thousands_of_rows_a_chunk_at_gpu_sizes():
    """A 25k-token batch over a 37k vocabulary: 28 rows a chunk before (2^20 logits), hence ~900
    chunks of ~20 launches; now a few chunks of thousands of rows, within 1/32 of the card."""
    for memory, least in ((16 * GiB, 2_000), (40 * GiB, 5_000), (80 * GiB, 10_000)):
        rows = chunk_rows(25_000, 37_000, CUDA, memory=memory)
        assert rows >= least, (memory, rows)
        assert rows * 37_000 * 6 <= memory / 32 + MIN_ROWS * 37_000 * 6
    assert (
        chunk_rows(25_000, 37_000, CUDA, memory=4 * GiB) == MIN_ROWS
    )  # a small card: still 1,024 rows
    assert chunk_rows(300, 37_000, CUDA, memory=80 * GiB) == 300  # never more than the batch
    assert chunk_rows(25_000, 37_000, torch.device("cpu")) == MIN_ROWS
    assert (
        chunk_rows(25_000, 500, torch.device("cpu")) == (1 << 20) // 500
    )  # small vocabularies: 4 MiB of logits


def test_training_loss_holds_no_full_logit_gradient_and_waits_for_nothing():
    """The gradient is multiplied out chunk by chunk (no [N, V] buffer), and PAD rows are masked,
    not found with nonzero() (which waits for the device)."""
    torch.manual_seed(0)
    N, V, d = 2_500, 1_100, 16  # 3 chunks of 1,024 rows
    hidden = torch.randn(N, d, requires_grad=True)
    weight = torch.randn(V, d, requires_grad=True)
    target = torch.randint(1, V, (N,))
    target[-500:] = 0
    with Ops() as ops:
        loss, _ = label_smoothed_loss(hidden, weight, target, 0.1)
        loss.backward()
    assert ops.largest <= MIN_ROWS * V < N * V
    assert not ops.names & {
        "nonzero",
        "_local_scalar_dense",
        "item",
        "masked_select",
        "index_select",
    }
    assert hidden.grad[-500:].abs().max() == 0 and hidden.grad[:-500].abs().max() > 0


def test_fp16_projects_and_reduces_the_logits_in_half_precision():
    """Under fp16 autocast the final LayerNorm returns fp32 and the output weight is fp32; the
    loss casts both to fp16, so the [tokens, V] products run in half precision."""
    cfg = ModelConfig(layers=1, d_model=32, d_ff=64, heads=2, dropout=0.0, max_positions=32)
    torch.manual_seed(0)
    model = Transformer(cfg, 500, 500, shared_vocab=True)
    src, tgt = torch.randint(4, 500, (4, 9)), torch.randint(4, 500, (4, 7))
    with torch.autocast("cpu", dtype=torch.float16):
        with Ops() as ops:
            loss, nll = model(src, tgt, tgt, 0.1)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert ops.mm_dtypes.count(torch.float16) >= 3  # the projection, dL/dh and dL/dW of the loss
    assert torch.float32 not in ops.mm_dtypes
    loss.backward()
    assert (
        model.out.weight.grad.dtype == torch.float32 and torch.isfinite(model.out.weight.grad).all()
    )


# -- finding 8: the input pipeline ----------------------------------------------------------
def test_batches_built_ahead_are_used_when_the_guess_was_right_and_rebuilt_when_not(monkeypatch):
    """On CUDA the next update's batches are built on a worker thread from a copy of the stream
    (pin_memory stands in for itself here: this torch has no CUDA); the stream does not move."""
    import numpy as np
    from s2s.core.training.prefetch import Prefetch

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)

    class Member:
        built = []

        def batch(self, split, idx):
            self.built.append(tuple(idx))
            return {"src": torch.tensor(idx), "ntokens": len(idx)}

    class Stream:
        def __init__(self):
            self.pos = 0

        def next(self):
            self.pos += 1
            return np.array([self.pos, self.pos + 100])

        def update_batches(self):  # this process's two batches of the next update
            return [self.next(), self.next()]

    member, stream = Member(), Stream()
    ahead = Prefetch(CUDA)
    try:
        ahead.ahead(member, stream)
        assert stream.pos == 0  # a copy was read, not the stream
        got = ahead.take(
            member, [stream.next(), stream.next()]
        )  # the same pairs: built ahead, once
        assert [b["src"].tolist() for b in got] == [[1, 101], [2, 102]] and len(member.built) == 2
        ahead.ahead(member, stream)
        got = ahead.take(member, [np.array([7, 8])])  # another draw: built now
        assert got[0]["src"].tolist() == [7, 8] and member.built[-1] == (7, 8)
    finally:
        ahead.close()
    assert Prefetch(torch.device("cpu")).pool is None  # on CPU each batch is built when used


# -- findings 2 and 7: precision from the compute capability ---------------------------------
@pytest.fixture
def tf32_flags():
    """torch's two TF32 switches as they were, set back by assignment after the test: torch's
    backend modules refuse `delattr`, which is how pytest's monkeypatch (9.2 on) restores them."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize(
    "capability, auto, bf16, tf32",
    [
        ((9, 0), "bf16", "bf16", True),
        ((8, 0), "bf16", "bf16", True),
        ((7, 5), "fp16", "fp32", False),
        ((7, 0), "fp16", "fp32", False),
        ((6, 1), "fp32", "fp32", False),
    ],
)
def test_precision_follows_the_compute_capability(
    capability, auto, bf16, tf32, monkeypatch, caplog, tf32_flags
):
    """bf16 natively from Ampere (sm_80) on, with TF32 for fp32 products; a V100 or T4, which
    torch.cuda.is_bf16_supported() passes through emulation, gets fp16 for auto, fp32 for bf16."""
    monkeypatch.setattr(precision, "cuda_capability", lambda device: capability)
    torch.backends.cuda.matmul.allow_tf32 = False
    assert precision.resolve("auto", CUDA) == auto
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    with caplog.at_level(logging.WARNING, logger="s2s"):
        assert precision.resolve("bf16", CUDA) == bf16
    assert ("no native bf16" in caplog.text) == (bf16 == "fp32")
    assert precision.resolve("fp32", CUDA) == "fp32" and precision.resolve("fp16", CUDA) == "fp16"


def test_the_wmt_presets_train_in_auto():
    registry = Registry.installed()
    for preset in ("wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_base", "wmt14_en_fr_big"):
        assert str(load_config(preset, [], registry=registry).run.precision) == "auto", preset


# -- finding 10: LOCAL_RANK ------------------------------------------------------------------
def test_each_torchrun_process_takes_the_gpu_of_its_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert distributed.resolve_device("cuda") == torch.device("cuda:3")
    assert distributed.resolve_device("auto") == torch.device("cuda:3")
    with pytest.raises(ConfigError, match=r"run.device=cuda:1: under torchrun .* run.device=cuda"):
        distributed.resolve_device("cuda:1")  # all four processes on one GPU
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one process a node may choose its GPU
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert distributed.resolve_device("cuda:2") == torch.device("cuda:2")
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(ConfigError, match="LOCAL_RANK=5.*4 CUDA device"):
        distributed.resolve_device("cuda")


def test_the_docs_no_longer_claim_bitwise_resume_in_bf16_on_cuda():
    text = (ROOT / "docs" / "training-at-scale.md").read_text()
    assert "Resuming is bitwise exact in bf16 too." not in text
    assert "atomic" in text and "CUDA" in text


# -- finding 9: one builder a machine --------------------------------------------------------
def _prepare_in_child(cache, log):
    from s2s.core.data import build as child_build
    from s2s.core.data import nodes as child_data

    real = child_build._build

    def counted(*args, **kwargs):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        real(*args, **kwargs)

    child_build._build = counted
    registry = Registry.installed()
    cfg = load_config(
        "demo",
        task_keys("demo", "train_size=300", "valid_size=8", "test_size=4"),
        registry=registry,
    )
    task = build_task(cfg.task, registry)
    prepared = child_data.prepare_data(
        task, OmegaConf.structured(DataConfig(cache_dir=str(cache))), quiet=True
    )
    return prepared.pairs["train"]


@pytest.mark.slow
def test_one_process_of_a_machine_builds_a_missing_cache_the_others_read_it(tmp_path):
    log = tmp_path / "built.txt"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        pairs = pool.starmap(_prepare_in_child, [(tmp_path / "cache", log)] * 3)
    assert len(set(pairs)) == 1 and pairs[0] > 0
    assert len(log.read_text().split()) == 1  # one build; the other two waited and read it
    assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp" in p.name]


# -- findings 4 and 5: rank 0 alone, past a short collective timeout -------------------------
SLOW_RANK0 = '''
import os, time
from s2s.plugins.demo import DemoTask

SLEEP = {sleep}


class SlowRank0Demo(DemoTask):
    """The demo task, with rank 0's first data preparation and its test decode slower than
    run.timeout_minutes."""

    name = "slow_rank0_demo"

    def read_split(self, split):
        if split == "train" and os.environ.get("RANK") == "0":
            time.sleep(SLEEP)
        yield from super().read_split(split)

    def score(self, hypotheses, references, sources=None):
        if len(hypotheses) == {test_size} and os.environ.get("RANK") == "0":
            time.sleep(SLEEP)
        return super().score(hypotheses, references, sources)
'''


@pytest.mark.slow
def test_rank0_phases_longer_than_the_collective_timeout_finish_and_write_the_result(tmp_path):
    """2 gloo processes, run.timeout_minutes=0.5: rank 0 prepares the data (35 s) and decodes the
    test set (35 s) alone while rank 1 waits over the run.wait_minutes group; the checkpoints are
    averaged on rank 0 and broadcast. The run finishes and writes result.json."""
    plugin = tmp_path / "slow_rank0.py"
    plugin.write_text(SLOW_RANK0.format(sleep=35, test_size=4))
    port = free_port()
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "s2s.core.apps.cli",
        "train",
        "-q",
        "--plugin",
        str(plugin),
        "demo",
        "task.name=slow_rank0_demo",
        *task_keys("demo", "train_size=300", "valid_size=8", "test_size=4"),
        "model.layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.heads=2",
        "data.max_tokens=300",
        "optim.max_updates=4",
        "run.save_interval=1",
        "run.valid_interval=4",
        "run.keep_last=2",
        "run.average_last=2",
        "run.threads=1",
        "run.device=cpu",
        f"run.dir={run_dir}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "run.timeout_minutes=0.5",
        "run.wait_minutes=5",
    ]
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    result = json.loads((run_dir / "result.json").read_text())
    assert (
        result["update"] == 4 and result["averaged"] == 2 and "bleu" in json.dumps(result["test"])
    )


# -- finding 11: the GPU check runs up to the CUDA calls on CPU ------------------------------
@pytest.mark.slow
def test_the_gpu_check_runs_end_to_end_on_cpu_as_a_dry_run(tmp_path):
    out = subprocess.run(
        ["bash", "bench/training/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "S2S_GPU_CHECK_RESULTS": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gpu_check: dry run passed" in out.stdout
    written = json.loads(next(tmp_path.glob("gpu_check*.json")).read_text())
    assert written["dry_run"] is True
    # each precision asked for (a CPU without native bf16 computes the bf16 step in fp32)
    assert {r["asked"] for r in written["steps"]} == {"bf16", "fp16", "fp32"}
    assert written["loss"]["chunks"] >= 1 and "load_average" in written["machine"]
