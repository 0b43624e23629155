"""Section 5.3-5.4: Adam, the warm-up learning-rate schedule, label-smoothed cross-entropy."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .vocab import PAD


def lrate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (equation 3).

    It rises linearly for the first `warmup` steps and then decays with the inverse square root
    of the step; the peak, at step = warmup, is scale * (d_model * warmup)^-0.5.
    """
    step = max(step, 1)
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def adam(params, cfg) -> torch.optim.Adam:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 in the paper; the schedule sets lr."""
    return torch.optim.Adam(params, lr=0.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                            weight_decay=cfg.weight_decay, fused=True)


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-pad target tokens.

    The smoothed target puts 1 - eps on the reference and spreads eps uniformly over all K
    classes (Szegedy et al. 2016): loss = (1 - eps) * NLL + eps * mean_k(-log p_k).
    """
    lprobs = F.log_softmax(logits.float(), dim=-1).flatten(0, -2)
    target = target.reshape(-1)
    keep = target != PAD
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)
    smooth = -lprobs.mean(dim=-1)
    loss = ((1.0 - eps) * nll + eps * smooth) * keep
    return loss.sum(), (nll * keep).sum()
