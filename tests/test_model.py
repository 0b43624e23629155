"""The Transformer: the paper's sizes, masking, padding, weight tying, incremental decoding."""
import pytest
import torch

from s2s.core.settings import ModelConfig
from s2s.core.model import Transformer
from s2s.core.vocab import BOS, PAD

V = 23


def tiny(pre_norm=False, shared=True, src_vocab=V, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(layers=2, d_model=32, d_ff=64, heads=4, dropout=0.1, pre_norm=pre_norm,
                      max_positions=64, **kw)
    return Transformer(cfg, src_vocab, V, shared).eval()


def sentences(lengths, vocab=V):
    """Right-padded batch of random ids, each row ending with EOS (sources) or starting with BOS."""
    rows = [torch.randint(4, vocab, (n,)) for n in lengths]
    out = torch.full((len(rows), max(lengths)), PAD)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@pytest.mark.parametrize("size, d_model, d_ff, heads, paper", [
    ("base", 512, 2048, 8, 65e6), ("big", 1024, 4096, 16, 213e6)])
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
        assert model.out.weight.std().item() == pytest.approx(32 ** -0.5, rel=0.2)
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


@pytest.mark.parametrize("pre_norm", [False, True])
def test_decode_step_equals_full_decode(pre_norm):
    """20 steps (past the cache's first capacity), with beam-like reordering half way."""
    model = tiny(pre_norm=pre_norm)
    B, g, T, t0 = 2, 3, 20, 9
    src = sentences([5, 8])
    memory, src_pad = model.encode(src)
    tgt = sentences([T] * (B * g))
    tgt[:, 0] = BOS
    with torch.inference_mode():
        cache = model.init_cache(memory, src_pad)
        full = model.decode(tgt, memory, src_pad)
        for t in range(t0):
            torch.testing.assert_close(model.decode_step(tgt[:, t], cache), full[:, t], atol=1e-5, rtol=0)
        # rows now continue other rows of the same sentence (sentence-major groups of g)
        index = torch.tensor([2, 2, 0, 4, 3, 3])
        model.reorder_cache(cache, index)
        tgt = torch.cat([tgt[index, :t0], tgt[:, t0:]], dim=1)
        full = model.decode(tgt, memory, src_pad)
        for t in range(t0, T):
            torch.testing.assert_close(model.decode_step(tgt[:, t], cache), full[:, t], atol=1e-5, rtol=0)
    assert cache.step == T


def test_positions_beyond_max_positions_raise():
    model = tiny()
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(sentences([65]))


def test_dropout_zeroes_a_share_p_and_keeps_the_expectation():
    from s2s.core.model import Dropout

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
    from s2s.core.model import Dropout

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
    """bf16 on CPU writes equation 1 out (s2s.core.model.attention); its output and gradients
    agree with the fused fp32 kernel's to bf16 precision, padding and causal masks included."""
    import torch.nn.functional as F

    from s2s.core.model import attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 16, requires_grad=True) for _ in range(3))
    mask = None if causal else (torch.arange(7) < torch.tensor([7, 4, 1])[:, None])[:, None, None, :]
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


def test_initialisation_bounds():
    """W^Q, W^K, W^V Xavier-uniform as one [3d, d] matrix, W^O Xavier, FFN U(+-1/sqrt(fan_in)),
    zero biases, embeddings N(0, d^-0.5) with a zero PAD row: each weight fills its bound."""
    cfg = ModelConfig(layers=1, d_model=64, d_ff=256, heads=4)
    m = Transformer(cfg, 50, 40, shared_vocab=False)
    d, ff = 64, 256
    for attn in (m.encoder[0].self_attn, m.decoder[0].self_attn, m.decoder[0].cross_attn):
        for w in (attn.w_q, attn.w_k, attn.w_v):
            assert w.weight.abs().max() <= (6 / (4 * d)) ** 0.5 and w.weight.abs().max() > 0.9 * (6 / (4 * d)) ** 0.5
        assert 0.9 * (6 / (2 * d)) ** 0.5 < attn.w_o.weight.abs().max() <= (6 / (2 * d)) ** 0.5
    for ffn in (m.encoder[0].ffn, m.decoder[0].ffn):
        assert 0.9 * d ** -0.5 < ffn[0].weight.abs().max() <= d ** -0.5
        assert 0.9 * ff ** -0.5 < ffn[2].weight.abs().max() <= ff ** -0.5
    assert all(p.abs().max() == 0 for n, p in m.named_parameters() if n.endswith("bias") and "norm" not in n)
    assert m.src_embed.weight[PAD].abs().max() == 0
    assert abs(m.src_embed.weight[1:].std().item() - d ** -0.5) < 0.01
