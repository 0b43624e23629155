"""Sampling: outputs drawn from the model's distribution instead of searched for, each
sentence from a generator of its own (its draws never depend on its batch-mates), with the
temperature, top-k, top-p and epsilon filters, and their one check (`Sampling.problem`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..contract.checks import SEED_MAX, number_problem, shown, whole_number_problem
from ..tokenizers import BOS, EOS, PAD
from .steps import Stepper, keep_order


@dataclass(frozen=True)
class Sampling:
    """Draw outputs instead of searching for the best: each next token from the model's
    distribution (after the constraint), sharpened or flattened by `temperature`, limited to the
    `top_k` most probable tokens (0: all), to the smallest set whose probability reaches
    `top_p` (1: all) and to the tokens of probability `epsilon` or more (epsilon sampling,
    Hewitt et al. 2022; 0: all). `seed` makes the draws repeat: each sentence draws from a
    generator of its own, seeded by the seed and the sentence's ids (`sentence_generators`), so
    its samples never depend on the sentences searched beside it.

    `problem` is the one check of these settings that the command line, the server and the
    Python API share: the bounds (`TEMPERATURE`, `TOP_P`, `SEED_MAX`) keep logp / temperature
    and the nucleus inside float32, where the draws are computed."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    epsilon: float = 0.0

    def problem(self) -> str | None:
        """What is wrong with the settings, as `option value: why`, or None."""
        checks = (
            ("temperature", number_problem(self.temperature, *TEMPERATURE)),
            ("top-k", whole_number_problem(self.top_k, 0, TOP_K_MAX)),
            ("top-p", number_problem(self.top_p, *TOP_P, low_open=True)),
            ("epsilon", number_problem(self.epsilon, 0.0, 0.5)),
            ("seed", whole_number_problem(self.seed, 0, SEED_MAX)),
        )
        for name, problem in checks:
            if problem:
                return f"{name} {shown(getattr(self, name.replace('-', '_')))}: {problem}"
        return None


#: the temperatures a draw takes: logp / T stays well inside float32 (|logp| up to 10^4 gives at
#: most 10^7), and at the bounds the draws are already greedy search's (0.001: a token 0.01 nats
#: behind the best is e^10 times less likely) or nearly uniform (1000); beyond them inf, 1e300 or
#: 1e-45 over- or underflow float32 and every draw is one token
TEMPERATURE = (0.001, 1000.0)


#: top-p in (0.001, 1]: below, the nucleus is the best token alone (greedy search) and values
#: such as 1e-300 round to 0 in float32, where no token is kept
TOP_P = (0.001, 1.0)


TOP_K_MAX = 2**31 - 1  # at least every token of any vocabulary


