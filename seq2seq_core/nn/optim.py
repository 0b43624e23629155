"""Section 5.3: Adam and the warm-up learning-rate schedule."""

from __future__ import annotations

import torch


def lrate(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)  (equation 3).

    It rises linearly for the first `warmup` steps and then decays with the inverse square root
    of the step; the peak, at step = warmup, is scale * (d_model * warmup)^-0.5.
    """
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def adam(params, cfg) -> torch.optim.Adam:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 in the paper; the schedule sets lr."""
    return torch.optim.Adam(
        params,
        lr=0.0,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=True,
    )
