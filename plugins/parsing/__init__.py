"""Constituency parsing as translation (section 6.3 of "Attention Is All You Need").

source: the words of a sentence, space-separated ("The dog barks .")
target: its tree linearised depth first ("(S (NP XX XX )NP (VP XX )VP XX )S"), see linearise.py
output: a tree over exactly the source words, rebuilt (and repaired if need be) by postprocess
metric: labelled-bracket F1 exactly as EVALB computes it with COLLINS.prm, see evalb.py

Trees come from s2s.data_recipes.treebank: the user's WSJ (LDC99T42; 02-21 / 22 / 23), the NLTK
10% sample with a fixed split by file, or one-tree-per-line files; the semi-supervised setting
adds silver trees to the training split.

Repairs: `postprocess` counts the hypotheses it had to repair; `score` reports that count as
`repaired` and starts it again from zero, so it covers the hypotheses post-processed since the
previous `score` call. Given `sources`, `score` also accepts linearised hypotheses or references
(the targets of `read_split`, which is what the trainer passes) and rebuilds them itself, counting
the repairs of hypotheses; the signature then says the references were rebuilt (their POS tags
are placeholders, so tagging accuracy says nothing). Without `sources` every line is a tree.
"""
from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from s2s.core.task import DataError, DecodeDefaults, Score, Task, TaskConfig
from s2s.core.vocab import SPECIALS, WordTokenizer

from .evalb import evalb
from .linearise import SCHEMES, delinearise, linearise

__all__ = ["ParsingTask", "ParsingConfig"]

log = logging.getLogger(__name__)

CORPORA = ("wsj", "nltk_sample", "lines")
_WORD = re.compile(r"[^\s()]")
_GLUED_CLOSER = re.compile(r"\)[^\s()]")  # ")NP": a closing token of a linearised tree
_WORD_CLOSER = re.compile(r"[^\s()]\)")  # "The)": the end of a pre-terminal


@dataclass
class ParsingConfig(TaskConfig):
    corpus: str = "wsj"  # wsj | nltk_sample | lines
    # wsj: the LDC99T42 copy (holding parsed/mrg/wsj/00 .. 24) and the sections of each split
    wsj_root: str = ""
    wsj_train: str = "02-21"
    wsj_valid: str = "22"
    wsj_test: str = "23"
    # nltk_sample: the nltk_data directory holding corpora/treebank.zip ("" = the user's
    # nltk_data, where nltk.download("treebank") fetches it once when absent)
    nltk_data: str = ""
    # lines: one bracketed tree per line
    train_file: str = ""
    valid_file: str = ""
    test_file: str = ""
    # semi-supervised: extra training trees, one per line (same form as the gold trees)
    silver_trees: str = ""
    # preprocessing (data_recipes.treebank.Preprocessing)
    remove_empty: bool = True  # drop -NONE- elements and the phrases left empty
    strip_functions: bool = True  # NP-SBJ-1 -> NP
    root_label: str = "TOP"  # root bracket of every tree (EVALB ignores TOP); "" = none
    skip_malformed: bool = False  # skip (and count) malformed trees instead of failing
    # linearisation: vinyals (POS tags -> XX) | tags (POS tags kept as tokens)
    scheme: str = "vinyals"
    # vocabulary caps, specials included (0 = no cap): 16k WSJ only, 32k semi-supervised
    src_vocab_size: int = 16_000
    tgt_vocab_size: int = 0


