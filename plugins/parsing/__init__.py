"""Constituency parsing as translation (section 6.3 of "Attention Is All You Need").

source: the words of a sentence, space-separated ("The dog barks ."); `s2s generate` takes raw
        sentences and splits them into Penn Treebank tokens first (`prepare_source`, `tokenize`)
target: its tree linearised depth first ("(S (NP XX XX )NP (VP XX )VP XX )S"), see linearise.py
output: a tree over exactly the source words, rebuilt (and repaired if need be) by postprocess
metric: labelled-bracket F1 exactly as EVALB computes it with COLLINS.prm, see evalb.py, and
        f1_all, the same over all sentences (error and skipped ones count as missed)
search: with `constrained`, only well-formed trees over the source words (constraint.py)

Trees come from s2s.data_recipes.treebank: the user's WSJ (LDC99T42; 02-21 / 22 / 23), the NLTK
10% sample with a fixed split by file, or one-tree-per-line files; the semi-supervised setting
adds silver trees to the training split.

Repairs: `postprocess` is a pure function (decoding calls it from several threads). Given
`sources`, `score` accepts decoded hypotheses (what validation and test pass it: token sequences,
before post-processing) and linearised references (the targets of `read_split`), rebuilds them
itself (`rebuild`) and reports how many hypotheses it had to repair as `repaired`; the signature
then says the references were rebuilt (their POS tags are placeholders, so tagging accuracy says
nothing). Without `sources` every line is a tree and `score` is exactly EVALB.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from s2s.core import (
    SPECIALS,
    DataError,
    DecodeDefaults,
    Score,
    Shareable,
    Subwords,
    Task,
    TaskConfig,
    WordTokenizer,
    at_least,
    atomic_write_text,
    one_of,
    setting,
)

from .constraint import TokenTables, TreeConstraint, leaf_tags
from .evalb import evalb
from .linearise import (
    PUNCTUATION_TAGS,
    SCHEMES,
    TAG_SCHEMES,
    WORD_SCHEMES,
    delinearise,
    linearise,
    punctuation_tags,
)

__all__ = ["ParsingTask", "ParsingConfig", "ptb_tokens"]

log = logging.getLogger(__name__)

CORPORA = ("wsj", "nltk_sample", "lines")
_WORD = re.compile(r"[^\s()]")
_GLUED_CLOSER = re.compile(r"\)[^\s()]")  # ")NP": a closing token of a linearised tree
_WORD_CLOSER = re.compile(r"[^\s()]\)")  # "The)": the end of a pre-terminal


@dataclass
class ParsingConfig(TaskConfig):
    corpus: str = setting("wsj", one_of(*CORPORA))
    # wsj: the LDC99T42 copy (holding parsed/mrg/wsj/00 .. 24) and the sections of each split
    wsj_root: str = setting("", path=True)  # a leading ~ is expanded, as in every path setting
    wsj_train: str = "02-21"
    wsj_valid: str = "22"
    wsj_test: str = "23"
    # nltk_sample: the nltk_data directory holding corpora/treebank.zip ("" = the user's
    # nltk_data, where nltk.download("treebank") fetches it once when absent)
    nltk_data: str = ""
    # lines: one bracketed tree per line
    train_file: str = setting("", path=True)
    valid_file: str = setting("", path=True)
    test_file: str = setting("", path=True)
    # semi-supervised: extra training trees, one per line (same form as the gold trees)
    silver_trees: str = setting("", path=True)
    # preprocessing (data_recipes.treebank.Preprocessing)
    remove_empty: bool = True  # drop -NONE- elements and the phrases left empty
    strip_functions: bool = True  # NP-SBJ-1 -> NP
    root_label: str = "TOP"  # root bracket of every tree (EVALB ignores TOP); "" = none
    skip_malformed: bool = False  # skip (and count) malformed trees instead of failing
    # linearisation (linearise.py): vinyals (POS tags -> XX) | tags (POS tags as tokens) |
    # words (the words at the leaves) | tags_words (tag then word at each leaf)
    scheme: str = setting("vinyals", one_of(*SCHEMES))
    # search only well-formed trees over the source words (constraint.py); false: the paper's
    # unconstrained search, whose outputs postprocess repairs
    constrained: bool = False
    # corpus=lines: a folder holding train.trees, valid.trees and test.trees (one bracketed tree
    # a line), read where train_file / valid_file / test_file are left empty
    data_dir: str = ""
    # s2s generate / serve: split each input sentence into Penn Treebank tokens (nltk's
    # TreebankWordTokenizer: "quarter." -> "quarter .", "10%" -> "10 %", "don't" -> "do n't",
    # "(" -> "-LRB-"); false: the input is tokenised already, tokens separated by spaces.
    # How input is read, not what the weights mean: a run may be decoded with either.
    tokenize: bool = field(default=True, metadata={"input": True})
    # vocabulary caps, specials included (0 = no cap): 16k WSJ only, 32k semi-supervised
    src_vocab_size: int = 16_000
    tgt_vocab_size: int = 0
    # source words seen fewer times in the training trees are <unk> there, so that <unk> is
    # trained for the unseen words of new sentences (1 = every word keeps its own id)
    src_min_count: int = setting(2, at_least(1))
    # the source vocabulary: words, or the translation plugin's byte-level subwords (bpe |
    # wordpiece, src_vocab_size of them), which a multi-task run shares with translation's English
    # (multitask.shared_vocab). Targets, the word schemes and the constraint stay word-level:
    # they place each source word by its string, whatever the source's ids
    src_tokenizer: str = setting("word", one_of("word", "bpe", "wordpiece"))


class ParsingTask(Task):
    name = "parsing"
    Config = ParsingConfig
    decoding = DecodeDefaults(beam=21, alpha=0.3, max_len_a=1.0, max_len_b=300)
    terminology = False  # outputs are trees over the sentence's words

    def __init__(self, cfg):
        super().__init__(cfg)
        self.tags: list[str] = []  # leaf tags of the tag schemes (tgt_tags.json)
        self.punct_tagged: list[
            str
        ] = []  # words the training trees tag as punctuation, punctuation_tags not
        self._tables = None  # the constraint's TokenTables for the current target vocabulary
        self.read_stats: dict = {}  # split -> data_recipes.treebank.ReadStats of the last read

    # -- data ---------------------------------------------------------------------------------
    def trees(self, split: str) -> Iterator:
        """The preprocessed nltk.Trees of `split` (train includes the silver trees)."""
        from s2s.data_recipes import treebank

        if split not in self.splits:
            raise DataError(
                f"unknown split {split!r}; the parsing task has {', '.join(self.splits)}"
            )
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
            if not path and cfg.data_dir:
                path = str(Path(cfg.data_dir) / f"{split}.trees")
            if not path:
                raise DataError(
                    f"neither task.data_dir nor task.{split}_file is set (corpus=lines reads "
                    "one tree per line from DATA_DIR/{train,valid,test}.trees)"
                )
            yield from treebank.line_trees(path, **kw)
        if silver:
            yield from treebank.line_trees(silver, **kw)
        if stats.malformed or stats.empty:
            log.warning(
                "%s split: skipped %d malformed tree(s) and %d tree(s) left empty; first: %s",
                split,
                stats.malformed,
                stats.empty,
                "; ".join(stats.messages[:3]),
            )

    def read_split(self, split: str) -> Iterator[tuple[str, str]]:
        from s2s.data_recipes import treebank

        for tree in self.trees(split):
            yield (
                " ".join(treebank.leaves(tree)),
                " ".join(linearise(tree, self.cfg.scheme, self.cfg.root_label)),
            )

    def references(self, split: str) -> Iterator[str]:
        """The gold trees of `split`, one line each, in the form `s2s score --ref` reads."""
        from s2s.data_recipes.treebank import to_string

        return map(to_string, self.trees(split))

    # -- vocabulary ---------------------------------------------------------------------------
    def build_vocab(self, pairs) -> None:
        """Source words (those seen `src_min_count` times or more) and target tokens, most
        frequent first. Where targets carry the words, the cap `tgt_vocab_size` drops rare
        words only (to <unk>), never a label or a tag."""
        src, tgt, tags, punct_tagged = Counter(), Counter(), Counter(), set()
        punctuation = set(PUNCTUATION_TAGS.values())
        sentences = []  # what a subword source vocabulary learns from
        for s, t in pairs:
            if self.cfg.src_tokenizer != "word" and "src" not in self.joint:
                sentences.append(s)
            words = s.split()
            src.update(words)
            tgt.update(t.split())
            if self.cfg.scheme in TAG_SCHEMES:
                leaves = leaf_tags(t, self.cfg.scheme)
                tags.update(leaves)
                punct_tagged.update(
                    w
                    for w, rule, tag in zip(words, punctuation_tags(words), leaves)
                    if rule is None and tag in punctuation
                )
        if "src" in self.joint:  # shared with other members of the run (`shareable`)
            self.src_vocab = self.joint["src"]
        elif self.cfg.src_tokenizer != "word":
            self.src_vocab = self.shareable("src").train([sentences], self.cfg.src_vocab_size)
        else:
            self.src_vocab = _ranked(
                Counter({w: c for w, c in src.items() if c >= self.cfg.src_min_count}),
                self.cfg.src_vocab_size,
            )
        if self.cfg.scheme in WORD_SCHEMES:
            structure = [t for t in tgt if t[0] in "()" or t in tags]
            words = Counter({t: c for t, c in tgt.items() if t[0] not in "()" and t not in tags})
            cap = (
                max(len(structure) + len(SPECIALS), self.cfg.tgt_vocab_size)
                if self.cfg.tgt_vocab_size
                else 0
            )
            self.tgt_vocab = WordTokenizer(
                _ranked(Counter({t: tgt[t] for t in structure}), 0).itos[len(SPECIALS) :]
                + _ranked(words, cap - len(structure) if cap else 0).itos[len(SPECIALS) :]
            )
        else:
            self.tgt_vocab = _ranked(tgt, self.cfg.tgt_vocab_size)
        self.tags, self.punct_tagged = sorted(tags), sorted(punct_tagged)
        self._tables = None

    def save_vocab(self, directory: Path) -> None:
        """src_vocab.json, tgt_vocab.json and, for the tag schemes, tgt_tags.json: the leaf tags
        and the words `punct_tagged`."""
        super().save_vocab(directory)
        if self.tags:
            atomic_write_text(
                Path(directory) / "tgt_tags.json",
                json.dumps(
                    {"tags": self.tags, "punct_tagged": self.punct_tagged}, ensure_ascii=False
                ),
            )

    def shareable(self, side: str):
        """A subword source writes English (the treebanks are English); words and trees are not shared."""
        if side != "src" or self.cfg.src_tokenizer == "word":
            return None
        return Shareable(
            self.cfg.src_tokenizer,
            frozenset({"en"}),
            self.cfg.src_vocab_size,
            lambda batches, size: Subwords.train(batches, size, self.cfg.src_tokenizer),
            Subwords.load,
        )

    def load_vocab(self, directory: Path) -> None:
        if self.cfg.src_tokenizer != "word":  # src_vocab.json holds a subword tokenizer
            self.src_vocab = Subwords.load(Path(directory) / self.vocab_files[0])
            self.tgt_vocab = WordTokenizer.load(Path(directory) / self.vocab_files[1])
        else:
            super().load_vocab(directory)
        path = Path(directory) / "tgt_tags.json"
        saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        if isinstance(saved, list):  # written before punct_tagged: the tags alone
            saved = {"tags": saved, "punct_tagged": []}
        self.tags, self.punct_tagged = saved["tags"], saved["punct_tagged"]
        self._tables = None

    # -- ids <-> text -------------------------------------------------------------------------
    def prepare_source(self, lines: Sequence[str]) -> list[str]:
        """Raw sentences as Penn Treebank tokens (with `tokenize`), else split on whitespace,
        each bracket written as the treebank writes it (-LRB-, -RRB-, -LCB-, ...): a raw
        bracket would read as a phrase's bracket in the output tree."""
        if not self.cfg.tokenize:
            return [" ".join(_escaped(w) for w in line.split()) for line in lines]
        return [" ".join(ptb_tokens(line)) for line in lines]

    def display(self, output: str) -> str:
        """The tree indented, a phrase a line: the root and its child always broken, below them a
        phrase kept on one line where it fits in 60 characters (nltk's pformat). A tree deeper than
        DRAWN_DEPTH brackets is shown on one line (nltk's drawing recurses a call a bracket)."""
        from nltk.tree import Tree

        from s2s.data_recipes import treebank

        try:
            tree = Tree.fromstring(output)
        except ValueError:  # not a tree (a plugin's output, an empty line): shown as it is
            return output
        return _drawn(tree) if treebank.depth(tree) <= DRAWN_DEPTH else output

    def corpus_files(self, name, sources, outputs) -> dict[str, list[str]]:
        """NAME.trees: one tree a line (its words are the sentence's), the files `corpus=lines`
        and `task.silver_trees` read (a silver treebank for self-training)."""
        return {f"{name}.trees": list(outputs)}

    def postprocess(self, hypothesis: str, source: str) -> str:
        """The tree (one line) over the words of `source` that `hypothesis` describes."""
        return delinearise(hypothesis, source, self.cfg.scheme, self.cfg.root_label)[0]

    def output_target(self, output: str, source: str) -> str:
        """A bracketed tree (an output line) as the linearised target the model writes, in the
        task's scheme; a line that is linearised already is kept, as is an empty one."""
        from s2s.data_recipes import treebank

        if not output.strip() or _is_linearised(output):
            return output
        stats = treebank.ReadStats()
        trees = list(treebank.read_trees([output], "tree", skip_malformed=True, stats=stats))
        if stats.messages:
            raise DataError(stats.messages[0].replace("tree, line 1: ", "", 1))
        if len(trees) != 1:
            raise DataError(f"{len(trees)} trees: one tree a line")
        return " ".join(linearise(trees[0], self.cfg.scheme, self.cfg.root_label))

    def rebuild(self, hypotheses: Sequence[str], sources: Sequence[str]) -> tuple[list[str], int]:
        """The trees of decoded hypotheses, and how many of them had to be repaired.

        A hypothesis that is already a bracketed tree is kept as it is; an empty one is a search
        that found no tree within the length limit: it stays empty, so that EVALB counts the
        sentence as skipped and `f1_all` its brackets as missed, instead of scoring a made-up
        tree."""
        trees, repaired = [], 0
        for h, src in zip(hypotheses, sources):
            if h.strip() and _is_linearised(h):
                h, fixed = delinearise(h, src, self.cfg.scheme, self.cfg.root_label)
                repaired += fixed
            trees.append(h)
        return trees, repaired

    def constraint(self, sources: Sequence[str]) -> TreeConstraint | None:
        """With `constrained`, the search writes only well-formed trees over each source's words."""
        if not self.cfg.constrained:
            return None
        if (
            self._tables is None
        ):  # a run trained before tgt_tags.json: every "tags" leaf token is a tag
            itos = self._vocab("tgt").itos
            tags = self.tags or [t for t in itos[len(SPECIALS) :] if t[0] not in "()"]
            self._tables = TokenTables(itos, tags, self.cfg.scheme, self.punct_tagged)
        return TreeConstraint(self._tables, sources)

    # -- evaluation ---------------------------------------------------------------------------
    def score(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        sources: Sequence[str] | None = None,
    ) -> Score:
        """EVALB (COLLINS.prm) F1 of hypothesis trees against reference trees, line by line.

        Needs no vocabulary. Figures: every EVALB summary figure, the same with a
        `_len_le_40` suffix for gold length <= 40, `repaired`, and the all-sentences figures
        (f1_all, recall_all, precision_all: error and skipped sentences count as missed).
        The primary figure is EVALB's f1 when the references are trees (`s2s score`), and
        f1_all when they are linearised targets (training, validation and the benchmarks, which
        must not hide the sentences EVALB leaves out).
        """
        result, repaired, rebuilt_refs = self._evalb(hypotheses, references, sources)
        figures = {
            k: round(v, 2) if isinstance(v, float) else v for k, v in result.figures().items()
        }
        figures.update(
            {k: round(v, 2) if isinstance(v, float) else v for k, v in result.all_sentences.items()}
        )
        figures["repaired"] = repaired
        s = result.summary
        signature = (
            f"evalb COLLINS.prm (s2s) | sentences {s['sentences']} | errors {s['error_sentences']}"
            f" | skipped {s['skipped_sentences']} | repaired {figures['repaired']}"
        )
        if rebuilt_refs:
            signature += " | references rebuilt from linearised targets (POS tags not gold)"
        primary = "f1_all" if rebuilt_refs else "f1"
        return Score(primary, figures.pop(primary), figures, signature)

    def statistics(self, hypotheses, references, sources=None):
        """Each sentence's matched, gold and test brackets (EVALB's, and over all sentences),
        whose sums make f1 / recall / precision and f1_all / recall_all / precision_all, the
        primary first as in `score`."""
        from .evalb import sentence_statistics

        result, _, rebuilt_refs = self._evalb(hypotheses, references, sources)
        return sentence_statistics(result, "f1_all" if rebuilt_refs else "f1")

    def _evalb(self, hypotheses, references, sources) -> tuple:
        """(EVALB's result, the hypotheses repaired, whether the references were rebuilt from
        linearised targets) of what `score` and `statistics` are given."""
        hypotheses, references = list(hypotheses), list(references)
        if len(hypotheses) != len(references):
            raise DataError(
                f"{len(hypotheses)} test trees for {len(references)} gold trees: "
                "EVALB pairs them line by line, the counts must agree"
            )
        if sources is not None and len(sources) != len(references):
            raise DataError(f"{len(sources)} sources for {len(references)} gold trees")
        rebuilt_refs, repaired = False, 0
        hyps, refs = hypotheses, references
        if sources is not None:  # lines that are token sequences, not trees, are rebuilt first
            hyps, repaired = self.rebuild(hypotheses, sources)
            refs = []
            for r, src in zip(references, sources):
                if _is_linearised(r):
                    r = delinearise(r, src, self.cfg.scheme, self.cfg.root_label)[0]
                    rebuilt_refs = True
                refs.append(r)
        return evalb(refs, hyps), repaired, rebuilt_refs


