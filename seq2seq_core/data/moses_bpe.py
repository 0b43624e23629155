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
language, so that its hash covers everything that turns text into ids.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Sequence

from ..errors import DataError
from ..files import atomic_write_text
from ..contract.vocab import EOS, PAD, SPECIALS, UNK

KIND = "moses_bpe"
FILES = ("moses_bpe.src.json", "moses_bpe.tgt.json")  # a run directory's source and target sides
FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3 of every fairseq dictionary


class MosesBPE:
    """Lines to ids through Moses tokenisation, BPE codes and a fixed token list, and back."""

    def __init__(self, lang: str, codes: str, tokens: Sequence[str], source_ids: Sequence[int]):
        from sacremoses import MosesDetokenizer, MosesTokenizer
        from subword_nmt.apply_bpe import BPE

        if list(tokens[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"a vocabulary's first tokens must be {SPECIALS}")
        self.lang, self.codes = lang, codes
        self.itos, self.source_ids = list(tokens), list(source_ids)
        self.stoi = {t: i for i, t in enumerate(self.itos) if i >= len(SPECIALS)}
        self.tokenizer, self.detokenizer = MosesTokenizer(lang), MosesDetokenizer(lang)
        self.bpe = BPE(io.StringIO(codes), separator="@@")

    @property
    def id_space(self) -> tuple:
        """What decides which id is which token: equal for the two sides of one dictionary."""
        return tuple(self.itos)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Each line's ids (no </s>): Moses tokens, BPE pieces, a piece outside the dictionary
        UNK."""
        found = []
        for line in lines:
            text = self.tokenizer.tokenize(
                line, aggressive_dash_splits=True, return_str=True, escape=True
            )
            pieces = self.bpe.process_line(text).split()
            found.append([self.stoi.get(p, UNK) for p in pieces])
        return found

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the pieces: <unk> written as such (as fairseq's `string`), "@@ " removed,
        Moses detokenised; the other specials left out."""
        words = [self.itos[i] for i in ids if i >= len(SPECIALS) or i == UNK]
        text = (" ".join(words) + " ").replace("@@ ", "").rstrip()
        return self.detokenizer.detokenize(text.split())

    def save(self, path: Path) -> None:
        document = {
            "kind": KIND,
            "lang": self.lang,
            "codes": self.codes,
            "tokens": self.itos,
            "source_ids": self.source_ids,
        }
        atomic_write_text(Path(path), json.dumps(document, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> "MosesBPE":
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            if document.get("kind") != KIND:
                raise ValueError(f'"kind" is {document.get("kind")!r}, not {KIND!r}')
            return cls(
                document["lang"], document["codes"], document["tokens"], document["source_ids"]
            )
        except FileNotFoundError:
            raise DataError(f"vocabulary file {path} does not exist") from None
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 -- JSON or the libraries' own errors
            first = (str(e).splitlines() or [""])[0]
            raise DataError(f"{path}: not a Moses + BPE vocabulary of s2s ({first})") from None

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
