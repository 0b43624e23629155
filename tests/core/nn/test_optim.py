"""Section 5: the warm-up schedule at known steps, and label smoothing on a hand-computed case."""

import math
import threading

import pytest
import torch
from s2s.core.nn.loss import label_smoothed_loss
from s2s.core.nn.model import Transformer
from s2s.core.nn.optim import lrate
from s2s.core.setup.settings import ModelConfig


def test_schedule_known_values():
    d, w = 512, 4000
    assert lrate(1, d, w) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert lrate(4000, d, w) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak, ~7.0e-4
    assert lrate(4000, d, w) == pytest.approx(6.9877e-4, rel=1e-4)
    assert lrate(16000, d, w) == pytest.approx(lrate(4000, d, w) / 2)  # inverse square root decay
    assert lrate(2000, d, w) == pytest.approx(lrate(4000, d, w) / 2)  # linear warm-up
    assert lrate(4000, d, w, scale=2.0) == pytest.approx(2 * lrate(4000, d, w))


def test_label_smoothed_loss_hand_computed():
    # one token, K=4 classes, logits give p = (0.5, 0.25, 0.125, 0.125); reference class 1
    p = torch.tensor([0.5, 0.25, 0.125, 0.125])
    logits = p.log().view(1, 1, 4)
    target = torch.tensor([[1]])
    eps = 0.1
    nll = -math.log(0.25)
    smooth = -(math.log(0.5) + math.log(0.25) + 2 * math.log(0.125)) / 4
    loss, n = label_smoothed_loss(logits, torch.eye(4), target, eps)  # logits = logits @ I
    assert n.item() == pytest.approx(nll)
    assert loss.item() == pytest.approx((1 - eps) * nll + eps * smooth)


def test_padding_tokens_do_not_count():
    hidden, weight = torch.randn(1, 3, 8), torch.randn(5, 8)
    loss_a, _ = label_smoothed_loss(hidden[:, :2], weight, torch.tensor([[4, 3]]), 0.1)
    loss_b, _ = label_smoothed_loss(hidden, weight, torch.tensor([[4, 3, 0]]), 0.1)
    assert loss_a.item() == pytest.approx(loss_b.item())


def _reference_loss(logits, target, eps):
    """The loss written out with autograd's own log_softmax, for comparison: (loss, nll)."""
    lprobs = torch.log_softmax(logits.float(), dim=-1).flatten(0, -2)
    keep = target.reshape(-1) != 0
    nll = -lprobs.gather(1, target.reshape(-1, 1)).squeeze(1)
    return (((1 - eps) * nll - eps * lprobs.mean(-1)) * keep).sum(), (nll * keep).sum()


def test_the_chunked_loss_and_its_gradients_match_autograd_on_log_softmax():
    torch.manual_seed(0)
    hidden = torch.randn(3, 700, 64).requires_grad_()
    weight = torch.randn(3000, 64).requires_grad_()  # 2,100 rows of 3,000 logits: several chunks
    target = torch.randint(0, 3000, (3, 700))
    target[0, -50:] = 0  # padding
    loss, nll = label_smoothed_loss(hidden, weight, target, 0.1)
    (0.5 * loss).backward()
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref_loss, ref_nll = _reference_loss(h @ w.t(), target, 0.1)
    (0.5 * ref_loss).backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    for got, ref in (
        (hidden.grad, h.grad),
        (weight.grad, w.grad),
    ):  # fp32 rounding of 3,000-term sums
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    assert hidden.grad[0, -50:].abs().max() == 0


@pytest.mark.parametrize("tied", [True, False])
def test_the_models_loss_matches_the_loss_of_its_logits(tied):
    """Transformer(src, tgt_in, tgt_out, eps) (the projection inside the loss) against the
    reference loss of Transformer(src, tgt_in) (the logits), values and every gradient; a tied
    output weight gets both its embedding and its projection gradient."""
    cfg = ModelConfig(
        layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0, max_positions=32, tie_output=tied
    )
    torch.manual_seed(0)
    model = Transformer(cfg, 30, 30, shared_vocab=False)
    assert (model.out.weight is model.tgt_embed.weight) == tied
    src, tgt_in, tgt_out = (
        torch.randint(4, 30, (5, 6)),
        torch.randint(4, 30, (5, 7)),
        torch.randint(4, 30, (5, 7)),
    )
    tgt_out[1, -3:] = 0

    def run(fused):
        model.zero_grad()
        loss, nll = (
            model(src, tgt_in, tgt_out, 0.1)
            if fused
            else _reference_loss(model(src, tgt_in), tgt_out, 0.1)
        )
        loss.backward()
        return loss.item(), nll.item(), {n: p.grad.clone() for n, p in model.named_parameters()}

    (loss, nll, grads), (ref_loss, ref_nll, ref_grads) = run(True), run(False)
    assert loss == pytest.approx(ref_loss, rel=1e-5) and nll == pytest.approx(ref_nll, rel=1e-5)
    scale = max(
        g.abs().max().item() for g in ref_grads.values()
    )  # some are 0 up to rounding (key biases)
    for n in ref_grads:
        assert torch.allclose(grads[n], ref_grads[n], rtol=1e-4, atol=1e-6 * scale), n


def test_bf16_inputs_give_an_fp32_loss_and_bf16_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(64, 32).bfloat16().requires_grad_()
    weight = (0.5 * torch.randn(500, 32)).bfloat16().requires_grad_()
    target = torch.randint(1, 500, (64,))
    loss, nll = label_smoothed_loss(hidden, weight, target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    logits = (hidden @ weight.t()).detach()
    assert loss.item() == pytest.approx(_reference_loss(logits, target, 0.1)[0].item(), rel=1e-4)
    loss.backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_the_kept_chunk_buffers_serve_calls_of_any_size_and_thread():
    """The chunk's buffers outlive a call on CPU (s2s.core.nn.loss.workspace): a call after a
    larger one, a larger after a smaller, bf16 after fp32, and calls from two threads at once
    each give the loss of their own logits."""
    torch.manual_seed(0)
    cases = [
        (torch.randn(n, 16), torch.randn(v, 16), torch.randint(1, v, (n,)))
        for n, v in ((1500, 900), (40, 50), (2200, 1300), (30, 7))
    ]
    want = [_reference_loss(h @ w.t(), t, 0.1)[0].item() for h, w, t in cases]
    for (h, w, t), ref in zip(cases, want):
        assert label_smoothed_loss(h, w, t, 0.1)[0].item() == pytest.approx(ref, rel=1e-5)
    h, w, t = cases[0]
    got = label_smoothed_loss(h.bfloat16(), w.bfloat16(), t, 0.1)[0].item()
    assert got == pytest.approx(
        _reference_loss(h.bfloat16() @ w.bfloat16().t(), t, 0.1)[0].item(), rel=1e-3
    )
    results = [None] * len(cases)

    def work(k):
        for _ in range(3):
            results[k] = label_smoothed_loss(*cases[k][:2], cases[k][2], 0.1)[0].item()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(cases))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert results == pytest.approx(want, rel=1e-5)
