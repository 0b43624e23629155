"""Tree-constrained search for parsing: the constraint admits every treebank tree, and search
under it always writes a tree over exactly the source words."""

from __future__ import annotations

import pytest
import torch
from s2s.core.contract.task import DecodeDefaults
from conftest import NLTK_DATA, needs
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from s2s.core.decode.batched import Decoder, source_batch
from s2s.core.decode.search import search
from s2s.core.nn.model import Transformer
from s2s.core.setup.settings import ModelConfig
from s2s.core.tokenizers import EOS
from s2s.plugins.parsing import ParsingTask
from s2s.plugins.parsing.evalb import evalb, read_tree
from s2s.plugins.parsing.linearise import SCHEMES, linearise, punctuation_tags

SAMPLE = NLTK_DATA / "corpora" / "treebank.zip"
needs_sample = needs(SAMPLE)


def task_for(scheme, pairs, **cfg):
    task = ParsingTask(
        OmegaConf.structured(ParsingTask.Config(scheme=scheme, constrained=True, **cfg))
    )
    task.build_vocab(pairs)
    return task


def admitted(task, sources, targets, slack=0):
    """For each pair: does the constraint allow every token of the target, then EOS, when the
    maximum length is the target's own length + slack? Checked for all pairs at once."""
    ids = task.encode_target(targets)
    n = len(ids)
    length = torch.tensor([len(x) for x in ids]) + slack
    tokens = torch.full((n, int(length.max()) + 1), EOS)
    for i, x in enumerate(ids):
        tokens[i, : len(x)] = torch.tensor(x)
    c = task.constraint(sources)
    state, ok = c.initial("cpu"), torch.ones(n, dtype=torch.bool)
    for t in range(tokens.size(1)):
        allowed = c.allowed(state, (length - t).clamp(min=0))
        ok &= allowed[torch.arange(n), tokens[:, t]] | (t > length)
        state = c.advance(state, tokens[:, t])
    return ok


@pytest.fixture(scope="module")
def sample():
    from s2s.data_recipes.treebank import sample_trees

    return [t for split in ("train", "valid", "test") for t in sample_trees(str(NLTK_DATA), split)]


@needs_sample
@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_constraint_admits_every_sample_tree_at_its_own_length(sample, scheme):
    """All 3,914 trees, each with exactly its own length as the maximum (the tightest budget).
    The target vocabulary is capped (words beyond it are <unk>, as the search writes them)."""
    assert len(sample) == 3914
    sources = [" ".join(t.leaves()) for t in sample]
    targets = [" ".join(linearise(t, scheme)) for t in sample]
    task = task_for(scheme, zip(sources, targets), tgt_vocab_size=400)
    order = sorted(range(len(sample)), key=lambda i: len(targets[i]))
    for k in range(0, len(order), 1000):  # batches of similar length
        part = order[k : k + 1000]
        ok = admitted(task, [sources[i] for i in part], [targets[i] for i in part])
        assert ok.all(), [targets[part[i]] for i in (~ok).nonzero().squeeze(1)[:3]]


PAIRS = [
    ("The dog barks .", "(S (NP DT NN )NP (VP VBZ )VP . )S"),
    (
        "A cat , a dog and `` birds '' sleep",
        "(S (NP (NP DT NN )NP , (NP DT NN )NP CC `` NNS '' )NP (VP VBP )VP )S",
    ),
    ("Stocks fell -- sharply", "(S (NP NNS )NP (VP VBD : (ADVP RB )ADVP )VP )S"),
]


def linearised_pairs(scheme):
    """PAIRS (written with tags) in `scheme`."""
    from s2s.data_recipes.treebank import read_trees
    from s2s.plugins.parsing.linearise import delinearise

    out = []
    for src, tagged in PAIRS:
        tree = next(iter(read_trees([delinearise(tagged, src, "tags")[0]], "x")))
        out.append((src, " ".join(linearise(tree, scheme))))
    return out


def test_rejects_what_is_not_a_tree_over_the_words():
    for scheme in SCHEMES:
        task = task_for(scheme, linearised_pairs(scheme))
        src, good = linearised_pairs(scheme)[0]
        toks = good.split()
        bad = [
            " ".join(toks[:-1]),  # EOS before the tree is complete
            " ".join(toks + toks[-1:]),  # a closer too many
            " ".join(toks[:1] + ["(NP", ")NP"] + toks[1:]),  # an empty phrase
            " ".join(toks[:1] + toks[1:4] + toks[1:4] + toks[4:]),  # leaves beyond the words
            good.replace(")VP", ")NP"),
        ]  # a closer that does not match
        ok = admitted(task, [src] * len(bad), bad, slack=20)
        assert not ok.any(), [b for b, o in zip(bad, ok) if o]
        assert admitted(task, [src], [good]).all()
        assert not admitted(task, [src], [good], slack=-1).any()  # a budget too short to finish