class ParsingTask(Task):
    name = "parsing"
    Config = ParsingConfig
    decoding = DecodeDefaults(beam=21, alpha=0.3, max_len_a=1.0, max_len_b=300)

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.corpus not in CORPORA:
            raise ValueError(f"task.corpus must be one of {', '.join(CORPORA)}, got {cfg.corpus!r}")
        if cfg.scheme not in SCHEMES:
            raise ValueError(f"task.scheme must be one of {', '.join(SCHEMES)}, got {cfg.scheme!r}")
        self.src_vocab = WordTokenizer()
        self.tgt_vocab = WordTokenizer()
        self.repaired = 0  # hypotheses repaired by postprocess since the last score()
        self.read_stats: dict = {}  # split -> data_recipes.treebank.ReadStats of the last read

    # -- data ---------------------------------------------------------------------------------
    def trees(self, split: str) -> Iterator:
        """The preprocessed nltk.Trees of `split` (train includes the silver trees)."""
        from s2s.data_recipes import treebank

        if split not in self.splits:
            raise DataError(f"unknown split {split!r}; the parsing task has {', '.join(self.splits)}")
        cfg = self.cfg
        silver = cfg.silver_trees if split == "train" else ""  # a preset's ??? fails here, early
        prep = treebank.Preprocessing(cfg.remove_empty, cfg.strip_functions, cfg.root_label)
        stats = self.read_stats[split] = treebank.ReadStats()
        kw = dict(prep=prep, skip_malformed=cfg.skip_malformed, stats=stats)
        if cfg.corpus == "wsj":
            sections = {"train": cfg.wsj_train, "valid": cfg.wsj_valid, "test": cfg.wsj_test}[split]
            yield from treebank.wsj_trees(cfg.wsj_root, sections, **kw)
        elif cfg.corpus == "nltk_sample":
            yield from treebank.sample_trees(cfg.nltk_data or None, split, **kw)
        else:
            path = {"train": cfg.train_file, "valid": cfg.valid_file, "test": cfg.test_file}[split]
            if not path:
                raise DataError(f"task.{split}_file is not set (corpus=lines reads one tree per line)")
            yield from treebank.line_trees(path, **kw)
        if silver:
            yield from treebank.line_trees(silver, **kw)
        if stats.malformed or stats.empty:
            log.warning("%s split: skipped %d malformed tree(s) and %d tree(s) left empty; first: %s",
                        split, stats.malformed, stats.empty, "; ".join(stats.messages[:3]))

    def read_split(self, split: str) -> Iterator[tuple[str, str]]:
        for tree in self.trees(split):
            yield " ".join(tree.leaves()), " ".join(linearise(tree, self.cfg.scheme, self.cfg.root_label))

    def references(self, split: str) -> Iterator[str]:
        """The gold trees of `split`, one line each, in the form `s2s score --ref` reads."""
        from s2s.data_recipes.treebank import to_string

        return map(to_string, self.trees(split))

    # -- vocabulary ---------------------------------------------------------------------------
    def build_vocab(self, pairs) -> None:
        src, tgt = Counter(), Counter()
        for s, t in pairs:
            src.update(s.split())
            tgt.update(t.split())
        self.src_vocab = _ranked(src, self.cfg.src_vocab_size)
        self.tgt_vocab = _ranked(tgt, self.cfg.tgt_vocab_size)

    def save_vocab(self, directory: Path) -> None:
        self.src_vocab.save(Path(directory) / "src_vocab.json")
        self.tgt_vocab.save(Path(directory) / "tgt_vocab.json")

    def load_vocab(self, directory: Path) -> None:
        self.src_vocab = WordTokenizer.load(Path(directory) / "src_vocab.json")
        self.tgt_vocab = WordTokenizer.load(Path(directory) / "tgt_vocab.json")

    def tokenizers(self):
        return self.src_vocab.to_tokenizers(), self.tgt_vocab.to_tokenizers()

    @property
    def src_vocab_size(self) -> int:
        return len(self.src_vocab)

    @property
    def tgt_vocab_size(self) -> int:
        return len(self.tgt_vocab)

    # -- ids <-> text -------------------------------------------------------------------------
    def encode_source(self, lines: Sequence[str]) -> list[list[int]]:
        return self.src_vocab.encode(lines)

    def encode_target(self, lines: Sequence[str]) -> list[list[int]]:
        return self.tgt_vocab.encode(lines)

    def decode_target(self, ids: Sequence[int]) -> str:
        return self.tgt_vocab.decode(ids)

    def postprocess(self, hypothesis: str, source: str) -> str:
        """The tree (one line) over the words of `source` that `hypothesis` describes."""
        tree, repaired = delinearise(hypothesis, source, self.cfg.scheme, self.cfg.root_label)
        self.repaired += repaired
        return tree

    # -- evaluation ---------------------------------------------------------------------------
    def score(self, hypotheses: Sequence[str], references: Sequence[str],
              sources: Sequence[str] | None = None) -> Score:
        """EVALB (COLLINS.prm) F1 of hypothesis trees against reference trees, line by line.

        Needs no vocabulary. Figures: every EVALB summary figure, the same with a
        `_len_le_40` suffix for gold length <= 40, and `repaired`.
        """
        hypotheses, references = list(hypotheses), list(references)
        if len(hypotheses) != len(references):
            raise DataError(f"{len(hypotheses)} test trees for {len(references)} gold trees: "
                            "EVALB pairs them line by line, the counts must agree")
        if sources is not None and len(sources) != len(references):
            raise DataError(f"{len(sources)} sources for {len(references)} gold trees")
        rebuilt_refs = False
        hyps, refs = hypotheses, references
        if sources is not None:  # lines that are token sequences, not trees, are rebuilt first
            hyps, refs = [], []
            for h, r, src in zip(hypotheses, references, sources):
                if _is_linearised(h):
                    h = self.postprocess(h, src)
                if _is_linearised(r):
                    r = delinearise(r, src, self.cfg.scheme, self.cfg.root_label)[0]
                    rebuilt_refs = True
                hyps.append(h)
                refs.append(r)
        result = evalb(refs, hyps)
        figures = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.figures().items()}
        f1 = figures.pop("f1")
        figures["repaired"] = self.repaired
        self.repaired = 0
        s = result.summary
        signature = (f"evalb COLLINS.prm (s2s) | sentences {s['sentences']} | errors {s['error_sentences']}"
                     f" | skipped {s['skipped_sentences']} | repaired {figures['repaired']}")
        if rebuilt_refs:
            signature += " | references rebuilt from linearised targets (POS tags not gold)"
        return Score("f1", f1, figures, signature)


def _ranked(counts: Counter, max_size: int) -> WordTokenizer:
    """Most frequent tokens first (ties alphabetical), at most max_size ids with the specials."""
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    if max_size:
        ranked = ranked[: max(0, max_size - len(SPECIALS))]
    return WordTokenizer(ranked)


def _is_linearised(line: str) -> bool:
    """True for a token sequence of linearise.py, False for a bracketed tree.

    A bracketed tree has a word glued to a closing bracket, "(DT The)", and never a closing
    bracket glued to a label, ")NP"; lines without any word ("", "()") count as trees.
    """
    text = line.strip()
    if not _WORD.search(text):
        return False
    return bool(_GLUED_CLOSER.search(text)) or not _WORD_CLOSER.search(text)
