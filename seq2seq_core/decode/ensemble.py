"""Several models decoded as one (an ensemble): at every step, the average of their next-token
probabilities.

An ensemble's next-token distribution is the mean of its models' distributions, p(y) = 1/M sum_m
p_m(y), computed in log space as logsumexp_m(log p_m(y)) - log M. That is what fairseq, Sockeye,
Marian and OpenNMT-py do by default: averaging probabilities (a mixture) keeps a token that one
model is sure of and another doubts, where averaging log-probabilities (a product of experts)
lets one model's near-zero veto it; for models of one kind trained with different seeds the
two rank alike, and the mixture is a distribution, so the scores mean what a single model's
mean. Each model keeps its own key/value cache, shape and precision; the search sees one model.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor, nn


class Ensemble(nn.Module):
    """Models with one source and target vocabulary, as one model to `s2s.core.decode.search`
    (encode / decode / init_cache / decode_step / reorder_cache): `decode` and `decode_step`
    return the ensemble's log-probabilities, which log_softmax leaves as they are."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        self.models = nn.ModuleList(models)
        self.max_positions = min(m.max_positions for m in models)

    def encode(self, src: Tensor) -> tuple[list[Tensor], Tensor]:
        encoded = [m.encode(src) for m in self.models]
        return [memory for memory, _ in encoded], encoded[0][1]

    def decode(self, tgt_in: Tensor, memory: list[Tensor], src_pad: Tensor) -> Tensor:
        return self.mixture([m.decode(tgt_in, x, src_pad) for m, x in zip(self.models, memory)])

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Log-probabilities [B, T, V] of every next token given tgt_in [B, T]."""
        return self.decode(tgt_in, *self.encode(src))

    def log_probs(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The mixture of the models' fp32 log-probabilities (each model's `log_probs`)."""
        return self.mixture([m.log_probs(src, tgt_in) for m in self.models])

    def init_cache(self, memory: list[Tensor], src_pad: Tensor, capacity: int = 16) -> list:
        return [m.init_cache(x, src_pad, capacity=capacity) for m, x in zip(self.models, memory)]

    def decode_step(self, tokens: Tensor, cache: list) -> Tensor:
        return self.mixture([m.decode_step(tokens, c) for m, c in zip(self.models, cache)])

    def reorder_cache(self, cache: list, index: Tensor, keep: Optional[Tensor] = None) -> list:
        for m, c in zip(self.models, cache):
            m.reorder_cache(c, index, keep=keep)
        return cache

    @staticmethod
    def mixture(logits: list[Tensor]) -> Tensor:
        """log(1/M sum_m softmax(logits_m)), in fp32 whatever the models' precision."""
        logp = torch.stack([torch.log_softmax(x.float(), dim=-1) for x in logits])
        return torch.logsumexp(logp, dim=0) - math.log(len(logits))
