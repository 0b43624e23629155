"""Data parallelism: 2 processes with batch B take the steps of 1 process with batch 2B, and of
1 process with batch B and update_freq 2.

The batch plan is the real one: each member's batches are one sequence R for any number of
processes (`s2s.core.training.schedule`), and update i takes R[2i] and R[2i+1], on processes 0
and 1, or both on the one process with update_freq 2, each batch with the dropout masks of its
slot. The run with batch 2B replaces `epoch_batches` with [R[2i] + R[2i+1] for each i] (one batch,
padded to the longer of the two), so that every update of every run covers the same pairs.

Dropout is off in the 2B comparison (one batch draws other masks than two) and on between 2
processes and update_freq 2, whose masks are the same. The 2-process run is launched as users do,
`torchrun --standalone --nproc_per_node 2 --no-python s2s train ...`, on gloo. After several
updates at a large learning rate, parameters and Adam's first moment (a linear function of the
gradients, so it also catches a wrong normalisation, which Adam's step alone would hide) agree
to 1e-5 relative; the per-update losses logged agree too.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import S2S, task_keys
from s2s.core.data.members import build_members, load_vocabularies
from s2s.core.data import batches
from s2s.core.nn.model import Transformer
from s2s.core.setup.config import load_config
from s2s.core.runs import checkpoint
from s2s.core.training import schedule
from s2s.core.training.trainer import Trainer, train

UPDATES = 6
# Adam divides each moment by sqrt(v) + eps. Where a gradient is rounding noise (~1e-10 here, from
# sums taken in another order), the paper's eps of 1e-9 lets Adam scale that noise up to
# lr-sized steps, and the runs drift apart by chance (once in 11 runs: CPU GEMM rounding may vary with memory alignment). 1e-6 sits far below
# every real gradient (>= 1e-4 here, so Adam's step is unchanged there) and far above the noise,
# which then moves nothing: the comparison becomes deterministic and still catches any error of
# normalisation or data split (those change real gradients and Adam's first moment).
EPS = 1e-6
DROPOUT = "model.dropout=0.1"


def _overrides(tmp, cache, name, *extra, preset="demo"):
    return [
        "model.layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        "model.heads=2",
        "model.dropout=0",
        f"run.dir={tmp / name}",
        f"data.cache_dir={cache}",
        *task_keys(preset, "train_size=400", "valid_size=8", "test_size=4"),
        "data.max_tokens=300",
        # seed 2 draws both members of multitask_demo within the updates (seed 1: 7 x translate)
        f"run.seed={1 if preset == 'demo' else 2}",
        "optim.warmup=4",
        f"optim.max_updates={UPDATES}",
        "run.log_interval=1",
        "run.valid_interval=1000",
        "run.save_interval=1000",
        "run.threads=1",
        "run.device=cpu",
        "run.quiet=true",
        f"optim.eps={EPS}",
        *extra,
    ]


def _twice_the_batch(split, max_tokens, seed, epoch):
    """The epoch's batches two by two, each pair as one batch."""
    r = batches.epoch_batches(split, max_tokens, seed, epoch)
    return [np.concatenate([r[i], r[i + 1]]) for i in range(0, len(r) - 1, 2)]


def _final(run_dir):
    state = checkpoint.load(checkpoint.listed(run_dir)[-1])
    assert state["update"] == UPDATES
    losses = [
        json.loads(line)["loss"]
        for line in open(run_dir / "metrics.jsonl")
        if json.loads(line)["kind"] == "train"
    ]
    return state, losses


