"""Section 5.3-5.4: Adam, the warm-up learning-rate schedule, label-smoothed cross-entropy."""
from __future__ import annotations

import torch

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


class _LabelSmoothedLoss(torch.autograd.Function):
    """Summed smoothed cross-entropy and NLL from logits of any float dtype, computed in fp32 a
    chunk of rows at a time: no fp32 copy of the whole [tokens, V] logits, no [tokens, V]
    log-probabilities kept for the backward pass. The gradient with respect to the logits is
    (softmax(z) - q) * keep, q the smoothed target; the backward pass recomputes the softmax
    from the logits, again in fp32, and writes it in the logits' dtype."""

    @staticmethod
    def forward(ctx, logits, target, eps):
        z_all, t_all = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
        loss = torch.zeros((), dtype=torch.float32, device=logits.device)
        nll = torch.zeros_like(loss)
        for rows in _chunks(z_all):
            lprobs = torch.log_softmax(z_all[rows], dim=-1, dtype=torch.float32)
            t = t_all[rows]
            keep = t != PAD
            token_nll = -lprobs.gather(1, t[:, None]).squeeze(1) * keep
            smooth = -lprobs.mean(dim=-1) * keep  # mean_k(-log p_k)
            loss += ((1.0 - eps) * token_nll + eps * smooth).sum()
            nll += token_nll.sum()
        ctx.save_for_backward(logits, target)
        ctx.eps = eps
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        logits, target = ctx.saved_tensors
        z_all, t_all = logits.reshape(-1, logits.size(-1)), target.reshape(-1)
        grad = torch.empty_like(z_all)
        eps, V = ctx.eps, z_all.size(1)
        for rows in _chunks(z_all):
            t = t_all[rows]
            g = torch.softmax(z_all[rows], dim=-1, dtype=torch.float32)
            g.scatter_add_(1, t[:, None], torch.full((len(t), 1), eps - 1.0, device=g.device))
            w = (t != PAD)[:, None] * grad_loss  # [rows, 1]
            torch.addcmul(w * (-eps / V), g, w, out=grad[rows])  # (g - eps / V) * w
        return grad.view_as(logits), None, None


def _chunks(z: torch.Tensor, elements: int = 1 << 20):
    """Row slices of z holding about `elements` values each (4 MiB in fp32)."""
    step = max(1, elements // max(1, z.size(1)))
    return [slice(i, i + step) for i in range(0, z.size(0), step)]


def label_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-pad target tokens, in fp32
    whatever the logits' dtype.

    The smoothed target puts 1 - eps on the reference and spreads eps uniformly over all K
    classes (Szegedy et al. 2016): loss = (1 - eps) * NLL + eps * mean_k(-log p_k).
    """
    return _LabelSmoothedLoss.apply(logits, target, float(eps))