# bracket tokens as the Penn Treebank writes them (what `ptb_tokens` makes of raw text)
BRACKETS = {"(": "-LRB-", ")": "-RRB-", "[": "-LSB-", "]": "-RSB-", "{": "-LCB-", "}": "-RCB-"}


def _escaped(word: str) -> str:
    """A pre-tokenised word with every bracket in it as the treebank writes one."""
    return re.sub(r"[()\[\]{}]", lambda m: BRACKETS[m.group()], word)


def ptb_tokens(sentence: str) -> list[str]:
    """The Penn Treebank tokens of a raw sentence, as the treebank writes them: punctuation and
    clitics split off, double quotes as `` and '', brackets as -LRB- -RRB- -LCB- ... ."""
    return _treebank_tokenizer().tokenize(sentence, convert_parentheses=True)


@functools.lru_cache(maxsize=1)
def _treebank_tokenizer():
    from nltk.tokenize import TreebankWordTokenizer

    return TreebankWordTokenizer()


DRAWN_DEPTH = 200  # deeper trees are displayed on one line, well within Python's recursion limit


def _drawn(tree, indent: int = 0, broken: int = 2) -> str:
    """`tree` (an nltk.Tree, or a word) drawn from column `indent`; its top `broken` levels a phrase a line."""
    if isinstance(tree, str):
        return tree
    if broken <= 0 or tree.height() <= 2:
        return tree.pformat(margin=60, indent=indent)
    children = "\n".join(
        " " * (indent + 2) + _drawn(child, indent + 2, broken - 1) for child in tree
    )
    return f"({tree.label()}\n{children})"


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
