"""Section 5: the warm-up schedule at known steps, and label smoothing on a hand-computed case."""
import math

import pytest
import torch

from s2s.core.optim import label_smoothed_loss, lrate


def test_schedule_known_values():
    d, w = 512, 4000
    assert lrate(1, d, w) == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert lrate(4000, d, w) == pytest.approx(512 ** -0.5 * 4000 ** -0.5)  # the peak, ~7.0e-4
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
    loss, n = label_smoothed_loss(logits, target, eps)
    assert n.item() == pytest.approx(nll)
    assert loss.item() == pytest.approx((1 - eps) * nll + eps * smooth)


def test_padding_tokens_do_not_count():
    logits = torch.randn(1, 3, 5)
    loss_a, _ = label_smoothed_loss(logits[:, :2], torch.tensor([[4, 3]]), 0.1)
    loss_b, _ = label_smoothed_loss(logits, torch.tensor([[4, 3, 0]]), 0.1)
    assert loss_a.item() == pytest.approx(loss_b.item())


def _reference_loss(logits, target, eps):
    """The loss written out with autograd's own log_softmax, for comparison."""
    lprobs = torch.log_softmax(logits.float(), dim=-1).flatten(0, -2)
    keep = target.reshape(-1) != 0
    nll = -lprobs.gather(1, target.reshape(-1, 1)).squeeze(1)
    return (((1 - eps) * nll - eps * lprobs.mean(-1)) * keep).sum()


def test_the_chunked_loss_and_its_gradient_match_autograd_on_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(3, 700, 3000, dtype=torch.float64).float().requires_grad_()  # several chunks
    target = torch.randint(0, 3000, (3, 700))
    target[0, -50:] = 0  # padding
    loss, _ = label_smoothed_loss(logits, target, 0.1)
    (0.5 * loss).backward()
    ref = logits.detach().clone().requires_grad_()
    ref_loss = _reference_loss(ref, target, 0.1)
    (0.5 * ref_loss).backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert torch.allclose(logits.grad, ref.grad, atol=1e-7)
    assert logits.grad[0, -50:].abs().max() == 0


def test_bf16_logits_give_an_fp32_loss_and_a_bf16_gradient():
    torch.manual_seed(0)
    logits = (3 * torch.randn(64, 500)).bfloat16().requires_grad_()
    target = torch.randint(1, 500, (64,))
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    assert loss.item() == pytest.approx(_reference_loss(logits.detach().float(), target, 0.1).item(), rel=1e-5)
    loss.backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad).all()
