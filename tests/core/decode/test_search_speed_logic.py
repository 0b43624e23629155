"""The pieces that make search fast, each against the plain computation it replaces: beam rows
that stay put (few cache copies, none reading a row another writes), the cache moved in place,
sentences leaving the batch, a batch searched in parts, dev search capped by the reference's length."""

import pytest
import torch
from s2s.core.contract.task import DecodeDefaults
from s2s.core.decode.steps import keep_order
from s2s.core.decode.beam import stable_slots
from s2s.core.decode.search import search
from s2s.core.nn.model import DecoderCache, Transformer
from s2s.core.training.validation import LengthCap
from s2s.core.tokenizers import EOS
from test_search import sources, transformer


@pytest.mark.parametrize("seed", range(20))
def test_stable_slots_keep_parents_rows_and_copies_never_overlap(seed):
    g = torch.Generator().manual_seed(seed)
    b, k = 6, 5
    parent = torch.randint(0, k, (b, k), generator=g)
    parent[0] = torch.arange(k)  # every hypothesis has one child: nothing moves
    parent[1] = 2  # all from one parent
    slot = stable_slots(parent)
    for s, p in zip(slot.tolist(), parent.tolist()):
        assert sorted(s) == list(range(k))  # a permutation of the sentence's rows
        firsts = {q: j for j, q in reversed(list(enumerate(p)))}
        for q, j in firsts.items():
            assert s[j] == q  # the first child of each parent stays in its parent's row
        moved = [(s[j], p[j]) for j in range(k) if s[j] != p[j]]
        written, read = {d for d, _ in moved}, {r for _, r in moved}
        assert not written & read and len(moved) == k - len(firsts)
    assert slot[0].tolist() == list(range(k))