def test_punctuation_words_must_carry_their_tag_and_only_they(tmp_path):
    task = task_for("tags", linearised_pairs("tags"))
    assert admitted(task, ["The dog barks ."], ["(S (NP DT NN )NP (VP VBZ )VP . )S"]).all()
    assert not admitted(task, ["The dog barks ."], ["(S (NP DT NN )NP (VP VBZ )VP NN )S"]).any()
    # nor may a word that is not punctuation carry a punctuation tag (EVALB would delete it),
    # unless the training trees tag it as punctuation somewhere
    assert not admitted(task, ["The dog barks ."], ["(S (NP DT , )NP (VP VBZ )VP . )S"]).any()
    task = task_for(
        "tags", linearised_pairs("tags") + [("Wa .", "(S (NP , )NP . )S")]
    )  # as in wsj_0037
    assert task.punct_tagged == ["Wa"]
    task.save_vocab(tmp_path)
    task = ParsingTask(task.cfg)
    task.load_vocab(tmp_path)  # the words travel with the vocabulary
    assert admitted(task, ["Wa ."], ["(S (NP , )NP . )S"]).all()
    assert not admitted(task, ["The dog barks ."], ["(S (NP DT , )NP (VP VBZ )VP . )S"]).any()


def untrained_model(task, seed):
    torch.manual_seed(seed)
    cfg = ModelConfig(layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0, max_positions=128)
    return Transformer(cfg, task.src_vocab_size, task.tgt_vocab_size, shared_vocab=False).eval()


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
    "cat",
    "sleep",
    "unseen",
    "Zq",
]


@settings(max_examples=12, deadline=None)
@given(
    sentences=st.lists(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=9).map(" ".join),
        min_size=1,
        max_size=4,
    ),
    scheme=st.sampled_from(SCHEMES),
    beam=st.sampled_from([1, 4, 21]),
    seed=st.integers(0, 5),
)
def test_constrained_search_on_an_untrained_model_writes_trees_over_the_words(
    sentences, scheme, beam, seed
):
    """Whatever the model, every output is a well-formed tree over exactly the words, found
    within a tight maximum length (2n + 4 tokens; the smallest tree needs n + 2, 2n + 2 with
    tags_words); nothing is repaired, and EVALB scores it without error against a reference
    tree over the same words tagged as the treebank tags punctuation."""
    task = task_for(scheme, linearised_pairs(scheme))
    model = untrained_model(task, seed)
    src = source_batch(task.encode_source(sentences))
    hyps = search(
        model,
        src,
        DecodeDefaults(beam=beam, alpha=0.3, max_len_a=2.0, max_len_b=2),
        constraint=task.constraint(sentences),
    )
    trees, repaired = task.rebuild([task.decode_target(h.tokens) for h in hyps], sentences)
    assert repaired == 0, trees
    for tree, words in zip(trees, sentences):
        assert read_tree(tree).words == words.split() and read_tree(tree).problem is None
    gold = [
        "(TOP (S "
        + " ".join(f"({tag or 'NN'} {w})" for w, tag in zip(s.split(), punctuation_tags(s.split())))
        + "))"
        for s in sentences
    ]
    assert evalb(gold, trees).summary["error_sentences"] == 0


def test_off_by_default_and_on_in_the_sample_preset(registry):
    from s2s.core.data.members import build_task
    from s2s.core.setup.config import load_config

    assert ParsingTask(OmegaConf.structured(ParsingTask.Config)).constraint(["a b"]) is None
    assert (
        build_task(load_config("wsj_parsing", [], registry=registry).task, registry).constraint(
            ["a"]
        )
        is None
    )
    task = build_task(load_config("ptb_sample_parsing", [], registry=registry).task, registry)
    with pytest.raises(
        RuntimeError, match="neither built nor loaded"
    ):  # its tokens come from the vocabulary
        task.constraint(["a b"])
    task.build_vocab([("a b", "(S a b )S")])
    assert task.cfg.constrained and task.constraint(["a b"]) is not None


