"""Translation metrics: sacreBLEU, the paper's tokenised BLEU, and chrF.

`bleu` is what the field reports now: sacreBLEU's corpus BLEU on detokenised text with its
default 13a tokenisation, printed with its signature so it can be compared across papers.
`bleu_tok` is the figure comparable with the paper's 27.3 / 28.4 (EN-DE) and 38.1 / 41.8 (EN-FR):
Moses-style tokenisation of both sides (`moses.tokenize`), hyphenated compounds split into
`##AT##-##AT##`, then corpus BLEU on those tokens with no further tokenisation and no smoothing,
as `multi-bleu.perl` computes it. It usually reads higher than `bleu` on the same output.
Its signature names the Moses rules used: `tok:moses-fr+atat` for a language with rules of its
own (`moses.RULES`), `tok:moses-generic+atat` for any other.

`statistics` gives each sentence's counts behind the three (sacreBLEU's own sufficient
statistics: n-gram matches and totals, lengths), for intervals and paired tests
(`s2s.core.contract.resampling`); the figures of resampled counts are sacreBLEU's own computation.
"""

from __future__ import annotations

from typing import Sequence

from s2s.core import DataError, SentenceStatistics, joined, sacrebleu_statistics
from sacrebleu.metrics import BLEU, CHRF

from . import moses


def _check(
    hypotheses: Sequence[str], references: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    if len(hypotheses) != len(references):
        raise DataError(
            f"{len(hypotheses)} hypotheses for {len(references)} references: "
            "a partial score is no score"
        )
    if not references:
        raise DataError("no references to score against")
    return list(hypotheses), [list(references)]


def bleu(hypotheses: Sequence[str], references: Sequence[str]):
    """sacreBLEU corpus BLEU (13a, mixed case, exponential smoothing): a `BLEUScore`."""
    metric = BLEU()
    score = metric.corpus_score(*_check(hypotheses, references))
    score.signature = str(metric.get_signature())
    return score


def _moses_bleu() -> BLEU:
    """The BLEU of `bleu_tok`: on Moses tokens, no further tokenisation, no smoothing."""
    return BLEU(tokenize="none", smooth_method="none", force=True)


def _moses_lines(lines: Sequence[str], lang: str) -> list[str]:
    return [moses.split_compounds(moses.tokenize(line, lang)) for line in lines]


def bleu_tok(hypotheses: Sequence[str], references: Sequence[str], lang: str = "en"):
    """Tokenised BLEU with compound splitting, as the paper's evaluation computed it."""
    hyps, (refs,) = _check(hypotheses, references)
    metric = _moses_bleu()
    score = metric.corpus_score(_moses_lines(hyps, lang), [_moses_lines(refs, lang)])
    rules = lang if lang in moses.RULES else "generic"  # no rules of its own: the generic ones
    score.signature = str(metric.get_signature()).replace("tok:none", f"tok:moses-{rules}+atat")
    return score


def chrf(hypotheses: Sequence[str], references: Sequence[str]):
    """sacreBLEU chrF (character 6-grams, beta 2): a `CHRFScore`."""
    metric = CHRF()
    score = metric.corpus_score(*_check(hypotheses, references))
    score.signature = str(metric.get_signature())
    return score


def statistics(
    hypotheses: Sequence[str], references: Sequence[str], lang: str = "en"
) -> SentenceStatistics:
    """The per-sentence statistics of `bleu` (primary), `bleu_tok` and `chrf`."""
    hyps, (refs,) = _check(hypotheses, references)
    return joined(
        [
            sacrebleu_statistics("bleu", BLEU(), hyps, refs),
            sacrebleu_statistics(
                "bleu_tok", _moses_bleu(), _moses_lines(hyps, lang), _moses_lines(refs, lang)
            ),
            sacrebleu_statistics("chrf", CHRF(), hyps, refs),
        ]
    )