def cache_of(n, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(t + 4, 2, 2, n, 3, 5, generator=g)
    return DecoderCache(
        memory_kv=torch.randn(2, 2, n // 2, 3, 7, 5, generator=g),
        memory_mask=torch.ones(n // 2, 1, 1, 7, dtype=torch.bool),
        kv=kv,
        step=t,
    )


@pytest.mark.parametrize("kind", ["stable", "any"])
def test_reorder_cache_moves_rows_as_index_select_does(kind):
    n, t = 8, 6
    g = torch.Generator().manual_seed(1)
    if kind == "stable":  # rows of a sentence from _stable_slots: only some move, in place
        parent = torch.randint(0, 2, (4, 2), generator=g)
        at = torch.empty_like(parent).scatter_(
            1, stable_slots(parent), torch.arange(2).expand(4, 2)
        )
        index = (torch.arange(4)[:, None] * 2 + parent.gather(1, at)).view(-1)
    else:  # a row is read by one copy and written by another: every row moves
        index = torch.tensor([1, 0, 3, 2, 5, 4, 7, 6])
    cache = cache_of(n, t)
    expected = cache.kv[:t, :, :, index].clone()
    Transformer.reorder_cache(cache, index)
    assert torch.equal(cache.kv[:t, :, :, :n], expected)
    assert (cache.spare is None) == (kind == "stable")


def test_sentences_leave_by_filling_their_places_from_the_end():
    done = torch.tensor([False, True, False, True, False, False])
    keep = keep_order(done)
    assert keep.tolist() == [0, 4, 2, 5]  # 1 and 3 leave: the last two take their places
    assert keep_order(torch.tensor([True, False])).tolist() == [1]
    assert keep_order(torch.zeros(3, dtype=torch.bool)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("beam", [1, 3])
def test_a_length_cap_cuts_outputs_at_each_cap_and_changes_nothing_below_it(beam):
    model = transformer()
    src = sources([3, 6, 2, 5], vocab=20)
    free = search(model, src, DecodeDefaults(beam=beam, alpha=0.6, max_len_a=1.0, max_len_b=8))
    lengths = [len(h.tokens) for h in free]
    assert max(lengths) >= 3  # an untrained model writes on: the caps below bite
    caps = torch.tensor([2, 0, 30, 1])
    capped = search(
        model,
        src,
        DecodeDefaults(beam=beam, alpha=0.6, max_len_a=1.0, max_len_b=8),
        constraint=LengthCap(None, caps, 20),
    )
    for h, f, c in zip(capped, free, caps.tolist()):
        assert len(h.tokens) <= c
        if c >= 30:  # (the score may differ in rounding: the batch around it shrinks otherwise)
            assert h.tokens == f.tokens and h.score == pytest.approx(f.score, abs=1e-5)
    # the cap a constraint sees: the tokens left under the cap, not the search's limit
    c = LengthCap(None, torch.tensor([2]), 20)
    state = c.advance(c.initial("cpu"), torch.tensor([5]))
    assert c.allowed(state, torch.tensor([9])).all()
    state = c.advance(state, torch.tensor([5]))
    mask = c.allowed(state, torch.tensor([8]))
    assert mask[0, EOS] and mask.sum() == 1


@pytest.mark.parametrize("beam", [1, 3])
def test_a_batch_searched_in_parts_gives_what_the_whole_batch_gives(beam, monkeypatch):
    """At most ROWS_PER_SEARCH hypotheses at once on a CPU: the parts' outputs, in order, and
    the constraint's rows going with their sentences."""
    from s2s.core.decode import search as decoding
    from test_search import Increasing

    model = transformer()
    src = sources([3, 7, 5, 2, 6, 4, 1], vocab=20)
    whole = search(
        model,
        src,
        DecodeDefaults(beam=beam, alpha=0.6, max_len_a=0.0, max_len_b=4),
        constraint=Increasing(src, 20),
    )
    monkeypatch.setitem(decoding.ROWS_PER_SEARCH, "cpu", 2 * beam)  # two sentences at a time
    parts = search(
        model,
        src,
        DecodeDefaults(beam=beam, alpha=0.6, max_len_a=0.0, max_len_b=4),
        constraint=Increasing(src, 20),
    )
    assert [h.tokens for h in parts] == [h.tokens for h in whole]
    assert [h.score for h in parts] == pytest.approx([h.score for h in whole], abs=1e-5)
    free = search(model, src, DecodeDefaults(beam=beam, alpha=0.6, max_len_a=1.0, max_len_b=3))
    monkeypatch.setitem(decoding.ROWS_PER_SEARCH, "cpu", 10**6)
    assert [h.tokens for h in free] == [
        h.tokens
        for h in search(
            model, src, DecodeDefaults(beam=beam, alpha=0.6, max_len_a=1.0, max_len_b=3)
        )
    ]


def test_decode_batches_by_device_unless_set():
    """decode.max_sentences=0 (the default) means 128 sentences on a CPU and 1,024 on a GPU
    (issue 28 finding 8); a value set is taken as written."""
    from s2s.core.decode.search import sentences_per_batch
    from s2s.core.setup.settings import DecodeConfig

    assert DecodeConfig().max_sentences == 0
    assert (
        sentences_per_batch(0, "cpu") == 128 and sentences_per_batch(0, torch.device("cpu")) == 128
    )
    assert sentences_per_batch(0, "cuda") == 1024 and sentences_per_batch(0, "cuda:1") == 1024
    assert sentences_per_batch(64, "cuda") == 64 and sentences_per_batch(7, "cpu") == 7


def test_top_k_off_the_cpu_is_one_torch_topk():
    """The chunked top-k pays on a CPU only; elsewhere a row's k best are torch.topk's one call."""
    from unittest import mock

    from s2s.core.decode.steps import top_k

    x = mock.MagicMock(shape=(8, 37000))
    x.device.type = "cuda"
    assert top_k(x, 8) is x.topk.return_value
    x.topk.assert_called_once_with(8, dim=1)
    assert not x.amax.called and not x.view.called


def test_a_finished_search_hands_its_cache_memory_to_the_next_in_the_thread():
    """SearchMemory: the next search's cache is written into the memory the last one used (no
    fresh pages to fault in), never into memory a live cache holds, and never into an inference
    tensor outside inference mode (nor the reverse)."""
    from s2s.core.nn.model import SEARCH_MEMORY, SearchMemory

    model, src = transformer(), sources([3, 6, 2, 5], vocab=20)
    settings = DecodeDefaults(beam=3, alpha=0.6, max_len_a=1.0, max_len_b=8)
    first = search(model, src, settings)
    kept = {x.data_ptr() for x in SEARCH_MEMORY.free}
    assert kept and len(SEARCH_MEMORY.free) <= SearchMemory.KEEP
    again = search(model, src, settings)
    assert [h.tokens for h in again] == [h.tokens for h in first]
    assert {x.data_ptr() for x in SEARCH_MEMORY.free} == kept  # taken and given back

    memory = SearchMemory()
    like = torch.zeros(1)
    a = memory.take((4, 5), like)
    memory.give(a)
    b = memory.take((2, 3), like)  # fits in a's memory: a's, as a new view
    assert b.data_ptr() == a.data_ptr() and b.shape == (2, 3)
    c = memory.take((2, 3), like)  # b holds it: fresh memory
    assert c.data_ptr() != b.data_ptr()
    memory.give(b)
    with torch.inference_mode():
        d = memory.take((2, 3), like)
        assert d.data_ptr() != b.data_ptr() and d.is_inference()
        memory.give(d)
    assert not memory.take((2, 3), like).is_inference()
    memory.give(torch.zeros(100))
    memory.give(torch.zeros(200))
    assert [x.numel() for x in memory.free] == [200, 100]  # KEEP, the largest
