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

A multilingual model's vocabulary (NLLB-200's, M2M100's: fairseq's numbering, the pieces one
past sentencepiece's own ids, the language codes after them) holds its `languages`, each
language's name (as transformers' `src_lang` takes it: "eng_Latn", "de") and its token
("eng_Latn", "__de__"), and its other `specials` (fairseq's "<s>", "<mask>", unused rows);
each side has a language, `lang`, whose token starts every line it encodes: the source's is
prefixed to the source, the target's is the decoder's first token (forced at search,
`start_ids`). A language token typed into the text is refused: languages are chosen by name
(`choose_languages`), never written into the text.
"""

from __future__ import annotations

import base64
import difflib
import re
from typing import Sequence

from ..errors import ConfigError, DataError
from .base import EOS, PAD, SPECIALS, UNK, Imported


class Pieces(Imported):
    """Lines to ids through a sentencepiece model and a fixed token list, and ids back."""

    KIND = "sentencepiece"
    FILES = ("pieces.src.json", "pieces.tgt.json")
    WHAT = "a sentencepiece vocabulary of s2s"
    UNKNOWN = None  # as `MarianTokenizer.decode` with skip_special_tokens

    def __init__(
        self,
        model_proto: bytes,
        tokens: Sequence[str],
        source_ids: Sequence[int],
        languages: dict | None = None,
        specials: Sequence[str] = (),
        lang: str | None = None,
    ):
        import sentencepiece

        super().__init__(tokens, source_ids)
        self.model_proto = bytes(model_proto)
        self.spm = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)
        self.languages = dict(languages or {})  # name -> token, in the model's order
        self.specials = list(specials)  # tokens beyond SPECIALS that text never holds
        missing = [t for t in [*self.languages.values(), *self.specials] if t not in self.stoi]
        if missing:
            raise DataError(f"the language or special token {missing[0]!r} is not in the tokens")
        self.skipped = {self.stoi[t] for t in [*self.languages.values(), *self.specials]}
        self.typed = (
            re.compile("|".join(map(re.escape, sorted(self.languages.values(), key=len)[::-1])))
            if self.languages
            else None
        )
        self.lang = None
        if lang is not None:
            self.choose(lang, "lang")

    def choose(self, lang: str, setting: str) -> None:
        """Make `lang` (a language's name, as the model's tokenizer takes it) this side's
        language; a name the model lacks is a ConfigError naming `setting` and the nearest."""
        problem = language_problem(self, lang)
        if problem:
            raise ConfigError(f"{setting}={lang!r}{problem}")
        self.lang = lang

    def start_ids(self) -> list[int]:
        """The ids every line of this side starts with: its language's code, or none."""
        return [] if self.lang is None else [self.stoi[self.languages[self.lang]]]

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Each line's ids; a multilingual model's lines start with their language's code, and
        a code typed into the text is refused."""
        if self.typed is None:
            return super().encode(lines)
        found = []
        for line in lines:
            if typed := self.typed.search(line):
                raise DataError(
                    f"{typed.group()!r} is a language code of the model: choose languages "
                    "with --src-lang / --tgt-lang (decode.src_lang, decode.tgt_lang), not "
                    "in the text"
                )
            pieces = self.spm.encode(line, out_type=str)
            found.append(self.start_ids() + [self.stoi.get(p, UNK) for p in pieces])
        return found

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the pieces, specials and language codes left out."""
        return super().decode([i for i in ids if i not in self.skipped])

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
        found = {"model": base64.b64encode(self.model_proto).decode("ascii")}
        if self.languages:
            found.update(languages=self.languages, specials=self.specials, lang=self.lang)
        return found

    @classmethod
    def of_settings(cls, settings: dict, tokens: Sequence[str], source_ids: Sequence[int]):
        return cls(
            base64.b64decode(settings["model"], validate=True),
            tokens,
            source_ids,
            settings.get("languages"),
            settings.get("specials", ()),
            settings.get("lang"),
        )

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


def language_problem(vocab, lang: str) -> str | None:
    """What is wrong with `lang` as a language of `vocab` (words to follow its name), or None:
    the vocabulary has no language codes, or not this one (the nearest named)."""
    languages = getattr(vocab, "languages", None)
    if not languages:
        return ": this model has no language codes (not a multilingual import: NLLB-200, M2M100)"
    if lang in languages:
        return None
    near = difflib.get_close_matches(lang, list(languages), n=3, cutoff=0.5)
    near = near or [n for n in languages if n.lower().startswith(lang[:2].lower())]
    hint = f"; nearest: {', '.join(near[:3])}" if near else ""
    return f" is not a language of this model ({len(languages)} languages{hint})"


def choose_languages(tasks, src_lang: str, tgt_lang: str) -> None:
    """Set the source and the target language (names; "" keeps the vocabulary's own) of every
    task whose vocabularies are a multilingual model's; a name the model lacks is a ConfigError
    naming decode.src_lang / decode.tgt_lang and the nearest names."""
    for task in tasks:
        for side, lang, setting in (
            ("src_vocab", src_lang, "decode.src_lang (--src-lang)"),
            ("tgt_vocab", tgt_lang, "decode.tgt_lang (--tgt-lang)"),
        ):
            vocab = getattr(task, side, None)
            if lang and isinstance(vocab, Pieces):
                vocab.choose(lang, setting)
            elif lang:
                raise ConfigError(f"{setting}={lang!r}{language_problem(vocab, lang)}")


def start_ids(task) -> list[int]:
    """The target ids every output of `task` (a run's member or a task) starts with: a
    multilingual model's target language code (forced as the decoder's first token, as
    transformers' forced_bos_token_id), or none."""
    vocab = getattr(getattr(task, "task", task), "tgt_vocab", None)
    if not isinstance(vocab, Pieces) or not vocab.start_ids():
        return []
    return task.encode_target([""])[0]
