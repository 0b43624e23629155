"""The options an imported model needs (docs/pretrained.md): a bias on the pre-softmax projection,
-inf where the model never writes an id, swish, and the loss over them."""

import torch
import torch.nn.functional as F

from s2s.core.nn.loss import label_smoothed_loss
from s2s.core.nn.model import Transformer
from s2s.core.setup.settings import ModelConfig
from s2s.core.tokenizers import PAD


def reference(h, w, b, target, eps, allowed):
    """Label smoothing over the allowed classes only, written out."""
    z = (h @ w.t() + b)[:, allowed]
    logp = torch.log_softmax(z, -1)
    keep = target.ne(PAD)
    column = {int(c): i for i, c in enumerate(allowed)}
    t = torch.tensor([column.get(int(x), 0) for x in target])
    nll = -logp.gather(1, t[:, None]).squeeze(1)
    loss = (1 - eps) * nll - eps * logp.mean(1)
    return (loss * keep).sum(), (nll * keep).sum()


def test_loss_with_a_bias_and_never_written_ids():
    torch.manual_seed(0)
    V, d = 11, 6
    h = torch.randn(9, d, requires_grad=True)
    w = torch.randn(V, d, requires_grad=True)
    b = torch.randn(V)
    b[PAD] = -torch.inf  # never written
    b.requires_grad_()
    target = torch.tensor([3, 4, 5, PAD, 7, 8, 9, 10, 2])
    loss, nll = label_smoothed_loss(h, w, target, 0.1, b)
    allowed = torch.tensor([i for i in range(V) if i != PAD])
    h2, w2 = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    b2 = b.detach().clone().requires_grad_()
    ref_loss, ref_nll = reference(h2, w2, b2, target, 0.1, allowed)
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(h.grad, h2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    assert b.grad[PAD] == 0  # the -inf stays -inf under any optimiser step
    torch.testing.assert_close(b.grad[allowed], b2.grad[allowed])


def test_loss_without_a_bias_is_unchanged():
    torch.manual_seed(1)
    h, w = torch.randn(5, 4), torch.randn(7, 4)
    target = torch.tensor([3, 4, 5, 6, PAD])
    loss, _ = label_smoothed_loss(h, w, target, 0.1)
    z = h @ w.t()
    expected = F.cross_entropy(z, target, ignore_index=PAD, label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, expected)


def test_model_options_swish_and_output_bias():
    cfg = ModelConfig(
        layers=1, d_model=8, d_ff=16, heads=2, activation="swish", output_bias=True, dropout=0.0
    )
    model = Transformer(cfg, 12, 12, True).eval()
    assert isinstance(model.encoder[0].ffn[1], torch.nn.SiLU)
    assert model.out.bias is not None and model.out.weight is model.tgt_embed.weight
    with torch.no_grad():
        model.out.bias[PAD] = -torch.inf
    src = torch.tensor([[5, 6, 2]])
    tgt_in = torch.tensor([[1, 7, 8]])
    logits = model(src, tgt_in)
    assert torch.isneginf(logits[..., PAD]).all()
    loss, nll = model(src, tgt_in, torch.tensor([[7, 8, 2]]), 0.1)
    assert torch.isfinite(loss) and torch.isfinite(nll)


def test_log_probs_are_fp32_whatever_the_search_precision():
    """A bf16 model's `log_probs` project its own bf16 states in fp32: the scores are not the
    bf16 logits' (steps of 2^-3 at |z| in [16, 32)), which move with the batch's rounding."""
    from s2s.core.nn.precision import for_inference

    torch.manual_seed(3)
    cfg = ModelConfig(layers=1, d_model=32, d_ff=64, heads=4, dropout=0.0)
    bf16 = for_inference(Transformer(cfg, 50, 50, True).eval(), "bf16")
    src, tgt_in = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 8, 9]])
    with torch.no_grad():
        ours = bf16.log_probs(src, tgt_in)
        states = bf16.decoder_states(tgt_in, *bf16.encode(src)).float()
        expected = torch.log_softmax(states @ bf16.tgt_embed.weight.float().t(), -1)
        assert bf16(src, tgt_in).dtype == torch.bfloat16  # what scores were taken from before
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, rtol=1e-6, atol=1e-5)
