"""Section 5.4: label-smoothed cross-entropy over the output projection, a chunk of rows at a time."""
from __future__ import annotations

import torch

from .vocab import PAD


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Summed smoothed cross-entropy and NLL of logits z = h W^T, projected and reduced a chunk of
    rows at a time: the [tokens, V] logits and log-probabilities never exist whole.

    For each chunk the logits are multiplied in the inputs' dtype (bf16 or fp32) into a reused
    buffer and reduced in fp32: with m = max_k z_k and s = sum_k exp(z_k - m), -log p_y =
    log s - (z_y - m) and mean_k(-log p_k) = log s - mean_k(z_k - m). The gradient with respect
    to the logits, softmax(z) - q with q the smoothed target, is written for the chunk in the
    same pass (in the inputs' dtype) when a gradient is wanted; the backward pass then only
    multiplies it by W and h. Every target must be a real token (`label_smoothed_loss` drops
    the padding first). Reused buffers matter on CPU: a fresh large tensor costs a page fault
    per 4 KiB, more than a cheap pass such as a bf16-to-fp32 copy spends writing into it."""

    @staticmethod
    def forward(ctx, h, w, target, eps, want_grad):
        N, V = h.size(0), w.size(0)
        rows = max(1, min(N, _CHUNK_ELEMENTS // V))
        z = h.new_empty(rows, V)
        zf = z if z.dtype == torch.float32 else torch.empty(rows, V, dtype=torch.float32, device=h.device)
        grad = h.new_empty(N, V) if want_grad else None
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        nll = torch.zeros_like(loss)
        offset = torch.tensor(-eps / V, dtype=torch.float32, device=h.device)
        for i in range(0, N, rows):
            t = target[i:i + rows, None]
            n = t.size(0)
            f = zf[:n]
            torch.mm(h[i:i + n], w.t(), out=z[:n])
            torch.sub(z[:n], z[:n].amax(1, keepdim=True).float(), out=f)  # z - m, in fp32 from any dtype
            z_y, z_mean = f.gather(1, t).squeeze(1), f.mean(1)
            s = f.exp_().sum(1)
            log_s = s.log()
            token_nll = log_s - z_y
            loss += ((1.0 - eps) * token_nll + eps * (log_s - z_mean)).sum()
            nll += token_nll.sum()
            if grad is not None:  # (exp(z - m) - (1 - eps) s [at the reference]) / s - eps / V
                f.scatter_add_(1, t, ((eps - 1.0) * s)[:, None])
                torch.addcmul(offset, f, s.reciprocal()[:, None], out=grad[i:i + n])
        ctx.save_for_backward(h, w, grad)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        h, w, grad = ctx.saved_tensors
        grad_h = torch.mm(grad, w).mul_(grad_loss) if ctx.needs_input_grad[0] else None
        grad_w = torch.mm(grad.t(), h).mul_(grad_loss) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None


_CHUNK_ELEMENTS = 1 << 20  # logits per chunk: 4 MiB in fp32


def label_smoothed_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-pad target tokens of the
    logits hidden @ weight^T (hidden [..., d], weight [V, d], target [...]), in fp32 whatever
    the inputs' dtype; the logits are computed chunk by chunk (_ProjectedLabelSmoothedLoss).

    The smoothed target puts 1 - eps on the reference and spreads eps uniformly over all K
    classes (Szegedy et al. 2016): loss = (1 - eps) * NLL + eps * mean_k(-log p_k). PAD
    positions are left out before the projection, so they cost nothing.
    """
    keep = (target.reshape(-1) != PAD).nonzero().squeeze(1)
    h = hidden.reshape(-1, hidden.size(-1)).index_select(0, keep)
    w = weight.to(h.dtype)  # a no-op but under autocast
    want_grad = torch.is_grad_enabled() and (h.requires_grad or w.requires_grad)
    return _ProjectedLabelSmoothedLoss.apply(h, w, target.reshape(-1)[keep], float(eps), want_grad)
