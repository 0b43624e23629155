"""Terminology constraints on the search: every output holds each term of its source, whatever
the beam, n-best or sampling, within the length limit; term files and term matching."""

import pytest
import itertools

import torch
from s2s.core.decode.banks import allocate
from s2s.core.decode.sampling import Sampling
from s2s.core.decode.search import Wanted, nbest, search
from s2s.core.decode.steps import length_penalty
from s2s.core.decode.terminology import (
    Spelling,
    Terms,
    holds_term,
    line_terms,
    placeable,
    read_terms,
    word_glue,
)
from s2s.core.errors import DataError
from s2s.core.contract.task import DecodeDefaults
from s2s.core.tokenizers import EOS

from test_search import ToyModel, log_probs, sources, transformer

SETTINGS = dict(alpha=0.6, max_len_a=1.0, max_len_b=6)


def spelled(lines):
    """Each line's terms, each of one spelling (what `Terms` takes: terms of spellings)."""
    return [[[term] for term in terms] for terms in lines]


def holds(tokens, term):
    n = len(term)
    return any(tokens[i : i + n] == term for i in range(len(tokens) - n + 1))


@pytest.mark.parametrize(
    "beam, n, sampling", [(1, 1, None), (4, 1, None), (4, 4, None), (4, 3, Sampling(seed=1))]
)
def test_every_output_holds_every_term_of_its_source(beam, n, sampling):
    model, src = transformer(), sources([3, 7, 1, 5, 2])
    terms = [[[5, 6]], [], [[9], [11, 12, 13]], [[7, 7]], [[4], [5], [6]]]
    free = nbest(model, src, DecodeDefaults(beam=beam, **SETTINGS), Wanted(n=n, sampling=sampling))
    found = nbest(
        model,
        src,
        DecodeDefaults(beam=beam, **SETTINGS),
        Wanted(n=n, sampling=sampling),
        constraint=Terms(spelled(terms), 20),
    )
    for ts, hyps, before in zip(terms, found, free):
        assert hyps and all(holds(h.tokens, t) for h in hyps for t in ts)
        if not ts:
            assert [h.tokens for h in hyps] == [h.tokens for h in before]
        limit = int(SETTINGS["max_len_a"] * 8 + SETTINGS["max_len_b"])
        assert all(len(h.tokens) <= limit for h in hyps)


def test_terms_that_just_fit_the_length_limit_are_placed():
    """A limit of 4 tokens and terms of 1 + 3: the output is exactly the terms."""
    model, src = transformer(), sources([2])
    (hyp,) = search(
        model,
        src,
        DecodeDefaults(beam=3, alpha=0.6, max_len_a=0.0, max_len_b=4),
        constraint=Terms(spelled([[[9], [11, 12, 13]]]), 20),
    )
    assert len(hyp.tokens) == 4 and holds(hyp.tokens, [9]) and holds(hyp.tokens, [11, 12, 13])


class WordTask:
    """Words as ids, as a task's tokenisation: spaces split, the same ids on both sides."""

    words = {w: i for i, w in enumerate("a b c dog cat Hund Katze big grosser the".split(), 4)}

    def encode_source(self, lines):
        return [[self.words.get(w, 3) for w in line.split()] for line in lines]

    encode_target = encode_source
    tgt_vocab_size = 14

    def decode_target(self, ids):
        names = {i: w for w, i in self.words.items()}
        return " ".join(names.get(i, "<unk>") for i in ids)


def test_terms_are_matched_on_the_tokenisation():
    pairs = [("dog", "Hund"), ("big cat", "grosser Katze"), ("the", "a")]
    found = line_terms(WordTask(), ["the big dog", "a cat big", "big cat"], pairs)
    assert [[t[0] for t in ts] for ts in found] == [["dog", "the"], [], ["big cat"]]
    assert found[2][0][2] == [Spelling((12, 10))]  # grosser Katze: one spelling in words
    limits = DecodeDefaults(max_len_a=0.0, max_len_b=2)
    assert placeable(WordTask(), "the big dog", found[0], limits, 64) == 2
    limits = DecodeDefaults(max_len_a=0.0, max_len_b=1)
    assert placeable(WordTask(), "the big dog", found[0], limits, 64) == 1


