"""The Transformer: the paper's sizes, masking, padding, weight tying, incremental decoding."""

import pytest
import torch
from s2s.core.nn.model import Transformer
from s2s.core.setup.settings import ModelConfig
from s2s.core.tokenizers import BOS, PAD

V = 23


def tiny(pre_norm=False, shared=True, src_vocab=V, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(
        **{
            "layers": 2,
            "d_model": 32,
            "d_ff": 64,
            "heads": 4,
            "dropout": 0.1,
            "pre_norm": pre_norm,
            "max_positions": 64,
            **kw,
        }
    )
    return Transformer(cfg, src_vocab, V, shared).eval()


def sentences(lengths, vocab=V):
    """Right-padded batch of random ids, each row ending with EOS (sources) or starting with BOS."""
    rows = [torch.randint(4, vocab, (n,)) for n in lengths]
    out = torch.full((len(rows), max(lengths)), PAD)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@pytest.mark.parametrize(
    "size, d_model, d_ff, heads, paper",
    [("base", 512, 2048, 8, 65e6), ("big", 1024, 4096, 16, 213e6)],
)
def test_parameter_count_matches_paper(size, d_model, d_ff, heads, paper):
    cfg = ModelConfig(layers=6, d_model=d_model, d_ff=d_ff, heads=heads)
    with torch.device("meta"):
        model = Transformer(cfg, 37000, 37000, shared_vocab=True)
    n = model.num_parameters()
    assert abs(n - paper) / paper < 0.05, f"{size}: {n:,} parameters"


@pytest.mark.parametrize("shared,tie", [(True, None), (False, True), (False, None), (False, False)])
def test_tied_weights_are_one_tensor(shared, tie):
    """Tied by default with a shared vocabulary only; model.tie_output decides otherwise."""
    model = tiny(shared=shared, src_vocab=V if shared else 17, tie_output=tie)
    tied = shared if tie is None else tie
    assert (model.out.weight is model.tgt_embed.weight) == tied
    assert (model.out.weight.data_ptr() == model.tgt_embed.weight.data_ptr()) == tied
    assert (model.src_embed.weight is model.tgt_embed.weight) == shared
    if not tied:
        assert model.out.weight.std().item() == pytest.approx(32**-0.5, rel=0.2)
    unique = {p.data_ptr(): p.numel() for p in model.state_dict().values()}
    assert model.num_parameters() == sum(unique.values())
    assert model.tgt_embed.weight[PAD].abs().sum() == 0


def test_shared_vocab_needs_equal_sizes():
    with pytest.raises(AssertionError):
        tiny(shared=True, src_vocab=V + 1)


def test_decoder_is_causal():
    model = tiny()
    src, tgt = sentences([6, 4]), sentences([7, 7])
    a = model(src, tgt)
    tgt[:, 4:] = torch.randint(4, V, (2, 3))
    b = model(src, tgt)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("pre_norm", [False, True])
def test_padding_does_not_change_results(pre_norm):
    model = tiny(pre_norm=pre_norm)
    src, tgt = sentences([4, 9]), sentences([3, 8])
    memory, src_pad = model.encode(src)
    alone_memory, _ = model.encode(src[:1, :4])
    torch.testing.assert_close(memory[:1, :4], alone_memory, atol=1e-5, rtol=1e-5)
    batched = model.decode(tgt, memory, src_pad)
    alone = model(src[:1, :4], tgt[:1, :3])
    torch.testing.assert_close(batched[:1, :3], alone, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(batched).all()


def test_all_pad_row_gives_no_nan():
    model = tiny()
    src = sentences([5, 5])
    src[1] = PAD
    assert torch.isfinite(model(src, sentences([3, 3]))).all()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"pre_norm": True},
        {"d_k": 5, "d_v": 11},
        {"d_k": 12, "d_v": 3},
        {"d_k": 16, "d_v": 16},
        {"positions": "learned"},
        {"encoder_layers": 3, "decoder_layers": 1},
    ],
    ids=[
        "post_norm",
        "pre_norm",
        "d_k<d_v",
        "d_k>d_v",
        "wide_heads",
        "learned_positions",
        "depths",
    ],  # fmt: skip
)
@pytest.mark.parametrize("in_order", [False, True], ids=["products", "cache_in_order"])
def test_decode_step_equals_full_decode(kw, in_order, monkeypatch):
    """20 steps (past the cache's first capacity), with beam-like reordering half way; heads of
    d_k, d_v other than d_model / h (the cache pads the narrower) and learned positions too;
    with the self-attention cache read in order from the first step (as once it is long and
    outgrows the CPU's cache: here a last-level cache of 0 bytes, from 0 positions on)."""
    from s2s.core.nn import attention as module

    if in_order:
        monkeypatch.setattr(module, "cpu_last_level_cache", lambda: 0)
        monkeypatch.setattr(module, "IN_ORDER_AFTER", 0)
    model = tiny(**kw)
    B, g, T, t0 = 2, 3, 20, 9
    src = sentences([5, 8])
    memory, src_pad = model.encode(src)
    tgt = sentences([T] * (B * g))
    tgt[:, 0] = BOS
    with torch.inference_mode():
        cache = model.init_cache(memory, src_pad)
        full = model.decode(tgt, memory, src_pad)
        for t in range(t0):
            torch.testing.assert_close(
                model.decode_step(tgt[:, t], cache), full[:, t], atol=1e-5, rtol=0
            )
        # rows now continue other rows of the same sentence (sentence-major groups of g)
        index = torch.tensor([2, 2, 0, 4, 3, 3])
        model.reorder_cache(cache, index)
        tgt = torch.cat([tgt[index, :t0], tgt[:, t0:]], dim=1)
        full = model.decode(tgt, memory, src_pad)
        for t in range(t0, T):
            torch.testing.assert_close(
                model.decode_step(tgt[:, t], cache), full[:, t], atol=1e-5, rtol=0
            )
    assert cache.step == T


