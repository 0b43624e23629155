"""The task interface: everything the engine needs to know about one transduction problem.

A task turns raw (source, target) pairs into ids and hypotheses back into text, and scores them.
The engine owns the model, the data pipeline, training and decoding and never imports a task by
name; a task imports only this module and `s2s.core.tokenizers`.

A plugin writes what is its own: `read_split`, `build_vocab` (which sets `src_vocab` and
`tgt_vocab`, objects of the `s2s.core.Vocabulary` protocol, one object twice when
shared) and `score`; optionally `prepare_source` (raw input text), `postprocess`, `display`,
`constraint`, `output_target` (an output line as the model writes it) and `statistics`
(per-sentence counts, for intervals and paired tests).
Everything else about vocabularies has a default built on those two objects: sizes, sharing,
text <-> ids, saving and loading (file names `vocab_file` / `vocab_files`, read back with
`Vocab.load`), and `tokenizers()` for export.

`postprocess` is a pure function of its arguments and changes no state, so the engine may call
it anywhere, on any thread. What a task counts about post-processing (parsing: repaired trees)
it counts in `score`, which validation and test hand the decoded hypotheses, before
post-processing, with their sources.

Every vocabulary reserves the ids in `SPECIALS` (see `s2s.core.tokenizers`): 0 <pad>, 1 <s>,
2 </s>, 3 <unk>. Tokenizers trained with the `tokenizers` library get them by listing
`SPECIALS` first among their special tokens.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Iterator, Sequence

from ..errors import DataError, plugin_error
from ..tokenizers import Shareable, Vocabulary, WordTokenizer

if TYPE_CHECKING:
    import torch

#: the version of this contract, "major.minor": a task written for 1.x runs on any s2s whose
#: contract is 1.y with y >= x; a task declares its own as `Task.contract_version` (1.0 was the
#: contract before task origins were recorded and tasks could declare a version)
CONTRACT_VERSION = "1.1"


@dataclass(frozen=True)
class DecodeDefaults:
    """A task's decoding settings; the maximum output length is max_len_a * |x| + max_len_b.

    stop: when beam search leaves a sentence. "bound" (exact): once no live hypothesis can
    beat the best finished one, the paper's "terminate early when possible". "beam": once
    `beam` hypotheses have ended among the `beam` best extensions of a step, as fairseq does;
    can return a worse hypothesis, saves steps. "transformers": as Hugging Face transformers'
    `generate` (early_stopping=False): `beam` finished kept, ended when the best live
    hypothesis, scored at its current length, cannot beat the worst of them.
    length_penalty: "gnmt", lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016), or "power",
    lp(Y) = |Y|^alpha (fairseq, Marian, transformers). min_len: the fewest tokens an output
    has before </s> (fairseq's --min-len is 1).
    """

    beam: int = 4
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    stop: str = "bound"
    length_penalty: str = "gnmt"
    min_len: int = 0


def better(a: float, b: float, higher_is_better: bool = True) -> bool:
    """Whether figure `a` is strictly better than `b` in the direction of a `Score` whose
    `higher_is_better` is given: the one comparison the engine makes of two scores."""
    return a > b if higher_is_better else a < b


@dataclass
class Score:
    """A metric's answer: the primary figure, other figures, a signature, and which way is
    better.

    `higher_is_better` says which way the primary figure improves: True for BLEU, F1 or
    accuracy; False for an error rate (TER, character or word error rate, edit distance). The
    engine never guesses it from the name: the best checkpoint, early stopping (run.patience),
    a sweep's ranking, reranker tuning, minimum Bayes risk over the task's metric and which of
    two systems a paired test calls better all follow it. A task whose direction depends on
    its config (the demo's task.metric) sets it in each Score it returns. It is recorded
    (`as_dict`, so result.json and checkpoints keep it); a record written before it existed
    reads as True."""

    name: str
    value: float
    figures: dict = field(default_factory=dict)
    signature: str = ""
    # figure -> its confidence interval {"value", "low", "high", "mean"}: set by the engine from
    # `Task.statistics` (`s2s.core.contract.resampling.scored`), not by a plugin
    intervals: dict = field(default_factory=dict)
    higher_is_better: bool = True

    def as_dict(self) -> dict:
        found = {
            self.name: self.value,
            **self.figures,
            "higher_is_better": self.higher_is_better,
            "signature": self.signature,
        }
        return found | ({"intervals": self.intervals} if self.intervals else {})

    def better(self, a: float, b: float) -> bool:
        """Whether primary figure `a` is strictly better than `b`, in this score's direction."""
        return better(a, b, self.higher_is_better)

    @property
    def direction(self) -> str:
        """ "higher is better" or "lower is better", for a person."""
        return "higher is better" if self.higher_is_better else "lower is better"

    def _notes(self) -> str:
        """The primary figure's parenthesis: its signature, and "lower is better" where it is."""
        notes = [n for n in (self.signature, "" if self.higher_is_better else "lower is better")]
        found = "; ".join(n for n in notes if n)
        return f" ({found})" if found else ""

    def __str__(self) -> str:
        return f"{self.name} {self.value:.2f}{self._notes()}"

    @classmethod
    def from_dict(cls, record: dict) -> "Score":
        """The Score that `as_dict` wrote (result.json's test figures): its first key is the
        primary figure; a record without "higher_is_better" (written before it) reads True."""
        name, value = next(iter(record.items()))
        kept = (name, "signature", "intervals", "higher_is_better")
        figures = {k: v for k, v in record.items() if k not in kept}
        intervals = record.get("intervals", {})
        higher = bool(record.get("higher_is_better", True))
        return cls(name, value, figures, record.get("signature", ""), intervals, higher)

    def lines(self) -> list[str]:
        """Every figure for a person, one a line: the primary with its signature (and "lower
        is better" where it is) first; a figure with an interval is followed by it, [low,
        high]."""
        width = max(len(k) for k in (self.name, *self.figures))

        def interval(key: str) -> str:
            found = self.intervals.get(key)
            return f"  [{found['low']:.2f}, {found['high']:.2f}]" if found else ""

        lines = [
            f"{self.name:<{width}}  {self.value:.2f}{interval(self.name)} {self._notes()}".rstrip()
        ]
        for key, value in self.figures.items():
            shown = f"{value:.2f}" if isinstance(value, float) else value  # e.g. cer 39.64
            lines.append(f"{key:<{width}}  {shown}{interval(key)}")
        return lines


class Constraint:
    """The outputs a search may write for a batch of sources, as a state machine over tokens.

    A state is a tuple of tensors whose first dimension is the row (one hypothesis each); the
    search repeats, advances and reorders the rows itself, so every method works on all rows at
    once. A constraint must keep a way to finish open: whatever `allowed` admits with
    `remaining` tokens left must still be completable in the remaining tokens, EOS included.
    """

    def initial(self, device) -> tuple:
        """The state of each source of the batch, in order (first dimension B), on `device`."""
        raise NotImplementedError

    def advance(self, state: tuple, tokens) -> tuple:
        """The states after each row takes tokens [n] (a new tuple; EOS leaves a state as it is).

        A row that is out of the search (its score is -inf, e.g. a beam not yet filled) may take
        a token that was not allowed; its state must then stay usable, whatever it holds."""
        raise NotImplementedError

    def allowed(self, state: tuple, remaining) -> "torch.Tensor":
        """Bool [n, V], True where a row may take the token next; remaining [n]: the tokens a
        row may still write before its EOS (0: only EOS may come)."""
        raise NotImplementedError

    def score(self, state: tuple, logp: "torch.Tensor", remaining) -> "torch.Tensor":
        """The log-probabilities [n, V] the search ranks the next tokens by: the model's `logp`,
        -inf where `allowed` says no. A constraint that fixes a token by its state (the word
        at a leaf, say) may score it with the probability of what the model does choose there."""
        return logp.masked_fill(~self.allowed(state, remaining), float("-inf"))

    #: whether beam search divides its beam into banks by `met` (dynamic beam allocation)
    banked: ClassVar[bool] = False

    def candidates(self, state: tuple) -> "torch.Tensor":
        """Tokens [n, m] that each row's next step considers beside the model's best ones: those
        that move the constraint on (a banked constraint's; see `met`)."""
        raise NotImplementedError

    def met(self, state: tuple, tokens) -> "torch.Tensor":
        """[n, K]: how many of the constraint's tokens each row has met after taking each of its
        tokens [n, K]. A `banked` constraint's beam search keeps hypotheses of every count side
        by side (Post and Vilar 2018), so that those that place what the constraint asks for
        are not crowded out by those that put it off."""
        raise NotImplementedError


@dataclass
class TaskConfig:
    """Base of every task's config section; a task subclasses it and adds its own fields."""


class Task:
    """One transduction problem, as a plugin supplies it.

    Subclasses set `name`, `Config` (a dataclass subclassing `TaskConfig`), `decoding`, and
    implement the methods below that raise NotImplementedError (`read_split`, `build_vocab`,
    `score`); the rest have defaults. The instance gets its config section (an omegaconf object
    with `Config`'s fields) as `self.cfg`.
    """

    name: ClassVar[str]
    #: the contract version the task was written for ("1.1"); None: this s2s's own. A task
    #: written for another major version, or a newer minor one, is refused when registered
    contract_version: ClassVar[str | None] = None
    Config: ClassVar[type] = TaskConfig
    decoding: ClassVar[DecodeDefaults] = DecodeDefaults()
    #: whether a source term has a target term in its outputs (`s2s generate --terms`): True
    #: for translation; a parser's outputs are trees over the source's own words
    terminology: ClassVar[bool] = True
    #: names of the splits this task can read; "train" and "valid" are needed to train
    splits: ClassVar[Sequence[str]] = ("train", "valid", "test")

    #: the class whose `load` reads this task's vocabulary files (a `Vocabulary`)
    Vocab: ClassVar[type] = WordTokenizer
    #: file names in a run directory: one shared vocabulary, or the source and the target one
    vocab_file: ClassVar[str] = "vocab.json"
    vocab_files: ClassVar[tuple[str, str]] = ("src_vocab.json", "tgt_vocab.json")

    def __init__(self, cfg):
        self.cfg = cfg
        self.src_vocab: Vocabulary | None = None  # set by build_vocab or load_vocab
        self.tgt_vocab: Vocabulary | None = None
        # side ("src" / "tgt") -> the vocabulary members share there (`shareable`), set by the
        # engine before `build_vocab`, which then takes it for that side instead of training one
        self.joint: dict[str, Vocabulary] = {}

    # -- data -------------------------------------------------------------------------------
    def read_split(self, split: str) -> Iterator[tuple[str, str]]:
        """Yield the raw (source, target) pairs of `split` through the task's recipe.

        Missing or empty data raises `DataError` naming the file.
        """
        raise NotImplementedError

    # -- vocabulary -------------------------------------------------------------------------
    def build_vocab(self, pairs: Iterator[tuple[str, str]]) -> None:
        """Train the vocabularies on the training pairs: set `self.src_vocab` and `self.tgt_vocab`
        (one object twice for a shared vocabulary)."""
        raise NotImplementedError

    def save_vocab(self, directory: Path) -> None:
        """Write the vocabularies into `directory` (`vocab_file`, or the two `vocab_files`)."""
        directory = Path(directory)
        src, tgt = self._vocab("src"), self._vocab("tgt")
        if src is tgt:
            src.save(directory / self.vocab_file)
        else:
            src.save(directory / self.vocab_files[0])
            tgt.save(directory / self.vocab_files[1])

    def load_vocab(self, directory: Path) -> None:
        """Read what `save_vocab` wrote, with `Vocab.load`: the shared file where there is one."""
        directory = Path(directory)
        shared = directory / self.vocab_file
        if shared.is_file():
            self.src_vocab = self.tgt_vocab = self.Vocab.load(shared)
            return
        src, tgt = (directory / name for name in self.vocab_files)
        for path in (src, tgt):
            if not path.is_file():
                raise DataError(
                    f"{path} does not exist, nor {shared}: the vocabulary of task {self.name!r}"
                )
        self.src_vocab, self.tgt_vocab = self.Vocab.load(src), self.Vocab.load(tgt)

    @property
    def src_vocab_size(self) -> int:
        return len(self._vocab("src"))

    @property
    def tgt_vocab_size(self) -> int:
        return len(self._vocab("tgt"))

    @property
    def shared_vocab(self) -> bool:
        """True when source and target use one vocabulary (then all embeddings are tied): one
        object, or two whose `id_space` is the same (OPUS-MT's source and target sentencepiece
        models over one vocab.json: s2s.core.tokenizers.pieces)."""
        src, tgt = self._vocab("src"), self._vocab("tgt")
        return src is tgt or getattr(src, "id_space", None) == getattr(tgt, "id_space", 0)

    def shareable(self, side: str) -> Shareable | None:
        """What this task's `side` ("src" / "tgt") vocabulary is, for sharing it with other
        members of a run (`multitask.shared_vocab`; see `s2s.core.Shareable`), or
        None: not shared. Decided by the config alone (it is asked before any vocabulary exists)."""
        return None

    def tokenizers(self):
        """The source and target vocabularies as `tokenizers.Tokenizer` objects (one object twice
        when shared), id for id: what `s2s export` gives CTranslate2 and Hugging Face. Optional:
        the vocabularies' `to_tokenizers()`."""
        src, tgt = self._vocab("src"), self._vocab("tgt")
        if not hasattr(src, "to_tokenizers") or not hasattr(tgt, "to_tokenizers"):
            raise NotImplementedError(
                f"task {self.name!r} does not give its tokenizers "
                f"({type(src).__name__} has no to_tokenizers())"
            )
        first = src.to_tokenizers()
        return (first, first) if src is tgt else (first, tgt.to_tokenizers())

    def _vocab(self, side: str) -> Vocabulary:
        vocab = self.src_vocab if side == "src" else self.tgt_vocab
        if vocab is None:
            raise RuntimeError(
                f"task {self.name!r}: the vocabulary is neither built nor loaded "
                "(build_vocab / load_vocab first)"
            )
        return vocab

    # -- ids <-> text -----------------------------------------------------------------------
    def prepare_source(self, lines: Sequence[str]) -> list[str]:
        """Input lines as a user types them (raw text) made into the source lines the task was
        trained on (parsing: Penn Treebank tokens). `s2s generate` and the server call it before
        `encode_source`; the data of training and evaluation is already in that form and does
        not go through it. The default keeps the lines as they are."""
        return list(lines)

    def display(self, output: str) -> str:
        """An output line (what `postprocess` returned) in the form a person reads (parsing: an
        indented tree), for `s2s generate --pretty`; it may span lines. The default is the line."""
        return output

    def encode_source(self, lines: Sequence[str]) -> list[list[int]]:
        """Ids of each source line, without <s> or </s> (the engine adds those)."""
        return self._vocab("src").encode(lines)

    def encode_target(self, lines: Sequence[str]) -> list[list[int]]:
        return self._vocab("tgt").encode(lines)

    def decode_target(self, ids: Sequence[int]) -> str:
        """The target string for a sequence of ids (specials already removed)."""
        return self._vocab("tgt").decode(ids)

    def postprocess(self, hypothesis: str, source: str) -> str:
        """Turn a decoded hypothesis into the task's output for `source` (e.g. rebuild a tree).

        A pure function: it changes no state (decoding may run it on several threads at once)."""
        return hypothesis

    def output_target(self, output: str, source: str) -> str:
        """An output line (as `postprocess` returns it and `s2s generate` writes it) for
        `source` as the target line the model writes (`encode_target` reads it): what
        `--score-targets` and `POST /score` score, so that an output's score there is its
        `logprob` in `--json`. The default is the line itself (parsing linearises a bracketed
        tree). A line that is no output of the task raises `DataError` saying why."""
        return output

    def corpus_files(
        self, name: str, sources: Sequence[str], outputs: Sequence[str]
    ) -> dict[str, list[str]] | None:
        """A training corpus of this task's own `outputs` for `sources` (`s2s label`: a
        silver treebank, a back-translated corpus), as files its corpus reader reads: file name
        (made from `name`) -> lines. None: the task has no corpus files to write."""
        return None

    def constraint(self, sources: Sequence[str]) -> Constraint | None:
        """A `Constraint` on the search's outputs for these source lines, or None (no
        constraint)."""
        return None

    # -- evaluation -------------------------------------------------------------------------
    def score(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        sources: Sequence[str] | None = None,
    ) -> Score:
        """Score hypotheses against references (same number of lines).

        Validation and test pass the decoded hypotheses before `postprocess`, with `sources`:
        a task whose post-processing does something applies it here (and counts what it did).
        `s2s score` passes output lines (with `sources` when given `--src`), so such a task
        tells the two apart (parsing: a token sequence from a bracketed tree)."""
        raise NotImplementedError

    def statistics(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        sources: Sequence[str] | None = None,
    ) -> "s2s.core.contract.resampling.SentenceStatistics | None":  # noqa: F821
        """Each sentence's counts behind the figures `score` gives, for confidence intervals
        and paired tests (`s2s.core.contract.resampling`: `s2s score --ci`, `--hyp A --hyp B`), with
        the same arguments as `score`; None (the default): this task gives none, and its
        figures have no interval. The figures of all rows summed must equal `score`'s."""
        return None


def checked_score(task, result) -> Score:
    """`result`, what `task.score` returned, if it is a Score whose value is a finite number
    (as a float) and whose higher_is_better is a bool; else a PluginError naming the plugin and
    `score`. The engine calls it where it receives a score: `s2s score`, validation and test."""
    if not isinstance(result, Score):
        raise plugin_error(task, "score", f"returned {type(result).__name__}, not a s2s.core.Score")
    value = result.value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise plugin_error(
            task,
            "score",
            f"returned a Score whose value is {type(value).__name__} {value!r:.40}, not a number",
        )
    if not math.isfinite(value):
        raise plugin_error(task, "score", f"returned a Score whose value is {value} (not finite)")
    if not isinstance(result.name, str) or not result.name or not isinstance(result.figures, dict):
        raise plugin_error(
            task, "score", "returned a Score without a name (str) or whose figures are not a dict"
        )
    if not isinstance(result.higher_is_better, bool):
        raise plugin_error(
            task,
            "score",
            f"returned a Score whose higher_is_better is {result.higher_is_better!r:.40}, "
            "not True or False",
        )
    return result if type(value) is float else replace(result, value=float(value))
