"""Metric direction (`Score.higher_is_better`): a score says which way its primary figure is
better, records it, and whatever compares scores reads it: the selection figure of a run, a
paired test's verdict, reranker tuning, a sweep's ranking. The demo's task.metric=ter | cer is
the built-in error rate (better lower)."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from s2s.core import Score
from s2s.core.apps.sweep.results import _rank, best_lines, table
from s2s.core.contract.task import better, checked_score
from s2s.core.errors import ConfigError, PluginError
from s2s.core.inference.rerank import tune
from s2s.core.setup.config import load_config
from s2s.core.training.validation import selection
from s2s.plugins.demo import DemoConfig, DemoTask


def _demo(**settings) -> DemoTask:
    return DemoTask(OmegaConf.merge(OmegaConf.structured(DemoConfig), settings))


def _pairs(n: int = 60) -> tuple[list[str], list[str]]:
    pairs = list(_demo().read_split("test"))[:n]
    return [s for s, _ in pairs], [t for _, t in pairs]


def test_a_score_records_its_direction_and_an_old_record_reads_higher():
    ter = Score("ter", 41.5, {"bleu": 30.1}, "tok:tercom", higher_is_better=False)
    record = json.loads(json.dumps(ter.as_dict()))
    assert record["higher_is_better"] is False and next(iter(record)) == "ter"
    back = Score.from_dict(record)
    assert back == ter and back.figures == {"bleu": 30.1}
    old = Score.from_dict({"bleu": 27.3, "chrf": 55.0, "signature": "nrefs:1"})
    assert old.higher_is_better is True and old.figures == {"chrf": 55.0}
    assert "lower is better" in str(ter) and "lower is better" in ter.lines()[0]
    assert "better" not in str(old) and "better" not in old.lines()[0]
    assert ter.better(40.0, 41.5) and not ter.better(43.0, 41.5) and old.better(28.0, 27.3)
    assert better(1.0, 2.0, False) and not better(2.0, 2.0, False) and better(2.0, 1.0)


def test_a_plugin_score_whose_direction_is_not_a_bool_is_named():
    task = DemoTask.__new__(DemoTask)
    with pytest.raises(PluginError, match="higher_is_better is 'lower', not True or False"):
        checked_score(task, Score("cer", 3.0, higher_is_better="lower"))


@pytest.mark.parametrize("metric", ["ter", "cer"])
def test_the_demo_error_rates_fall_as_outputs_improve_and_their_statistics_add_up(metric):
    """An error rate is 0 for the references themselves, rises for worse outputs, is declared
    better lower, and its per-sentence statistics sum to the figures `score` gives."""
    task = _demo(metric=metric)
    _, refs = _pairs()
    worse = [" ".join(r.split()[:-1]) if i % 2 else r for i, r in enumerate(refs)]
    worst = [" ".join(r.split()[::-1]) for r in refs]
    perfect, some, many = (task.score(h, refs) for h in (refs, worse, worst))
    assert perfect.name == metric and perfect.higher_is_better is False
    assert perfect.value == 0.0 < some.value < many.value
    assert perfect.figures["bleu"] == 100.0 and "bleu" in some.figures
    corpus = task.statistics(worse, refs).corpus()
    assert list(corpus)[0] == metric
    assert corpus[metric] == pytest.approx(some.value, abs=0.01)
    assert corpus["bleu"] == pytest.approx(some.figures["bleu"], abs=0.01)
    assert _demo().score(worse, refs).higher_is_better is True  # bleu, the default


def test_the_character_error_rate_counts_character_edits_spaces_included():
    task = _demo(metric="cer")
    # "a cat" -> "a bat": 1 substitution; "dog" -> "do g": 1 insertion (a space); 8 reference characters
    score = task.score(["a bat", "do g"], ["a cat", "dog"])
    assert score.value == pytest.approx(round(100 * 2 / 8, 2))


def test_a_metric_the_mode_lacks_is_refused_in_one_line(registry):
    with pytest.raises(ConfigError, match=r"task.metric=ter: task.mode=parse scores with f1"):
        load_config("demo", ["task.mode=parse", "task.metric=ter"], registry=registry)
    with pytest.raises(ConfigError, match=r"task.metric='wer': must be one of bleu, ter, cer, f1"):
        load_config("demo", ["task.metric=wer"], registry=registry)


def test_the_selection_figure_keeps_one_direction_and_negates_the_other_when_mixed():
    bleu, f1 = Score("bleu", 30.0), Score("f1", 80.0)
    ter, cer = (
        Score("ter", 40.0, higher_is_better=False),
        Score("cer", 10.0, higher_is_better=False),
    )
    assert selection([(1.0, ter)]) == (40.0, False)
    assert selection([(1.0, ter), (1.0, cer)]) == (25.0, False)
    assert selection([(1.0, bleu), (1.0, f1)]) == (55.0, True)
    assert selection([(1.0, bleu), (1.0, ter)]) == (-5.0, True)  # (30 - 40) / 2
    assert selection([(1.0, ter), (0.0, bleu)]) == (40.0, False)  # a member without weight
    assert selection([]) == (0.0, True)


def test_rerank_tuning_lowers_an_error_rate_and_raises_a_score():
    """Two lines, two candidates each; the search prefers the wrong one on line 0, a scorer the
    right one: tuning on an error rate takes the scorer's weight (the error falls), and on the
    same figure read as higher-is-better it keeps weight 0 (the figure stays highest)."""

    class Out:
        def __init__(self, text):
            self.text = text

    candidates = [[Out("wrong"), Out("right")], [Out("right"), Out("wrong")]]
    rows = [[[0.0, -5.0], [-0.5, 0.0]], [[0.0, 0.0], [-1.0, -1.0]]]  # [f_0, f_1] a candidate

    def errors(hyps, refs):
        return 100.0 * sum(h != r for h, r in zip(hyps, refs)) / len(refs)

    refs = ["right", "right"]
    weights, figure = tune(rows, candidates, refs, errors, higher_is_better=False)
    assert figure == 0.0 and weights[0] > 0
    weights, figure = tune(rows, candidates, refs, errors, higher_is_better=True)
    assert figure == 50.0 and weights == [0.0]


def _row(name: str, dev: float | None, higher: bool, metric: str = "ter") -> dict:
    return {
        "name": name,
        "dev_name": metric,
        "dev_metric": dev,
        "dev_higher_is_better": higher,
        "settings": {"model.heads": int(name[-1])},
        "params": 1,
        "updates": 4,
        "dev_ppl": 2.0,
        "test": {metric: dev},
    }


def test_a_sweep_ranks_an_error_rate_lowest_first_and_a_score_highest_first():
    rows = [_row("h-1", 30.0, False), _row("h-2", 10.0, False), _row("h-3", 30.0, False)]
    assert _rank(rows) == {"ter": ["h-2", "h-1", "h-3"]}
    assert [r["dev_rank"] for r in rows] == [2, 1, 2]  # a tie shares its place
    rows = [
        _row("h-1", 30.0, True, "bleu"),
        _row("h-2", 10.0, True, "bleu"),
        _row("h-3", None, True),
    ]
    assert _rank(rows) == {"bleu": ["h-1", "h-2"]} and rows[2]["dev_rank"] is None
    results = {"varied": ["model.heads"], "metric": "ter", "rows": [_row("h-1", 3.0, False)]}
    results["ranking"] = _rank(results["rows"])
    assert "| dev ter (lower is better) |" in table(results).splitlines()[0]
    assert best_lines(results) == ["best on dev ter (lower is better): h-1"]


def test_a_paired_test_calls_the_lower_error_rate_better(tmp_path, capsys):
    """`s2s score demo task.metric=ter --hyp A --hyp B`: B, the better system, has the lower
    TER; the difference B - A is negative and the verdict names B, as with BLEU, where the
    difference is positive."""
    from s2s.core.apps.cli import main

    _, refs = _pairs(120)
    good = [r if i % 5 else " ".join(r.split()[:-2]) for i, r in enumerate(refs)]
    bad = [" ".join(r.split()[::-1]) if i % 2 else r for i, r in enumerate(refs)]
    for name, lines in (("ref", refs), ("good", good), ("bad", bad)):
        (tmp_path / f"{name}.txt").write_text("".join(x + "\n" for x in lines))
    files = ["--ref", tmp_path / "ref.txt", "--hyp", tmp_path / "bad.txt", "--hyp"]
    for metric, sign in (("ter", -1), ("bleu", 1)):
        argv = ["score", "demo", f"task.metric={metric}", *files, tmp_path / "good.txt"]
        assert main([*map(str, argv), "--json", "--trials", "1000"]) == 0
        (compared,) = json.loads(capsys.readouterr().out)["comparisons"]
        assert compared["better"] == "b" and compared["higher_is_better"] == (metric == "bleu")
        assert sign * compared["figures"][metric]["difference"] > 0
        assert main([*map(str, argv), "--trials", "1000"]) == 0
        out = capsys.readouterr().out
        how = "lower" if metric == "ter" else "higher"
        assert f"B is better than A on {metric} ({how} is better), p = 0.0010" in out, out
        swapped = ["score", "demo", f"task.metric={metric}", "--ref", tmp_path / "ref.txt"]
        swapped += ["--hyp", tmp_path / "good.txt", "--hyp", tmp_path / "bad.txt", "--json"]
        assert main([*map(str, swapped), "--trials", "1000"]) == 0
        (compared,) = json.loads(capsys.readouterr().out)["comparisons"]
        assert compared["better"] == "a"


def test_s2s_plot_titles_the_falling_figures_of_a_run(tmp_path):
    """`s2s plot` of a run whose selection figure is better lower titles `select` and each
    member's primary figure "(lower is better)"; a run better higher, or one written before
    the field, none."""
    from s2s.core.apps.plot import _falling, plot_run

    valid = {"kind": "valid", "update": 4, "loss": 3.9, "nll": 3.4, "ppl": 31.5, "select": 40.0}
    lower = {**valid, "select_higher_is_better": False, "ter": 40.0, "ter_low": 38.0, "bleu": 9.0}
    assert _falling([lower]) == {"select", "ter"}
    several = {**valid, "select_higher_is_better": False, "a/loss": 3.0, "a/cer": 12.0}
    several |= {"a/bleu": 5.0, "b/loss": 2.0, "b/ter": 40.0, "best": True}
    assert _falling([several]) == {"select", "cer", "ter"}
    assert _falling([{**lower, "select_higher_is_better": True}]) == set()
    assert _falling([valid]) == set() and _falling([]) == set()
    (tmp_path / "metrics.jsonl").write_text(json.dumps({**lower, "elapsed": 2.0}) + "\n")
    assert {p.name for p in plot_run(tmp_path)} >= {"ter.png", "select.png"}
