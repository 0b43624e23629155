"""Training end to end on the demo: it learns, resumes, averages, generates, scores."""

import json
import re
import subprocess
import sys

import pytest
import torch
from s2s.core.decode.batched import Decoder
from s2s.core.errors import TrainingError
from s2s.core.setup.config import load_config
from s2s.core.runs import checkpoint
from s2s.core.training.trainer import train


def _cfg(registry, tiny, *extra):
    return load_config(
        "demo",
        tiny(
            "task.train_size=400",
            "task.valid_size=20",
            "task.test_size=20",
            "data.max_tokens=600",
            "optim.warmup=5",
            "run.valid_interval=4",
            "run.save_interval=4",
            "run.keep_last=3",
            *extra,
        ),
        registry=registry,
    )


def test_resume_continues_from_the_last_checkpoint(registry, tiny):
    cfg = _cfg(registry, tiny, "optim.max_updates=4")
    train(cfg, registry, quiet=True)
    first = checkpoint.load(checkpoint.listed(cfg.run.dir)[-1])
    cfg = _cfg(registry, tiny, "optim.max_updates=8")  # the same run directory, more updates
    result = train(cfg, registry, quiet=True)
    assert result["update"] == 8
    names = [p.name for p in checkpoint.listed(cfg.run.dir)]
    assert names == ["checkpoint_00000004.pt", "checkpoint_00000008.pt"]
    last = checkpoint.load(checkpoint.listed(cfg.run.dir)[-1])
    assert last["update"] == 8 and first["update"] == 4
    records = [json.loads(line) for line in open(f"{cfg.run.dir}/metrics.jsonl")]
    assert [r["update"] for r in records if r["kind"] == "valid"] == [4, 8]


def test_average_is_the_elementwise_mean(registry, tiny, tmp_path):
    cfg = _cfg(registry, tiny, "optim.max_updates=12", "run.average_last=3")
    result = train(cfg, registry, quiet=True)
    assert result["averaged"] == 3
    paths = checkpoint.listed(cfg.run.dir)
    states = [checkpoint.load(p)["model"] for p in paths]
    avg = checkpoint.load(tmp_path / "run" / "checkpoint_average.pt")["model"]
    for k in avg:
        expect = (states[0][k].double() + states[1][k].double() + states[2][k].double()) / 3
        assert torch.equal(avg[k], expect.to(avg[k].dtype)), k
    from s2s.core.apps.cli import main

    assert (
        main(["average", str(tmp_path / "run"), "--last", "2", "--output", str(tmp_path / "a2.pt")])
        == 0
    )
    two = checkpoint.load(tmp_path / "a2.pt")["model"]
    k = next(iter(two))
    assert torch.equal(
        two[k], ((states[1][k].double() + states[2][k].double()) / 2).to(two[k].dtype)
    )


def test_corrupted_latest_checkpoint_falls_back(registry, tiny, caplog):
    cfg = _cfg(registry, tiny, "optim.max_updates=8")
    train(cfg, registry, quiet=True)
    latest = checkpoint.listed(cfg.run.dir)[-1]
    latest.write_bytes(latest.read_bytes()[:1000])  # truncated
    state, path = checkpoint.load_latest(cfg.run.dir)
    assert state["update"] == 4 and path.name == "checkpoint_00000004.pt"
    assert "checkpoint_00000008.pt" in caplog.text


def test_unwritable_run_directory_fails_before_training(registry, tiny, tmp_path):
    (tmp_path / "file").write_text("x")
    cfg = _cfg(registry, tiny, f"run.dir={tmp_path / 'file' / 'run'}")
    with pytest.raises(TrainingError, match="not writable"):
        train(cfg, registry, quiet=True)


