"""Decoding beyond the single best: n-best lists, sampling, ensembles and forced prefixes, on
the search itself (the command line's options: tests/cli/test_generate_beyond_best.py)."""

import itertools

import pytest
import torch
from s2s.core.contract.task import DecodeDefaults
from s2s.core.decode.constraints import Prefix, joined
from s2s.core.decode.ensemble import Ensemble
from s2s.core.decode.sampling import Sampling
from s2s.core.decode.search import Wanted, nbest, search
from s2s.core.decode.steps import length_penalty
from s2s.core.tokenizers import EOS

from test_search import ToyModel, log_probs, sources, transformer

SETTINGS = dict(alpha=0.6, max_len_a=1.0, max_len_b=8)


def test_a_wide_beam_finds_the_exact_n_best():
    """A beam as wide as every prefix makes the search exhaustive: its n-best list is the exact
    n best outputs under the length penalty, best first."""
    vocab, max_len, n = 5, 6, 6
    model = ToyModel(vocab, ends_at=2.0)
    src = torch.tensor([[3, 3, EOS], [4, 3, EOS]])
    found = nbest(
        model,
        src,
        DecodeDefaults(beam=2**max_len, alpha=0.6, max_len_a=0.0, max_len_b=max_len),
        Wanted(n=n),
    )
    outputs = [list(y) for k in range(max_len + 1) for y in itertools.product([3, 4], repeat=k)]
    for i, hyps in enumerate(found):
        sums = log_probs(model, src[i : i + 1], outputs)
        scores = [s / length_penalty(len(y) + 1, 0.6) for s, y in zip(sums, outputs)]
        best = sorted(range(len(outputs)), key=scores.__getitem__, reverse=True)[:n]
        assert [h.tokens for h in hyps] == [outputs[b] for b in best]
        assert [h.score for h in hyps] == pytest.approx([scores[b] for b in best], abs=1e-4)


@pytest.mark.parametrize("make", [ToyModel, transformer])
@pytest.mark.parametrize("stop", ["bound", "beam"])
def test_the_first_of_an_n_best_list_is_the_single_best(make, stop):
    model, src = make(), sources([3, 7, 1, 5, 2, 6])
    single = search(model, src, DecodeDefaults(beam=4, stop=stop, **SETTINGS))
    for n in (2, 4):
        found = nbest(model, src, DecodeDefaults(beam=4, **SETTINGS, stop=stop), Wanted(n=n))
        assert [hyps[0].tokens for hyps in found] == [h.tokens for h in single]
        assert [hyps[0].score for hyps in found] == pytest.approx([h.score for h in single])
        for hyps in found:
            assert len(hyps) == n
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
            assert len({tuple(h.tokens) for h in hyps}) == n  # n different outputs


def test_n_must_fit_the_beam():
    with pytest.raises(ValueError, match="between 1 and the beam"):
        nbest(ToyModel(), sources([3]), DecodeDefaults(beam=2, **SETTINGS), Wanted(n=3))


def test_sampling_repeats_for_a_seed_and_differs_for_another():
    model, src = transformer(), sources([3, 7, 1, 5])
    draw = lambda seed, **kw: [  # noqa: E731
        [h.tokens for h in hyps]
        for hyps in nbest(
            model,
            src,
            DecodeDefaults(beam=4, **SETTINGS),
            Wanted(n=4, sampling=Sampling(seed=seed, **kw)),
        )
    ]
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    assert any(len({tuple(t) for t in outs}) > 1 for outs in draw(1))  # samples vary
    greedy = [h.tokens for h in search(model, src, DecodeDefaults(beam=1, **SETTINGS))]
    # the most probable token only: top-k 1, a tiny nucleus, or nearly zero temperature is greedy
    for only_best in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-4)):
        assert [outs[0] for outs in draw(3, **only_best)] == greedy
        assert all(len({tuple(t) for t in outs}) == 1 for outs in draw(3, **only_best))


def test_samples_are_ranked_and_scored_as_the_search_scores():
    model, src = transformer(), sources([4, 2])
    found = nbest(
        model, src, DecodeDefaults(beam=4, **SETTINGS), Wanted(n=3, sampling=Sampling(seed=5))
    )
    for i, hyps in enumerate(found):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        sums = log_probs(model, src[i : i + 1, : int(src[i].ne(0).sum())], [h.tokens for h in hyps])
        lp = [length_penalty(len(h.tokens) + 1, 0.6) for h in hyps]
        assert [h.score for h in hyps] == pytest.approx([s / p for s, p in zip(sums, lp)], abs=1e-4)


def test_sampling_settings_name_what_is_wrong():
    assert Sampling().problem() is None
    assert "temperature 0" in Sampling(temperature=0).problem()
    assert "top-k -1" in Sampling(top_k=-1).problem()
    assert "top-p 1.5" in Sampling(top_p=1.5).problem()


@pytest.mark.parametrize("incremental", [True, False])
def test_an_ensemble_of_a_model_with_itself_is_that_model(incremental):
    model, src = transformer(), sources([3, 7, 1, 5, 2])
    alone = nbest(
        model, src, DecodeDefaults(beam=3, **SETTINGS), Wanted(incremental=incremental, n=2)
    )
    twice = nbest(
        Ensemble([model, model]),
        src,
        DecodeDefaults(beam=3, **SETTINGS),
        Wanted(incremental=incremental, n=2),
    )
    assert [[h.tokens for h in hs] for hs in twice] == [[h.tokens for h in hs] for hs in alone]
    assert [h.score for hs in twice for h in hs] == pytest.approx(
        [h.score for hs in alone for h in hs], abs=1e-4
    )


