"""Multi-task runs: members in one id space, the schedule of their batches, per-member figures,
generation for one member, and the preset that joins the two demo tasks."""

import json
import re
import types
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import task_keys
from s2s.core.apps.cli import main
from s2s.core.data.idspace import MappedConstraint, join
from s2s.core.data.members import Member, build_members
from s2s.core.errors import ConfigError, DataError
from s2s.core.setup.config import load_config
from s2s.core.runs.metrics import read_metrics
from s2s.core.training.schedule import draw
from s2s.core.training.trainer import train
from s2s.core.tokenizers import EOS, SPECIALS

SMALL = ("train_size=300", "valid_size=8", "test_size=6")


def _cfg(registry, tiny, *extra):
    return load_config(
        "multitask_demo",
        tiny(
            *task_keys("multitask_demo", *SMALL), "data.max_tokens=300", "optim.warmup=10", *extra
        ),
        registry=registry,
    )


class _Vocab:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


class _Task:
    """Just what `join` and a Member read of a task: vocabulary sizes, shared or not, ids."""

    name = "fake"

    def __init__(self, src, tgt, shared):
        self.src_vocab_size, self.tgt_vocab_size, self.shared_vocab = src, tgt, shared

    def encode_source(self, lines):
        return [[int(w) for w in line.split()] for line in lines]

    def decode_target(self, ids):
        return " ".join(map(str, ids))

    def constraint(self, sources):
        return None


def test_members_get_disjoint_ids_and_their_own_task_tokens():
    n = len(SPECIALS)
    a, b = Member("a", _Task(10, 7, False)), Member("b", _Task(5, 9, False))
    src, tgt, shared = join([a, b])
    assert (src, tgt, shared) == (n + 6 + 1 + 2, n + 3 + 5, False)  # + the two task tokens
    assert a.encode_source(["4 9 3"]) == [[a.ids.task_token, 4, 9, 3]]  # specials stay
    assert b.encode_source(["4"]) == [[b.ids.task_token, 4 + 6]]
    assert {a.ids.task_token, b.ids.task_token} == {src - 2, src - 1}
    # b's target ids start where a's end; decoding maps them back
    assert b.ids.tgt(torch.tensor([4, 2, 8])).tolist() == [4 + 3, 2, 8 + 3]
    assert b.decode_target([7, 11]) == "4 8"
    # shared members share one space, source and target
    c, d = Member("c", _Task(10, 10, True)), Member("d", _Task(6, 6, True))
    assert join([c, d]) == (n + 6 + 2 + 2, n + 6 + 2 + 2, True)
    assert d.ids.src_offset == d.ids.tgt_offset == 6
    # one member: the task's own ids, no task token
    e = Member("e", _Task(10, 7, False))
    assert join([e]) == (10, 7, False) and e.encode_source(["5"]) == [[5]]


def test_members_sharing_a_vocabulary_share_its_rows_in_one_tied_space():
    """multitask.shared_vocab: a's source and b's two sides are one vocabulary (one block of rows),
    a's target its own block; one space for source and target."""
    n = len(SPECIALS)
    shared, own = _Vocab(10), _Vocab(7)
    a, b = (
        Member("a", _Task(10, 7, False), alone=False),
        Member("b", _Task(10, 10, True), alone=False),
    )
    a.task.src_vocab, a.task.tgt_vocab, b.task.src_vocab = shared, own, shared
    b.task.tgt_vocab = _Vocab(
        10
    )  # b's own copy of the shared vocabulary, as read back from its files
    a.share, b.share = {"src": 0}, {"src": 0, "tgt": 0}
    size = n + 6 + 3 + 2  # the shared block, a's target block, two task tokens
    assert join([a, b]) == (size, size, True)
    assert a.ids.src_offset == b.ids.src_offset == b.ids.tgt_offset == 0
    assert a.ids.tgt_offset == 6
    assert a.encode_source(["5 9"])[0][1:] == b.encode_source(["5 9"])[0][1:] == [5, 9]
    b.task.tgt_vocab = _Vocab(11)  # vocabulary files that disagree are named
    with pytest.raises(
        DataError, match="task 'b': its tgt vocabulary has 11 tokens, the one it shares"
    ):
        join([a, b])


