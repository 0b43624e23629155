"""Section 5.4: label-smoothed cross-entropy over the output projection, a chunk of rows at a
time."""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from ..tokenizers import PAD
from .precision import padded_rows


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """Summed smoothed cross-entropy and NLL of logits z = h W^T, projected, reduced and
    differentiated a chunk of rows at a time: neither the [tokens, V] logits nor their gradient
    ever exist whole.

    For each chunk the logits are multiplied in the states' dtype (bf16, fp16 or fp32) into a
    reused buffer and reduced in fp32: with m = max_k z_k and s = sum_k exp(z_k - m), -log p_y =
    log s - (z_y - m) and mean_k(-log p_k) = log s - mean_k(z_k - m). When a gradient is wanted,
    the same pass writes the chunk's logit gradient G = softmax(z) - q (q the smoothed target)
    into the logits' buffer and multiplies it out at once: dL/dh = G W for the chunk's rows, and
    dL/dW += G^T h summed in fp32 over the chunks. The backward pass only scales the two by the
    incoming gradient. Rows whose target is PAD are masked (`keep` = 0: no loss, a zero
    gradient) rather than dropped, so that nothing waits on the device to count them.
    The weight is cast to the states' dtype here, outside autograd, and its gradient returned
    in the weight's own dtype: to the fp32 table of a tied embedding (which
    s2s.core.nn.precision.LowPrecision leaves in fp32) the fp32 sum, never rounded to 16 bits.
    The chunk's buffers are kept between calls on CPU (`workspace`), and every conversion
    between the product's dtype and fp32 is one explicit copy: an elementwise op whose output
    dtype differs from its inputs' would allocate a temporary [rows, V] tensor of its own."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, keep, eps, rows, need_h, need_w):
        N, V = h.size(0), weight.size(0)
        ctx.w_dtype = weight.dtype
        # columns whose bias is -inf are tokens the model never writes (`never_written`): no
        # probability, no share of the smoothing, no gradient
        never = never_written(bias)
        classes = V - (0 if never is None else never.numel())
        need_b = bias is not None and ctx.needs_input_grad[2]
        grad_b = torch.zeros(V, dtype=torch.float32, device=h.device) if need_b else None
        with torch.autocast(h.device.type, enabled=False):  # the dtypes are chosen by the caller
            w = weight.to(h.dtype)  # the product's dtype; the gradient goes back in weight's
            z = workspace(0, rows * V, h.dtype, h.device).view(rows, V)
            zf = (
                z
                if z.dtype == torch.float32
                else workspace(1, rows * V, torch.float32, h.device).view(rows, V)
            )
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = (  # the first chunk's product starts the sum (no rows: zero)
                (torch.empty if N else torch.zeros)(
                    V, h.size(1), dtype=torch.float32, device=h.device
                )
                if need_w
                else None
            )
            part = (
                torch.empty_like(w) if need_w and w.dtype != torch.float32 else None
            )  # G^T h of a chunk
            loss = torch.zeros((), dtype=torch.float32, device=h.device)
            nll = torch.zeros_like(loss)
            for i in range(0, N, rows):
                t, k = target[i : i + rows, None], keep[i : i + rows]
                n = t.size(0)
                f = zf[:n]
                torch.mm(h[i : i + n], w.t(), out=z[:n])
                if f is not z:
                    f.copy_(z[:n])  # in fp32 from any dtype: one conversion, no temporary
                if bias is not None:
                    f.add_(bias)
                f.sub_(f.amax(1, keepdim=True))  # z - m
                if never is not None:  # -inf there: left out of the mean (and of z_y at PAD)
                    f.index_fill_(1, never, 0.0)
                z_y, z_mean = f.gather(1, t).squeeze(1), f.sum(1) / classes
                if never is not None:
                    f.index_fill_(1, never, -torch.inf)
                s = f.exp_().sum(1)
                log_s = s.log()
                token_nll = (log_s - z_y) * k
                loss += ((1.0 - eps) * token_nll + eps * (log_s - z_mean) * k).sum()
                nll += token_nll.sum()
                if (
                    need_h or need_w
                ):  # G = k * ((exp(z - m) - (1 - eps) s [at the reference]) / s - eps / V)
                    f.scatter_add_(1, t, ((eps - 1.0) * s)[:, None])
                    G = f.mul_((k / s)[:, None]).add_((-eps / classes) * k[:, None])
                    if never is not None:
                        G.index_fill_(1, never, 0.0)
                    if grad_b is not None:
                        grad_b += G.sum(0)
                    if f is not z:
                        G = z[:n].copy_(f)  # back to the product's dtype
                    if need_h:
                        torch.mm(G, w, out=grad_h[i : i + n])
                    if need_w and part is None:  # fp32: the chunks' products add up in grad_w
                        if i == 0:
                            torch.mm(G.t(), h[i : i + n], out=grad_w)
                        else:
                            grad_w.addmm_(G.t(), h[i : i + n])
                    elif need_w:  # 16 bits: each chunk's product is added up in fp32
                        torch.mm(G.t(), h[i : i + n], out=part)
                        if i == 0:
                            grad_w.copy_(part)
                        else:
                            grad_w.add_(part)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        gh = grad_h * grad_loss if ctx.needs_input_grad[0] else None
        gw = (
            (grad_w * grad_loss).to(ctx.w_dtype) if ctx.needs_input_grad[1] else None
        )  # scaled in fp32
        gb = grad_b * grad_loss if ctx.needs_input_grad[2] and grad_b is not None else None
        return gh, gw, gb, None, None, None, None, None, None


def never_written(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The ids whose output bias is -inf (a row an imported vocabulary adds, such as PAD for
    OPUS-MT's: s2s.core.inference.formats), or None where there are none."""
    if bias is None:
        return None
    never = torch.isneginf(bias.detach()).nonzero().squeeze(1)
    return never if never.numel() else None