def test_positions_beyond_max_positions_raise():
    model = tiny()
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(sentences([65]))


def test_dropout_zeroes_a_share_p_and_keeps_the_expectation():
    from s2s.core.nn.model import Dropout

    torch.manual_seed(0)
    drop = Dropout(0.1).train()
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.ones(200, 501, dtype=dtype)
        y = drop(x)
        assert y.dtype == dtype and abs((y == 0).float().mean().item() - 0.1) < 0.005
        assert abs(y.float().mean().item() - 1.0) < 0.01
    assert torch.equal(drop.eval()(x), x)


def test_residual_dropout_is_one_mask():
    """x + Dropout(y) drops y's values with the same mask as Dropout(y): equal draws, equal results."""
    from s2s.core.nn.model import Dropout

    drop = Dropout(0.3).train()
    x, y = torch.randn(50, 64), torch.randn(50, 64)
    torch.manual_seed(1)
    fused = drop.add(x, y)
    torch.manual_seed(1)
    assert torch.allclose(fused, x + drop(y))
    assert 0.25 < (fused == x).float().mean().item() < 0.35
    assert torch.equal(drop.eval().add(x, y), x + y)


@pytest.mark.parametrize("causal", [False, True])
def test_bf16_cpu_attention_matches_the_fused_kernel(causal):
    """bf16 on CPU writes equation 1 out (s2s.core.nn.attention.attention); its output and gradients
    agree with the fused fp32 kernel's to bf16 precision, padding and causal masks included."""
    import torch.nn.functional as F
    from s2s.core.nn.attention import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16, requires_grad=True) for _ in range(3))
    mask = (
        None if causal else (torch.arange(7) < torch.tensor([7, 4, 1])[:, None])[:, None, None, :]
    )
    g = torch.randn(3, 4, 7, 16)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    out = attention(*low, mask, causal, 0.0)
    grads = torch.autograd.grad(out, low, g.bfloat16())
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 0.05
    for a, b in zip(grads, ref_grads):
        assert (a.float() - b).abs().max() < 0.05 * b.abs().max()
    with torch.no_grad():  # no gradient wanted (search, validation): the fused kernel, in bf16
        fused = attention(*low, mask, causal, 0.0)
    assert fused.dtype == torch.bfloat16 and (fused.float() - ref).abs().max() < 0.05


