"""Scaled dot-product and multi-head attention (section 3.2), and the weights they attend with.

`attention` is equation 1; `MultiHeadAttention` projects d_model to h heads of d_k (queries,
keys) and d_v (values) dimensions and back, d_k = d_v = d_model / h unless the model's settings
give them (Table 3, rows A and B). A module records its attention weights while `recorded` is a
list (`Transformer.forward(..., return_attention=True)` sets it): the weights that computed the
output, from the same code; otherwise nothing is kept and the fused kernel runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .precision import cpu_has_bf16_matrix_units, cpu_last_level_cache


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Optional[Tensor],
    causal: bool,
    dropout: float,
    need_weights: bool = False,
):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V (equation 1), over q [B, h, T, d_k],
    k [B, h, S, d_k] and v [B, h, S, d_v]; mask [B, 1, 1, S] True where a key may be attended,
    `causal`: query i sees keys 0..i; `dropout` on the attention weights. With `need_weights`,
    (output, the weights [B, h, T, S] before dropout).

    PyTorch's fused scaled_dot_product_attention, except where the weights are asked for (the fused
    kernel does not return them) and on a CPU where the fused kernel is the slower one. In fp32
    that is attention without a causal mask or a gradient (search's steps, its encoder): the
    fused kernel works through each row and head in turn, while here each product is one
    batched matrix product over all of them, reading a search's key and value cache where it
    lies (s2s.core.nn.model.DecoderCache). In bf16 it is attention with a gradient wanted (the
    fused backward pass), and on a CPU without bf16 matrix units (AMX) also without; with AMX
    and no gradient the fused kernel is the faster one. Here both products are in the input's
    dtype, the softmax fp32 by torch's kernel (docs/performance.md)."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if q.dtype == torch.bfloat16:
        slower_fused = grad or not cpu_has_bf16_matrix_units()
    else:
        slower_fused = not causal and not grad
    slower_fused = slower_fused and q.device.type == "cpu"
    if not need_weights and not slower_fused:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, dropout_p=dropout
        )
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.size(-1) ** -0.5)
    if causal:
        T, S = scores.shape[-2:]
        scores.masked_fill_(
            torch.ones(T, S, dtype=torch.bool, device=q.device).triu_(1), float("-inf")
        )
    elif mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    weights = torch.softmax(scores, -1)
    out = torch.matmul(F.dropout(weights, dropout) if dropout > 0.0 else weights, v)
    return (out, weights) if need_weights else out


#: a step's self-attention reads its cache in order past this many positions, where the cache is
#: larger than the CPU's largest cache (MultiHeadAttention.step)
IN_ORDER_AFTER = 32


def attention_in_order(q: Tensor, k: Tensor, v: Tensor, positions: Optional[int] = None) -> Tensor:
    """Equation 1 for one query a row, q [R, d_k], over keys k [T, R, d_k] and values v [T, R,
    d_v] laid out position by position (a search's cache, s2s.core.nn.model.DecoderCache):
    [R, d_v].

    The same sums as `attention`, in another order: the cache is read in its own order,
    `positions` positions at a time (by default a block of about 4 MiB), multiplied elementwise
    and summed, where batched products make one small product a row and head, each reading
    d_k * 4 bytes at every position, the next position a whole block further on. Over a cache
    larger than the CPU's and more than IN_ORDER_AFTER positions that walk reads memory slower
    than in order does; over fewer positions the batched products are the faster
    (docs/performance.md, "Search")."""
    T, R, _ = k.shape
    d = max(k.size(-1), v.size(-1))
    positions = positions or max(1, 4 * 2**20 // (R * d * k.element_size()))
    scores = q.new_empty(T, R)
    block = q.new_empty(min(positions, T), R, d)
    for p in range(0, T, positions):
        keys = k[p : p + positions]
        part = torch.mul(keys, q, out=block[: keys.size(0), :, : k.size(-1)])
        torch.sum(part, -1, out=scores[p : p + positions])
    weights = torch.softmax(scores.mul_(q.size(-1) ** -0.5), 0)
    out = q.new_zeros(R, v.size(-1))
    for p in range(0, T, positions):
        values = v[p : p + positions]
        into = block[: values.size(0), :, : v.size(-1)]
        part = torch.mul(values, weights[p : p + positions, :, None], out=into)
        out += part.sum(0)
    return out


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V
    W_i^V), W^Q, W^K: d_model x h d_k, W^V: d_model x h d_v, W^O: h d_v x d_model.

    Keys and values are projected separately (`keys_values`) so that the decoder can compute the
    encoder-decoder ones once per sentence and cache its own step by step."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float,
        d_k: Optional[int] = None,
        d_v: Optional[int] = None,
    ):
        super().__init__()
        if d_k is None or d_v is None:
            assert d_model % heads == 0, f"d_model {d_model} is not a multiple of heads {heads}"
        self.h, self.dropout = heads, dropout
        self.d_k = d_model // heads if d_k is None else d_k
        self.d_v = d_model // heads if d_v is None else d_v
        self.w_q, self.w_k = (
            nn.Linear(d_model, heads * self.d_k),
            nn.Linear(d_model, heads * self.d_k),
        )
        self.w_v, self.w_o = (
            nn.Linear(d_model, heads * self.d_v),
            nn.Linear(heads * self.d_v, d_model),
        )
        self.recorded: Optional[list[Tensor]] = (
            None  # a list: each call appends its weights [B, h, T, S]
        )

    def split_heads(self, x: Tensor) -> Tensor:  # [B, T, h d] -> [B, h, T, d]
        return x.view(x.size(0), x.size(1), self.h, -1).transpose(1, 2)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))

    def cached_keys_values(self, x: Tensor) -> Tensor:
        """x's keys and values as one tensor [2, B, h, S, max(d_k, d_v)] (the smaller one
        padded), each head's positions consecutive."""
        k, v = self.keys_values(x)
        if self.d_k != self.d_v:
            d = max(self.d_k, self.d_v)
            k, v = F.pad(k, (0, d - self.d_k)), F.pad(v, (0, d - self.d_v))
        return torch.stack((k, v))

    def split_cached(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """kv [2, B, h, S, d] (as `cached_keys_values` lays it out) -> views of keys and values."""
        if self.d_k == self.d_v:
            return kv[0], kv[1]
        return kv[0, ..., : self.d_k], kv[1, ..., : self.d_v]

    def step(self, x: Tensor, kv: Tensor, step: int) -> Tensor:
        """Self-attention of one search step: x [n, 1, d_model] at position `step`, kv
        [positions, 2, n, h, max(d_k, d_v)] the layer's cache (s2s.core.nn.model.DecoderCache).
        This step's keys and values are written at `step`; the queries attend to steps 0..step.

        On a CPU in fp32 without a gradient, once the keys and values attended (the steps done,
        all rows) are more than the CPU's largest cache holds and more than IN_ORDER_AFTER
        positions, they are read in order (`attention_in_order`); otherwise by `attention`'s
        batched products."""
        k, v = self.keys_values(x)
        keys, values = self.split_cached(kv[: step + 1].permute(1, 2, 3, 0, 4))
        keys[:, :, step : step + 1], values[:, :, step : step + 1] = k, v
        in_order = (
            x.device.type == "cpu"
            and x.dtype == torch.float32
            and self.recorded is None
            and self.d_k == self.d_v
            and step + 1 > IN_ORDER_AFTER
            and kv[: step + 1].numel() * kv.element_size() > cpu_last_level_cache()
            and not (torch.is_grad_enabled() and x.requires_grad)
        )
        if not in_order:
            return self(x, keys, values)
        n = x.size(0)
        q = self.w_q(x).view(n * self.h, self.d_k)
        out = attention_in_order(
            q, kv[: step + 1, 0].flatten(1, 2), kv[: step + 1, 1].flatten(1, 2)
        )
        return self.w_o(out.view(n, 1, -1))

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None, causal: bool = False
    ) -> Tensor:
        """Queries from x [B*g, T, d_model] attend over k [B, h, S, d_k], v [B, h, S, d_v].

        mask [B, 1, 1, S] is True where a key may be attended. When x holds g > 1 rows per row
        of k, v (g beam hypotheses of one sentence, consecutive), their queries are folded into
        one query sequence of length g*T: they share the keys, which are never copied."""
        n, T, d = x.shape
        B = k.size(0)
        q = self.split_heads(self.w_q(x.reshape(B, -1, d)))
        dropout = self.dropout if self.training else 0.0
        if self.recorded is None:
            out = attention(q, k, v, mask, causal, dropout)
        else:
            out, w = attention(q, k, v, mask, causal, dropout, need_weights=True)
            self.recorded.append(
                w.view(B, self.h, n // B, T, -1).transpose(1, 2).reshape(n, self.h, T, -1)
            )
        return self.w_o(out.transpose(1, 2).reshape(n, T, -1))


@dataclass
class AttentionWeights:
    """The attention weights of one forward pass, a list over layers (first to last) of
    [B, h, queries, keys] tensors: each row a distribution over the keys it may attend."""

    encoder: list[Tensor] = field(default_factory=list)  # encoder self-attention, source x source
    decoder: list[Tensor] = field(
        default_factory=list
    )  # decoder self-attention, target x target (causal)
    cross: list[Tensor] = field(default_factory=list)  # encoder-decoder attention, target x source

    def kinds(self) -> dict[str, list[Tensor]]:
        return {"encoder": self.encoder, "decoder": self.decoder, "cross": self.cross}
