"""A run whose primary metric is an error rate (the demo with task.metric=ter: better lower)
keeps the checkpoint with the LOWEST dev error, tests it, stops early on it (run.patience),
and says so in its log; the same figures read as BLEU keep the highest."""

import json
from pathlib import Path

import pytest
import torch
from s2s.core.runs import checkpoint
from s2s.core.setup.config import load_config
from s2s.core.training.runlog import shown
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
            "run.keep_last=5",
            *extra,
        ),
        registry=registry,
    )


def _scripted(monkeypatch, figures):
    """Each validation's selection figure, in order, replaced by the next of `figures` (in the
    record too; the rest of the record, its direction included, is the task's own)."""
    import s2s.core.training.trainer as train_module

    real, left = train_module.evaluate_dev, list(figures)

    def scripted(*args, **kwargs):
        record, _ = real(*args, **kwargs)
        record["select"] = left.pop(0)
        return record, record["select"]

    monkeypatch.setattr(train_module, "evaluate_dev", scripted)
    return left


def _valid(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "valid"]


@pytest.mark.parametrize("metric, best", [("ter", 8), ("bleu", 4)])
def test_the_best_checkpoint_is_the_lowest_error_or_the_highest_score(
    registry, tiny, monkeypatch, tmp_path, metric, best
):
    """Validations at updates 4, 8, 12, 16 with figures 30, 10, 20, 25: an error rate keeps
    update 8's model (the lowest) and tests it; BLEU keeps update 4's (the highest)."""
    figures = [30.0, 10.0, 20.0, 25.0]
    left = _scripted(monkeypatch, figures)
    cfg = _cfg(registry, tiny, "optim.max_updates=16", f"task.metric={metric}")
    result = train(cfg, registry, quiet=True)
    run = tmp_path / "run"
    assert not left
    lower = metric == "ter"
    assert result["checkpoint"] == "checkpoint_best.pt" and result["best_update"] == best
    assert result["select_higher_is_better"] is not lower
    assert result["dev_select"] == {
        "checkpoints/checkpoint_00000016.pt": 25.0,
        "checkpoint_best.pt": figures[best // 4 - 1],
    }
    assert next(iter(result["test"])) == metric
    assert result["test"]["higher_is_better"] is not lower
    kept = checkpoint.load(run / "checkpoint_best.pt")
    assert (kept["update"], kept["select"], kept["higher_is_better"]) == (
        best,
        figures[best // 4 - 1],
        not lower,
    )
    at_best = checkpoint.load(run / "checkpoints" / f"checkpoint_{best:08d}.pt")["model"]
    assert all(torch.equal(kept["model"][k], v) for k, v in at_best.items())
    assert checkpoint.tested(run)[1] == run / "checkpoint_best.pt"
    valid = _valid(run)
    assert [r["best"] for r in valid] == (
        [True, True, False, False] if lower else [True] + [False] * 3
    )
    assert all(r["select_higher_is_better"] is not lower for r in valid)
    line = shown(valid[1])
    assert line.startswith("valid update 8: select 10 (lower is better; best) | ter ") == lower, (
        line
    )


def test_patience_stops_an_error_rate_run_that_stopped_falling_and_a_rerun_trains_no_more(
    registry, tiny, monkeypatch, tmp_path, caplog
):
    """run.patience=2: after the lowest error at update 8, updates 12 and 16 (higher) stop the
    run at 16 of 40; the best model is tested. The same command again
    resumes at 16 and, out of patience, trains no further update."""
    left = _scripted(monkeypatch, [30.0, 10.0, 20.0, 15.0])
    cfg = _cfg(registry, tiny, "optim.max_updates=40", "task.metric=ter", "run.patience=2")
    with caplog.at_level("INFO", logger="s2s"):
        result = train(cfg, registry, quiet=True)
    assert not left
    assert result["update"] == 16 and result["best_update"] == 8
    assert result["checkpoint"] == "checkpoint_best.pt"
    assert (
        "run.patience=2: 2 validations without a better dev figure than update 8's" in caplog.text
    )
    run = tmp_path / "run"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"kind": "stopped", "update": 16, "reason": "patience"}.items() <= records[-2].items()
    assert [r["update"] for r in _valid(run)] == [4, 8, 12, 16]
    assert checkpoint.listed(run)[-1].name == "checkpoint_00000016.pt"
    left.append(12.0)  # the resumed run re-scores the model as trained at update 16
    result = train(cfg, registry, quiet=True)
    assert not left and result["update"] == 16 and result["best_update"] == 8
    assert checkpoint.listed(run)[-1].name == "checkpoint_00000016.pt"


def test_a_falling_error_rate_never_runs_out_of_patience_and_mbr_minimises_it(
    registry, tiny, monkeypatch, tmp_path
):
    """Each validation's error lower than the last: run.patience=1 never stops the run. MBR
    over the task's metric (`mbr="task"`) then ranks a line's candidates by their expected TER
    against each other, the lowest first."""
    left = _scripted(monkeypatch, [40.0, 30.0, 20.0])
    cfg = _cfg(registry, tiny, "optim.max_updates=12", "task.metric=ter", "run.patience=1")
    result = train(cfg, registry, quiet=True)
    assert not left and result["update"] == 12
    assert result["checkpoint"] == "checkpoints/checkpoint_00000012.pt"
    assert result["dev_select"] == {"checkpoints/checkpoint_00000012.pt": 20.0}

    from s2s.core.decode.mbr import expected_figures
    from s2s.core.decode.sampling import Sampling
    from s2s.core.inference import load_run

    run = load_run(tmp_path / "run", ["run.device=cpu"])
    lines = [source for source, _ in run.task.read_split("test")][:3]
    drawn = Sampling(seed=3)
    ranked = run.outputs(lines, n=6, sampling=drawn, mbr="task")
    spread = False
    for outs in ranked:
        texts = [o.text for o in outs]
        figures, higher = expected_figures(texts, run.task.score)
        assert higher is False
        assert [o.utility for o in outs] == figures == sorted(figures)
        spread |= figures[0] < figures[-1]
    assert spread  # the ranking was put to the test: candidates of different expected TER


def test_a_best_figure_of_another_direction_is_not_compared(registry, tiny, monkeypatch, caplog):
    """A checkpoint whose best figure has no direction (written before `higher_is_better`: it
    reads better higher) resumed by a run whose figure is better lower: the old best does not
    compare, the next validated model is the best, and the log says why."""
    left = _scripted(monkeypatch, [30.0, 10.0])
    cfg = _cfg(registry, tiny, "optim.max_updates=8", "task.metric=ter")
    train(cfg, registry, quiet=True)
    for path in checkpoint.listed(cfg.run.dir):  # as an older s2s wrote them
        state = checkpoint.load(path)
        state["best"] = {"update": 4, "select": 5.0}  # lower than any figure to come
        checkpoint.atomic_save(state, path)
    left.extend([20.0])
    cfg = _cfg(registry, tiny, "optim.max_updates=12", "task.metric=ter")
    with caplog.at_level("WARNING", logger="s2s"):
        result = train(cfg, registry, quiet=True)
    assert not left and result["update"] == 12
    assert "the best dev figure so far (update 4) was better higher" in caplog.text
    kept = checkpoint.load(Path(cfg.run.dir) / checkpoint.BEST)
    assert (kept["update"], kept["select"], kept["higher_is_better"]) == (12, 20.0, False)
