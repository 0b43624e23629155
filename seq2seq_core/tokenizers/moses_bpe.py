"""A fairseq model's vocabulary: Moses tokenisation, subword-nmt BPE codes, and its dictionary.

fairseq's WMT models read text as `fairseq-interactive --tokenizer moses --bpe subword_nmt` does:
sacremoses' Moses tokeniser for the language (dashes split aggressively, special characters
escaped), subword-nmt's BPE with its codes ("@@" marks a piece that continues a word), and the
dictionary (dict.LANG.txt) that numbers the pieces after fairseq's four specials <s> <pad> </s>
<unk>; a piece it lacks is <unk>. Outputs go back the other way: "@@ " removed, then Moses
detokenised. `MosesBPE` does exactly that, with those libraries, in s2s's id space: the four
`SPECIALS` first (fairseq's <pad>, </s> and <unk> are PAD, EOS and UNK; s2s's BOS is a row of
its own, the copy of </s> that starts fairseq's decoder), then fairseq's <s> (as "<bos>") and
the dictionary's tokens in its order. `source_ids` keeps each id's number in the dictionary
(-1 for BOS).

The vocabulary is one JSON file holding the tokens, the source numbers, the codes and the
language (`s2s.core.tokenizers.base.Imported`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

from ..errors import DataError
from .base import EOS, PAD, SPECIALS, Imported

FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3 of every fairseq dictionary


class MosesBPE(Imported):
    """Lines to ids through Moses tokenisation, BPE codes and a fixed token list, and back;
    <unk> is decoded as such (as fairseq's `string`)."""

    KIND = "moses_bpe"
    FILES = ("moses_bpe.src.json", "moses_bpe.tgt.json")
    WHAT = "a Moses + BPE vocabulary of s2s"

    def __init__(self, lang: str, codes: str, tokens: Sequence[str], source_ids: Sequence[int]):
        from sacremoses import MosesDetokenizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE

        super().__init__(tokens, source_ids)
        self.lang, self.codes = lang, codes
        self.tokenizer, self.detokenizer = MosesTokenizer(lang), MosesDetokenizer(lang)
        self.bpe = BPE(io.StringIO(codes), separator="@@")

    def split(self, line: str) -> list[str]:
        """A line's pieces (no </s>): Moses tokens, then BPE pieces."""
        text = self.tokenizer.tokenize(
            line, aggressive_dash_splits=True, return_str=True, escape=True
        )
        return self.bpe.process_line(text).split()

    def join(self, pieces: Sequence[str]) -> str:
        """ "@@ " removed, then Moses detokenised."""
        text = (" ".join(pieces) + " ").replace("@@ ", "").rstrip()
        return self.detokenizer.detokenize(text.split())

    def settings(self) -> dict:
        return {"lang": self.lang, "codes": self.codes}

    @classmethod
    def of_settings(cls, settings: dict, tokens: Sequence[str], source_ids: Sequence[int]):
        return cls(settings["lang"], settings["codes"], tokens, source_ids)

    @classmethod
    def of_fairseq(cls, lang: str, codes: str, dictionary: Sequence[str]) -> "MosesBPE":
        """The s2s form of a fairseq dictionary: `dictionary` lists its tokens in id order, the
        four specials first (as fairseq's Dictionary numbers a dict.LANG.txt)."""
        if list(dictionary[:4]) != FAIRSEQ_SPECIALS:
            raise DataError(f"a fairseq dictionary starts with {FAIRSEQ_SPECIALS}")
        tokens = list(SPECIALS) + ["<bos>"] + list(dictionary[4:])
        source_ids = [1, -1, 2, 3, 0] + list(range(4, len(dictionary)))
        assert source_ids[PAD] == 1 and source_ids[EOS] == 2
        return cls(lang, codes, tokens, source_ids)


def read_fairseq_dictionary(path: Path) -> list[str]:
    """The tokens of a fairseq dict.LANG.txt in id order: fairseq's four specials, then one
    token a line ("TOKEN COUNT", or "TOKEN COUNT #fairseq:overwrite"); a malformed line raises
    DataError naming the file and line."""
    tokens = list(FAIRSEQ_SPECIALS)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"{path} is missing: fairseq's dictionary of that language") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable ({e})") from None
    for number, line in enumerate(lines, 1):
        fields = line.rstrip("\n").split(" ")
        overwrite = fields[-1] == "#fairseq:overwrite"
        if overwrite:
            fields = fields[:-1]
        if len(fields) < 2 or not fields[-1].lstrip("-").isdigit():
            raise DataError(f"{path}, line {number}: not 'TOKEN COUNT' ({line[:40]!r})")
        token = " ".join(fields[:-1])
        if token in tokens and not overwrite:
            raise DataError(f"{path}, line {number}: {token!r} is listed twice")
        if token not in tokens:
            tokens.append(token)
    return tokens
