"""Labelled-bracket scores exactly as EVALB computes them with the COLLINS.prm parameters.

These are the figures WSJ parsing papers report (the Transformer paper's 91.3 F1 on section 23).
Gold line i is scored against test line i:

* Reading: tokens are "(", ")" and runs of other non-space characters; "(X w)" is a
  pre-terminal, the label is whatever follows "(" up to the next space or bracket (so
  "( (S ...))" has a root with an empty label).
* Pre-terminals tagged with a DELETE_LABEL (-NONE- and the punctuation tags , : `` '' .) are
  removed with their words; positions count only the remaining words. The decision is made
  on each tree's own tags, never on the word.
* Every phrase is a bracket (label, start, end) over the remaining words; it is dropped when it
  covers none of them or when its label is TOP. Labels are cut at the first "-" or "="
  (NP-SBJ-1 -> NP) and ADVP = PRT.
* A sentence is *skipped* when the test line has no remaining words (empty line, "()",
  "(())"), an *error* when the word sequences differ (count, or a word at some position) or the
  line is not a well-formed tree (e.g. closing brackets missing), otherwise *valid*. Skipped
  and error sentences count in no total.
* Matching is on (label, start, end) as a multiset; recall, precision and F1 come from corpus
  totals over valid sentences; "length <= 40" repeats everything for sentences whose gold
  length (every token except -NONE-) is at most 40.

PYEVALB (Flyaway's Python EVALB) is used for the corpus summary (`PYEVALB.summary.summary`,
whose formulas agree with EVALB); everything it gets wrong for COLLINS.prm is done here
instead. What differs from PYEVALB (1-5 and most of 6-7 are pinned by tests/data/evalb_cases):

1. nothing is deleted: PYEVALB counts -NONE- and , : `` '' . as words, and brackets over them;
2. TOP is an ordinary bracket in PYEVALB, and labels are not cut (NP-SBJ != NP), ADVP != PRT;
3. brackets are compared as a set, so duplicated brackets (NP (NP ...)) match only once;
4. a root with an empty label, "( (S ...))", loses the whole tree in PYEVALB's reader;
5. unbalanced lines are accepted silently instead of being errors; an empty line is not a
   skipped sentence (it crashes PYEVALB, or repeats the previous sentence's result);
6. words are compared including punctuation (a "." written "!" is an error there, not here),
   and a word containing "_" is cut at the "_";
7. status codes are swapped (PYEVALB: 1 skipped, 2 error; EVALB: 1 error, 2 skipped), there is
   no "2 or less crossing" and no length <= 40 summary, and a zero denominator (no valid
   sentence, no test bracket) raises ZeroDivisionError where EVALB prints 0.

Outside what EVALB can answer (it aborts or overflows) this scorer still answers: a surplus
closing bracket, a word outside a pre-terminal, or text after the tree make the sentence an
error; there is no limit on errors, sentence length or line length. Gold and test of different
lengths raise ValueError (EVALB scores the common prefix).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

# COLLINS.prm
DELETE_LABELS = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
DELETE_LABELS_FOR_LENGTH = frozenset({"-NONE-"})
EQUIVALENT_LABELS = {"PRT": "ADVP"}  # EQ_LABEL ADVP PRT
MAX_SHORT_LENGTH = 40  # the second summary: gold length <= 40

VALID, ERROR, SKIPPED = 0, 1, 2

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_FUNCTION_TAG = re.compile(r"[-=]")


def phrase_label(label: str) -> str:
    """The label EVALB compares: cut at the first '-' or '=', PRT -> ADVP.

    A label that starts with '-' (-LRB-, -NONE-) is left whole; no case pins this down, since
    such labels only occur as POS tags, which are never cut.
    """
    m = None if label.startswith("-") else _FUNCTION_TAG.search(label)
    if m:
        label = label[: m.start()]
    return EQUIVALENT_LABELS.get(label, label)


def tag_label(tag: str) -> str:
    """POS tags are compared as written, with the same ADVP/PRT equivalence."""
    return EQUIVALENT_LABELS.get(tag, tag)


@dataclass
class Reading:
    """One line as EVALB reads it: pre-terminals (tag, word) in order and phrases over them."""

    tags: list[str] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    phrases: list[tuple[str, int, int]] = field(default_factory=list)  # label, first, end (items)
    problem: str | None = None  # why the line is not a well-formed tree

    @property
    def length(self) -> int:
        """EVALB's sentence length: every token except the DELETE_LABEL_FOR_LENGTH ones."""
        return sum(t not in DELETE_LABELS_FOR_LENGTH for t in self.tags)