def test_a_member_search_writes_only_its_own_target_ids():
    a, b = Member("a", _Task(10, 7, False)), Member("b", _Task(5, 9, False))
    _, tgt, _ = join([a, b])
    c = b.constraint(["4", "5 6"])
    assert isinstance(c, MappedConstraint)
    state = c.initial("cpu")
    allowed = c.allowed(state, torch.tensor([3, 3]))
    ours = [0, 1, 2, 3] + [i + b.ids.tgt_offset for i in range(4, 9)]
    assert (
        allowed.shape == (2, tgt)
        and allowed[:, ours].all()
        and allowed.sum().item() == 2 * len(ours)
    )
    scored = c.score(state, torch.zeros(2, tgt), torch.tensor([3, 3]))
    assert torch.isinf(scored[:, 4 : 4 + 3]).all() and (scored[:, ours] == 0).all()
    assert c.advance(state, torch.tensor([EOS, 9])) == state


def test_the_schedule_draws_members_by_size_to_the_power_one_over_t_deterministically():
    p = np.array([0.2, 0.8])
    draws = [draw(p, 7, u) for u in range(1, 5001)]
    assert draws == [draw(p, 7, u) for u in range(1, 5001)]  # a function of (seed, update)
    assert abs(Counter(draws)[1] / 5000 - 0.8) < 0.02
    assert draws != [draw(p, 8, u) for u in range(1, 5001)]


