"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), section 3, attention aside.

An encoder and a decoder stack of N layers each (3.1), or of depths of their own (`depths`);
multi-head scaled dot-product attention (3.2, s2s.core.nn.attention), d_k and d_v per head
d_model / h or set (Table 3, rows A and B); position-wise feed-forward networks (3.3); embeddings
scaled by sqrt(d_model) (or not: `cfg.scale_embedding`), with a shared vocabulary tied with the
pre-softmax projection (3.4); sinusoidal positional encodings (3.5), learned ones (Table 3, row
E), or fairseq's sinusoids offset past the padding index (M2M100's and NLLB-200's). Residual
blocks are post-norm as in the paper, LayerNorm(x + Dropout(Sublayer(x))), or pre-norm with
`cfg.pre_norm`, each stack then ending with a LayerNorm. `forward(..., return_attention=True)` also
returns every attention's weights.

Besides training (`forward`), the model serves search: `encode` once, then either `decode` the
whole prefix at every step or keep a `DecoderCache` and feed one token per step (`decode_step`).
Beam search runs g hypotheses per source sentence as g consecutive rows (sentence-major); the
encoder output and its attention keys/values stay one row per sentence, never copied per beam."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..tokenizers import PAD
from .attention import AttentionWeights, MultiHeadAttention
from .loss import label_smoothed_loss


def depths(cfg) -> tuple[int, int]:
    """The encoder's and the decoder's number of layers: model.encoder_layers and
    model.decoder_layers, each `model.layers` where unset."""
    enc, dec = getattr(cfg, "encoder_layers", None), getattr(cfg, "decoder_layers", None)
    return int(enc or cfg.layers), int(dec or cfg.layers)


def sinusoids(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos /
    10000^(2i/d_model)), computed in float64 and rounded to float32 (as transformers' Marian
    table is: an OPUS-MT import decodes with its table to the last bit; fairseq computes its own
    table in float32, s2s.core.inference.formats.fairseq)."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    angle = pos / np.power(10000.0, np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    pe = np.zeros((n_positions, d_model), dtype=np.float32)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return torch.from_numpy(pe)


def offset_sinusoids(n_positions: int, d_model: int, padding_idx: int = 1) -> Tensor:
    """fairseq's sinusoidal table, which M2M100 and NLLB-200 were trained with, for s2s's
    positions 0..n-1: [sin | cos] halves at frequencies 10000^(-i / (d/2 - 1)) (Vaswani et al.'s
    are 10000^(-2i / d)), computed in float32 as fairseq computes them, its positions counted
    from padding_idx + 1 (row padding_idx + 1 + t is position t's)."""
    half = d_model // 2
    scale = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -scale)
    pos = torch.arange(padding_idx + 1 + n_positions, dtype=torch.float)[:, None] * freq[None]
    table = torch.cat([torch.sin(pos), torch.cos(pos)], dim=1)
    if d_model % 2:
        table = torch.cat([table, torch.zeros(table.size(0), 1)], dim=1)
    return table[padding_idx + 1 :]


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computed in fp32 whatever the input's dtype, returned in the input's dtype.

    PyTorch's CPU kernel sums the gain and bias gradients over all positions in the input's
    dtype; in bf16 the sum stalls (3,000 positions of 0.0123 add up to 8, not 36.9)."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        return F.layer_norm(
            x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps
        ).to(x.dtype)


class Dropout(nn.Module):
    """Dropout (section 5.4): zero each value with probability p, scale the rest by 1 / (1 - p).

    On CPU the mask is drawn in the input's dtype, 16 bits a value, four values from each 64-bit
    random number: a quarter of the random numbers torch's dropout draws (p is then a multiple of
    2^-16); a residual connection's x + Dropout(y) is one fused multiply-add (`add`). Elsewhere it
    is torch's fused dropout."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    @property
    def active(self) -> bool:
        return self.training and self.p > 0.0

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.p)

    def keep(self, x: Tensor) -> Tensor:
        """1 with probability 1 - p, else 0, in x's shape and dtype (CPU): compared straight
        into x's dtype, one pass, not a bool mask converted afterwards."""
        n = x.numel()
        bits = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64).view(
            torch.int16
        )
        return torch.ge(
            bits[:n].view(x.shape), round(self.p * 65536) - 32768, out=torch.empty_like(x)
        )

    def forward(self, x: Tensor) -> Tensor:
        if not self.active:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        return torch.mul(x, self.keep(x)).mul_(self.scale)

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """x + Dropout(y)."""
        if self.active and y.device.type == "cpu":
            return torch.addcmul(x, y, self.keep(y), value=self.scale)
        return x + self(y)


