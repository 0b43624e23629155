"""Linearisation of trees (Vinyals et al. 2015) and its inverse with repair."""

from __future__ import annotations

import pytest
from conftest import NLTK_DATA, needs
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from s2s.data_recipes.treebank import read_trees, to_string
from s2s.plugins.parsing import ParsingTask
from s2s.plugins.parsing.evalb import DELETE_LABELS, evalb, read_tree
from s2s.plugins.parsing.linearise import (
    PLACEHOLDER,
    delinearise,
    linearise,
    punctuation_tags,
)

needs_sample = needs(NLTK_DATA)


@pytest.fixture(scope="module")
def sample():
    from s2s.data_recipes.treebank import sample_trees

    return [t for split in ("train", "valid", "test") for t in sample_trees(NLTK_DATA, split)]


def _placeholder_tags(tree):
    """The tree as the vinyals scheme rebuilds it: punctuation tagged from the word, else XX."""
    out = tree.copy(deep=True)
    for tag, leaf in zip(punctuation_tags(tree.leaves()), out.treepositions("leaves")):
        out[leaf[:-1]].set_label(tag or PLACEHOLDER)
    return out


@needs_sample
def test_linearise_then_rebuild_returns_every_sample_tree(sample):
    assert len(sample) == 3914
    for tree in sample:
        words = tree.leaves()
        tokens = linearise(tree, "tags")
        assert delinearise(tokens, words, "tags") == (to_string(tree), False)
        tokens = linearise(tree)
        assert tokens.count(PLACEHOLDER) == len(words) and all(
            t[0] in "()" for t in tokens if t != PLACEHOLDER
        )
        assert delinearise(tokens, words) == (to_string(_placeholder_tags(tree)), False)


@needs_sample
def test_punctuation_is_tagged_as_the_treebank_tags_it(sample):
    """EVALB drops the same tokens from rebuilt trees as from gold ones, bar two gold oddities."""
    differ = []
    for tree in sample:
        words, gold = zip(*tree.pos())
        for w, g, t in zip(words, gold, punctuation_tags(words)):
            if (g in DELETE_LABELS) != (t is not None) or (t is not None and t != g):
                differ.append((w, g))
    # 'Wa' tagged ',' once (a treebank error); one closing ' with no opening ` before it
    assert sorted(differ) == [("'", "''"), ("Wa", ",")]


def test_example():
    tree = read_trees(["( (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))"], "x")
    tree = next(iter(tree))
    from s2s.data_recipes.treebank import preprocess

    tree = preprocess(tree)
    assert " ".join(linearise(tree)) == "(S (NP XX XX )NP (VP XX )VP XX )S"
    assert " ".join(linearise(tree, "tags")) == "(S (NP DT NN )NP (VP VBZ )VP . )S"
    assert delinearise("(S (NP XX XX )NP (VP XX )VP XX )S", "The dog barks .") == (
        "(TOP (S (NP (XX The) (XX dog)) (VP (XX barks)) (. .)))",
        False,
    )


WORDS = [
    "The",
    "dog",
    "barks",
    ",",
    ".",
    "``",
    "''",
    "'",
    "`",
    "--",
    "-LRB-",
    "$",
    "42",
    "a_b",
    "?",
]
REPAIRS = [
    ("(S (NP XX XX )NP (VP XX )VP XX )S )S )NP", "stray closers dropped"),
    ("(S (NP XX XX )NP (VP XX", "open phrases closed"),
    ("(S (NP XX XX XX XX XX XX )NP )S", "surplus leaves dropped"),
    ("(S (NP XX )NP )S", "missing leaves added"),
    ("", "nothing at all"),
    (")S )NP (VP )VP", "only closers and an empty phrase"),
    ("(NP XX XX )NP (VP XX XX )VP", "two top-level phrases"),
    ("(S (NP XX XX )VP (VP XX XX )NP )S", "closing labels that do not match"),
    ("XX XX <unk> XX", "leaves only, one unknown"),
    ("( (S XX XX XX XX )S", "an opener without a label"),
]


@pytest.mark.parametrize("tokens,what", REPAIRS, ids=[w for _, w in REPAIRS])
def test_repair_examples(tokens, what):
    words = "The dog barks .".split()
    tree, repaired = delinearise(tokens, words)
    assert repaired, what
    _assert_well_formed(tree, words)


def _assert_well_formed(tree: str, words: list[str], root: str = "TOP") -> None:
    reading = read_tree(tree)
    assert reading.problem is None, tree
    assert reading.words == words, tree
    assert reading.phrases[-1][0] == root and reading.phrases[-1][1:] == (0, len(words))
    assert all(first < end for _, first, end in reading.phrases), "an empty phrase"
    strict = next(iter(read_trees([tree], "rebuilt")))  # the recipe's strict reader accepts it too
    assert strict.leaves() == words
    # EVALB scores it against itself without error: punctuation tagged consistently
    assert evalb([tree], [tree]).summary["error_sentences"] == 0


