"""Noise on training sources: case, punctuation, typos, each pair's drawn from (seed, epoch, pair)
alone; bitwise resume with noise on is in tests/core/training/test_resume.py."""

import numpy as np
import torch
from s2s.core.data.augment import Augment
from s2s.core.data.batches import taken
from s2s.core.data.members import build_members
from s2s.core.data.nodes import prepare_data
from s2s.core.setup.config import load_config

from conftest import MULTI30K, corpus


def _member(registry, tmp_path, *noise):
    text = tmp_path / "text"
    text.mkdir(exist_ok=True)
    for lang in ("en", "de"):
        lines = (corpus(MULTI30K) / f"train.{lang}").read_text("utf-8").splitlines()[:1000]
        (text / f"train.{lang}").write_text("\n".join(lines) + "\n", "utf-8")
        (text / f"valid.{lang}").write_text("\n".join(lines[:5]) + "\n", "utf-8")
    cfg = load_config(
        "own_translation",
        [
            f"task.data_dir={text}",
            "task.test_prefix=",
            "task.vocab_size=400",
            f"data.cache_dir={tmp_path / 'cache'}",
            *noise,
        ],
        registry=registry,
    )
    (m,) = build_members(cfg, registry)
    m.data = prepare_data(m.task, cfg.data, quiet=True)
    return m


def _sources(m, batch):
    return [m.task.src_vocab.decode([i for i in row.tolist() if i > 3]) for row in batch["src"]]


def test_each_kind_of_noise_at_probability_one():
    cfg = {"augment_case": 0, "augment_punct": 1, "augment_typos": 0, "max_len": 100}
    rng = Augment(_Cfg(cfg), seed=1).rng(0, 0)
    assert Augment(_Cfg(cfg), 1).text("A dog, running.", rng) == "A dog running"
    case = Augment(_Cfg({**cfg, "augment_punct": 0, "augment_case": 1}), 1)
    assert {case.text("A Dog", case.rng(0, i)) for i in range(20)} == {"A DOG", "a dog"}
    typos = Augment(_Cfg({**cfg, "augment_punct": 0, "augment_typos": 1}), 1)
    noised = typos.text("the yellow dog is on a hill", typos.rng(0, 3))
    assert [a == b for a, b in zip(noised.split(), "the yellow dog is on a hill".split())] == [
        False, False, False, True, True, True, False,
    ]  # fmt: skip


class _Cfg(dict):
    __getattr__ = dict.__getitem__


def test_a_pairs_noise_follows_from_seed_epoch_and_index_alone(registry, tmp_path):
    """The same pair gets the same noisy source in any batch of the same epoch, another in
    another epoch; targets, and batches that carry no epoch (validation's), are untouched."""
    m = _member(
        registry, tmp_path, "data.augment_case=0.5", "data.augment_punct=0.5",
        "data.augment_typos=0.2",
    )  # fmt: skip
    plain = m.batch("train", np.arange(8))
    first = m.batch("train", taken(np.arange(8), 0))
    assert not torch.equal(first["src"], plain["src"])
    assert torch.equal(first["tgt_out"], plain["tgt_out"])
    assert torch.equal(first["tgt_in"], plain["tgt_in"])
    again = m.batch("train", taken(np.array([5, 3, 900, 0]), 0))
    assert _sources(m, again)[0] == _sources(m, first)[5]
    assert _sources(m, again)[1] == _sources(m, first)[3]
    assert _sources(m, again)[3] == _sources(m, first)[0]
    other = m.batch("train", taken(np.arange(8), 1))
    assert _sources(m, other) != _sources(m, first)
    assert torch.equal(
        m.batch("valid", taken(np.arange(3), 0))["src"], m.batch("valid", np.arange(3))["src"]
    )


def test_no_noise_asked_none_made(registry, tmp_path):
    m = _member(registry, tmp_path)
    assert m.augment is None
    assert torch.equal(
        m.batch("train", taken(np.arange(8), 0))["src"], m.batch("train", np.arange(8))["src"]
    )