class Residual(nn.Module):
    """A sublayer's residual connection: LayerNorm(x + Dropout(f(x))) as in the paper (post-norm),
    or x + Dropout(f(LayerNorm(x))) (pre-norm)."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm, self.drop, self.pre_norm = LayerNorm(d_model), Dropout(dropout), pre_norm

    def forward(self, x: Tensor, f) -> Tensor:
        if self.pre_norm:
            return self.drop.add(x, f(self.norm(x)))
        return self.norm(self.drop.add(x, f(x)))


ACTIVATIONS = {"relu": nn.ReLU, "swish": nn.SiLU}  # swish(x) = x sigmoid(x): OPUS-MT's


class FeedForward(nn.Sequential):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied at each position (or swish for max(0, .)
    with model.activation=swish)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__(
            nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), nn.Linear(d_ff, d_model)
        )


def attention_of(cfg) -> MultiHeadAttention:
    return MultiHeadAttention(
        cfg.d_model,
        cfg.heads,
        cfg.attention_dropout,
        getattr(cfg, "d_k", None),
        getattr(cfg, "d_v", None),
    )


class EncoderLayer(nn.Module):
    """Self-attention over the source, then the feed-forward network."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn = attention_of(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, getattr(cfg, "activation", "relu"))
        self.res1, self.res2 = (Residual(cfg.d_model, cfg.dropout, cfg.pre_norm) for _ in range(2))

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        x = self.res1(x, lambda y: self.self_attn(y, *self.self_attn.keys_values(y), mask))
        return self.res2(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention over the target prefix, attention over the encoder output, then the
    FFN."""

    def __init__(self, cfg):
        super().__init__()
        self.self_attn, self.cross_attn = attention_of(cfg), attention_of(cfg)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, getattr(cfg, "activation", "relu"))
        self.res1, self.res2, self.res3 = (
            Residual(cfg.d_model, cfg.dropout, cfg.pre_norm) for _ in range(3)
        )

    def forward(
        self, x: Tensor, memory_kv, memory_mask: Tensor, kv: Optional[Tensor] = None, step: int = 0
    ) -> Tensor:
        """memory_kv: the encoder output's keys [B, h, S, d_k] and values [B, h, S, d_v] for this
        layer.

        kv None: x is the whole target prefix, masked causally. Otherwise x is one position
        (`step`) and kv [positions, 2, B*g, h, max(d_k, d_v)] this layer's self-attention
        cache: this step's keys and values are written at `step` and the query attends to steps
        0..step."""

        def self_attention(y):
            if kv is None:
                return self.self_attn(y, *self.self_attn.keys_values(y), causal=True)
            return self.self_attn.step(y, kv, step)

        x = self.res1(x, self_attention)
        x = self.res2(x, lambda y: self.cross_attn(y, memory_kv[0], memory_kv[1], memory_mask))
        return self.res3(x, self.ffn)


def _plain(p) -> Optional[Tensor]:
    """A linear layer's weight or bias as an fp32 tensor: int8 layers (dynamic quantisation)
    give theirs by a call, quantised."""
    p = p() if callable(p) else p
    if p is None:
        return None
    return (p.dequantize() if p.is_quantized else p).float()


class SearchMemory(threading.local):
    """Memory that a finished search's caches hand back for the next search in the same thread,
    on a CPU (a GPU's allocator keeps freed memory itself).

    A cache is tens to hundreds of megabytes, which the C library maps afresh for every
    allocation and returns when it is freed, so each page of it would fault on its first write:
    a step of 512 rows of d_model 256 writes 256 new pages a layer (its keys and values), and on
    a virtual machine a fault costs microseconds (docs/performance.md, "Search"). A thread keeps
    at most `KEEP` buffers, the largest; they go with the thread."""

    KEEP = 2

    def __init__(self):
        self.free: list[Tensor] = []

    def take(self, shape: tuple, like: Tensor, headroom: int = 1) -> Tensor:
        """An uninitialised tensor of `shape`, with like's dtype and device, in a kept buffer
        where one is large enough (and made in inference mode if and only if this is); else in
        a new buffer `headroom` times its size, so that later, longer searches fit in it (pages
        never written take no memory, only addresses)."""
        numel = math.prod(shape)
        if like.device.type != "cpu":
            return like.new_empty(shape)
        inference = torch.is_inference_mode_enabled()
        for i, flat in enumerate(self.free):
            fits = flat.dtype == like.dtype and flat.numel() >= numel
            if fits and flat.is_inference() == inference:
                return self.free.pop(i)[:numel].view(shape)
        return like.new_empty(numel * headroom)[:numel].view(shape)

    def give(self, x: Optional[Tensor]) -> None:
        """Keep x's memory (all of its storage) for a later `take`."""
        if x is None or x.device.type != "cpu":
            return
        flat = x.new_empty(0).set_(x.untyped_storage())
        self.free = sorted([*self.free, flat], key=Tensor.numel, reverse=True)[: self.KEEP]


SEARCH_MEMORY = SearchMemory()


@dataclass
class DecoderCache:
    """What incremental decoding keeps between steps; tensors only, laid out so that a step's
    attention reads the keys and values of all rows as one batch of matrices (a view, never a
    copy) from one block of memory.

    memory_kv [N, 2, B, h, S, d]: encoder-decoder keys/values of the N layers, once per sentence,
    keys in the first d_k, values in the first d_v of d = max(d_k, d_v)
    (MultiHeadAttention.split_cached).
    memory_mask [B, 1, 1, S]: True at source positions that may be attended.
    kv [positions, N, 2, B*g, h, d]: self-attention keys/values of the steps done so far,
    position-major: the steps done are the buffer's first bytes, read in sequence by a step's
    attention, and pages past them are never touched. Allocated at the first step for
    `capacity` positions, in memory a finished search handed back where it fits (SearchMemory;
    new memory has room for twice that), doubled when full; spare: a buffer of its shape for a
    reordering that moves every row, made when one first does (reorder_cache).
    capacity: the steps expected. step: the steps done, hence the position of the next token."""

    memory_kv: Tensor
    memory_mask: Tensor
    capacity: int = 16
    kv: Optional[Tensor] = None
    spare: Optional[Tensor] = None
    step: int = 0

    def room(self, rows: int) -> Tensor:
        """The self-attention cache with room for this step's keys and values (allocated at the
        first step for `rows` rows, doubled when full)."""
        N, _, B, h, _, d = self.memory_kv.shape
        if self.kv is None:
            assert rows % B == 0, f"{rows} rows are not a whole number of hypotheses a sentence"
            self.kv = SEARCH_MEMORY.take((self.capacity, N, 2, rows, h, d), self.memory_kv, 2)
        elif self.step == self.kv.size(0):
            grown = SEARCH_MEMORY.take((2 * self.step, *self.kv.shape[1:]), self.kv)
            grown[: self.step] = self.kv
            SEARCH_MEMORY.give(self.kv)
            SEARCH_MEMORY.give(self.spare)
            self.kv, self.spare = grown, None
        return self.kv

    def release(self) -> None:
        """Hand the self-attention cache's memory back (SearchMemory): the search is over."""
        SEARCH_MEMORY.give(self.kv)
        SEARCH_MEMORY.give(self.spare)
        self.kv = self.spare = None


class Transformer(nn.Module):
    """Encoder-decoder Transformer; `cfg` has ModelConfig's fields (layers, d_model, d_ff, heads,
    ...).

    With `shared_vocab` the encoder and decoder embeddings and the pre-softmax projection are one
    tensor (section 3.4). With separate vocabularies the projection is its own matrix, N(0,
    d_model^-0.5) as fairseq's, unless `cfg.tie_output` ties it to the decoder embedding: tied, a
    small target vocabulary (parsing's 60 tokens) learns slower per update, each row serving at once
    as an input embedding and as a softmax class everywhere (docs/parsing.md, "Learning speed")."""

    def __init__(self, cfg, src_vocab_size: int, tgt_vocab_size: int, shared_vocab: bool):
        super().__init__()
        self.d_model, self.d_ff, self.max_positions = cfg.d_model, cfg.d_ff, cfg.max_positions
        self.tgt_embed = nn.Embedding(tgt_vocab_size, cfg.d_model, padding_idx=PAD)
        if shared_vocab:
            assert src_vocab_size == tgt_vocab_size, "a shared vocabulary needs equal sizes"
            self.src_embed = self.tgt_embed
        else:
            self.src_embed = nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=PAD)
        # learned positions (Table 3, row E) are a parameter; the sinusoid buffer `pe` is then
        # empty, kept for its dtype, the activations' (s2s.core.nn.precision casts buffers, not
        # embeddings)
        kind = getattr(cfg, "positions", "sinusoid")
        learned = kind == "learned"
        self.pos_embed = nn.Embedding(cfg.max_positions, cfg.d_model) if learned else None
        table = offset_sinusoids if kind == "offset_sinusoid" else sinusoids
        self.register_buffer(
            "pe",
            torch.zeros(0, cfg.d_model) if learned else table(cfg.max_positions, cfg.d_model),
            persistent=False,
        )
        # x sqrt(d_model) (section 3.4), or 1 with model.scale_embedding=false
        self.embed_scale = math.sqrt(cfg.d_model) if getattr(cfg, "scale_embedding", True) else 1.0
        self.drop = Dropout(cfg.dropout)
        n_enc, n_dec = depths(cfg)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_enc))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(n_dec))
        # pre-norm leaves the residual stream unnormalised: each stack ends with a LayerNorm
        self.enc_norm = LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.dec_norm = LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        # a bias only with model.output_bias (OPUS-MT's final logits bias)
        self.out = nn.Linear(
            cfg.d_model, tgt_vocab_size, bias=bool(getattr(cfg, "output_bias", False))
        )
        if getattr(cfg, "output_bias_fixed", False):  # an import's, held as imported
            self.out.bias.requires_grad_(False)
        self.tied_output = shared_vocab if cfg.tie_output is None else cfg.tie_output
        if self.tied_output:
            self.out.weight = self.tgt_embed.weight  # the pre-softmax projection is the embedding
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Zero biases; embeddings N(0, d_model^-0.5), PAD row zero, learned positions too
        (fairseq's: small beside the scaled token embeddings, whose entries start near std 1, so
        that a token's identity dominates its first input); attention's W^Q, W^K, W^V Xavier-uniform
        as if the three were one [h (2 d_k + d_v), d_model] matrix (gain 1/sqrt(2) when d_k = d_v =
        d_model / h), W^O Xavier-uniform; the feed-forward weights U(+-1/sqrt(fan_in)), which keeps
        each FFN's residual branch small at the start (W_2's bound is half Xavier's at d_ff = 4
        d_model). With Xavier everywhere a small parser learned far slower per update
        (docs/parsing.md, "Learning speed")."""
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, MultiHeadAttention):
                d, hk, hv = m.w_q.in_features, m.w_q.out_features, m.w_v.out_features
                for w in (m.w_q, m.w_k, m.w_v):  # fan_out of the three together: 2 hk + hv
                    nn.init.xavier_uniform_(
                        w.weight, gain=((d + w.out_features) / (d + 2 * hk + hv)) ** 0.5
                    )
                nn.init.xavier_uniform_(m.w_o.weight)
            elif isinstance(m, FeedForward):
                for w in (m[0], m[2]):
                    nn.init.uniform_(w.weight, -(w.in_features**-0.5), w.in_features**-0.5)
        if self.out.weight is not self.tgt_embed.weight:
            nn.init.normal_(self.out.weight, 0.0, self.d_model**-0.5)
        for emb in dict.fromkeys([self.tgt_embed, self.src_embed]):  # a shared one once
            nn.init.normal_(emb.weight, 0.0, self.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed.weight, 0.0, self.d_model**-0.5)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # parameters() yields a tied tensor once

    def flops(self, src_lens, tgt_lens, backward: bool = True, attention: bool = True) -> float:
        """Matmul FLOPs (2mkn a product) of training (`backward`) or of a forward pass over pairs of
        these real lengths (numbers or arrays, an entry a pair: padding is waste, not work), what
        model-FLOPs utilisation divides by. S, T: a pair's source and target tokens (with EOS /
        BOS), N (M) layers in the encoder (decoder), d = d_model, V the target vocabulary,
        a = h d_k, b = h d_v (d both by default):

            training = 3 forward             the backward pass costs twice the forward
            forward = 2 (S P_src + T P_tgt) + A
                P: the weights a token is multiplied by
            P_src = N (2 d (a + b) + 2 d d_ff) + M d (a + b)
                encoder Q, K, V, O, FFN; the decoder's cross-attention K, V
            P_tgt = M (3 d (a + b) + 2 d d_ff) + d V
                decoder self-attention Q, K, V, O, cross-attention Q, O, FFN; the output layer
            A = (a + b) (2 N S^2 + M T (T + 1) + 2 M T S)
                Q K^T and weights x V; causal pairs only

        Embeddings, biases, norms, softmax, dropout, loss and Adam count 0. Without `attention`
        (small in a search step) only the lengths' sums matter: a search's source tokens and decoder
        rows will do."""
        S, T = np.asarray(src_lens, dtype=np.float64), np.asarray(tgt_lens, dtype=np.float64)
        N, M = len(self.encoder), len(self.decoder)
        d, d_ff, V = self.d_model, self.d_ff, self.out.out_features
        att = self.encoder[0].self_attn
        ab = att.h * (att.d_k + att.d_v)  # a + b
        p_src, p_tgt = (
            N * (2 * d * ab + 2 * d * d_ff) + M * d * ab,
            M * (3 * d * ab + 2 * d * d_ff) + d * V,
        )
        forward = 2 * (S * p_src + T * p_tgt)
        if attention:
            forward = forward + ab * (2 * N * S * S + M * T * (T + 1) + 2 * M * T * S)
        return float((3 if backward else 1) * forward.sum())

    def embed(self, emb: nn.Embedding, tokens: Tensor, start: int = 0) -> Tensor:
        """Dropout(Embedding(tokens) * sqrt(d_model) + PE) (x 1 without model.scale_embedding),
        positions from `start`, in the dtype of
        the buffer `pe` (that of the activations: s2s.core.nn.precision casts it with the weights).
        Learned positions are added in their table's dtype, then cast: the gradient of a position's
        row, a sum over the batch, is summed in fp32 when the table is (as the token
        embeddings')."""
        end = start + tokens.size(1)
        if end > self.max_positions:
            raise ValueError(
                f"position {end - 1} is beyond model.max_positions={self.max_positions}"
            )
        if self.pos_embed is not None:
            x = emb(tokens) * self.embed_scale + self.pos_embed.weight[start:end]
            return self.drop(x.to(self.pe.dtype))
        return self.drop(emb(tokens).to(self.pe.dtype) * self.embed_scale + self.pe[start:end])

    def position_table(self) -> Tensor:
        """The positional encodings added at each position, [max_positions, d_model]."""
        return self.pe if self.pos_embed is None else self.pos_embed.weight

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src [B, S] -> memory [B, S, d_model] and src_pad [B, S] (True at PAD)."""
        src_pad = src.eq(PAD)
        x = self.embed(self.src_embed, src)
        mask = self.key_mask(src_pad)
        for layer in self.encoder:
            x = layer(x, mask)
        return self.enc_norm(x), src_pad

    @staticmethod
    def key_mask(src_pad: Tensor) -> Tensor:
        """[B, 1, 1, S], True where a source key may be attended."""
        keep = ~src_pad
        keep[:, 0] |= src_pad.all(
            1
        )  # an all-PAD row attends to its first position, not to nothing (NaN)
        return keep[:, None, None, :]

    def decoder_states(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
        """tgt_in [B*g, T] (BOS y_1 ..., right-padded) -> the decoder's final states [B*g, T,
        d_model], each position seeing only the positions before it. g > 1 consecutive rows may
        share one sentence's memory."""
        mask = self.key_mask(src_pad)
        x = self.embed(self.tgt_embed, tgt_in)
        for layer in self.decoder:
            x = layer(x, layer.cross_attn.keys_values(memory), mask)
        return self.dec_norm(x)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad: Tensor) -> Tensor:
        """tgt_in [B*g, T] -> logits [B*g, T, V] (decoder_states, projected)."""
        return self.out(self.decoder_states(tgt_in, memory, src_pad))

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        tgt_out: Optional[Tensor] = None,
        label_smoothing: float = 0.0,
        return_attention: bool = False,
    ):
        """Logits [B, T, V]; or, given the targets tgt_out [B, T], the summed label-smoothed
        loss and NLL over its non-PAD tokens (s2s.core.nn.loss.label_smoothed_loss), which
        projects the decoder states chunk by chunk: training never holds the whole logits.

        With `return_attention`, (that, AttentionWeights): the weights every attention computed
        its output with in this pass (equation 1 written out instead of the fused kernel)."""
        if return_attention:
            return self._with_attention(src, tgt_in, tgt_out, label_smoothing)
        states = self.decoder_states(tgt_in, *self.encode(src))
        if tgt_out is None:
            return self.out(states)
        # tied, the projection is the embedding's table, which LowPrecision leaves in fp32 (the
        # module `out` holds its cast): the loss casts it itself and returns its gradient in fp32
        weight = self.tgt_embed.weight if self.tied_output else self.out.weight
        return label_smoothed_loss(states, weight, tgt_out, label_smoothing, self.out.bias)

    def log_probs(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """log p(y_t | y_<t, x) [B, T, V] in fp32 whatever the model's precision: the decoder
        states projected in fp32 (from a 16-bit or int8 model's weights, widened), so that a
        reported score is not a logit rounded to 16 bits (steps of 2^-3 at |z| in [16, 32))."""
        states = self.decoder_states(tgt_in, *self.encode(src)).float()
        weight, bias = (_plain(p) for p in (self.out.weight, self.out.bias))
        logits = F.linear(states, weight, None if bias is None else bias)
        return torch.log_softmax(logits, dim=-1)

    def _with_attention(self, *args):
        kinds = AttentionWeights()
        modules = (
            [(layer.self_attn, kinds.encoder) for layer in self.encoder]
            + [(layer.self_attn, kinds.decoder) for layer in self.decoder]
            + [(layer.cross_attn, kinds.cross) for layer in self.decoder]
        )
        for m, _ in modules:
            m.recorded = []
        try:
            result = self.forward(*args)
            for m, where in modules:
                where.extend(m.recorded)
        finally:
            for m, _ in modules:
                m.recorded = None
        return result, kinds

    # -- incremental decoding for search ---------------------------------------------------
    def init_cache(self, memory: Tensor, src_pad: Tensor, capacity: int = 16) -> DecoderCache:
        """Compute the encoder-decoder keys and values of every layer once per sentence;
        `capacity`: the number of steps expected (more are possible, at the cost of a copy)."""
        memory_kv = torch.stack(
            [layer.cross_attn.cached_keys_values(memory) for layer in self.decoder]
        )
        return DecoderCache(memory_kv, self.key_mask(src_pad), max(1, capacity))

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Feed tokens [B*g] at position cache.step; return logits [B*g, V] for the next token.

        Equal to decode(prefix)[:, -1]; rows b*g .. b*g+g-1 belong to sentence b of the cache."""
        n, step = tokens.size(0), cache.step
        kv = cache.room(n)
        x = self.embed(self.tgt_embed, tokens[:, None], start=step)
        for i, layer in enumerate(self.decoder):
            x = layer(
                x,
                layer.cross_attn.split_cached(cache.memory_kv[i]),
                cache.memory_mask,
                kv[:, i, :, :n],
                step,
            )
        cache.step += 1
        return self.out(self.dec_norm(x[:, 0]))

    @staticmethod
    def reorder_cache(
        cache: DecoderCache, index: Tensor, keep: Optional[Tensor] = None
    ) -> DecoderCache:
        """Row i continues the hypothesis of row index[i] (in place; returns the cache).

        index[i] must be a row of the same sentence as row i, as in beam search: the encoder
        keys/values are per sentence and stay untouched; only the self-attention cache moves.
        With `keep` (sentence numbers) the cache holds those sentences only from now on, in that
        order; index then lists g rows for each kept sentence, in the same order. Only the rows
        that change are copied, in place, when no copy reads a row another writes (as beam
        search arranges: s2s.core.decode.beam.stable_slots); otherwise all, via the spare
        buffer. On a CPU each moved row is one (strided) copy of its steps done, row to row:
        indexing would gather the rows into a temporary and scatter them back, twice the memory
        traffic (a GPU takes the indexing: one kernel)."""
        if keep is not None:
            cache.memory_kv = cache.memory_kv.index_select(2, keep)
            cache.memory_mask = cache.memory_mask.index_select(0, keep)
        if cache.kv is not None and cache.step > 0:
            n, t = index.size(0), cache.step
            moved = index.ne(torch.arange(n, device=index.device))
            src = index[dst := moved.nonzero().squeeze(1)]
            done = cache.kv[:t]  # only the steps done
            if not moved[src[src.lt(n)]].any():
                if done.device.type == "cpu":
                    for row, source in zip(dst.tolist(), src.tolist()):
                        done[:, :, :, row].copy_(done[:, :, :, source])
                else:
                    done[:, :, :, dst] = done[:, :, :, src]
                return cache
            if cache.spare is None:
                cache.spare = SEARCH_MEMORY.take(cache.kv.shape, cache.kv)
            torch.index_select(done, 3, index, out=cache.spare[:t, :, :, :n])
            cache.kv, cache.spare = cache.spare, cache.kv
        return cache