def read_tree(line: str) -> Reading:
    """Read a bracketed tree leniently, noting (not raising) what makes it malformed."""
    r = Reading()
    toks = _TOKEN.findall(line)
    stack: list[list] = []  # [label, first item, phrase children?, words]
    done = False
    i = 0

    def close() -> None:
        label, first, has_phrase, words = stack.pop()
        if len(words) == 1 and not has_phrase:
            r.tags.append(label)
            r.words.append(words[0])
            return
        if words:  # a word beside other words or phrases: EVALB aborts on this
            r.problem = r.problem or "word outside a pre-terminal"
            for w in words:
                r.tags.append(label)
                r.words.append(w)
        r.phrases.append((label, first, len(r.words)))
        if stack:
            stack[-1][2] = True

    while i < len(toks):
        tok = toks[i]
        if tok == "(":
            if done:
                r.problem = r.problem or "text after the tree"
            label = ""
            if i + 1 < len(toks) and toks[i + 1] not in ("(", ")"):
                label = toks[i + 1]
                i += 1
            stack.append([label, len(r.words), False, []])
        elif tok == ")":
            if stack:
                close()
                done = not stack
            else:
                r.problem = r.problem or "unbalanced (too many close brackets)"
        else:
            if stack:
                stack[-1][3].append(tok)
            else:
                r.problem = r.problem or "word outside the tree"
        i += 1
    if stack:
        r.problem = r.problem or "Bracketing is unbalanced (too many open bracket)"
        while stack:
            close()
    return r


def brackets(r: Reading) -> tuple[list[tuple[str, int, int]], list[int]]:
    """EVALB's brackets (label, start, end) over remaining words, and the remaining item ids."""
    keep = [i for i, t in enumerate(r.tags) if t not in DELETE_LABELS]
    before = [0] * (len(r.tags) + 1)  # remaining words before item i
    for i, t in enumerate(r.tags):
        before[i + 1] = before[i] + (t not in DELETE_LABELS)
    out = []
    for label, first, end in r.phrases:
        s, e = before[first], before[end]
        label = phrase_label(label)
        if s < e and label not in DELETE_LABELS:
            out.append((label, s, e))
    return out, keep


@dataclass
class Sentence:
    """One row of EVALB's per-sentence table."""

    id: int
    length: int
    status: int
    matched: int = 0
    gold: int = 0
    test: int = 0
    crossing: int = 0
    words: int = 0
    correct_tags: int = 0
    message: str = ""

    @property
    def recall(self) -> float:
        return 100.0 * self.matched / self.gold if self.gold else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched / self.test if self.test else 0.0


def score_sentence(gold: str, test: str, id: int = 1) -> Sentence:
    g, t = read_tree(gold), read_tree(test)
    gb, gkeep = brackets(g)
    tb, tkeep = brackets(t)
    gwords = [g.words[i] for i in gkeep]
    twords = [t.words[i] for i in tkeep]
    row = Sentence(id=id, length=g.length, status=VALID)
    if not twords:
        row.status = SKIPPED
        return row
    if t.problem or g.problem:
        row.status = ERROR
        row.message = f"{id} : {t.problem or 'gold: ' + g.problem}"
    elif len(gwords) != len(twords):
        row.status = ERROR
        row.message = f"{id} : Length unmatch ({len(gwords)}|{len(twords)})"
    else:
        for a, b in zip(gwords, twords):
            if a != b:
                row.status = ERROR
                row.message = f"{id} : Words unmatch ({a}|{b})"
                break
    gold_count, test_count = Counter(gb), Counter(tb)
    row.matched = sum((gold_count & test_count).values())
    row.gold, row.test = len(gb), len(tb)
    row.crossing = sum(
        any(gs < ts < ge < te or ts < gs < te < ge for _, gs, ge in gb) for _, ts, te in tb
    )
    row.words = min(len(gwords), len(twords))
    row.correct_tags = sum(
        tag_label(g.tags[i]) == tag_label(t.tags[j]) for i, j in zip(gkeep, tkeep)
    )
    return row


