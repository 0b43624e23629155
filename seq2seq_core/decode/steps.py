"""One step of a search: the next-token log-probabilities of the hypotheses still searched
(`Stepper`: the model's, fp32, after the task's constraint, EOS forced at the maximum length),
and what every strategy (`s2s.core.decode.beam`, `s2s.core.decode.sampling`) shares: the
length penalty that scores a finished output, the k best of a row (`top_k`) and the order the
remaining sentences take when some leave the batch (`keep_order`).
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from ..contract.task import DecodeDefaults
from ..tokenizers import BOS, EOS, PAD


def length_penalty(length, alpha: float, form: str = "gnmt"):
    """lp(Y) for a number or a tensor of lengths |Y|: ((5 + |Y|) / 6)^alpha (form "gnmt", Wu et
    al. 2016), or |Y|^alpha ("power": fairseq's lenpen, Marian's normalisation, transformers'
    length_penalty)."""
    if form == "power":
        return length**alpha
    return ((5.0 + length) / 6.0) ** alpha


def penalty(settings: DecodeDefaults):
    """The length penalty of `settings` (its alpha and form) as a function of |Y|."""
    return lambda length: length_penalty(length, settings.alpha, settings.length_penalty)


def top_k(x: Tensor, k: int, chunks: int = 64) -> tuple[Tensor, Tensor]:
    """The k largest values of each row of x [n, m] and their positions, largest first, as
    torch.topk (ties may pick other positions), in a fraction of its time over long rows on a CPU.

    For any partition of a row into chunks, its k largest values lie in the k chunks with the
    largest maxima: a value outside them would have those k maxima above it. The row is cut
    into `chunks` strided chunks (position j in chunk j mod chunks, so the chunk maxima are one
    vectorised reduction), and topk runs over the k best chunks and the m mod chunks last
    positions only.
    """
    n, m = x.shape
    L = m // chunks
    if L <= 4 * k or x.device.type != "cpu":  # short rows, or a GPU, where torch.topk is one kernel
        return x.topk(k, dim=1)
    grid = x[:, : L * chunks].view(n, L, chunks)
    best = grid.amax(1).topk(k, dim=1).indices  # [n, k] chunks
    cand = grid.gather(2, best[:, None, :].expand(n, L, k)).reshape(n, L * k)
    rest = x[:, L * chunks :]
    if rest.size(1):
        cand = torch.cat([cand, rest], dim=1)
    values, pos = cand.topk(k, dim=1)
    in_grid = pos < L * k
    pos_grid = pos.clamp(max=L * k - 1)
    index = torch.where(
        in_grid,
        torch.div(pos_grid, k, rounding_mode="floor") * chunks + best.gather(1, pos_grid % k),
        pos - L * k + L * chunks,
    )
    return values, index


def keep_order(done: Tensor) -> Tensor:
    """The sentences that remain, in the order their rows will have: the last ones fill the
    places of those that leave, so that only their rows move (not all that follow a gap)."""
    stay = (~done).nonzero().squeeze(1)
    m = stay.size(0)
    keep = torch.arange(m, device=done.device)
    holes = done[:m].nonzero().squeeze(1)
    keep[holes] = stay[stay.ge(m)]
    return keep


class Stepper:
    """Next-token log-probabilities for the prefixes of the sentences still searched, incrementally
    or by recomputing; `reorder` moves hypotheses and, where the model allows, drops sentences."""

    def __init__(
        self,
        model,
        encoded: tuple[Tensor, Tensor],
        capacity: int,
        incremental: bool,
        constrained: tuple | None = None,
        truncate: bool = False,
        min_len: int = 0,
    ):
        """`encoded`: the encoder's (memory, src_pad); `capacity`: the most steps; `constrained`:
        a constraint and its state, one row per sentence; `truncate`: a row at its maximum length
        takes any token and ends there (transformers' `generate`), not only </s>; `min_len`: </s>
        is not taken before that many tokens (fairseq's --min-len)."""
        self.truncate, self.min_len = truncate, min_len
        self.model, (self.memory, src_pad) = model, encoded
        self.src_pad = src_pad
        self.constraint, self.state = constrained or (None, None)
        self.cache = None
        if incremental:
            self.cache = (
                model.init_cache(self.memory, src_pad, capacity=capacity)
                if accepts(model.init_cache, "capacity")
                else model.init_cache(self.memory, src_pad)
            )
            self.memory = self.src_pad = None  # the cache holds what the steps read of them
        # finished sentences leave the batch, unless the model's cache cannot drop sentences
        self.can_shrink = self.cache is None or accepts(model.reorder_cache, "keep")
        self.banned = torch.tensor([PAD, BOS], device=src_pad.device)
        self.logp = None  # [rows, V] fp32, reused by every step: the rows only ever shrink
        self._max_len, self._ends_at = None, set()

    def __call__(self, tokens: Tensor, max_len: Tensor, t: int) -> Tensor:
        """tokens [n, t+1] (BOS and t outputs) -> log-probs [n, V] in fp32, in a buffer that the
        next step overwrites; rows at max_len may only end (pass the same max_len tensor while
        the rows stay: its values are read from the device once)."""
        if self.cache is not None:
            logits = self.model.decode_step(tokens[:, -1], self.cache)
        else:
            logits = self.model.decode(tokens, self.memory, self.src_pad)[:, -1]
        if self.logp is None:
            self.logp = logits.new_empty(logits.shape, dtype=torch.float32)
        # into the buffer: a fresh [n, V] tensor per step is a new mapping of memory to fault in,
        # which cost more than the softmax (decode figures: docs/performance.md). bf16 logits are
        # copied in first: the kernel's own bf16-to-fp32 path is slower than the copy and an
        # in-place softmax.
        logp = self.logp[: logits.size(0)]
        torch.log_softmax(
            logits if logits.dtype == torch.float32 else logp.copy_(logits), dim=-1, out=logp
        )
        logp.index_fill_(1, self.banned, -torch.inf)
        if max_len is not self._max_len:  # the lengths the rows end at, read once per batch of rows
            self._max_len, self._ends_at = max_len, set(max_len.tolist())
        at_max = max_len.eq(t) if t in self._ends_at and not self.truncate else None
        if at_max is not None:
            eos = logp[at_max, EOS]  # the model's, even where a constraint would not allow it
        if t < self.min_len:
            logp[:, EOS] = -torch.inf
        if self.constraint is not None:
            if t == 0:  # one state per sentence, repeated for its rows
                self.state = tuple(
                    s.repeat_interleave(tokens.size(0) // s.size(0), dim=0) for s in self.state
                )
            else:
                self.state = self.constraint.advance(self.state, tokens[:, -1])
            logp = self.constraint.score(self.state, logp, max_len - t)
        if at_max is not None:  # hypotheses that reached the maximum length are finalised with EOS
            logp[at_max] = -torch.inf
            logp[at_max, EOS] = eos
        return logp

    def release(self) -> None:
        """The search is over: its caches may hand their memory back (DecoderCache.release)."""
        for cache in self.cache if isinstance(self.cache, list) else [self.cache]:
            if hasattr(cache, "release"):
                cache.release()

    def reorder(self, index: Tensor, keep: Tensor | None = None) -> None:
        """Row i continues row index[i]; with `keep`, only those sentences (ascending) remain."""
        if keep is not None and self.memory is not None:  # an ensemble's: one a model
            memory = self.memory if isinstance(self.memory, list) else [self.memory]
            memory = [x.index_select(0, keep) for x in memory]
            self.memory = memory if isinstance(self.memory, list) else memory[0]
            self.src_pad = self.src_pad.index_select(0, keep)
        if self.state is not None:
            self.state = tuple(s.index_select(0, index) for s in self.state)
        if self.cache is not None:
            if keep is None:
                self.model.reorder_cache(self.cache, index)
            else:
                self.model.reorder_cache(self.cache, index, keep=keep)


def accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