_KEPT = threading.local()  # each thread's buffers, so that two callers never share one


def workspace(slot: int, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A flat buffer of at least `numel` elements for a chunk's logits. On CPU it is kept from
    one call to the next (per thread, `slot` and dtype; it only grows): a fresh [rows, V] buffer
    of tens of MiB is above glibc's mmap threshold (at most 32 MiB), so each call would map new
    pages and fault on every 4 KiB of them. CUDA's caching allocator already reuses its blocks."""
    if device.type != "cpu":
        return torch.empty(numel, dtype=dtype, device=device)
    kept = _KEPT.__dict__
    buf = kept.get((slot, dtype))
    if buf is None or buf.numel() < numel:
        buf = kept[(slot, dtype)] = torch.empty(numel, dtype=dtype)
    return buf[:numel]


#: every chunk takes at least MIN_ROWS rows: dL/dW = sum G^T h is added up chunk by chunk, and
#: a product over a few dozen rows re-reads W (and dL/dW) for little work; M = 1,024+ keeps a
#: GPU's tensor cores busy, and on CPU such chunks cost no more than one [N, V] gradient buffer
MIN_ROWS = 1024
#: beyond that, logits per chunk on CPU (4 MiB in fp32: the chunk stays in cache); on CUDA the
#: chunk's buffers take at most 1/32 of the device's memory (6 bytes a logit: the product in 16
#: bits and the fp32 reduction)
CPU_CHUNK_ELEMENTS, CUDA_MEMORY_SHARE, BYTES_PER_LOGIT = 1 << 20, 32, 6


def chunk_rows(n: int, vocab: int, device: torch.device, memory: int | None = None) -> int:
    """Rows of the [n, vocab] logits computed at once on `device` (`memory`: the device's
    memory in bytes, read from CUDA when not given). On a GPU that is thousands of rows, so that
    a 25k-token batch is a few launches of large GEMMs, not hundreds of small ones."""
    if torch.device(device).type == "cuda":
        if memory is None:
            memory = torch.cuda.get_device_properties(device).total_memory
        elements = memory // CUDA_MEMORY_SHARE // BYTES_PER_LOGIT
    else:
        elements = CPU_CHUNK_ELEMENTS
    return max(1, min(n, max(MIN_ROWS, elements // vocab)))


def label_smoothed_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    eps: float,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed cross-entropy and summed NLL over the non-pad target tokens of the
    logits hidden @ weight^T + bias (hidden [..., d], weight [V, d], bias [V] or None, target
    [...]), in fp32 whatever the inputs' dtype; the logits are computed chunk by chunk
    (_ProjectedLabelSmoothedLoss), the bias added in fp32.

    The smoothed target puts 1 - eps on the reference and spreads eps uniformly over all K
    classes (Szegedy et al. 2016): loss = (1 - eps) * NLL + eps * mean_k(-log p_k); classes
    whose bias is -inf (`never_written`) are not among the K. PAD
    positions are masked out. Under autocast (fp16 training) the projection multiplies in the
    autocast dtype, as a linear layer would: the final LayerNorm's fp32 output and the fp32
    weight are cast down, so the product runs on the half-precision units.
    """
    h = hidden.reshape(-1, hidden.size(-1))
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    h = h.to(dtype)  # a no-op but under autocast
    grad = torch.is_grad_enabled()
    target = target.reshape(-1)
    if kind == "cpu" and dtype != torch.float32:  # oneDNN's products: cached shapes
        padded = padded_rows(h.size(0))
        h = F.pad(h, (0, 0, 0, padded - h.size(0)))
        target = F.pad(target, (0, padded - target.size(0)), value=PAD)
    keep = target.ne(PAD).float()
    rows = chunk_rows(h.size(0), weight.size(0), h.device)
    if bias is not None:
        bias = bias.float()
    return _ProjectedLabelSmoothedLoss.apply(
        h,
        weight,
        bias,
        target,
        keep,
        float(eps),
        rows,
        grad and h.requires_grad,
        grad and weight.requires_grad,
    )