def test_term_files_name_the_bad_line(tmp_path):
    good = tmp_path / "terms.tsv"
    good.write_text("dog\tHund\nbig cat\tgrosser Katze\n")
    assert read_terms(good) == [("dog", "Hund"), ("big cat", "grosser Katze")]
    for text, needle in [
        ("dog\tHund\ncat Katze\n", "line 2"),
        ("dog\t\n", "line 1"),
        ("a\tb\tc\n", "line 1"),
        ("", "no terms"),
    ]:
        bad = tmp_path / "bad.tsv"
        bad.write_text(text)
        with pytest.raises(DataError, match=needle):
            read_terms(bad)


def test_terms_join_a_prefix():
    from s2s.core.decode.constraints import Prefix, joined

    model, src = transformer(), sources([3, 5])
    both = joined(Prefix([[4], [8, 8]], 20), Terms(spelled([[[9, 10]], [[6]]]), 20))
    found = nbest(model, src, DecodeDefaults(beam=3, **SETTINGS), Wanted(n=2), constraint=both)
    for prefix, term, hyps in zip([[4], [8, 8]], [[9, 10], [6]], found):
        assert all(h.tokens[: len(prefix)] == prefix and holds(h.tokens, term) for h in hyps)


def test_a_term_is_met_by_any_of_its_spellings():
    """Two spellings of one term (a subword vocabulary's word inside a sentence and at its
    start): every output holds one of them; the shorter one fits where the other would not."""
    model, src = transformer(), sources([3, 6, 2])
    terms = [[[[5, 6], [7]]], [[[9, 9, 9], [8, 8]], [[4]]], [[[11, 12], [13]]]]
    found = nbest(
        model, src, DecodeDefaults(beam=4, **SETTINGS), Wanted(n=4), constraint=Terms(terms, 20)
    )
    for line, hyps in zip(terms, found):
        for h in hyps:
            assert all(any(holds(h.tokens, x) for x in spellings) for spellings in line)
    # a limit of 1 token: only the one-token spelling fits, and it is written
    (tight,) = search(
        model,
        sources([2]),
        DecodeDefaults(beam=3, alpha=0.6, max_len_a=0.0, max_len_b=1),
        constraint=Terms([[[[5, 6], [7]]]], 20),
    )
    assert tight.tokens == [7]


def test_a_first_only_spelling_begins_the_output_or_not_at_all():
    """A word's spelling at the start of a sentence (no space before it, in a subword
    vocabulary) meets its term only as the output's first tokens, never glued to a word."""
    model, src = transformer(), sources([3, 6, 2, 5])
    start = Spelling((7, 8), first=True)
    found = nbest(
        model,
        src,
        DecodeDefaults(beam=4, **SETTINGS),
        Wanted(n=4),
        constraint=Terms([[[[5], start]]] * 4, 20),
    )
    for hyps in found:
        for h in hyps:
            assert holds(h.tokens, [5]) or h.tokens[:2] == [7, 8]
    forced = nbest(
        model,
        src,
        DecodeDefaults(beam=4, **SETTINGS),
        Wanted(n=4),
        constraint=Terms([[[start]]] * 4, 20),
    )
    assert all(h.tokens[:2] == [7, 8] for hyps in forced for h in hyps)


def test_the_spelling_inside_a_sentence_does_not_begin_one():
    """The spelling after a space of a term that has one for the start (" Hund" beside
    "Hund") does not meet the term as the output's first tokens: there it would write a
    leading space."""
    model, src = transformer(), sources([3, 6, 2, 5])
    terms = Terms([[[[5], Spelling((7,), first=True)]]] * 4, 20)
    found = nbest(model, src, DecodeDefaults(beam=4, **SETTINGS), Wanted(n=4), constraint=terms)
    for hyps in found:
        assert all(holds(h.tokens[1:], [5]) or h.tokens[0] == 7 for h in hyps)
    state = terms.initial("cpu")
    assert terms.met(state, torch.tensor([[5, 7]] * 4)).tolist() == [[0, 1]] * 4


