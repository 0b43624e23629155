"""run.init_from: a new run starts from another run's weights (issue 23)."""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from s2s.core.apps.cli import main
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from s2s.core.runs import checkpoint
from s2s.core.training.trainer import Trainer, train
from conftest import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "run.quiet=true",
    "task.valid_size=10",
    "task.test_size=10",
    "run.valid_interval=2",
    "run.save_interval=1",
]


@pytest.fixture(scope="module")
def registry():
    return Registry.installed()


@pytest.fixture(scope="module")
def source(tmp_path_factory, registry) -> Path:
    """A tiny demo run of 4 updates on 400 pairs."""
    root = tmp_path_factory.mktemp("source")
    cfg = load_config(
        "demo",
        [
            *TINY,
            "task.train_size=400",
            "optim.max_updates=4",
            f"run.dir={root / 'run'}",
            f"data.cache_dir={root / 'cache'}",
        ],
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    return root / "run"


def _trainer(registry, tmp_path, *extra) -> Trainer:
    cfg = load_config(
        "demo",
        [
            *TINY,
            "task.train_size=400",
            "optim.max_updates=8",
            f"run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *extra,
        ],
        registry=registry,
    )
    return Trainer(cfg, registry, quiet=True)


def _tested(run: Path) -> dict:
    return checkpoint.tested(run)[0]


def test_init_from_carries_the_weights_and_nothing_else_by_default(source, registry, tmp_path):
    trainer = _trainer(registry, tmp_path, f"run.init_from={source}")
    try:
        theirs = _tested(source)["model"]
        for name, tensor in trainer.model.state_dict().items():
            assert torch.equal(tensor, theirs[name]), name
        assert trainer.update == 0 and trainer.best is None and not trainer.optimizer.state
        assert all(s.state() == [0, 0] for s in trainer.streams)
    finally:
        trainer.close()


def test_init_keep_takes_the_optimizer_schedule_best_and_data_position(source, registry, tmp_path):
    state = _tested(source)
    trainer = _trainer(
        registry,
        tmp_path,
        f"run.init_from={source}",
        "run.init_keep=[optimizer,schedule,best,data]",
    )
    try:
        assert trainer.update == state["update"] and trainer.best == state["best"]
        assert [s.state() for s in trainer.streams] == [list(p) for p in state["streams"].values()]
        moments = trainer.optimizer.state_dict()["state"]
        assert moments and all(
            torch.equal(moments[k]["exp_avg"], v["exp_avg"])
            for k, v in state["optimizer"]["state"].items()
        )
    finally:
        trainer.close()


def test_rows_are_carried_by_token_string_when_the_vocabulary_differs(source, registry, tmp_path):
    """The demo parsed instead of translated: the English words take the source run's rows, the
    tree labels keep their fresh ones (and the foreign words are not carried)."""
    trainer = _trainer(registry, tmp_path, f"run.init_from={source}", "task.mode=parse")
    fresh = _trainer(registry, tmp_path / "fresh", "task.mode=parse")
    try:
        theirs = _tested(source)["model"]["tgt_embed.weight"]
        old = {t: i for i, t in enumerate(load_vocab(source).itos)}
        new_vocab = trainer.members[0].task.tgt_vocab.itos
        assert set(new_vocab) != set(old)  # the vocabularies differ
        mine, init = (
            trainer.model.state_dict()["tgt_embed.weight"],
            fresh.model.state_dict()["tgt_embed.weight"],
        )
        shared = [t for t in new_vocab if t in old]
        assert 4 < len(shared) < len(old)
        for i, token in enumerate(new_vocab):
            assert torch.equal(mine[i], theirs[old[token]] if token in old else init[i]), token
    finally:
        trainer.close()
        fresh.close()


def load_vocab(run: Path):
    from s2s.core.tokenizers import WordTokenizer

    return WordTokenizer.load(run / "vocab.json")


def test_a_member_is_fine_tuned_out_of_a_multi_task_run(registry, tmp_path):
    joint = tmp_path / "joint"
    cfg = load_config(
        "multitask_demo",
        [
            "model.layers=1",
            "model.d_model=32",
            "model.d_ff=64",
            "model.heads=2",
            "run.quiet=true",
            "run.threads=1",
            "optim.max_updates=2",
            "run.valid_interval=2",
            f"run.dir={joint}",
            f"data.cache_dir={tmp_path / 'c'}",
            *[
                f"tasks.{m}.task.{k}"
                for m in ("translate", "parse")
                for k in ("train_size=200", "valid_size=10", "test_size=10")
            ],
        ],
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    members = list(cfg.tasks)
    trainer = _trainer(
        registry,
        tmp_path,
        f"run.init_from={joint}",
        "run.init_member=parse",
        "task.mode=parse",
        "task.train_size=200",
        "model.pre_norm=true",
    )  # the joint preset's
    try:
        theirs = _tested(joint)["model"]
        from s2s.core.data.idspace import join
        from s2s.core.data.members import build_members, load_vocabularies

        joint_members = build_members(
            load_config(joint / "config.yaml", registry=registry), registry
        )
        load_vocabularies(joint_members, joint)
        parse = joint_members[members.index("parse")]
        rows = {
            t: (i + parse.ids.tgt_offset if i >= 4 else i)
            for i, t in enumerate(parse.task.tgt_vocab.itos)
        }
        mine = trainer.model.state_dict()["out.weight"]
        vocab = trainer.members[0].task.tgt_vocab.itos
        assert join(trainer.members)[1] == len(vocab)
        for i, token in enumerate(vocab):
            if token in rows:
                assert torch.equal(mine[i], theirs["out.weight"][rows[token]]), token
    finally:
        trainer.close()


def test_a_model_of_another_shape_is_named(source, capsys, tmp_path):
    argv = [
        "train",
        "demo",
        "-q",
        *TINY,
        "model.d_ff=128",
        "task.train_size=400",
        "optim.max_updates=2",
        f"run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        f"run.init_from={source}",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "model.d_ff is 64 there and 128 here" in err, err
    argv[argv.index("model.d_ff=128")] = (
        "model.pre_norm=true"  # the same shapes but for two LayerNorms
    )
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "model.pre_norm is False there and True here; set model.pre_norm=False" in err, err


@pytest.mark.slow
def test_sigkill_during_a_fine_tuning_run_resumes_bitwise(source, tmp_path):
    """Killed after a checkpoint of its own, the run resumes from that, not from its source, and
    ends with the model of a run never stopped."""
    common = [
        sys.executable,
        "-m",
        "s2s.core.apps.cli",
        "train",
        "demo",
        "-q",
        *TINY,
        "task.train_size=400",
        "optim.max_updates=30",
        f"run.init_from={source}",
        f"data.cache_dir={tmp_path / 'cache'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [*common, f"run.dir={tmp_path / 'whole'}"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    broken = tmp_path / "broken"
    run = subprocess.Popen(
        [*common, f"run.dir={broken}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(1200):
        if (
            len(list((broken / "checkpoints").glob("checkpoint_*.pt"))) >= 3
            or run.poll() is not None
        ):
            break
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)
    subprocess.run(
        [*common, f"run.dir={broken}"], env=env, check=True, capture_output=True, timeout=300
    )
    a = checkpoint.load(checkpoint.listed(tmp_path / "whole")[-1])
    b = checkpoint.load(checkpoint.listed(broken)[-1])
    assert a["update"] == b["update"] == 30
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def _captions(folder: Path, extra: list[str]) -> Path:
    """Tiny parallel text (train/valid/test .en/.de); `extra` lines join the training text."""
    import random

    words = "a the man woman dog cat sees likes runs sits big small red blue house park".split()
    rng = random.Random(3)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 80), ("valid", 4), ("test", 4)):
        lines = [" ".join(rng.choice(words) for _ in range(5)) for _ in range(n)] + (
            extra if split == "train" else []
        )
        (folder / f"{split}.en").write_text(
            "".join(f"{line}\n" for line in lines), encoding="utf-8"
        )
        (folder / f"{split}.de").write_text(
            "".join(f"{line.upper()}\n" for line in lines), encoding="utf-8"
        )
    return folder


def test_rows_are_carried_by_token_string_on_a_vocabulary_that_differs_in_a_few_tokens(
    registry, tmp_path
):
    """Subword vocabularies trained on text that differs in two lines: the tokens both hold take
    the source's rows wherever their ids moved, the few new ones keep fresh rows."""

    def cfg(name: str, extra: list[str], *more: str):
        return load_config(
            None,
            [
                "task.name=translation",
                "task.source=text",
                "task.vocab_size=300",
                f"task.data_dir={_captions(tmp_path / name, extra)}",
                *TINY[:6],
                "optim.max_updates=2",
                "run.valid_interval=2",
                "run.save_interval=2",
                "run.valid_max_sentences=2",
                "decode.beam=1",
                f"run.dir={tmp_path / name / 'run'}",
                f"data.cache_dir={tmp_path / 'cache'}",
                *more,
            ],
            registry=registry,
        )

    train(cfg("old", []), registry, quiet=True)
    new_words = ["zebra xylophone quokka"] * 30
    trainer = Trainer(
        cfg("new", new_words, f"run.init_from={tmp_path / 'old' / 'run'}"), registry, quiet=True
    )
    fresh = Trainer(cfg("fresh", new_words), registry, quiet=True)
    try:
        from s2s.core.training.transfer import tokens_of

        theirs = _tested(tmp_path / "old" / "run")["model"]["tgt_embed.weight"]
        old_run = load_config(tmp_path / "old" / "run" / "config.yaml", registry=registry)
        from s2s.core.data.members import build_members, load_vocabularies

        old_members = build_members(old_run, registry)
        load_vocabularies(old_members, tmp_path / "old" / "run")
        old = {t: i for i, t in enumerate(tokens_of(old_members[0].task.tgt_vocab))}
        new = tokens_of(trainer.members[0].task.tgt_vocab)
        differ = [t for t in new if t not in old]
        assert 0 < len(differ) <= 30 and len(new) == len(old)  # a few tokens differ
        assert any(old[t] != i for i, t in enumerate(new) if t in old)  # and shared ones moved
        mine, init = (
            trainer.model.state_dict()["tgt_embed.weight"],
            fresh.model.state_dict()["tgt_embed.weight"],
        )
        for i, token in enumerate(new):
            assert torch.equal(mine[i], theirs[old[token]] if token in old else init[i]), token
    finally:
        trainer.close()
        fresh.close()


def test_depths_of_their_own_train_resume_generate_and_fine_tune(registry, tmp_path, capsys):
    """A run with a 2-layer encoder and a 1-layer decoder trains, its checkpoint holds those
    stacks, `s2s generate` decodes it, fine-tuning takes it with the same depths, and another
    decoder depth is named in one line."""
    common = [*TINY, "task.train_size=400", f"data.cache_dir={tmp_path / 'cache'}"]
    run = tmp_path / "deep"
    depths = ["model.encoder_layers=2", "model.decoder_layers=1"]
    argv = ["train", "demo", "-q", *common, *depths, "optim.max_updates=2", f"run.dir={run}"]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    weights = _tested(run)["model"]
    assert "encoder.1.ffn.0.weight" in weights and "decoder.1.ffn.0.weight" not in weights
    source = tmp_path / "in.txt"
    source.write_text("a b c\nd e\n", encoding="utf-8")
    assert main(["generate", str(run), "--input", str(source)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    tuned = ["train", "demo", "-q", *common, *depths, "optim.max_updates=2"]
    assert main([*tuned, f"run.dir={tmp_path / 'ft'}", f"run.init_from={run}"]) == 0
    capsys.readouterr()
    assert _tested(tmp_path / "ft")["model"].keys() == weights.keys()
    tuned[tuned.index("model.decoder_layers=1")] = "model.decoder_layers=2"
    assert main([*tuned, f"run.dir={tmp_path / 'bad'}", f"run.init_from={run}"]) == 2
    err = capsys.readouterr().err
    assert "the decoder has 1 layers there and 2 here; set model.decoder_layers=1" in err, err
