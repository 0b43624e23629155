"""Vocabularies learned from a task's own text: whitespace-separated words (`WordTokenizer`, for
text already split into tokens: the demo, linearised trees) and characters (`CharTokenizer`, for
transliteration, spelling, numbers written out: any text, spaces and non-ASCII included).

Both keep their file as a JSON list of tokens, the specials first.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import ClassVar, Iterable, Sequence

from .base import SPECIALS, UNK, TokenList


class WordTokenizer(TokenList):
    """Whitespace-separated tokens to ids; a token outside the vocabulary becomes <unk>, which
    decoding writes as such. Decoding joins tokens with one space: the text's own spacing is not
    kept (`CharTokenizer` keeps it)."""

    WHAT = "a vocabulary file (a JSON list of tokens)"

    def __init__(self, tokens: Sequence[str] = ()):
        super().__init__(list(SPECIALS) + [t for t in tokens if t not in SPECIALS])

    @classmethod
    def train(cls, lines: Iterable[str], max_size: int | None = None, min_count: int = 1):
        """The tokens of `lines`, most frequent first (ties in the order of their text), those
        seen fewer than `min_count` times left out, at most `max_size` tokens with the specials."""
        split = cls().split
        counts = Counter(token for line in lines for token in split(line))
        ranked = sorted(
            (t for t, c in counts.items() if c >= min_count), key=lambda t: (-counts[t], t)
        )
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        return cls(ranked)

    def split(self, line: str) -> list[str]:
        return line.split()

    def join(self, tokens: Sequence[str]) -> str:
        return " ".join(tokens)

    def to_tokenizers(self):
        """The same vocabulary as a `tokenizers.Tokenizer` (word level, split on whitespace), for
        export."""
        from tokenizers import Tokenizer, models, pre_tokenizers

        tokenizer = Tokenizer(
            models.WordLevel({t: i for i, t in enumerate(self.itos)}, unk_token=SPECIALS[UNK])
        )
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tokenizer.add_special_tokens(SPECIALS)
        return tokenizer

    def dumps(self) -> str:
        return json.dumps(self.itos, ensure_ascii=False)

    @classmethod
    def loads(cls, text: str) -> "WordTokenizer":
        tokens = json.loads(text)
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError("not a JSON list of tokens")
        return cls(tokens)


class CharTokenizer(WordTokenizer):
    """Characters to ids: every character is a token, a space too, so decoding gives back
    exactly the text (any Unicode); a character outside the vocabulary becomes <unk>, which
    decoding writes as U+FFFD (the replacement character), one character as it was."""

    UNKNOWN: ClassVar[str] = "\ufffd"

    def split(self, line: str) -> list[str]:
        return list(line)

    def join(self, tokens: Sequence[str]) -> str:
        return "".join(tokens)

    def to_tokenizers(self):
        """The same vocabulary as a `tokenizers.Tokenizer`: one token a character, decoded by
        joining them as they are, for export."""
        from tokenizers import Regex, decoders, pre_tokenizers

        tokenizer = super().to_tokenizers()
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        tokenizer.decoder = decoders.Fuse()
        return tokenizer