def test_scores_are_the_models_own():
    """No bonus: the score of an output with terms is its log-probability over the length
    penalty, as without terms."""
    model, src = transformer(), sources([3, 7, 5])
    terms = [[[5, 6]], [[9], [11, 12, 13]], [[7, 7]]]
    found = nbest(
        model, src, DecodeDefaults(beam=4, **SETTINGS), Wanted(n=4), Terms(spelled(terms), 20)
    )
    for i, hyps in enumerate(found):
        sums = log_probs(model, src[i : i + 1], [h.tokens for h in hyps])
        for h, total in zip(hyps, sums):
            assert h.score == pytest.approx(
                total / length_penalty(len(h.tokens) + 1, 0.6), abs=1e-4
            )


@pytest.mark.parametrize("term", [[4, 3], [3, 3, 4]])
def test_a_wide_beam_finds_the_best_output_that_holds_the_terms(term):
    """A beam as wide as every prefix: the output is the best of those holding the term."""
    vocab, max_len = 5, 6
    model = ToyModel(vocab, ends_at=2.0)
    src = torch.tensor([[3, 3, EOS], [4, 3, EOS]])
    settings = DecodeDefaults(beam=2**max_len, alpha=0.6, max_len_a=0.0, max_len_b=max_len)
    hyps = search(model, src, settings, Terms(spelled([[term]] * 2), vocab))
    outputs = [list(y) for n in range(max_len + 1) for y in itertools.product([3, 4], repeat=n)]
    outputs = [y for y in outputs if holds(y, term)]
    for i, hyp in enumerate(hyps):
        sums = log_probs(model, src[i : i + 1], outputs)
        scores = [s / length_penalty(len(y) + 1, 0.6) for s, y in zip(sums, outputs)]
        best = max(range(len(outputs)), key=scores.__getitem__)
        assert hyp.tokens == outputs[best]
        assert hyp.score == pytest.approx(scores[best], abs=1e-4)


def test_a_bank_counts_the_terms_met():
    terms = Terms(spelled([[[5, 6], [9]]]), 20)
    state = terms.initial("cpu")
    tokens = torch.tensor([[5, 6, 9, 7]])
    assert terms.met(state, tokens).tolist() == [[0, 0, 1, 0]]
    state = terms.advance(state, torch.tensor([5]))  # the first term begun: not yet met
    assert terms.met(state, tokens).tolist() == [[0, 1, 1, 0]]
    state = terms.advance(state, torch.tensor([7]))  # abandoned: 6 no longer completes it
    assert terms.met(state, tokens).tolist() == [[0, 0, 1, 0]]


class Sevens:
    """A stand-in banked constraint: token 7 meets it, nothing else does."""

    def candidates(self, state):
        return torch.full((state[0].size(0), 1), 7)

    def met(self, state, tokens):
        return tokens.eq(7).long()


def test_the_beam_is_dealt_out_bank_by_bank():
    """Each bank's best first, then each bank's second best, a rank's higher score first: a
    candidate that meets the constraint is taken second, however low its score."""
    k, V = 2, 10
    total = torch.full((1, k * V), -torch.inf)
    total[0, :6] = torch.tensor([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0])
    total[0, 7], total[0, V + 7] = -50.0, -40.0  # token 7 from either row: bank 1
    score, index = total.topk(2 * k)
    state = (torch.zeros(k, 1),)
    score, index, key = allocate(Sevens(), state, total, score, index, k)
    assert index[0, :4].tolist() == [0, V + 7, 1, 7]
    assert score[0, :4].tolist() == [-1.0, -40.0, -2.0, -50.0]
    assert key[0].isfinite().sum() == 6  # 4 best, the row's best (token 0, once), two 7s