SUMMARY_FIELDS = (
    "sentences",
    "error_sentences",
    "skipped_sentences",
    "valid_sentences",
    "recall",
    "precision",
    "f1",
    "complete_match",
    "average_crossing",
    "no_crossing",
    "two_or_less_crossing",
    "tagging_accuracy",
    "matched_brackets",
    "gold_brackets",
    "test_brackets",
    "crossing_brackets",
    "words",
    "correct_tags",
)


def summarise(rows: Sequence[Sentence]) -> dict:
    """EVALB's summary block for `rows` (all keys of SUMMARY_FIELDS)."""
    valid = [r for r in rows if r.status == VALID]
    totals = {
        "sentences": len(rows),
        "error_sentences": sum(r.status == ERROR for r in rows),
        "skipped_sentences": sum(r.status == SKIPPED for r in rows),
        "valid_sentences": len(valid),
        "matched_brackets": sum(r.matched for r in valid),
        "gold_brackets": sum(r.gold for r in valid),
        "test_brackets": sum(r.test for r in valid),
        "crossing_brackets": sum(r.crossing for r in valid),
        "words": sum(r.words for r in valid),
        "correct_tags": sum(r.correct_tags for r in valid),
    }
    n = len(valid)
    out = dict(totals)
    if (
        n
        and totals["gold_brackets"]
        and totals["test_brackets"]
        and totals["matched_brackets"]
        and totals["words"]
    ):
        s = _pyevalb_summary(valid)
        out.update(
            recall=s.bracket_recall,
            precision=s.bracket_prec,
            f1=s.bracker_fmeasure,
            complete_match=s.complete_match,
            average_crossing=s.average_crossing,
            no_crossing=s.no_crossing,
            tagging_accuracy=s.tagging_accuracy,
        )
    else:  # EVALB prints 0 where a denominator is 0; PYEVALB would divide by zero
        m = totals["matched_brackets"]
        r = 100.0 * m / totals["gold_brackets"] if totals["gold_brackets"] else 0.0
        p = 100.0 * m / totals["test_brackets"] if totals["test_brackets"] else 0.0
        out.update(
            recall=r,
            precision=p,
            f1=2 * p * r / (p + r) if p + r else 0.0,
            complete_match=100.0 * sum(r.matched == r.gold == r.test for r in valid) / n
            if n
            else 0.0,
            average_crossing=totals["crossing_brackets"] / n if n else 0.0,
            no_crossing=100.0 * sum(r.crossing == 0 for r in valid) / n if n else 0.0,
            tagging_accuracy=100.0 * totals["correct_tags"] / totals["words"]
            if totals["words"]
            else 0.0,
        )
    out["two_or_less_crossing"] = 100.0 * sum(r.crossing <= 2 for r in valid) / n if n else 0.0
    return {k: out[k] for k in SUMMARY_FIELDS}


def _pyevalb_summary(valid: Sequence[Sentence]):
    """PYEVALB's corpus summary over valid sentences (it agrees with EVALB there)."""
    from PYEVALB.summary import Result, summary

    results = []
    for r in valid:
        res = Result()
        res.state = 0
        res.matched_brackets, res.gold_brackets, res.test_brackets = r.matched, r.gold, r.test
        res.cross_brackets, res.words, res.correct_tags = r.crossing, r.words, r.correct_tags
        results.append(res)
    return summary(results)


@dataclass
class EvalbResult:
    """Per-sentence rows, the two summaries, and EVALB-style messages for error sentences."""

    sentences: list[Sentence]
    summary: dict
    summary_len_le_40: dict
    messages: list[str]
    all_sentences: dict = None  # all_sentences_figures(): F1 with left-out sentences counted
    gold_all: list = None  # each sentence's gold brackets, skipped ones included

    def figures(self) -> dict:
        """A flat dict: the summary, then the length <= 40 summary with a `_len_le_40` suffix."""
        short = {
            f"{k}_len_le_40": v for k, v in self.summary_len_le_40.items() if k in SHORT_FIELDS
        }
        return {**self.summary, **short}