@pytest.mark.slow
def test_generate_and_score_from_the_command_line(registry, tiny, tmp_path):
    cfg = _cfg(registry, tiny, "optim.max_updates=4")
    train(cfg, registry, quiet=True)
    src = tmp_path / "src.txt"
    src.write_text("the cat sees a dog\nevery small bird follows the old man\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "generate",
            cfg.run.dir,
            "--input",
            str(src),
            "--beam",
            "2",
            "-q",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(out.splitlines()) == 2
    hyp = tmp_path / "hyp.txt"
    hyp.write_text(out)
    scored = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "score",
            "demo",
            "--ref",
            str(src),
            "--hyp",
            str(src),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(scored)["bleu"] == 100.0
    short = tmp_path / "short.txt"
    short.write_text("x\n")
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "score",
            "demo",
            "--ref",
            str(hyp),
            "--hyp",
            str(short),
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "short.txt has 1 lines" in bad.stderr


@pytest.mark.slow
def test_quickstart_beats_the_copy_baseline(tmp_path):
    """The quickstart as a user runs it (600 updates, the demo preset's own), on 8,000 training
    pairs: held-out BLEU far above copying the input. Not at 300 updates, where the learning
    rate has just peaked and the model is still learning the word order: there the dev BLEU of
    seeds 1 to 5 was 62.8, 78.5, 90.7, 73.1, 86.8 (24 to 84 in the issue's probes, also with a
    2e-6 change in the position table). At 600 it was 97.2, 95.0, 94.3, 93.8, 96.7 and the
    test BLEU 96.2, 96.1, 94.1, 95.8, 95.5 (issue 77: `s2s quickstart optim.max_updates=600
    task.train_size=8000 run.valid_interval=100 run.threads=1 run.seed=S`), so 80 holds with
    a margin of 13."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "quickstart",
            "-q",
            f"run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "optim.max_updates=600",
            "task.train_size=8000",
            "run.valid_interval=600",
            "run.save_interval=600",
            "run.threads=1",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    table = out.strip().splitlines()  # the table only: a heading, then a line each
    assert table[0].startswith("demo (translate) on ") and len(table) == 3, out
    trained, baseline = (
        float(re.match(rf"  {row} +bleu ([\d.]+) \(nrefs", line).group(1))
        for row, line in zip(("trained model", "copy baseline"), table[1:])
    )
    assert baseline < 5
    assert trained > 80, out


def test_batches_searched_in_parallel_equal_one_after_another(registry, tiny):
    """On a CPU with 2 threads, translate searches 2 batches at once, one thread each: the same
    lines as one batch after the other, and the thread setting is given back."""
    from s2s.core.data.idspace import join
    from s2s.core.data.members import Member, build_task, decode_settings
    from s2s.core.data.nodes import prepare_data
    from s2s.core.nn.model import Transformer

    cfg = _cfg(registry, tiny, "optim.max_updates=4")
    train(cfg, registry, quiet=True)
    task = build_task(cfg.task, registry)
    prepare_data(task, cfg.data, quiet=True)
    model = Transformer(cfg.model, *join([Member(task.name, task)]))
    model.load_state_dict(checkpoint.load(checkpoint.listed(cfg.run.dir)[-1])["model"])
    sources = [s for s, _ in task.read_split("test")]
    settings = decode_settings(task, cfg.decode)
    serial = Decoder(model, task, settings, "cpu", 3).generate(sources)
    torch.set_num_threads(2)
    parallel = Decoder(model, task, settings, "cpu", 3).generate(sources)
    assert torch.get_num_threads() == 2
    assert parallel == serial and len(serial) == 20


def _scripted_dev_figures(monkeypatch, figures):
    """Replace the selection figure of each validation, in order, by the next of `figures` (the
    records themselves stay real), so that which model is best is known in advance."""
    import s2s.core.training.trainer as train_module

    real, left = train_module.evaluate_dev, list(figures)

    def scripted(*args, **kwargs):
        record, _ = real(*args, **kwargs)
        return record, left.pop(0)

    monkeypatch.setattr(train_module, "evaluate_dev", scripted)
    return left


def test_the_best_validated_model_is_tested_when_it_beats_the_final_one(
    registry, tiny, monkeypatch, tmp_path
):
    left = _scripted_dev_figures(monkeypatch, [10.0, 30.0, 20.0])  # validations at updates 4, 8, 12
    result = train(_cfg(registry, tiny, "optim.max_updates=12"), registry, quiet=True)
    assert not left
    run = tmp_path / "run"
    assert result["checkpoint"] == "checkpoint_best.pt" and result["best_update"] == 8
    assert result["dev_select"] == {
        "checkpoints/checkpoint_00000012.pt": 20.0,
        "checkpoint_best.pt": 30.0,
    }
    assert json.loads((run / "result.json").read_text())["checkpoint"] == "checkpoint_best.pt"
    best = checkpoint.load(run / "checkpoint_best.pt")
    assert (best["update"], best["select"]) == (8, 30.0)
    at_8 = checkpoint.load(run / "checkpoints" / "checkpoint_00000008.pt")["model"]
    assert best["model"].keys() == at_8.keys() and all(
        torch.equal(best["model"][k], v) for k, v in at_8.items()
    )
    assert (
        checkpoint.tested(run)[1] == run / "checkpoint_best.pt"
    )  # what `s2s generate RUN_DIR` loads
    # the test record (the console's "test update 8: ...") names the update of the model tested
    from s2s.core.runs.metrics import read_metrics

    assert [r["update"] for r in read_metrics(run) if r["kind"] == "test"] == [8]


def test_the_average_is_tested_unless_the_best_scores_higher_and_resuming_keeps_the_best(
    registry, tiny, monkeypatch, tmp_path
):
    run = tmp_path / "run"
    # updates 4, 8, then the average of the checkpoints of 4 and 8
    left = _scripted_dev_figures(monkeypatch, [10.0, 30.0, 25.0])
    result = train(
        _cfg(registry, tiny, "optim.max_updates=8", "run.average_last=2"), registry, quiet=True
    )
    assert not left and result["checkpoint"] == "checkpoint_best.pt" and result["averaged"] == 2
    assert result["dev_select"] == {"checkpoint_average.pt": 25.0, "checkpoint_best.pt": 30.0}
    # resumed to update 12: a tie with the best keeps the earlier model; the new average wins
    left.extend([30.0, 35.0])
    result = train(
        _cfg(registry, tiny, "optim.max_updates=12", "run.average_last=2"), registry, quiet=True
    )
    assert (
        not left and result["checkpoint"] == "checkpoint_average.pt" and result["best_update"] == 8
    )
    assert result["dev_select"] == {"checkpoint_average.pt": 35.0, "checkpoint_best.pt": 30.0}
    assert checkpoint.load(run / "checkpoint_best.pt")["update"] == 8
    assert checkpoint.tested(run)[1] == run / "checkpoint_average.pt"


def test_run_valid_beam_narrows_only_the_dev_search(registry, tiny, monkeypatch):
    """run.valid_beam=1 searches dev greedily (a figure to select by, at a fraction of the cost);
    a larger run.valid_beam never widens the task's beam, and 0 keeps it."""
    import s2s.core.training.validation as validation

    beams = []

    class Recording(validation.Decoder):
        def generate(self, sources, progress=None, raw=False, postprocess=True):
            beams.append(self.settings.beam)
            return super().generate(sources, progress, raw, postprocess)

    monkeypatch.setattr(validation, "Decoder", Recording)
    for valid_beam, expected in ((1, 1), (50, 4), (0, 4)):
        beams.clear()
        result = train(
            _cfg(
                registry,
                tiny,
                "optim.max_updates=4",
                "decode.beam=4",
                f"run.valid_beam={valid_beam}",
            ),
            registry,
            quiet=True,
        )
        assert beams and set(beams) == {expected}, valid_beam
        assert result["dev_select"]  # selection ran on the validation's figure


def test_run_valid_after_skips_the_young_model_but_the_last_update_validates(registry, tiny):
    """run.valid_after=N: no validation before update N (a young model's dev search is the
    slowest and never chosen); the intervals after it, and the last update, validate as before."""

    def valid_updates(*extra):
        cfg = _cfg(registry, tiny, "run.valid_interval=2", "run.valid_after=6", *extra)
        result = train(cfg, registry, quiet=True)
        assert result["dev_select"]  # a figure to choose the tested model by
        return [
            r["update"]
            for r in map(json.loads, open(f"{cfg.run.dir}/metrics.jsonl"))
            if r["kind"] == "valid"
        ]

    assert valid_updates("optim.max_updates=3") == [
        3
    ]  # a run that ends before N still validates once
    assert valid_updates("optim.max_updates=10") == [
        3,
        6,
        8,
        10,
    ]  # resumed from update 3: 6, 8, 10 added


def test_a_budget_spent_while_validating_ends_the_run_at_that_update(registry, tiny, monkeypatch):
    """run.max_minutes runs out during a validation: that update, just validated, is the last
    one (no further update and second validation of a model one update older)."""
    import time

    import s2s.core.training.validation as validation

    class Slow(validation.Decoder):
        def generate(self, sources, progress=None, raw=False, postprocess=True):
            time.sleep(4.0)  # longer than the whole budget below
            return super().generate(sources, progress, raw, postprocess)

    monkeypatch.setattr(validation, "Decoder", Slow)
    cfg = _cfg(
        registry, tiny, "optim.max_updates=100", "run.valid_interval=2", "run.max_minutes=0.04"
    )  # 2.4 s: two tiny updates fit
    result = train(cfg, registry, quiet=True)
    valid = [
        r["update"]
        for r in map(json.loads, open(f"{cfg.run.dir}/metrics.jsonl"))
        if r["kind"] == "valid"
    ]
    assert result["update"] == 2 and valid == [2]
    assert [p.name for p in checkpoint.listed(cfg.run.dir)] == ["checkpoint_00000002.pt"]