def test_a_due_word_is_scored_as_any_word():
    """The source fixes which word a leaf writes, so the search scores it with the model's
    probability of writing some word there; brackets keep their own probability."""
    from s2s.core.tokenizers import SPECIALS, UNK

    task = task_for("words", linearised_pairs("words"))
    V = task.tgt_vocab_size
    tokens = {i: task.decode_target([i]) for i in range(len(SPECIALS), V)}
    words = [UNK] + [i for i, t in tokens.items() if not t.startswith(("(", ")"))]
    c = task.constraint(["The dog barks ."])
    state = c.advance(
        c.initial("cpu"), torch.tensor(task.encode_target(["(S"])[0])
    )  # the tree opened
    logp = torch.randn(1, V).log_softmax(-1)
    scored = c.score(state, logp, torch.tensor([20]))
    the = task.encode_target(["The"])[0][0]
    assert torch.isclose(scored[0, the], logp[0, words].logsumexp(0))
    opens = [i for i, t in tokens.items() if t.startswith("(")]
    assert torch.equal(scored[0, opens], logp[0, opens])
    assert scored[0, [w for w in words if w != the]].eq(-torch.inf).all()


def test_repairs_are_counted_right_when_batches_are_decoded_on_several_threads():
    """Decoding searches batches on 2 threads at once; score counts the repairs of the decoded
    hypotheses itself (postprocess keeps no count), the same as one sentence after the other."""
    from s2s.core.contract.task import DecodeDefaults
    from s2s.plugins.parsing.linearise import delinearise

    task = task_for("vinyals", linearised_pairs("vinyals"))
    task.cfg.constrained = False
    model = untrained_model(task, seed=0)
    sentences = [
        " ".join(WORDS[i % len(WORDS) :][:n]) for i, n in enumerate([3, 5, 2, 7, 4, 6, 1, 8] * 2)
    ]
    settings = DecodeDefaults(beam=2, alpha=0.3, max_len_a=1.0, max_len_b=6)
    state = dict(vars(task))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        hyps = Decoder(model, task, settings, "cpu", 2).generate(sentences, postprocess=False)
        trees = Decoder(model, task, settings, "cpu", 2).generate(sentences)
    finally:
        torch.set_num_threads(threads)
    expected = [delinearise(h, s, "vinyals") for h, s in zip(hyps, sentences)]
    assert trees == [t for t, _ in expected]
    repaired = sum(r for _, r in expected)
    assert repaired > 0  # an untrained model's unconstrained outputs need repairs
    gold = [t for _, t in linearised_pairs("vinyals")][:1] * len(sentences)
    for _ in range(2):  # the count is per call, not carried over
        assert task.score(hyps, gold, sentences).figures["repaired"] == repaired
    assert vars(task) == state


def test_a_wide_beam_gives_each_thread_a_batch_of_one_search_and_the_same_trees(monkeypatch):
    """A batch holds at most one search's rows (ROWS_PER_SEARCH hypotheses on a CPU), so that a
    wide beam over a few sentences still gives each thread a batch of its own; the trees are the
    ones searched on one thread in one batch."""
    from s2s.core.decode import batched
    from s2s.core.decode import search as decoding
    from s2s.core.decode.search import sentences_per_search

    assert sentences_per_search(21, 128, "cpu") == 512 // 21
    assert sentences_per_search(4, 128, "cpu") == 128
    assert sentences_per_search(21, 1024, "cuda") == 1024  # a GPU searches the whole batch
    task = task_for("vinyals", linearised_pairs("vinyals"))
    model = untrained_model(task, seed=0)
    sentences = [" ".join(WORDS[i % len(WORDS) :][:n]) for i, n in enumerate([3, 5, 2, 7, 4, 6])]
    settings = DecodeDefaults(beam=3, alpha=0.3, max_len_a=1.0, max_len_b=6)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = Decoder(model, task, settings, "cpu", 8).generate(sentences)
        sizes = []

        def recorded(model, src, *args):
            sizes.append(src.size(0))
            return decoding.nbest(model, src, *args)

        monkeypatch.setattr(batched, "nbest", recorded)
        monkeypatch.setitem(decoding.ROWS_PER_SEARCH, "cpu", 2 * settings.beam)
        torch.set_num_threads(2)
        split = Decoder(model, task, settings, "cpu", 8).generate(sentences)
    finally:
        torch.set_num_threads(threads)
    assert sorted(sizes) == [2, 2, 2] and split == alone
