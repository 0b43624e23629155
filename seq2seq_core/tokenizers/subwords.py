"""Subword vocabularies trained with the `tokenizers` library: BPE or word-piece, over bytes.
In the engine, not a plugin, because several tasks use them: translation, and parsing with a
subword source that shares translation's English (`multitask.shared_vocab`).

The paper encodes EN-DE with byte-pair encoding (a shared source-target vocabulary of about 37,000
tokens) and EN-FR with a 32,000 word-piece vocabulary. Both models here run over byte-level
pre-tokens (GPT-2's scheme: every byte is one of 256 printable characters, a space is kept as part
of the following word), so every string is covered by the vocabulary and decoding the encoding of
a line gives the line back exactly, spaces included; no detokeniser is needed.

Word-piece marks a piece that continues a word with a prefix. The usual "##" could also be text
("a##b" would then decode wrongly), so the prefix here is "＃＃" (two fullwidth number signs),
which byte-level text never contains, and every byte gets a continuation piece, so no word falls
back to <unk>. A pre-token longer than `MAX_WORD` characters (never natural text; word-piece
matching is quadratic in it) is the one thing still encoded as <unk>.

The ids of `s2s.core.SPECIALS` are 0..3. Those tokens are not matched in text: "<s>"
in a sentence is three ordinary characters.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .base import SPECIALS, UNK
from .base import Tokenizer as Base  # `Tokenizer` here is the library's

CONTINUATION = "\uff03\uff03"  # "＃＃"
MAX_WORD = 200
SLICE = 2_000  # lines a thread encodes at a time
#: threads that encode (None: one per core this process may use); a worker process of a sharded
#: prepare, one of one per core, encodes in one (s2s.core.data.shards)
THREADS: int | None = None
ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


class Subwords(Base):
    """A trained subword vocabulary: lines to ids and ids back to the exact line."""

    MODELS = ("bpe", "wordpiece")
    WHAT = "a readable tokenizer file"

    @staticmethod
    def smallest_vocab(model: str) -> int:
        """The fewest tokens a byte-level `model` vocabulary holds: the specials and every byte
        (word-piece: every byte twice, word-initial and continuing)."""
        return len(SPECIALS) + len(ALPHABET) * (2 if model == "wordpiece" else 1)

    def __init__(self, tokenizer: Tokenizer):
        tokenizer.encode_special_tokens = True  # not stored in tokenizer.json: set on every load
        self.tokenizer = tokenizer

    @classmethod
    def train(
        cls, batches: Iterable[Sequence[str]], vocab_size: int, model: str = "bpe"
    ) -> "Subwords":
        """Learn a vocabulary of `vocab_size` tokens (specials and the 256 bytes included) from
        batches of lines."""
        if model not in cls.MODELS:
            raise ValueError(f"subword model must be one of {', '.join(cls.MODELS)}, got {model!r}")
        smallest = cls.smallest_vocab(model)
        if vocab_size < smallest:
            raise ValueError(
                f"a byte-level {model} vocabulary needs at least {smallest} tokens, got "
                f"{vocab_size}"
            )
        unk = SPECIALS[UNK]
        if model == "bpe":
            tokenizer = Tokenizer(models.BPE(unk_token=unk))
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=SPECIALS,
                initial_alphabet=ALPHABET,
                show_progress=False,
            )
            tokenizer.decoder = decoders.ByteLevel()
        else:
            tokenizer = Tokenizer(
                models.WordPiece(
                    unk_token=unk,
                    continuing_subword_prefix=CONTINUATION,
                    max_input_chars_per_word=MAX_WORD,
                )
            )
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size,
                special_tokens=SPECIALS,
                initial_alphabet=ALPHABET,
                show_progress=False,
                continuing_subword_prefix=CONTINUATION,
            )
            tokenizer.decoder = decoders.Sequence(
                [decoders.Replace(CONTINUATION, ""), decoders.ByteLevel()]
            )
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tokenizer.train_from_iterator((list(b) for b in batches), trainer)
        if model == "wordpiece":
            _complete_wordpiece(tokenizer, vocab_size)
        return cls(tokenizer)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """The ids of each line. Many lines are cut into slices that Python threads encode, one
        per core, each slice sequentially (the library releases the GIL while it encodes): faster
        on 2 cores than the library's own parallel batch, whose threads contend."""
        lines = list(lines)
        workers = min(THREADS or len(os.sched_getaffinity(0)), len(lines) // SLICE)
        encode = lambda part: [
            e.ids for e in self.tokenizer.encode_batch_fast(part, add_special_tokens=False)
        ]  # noqa: E731
        slices = [lines[i : i + SLICE] for i in range(0, len(lines), SLICE)]
        if workers < 2:  # slices still: a batch of this size takes less time than a longer one
            return [ids for part in slices for ids in encode(part)]
        with _library_sequential(), ThreadPoolExecutor(workers) as pool:
            return [ids for part in pool.map(encode, slices) for ids in part]

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def to_tokenizers(self) -> Tokenizer:
        """The `tokenizers.Tokenizer` itself, for export."""
        return self.tokenizer

    def dumps(self) -> str:
        return self.tokenizer.to_str(pretty=True)

    @classmethod
    def loads(cls, text: str) -> "Subwords":
        return cls(Tokenizer.from_str(text))


def _complete_wordpiece(tokenizer: Tokenizer, vocab_size: int) -> None:
    """Give every byte a word-initial and a continuing piece, keeping the first-learned pieces
    up to `vocab_size`: then greedy longest-match always succeeds."""
    learned = tokenizer.get_vocab()
    base = SPECIALS + ALPHABET + [CONTINUATION + c for c in ALPHABET]
    taken = set(base)
    rest = [t for t in sorted(learned, key=learned.get) if t not in taken]
    tokens = base + rest[: vocab_size - len(base)]
    tokenizer.model = models.WordPiece(
        {t: i for i, t in enumerate(tokens)},
        unk_token=SPECIALS[UNK],
        continuing_subword_prefix=CONTINUATION,
        max_input_chars_per_word=MAX_WORD,
    )


@contextlib.contextmanager
def _library_sequential():
    """The library reads TOKENIZERS_PARALLELISM at every call: "false" while our own threads
    share the cores, then whatever it was."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