@pytest.mark.parametrize("amx", [True, False])
def test_bf16_search_attention_takes_the_fused_kernel_only_on_matrix_units(monkeypatch, amx):
    """Without a gradient, bf16 attention on a CPU takes torch's fused kernel where the CPU has
    AMX and writes equation 1 out on one without (where the fused kernel is the slower one);
    causal fp32 takes the fused kernel. Both give the same output to bf16 precision."""
    import torch.nn.functional as F
    from s2s.core.nn import attention as module

    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(module, "cpu_has_bf16_matrix_units", lambda: amx)
    monkeypatch.setattr(
        module.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k)
    )
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    with torch.no_grad():
        ref = module.attention(q, k, v, None, True, 0.0)
        assert len(calls) == 1  # fp32
        out = module.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, True, 0.0)
    assert len(calls) == (2 if amx else 1)
    assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.05


def test_fp32_search_attention_on_a_cpu_is_equation_1_in_batched_products(monkeypatch):
    """fp32 attention on a CPU without a causal mask and without a gradient (search's steps and
    its encoder) writes equation 1 out as batched products, over a key mask too; causal or
    with a gradient it takes the fused kernel. The outputs agree to fp32 rounding."""
    import torch.nn.functional as F
    from s2s.core.nn import attention as module

    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(
        module.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k)
    )
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8) for _ in range(3))
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1, ..., 3:] = False
    with torch.no_grad():
        out = module.attention(q, k, v, mask, False, 0.0)
        assert not calls
        module.attention(q, k, v, None, True, 0.0)
        assert len(calls) == 1
    module.attention(q.requires_grad_(), k, v, mask, False, 0.0)
    assert len(calls) == 2
    torch.testing.assert_close(out, fused(q.detach(), k, v, attn_mask=mask), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("d_v", [16, 8, 24])
@pytest.mark.parametrize("T", [1, 8, 13])
def test_attention_in_order_is_equation_1(T, d_v):
    """One query a row over position-major keys and values, read a few positions at a time
    (a last block shorter than the others too), equals equation 1's batched products."""
    from s2s.core.nn.attention import attention, attention_in_order

    torch.manual_seed(0)
    R, d = 6, 16  # values as wide as keys, narrower or wider (Table 3, rows A and B)
    q, k, v = torch.randn(R, d), torch.randn(T, R, d), torch.randn(T, R, d_v)
    ref = attention(
        q[:, None, None], k.permute(1, 0, 2)[:, None], v.permute(1, 0, 2)[:, None], None, False, 0.0
    )
    for positions in (1, 3, 8, None):  # None: blocks of about 4 MiB
        out = attention_in_order(q, k, v, positions)
        torch.testing.assert_close(out, ref.view(R, d_v), atol=1e-6, rtol=1e-5)


def test_initialisation_bounds():
    """W^Q, W^K, W^V Xavier-uniform as one [3d, d] matrix, W^O Xavier, FFN U(+-1/sqrt(fan_in)),
    zero biases, embeddings N(0, d^-0.5) with a zero PAD row: each weight fills its bound."""
    cfg = ModelConfig(layers=1, d_model=64, d_ff=256, heads=4)
    m = Transformer(cfg, 50, 40, shared_vocab=False)
    d, ff = 64, 256
    for attn in (m.encoder[0].self_attn, m.decoder[0].self_attn, m.decoder[0].cross_attn):
        for w in (attn.w_q, attn.w_k, attn.w_v):
            assert (
                w.weight.abs().max() <= (6 / (4 * d)) ** 0.5
                and w.weight.abs().max() > 0.9 * (6 / (4 * d)) ** 0.5
            )
        assert 0.9 * (6 / (2 * d)) ** 0.5 < attn.w_o.weight.abs().max() <= (6 / (2 * d)) ** 0.5
    for ffn in (m.encoder[0].ffn, m.decoder[0].ffn):
        assert 0.9 * d**-0.5 < ffn[0].weight.abs().max() <= d**-0.5
        assert 0.9 * ff**-0.5 < ffn[2].weight.abs().max() <= ff**-0.5
    assert all(
        p.abs().max() == 0
        for n, p in m.named_parameters()
        if n.endswith("bias") and "norm" not in n
    )
    assert m.src_embed.weight[PAD].abs().max() == 0
    assert abs(m.src_embed.weight[1:].std().item() - d**-0.5) < 0.01


def test_depths_of_their_own():
    """model.layers sets both stacks' depth; model.encoder_layers / decoder_layers each its
    own."""
    assert (len(tiny().encoder), len(tiny().decoder)) == (2, 2)
    model = tiny(encoder_layers=4, decoder_layers=1)
    assert (len(model.encoder), len(model.decoder)) == (4, 1)
    model = tiny(layers=3, decoder_layers=1)
    assert (len(model.encoder), len(model.decoder)) == (3, 1)


def test_default_heads_keep_the_parameter_names_and_shapes():
    """d_k = d_v = d_model / h, unset or given, is the model of before: same names, shapes, values."""
    unset, given = tiny().state_dict(), tiny(d_k=8, d_v=8).state_dict()
    assert list(unset) == list(given) and all(torch.equal(unset[k], given[k]) for k in unset)
    assert "pos_embed.weight" not in unset and not any(k.endswith("pe") for k in unset)


def test_head_dimensions_and_learned_positions_shape_the_parameters():
    """Q, K: d_model -> h d_k; V: d_model -> h d_v; O: h d_v -> d_model (Table 3, rows A, B);
    learned positions (row E): a [max_positions, d_model] parameter, N(0, d_model^-0.5)."""
    model = tiny(d_k=5, d_v=11, positions="learned")
    for attn in (model.encoder[0].self_attn, model.decoder[1].cross_attn):
        assert attn.w_q.weight.shape == attn.w_k.weight.shape == (4 * 5, 32)
        assert attn.w_v.weight.shape == (4 * 11, 32) and attn.w_o.weight.shape == (32, 4 * 11)
        bound = (6 / (32 + 2 * 20 + 44)) ** 0.5  # Xavier over [W^Q; W^K; W^V]
        assert all(
            0.9 * bound < w.weight.abs().max() <= bound for w in (attn.w_q, attn.w_k, attn.w_v)
        )
    state = model.state_dict()
    assert state["pos_embed.weight"].shape == (64, 32)
    assert abs(state["pos_embed.weight"].std().item() - 32**-0.5) < 0.02
    assert model.position_table() is model.pos_embed.weight and model.pe.numel() == 0
    src, tgt = sentences([5, 3]), sentences([4, 6])
    model.train()(src, tgt, tgt, 0.1)[0].backward()
    assert (
        model.pos_embed.weight.grad[:6].abs().sum() > 0
        and model.pos_embed.weight.grad[6:].abs().sum() == 0
    )
    heads_of_one = tiny(
        heads=3, d_k=7, d_v=7
    )  # heads need not divide d_model when d_k and d_v are given
    assert heads_of_one(src, tgt).shape == (2, 6, V)


def test_learned_positions_in_bf16_keep_an_fp32_table_and_gradient():
    from s2s.core.nn.precision import LowPrecision

    model = tiny(positions="learned").train()
    src, tgt = sentences([5, 3]), sentences([4, 6])
    loss = LowPrecision(model)(src, tgt, tgt, 0.1)[0]
    loss.float().backward()
    assert model.pos_embed.weight.dtype == model.pos_embed.weight.grad.dtype == torch.float32
    assert model.pe.dtype == torch.float32


@pytest.mark.parametrize(
    "kw", [{}, {"d_k": 5, "d_v": 11}, {"encoder_layers": 3}, {"decoder_layers": 1}]
)
def test_flops_count_the_products_of_a_forward_pass(kw):
    """Transformer.flops against torch's FLOP counter on one pair (no padding), attention written
    out (return_attention: the counter misses some fused kernels), where all T^2 query-key pairs of
    the decoder's causal self-attention are multiplied and flops counts T (T + 1) / 2; with d_k,
    d_v other than d_model / h too."""
    from torch.utils.flop_counter import FlopCounterMode

    model = tiny(**kw)
    S, T = 9, 7
    with FlopCounterMode(display=False) as counter:
        model(sentences([S]), sentences([T]), return_attention=True)
    attn = model.encoder[0].self_attn
    masked = len(model.decoder) * 2 * attn.h * (attn.d_k + attn.d_v) * T * (T - 1) / 2
    assert model.flops([S], [T], backward=False) + masked == counter.get_total_flops()


def test_attention_weights_come_from_the_forward_pass():
    """return_attention: the same logits, and [layer][B, h, queries, keys] distributions: padded
    keys and the decoder's future get 0, every row sums to 1; nothing is kept afterwards."""
    model = tiny(d_k=5, d_v=11)
    src, tgt = sentences([6, 4]), sentences([5, 7])
    logits, weights = model(src, tgt, return_attention=True)
    torch.testing.assert_close(logits, model(src, tgt), atol=1e-5, rtol=1e-5)
    assert [len(w) for w in weights.kinds().values()] == [2, 2, 2]
    assert weights.encoder[0].shape == (2, 4, 6, 6) and weights.decoder[1].shape == (2, 4, 7, 7)
    assert weights.cross[1].shape == (2, 4, 7, 6)
    for per_layer in weights.kinds().values():
        for w in per_layer:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert (
        weights.encoder[0][1, :, :, 4:].abs().max() == 0
        and weights.cross[0][1, :, :, 4:].abs().max() == 0
    )
    assert torch.equal(weights.decoder[0].triu(1), torch.zeros(2, 4, 7, 7))
    assert all(m.recorded is None for m in model.modules() if hasattr(m, "recorded"))


def test_attention_weights_unfold_beam_rows():
    """Queries of g hypotheses folded onto one sentence's keys come back one row each."""
    from s2s.core.nn.attention import MultiHeadAttention

    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, 0.0, d_k=3, d_v=5).eval()
    x, memory = torch.randn(6, 4, 16), torch.randn(2, 7, 16)  # g = 3 rows per sentence
    attn.recorded = []
    folded = attn(x, *attn.keys_values(memory))
    (w,) = attn.recorded
    assert w.shape == (6, 2, 4, 7)
    for r in range(6):
        attn.recorded = []
        alone = attn(x[r : r + 1], *(t[r // 3 : r // 3 + 1] for t in attn.keys_values(memory)))
        torch.testing.assert_close(attn.recorded[0][0], w[r])
        torch.testing.assert_close(alone[0], folded[r], atol=1e-5, rtol=1e-5)


def test_offset_sinusoids_are_fairseqs_table_past_the_padding_index():
    """model.positions=offset_sinusoid: position t adds row padding_idx + 1 + t of fairseq's
    [sin | cos] table (M2M100's, NLLB-200's), its frequencies 10000^(-i / (d/2 - 1))."""
    import math

    model = tiny(positions="offset_sinusoid", dropout=0.0)
    d, half = 32, 16
    t = torch.arange(64, dtype=torch.float)[:, None] + 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
    expected = torch.cat([torch.sin(t * freq), torch.cos(t * freq)], dim=1)
    assert torch.equal(model.position_table(), expected) and model.pe.shape == (64, d)


def test_embeddings_unscaled_with_scale_embedding_false():
    scaled, plain = tiny(dropout=0.0), tiny(dropout=0.0, scale_embedding=False)
    tokens = sentences([5])
    emb = scaled.src_embed(tokens)
    pe = scaled.position_table()[:5]
    torch.testing.assert_close(scaled.embed(scaled.src_embed, tokens), emb * 32**0.5 + pe)
    torch.testing.assert_close(plain.embed(plain.src_embed, tokens), emb + pe)