SHORT_FIELDS = SUMMARY_FIELDS[:12]  # EVALB's second block has no bracket/word totals


def evalb(gold: Iterable[str], test: Iterable[str]) -> EvalbResult:
    """Score test trees against gold trees, one tree per string, as `evalb -p COLLINS.prm`."""
    gold, test = list(gold), list(test)
    if len(gold) != len(test):
        raise ValueError(
            f"gold has {len(gold)} trees but test has {len(test)}; EVALB pairs them line by line"
        )
    rows = [score_sentence(g, t, i) for i, (g, t) in enumerate(zip(gold, test), 1)]
    short = [r for r in rows if r.length <= MAX_SHORT_LENGTH]
    gold_all = gold_brackets_all(rows, gold)
    return EvalbResult(
        rows,
        summarise(rows),
        summarise(short),
        [r.message for r in rows if r.message],
        all_sentences_figures(rows, gold_all),
        gold_all,
    )


def sentence_statistics(result: EvalbResult, primary: str = "f1"):
    """Each sentence's bracket counts, for intervals and paired tests
    (`s2s.core.contract.resampling`): matched, gold and test brackets of a valid sentence (EVALB's
    totals: error and skipped sentences add nothing), and gold and test brackets over all sentences
    (`f1_all`'s: a skipped sentence's gold brackets count as missed, an error sentence's test
    brackets as wrong). Their sums give EVALB's recall, precision and f1 and the _all figures,
    `primary` first; a zero denominator gives 0, as EVALB prints."""
    import numpy as np

    from s2s.core import SentenceStatistics, f_measure

    rows = np.array(
        [
            [
                r.matched if r.status == VALID else 0,
                r.gold if r.status == VALID else 0,
                r.test if r.status == VALID else 0,
                gold_all,
                r.test if r.status != SKIPPED else 0,
            ]
            for r, gold_all in zip(result.sentences, result.gold_all)
        ],
        dtype=np.float64,
    ).reshape(-1, 5)

    def figures(totals: np.ndarray) -> dict:
        matched, gold, test, gold_all, test_all = totals.T
        found = {}
        for suffix, g, t in (("", gold, test), ("_all", gold_all, test_all)):
            precision, recall, f1 = f_measure(matched, g, t)
            found |= {f"f1{suffix}": f1, f"recall{suffix}": recall}
            found[f"precision{suffix}"] = precision
        return {primary: found.pop(primary), **found}

    return SentenceStatistics(rows, figures)


def all_sentences_figures(rows: Sequence[Sentence], gold_all: Sequence[int]) -> dict:
    """Labelled-bracket recall, precision and F1 over ALL sentences, not EVALB's valid ones only.

    EVALB leaves error and skipped sentences out of every total, so a parser that gets the
    words of most sentences wrong can still report a high F1 over the few left. Here such a
    sentence contributes its gold brackets as missed (and an error sentence its test brackets
    as wrong); with no error or skipped sentence the figures equal EVALB's.
    """
    matched = sum(r.matched for r in rows if r.status == VALID)
    gold_all = sum(gold_all)  # each sentence's gold brackets (`gold_brackets_all`)
    test_all = sum(r.test for r in rows if r.status != SKIPPED)
    recall = 100.0 * matched / gold_all if gold_all else 0.0
    precision = 100.0 * matched / test_all if test_all else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "f1_all": f1,
        "recall_all": recall,
        "precision_all": precision,
        "gold_brackets_all": gold_all,
    }


def gold_brackets_all(rows: Sequence[Sentence], gold: Sequence[str]) -> list[int]:
    """Each sentence's gold brackets, a skipped sentence's read from its gold tree."""
    return [
        r.gold if r.status != SKIPPED else len(brackets(read_tree(g))[0])
        for r, g in zip(rows, gold)
    ]


def evalb_files(gold_path, test_path) -> EvalbResult:
    """`evalb -p COLLINS.prm gold_path test_path`: one tree per line in each file."""
    from s2s.core import read_lines  # lines end at "\n" only

    return evalb(read_lines(gold_path), read_lines(test_path))
