"""Dynamic beam allocation (Post and Vilar 2018): a beam divided into banks by how much of a
constraint its hypotheses have met, so that hypotheses that place a term are not crowded out by
those that put it off (which score higher until they pay for the term).

At each step of a sentence the candidates are the 2k best extensions of its k hypotheses (what
unconstrained beam search takes), each hypothesis's own best token, and each token that moves a
constraint on from each hypothesis (`Constraint.candidates`); a candidate's bank is how much of
the constraint it has met (`Constraint.met`: for terms, the number of terms). The k that stay
are dealt out by rank within the banks: every bank's best first, then every bank's second best,
and so on; among candidates of one rank, the higher score first. A candidate that ends (EOS)
joins the finished outputs, not the beam, so it takes no rank: a bank whose best candidate ends
keeps its place for its best live one. So with fewer banks than the beam holds each bank gets
its share, a bank with fewer candidates leaving its places to the others; with more banks,
the best-scoring bank leaders. Within a bank, and between the finished outputs, the model's
score alone decides. Hu et al. (2019) vectorise the allocation over the
batch; so does this, with sorts and a running count per bank.

Two choices differ from Post and Vilar's, each measured on Multi30k's val split (terms in the
source and the reference, beam 4, `python -m bench.decoding.terminology --split val --beams 4`
before issue 77's fixes; docs/decoding.md):
banks count terms met, not term tokens met (a word of three subwords made three banks, more than
a beam of 4 holds, so the hypotheses that had met nothing yet lost every place), and a rank's
ties go to the higher score, not to the bank that met more.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tokenizers import EOS


def allocate(
    constraint, state: tuple, total: Tensor, score: Tensor, index: Tensor, k: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The candidates of b sentences in the order the beam takes them, and their keys.

    `total` [b, k*V]: each sentence's hypotheses' scores after each token (row-major: index
    i is row i // V, token i % V); `score`, `index` [b, 2k]: its 2k best; `state`: the
    constraint's state of the b*k rows. Returns (score, index, key) [b, P], P >= 2k, with no
    candidate twice, sorted by key, highest first: the beam keeps the first k that do not end;
    a key of -inf is no candidate."""
    b, V = total.size(0), total.size(1) // k
    rows = total.view(b * k, V)
    extra = torch.cat([constraint.candidates(state), rows.argmax(1, keepdim=True)], dim=1)
    within = torch.arange(k, device=total.device).repeat(b)[:, None] * V  # row's offset
    index = torch.cat([index, (extra + within).view(b, -1)], dim=1).sort(1).values
    twice = torch.zeros_like(index, dtype=torch.bool)
    twice[:, 1:] = index[:, 1:].eq(index[:, :-1])
    score = total.gather(1, index).masked_fill(twice, -torch.inf)

    row = (torch.arange(b, device=total.device)[:, None] * k + index // V).view(-1)
    parent = tuple(s.index_select(0, row) for s in state)
    bank = constraint.met(parent, (index % V).view(-1, 1)).view(b, -1)

    # each candidate's rank within its bank by score: a running count of each bank's live
    # candidates in score order (one that ends takes the rank of the next live one, before
    # it); then the candidates by rank, in score order within a rank, the non-candidates last
    order = score.argsort(dim=1, descending=True, stable=True)
    bank = bank.gather(1, order)
    ends = (index.gather(1, order) % V).eq(EOS)
    live = torch.nn.functional.one_hot(bank, int(bank.max()) + 1) * ~ends[..., None]
    rank = live.cumsum(1).gather(2, bank[..., None])[..., 0] + ends
    rank = rank.masked_fill(score.gather(1, order).isneginf(), index.size(1))
    order = order.gather(1, rank.argsort(dim=1, stable=True))
    score, index = score.gather(1, order), index.gather(1, order)
    key = -torch.arange(index.size(1), device=index.device, dtype=score.dtype).expand_as(score)
    return score, index, key.masked_fill(score.isneginf(), -torch.inf)
