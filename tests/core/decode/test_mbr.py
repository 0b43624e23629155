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