def test_an_ensemble_places_the_terms():
    from s2s.core.decode.ensemble import Ensemble

    second = transformer()
    with torch.no_grad():
        for p in second.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model, src = Ensemble([transformer(), second]), sources([3, 7, 5])
    terms = [[[5, 6]], [[9], [11, 12, 13]], []]
    found = nbest(
        model, src, DecodeDefaults(beam=4, **SETTINGS), Wanted(n=2), Terms(spelled(terms), 20)
    )
    for ts, hyps in zip(terms, found):
        assert len(hyps) == 2 and all(holds(h.tokens, t) for h in hyps for t in ts)


def test_a_source_term_counts_only_as_whole_words():
    """At the start of a line or after a space, and up to a word's end: `cat` is not in
    "catalog", `bike` not in "motorbike", `dog` not in "hotdog"; punctuation ends a word."""
    for line, term, held in [
        ("a catalog of cats", "cat", False),
        ("catalog", "cat", False),
        ("a motorbike", "bike", False),
        ("hotdog stand", "dog", False),
        ("the cat.", "cat", True),
        ("cat", "cat", True),
        ("a big  dog runs", "big dog", True),
        ("a bigdog", "big dog", False),
        ("the dog's bowl", "dog", True),
        ("U.S. trade", "U.S.", True),
    ]:
        assert holds_term(line, term) == held, (line, term)
    pairs = [("cat", "Katze"), ("bike", "Fahrrad"), ("dog", "Hund")]
    lines = ["the catalog", "a motorbike", "a hotdog", "a cat, a bike and a dog"]
    found = line_terms(WordTask(), lines, pairs)
    assert [[t[0] for t in ts] for ts in found] == [[], [], [], ["cat", "bike", "dog"]]


def test_a_real_subword_vocabulary_is_matched_as_words():
    """With a byte-level BPE vocabulary the spelling "cat" is the start of "catalog" too: the
    line is matched as text, so it is not taken; the target side knows which pieces continue
    a word (`word_glue`)."""
    from s2s.core.tokenizers.subwords import Subwords

    text = ["a catalog of the cats", "the cat sees a motorbike", "Katzen und eine Katze"] * 20
    vocab = Subwords.train([text], 300)

    class BPETask:
        tgt_vocab_size = len(vocab)
        encode_source = encode_target = staticmethod(vocab.encode)
        decode_target = staticmethod(vocab.decode)

    task = BPETask()
    found = line_terms(task, ["a catalog", "catalog", "the cat sees"], [("cat", "Katze")])
    assert [len(ts) for ts in found] == [0, 0, 1]
    glue = word_glue(task)
    assert word_glue(task) is glue  # once a task
    (inside,) = task.encode_target([" Katze"])
    pieces = {vocab.decode([i]): bool(glue[i]) for i in range(4, len(vocab))}
    assert pieces["n"] and pieces["e"] and not pieces["."] and not pieces[","]
    assert not any(glued for piece, glued in pieces.items() if piece.startswith(" "))
    after = vocab.encode([" Katzen"])[0]
    assert after[: len(inside)] == inside and glue[after[len(inside)]]  # Katze + n: glued


def test_a_term_followed_by_a_piece_of_its_word_is_not_met():
    """[5] then 9 (a token that continues the word: "Katze" + "n") has not met the term; the
    end, or a token that begins a word, does."""
    glue = torch.zeros(20, dtype=torch.bool)
    glue[9] = True
    terms = Terms(spelled([[[5]]] * 3), 20, glue)
    state = terms.initial("cpu")
    state = terms.advance(state, torch.tensor([4, 4, 4]))
    state = terms.advance(state, torch.tensor([5, 5, 5]))
    assert terms.met(state, torch.tensor([[9, 6, EOS]] * 3)).tolist() == [[0, 1, 1]] * 3
    allowed = terms.allowed(state, torch.tensor([5, 5, 5]))
    assert allowed[:, EOS].all()  # the end closes the word
    after = terms.advance(state, torch.tensor([9, 6, 5]))
    assert terms.allowed(after, torch.tensor([5, 5, 5]))[:, EOS].tolist() == [False, True, True]
    # with one token left after [5], a glued token would leave no room to write the term again
    tight = terms.allowed(state, torch.tensor([1, 1, 1]))
    assert not tight[:, 9].any() and tight[:, 6].all()
    model, src = transformer(), sources([3, 7, 1, 5])
    found = nbest(model, src, DecodeDefaults(beam=4, **SETTINGS), Wanted(n=4),
                  Terms(spelled([[[5]]] * 4), 20, glue))  # fmt: skip
    for hyps in found:
        for h in hyps:
            y = h.tokens + [EOS]
            assert any(y[i] == 5 and y[i + 1] != 9 for i in range(len(y) - 1)), y


