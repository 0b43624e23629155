"""MBR's utilities: with one pseudo-reference they are sacreBLEU's sentence chrF and BLEU; with
several, reference aggregation averages their counts (linear in the candidates)."""

import random

import pytest
import sacrebleu

from s2s.core.decode.mbr import expected_utilities

SENTENCES = [
    "A man in an orange hat starring at something.",
    "A man with an orange hat staring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "A dog runs on the grass.",
    "Two people sit on a bench.",
    "A girl in karate uniform breaking a stick with a front kick.",
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "A",
    "",
]


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_one_reference_is_sacrebleus_sentence_score(utility):
    metric = sacrebleu.sentence_chrf if utility == "chrf" else sacrebleu.sentence_bleu
    rng = random.Random(0)
    pairs = [(a, b) for a in SENTENCES for b in SENTENCES]
    words = " ".join(SENTENCES).split()
    for _ in range(40):
        pairs.append((" ".join(rng.choices(words, k=8)), " ".join(rng.choices(words, k=6))))
    for hyp, ref in pairs:
        from s2s.core.decode import mbr

        stats = mbr._chrf_ngrams if utility == "chrf" else mbr._bleu_ngrams
        score = mbr._chrf if utility == "chrf" else mbr._bleu
        ours = score(stats(hyp), mbr._mean([stats(ref)]))
        assert ours == pytest.approx(metric(hyp, [ref]).score, abs=1e-9), (hyp, ref)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_the_consensus_wins(utility):
    """Three near-copies and an outlier: a near-copy has the highest expected utility."""
    candidates = [SENTENCES[0], SENTENCES[1], SENTENCES[0].replace("an orange", "a red"), "Hi."]
    scores = expected_utilities(candidates, utility)
    assert len(scores) == 4 and scores.index(max(scores)) in (0, 1)
    assert scores[3] == min(scores)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_pairwise_is_the_mean_of_sacrebleus_sentence_scores(utility):
    """The default method is the expectation itself: each candidate's mean sentence score
    against every candidate (itself included), as sacreBLEU computes each."""
    metric = sacrebleu.sentence_chrf if utility == "chrf" else sacrebleu.sentence_bleu
    rng = random.Random(1)
    words = " ".join(SENTENCES).split()
    candidates = SENTENCES[:6] + [" ".join(rng.choices(words, k=7)) for _ in range(4)]
    exact = [sum(metric(h, [y]).score for y in candidates) / len(candidates) for h in candidates]
    assert expected_utilities(candidates, utility) == pytest.approx(exact, abs=1e-9)
    assert expected_utilities(candidates, utility, "pairwise") == pytest.approx(exact, abs=1e-9)


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_aggregation_approximates_the_expectation(utility):
    """Reference aggregation scores against the averaged counts: with one candidate it is the
    sentence score, with several it is not the mean of the pairwise scores."""
    one = [SENTENCES[2]]
    assert expected_utilities(one, utility, "aggregate") == expected_utilities(one, utility)
    candidates = SENTENCES[:7]
    exact = expected_utilities(candidates, utility, "pairwise")
    aggregated = expected_utilities(candidates, utility, "aggregate")
    assert max(abs(a - b) for a, b in zip(exact, aggregated)) > 0.5


def test_a_bad_utility_or_method_is_named():
    from s2s.core.decode.search import Wanted

    assert Wanted(2, mbr="ter").problem(4).startswith("mbr 'ter'")
    assert Wanted(2, mbr="chrf", mbr_method="exact").problem(4).startswith("mbr-method 'exact'")
    assert Wanted(2, mbr="chrf", mbr_method="aggregate").problem(4) is None
    with pytest.raises(ValueError, match="method"):
        expected_utilities(["a"], "chrf", "exact")


@pytest.mark.parametrize("metric", ["ter", "bleu"])
def test_the_tasks_own_metric_is_a_utility_in_its_direction(metric):
    """MBR over a task's metric (`mbr="task"`): each candidate's mean figure against all of them,
    pairwise, with the figure's direction; of TER (better lower) the outlier has the highest
    expected error, of BLEU the lowest expected score."""
    from omegaconf import OmegaConf
    from s2s.core.decode.mbr import expected_figures
    from s2s.plugins.demo import DemoConfig, DemoTask

    task = DemoTask(OmegaConf.merge(OmegaConf.structured(DemoConfig), {"metric": metric}))
    near = [SENTENCES[0], SENTENCES[1], SENTENCES[0].replace("an orange", "a red")]
    candidates = [*near, SENTENCES[5]]  # an outlier of about their length (TER divides by it)
    figures, higher = expected_figures(candidates, task.score)
    assert higher is (metric == "bleu") and len(figures) == 4
    one = [task.score([candidates[3]], [y]).value for y in candidates]
    assert figures[3] == pytest.approx(sum(one) / 4)
    worst = max(figures) if metric == "ter" else min(figures)
    assert figures[3] == worst and figures.index(worst) == 3
    assert expected_figures([], task.score) == ([], True)
