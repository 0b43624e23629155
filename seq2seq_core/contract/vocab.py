"""Special ids shared by every vocabulary, the `Vocabulary` protocol, a word-level one, and what
a side of a task's vocabulary is when members share it (`Shareable`).

The engine pads with PAD, starts every target with BOS and ends it with EOS; a task's tokenizer
must give these ids to the tokens in `SPECIALS` (list them first when training with the
`tokenizers` library). A task keeps its vocabularies as objects of the `Vocabulary` protocol,
and `s2s.core.contract.task.Task` does the rest with them. `WordTokenizer` serves tasks whose text
is already split into tokens (the demo, linearised trees).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence, runtime_checkable

from ..errors import DataError
from ..files import atomic_write_text

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)


@runtime_checkable
class Vocabulary(Protocol):
    """What a task's vocabulary offers: lines to ids (no specials) and ids back, kept in one file.

    Optional: `to_tokenizers()`, the same vocabulary as a `tokenizers.Tokenizer`, id for id, which
    `s2s export --to ctranslate2|huggingface` needs.
    """

    def __len__(self) -> int: ...

    def encode(self, lines: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, path: Path) -> None: ...

    @classmethod
    def load(cls, path: Path) -> "Vocabulary":
        """The vocabulary `save` wrote to `path`; a missing or damaged file raises `DataError`."""
        ...


@dataclass(frozen=True)
class Shareable:
    """What one side of a task's vocabulary is, so that members of a run can share it
    (`Task.shareable`, `multitask.shared_vocab`): sides of the same `tokenizer` kind that write a
    language in common share one vocabulary, of the largest `size` they ask for, which `train`
    learns from batches of lines (the members' training text) and `load` reads back from the
    file its `save` wrote."""

    tokenizer: str  # e.g. "bpe", "wordpiece", "word": only equal kinds share
    languages: frozenset  # the languages this side's vocabulary writes, e.g. {"en", "de"}
    size: int  # the vocabulary size the task asks for
    train: Callable[[Iterable[Sequence[str]], int], "Vocabulary"] = field(
        compare=False
    )  # (batches, size)
    load: Callable[[Path], "Vocabulary"] = field(compare=False)


class WordTokenizer:
    """Whitespace-separated tokens to ids; a token outside the vocabulary becomes <unk>."""

    def __init__(self, tokens: Sequence[str] = ()):
        self.itos = list(SPECIALS) + [t for t in tokens if t not in SPECIALS]
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    @classmethod
    def train(cls, lines: Iterable[str], max_size: int | None = None, min_count: int = 1):
        counts = Counter(tok for line in lines for tok in line.split())
        ranked = sorted(
            (t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t)
        )
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        return cls(ranked)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        get = self.stoi.get
        return [[get(t, UNK) for t in line.split()] for line in lines]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.itos[i] for i in ids if i >= len(SPECIALS) or i == UNK)

    def to_tokenizers(self):
        """The same vocabulary as a `tokenizers.Tokenizer` (word level, split on whitespace), for
        export."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        tokenizer = Tokenizer(models.WordLevel(self.stoi, unk_token=SPECIALS[UNK]))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.add_special_tokens(SPECIALS)
        return tokenizer

    def save(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.itos, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> "WordTokenizer":
        try:
            tokens = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"vocabulary file {path} does not exist") from None
        except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise DataError(
                f"{path}: not a readable vocabulary file ({str(e).splitlines()[0]})"
            ) from None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise DataError(f"{path}: not a vocabulary file (a JSON list of tokens)")
        return cls(tokens)