def brute_holds(tokens, ids):
    return any(tokens[i : i + len(ids)] == list(ids) for i in range(len(tokens) - len(ids) + 1))


def test_the_tracker_follows_the_longest_beginning_after_a_mismatch():
    """Knuth-Morris-Pratt: after any output, a term is met exactly where it occurs in it (`a a
    b` in "a a a b"); once met, the end is allowed."""
    rng = torch.Generator().manual_seed(0)
    spellings = [(4, 4, 5), (4, 5, 4, 4), (4, 4, 4), (5, 4, 5, 4, 4), (4,), (4, 5, 4, 5, 5)]
    for ids in spellings:
        terms = Terms(spelled([[list(ids)]] * 64), 8)
        outputs = torch.randint(4, 6, (64, 12), generator=rng)
        state = terms.initial("cpu")
        for t in range(outputs.size(1)):
            state = terms.advance(state, outputs[:, t])
            got = terms.met(state, torch.full((64, 1), EOS))[:, 0].tolist()
            want = [brute_holds(row[: t + 1], ids) for row in outputs.tolist()]
            assert got == want, (ids, t)
            allowed = terms.allowed(state, torch.full((64,), 20))
            assert allowed[:, EOS].tolist() == want
    terms = Terms(spelled([[[4, 4, 5]]]), 8)
    state = terms.initial("cpu")
    for token in [4, 4, 4, 5]:
        state = terms.advance(state, torch.tensor([token]))
    assert terms.allowed(state, torch.tensor([3]))[0, EOS]


@pytest.mark.parametrize("term", [[3, 3, 4], [3, 4, 3, 3], [4, 4, 4, 3]])
def test_overlapping_terms_are_written_once(term):
    """A model that writes 3 3 3 4 (or the like) by itself: the term inside it is seen, so the
    output is the model's own, not the term written again after it."""
    vocab, max_len = 5, 6
    model = ToyModel(vocab, ends_at=2.0)
    src = torch.tensor([[3, 3, EOS], [4, 3, EOS]])
    settings = DecodeDefaults(beam=2**max_len, alpha=0.6, max_len_a=0.0, max_len_b=max_len)
    hyps = search(model, src, settings, Terms(spelled([[term]] * 2), vocab))
    outputs = [list(y) for n in range(max_len + 1) for y in itertools.product([3, 4], repeat=n)]
    outputs = [y for y in outputs if holds(y, term)]
    for i, hyp in enumerate(hyps):
        sums = log_probs(model, src[i : i + 1], outputs)
        scores = [s / length_penalty(len(y) + 1, 0.6) for s, y in zip(sums, outputs)]
        best = max(range(len(outputs)), key=scores.__getitem__)
        assert hyp.tokens == outputs[best]


def test_an_ending_candidate_takes_no_rank_in_its_bank():
    """Bank 0's best candidate ends (EOS): it joins the finished outputs, and bank 0's best
    live candidate still gets bank 0's place, not the second candidate of bank 1."""
    k, V = 2, 10
    total = torch.full((1, k * V), -torch.inf)
    total[0, EOS], total[0, 4], total[0, 7] = -1.0, -5.0, -2.0  # row 0: EOS best
    total[0, V + 7] = -3.0  # row 1: token 7
    score, index = total.topk(2 * k)
    state = (torch.zeros(k, 1),)
    score, index, key = allocate(Sevens(), state, total, score, index, k)
    ends = (index % V).eq(EOS)
    live = torch.where(ends, -torch.inf, key).topk(k, dim=1).indices
    assert sorted(index[0, live[0]].tolist()) == [4, 7]  # one of each bank
