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
model itself (base64): source and target sides of one vocab.json are two `Pieces` with the same
tokens, each side split by its own model (`s2s.core.tokenizers.base.Imported`).
"""

from __future__ import annotations

import base64
from typing import Sequence

from ..errors import DataError
from .base import EOS, PAD, SPECIALS, UNK, Imported


class Pieces(Imported):
    """Lines to ids through a sentencepiece model and a fixed token list, and ids back."""

    KIND = "sentencepiece"
    FILES = ("pieces.src.json", "pieces.tgt.json")
    WHAT = "a sentencepiece vocabulary of s2s"
    UNKNOWN = None  # as `MarianTokenizer.decode` with skip_special_tokens

    def __init__(self, model_proto: bytes, tokens: Sequence[str], source_ids: Sequence[int]):
        import sentencepiece

        super().__init__(tokens, source_ids)
        self.model_proto = bytes(model_proto)
        self.spm = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)

    def split(self, line: str) -> list[str]:
        """A line's pieces (no </s>): a leading ">>code<<" as one token, the rest split by the
        model."""
        code = []
        if line.startswith(">>") and (end := line.find("<<")) != -1:
            code, line = [line[: end + 2]], line[end + 2 :]
        return code + self.spm.encode(line, out_type=str)

    def join(self, pieces: Sequence[str]) -> str:
        return self.spm.decode_pieces(list(pieces)).replace("\u2581", " ").strip()

    def settings(self) -> dict:
        return {"model": base64.b64encode(self.model_proto).decode("ascii")}

    @classmethod
    def of_settings(cls, settings: dict, tokens: Sequence[str], source_ids: Sequence[int]):
        return cls(base64.b64decode(settings["model"], validate=True), tokens, source_ids)

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
