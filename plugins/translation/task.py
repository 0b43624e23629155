"""The translation task: any parallel corpus, WMT14 EN-DE / EN-FR as the paper trained them.

Data come from a recipe (`source`): "wmt14" reads the hub's WMT14 (or a local copy in its schema)
through `datasets`; "text" reads `{data_dir}/{prefix}.{lang}` files; "multi30k" reads the same
files of Multi30k, fetched once into the user's cache (or a local copy in `data_dir`). One subword vocabulary is
shared by source and target by default (the paper ties all embeddings then); detokenisation is
exact, so hypotheses are scored as plain text.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from s2s.core import (
    ConfigError,
    DataError,
    DecodeDefaults,
    MosesBPE,
    Pieces,
    Score,
    Shareable,
    Subwords,
    Task,
    TaskConfig,
    one_of,
    setting,
)

from . import metrics, moses
from .languages import LANGUAGE, UNSEGMENTED

log = logging.getLogger(__name__)

#: vocabularies that come with a pretrained model (`s2s import`): read, never trained; each
#: kind's class and its two files in a run directory
IMPORTED = {
    Pieces.KIND: (Pieces, Pieces.FILES),
    MosesBPE.KIND: (MosesBPE, MosesBPE.FILES),
}

SOURCES = ("text", "wmt14", "multi30k")
_BATCH = 1000
_TOLD: set = set()  # the languages the log has already said something about


@dataclass
class TranslationConfig(TaskConfig):
    source: str = setting("text", one_of(*SOURCES))
    # lower-case ISO 639-1 codes (languages.py); tokenised BLEU has rules of its own for some
    src_lang: str = setting("en", LANGUAGE)
    tgt_lang: str = setting("de", LANGUAGE)
    # source=text: {data_dir}/{prefix}.{lang}, plain or .gz; an empty prefix means no such split
    # source=multi30k: the same files, fetched into ~/.cache/s2s/multi30k unless data_dir names a copy
    data_dir: str = ""
    train_prefix: str = "train"
    valid_prefix: str = "valid"
    test_prefix: str = "test"
    # source=wmt14: the hub data set and config ("" = "de-en" / "fr-en" from the languages), or a
    # local copy in the hub's schema (save_to_disk folder or parquet files) read offline
    hub_name: str = "wmt14"
    hub_config: str = ""
    local_dir: str = ""
    # vocabulary: trained (bpe, wordpiece), or a pretrained model's (sentencepiece: OPUS-MT's;
    # moses_bpe: fairseq's; written by `s2s import`, never trained; docs/pretrained.md)
    tokenizer: str = setting("bpe", one_of(*Subwords.MODELS, *IMPORTED))
    # an imported tokenizer: the run directory (of `s2s import`) whose vocabulary files this
    # task reads instead of training one; an import names itself, and a run with
    # run.init_from=IMPORT takes it from there
    vocab_from: str = setting("", path=True)
    vocab_size: int = 37_000  # at least the specials and the bytes: 260 (bpe), 516 (wordpiece)
    shared_vocab: bool = True
    drop_empty: bool = True  # drop (and count) pairs with an empty side

    @staticmethod
    def check_relations(section, where: str) -> None:
        """Two languages (WMT14: English and another; Multi30k, fetched: en, de, fr), and a
        vocab_size at least what a byte-level vocabulary of `tokenizer` holds."""
        src, tgt = section.src_lang, section.tgt_lang
        if src == tgt:
            raise ConfigError(f"{where}.src_lang and {where}.tgt_lang are both {src!r}")
        if section.source == "wmt14" and not section.hub_config and "en" not in (src, tgt):
            raise ConfigError(
                f"{where}.src_lang={src!r}, {where}.tgt_lang={tgt!r}: WMT14 pairs English "
                f"with another language (or set {where}.hub_config)"
            )
        if section.source == "multi30k" and not section.data_dir:
            from s2s.data_recipes.multi30k import LANGS

            for key, lang in (("src_lang", src), ("tgt_lang", tgt)):
                if lang not in LANGS:
                    raise ConfigError(
                        f"{where}.{key}={lang!r}: Multi30k is fetched in {', '.join(LANGS)} "
                        f"(or set {where}.data_dir to a copy holding .{lang} files)"
                    )
        smallest = (
            0 if section.tokenizer in IMPORTED else Subwords.smallest_vocab(section.tokenizer)
        )
        if section.vocab_size < smallest:
            raise ConfigError(
                f"{where}.vocab_size={section.vocab_size}: must be >= {smallest} with "
                f"{where}.tokenizer={section.tokenizer} (the 4 specials and every byte"
                f"{' twice' if section.tokenizer == 'wordpiece' else ''})"
            )


class TranslationTask(Task):
    """Text to text in another language, scored with sacreBLEU, tokenised BLEU and chrF."""

    name = "translation"
    Config = TranslationConfig
    decoding = DecodeDefaults(beam=4, alpha=0.6, max_len_a=1.0, max_len_b=50)
    Vocab = Subwords
    vocab_file = "tokenizer.json"
    vocab_files = ("tokenizer.src.json", "tokenizer.tgt.json")

    def __init__(self, cfg):
        super().__init__(cfg)
        if cfg.tokenizer in IMPORTED:  # a pretrained model's vocabulary, side by side
            self.Vocab, self.vocab_files = IMPORTED[cfg.tokenizer]
        if cfg.src_lang == cfg.tgt_lang:
            raise ConfigError(f"task.src_lang and task.tgt_lang are both {cfg.src_lang!r}")
        if cfg.source == "text":  # a split without a prefix is one the corpus lacks
            prefixes = (cfg.train_prefix, cfg.valid_prefix, cfg.test_prefix)
            self.splits = tuple(s for s, p in zip(("train", "valid", "test"), prefixes) if p)
        if cfg.tgt_lang not in moses.RULES and cfg.tgt_lang not in _TOLD:
            _TOLD.add(cfg.tgt_lang)
            log.info(
                "task.tgt_lang=%s: tokenised BLEU (bleu_tok) uses the generic Moses rules, "
                "none of its own (signature tok:moses-generic+atat)",
                cfg.tgt_lang,
            )
        if cfg.tgt_lang in UNSEGMENTED and f"13a-{cfg.tgt_lang}" not in _TOLD:
            _TOLD.add(f"13a-{cfg.tgt_lang}")
            log.warning(
                "task.tgt_lang=%s: sacreBLEU's 13a tokenisation does not split %s words; bleu "
                "and bleu_tok are not comparable with figures computed with a word segmenter "
                "(chrf is)",
                cfg.tgt_lang,
                cfg.tgt_lang,
            )

    # -- data -------------------------------------------------------------------------------
    def read_split(self, split: str) -> Iterator[tuple[str, str]]:
        cfg = self.cfg
        if cfg.source == "wmt14":
            from s2s.data_recipes import wmt14

            return wmt14.read_split(
                split,
                cfg.src_lang,
                cfg.tgt_lang,
                cfg.hub_name,
                cfg.hub_config,
                cfg.local_dir,
                cfg.drop_empty,
            )
        from s2s.data_recipes import parallel_text

        prefixes = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}
        if not prefixes.get(split):
            raise DataError(f"task {self.name!r} has no {split!r} split (set task.{split}_prefix)")
        data_dir = cfg.data_dir
        if cfg.source == "multi30k" and not data_dir:
            from s2s.data_recipes import multi30k

            data_dir = multi30k.fetch(splits=[prefixes[split]], langs=[cfg.src_lang, cfg.tgt_lang])
        if not data_dir:
            raise DataError("task.data_dir is not set: the folder of the {prefix}.{lang} files")
        try:
            return parallel_text.read_split(
                data_dir, prefixes[split], cfg.src_lang, cfg.tgt_lang, cfg.drop_empty
            )
        except DataError as e:
            if not str(e).startswith("file "):  # not a missing file: the message says it all
                raise
            # a preset's names (multi30k_en_de: val, test_2016_flickr) replace the defaults
            raise DataError(
                f"{e}: task.{split}_prefix={prefixes[split]} names the {split} files "
                f"{prefixes[split]}.{cfg.src_lang} / .{cfg.tgt_lang} in task.data_dir={data_dir}; set "
                f"task.{split}_prefix to your files' prefix (own_translation reads train, valid, "
                f"test: docs/own-data.md)"
            ) from None

    def corpus_files(self, name, sources, outputs) -> dict[str, list[str]]:
        """NAME.SRC (the lines translated) and NAME.TGT (their translations), the files
        `task.source=text` reads with the prefix NAME. Back-translation labels target-language
        text with a reverse model (DE->EN for an EN->DE one): its sources are the forward
        model's targets and its outputs the forward model's (synthetic) sources."""
        return {
            f"{name}.{self.cfg.src_lang}": list(sources),
            f"{name}.{self.cfg.tgt_lang}": list(outputs),
        }

    def prepare_source(self, lines: Sequence[str]) -> list[str]:
        """Raw text is what the subword vocabulary reads (byte-level, trained on raw sentences):
        surrounding whitespace is stripped, as the corpus reader strips it, nothing else."""
        return [line.strip() for line in lines]

    # -- vocabulary -------------------------------------------------------------------------
    def shareable(self, side: str) -> Shareable | None:
        """A shared subword vocabulary writes both languages; separate ones are not shared."""
        if not self.cfg.shared_vocab:
            return None
        return Shareable(
            self.cfg.tokenizer,
            frozenset((self.cfg.src_lang, self.cfg.tgt_lang)),
            self.cfg.vocab_size,
            lambda batches, size: Subwords.train(batches, size, self.cfg.tokenizer),
            Subwords.load,
        )

    def build_vocab(self, pairs: Iterator[tuple[str, str]]) -> None:
        if self.cfg.tokenizer in IMPORTED:  # a pretrained model's: read, never trained
            if not self.cfg.vocab_from:
                raise DataError(
                    f"task.tokenizer={self.cfg.tokenizer} is a pretrained model's vocabulary: train "
                    "with run.init_from=RUN_DIR, an `s2s import` (docs/pretrained.md)"
                )
            self.load_vocab(Path(self.cfg.vocab_from))
            return
        train = lambda batches: Subwords.train(batches, self.cfg.vocab_size, self.cfg.tokenizer)  # noqa: E731
        if (
            self.joint
        ):  # one vocabulary shared with other members of the run (both sides: `shareable`)
            self.src_vocab = self.tgt_vocab = self.joint["src"]
            return
        if self.cfg.shared_vocab:
            self.src_vocab = self.tgt_vocab = train(
                [s for s, _ in chunk] + [t for _, t in chunk] for chunk in _chunks(pairs)
            )
            return
        with tempfile.TemporaryDirectory(
            prefix="s2s-vocab-"
        ) as tmp:  # one pass over the pairs, two sides
            sides = [Path(tmp) / "src.txt", Path(tmp) / "tgt.txt"]
            with (
                open(sides[0], "w", encoding="utf-8") as fs,
                open(sides[1], "w", encoding="utf-8") as ft,
            ):
                for s, t in pairs:
                    fs.write(s.replace("\n", " ") + "\n")
                    ft.write(t.replace("\n", " ") + "\n")
            self.src_vocab, self.tgt_vocab = (train(_chunks(_read(p))) for p in sides)

    # -- evaluation -------------------------------------------------------------------------
    def score(
        self,
        hypotheses: Sequence[str],
        references: Sequence[str],
        sources: Sequence[str] | None = None,
    ) -> Score:
        """sacreBLEU (primary), tokenised BLEU with compound splitting, and chrF."""
        bleu = metrics.bleu(hypotheses, references)
        tok = metrics.bleu_tok(hypotheses, references, self.cfg.tgt_lang)
        chrf = metrics.chrf(hypotheses, references)
        figures = {
            "bleu_tok": round(tok.score, 2),
            "chrf": round(chrf.score, 2),
            "sentences": len(references),
            "bleu_bp": round(bleu.bp, 3),
            "bleu_ratio": round(bleu.sys_len / max(1, bleu.ref_len), 3),
            "bleu_signature": bleu.signature,
            "bleu_tok_signature": tok.signature,
            "chrf_signature": chrf.signature,
        }
        return Score("bleu", round(bleu.score, 2), figures, bleu.signature)

    def statistics(self, hypotheses, references, sources=None):
        """sacreBLEU's per-sentence statistics of bleu, bleu_tok and chrf."""
        return metrics.statistics(hypotheses, references, self.cfg.tgt_lang)


def _chunks(items: Iterable) -> Iterator[list]:
    items = iter(items)
    while chunk := list(islice(items, _BATCH)):
        yield chunk


def _read(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line.rstrip("\n")
