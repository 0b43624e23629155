"""The translation vocabularies: exact round trips, specials at 0..3, save and load."""

from __future__ import annotations

import os
from itertools import islice

import pytest
from conftest import MULTI30K, corpus, needs
from omegaconf import OmegaConf
from s2s.core.tokenizers.subwords import CONTINUATION, Subwords
from s2s.core.tokenizers import SPECIALS, UNK
from s2s.plugins.translation import TranslationConfig, TranslationTask

needs_multi30k = needs(MULTI30K)
AWKWARD = [
    "",
    " ",
    "  two  spaces  and edges ",
    "\ttab\tand trailing\t",
    "a##b ##c ＃＃d",
    "<s> <unk> </s><pad>",
    "日本語のテキスト 😀 ÿĀĠ Ġ",
    "x" * 150,
    "Straßenbahn-Haltestelle, 3.000 € (ca.)!",
    "l'été « cité »",
]


def _lines(path):
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.removesuffix("\n") for line in f]


@pytest.fixture(scope="module", params=["bpe", "wordpiece"])
def subwords(request):
    """A small vocabulary trained on 2,000 lines of each language, so the dev sets hold unseen words."""
    corpus(MULTI30K)
    lines = [
        line
        for lang in ("en", "de", "fr")
        for line in islice(_lines(MULTI30K / f"train.{lang}"), 2000)
    ]
    return Subwords.train(
        (lines[i : i + 500] for i in range(0, len(lines), 500)), 2000, request.param
    )


@needs_multi30k
@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_round_trip_on_every_dev_line(subwords, lang):
    lines = _lines(MULTI30K / f"val.{lang}")
    assert len(lines) == 1014
    ids = subwords.encode(lines)
    assert [subwords.decode(i) for i in ids] == lines
    assert not any(UNK in i for i in ids)
    assert sum(map(len, ids)) < 3 * sum(len(line.split()) for line in lines)  # subwords, not bytes


@needs_multi30k
@needs_multi30k
def test_many_lines_encoded_on_threads_as_one_by_one(subwords, monkeypatch):
    """Thousands of lines go to Python threads in slices: the same ids, in order, as the
    library's sequential encoding of each line, and TOKENIZERS_PARALLELISM is given back."""
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    lines = _lines(MULTI30K / "test_2016_flickr.en") + _lines(MULTI30K / "test_2016_flickr.de")
    lines = (lines * 3)[:5_500]  # two slices and a part
    ids = subwords.encode(lines)
    assert ids == [subwords.tokenizer.encode(line, add_special_tokens=False).ids for line in lines]
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_round_trip_on_awkward_text(subwords):
    ids = subwords.encode(AWKWARD)
    assert [subwords.decode(i) for i in ids] == AWKWARD
    assert not any(UNK in i for i in ids)
    assert not any(i < len(SPECIALS) for seq in ids for i in seq)  # "<s>" in text is plain text


@needs_multi30k
def test_specials_first_and_size(subwords):
    assert [subwords.tokenizer.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    assert len(subwords) == 2000
    assert subwords.decode([1, 2, 3, 0]) == ""


@needs_multi30k
def test_wordpiece_marks_continuations(subwords):
    vocab = subwords.tokenizer.get_vocab()
    has_continuations = any(t.startswith(CONTINUATION) for t in vocab)
    assert has_continuations == (subwords.tokenizer.model.__class__.__name__ == "WordPiece")


@needs_multi30k
def test_save_and_load(subwords, tmp_path):
    subwords.save(tmp_path / "tokenizer.json")
    loaded = Subwords.load(tmp_path / "tokenizer.json")
    lines = _lines(MULTI30K / "val.de")[:50] + AWKWARD
    assert loaded.encode(lines) == subwords.encode(lines)
    assert len(loaded) == len(subwords)


def test_too_small_or_unknown_vocabulary():
    with pytest.raises(ValueError, match="at least 516"):
        Subwords.train([["a b"]], 300, "wordpiece")
    with pytest.raises(ValueError, match="bpe, wordpiece"):
        Subwords.train([["a b"]], 3000, "unigram")


def _task(**kw):
    return TranslationTask(OmegaConf.merge(OmegaConf.structured(TranslationConfig), kw))


PAIRS = [
    ("A man rides a red bicycle.", "Ein Mann fährt ein rotes Fahrrad."),
    ("Two dogs play in the snow.", "Zwei Hunde spielen im Schnee."),
    ("A woman sings on a stage.", "Eine Frau singt auf einer Bühne."),
] * 20


@pytest.mark.parametrize("model", ["bpe", "wordpiece"])
def test_task_shared_vocabulary_saved_as_tokenizer_json(tmp_path, model):
    task = _task(tokenizer=model, vocab_size=600)
    task.build_vocab(iter(PAIRS))
    assert task.shared_vocab and task.src_vocab_size == task.tgt_vocab_size
    task.save_vocab(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]
    again = _task(tokenizer=model, vocab_size=600)
    again.load_vocab(tmp_path)
    src, tgt = zip(*PAIRS)
    assert again.encode_source(src) == task.encode_source(src)
    assert [again.decode_target(i) for i in again.encode_target(tgt)] == list(tgt)


def test_task_separate_vocabularies(tmp_path):
    task = _task(shared_vocab=False, vocab_size=400)
    task.build_vocab(iter(PAIRS))
    assert not task.shared_vocab
    task.save_vocab(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "tokenizer.src.json",
        "tokenizer.tgt.json",
    ]
    again = _task(shared_vocab=False, vocab_size=400)
    again.load_vocab(tmp_path)
    src_vocab, tgt_vocab = (
        again.src_vocab.tokenizer.get_vocab(),
        again.tgt_vocab.tokenizer.get_vocab(),
    )
    assert "ĠFahrrad" in tgt_vocab and "ĠFahrrad" not in src_vocab
    assert again.decode_target(again.encode_target(["Zwei Hunde."])[0]) == "Zwei Hunde."


def test_load_names_the_missing_file(tmp_path):
    from s2s.core.errors import DataError

    with pytest.raises(DataError, match="tokenizer.json"):
        _task().load_vocab(tmp_path)


def test_vocabularies_fit_the_protocol_and_the_task_says_when_there_is_none():
    from s2s.core.tokenizers import Vocabulary, WordTokenizer

    task = _task(vocab_size=400)
    with pytest.raises(RuntimeError, match="neither built nor loaded"):
        task.encode_source(["A dog."])
    task.build_vocab(iter(PAIRS))
    assert isinstance(task.src_vocab, Vocabulary) and isinstance(WordTokenizer(), Vocabulary)
    src, tgt = task.tokenizers()
    assert src is tgt is task.src_vocab.to_tokenizers()
