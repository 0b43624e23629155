"""Minimum Bayes risk decoding: of a line's candidates, the one the others agree with most.

MBR (Kumar and Byrne 2004; Eikema and Aziz 2020; Freitag et al. 2022) picks, among a line's
candidates (the beam's n best, or n samples), the candidate h with the highest expected utility
E_y[u(h, y)], the candidates themselves standing in for draws y of the model's distribution,
each with weight 1/n (the Monte Carlo estimate of Eikema and Aziz; for n-best lists an
approximation), itself included. Two ways to compute it (`METHODS`):

* `pairwise` (the default): the expectation itself, u(h, y) for every pair, n^2 sentence
  scores a line. Each candidate's n-grams are counted once; each pair is then scored with the
  metric's own formula, which equals sacreBLEU's sentence_chrf and sentence_bleu
  (tests/core/decode/test_mbr.py).
* `aggregate`: reference aggregation (Vamvas and Sennrich 2024, "Linear-time Minimum Bayes
  Risk Decoding with Reference Aggregation"), n scores a line: the pseudo-references' n-gram
  counts are averaged into one expected reference and each candidate is scored once against
  it (the metric's form with fractional counts; for BLEU the expected reference length). This
  is an approximation of the expectation, not the expectation: chrF and BLEU are not linear in
  the reference's counts, so it can choose another candidate (docs/decoding.md measures how
  often). With one pseudo-reference both methods give the sentence score.

Utilities: `chrf` (sacreBLEU's chrF: character 1- to 6-grams, whitespace left out, beta 2),
`bleu` (sacreBLEU's sentence BLEU: 13a tokens, 1- to 4-grams, exponential smoothing), and `task`:
the task's own metric (`Task.score` of one candidate against one other, pairwise: n^2 calls a
line), in the direction its `Score.higher_is_better` declares: of an error rate (TER, a
character error rate), the candidate with the lowest expected error, the risk itself minimised.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

UTILITIES = ("chrf", "bleu", "task")
METHODS = ("pairwise", "aggregate")  # the exact expectation; reference aggregation
CHAR_ORDER, BETA, WORD_ORDER = 6, 2, 4


def expected_utilities(
    candidates: Sequence[str], utility: str, method: str = "pairwise"
) -> list[float]:
    """Each candidate's expected `utility` (0-100) against all the candidates as equally likely
    references (itself included): exactly, the mean of its sentence scores against each
    (`pairwise`), or against their averaged n-gram counts (`aggregate`, linear in their
    number)."""
    if utility not in UTILITIES[:2]:
        raise ValueError(f"utility {utility!r}: one of {', '.join(UTILITIES[:2])}")
    if method not in METHODS:
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    if not candidates:
        return []
    stats = _chrf_ngrams if utility == "chrf" else _bleu_ngrams
    score = _chrf if utility == "chrf" else _bleu
    counted = [stats(c) for c in candidates]
    if method == "aggregate":
        reference = _mean(counted)
        return [score(h, reference) for h in counted]
    references = [_mean([c]) for c in counted]
    return [sum(score(h, r) for r in references) / len(references) for h in counted]


def expected_figures(candidates: Sequence[str], score) -> tuple[list[float], bool]:
    """Each candidate's expected figure of a task's metric against all the candidates as
    equally likely references (itself included), pairwise, and whether the figure is better
    higher: `score(hypotheses, references)` is the task's checked `Score` of one candidate
    against one other. The caller ranks by it in that direction (an error rate: lowest
    first)."""
    if not candidates:
        return [], True
    figures, higher = [], set()
    for h in candidates:
        found = [score([h], [y]) for y in candidates]
        higher.update(f.higher_is_better for f in found)
        figures.append(sum(f.value for f in found) / len(found))
    return figures, higher != {False}


def _mean(counted: list) -> tuple:
    """The average of n-gram statistics: per order, each n-gram's mean count; and the mean
    length (BLEU's, unused by chrF)."""
    orders = len(counted[0][0])
    mean = [Counter() for _ in range(orders)]
    for grams, _ in counted:
        for total, order in zip(mean, grams):
            total.update(order)
    k = len(counted)
    mean = [{g: c / k for g, c in order.items()} for order in mean]
    return mean, sum(length for _, length in counted) / k


# -- chrF ---------------------------------------------------------------------------------------
def _chrf_ngrams(text: str) -> tuple:
    from sacrebleu.metrics.helpers import extract_all_char_ngrams

    return extract_all_char_ngrams(text, CHAR_ORDER, include_whitespace=False), 0


def _chrf(hyp: tuple, ref: tuple) -> float:
    """chrF as sacreBLEU computes it (precision and recall averaged over the orders that both
    sides have, then the F-beta score), with a reference's counts possibly fractional."""
    eps, factor = 1e-16, BETA**2
    precision = recall = 0.0
    effective = 0
    for h, r in zip(hyp[0], ref[0]):
        n_hyp, n_ref = sum(h.values()), sum(r.values())
        n_match = sum(min(c, r.get(g, 0.0)) for g, c in h.items())
        precision += n_match / n_hyp if n_hyp > 0 else eps
        recall += n_match / n_ref if n_ref > 0 else eps
        effective += 1 if n_hyp > 0 and n_ref > 0 else 0
    if effective == 0:
        return 0.0
    precision, recall = precision / effective, recall / effective
    if precision + recall == 0:
        return 0.0
    return 100 * (1 + factor) * precision * recall / (factor * precision + recall)


# -- BLEU ---------------------------------------------------------------------------------------
_TOKENIZER = None


def _bleu_ngrams(text: str) -> tuple:
    global _TOKENIZER
    from sacrebleu.metrics.helpers import extract_all_word_ngrams
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    if _TOKENIZER is None:
        _TOKENIZER = Tokenizer13a()
    grams, length = extract_all_word_ngrams(_TOKENIZER(text.rstrip()), 1, WORD_ORDER)
    orders = [Counter() for _ in range(WORD_ORDER)]
    for gram, count in grams.items():
        orders[len(gram) - 1][gram] = count
    return orders, length


def _bleu(hyp: tuple, ref: tuple) -> float:
    """Sentence BLEU as sacreBLEU computes it with exponential smoothing (Chen and Cherry 2014,
    method 3), with a reference's counts and length possibly fractional."""
    (h_orders, h_len), (r_orders, r_len) = hyp, ref
    if h_len == 0 or r_len == 0:
        return 0.0
    log_precision, smooth = 0.0, 1.0
    for n, (h, r) in enumerate(zip(h_orders, r_orders), 1):
        total = max(0, h_len - n + 1)
        correct = sum(min(c, r.get(g, 0.0)) for g, c in h.items())
        if total == 0:  # a hypothesis shorter than n words: the orders below n count
            return _bleu_from(log_precision, n - 1, h_len, r_len)
        if correct == 0 and n == 1:  # no word in common: sacreBLEU's 0, whatever the smoothing
            return 0.0
        if correct == 0:
            smooth *= 2
            log_precision += math.log(100.0 / (smooth * total))
        else:
            log_precision += math.log(100.0 * correct / total)
    return _bleu_from(log_precision, WORD_ORDER, h_len, r_len)


def _bleu_from(log_precision: float, orders: int, h_len: float, r_len: float) -> float:
    """The geometric mean of the precisions of the first `orders` orders (sacreBLEU's effective
    order), times the brevity penalty."""
    bp = 1.0 if h_len >= r_len else math.exp(1 - r_len / h_len)
    return bp * math.exp(log_precision / orders)
