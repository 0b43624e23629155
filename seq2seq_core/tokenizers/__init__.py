"""Tokenizers: the vocabularies that turn a task's text into ids and back, the special ids they
all reserve (`base`), and the tokenizers a task may use: words and characters learned from its
text (`words`), byte-level BPE and word-piece (`subwords`), a pretrained model's sentencepiece
(`pieces`) or Moses + BPE (`moses_bpe`) vocabulary. The lowest wing above the root: the
contract's `Task` keeps its vocabularies in them, and `s2s.core` exports their names."""

from .base import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    UNK,
    Imported,
    Shareable,
    Tokenizer,
    TokenList,
    Vocabulary,
)
from .moses_bpe import MosesBPE
from .pieces import Pieces
from .subwords import Subwords
from .words import CharTokenizer, WordTokenizer

__all__ = [
    "SPECIALS",
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "Vocabulary",
    "Tokenizer",
    "TokenList",
    "Imported",
    "Shareable",
    "WordTokenizer",
    "CharTokenizer",
    "Subwords",
    "Pieces",
    "MosesBPE",
]