def test_members_from_presets_and_sections_and_their_errors(registry):
    cfg = load_config(
        "multitask_demo", ["tasks.parse.weight=3", "multitask.temperature=2"], registry=registry
    )
    members = build_members(cfg, registry)
    assert [(m.name, m.task.cfg.mode, m.weight) for m in members] == [
        ("translate", "translate", 1.0),
        ("parse", "parse", 3.0),
    ]
    for bad, message in [
        (
            ["tasks.parse.task.mdoe=x"],
            r"'tasks\.parse\.task\.mdoe'; did you mean 'tasks\.parse\.task\.mode'",
        ),
        (["tasks.parse.weight=0"], r"tasks\.parse\.weight=0\.0: must be a number > 0"),
        (["multitask.temperature=0"], r"multitask\.temperature=0\.0: must be a number > 0"),
        (["tasks.parse.preset=nope"], r"unknown preset 'nope'"),
        (["task.name=demo"], r"both 'task' .* and 'tasks'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config("multitask_demo", bad, registry=registry)


@pytest.mark.slow
def test_multitask_demo_trains_logs_tests_and_generates_per_member(
    registry, tiny, tmp_path, capsys
):
    cfg = _cfg(
        registry,
        tiny,
        "optim.max_updates=40",
        "run.log_interval=10",
        "run.valid_interval=20",
        "run.save_interval=20",
        "tasks.parse.weight=3",
    )
    result = train(cfg, registry, quiet=True)
    records = read_metrics(cfg.run.dir)
    trains = [r for r in records if r["kind"] == "train"]
    assert all("translate/loss" in r or "parse/loss" in r for r in trains)
    assert all("parse/nll" in r for r in trains)  # weight 3: parse trained in every 10 updates
    valid = [r for r in records if r["kind"] == "valid"][-1]
    assert {"translate/bleu", "translate/loss", "parse/f1", "parse/loss", "select", "loss"} <= set(
        valid
    )
    assert valid["select"] == pytest.approx((valid["translate/bleu"] + valid["parse/f1"]) / 2)
    assert set(result["test"]) == {"translate", "parse"} and "f1" in result["test"]["parse"]
    assert sum(result["member_updates"].values()) == 40 and result["member_updates"]["parse"] > 20
    assert json.loads((tmp_path / "run" / "result.json").read_text())["test"] == result["test"]

    src = tmp_path / "in.txt"
    src.write_text("the dog sees a cat\nevery bird likes the big house\n")
    capsys.readouterr()
    assert (
        main(["generate", str(tmp_path / "run"), "--task", "parse", "--input", str(src), "-q"]) == 0
    )
    parses = capsys.readouterr().out.splitlines()
    assert len(parses) == 2 and all(line.startswith("(") or not line for line in parses)
    lines = (tmp_path / "run" / "test.parse.hyp.txt").read_text().splitlines()
    assert len(lines) == 6
    assert main(["generate", str(tmp_path / "run"), "--input", str(src)]) == 2
    assert "choose one with --task" in capsys.readouterr().err

    assert (
        main(
            [
                "export",
                str(tmp_path / "run"),
                "--to",
                "safetensors",
                "--output",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )
    assert "multi-task run: export takes single-task runs" in capsys.readouterr().err

    capsys.readouterr()
    assert main(["plot", str(tmp_path / "run"), "--output", str(tmp_path / "plots")]) == 0
    written = {line.rpartition("/")[2] for line in capsys.readouterr().out.split()}
    assert {
        "loss.png",
        "lr.png",
        "bleu.png",
        "f1.png",
        "select.png",
    } <= written  # a curve per member


def test_a_post_norm_multi_task_run_is_warned_of_and_the_presets_are_pre_norm(
    registry, tiny, caplog, tmp_path
):
    """Post-norm encoders learned to ignore their source behind the shared task token
    (docs/multitask.md): the multi-task presets are pre-norm, and a post-norm run says so."""
    for preset in ("multitask_demo", "multi30k_en_de_fr", "ptb_sample_parsing_multi30k"):
        assert load_config(preset, registry=registry).model.pre_norm, preset
    for pre_norm, warned in ((True, False), (False, True)):
        caplog.clear()
        train(
            _cfg(
                registry,
                tiny,
                "optim.max_updates=2",
                f"model.pre_norm={pre_norm}",
                f"run.dir={tmp_path / str(pre_norm)}",
            ),
            registry,
            quiet=True,
        )
        assert (
            any("model.pre_norm=true avoids it" in r.getMessage() for r in caplog.records) == warned
        )


def test_stages_change_the_mix_at_their_updates_and_bad_stages_fail_in_one_line(registry):
    """A curriculum: members mixed by `weight` up to update 200, by `stage_weights` after (a
    back-translated corpus dropped for the last stage); the draws stay a function of (seed,
    update); stage weights that do not match the stages are named."""
    from s2s.core.training.schedule import Mix

    cfg = load_config(
        "multitask_demo",
        ["multitask.stages=[200]", "tasks.translate.stage_weights=[1]"]
        + ["tasks.parse.stage_weights=[0]"],
        registry=registry,
    )
    members = build_members(cfg, registry)
    assert [m.stage_weights for m in members] == [[1.0], [0.0]]
    for m, n in zip(members, (100, 300)):
        m.data = types.SimpleNamespace(pairs={"train": n})
    mix = Mix(members, cfg.multitask.temperature, cfg.multitask.stages)
    draws = [mix.draw(7, u) for u in range(1, 1001)]
    assert draws == [mix.draw(7, u) for u in range(1, 1001)]
    assert 0.6 < sum(draws[:200]) / 200 < 0.9  # stage 0: in proportion to size, 3/4 parse
    assert set(draws[200:]) == {0}  # stage 1: parse's weight 0
    for overrides, needle in (
        (["multitask.stages=[200]"], "tasks.translate.stage_weights=[]"),
        (["multitask.stages=[300,200]"], "multitask.stages"),
        (
            ["multitask.stages=[5]", "tasks.translate.stage_weights=[0]"]
            + ["tasks.parse.stage_weights=[0]"],
            "stage 1 (from update 5) gives every member weight 0",
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            load_config("multitask_demo", overrides, registry=registry)
    with pytest.raises(ConfigError, match=re.escape("multitask.stages=[5]: stages mix")):
        load_config("demo", ["multitask.stages=[5]"], registry=registry)
