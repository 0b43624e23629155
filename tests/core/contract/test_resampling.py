"""Confidence intervals and paired tests (s2s.core.contract.resampling) for every built-in task:
BLEU's and chrF's intervals are sacreBLEU's own, F1's are EVALB recomputed on each resample, a
system against itself differs by 0 with p = 1, a clearly better one has p < 0.05, a seed repeats."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
from omegaconf import OmegaConf
from s2s.core.contract import resampling
from s2s.core.contract.resampling import Resampling, compare, intervals, resample_indices
from s2s.plugins.demo import DemoTask
from s2s.plugins.parsing import ParsingTask
from s2s.plugins.parsing.evalb import evalb
from s2s.plugins.translation import TranslationConfig, TranslationTask

from conftest import MULTI30K, ROOT, corpus

CASES = ROOT / "tests" / "data" / "evalb_cases"


def _translation() -> TranslationTask:
    return TranslationTask(
        OmegaConf.merge(OmegaConf.structured(TranslationConfig), {"tgt_lang": "de"})
    )


@pytest.fixture(scope="module")
def references() -> list[str]:
    path = corpus(MULTI30K / "test_2016_flickr.de")
    return path.read_text(encoding="utf-8").splitlines()[:300]


def _worse(refs: list[str], every: int, seed: int = 7) -> list[str]:
    """References with every `every`-th word dropped and one word pair swapped at random."""
    rng = random.Random(seed)
    out = []
    for r in refs:
        w = [x for j, x in enumerate(r.split()) if j % every != every - 1]
        if len(w) > 3:
            i = rng.randrange(len(w) - 1)
            w[i], w[i + 1] = w[i + 1], w[i]
        out.append(" ".join(w))
    return out


def test_bleu_and_chrf_intervals_are_sacrebleus_own(references, monkeypatch):
    from sacrebleu.metrics import BLEU, CHRF

    hyps = _worse(references, 4)
    stats = _translation().statistics(hyps, references)
    for seed, resamples in [(12345, 1000), (3, 400)]:
        found = intervals(stats, Resampling(resamples=resamples, seed=seed))
        monkeypatch.setenv("SACREBLEU_SEED", str(seed))
        for name, metric in [("bleu", BLEU()), ("chrf", CHRF())]:
            theirs = metric.corpus_score(hyps, [references], n_bootstrap=resamples)
            ours = found[name]
            assert ours.value == pytest.approx(theirs.score, abs=1e-9), name
            assert ours.mean == pytest.approx(theirs._mean, abs=1e-4), name
            assert (ours.high - ours.low) / 2 == pytest.approx(theirs._ci, abs=1e-4), name
            assert ours.low < ours.value < ours.high


def _case(name: str) -> list[str]:
    return (CASES / name).read_text(encoding="utf-8").splitlines()


def test_f1_intervals_are_evalb_recomputed_on_each_resample():
    """Each resample's F1 from summed counts equals EVALB's F1 of the resampled trees (valid
    sentences only) and f1_all over all of them, on a conformance case with error and skipped
    sentences."""
    gold, test = _case("gold.txt"), _case("test_mixed.txt")
    task = ParsingTask(OmegaConf.structured(ParsingTask.Config))
    stats = task.statistics(test, gold)
    assert stats.corpus()["f1"] == pytest.approx(task.score(test, gold).value, abs=0.005)
    indices = resample_indices(len(gold), 25, seed=11)
    drawn = stats.of(resampling.resampled_totals(stats.rows, indices))
    for r, rows in enumerate(indices):
        direct = evalb([gold[i] for i in rows], [test[i] for i in rows])
        assert drawn["f1"][r] == pytest.approx(direct.summary["f1"], abs=1e-6)
        assert drawn["recall"][r] == pytest.approx(direct.summary["recall"], abs=1e-6)
        assert drawn["f1_all"][r] == pytest.approx(direct.all_sentences["f1_all"], abs=1e-6)


def test_resampled_totals_are_the_sums_of_the_resampled_rows():
    rows = np.random.default_rng(0).integers(0, 9, size=(40, 5)).astype(float)
    indices = resample_indices(40, 30, seed=1)
    assert np.array_equal(resampling.resampled_totals(rows, indices), rows[indices].sum(1))


def _demo(mode: str) -> DemoTask:
    return DemoTask(OmegaConf.merge(OmegaConf.structured(DemoTask.Config), {"mode": mode}))


def _demo_pairs(mode: str, n: int = 120) -> tuple[list[str], list[str]]:
    task = _demo(mode)
    pairs = list(task.read_split("test"))[:n]
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.mark.parametrize("mode", ["translate", "parse"])
@pytest.mark.parametrize("test", ["ar", "bootstrap"])
def test_a_system_against_itself_and_a_clearly_better_one(mode, test):
    task = _demo(mode)
    _, refs = _demo_pairs(mode)
    good = [r if i % 5 else " ".join(r.split()[:-2]) for i, r in enumerate(refs)]
    bad = [" ".join(r.split()[::-1]) if i % 2 else r for i, r in enumerate(refs)]
    how = Resampling(test=test, resamples=500, trials=2000)
    a, b = task.statistics(bad, refs), task.statistics(good, refs)
    primary = next(iter(a.corpus()))
    same = compare(a, a, how)[primary]
    assert (same.difference, same.low, same.high, same.p) == (0.0, 0.0, 0.0, 1.0)
    better = compare(a, b, how)[primary]
    assert better.difference > 0 and better.low > 0 and better.p < 0.05
    assert better.b == pytest.approx(task.score(good, refs).value, abs=0.005)
    assert compare(a, b, how) == compare(a, b, how)  # a seed repeats
    other = compare(a, b, Resampling(test=test, resamples=500, trials=2000, seed=2))[primary]
    assert (other.low, other.high) != (better.low, better.high)


def test_the_statistics_make_every_task_s_own_figures(references):
    hyps = _worse(references, 3)
    task = _translation()
    score, whole = task.score(hyps, references), task.statistics(hyps, references).corpus()
    assert whole["bleu"] == pytest.approx(score.value, abs=0.005)
    assert whole["bleu_tok"] == pytest.approx(score.figures["bleu_tok"], abs=0.005)
    assert whole["chrf"] == pytest.approx(score.figures["chrf"], abs=0.005)
    for mode in ("translate", "parse"):
        _, refs = _demo_pairs(mode)
        hyps = [" ".join(r.split()[1:]) if i % 3 == 0 else r for i, r in enumerate(refs)]
        score = _demo(mode).score(hyps, refs)
        whole = _demo(mode).statistics(hyps, refs).corpus()
        assert whole[score.name] == pytest.approx(score.value, abs=0.005)
        for k, v in score.figures.items():
            if k in whole:
                assert whole[k] == pytest.approx(v, abs=0.005), (mode, k)


@pytest.mark.parametrize(
    "how, needle",
    [
        (Resampling(resamples=99), "--resamples 99"),
        (Resampling(resamples=100_001), "--resamples 100001"),
        (Resampling(level=0.0), "--level 0.0"),
        (Resampling(level=1.0), "--level 1.0"),
        (Resampling(test="t"), "--test t"),
    ],
)
def test_settings_out_of_range_are_named(how, needle):
    assert needle in how.problem()


def test_outputs_equal_to_the_references_have_a_point_interval(references):
    """Every resample of a perfect output is perfect: BLEU 100 with the interval [100, 100]
    (the cost is timed by bench/uncertainty.py, not here)."""
    stats = _translation().statistics(references, references)
    found = intervals(stats, Resampling(resamples=100))["bleu"]
    assert found.value == found.low == found.high == pytest.approx(100.0)


# -- the command line ------------------------------------------------------------------------
def _files(tmp_path, refs, **hyps):
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs))
    for name, lines in hyps.items():
        (tmp_path / f"{name}.txt").write_text("".join(h + "\n" for h in lines))
    return tmp_path


def test_score_ci_and_paired_through_the_command_line(tmp_path, capsys, caplog):
    from s2s.core.apps.cli import main

    _, refs = _demo_pairs("translate")
    good = [r if i % 5 else " ".join(r.split()[:-2]) for i, r in enumerate(refs)]
    bad = [" ".join(r.split()[::-1]) if i % 2 else r for i, r in enumerate(refs)]
    d = _files(tmp_path, refs, good=good, bad=bad)
    base = ["score", "demo", "--ref", str(d / "ref.txt")]
    assert main([*base, "--hyp", str(d / "bad.txt"), "--ci", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["intervals"]["bleu"]["low"] < one["bleu"] < one["intervals"]["bleu"]["high"]
    assert one["resampling"]["resamples"] == 1000 and one["resampling"]["seed"] == 12345
    assert main([*base, "--hyp", str(d / "bad.txt"), "--hyp", str(d / "good.txt"), "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    (compared,) = two["comparisons"]
    assert compared["figures"]["bleu"]["difference"] > 0 and compared["figures"]["bleu"]["p"] < 0.05
    assert [s["hyp"] for s in two["systems"]] == [str(d / "bad.txt"), str(d / "good.txt")]
    assert main([*base, "--hyp", str(d / "bad.txt"), "--hyp", str(d / "good.txt")]) == 0
    text = capsys.readouterr().out
    assert "B against A" in text and "approximate randomisation, 10000 trials" in text
    assert main([*base, "--hyp", str(d / "bad.txt"), "--hyp", str(d / "bad.txt")]) == 0
    assert "same file" in caplog.text and "1.0000" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--ci", "--resamples", "50"], "--resamples 50: from 100 to 100000"),
        (["--ci", "--resamples", "200000"], "--resamples 200000"),
        (["--ci", "--level", "1"], "--level 1.0: a confidence level between 0 and 1"),
        (["--ci", "--level", "0"], "--level 0.0"),
        (["--seed", "3"], "--seed: only with --ci or several --hyp files"),
        (["--hyp", "{short}"], "short.txt has 1 lines but"),
    ],
)
def test_bad_resampling_options_fail_in_one_line(tmp_path, capsys, extra, needle):
    from s2s.core.apps.cli import main

    _, refs = _demo_pairs("translate", 20)
    d = _files(tmp_path, refs, a=refs, short=refs[:1])
    extra = [x.format(short=d / "short.txt") for x in extra]
    code = main(["score", "demo", "--ref", str(d / "ref.txt"), "--hyp", str(d / "a.txt"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and needle in err[0], err


def test_a_task_without_statistics_says_so(tmp_path, capsys):
    from s2s.core.apps.cli import main

    plugin = tmp_path / "plain_plugin.py"
    plugin.write_text(
        "from s2s.plugins.demo import DemoTask\n"
        "from s2s.core.contract.task import Task\n"
        "class Plain(DemoTask):\n"
        "    name = 'plain'\n"
        "    statistics = Task.statistics\n"
    )
    _, refs = _demo_pairs("translate", 20)
    d = _files(tmp_path, refs, a=refs)
    argv = ["score", "plain", "--plugin", f"{plugin}", "--ref", str(d / "ref.txt")]
    assert main([*argv, "--hyp", str(d / "a.txt")]) == 0  # the score alone works
    capsys.readouterr()
    code = main([*argv, "--hyp", str(d / "a.txt"), "--ci"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "gives no per-sentence statistics" in err[0], err
    assert os.path.exists(d / "a.txt")