def _members_trained(run_dir):
    """The members named in the train records (one per update with run.log_interval=1)."""
    return [
        k.split("/")[0]
        for line in open(run_dir / "metrics.jsonl")
        for k in json.loads(line)
        if k.endswith("/loss") and json.loads(line)["kind"] == "train"
    ]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _assert_same_steps(a, b, what, index, skip=()):
    """Parameters and Adam's moments (`index`: parameter name -> optimiser state key) agree."""
    (sa, la), (sb, lb) = a, b
    names = [k for k in sb["model"] if k not in skip]
    worst = max(_rel(sa["model"][k], sb["model"][k]) for k in names)
    assert worst < 1e-5, f"{what}: parameters differ by {worst:.2e} relative"
    for key in ("exp_avg", "exp_avg_sq"):
        moments = sa["optimizer"]["state"], sb["optimizer"]["state"]
        worst = max(
            _rel(moments[0][index[k]][key], moments[1][index[k]][key]) for k in names if k in index
        )
        assert worst < 1e-5, f"{what}: Adam {key} differs by {worst:.2e} relative"
    assert np.allclose(la, lb, rtol=1e-5, atol=0), f"{what}: logged losses {la} vs {lb}"


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["demo", "multitask_demo"])
def test_two_processes_equal_one_with_twice_the_batch_and_with_update_freq_2(
    preset, registry, tmp_path, monkeypatch
):
    """A multi-task run too: every process draws the same member for an update. Dropout is on
    between 2 processes and update_freq 2 (each batch draws its slot's masks), off between
    update_freq 2 and batch 2B."""
    cache = tmp_path / "cache"

    def one(name, *extra):
        cfg = load_config(
            preset, _overrides(tmp_path, cache, name, *extra, preset=preset), registry=registry
        )
        train(cfg, registry)

    monkeypatch.setattr(schedule, "epoch_batches", _twice_the_batch)  # also prepares the cache
    one("one_2B")
    monkeypatch.undo()
    one("one_B_uf2", "optim.update_freq=2")
    one("one_B_uf2_dropout", "optim.update_freq=2", DROPOUT)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "--no-python",
            S2S,
            "train",
            "-q",
            preset,
            *_overrides(tmp_path, cache, "two", DROPOUT, preset=preset),
            "run.max_minutes=600",
            "run.save_minutes=600",
        ],  # rank 0's clock asked each step
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    names = ("two", "one_B_uf2_dropout", "one_2B", "one_B_uf2")
    two, one_uf2_dropout, one_2b, one_uf2 = (_final(tmp_path / n) for n in names)
    cfg = load_config(preset, _overrides(tmp_path, cache, "two", preset=preset), registry=registry)
    run = build_members(cfg, registry)
    sizes = load_vocabularies(run, tmp_path / "two")
    if preset != "demo":  # both members trained within the compared updates
        assert len({r for r in _members_trained(tmp_path / "two")}) == 2
    torch.manual_seed(cfg.run.seed)
    model = Transformer(cfg.model, *sizes)
    index = {name: i for i, (name, _) in enumerate(model.named_parameters())}  # a tied tensor once

    _assert_same_steps(two, one_uf2_dropout, "2 processes vs update_freq 2, dropout on", index)
    # The bias of a key projection adds q.b to every score of a query, which softmax ignores: its
    # gradient is 0 in exact arithmetic, and what floating point leaves there is rounding noise
    # that Adam scales up to lr-sized steps. Batches of other shapes round differently, so those
    # biases are left out of the 2B comparison (their noise is checked to be noise: ~0 moments).
    key_bias = [k for k in index if k.endswith("w_k.bias")]
    state = one_uf2[0]["optimizer"]["state"]
    for k in key_bias:
        weight = state[index[k.replace("bias", "weight")]]["exp_avg"].abs().max()
        assert state[index[k]]["exp_avg"].abs().max() < 1e-5 * weight, k
    _assert_same_steps(one_uf2, one_2b, "update_freq 2 vs batch 2B", index, skip=key_bias)
    # dropout made a difference: the runs with it are not the runs without
    with_, without = one_uf2_dropout[0]["model"], one_uf2[0]["model"]
    assert max(_rel(with_[k], without[k]) for k in without) > 1e-3

    # not a vacuous agreement: the parameters moved far from where they started
    start = model.state_dict()
    assert min(_rel(two[0]["model"][k], start[k]) for k in start if k.endswith("weight")) > 1e-3


def test_loss_is_normalised_by_the_target_tokens_of_the_whole_update(registry, tiny):
    """Gradients = d(sum of token losses over all batches of the update) / (their target tokens)."""
    cfg = load_config(
        "demo",
        tiny(
            "task.train_size=200",
            "task.valid_size=4",
            "task.test_size=4",
            "data.max_tokens=200",
            "model.dropout=0",
            "optim.update_freq=2",
            "run.threads=1",
        ),
        registry=registry,
    )
    trainer = Trainer(cfg, registry)
    member, stream = trainer.members[0], trainer.streams[0]
    batches = [stream.next(), stream.next()]
    out = trainer.gradients(member, batches)
    got = {n: p.grad.clone() for n, p in trainer.model.named_parameters()}
    trainer.optimizer.zero_grad(set_to_none=True)

    split = member.data.splits["train"]
    total, ntokens = 0.0, 0
    for idx in batches:
        b = split.batch(idx)
        total = total + trainer.model(b["src"], b["tgt_in"], b["tgt_out"], 0.1)[0]
        ntokens += b["ntokens"]
    (total / ntokens).backward()
    assert out["ntokens"].item() == ntokens
    assert (
        ntokens != split.batch(batches[0])["ntokens"] * 2
    )  # unequal batches: a mean of means would differ
    for n, p in trainer.model.named_parameters():
        assert torch.allclose(got[n], p.grad, rtol=1e-5, atol=1e-9), n
    trainer.close()
