"""Special ids shared by every vocabulary, the `Vocabulary` protocol, the base classes of s2s's
tokenizers (`Tokenizer`, `TokenList`), and what a side of a task's vocabulary is when members
share it (`Shareable`).

The engine pads with PAD, starts every target with BOS and ends it with EOS; a task's tokenizer
must give these ids to the tokens in `SPECIALS` (list them first when training with the
`tokenizers` library). A task keeps its vocabularies as objects of the `Vocabulary` protocol,
and `s2s.core.Task` does the rest with them. A tokenizer of its own may subclass `Tokenizer`
(which writes its file whole and names the file in every error reading it back) or `TokenList`
(ids that index a list of tokens: only the splitting of a line and the joining of its tokens
are left to write).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Protocol, Sequence, runtime_checkable

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


class Tokenizer(ABC):
    """The base of s2s's tokenizers, a `Vocabulary`: a subclass writes `__len__`, `encode`,
    `decode` and its file as text (`dumps`, `loads`); `save` writes the file whole or not at all,
    and `load` turns every failure to read it back into one `DataError` naming the file."""

    #: what a file of this class is, for the error of a file that is not one
    WHAT: ClassVar[str] = "a vocabulary file of s2s"

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Each line's ids, without specials."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, specials left out."""

    @abstractmethod
    def dumps(self) -> str:
        """The vocabulary as the text of its file."""

    @classmethod
    @abstractmethod
    def loads(cls, text: str) -> "Tokenizer":
        """The vocabulary whose file `dumps` wrote; text that is not one raises any exception
        (`load` names the file)."""

    def save(self, path: Path) -> None:
        atomic_write_text(Path(path), self.dumps())

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        try:
            return cls.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DataError(f"vocabulary file {path} does not exist") from None
        except Exception as e:  # noqa: BLE001 -- JSON, the libraries' own and the class's errors
            first = f"no {e}" if isinstance(e, KeyError) else (str(e).splitlines() or [""])[0]
            raise DataError(f"{path}: not {cls.WHAT} ({first})") from None


class TokenList(Tokenizer):
    """A tokenizer whose ids index a list of tokens, `SPECIALS` first: a line split into tokens
    (`split`), each token's id (a token outside the list is UNK; a special's name in text is no
    special), and ids back to their tokens joined (`join`)."""

    #: what `decode` writes for UNK (None: nothing)
    UNKNOWN: ClassVar[str | None] = SPECIALS[UNK]

    def __init__(self, tokens: Sequence[str]):
        if list(tokens[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"a vocabulary's first tokens must be {SPECIALS}")
        self.itos = list(tokens)
        self.stoi = {t: i for i, t in enumerate(self.itos) if i >= len(SPECIALS)}

    @abstractmethod
    def split(self, line: str) -> list[str]:
        """The tokens of one line."""

    @abstractmethod
    def join(self, tokens: Sequence[str]) -> str:
        """The text of tokens, the inverse of `split`."""

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        get = self.stoi.get
        return [[get(t, UNK) for t in self.split(line)] for line in lines]

    def decode(self, ids: Sequence[int]) -> str:
        first, unknown = len(SPECIALS), self.UNKNOWN
        shown = [i for i in ids if i >= first or (i == UNK and unknown is not None)]
        return self.join([self.itos[i] if i >= first else unknown for i in shown])


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


class Imported(TokenList):
    """A pretrained model's vocabulary: its tokens in s2s's id space (`SPECIALS` first), each
    id's number in the model's own vocabulary (`source_ids`, -1 for a row s2s adds), and what
    turns text into its tokens (`settings`), all in one JSON file whose "kind" names the class,
    so that the file's hash covers everything that turns text into ids. The two sides of one
    model's vocabulary have the same tokens (`id_space`): one id space, each side split by its
    own settings."""

    KIND: ClassVar[str]  # the file's "kind", and the task's `tokenizer` setting
    FILES: ClassVar[tuple[str, str]]  # a run directory's source and target sides

    def __init__(self, tokens: Sequence[str], source_ids: Sequence[int]):
        super().__init__(tokens)
        self.source_ids = list(source_ids)

    @property
    def id_space(self) -> tuple:
        """What decides which id is which token: equal for the two sides of one model."""
        return tuple(self.itos)

    @abstractmethod
    def settings(self) -> dict:
        """What the file holds besides the tokens and their numbers, as JSON values."""

    @classmethod
    @abstractmethod
    def of_settings(cls, settings: dict, tokens: Sequence[str], source_ids: Sequence[int]):
        """The vocabulary of the `settings` its file holds."""

    def dumps(self) -> str:
        document = {"kind": self.KIND, **self.settings()}
        document.update(tokens=self.itos, source_ids=self.source_ids)
        return json.dumps(document, ensure_ascii=False)

    @classmethod
    def loads(cls, text: str) -> "Imported":
        document = json.loads(text)
        if document.get("kind") != cls.KIND:
            raise ValueError(f'"kind" is {document.get("kind")!r}, not {cls.KIND!r}')
        tokens, source_ids = document.pop("tokens"), document.pop("source_ids")
        return cls.of_settings(document, tokens, source_ids)
