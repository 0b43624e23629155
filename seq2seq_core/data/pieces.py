"""A vocabulary that comes with a pretrained model: a sentencepiece model that splits text into
pieces, and the model's own list of pieces, whose order its embedding rows follow.

OPUS-MT models (Marian, as Hugging Face's `MarianTokenizer` reads them) split a source line with
`source.spm` and a target line with `target.spm`, and look each piece up in `vocab.json`, which
numbers them in its own order (a piece it lacks is <unk>); a leading language code such as
">>fra<<" is one token. `Pieces` does exactly that, with the sentencepiece library, so that a
line gets the ids `MarianTokenizer` gives it, in s2s's id space: the four `SPECIALS` first
(Marian's "</s>" is EOS, "<unk>" UNK, and its "<pad>", the decoder's start token, is BOS; s2s's
PAD is an id of its own, which an import's model never writes), then the model's other tokens in
its order. `source_ids` keeps each id's number in the model's own vocabulary.

The vocabulary is one JSON file holding the tokens, the source numbers and the sentencepiece
model itself (base64), so that the file's hash covers everything that turns text into ids.
Source and target sides of one vocab.json are two `Pieces` with the same tokens (`id_space`):
one id space, embeddings shared, each side split by its own model.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Sequence

from ..errors import DataError
from ..files import atomic_write_text
from ..contract.vocab import EOS, PAD, SPECIALS, UNK

KIND = "sentencepiece"
FILES = ("pieces.src.json", "pieces.tgt.json")  # a run directory's source and target sides


class Pieces:
    """Lines to ids through a sentencepiece model and a fixed token list, and ids back."""

    def __init__(self, model_proto: bytes, tokens: Sequence[str], source_ids: Sequence[int]):
        import sentencepiece

        if list(tokens[: len(SPECIALS)]) != SPECIALS:
            raise DataError(f"a vocabulary's first tokens must be {SPECIALS}")
        self.model_proto = bytes(model_proto)
        self.spm = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)
        self.itos = list(tokens)
        self.source_ids = list(source_ids)
        # a special's name is not a piece: "<unk>" in text is split like any other characters
        self.stoi = {t: i for i, t in enumerate(self.itos) if i >= len(SPECIALS)}

    @property
    def id_space(self) -> tuple:
        """What decides which id is which token: equal for the two sides of one vocab.json."""
        return tuple(self.itos)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Each line's ids (no </s>): a leading ">>code<<" as one token, the rest split into
        pieces, a piece outside the vocabulary UNK."""
        found = []
        for line in lines:
            code = []
            if line.startswith(">>") and (end := line.find("<<")) != -1:
                code, line = [line[: end + 2]], line[end + 2 :]
            pieces = code + self.spm.encode(line, out_type=str)
            found.append([self.stoi.get(p, UNK) for p in pieces])
        return found

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the pieces, specials left out (as `MarianTokenizer.decode` with
        skip_special_tokens)."""
        pieces = [self.itos[i] for i in ids if i >= len(SPECIALS)]
        return self.spm.decode_pieces(pieces).replace("\u2581", " ").strip()

    def save(self, path: Path) -> None:
        document = {
            "kind": KIND,
            "tokens": self.itos,
            "source_ids": self.source_ids,
            "model": base64.b64encode(self.model_proto).decode("ascii"),
        }
        atomic_write_text(Path(path), json.dumps(document, ensure_ascii=False))

    @classmethod
    def load(cls, path: Path) -> "Pieces":
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            if document.get("kind") != KIND:
                raise ValueError(f'"kind" is {document.get("kind")!r}, not {KIND!r}')
            proto = base64.b64decode(document["model"], validate=True)
            return cls(proto, document["tokens"], document["source_ids"])
        except FileNotFoundError:
            raise DataError(f"vocabulary file {path} does not exist") from None
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 -- JSON, base64 or sentencepiece's own errors
            first = (str(e).splitlines() or [""])[0]
            raise DataError(f"{path}: not a sentencepiece vocabulary of s2s ({first})") from None

    @classmethod
    def of_marian(cls, model_proto: bytes, vocab: dict) -> "Pieces":
        """The s2s form of an OPUS-MT vocabulary: `vocab` maps each token to its id (vocab.json);
        its "</s>", "<unk>" and "<pad>" become EOS, UNK and BOS, PAD is new (source id -1)."""
        by_id = sorted(vocab.items(), key=lambda kv: kv[1])
        marian = {"</s>": EOS, "<unk>": UNK, "<pad>": 1}
        for name in marian:
            if name not in vocab:
                raise DataError(f"vocab.json has no {name!r}: not an OPUS-MT (Marian) vocabulary")
        tokens, source_ids = list(SPECIALS), [-1] * len(SPECIALS)
        for name, ours in marian.items():
            source_ids[ours] = vocab[name]
        for token, i in by_id:
            if token not in marian:
                tokens.append(token)
                source_ids.append(i)
        assert source_ids[PAD] == -1
        return cls(model_proto, tokens, source_ids)
