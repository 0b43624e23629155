"""The offline demo task: data the project generates itself, so the quickstart needs no download.

mode=translate: source sentence -> reordered sentence in the target lexicon, scored with BLEU;
or, with task.metric, with TER (sacreBLEU's translation edit rate) or the character error rate,
figures that are better lower (`Score.higher_is_better`): the built-in example of a metric that
falls as the model improves.
mode=parse: source sentence -> its bracketed tree, scored with labelled-bracket F1.
Held-out sentences never occur in the training split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from s2s.core import (
    ConfigError,
    DecodeDefaults,
    Score,
    SentenceStatistics,
    Task,
    TaskConfig,
    WordTokenizer,
    f_measure,
    joined,
    one_of,
    sacrebleu_statistics,
    setting,
)
from sacrebleu.metrics import BLEU, TER

from . import grammar


#: the primary figures each mode can score with, its default first
METRICS = {"translate": ("bleu", "ter", "cer"), "parse": ("f1",)}


@dataclass
class DemoConfig(TaskConfig):
    mode: str = setting("translate", one_of("translate", "parse"))
    # the primary figure (None: the mode's own, bleu or f1); translate: bleu, or ter or cer
    # (error rates, better lower)
    metric: Optional[str] = setting(None, one_of(*dict.fromkeys(sum(METRICS.values(), ()))))
    seed: int = 1
    train_size: int = 20_000
    valid_size: int = 300
    test_size: int = 500

    @staticmethod
    def check_relations(section, where: str) -> None:
        """A metric of the mode's own."""
        allowed = METRICS[section.mode]
        if section.metric is not None and section.metric not in allowed:
            raise ConfigError(
                f"{where}.metric={section.metric}: {where}.mode={section.mode} scores with "
                f"{', '.join(allowed)}"
            )


class DemoTask(Task):
    name = "demo"
    Config = DemoConfig
    decoding = DecodeDefaults(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=10)

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.mode == "parse":
            self.decoding = DecodeDefaults(beam=4, alpha=0.6, max_len_a=3.0, max_len_b=10)
            self.terminology = False  # trees over the sentence's words
        self.metric = cfg.get("metric") or METRICS[cfg.mode][0]

    def _pair(self, tree) -> tuple[str, str]:
        target = (
            grammar.translate(tree) if self.cfg.mode == "translate" else grammar.bracketed(tree)
        )
        return " ".join(grammar.words(tree)), " ".join(target)

    def read_split(self, split):
        cfg = self.cfg
        train = grammar.corpus(cfg.seed, cfg.train_size)
        if split == "train":
            yield from map(self._pair, train)
            return
        seen = {" ".join(grammar.words(t)) for t in train}
        size = cfg.valid_size if split == "valid" else cfg.test_size
        offset = 1 if split == "valid" else 2
        kept = 0
        for tree in grammar.corpus(cfg.seed * 1000 + offset, size * 3):
            src, tgt = self._pair(tree)
            if src not in seen and kept < size:
                seen.add(src)
                kept += 1
                yield src, tgt

    def build_vocab(self, pairs):
        self.src_vocab = self.tgt_vocab = WordTokenizer.train(w for pair in pairs for w in pair)

    def score(self, hypotheses, references, sources=None) -> Score:
        if len(hypotheses) != len(references):
            raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
        if self.cfg.mode == "translate":
            metric = BLEU()
            bleu = metric.corpus_score(list(hypotheses), [list(references)])
            exact = sum(h == r for h, r in zip(hypotheses, references)) / max(1, len(references))
            figures = {"bleu": round(bleu.score, 2), "exact_match": round(100 * exact, 2)}
            signature = str(metric.get_signature())
            if self.metric == "ter":
                ter = TER()
                figures["ter"] = round(ter.corpus_score(hypotheses, [references]).score, 2)
                signature = str(ter.get_signature())
            elif self.metric == "cer":
                counts = _char_edits(hypotheses, references)
                edits, length = sum(e for e, _ in counts), sum(n for _, n in counts)
                figures["cer"] = round(100 * edits / max(1, length), 2)
                signature = "character edits / reference characters, spaces included"
            primary = figures.pop(self.metric)
            higher = self.metric == "bleu"
            return Score(self.metric, primary, figures, signature, higher_is_better=higher)
        counts = [_span_counts(hyp, ref) for hyp, ref in zip(hypotheses, references)]
        matched, gold, test, malformed = (sum(c) for c in zip(*counts)) if counts else [0] * 4
        p, r = matched / max(1, test), matched / max(1, gold)
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        return Score(
            "f1",
            round(100 * f1, 2),
            {"precision": round(100 * p, 2), "recall": round(100 * r, 2), "malformed": malformed},
            "labelled spans",
        )

    def statistics(self, hypotheses, references, sources=None) -> SentenceStatistics:
        """translate: sacreBLEU's statistics (BLEU's, and TER's with task.metric=ter), each
        sentence's character edits and reference characters (cer), and each sentence's exact
        match, the primary figure first; parse: each sentence's matched, gold and test
        spans."""
        if self.cfg.mode == "translate":
            exact = np.array([[h == r] for h, r in zip(hypotheses, references)], dtype=float)
            matches = SentenceStatistics(
                exact.reshape(-1, 1),
                lambda totals: {"exact_match": 100 * totals[:, 0] / len(exact)},
            )
            parts = [sacrebleu_statistics("bleu", BLEU(), hypotheses, references), matches]
            if self.metric == "ter":
                parts.insert(0, sacrebleu_statistics("ter", TER(), hypotheses, references))
            elif self.metric == "cer":
                counts = np.array(_char_edits(hypotheses, references), dtype=float)
                parts.insert(
                    0,
                    SentenceStatistics(
                        counts.reshape(-1, 2),
                        lambda t: {"cer": 100 * t[:, 0] / np.maximum(t[:, 1], 1)},
                    ),
                )
            return joined(parts)
        counts = np.array(
            [_span_counts(h, r)[:3] for h, r in zip(hypotheses, references)], dtype=float
        ).reshape(-1, 3)

        def figures(totals):
            precision, recall, f1 = f_measure(*totals.T)
            return {"f1": f1, "precision": precision, "recall": recall}

        return SentenceStatistics(counts, figures)


def _char_edits(hypotheses, references) -> list[tuple[int, int]]:
    """(Levenshtein distance in characters, reference characters) of each sentence: the counts
    whose sums make the character error rate (spaces are characters too)."""
    return [(_levenshtein(h, r), len(r)) for h, r in zip(hypotheses, references)]


def _levenshtein(a: str, b: str) -> int:
    """The fewest insertions, deletions and substitutions of characters that make `a` into `b`
    (Wagner and Fischer's dynamic programme, one row at a time)."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def _span_counts(hypothesis: str, reference: str) -> tuple[int, int, int, int]:
    """(matched, gold, test spans, whether the hypothesis is malformed) of one sentence."""
    g = grammar.spans(reference.split())
    found = grammar.spans(hypothesis.split())
    t = found or []
    pool = list(t)
    matched = 0
    for span in g:
        if span in pool:
            pool.remove(span)
            matched += 1
    return matched, len(g), len(t), int(found is None)