def test_an_ensemble_averages_probabilities_of_models_of_different_shapes():
    small = transformer()
    torch.manual_seed(7)
    from s2s.core.nn.model import Transformer
    from s2s.core.setup.settings import ModelConfig

    cfg = ModelConfig(layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0, max_positions=40)
    other = Transformer(cfg, 20, 20, shared_vocab=True).eval()
    src, tgt = sources([3, 5]), torch.tensor([[1, 5, 6], [1, 7, 4]])
    both = Ensemble([small.eval(), other])
    mixed = both(src, tgt).exp()
    expected = (small(src, tgt).softmax(-1) + other(src, tgt).softmax(-1)) / 2
    assert torch.allclose(mixed, expected, atol=1e-5)
    assert both.max_positions == 40
    found = [h.tokens for h in search(both, src, DecodeDefaults(beam=3, **SETTINGS))]
    assert found != [
        h.tokens for h in search(small, src, DecodeDefaults(beam=3, **SETTINGS))
    ] or found != [h.tokens for h in search(other, src, DecodeDefaults(beam=3, **SETTINGS))]


@pytest.mark.parametrize("sampling", [None, Sampling(seed=2)])
def test_a_forced_prefix_starts_every_output_and_an_empty_one_changes_nothing(sampling):
    model, src = transformer(), sources([3, 7, 1])
    prefixes = [[5, 6, 7], [], [9]]
    free = nbest(model, src, DecodeDefaults(beam=3, **SETTINGS), Wanted(n=3, sampling=sampling))
    forced = nbest(
        model,
        src,
        DecodeDefaults(beam=3, **SETTINGS),
        Wanted(n=3, sampling=sampling),
        constraint=Prefix(prefixes, 20),
    )
    for prefix, hyps, before in zip(prefixes, forced, free):
        assert all(h.tokens[: len(prefix)] == prefix for h in hyps)
        if not prefix:
            assert [h.tokens for h in hyps] == [h.tokens for h in before]
    if sampling is None:  # no prefix at all: the search's own outputs
        empty = nbest(
            model,
            src,
            DecodeDefaults(beam=3, **SETTINGS),
            Wanted(n=3),
            constraint=Prefix([[], [], []], 20),
        )
        assert [[h.tokens for h in hs] for hs in empty] == [[h.tokens for h in hs] for hs in free]


def test_a_prefix_joins_another_constraint():
    class NoSeven:  # a task's constraint: token 7 never
        def initial(self, device):
            return (torch.zeros(3),)

        def advance(self, state, tokens):
            return state

        def allowed(self, state, remaining):
            mask = torch.ones(state[0].size(0), 20, dtype=torch.bool)
            mask[:, 7] = False
            return mask

        def score(self, state, logp, remaining):
            return logp.masked_fill(~self.allowed(state, remaining), float("-inf"))

    model, src = transformer(), sources([3, 7, 1])
    both = joined(NoSeven(), Prefix([[5], [6, 6], []], 20))
    found = nbest(model, src, DecodeDefaults(beam=3, **SETTINGS), Wanted(n=2), constraint=both)
    for prefix, hyps in zip([[5], [6, 6], []], found):
        assert all(h.tokens[: len(prefix)] == prefix and 7 not in h.tokens for h in hyps)
    assert joined(None, None) is None


def test_samples_follow_the_model_distribution_after_temperature_and_nucleus():
    """One drawn token per output (the length limit is 1): its frequencies over 6,000 draws are
    softmax(logits / T), restricted to the nucleus and renormalised, within 2 points."""

    class Fixed(ToyModel):
        logits = torch.tensor([0.0, 0.0, 0.5, -1.0, 1.5, 1.0, 0.0, -0.5])

        def decode_step(self, tokens, cache):
            return self.logits.expand(tokens.size(0), -1).clone()

    src = sources([2])
    allowed = torch.ones(8, dtype=torch.bool)
    allowed[[0, 1]] = False  # PAD and BOS are never generated
    for temperature, top_p in [(1.0, 1.0), (0.5, 1.0), (1.0, 0.7)]:
        sampling = Sampling(temperature=temperature, top_p=top_p, seed=3)
        (hyps,) = nbest(
            Fixed(),
            src,
            DecodeDefaults(beam=4, alpha=0.6, max_len_a=0.0, max_len_b=1),
            Wanted(n=6000, sampling=sampling),
        )
        counts = torch.bincount(
            torch.tensor([h.tokens[0] if h.tokens else EOS for h in hyps]), minlength=8
        )
        p = torch.softmax(Fixed.logits.masked_fill(~allowed, -torch.inf) / temperature, 0)
        if top_p < 1:
            ranked, order = p.sort(descending=True)
            keep = (ranked.cumsum(0) - ranked) < top_p
            p = torch.zeros_like(p).scatter(0, order[keep], ranked[keep])
            p /= p.sum()
        assert torch.allclose(counts / counts.sum(), p, atol=0.02), (temperature, top_p, counts)
