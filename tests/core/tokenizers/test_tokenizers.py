"""The tokenizers a task may use, through `s2s.core`: characters that give the text back exactly
(spaces and non-ASCII included), words, and one way of failing to read a vocabulary file (one
line naming the file), whichever the class."""

from __future__ import annotations

import pytest
from s2s.core import (
    SPECIALS,
    UNK,
    CharTokenizer,
    DataError,
    MosesBPE,
    Pieces,
    Subwords,
    Tokenizer,
    Vocabulary,
    WordTokenizer,
)

TEXT = [
    "twenty  one",  # two spaces
    " leading and trailing ",
    "naïve café, señor: 1 234",
    "日本語のテキスト",
    "tab\there, emoji 🙂",
]


def test_characters_decode_back_to_exactly_the_text():
    chars = CharTokenizer.train(TEXT)
    ids = chars.encode(TEXT)
    assert [chars.decode(i) for i in ids] == TEXT
    assert ids[0][6:8] == [chars.stoi[" "]] * 2  # a space is a token of its own
    assert all(i > UNK for line in ids for i in line)


def test_an_unseen_character_is_one_replacement_character():
    chars = CharTokenizer.train(["abc"])
    (ids,) = chars.encode(["a b"])
    assert ids == [chars.stoi["a"], UNK, chars.stoi["b"]]
    assert chars.decode(ids) == "a\ufffdb"
    assert chars.decode([1, *ids, 2, 0]) == "a\ufffdb"  # BOS, EOS and PAD are no text


def test_a_special_name_in_text_is_text():
    words = WordTokenizer.train(["a <s> b"])
    assert words.encode(["<s> a"]) == [[UNK, words.stoi["a"]]]
    chars = CharTokenizer.train(["<s>"])
    assert chars.decode(chars.encode(["<s>"])[0]) == "<s>"


def test_words_are_ranked_by_count_and_cut_to_size():
    words = WordTokenizer.train(["b a a c", "a b"], max_size=len(SPECIALS) + 2)
    assert words.itos[len(SPECIALS) :] == ["a", "b"]
    assert words.decode(words.encode(["a c b"])[0]) == "a <unk> b"
    chars = CharTokenizer.train(["aab"], min_count=2)
    assert chars.itos[len(SPECIALS) :] == ["a"]


@pytest.mark.parametrize("cls", [WordTokenizer, CharTokenizer])
def test_saved_and_loaded_back_equal(cls, tmp_path):
    vocab = cls.train(TEXT)
    vocab.save(tmp_path / "vocab.json")
    loaded = cls.load(tmp_path / "vocab.json")
    assert loaded.itos == vocab.itos and loaded.encode(TEXT) == vocab.encode(TEXT)
    assert isinstance(loaded, Vocabulary) and isinstance(loaded, Tokenizer)


def test_characters_exported_to_the_tokenizers_library_keep_ids_and_text():
    chars = CharTokenizer.train(TEXT)
    library = chars.to_tokenizers()
    for line, ids in zip(TEXT, chars.encode(TEXT)):
        assert library.encode(line, add_special_tokens=False).ids == ids
        assert library.decode(ids) == line


@pytest.mark.parametrize(
    "cls, content, says",
    [
        (WordTokenizer, '{"a": 1}', "not a vocabulary file (a JSON list of tokens)"),
        (CharTokenizer, "[1, 2", "not a vocabulary file (a JSON list of tokens) (Expecting"),
        (WordTokenizer, b"\xff[]", "not a vocabulary file"),
        (Subwords, "{}", "not a readable tokenizer file"),
        (Pieces, '{"kind": "moses_bpe"}', 'not a sentencepiece vocabulary of s2s ("kind" is'),
        (MosesBPE, '{"kind": "sentencepiece"}', "'sentencepiece', not 'moses_bpe'"),
        (MosesBPE, '{"kind": "moses_bpe", "tokens": [], "source_ids": []}', "(no 'lang')"),
    ],
)
def test_a_file_that_is_no_vocabulary_is_one_line_naming_it(cls, content, says, tmp_path):
    path = tmp_path / "vocab.json"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    with pytest.raises(DataError) as caught:
        cls.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and says in message and "\n" not in message


@pytest.mark.parametrize("cls", [WordTokenizer, CharTokenizer, Subwords, Pieces, MosesBPE])
def test_a_missing_file_is_named(cls, tmp_path):
    with pytest.raises(DataError, match=f"vocabulary file {tmp_path}/none.json does not exist"):
        cls.load(tmp_path / "none.json")