LABELS = ["S", "NP", "VP", "PP", "SBAR", "TOP", "ADVP", "PRT"]
token = st.one_of(
    st.sampled_from(
        [PLACEHOLDER] * 4 + ["(" + lab for lab in LABELS] + [")" + lab for lab in LABELS]
    ),
    st.sampled_from(["(", ")", "<unk>", "NN", "((", "))", "(NP)", ")", "XX)"]),
    st.text(alphabet="()XS NP", min_size=1, max_size=4).filter(
        lambda t: not any(c.isspace() for c in t)
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(token, max_size=40),
    words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
    scheme=st.sampled_from(["vinyals", "tags"]),
    root=st.sampled_from(["TOP", ""]),
)
def test_any_token_sequence_becomes_a_tree_over_the_words(tokens, words, scheme, root):
    tree, repaired = delinearise(tokens, words, scheme, root)
    reading = read_tree(tree)
    assert reading.problem is None, tree
    assert reading.words == words
    assert all(first < end for _, first, end in reading.phrases), "an empty phrase"
    if root:
        assert reading.phrases[-1] == (root, 0, len(words))
    else:  # one phrase spans every word
        assert reading.phrases[-1][1:] == (0, len(words))
    assert next(iter(read_trees([tree], "rebuilt"))).leaves() == words
    if scheme == "vinyals":
        assert evalb([tree], [tree]).summary["error_sentences"] == 0
    # the rebuilt tree linearises to a sequence that needs no repair and rebuilds it
    again = next(iter(read_trees([tree], "rebuilt")))
    assert delinearise(linearise(again, scheme, root), words, scheme, root) == (tree, False)


def test_score_counts_the_repairs_of_decoded_hypotheses():
    task = ParsingTask(OmegaConf.structured(ParsingTask.Config))
    src = ["The dog barks .", "The dog barks .", "The dog barks ."]
    good = "(S (NP XX XX )NP (VP XX )VP XX )S"
    score = task.score(
        [good, "(S (NP XX )NP", ""], [good] * 3, src
    )  # "": no tree found within the length limit: not made up, a sentence skipped
    assert score.figures["repaired"] == 1 and "repaired 1" in score.signature
    assert score.figures["error_sentences"] == 0 and score.figures["skipped_sentences"] == 1
    assert score.value < score.figures["f1"]  # f1_all counts its brackets as missed
    # post-processed hypotheses (trees) are scored as they are: their repairs are not seen again
    trees = [task.postprocess(good, src[0]), task.postprocess("(S (NP XX )NP", src[1])]
    assert task.score(trees, [good, good], src[:2]).figures["repaired"] == 0
    assert task.rebuild(trees, src[:2]) == (trees, 0)


def test_postprocess_changes_no_state():
    task = ParsingTask(OmegaConf.structured(ParsingTask.Config))
    before = dict(vars(task))
    assert task.postprocess("(S (NP XX )NP", "The dog barks .") == task.postprocess(
        "(S (NP XX )NP", "The dog barks ."
    )
    assert vars(task) == before


@needs_sample
def test_word_schemes_rebuild_every_sample_tree(sample):
    for tree in sample:
        words = tree.leaves()
        assert delinearise(linearise(tree, "tags_words"), words, "tags_words") == (
            to_string(tree),
            False,
        )
        tokens = linearise(tree, "words")
        assert [t for t in tokens if t[0] not in "()"] == words
        assert delinearise(tokens, words, "words") == (to_string(_placeholder_tags(tree)), False)


def test_word_schemes_example_and_unknown_words():
    tree = next(iter(read_trees(["( (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))"], "x")))
    from s2s.data_recipes.treebank import preprocess

    tree = preprocess(tree)
    assert " ".join(linearise(tree, "words")) == "(S (NP The dog )NP (VP barks )VP . )S"
    assert (
        " ".join(linearise(tree, "tags_words"))
        == "(S (NP DT The NN dog )NP (VP VBZ barks )VP . . )S"
    )
    # a word the target vocabulary lacks comes back as <unk>: the source word is used, no repair
    assert delinearise("(S (NP The <unk> )NP (VP barks )VP . )S", "The dog barks .", "words") == (
        "(TOP (S (NP (XX The) (XX dog)) (VP (XX barks)) (. .)))",
        False,
    )
    assert delinearise("(S (NP The cat )NP (VP barks )VP . )S", "The dog barks .", "words")[1]
    assert delinearise("(S (NP DT The NN )NP )S", "The dog", "tags_words")[
        1
    ]  # a tag without its word


@pytest.mark.parametrize("scheme", ["vinyals", "tags", "words", "tags_words"])
def test_a_tree_100000_deep_linearises_and_rebuilds(scheme):
    """Neither direction recurses, so depth is bounded by memory only."""
    import nltk

    depth = 100_000
    tree = nltk.Tree("NN", ["w"])
    for _ in range(depth):
        tree = nltk.Tree("NP", [tree])
    tree = nltk.Tree("TOP", [tree])
    tokens = linearise(tree, scheme)
    assert len(tokens) == 2 * depth + (2 if scheme == "tags_words" else 1)
    rebuilt, repaired = delinearise(tokens, ["w"], scheme)
    assert not repaired and rebuilt.count("(NP") == depth and rebuilt.endswith(")" * (depth + 2))