def sample(
    step: Stepper, max_len: Tensor, lp, n: int, sampling: Sampling, generators: list
) -> tuple[Tensor, Tensor]:
    """n outputs drawn for each of B sentences (b*n rows, sentence-major) [B, n, L], best score
    first, and their scores [B, n]: the sum of the log-probabilities the search sees (the model's,
    after the constraint), untempered, over lp(Y), as beam search scores.

    Each row draws its next token from softmax(logp / temperature) (`draw`); rows that have
    ended take EOS until their sentence leaves the batch, once its n rows have ended."""
    B, device = max_len.size(0), max_len.device
    seqs = torch.full((B * n, int(max_len.max()) + 2), PAD, dtype=torch.long, device=device)
    seqs[:, 0] = BOS
    logp_sum = torch.zeros(B * n, device=device)
    length = torch.ones(B * n, dtype=torch.long, device=device)
    alive = torch.arange(B, device=device)  # the sentences of the batch, original numbers
    within = torch.arange(n, device=device)
    live = torch.ones(B * n, dtype=torch.bool, device=device)
    tokens = torch.full((B * n, 1), BOS, dtype=torch.long, device=device)
    acc = torch.zeros(B * n, device=device)
    ml_rows = max_len.repeat_interleave(n)
    for t in range(int(max_len.max()) + 1):
        logp = step(tokens, ml_rows, t)
        # n uniform numbers a sentence still searched, from its own generator, whether or not
        # each of its rows has ended: a sentence's draws depend on itself alone
        uniform = torch.cat([torch.rand(n, 1, generator=generators[i], device=device)
                             for i in alive.tolist()])  # fmt: skip
        next_tok = draw(filtered(logp, sampling), uniform)
        got = logp.gather(1, next_tok[:, None]).squeeze(1)
        acc += torch.where(live, got, 0.0)
        next_tok = torch.where(live, next_tok, EOS)
        ends = (next_tok.eq(EOS) | ml_rows.le(t)) & live  # at the maximum length: EOS, or cut
        rows = (alive[:, None] * n + within).view(-1)
        seqs[rows[live], t + 1] = next_tok[live]
        logp_sum[rows[ends]], length[rows[ends]] = acc[ends], t + 1
        live &= ~ends
        done = ~live.view(-1, n).any(1)
        n_done = int(done.sum())  # the step's one wait for the device
        if n_done == alive.size(0):
            break
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
        if n_done and step.can_shrink:
            keep = keep_order(done)
            index = (keep[:, None] * n + within).view(-1)
            alive, live, acc, ml_rows, tokens = (
                alive[keep],
                live[index],
                acc[index],
                ml_rows[index],
                tokens[index],
            )
            step.reorder(index, keep)
    scores = (logp_sum / lp(length.float())).view(B, n)
    scores, order = scores.sort(dim=1, descending=True, stable=True)
    seqs = seqs.view(B, n, -1).gather(1, order[..., None].expand(B, n, seqs.size(1)))
    return seqs, scores


def draw(x: Tensor, uniform: Tensor) -> Tensor:
    """One token a row of x [n, V] drawn with probability softmax(x), by the inverse of the
    cumulative distribution: one uniform number a row (`uniform` [n, 1], in [0, 1)) and a
    search in the row's running sum.
    That is exact, and on a CPU several times faster than torch.multinomial or the Gumbel-max
    trick, which draw or transform a random number for every token of the vocabulary. A row
    with no finite value (one that has ended) gets some token; the caller replaces it."""
    weights = (x - x.amax(1, keepdim=True)).exp_().cumsum_(1)  # the best token weighs 1
    u = uniform * weights[:, -1:]
    return torch.searchsorted(weights, u, right=True).squeeze(1).clamp_(max=x.size(1) - 1)


def sentence_generators(seed: int, src: Tensor) -> list[torch.Generator]:
    """A random generator for each source row of src [B, S], seeded by `seed` and the row's ids
    (a stable hash of both): the same sentence draws the same numbers in any batch, alone or
    among others, at any place."""
    found = []
    for row in src.tolist():
        ids = ",".join(map(str, (i for i in row if i != PAD)))
        digest = hashlib.blake2b(f"{seed}:{ids}".encode(), digest_size=8).digest()
        key = int.from_bytes(digest, "little") >> 1  # below 2^63
        found.append(torch.Generator(src.device).manual_seed(key))
    return found


def filtered(logp: Tensor, sampling: Sampling) -> Tensor:
    """logp [n, V] / temperature, -inf outside the top_k tokens, the top_p nucleus (the
    smallest set of most probable tokens whose probability reaches top_p) and the tokens of
    probability epsilon or more (of the model's own distribution); the best always in."""
    x = logp / sampling.temperature if sampling.temperature != 1 else logp.clone()
    if sampling.epsilon > 0:
        floor = logp.amax(1, keepdim=True).clamp(max=math.log(sampling.epsilon))
        x.masked_fill_(logp < floor, -torch.inf)
    if sampling.top_k and sampling.top_k < x.size(1):
        kth = x.topk(sampling.top_k, dim=1).values[:, -1:]
        x.masked_fill_(x < kth, -torch.inf)
    if sampling.top_p < 1:
        sorted_x, order = x.sort(dim=1, descending=True)
        probs = torch.softmax(sorted_x, dim=1)
        before = probs.cumsum(1) - probs  # the probability of the better tokens
        cut = before.ge(sampling.top_p)
        x.scatter_(1, order, sorted_x.masked_fill(cut, -torch.inf))
    return x
