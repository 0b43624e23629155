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
