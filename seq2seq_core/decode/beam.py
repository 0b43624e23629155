"""Greedy search and batched beam search (sections 6.1 and 6.3 of the paper: beam 4 and 21),
each over many sentences at once, a sentence leaving the batch once its search is over.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..contract.task import DecodeDefaults
from ..tokenizers import BOS, EOS, PAD
from . import constraints
from .banks import allocate
from .steps import Stepper, keep_order, penalty, top_k


def greedy(step: Stepper, max_len: Tensor, lp) -> tuple[Tensor, Tensor]:
    """Take the most probable token at each step; a sentence leaves the batch at its EOS."""
    B, device = max_len.size(0), max_len.device
    seqs = torch.full((B, int(max_len.max()) + 2), PAD, dtype=torch.long, device=device)
    seqs[:, 0] = BOS
    logp_sum = torch.zeros(B, device=device)
    length = torch.zeros(B, dtype=torch.long, device=device)  # |Y|, set when a sentence ends
    alive = torch.arange(B, device=device)  # the sentences of the batch rows, original numbers
    live = torch.ones(
        B, dtype=torch.bool, device=device
    )  # rows still searched (all, when shrinking)
    tokens = seqs[:, :1]
    acc = torch.zeros(B, device=device)
    ml = max_len
    n_live = B
    for t in range(int(max_len.max()) + 1):
        logp, next_tok = (v.squeeze(1) for v in top_k(step(tokens, ml, t), 1))
        acc += logp
        ends = (next_tok.eq(EOS) | ml.le(t)) & live  # at the maximum length: EOS, or truncated
        if not step.can_shrink:
            next_tok = torch.where(live, next_tok, EOS)
        seqs[alive[live], t + 1] = next_tok[live]
        n_ends = int(ends.sum())  # the step's one wait for the device
        if n_ends:
            ids = alive[ends]
            logp_sum[ids], length[ids] = acc[ends], t + 1
            live &= ~ends
            n_live -= n_ends
            if not n_live:
                break
            if step.can_shrink:
                keep = keep_order(~live)
                alive, ml, acc, live = alive[keep], ml[keep], acc[keep], live[keep]
                tokens = torch.cat([tokens[keep], next_tok[keep, None]], dim=1)
                step.reorder(keep, keep)
                continue
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
    return seqs, logp_sum / lp(length.float())


def stable_slots(parent: Tensor) -> Tensor:
    """The row each of a sentence's k surviving hypotheses takes, given their parents' rows
    parent [b, k] (0..k-1 within the sentence): a permutation of 0..k-1 per sentence in which
    the first survivor of each parent keeps its parent's row and the others take the rows of
    parents without survivors. A row's self-attention cache is then copied only when a second
    hypothesis grows from one parent (never the full cache at every step), and a copy never
    reads a row that another copy writes."""
    b, k = parent.shape
    rank = torch.arange(k, device=parent.device).expand(b, k)
    first_child = torch.full((b, k), k, dtype=torch.long, device=parent.device).scatter_reduce(
        1, parent, rank, "amin"
    )  # per row: its first surviving child, k if none
    first = first_child.gather(1, parent).eq(rank)
    free = (
        first_child.eq(k).int().argsort(dim=1, descending=True, stable=True)
    )  # childless rows first, ascending
    nth = ((~first).long().cumsum(1) - 1).clamp(min=0)
    return torch.where(first, parent, free.gather(1, nth))


def beam_search(
    step: Stepper, max_len: Tensor, settings: DecodeDefaults, n: int = 1
) -> tuple[Tensor, Tensor]:
    """Beam search over B sentences at once, k live hypotheses each (b*k rows, sentence-major);
    the n <= k best finished hypotheses of each sentence [B, n, L] and their scores [B, n].

    Each step takes the 2k best extensions of a sentence's live hypotheses: those ending in EOS
    are candidates for the sentence's n best finished hypotheses (an earlier one keeps its place
    on a tie), the k best others stay live.
    A sentence is done once no live hypothesis can beat its n-th finished one. That is decidable
    because log-probabilities are <= 0: a live hypothesis with sum s and final length L scores at
    most s / lp(L) (its sum can only fall), and L lies between its current length + 1 and
    max_len + 1, so it scores at most s / max(lp(current + 1), lp(max_len + 1)); with alpha >= 0
    that is s / lp(max_len + 1). A done sentence leaves the batch (its rows stop being computed);
    at max_len every live hypothesis is forced to end, so all are done then. The live
    hypotheses of a sentence keep their rows where they can (`stable_slots`): their order in
    the beam is not their rank. The other stopping rules (`settings.stop`, DecodeDefaults) are
    fairseq's and transformers': an ended extension is a finished hypothesis only among the k
    best of the step, and a sentence is also done once k have ended ("beam"), or only once k
    are finished and the best live one, scored at its current length, cannot beat the worst
    of them ("transformers").
    """
    k, stop, lp = settings.beam, settings.stop, penalty(settings)
    # the finished hypotheses kept: n, or the beam's k for transformers' rule, which compares
    # the best live one with the worst of k finished
    m = max(n, k) if stop == "transformers" else n
    B, device = max_len.size(0), max_len.device
    best_score = torch.full((B, m), -torch.inf, device=device)
    best_seq = torch.full((B, m, int(max_len.max()) + 2), PAD, dtype=torch.long, device=device)
    alive = torch.arange(B, device=device)  # the sentences of the batch, original numbers
    done = torch.zeros(B, dtype=torch.bool, device=device)  # stays all False when the batch shrinks
    rows = torch.arange(B, device=device)[:, None] * k  # first row of each sentence
    tokens = torch.full((B * k, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((B, k), -torch.inf, device=device)
    scores[:, 0] = 0.0  # one live hypothesis at the start, so the beam holds no duplicates
    ml, lp_max = max_len, lp(max_len.float() + 1)
    ended = torch.zeros(B, dtype=torch.long, device=device)
    ml_rows = None
    banked = constraints.banked(step.constraint)
    for t in range(int(max_len.max()) + 1):
        b = alive.size(0)
        if ml_rows is None or ml_rows.size(0) != b * k:
            ml_rows = ml.repeat_interleave(k)
        logp = step(tokens, ml_rows, t)  # [b*k, V]
        V = logp.size(1)
        # the 2k best extensions of each sentence, over its k hypotheses' V tokens
        total = logp.add_(scores.view(-1, 1)).view(b, k * V)
        cand_score, cand_idx = top_k(total, 2 * k)  # [b, 2k]
        cand_key = cand_score  # the order in which the beam takes them
        if banked:  # dynamic beam allocation: more candidates, taken bank by bank
            cand_score, cand_idx, cand_key = allocate(
                step.constraint, step.state, total, cand_score, cand_idx, k
            )
        cand_row = rows + torch.div(cand_idx, V, rounding_mode="floor")
        cand_tok = cand_idx % V
        ends = cand_tok.eq(EOS) | ml.le(t)[:, None]  # at the maximum length: EOS, or truncated

        # the finished candidates of this step, |Y| = t + 1, join the m best finished so far
        # (fairseq's and transformers' rules: only those among the k best extensions)
        finishing = ends & ~done[:, None]
        if stop != "bound":
            finishing[:, k:] = False
        fin = torch.where(finishing, cand_score, -torch.inf)
        pool = torch.cat([best_score[alive], fin / lp(t + 1)], dim=1)
        top, pick = pool.sort(dim=1, descending=True, stable=True)
        top, pick = top[:, :m], pick[:, :m]
        fresh = cand_row.gather(1, (pick - m).clamp(min=0))  # [b, m]: the rows of new ones
        last = cand_tok.gather(1, (pick - m).clamp(min=0))[..., None]  # EOS, or truncated
        kept = best_seq[alive, :, : t + 2]
        best_seq[alive, :, : t + 2] = torch.where(
            pick.ge(m)[..., None],
            torch.cat([tokens[fresh], last], dim=2),
            kept.gather(1, pick.clamp(max=m - 1)[..., None].expand_as(kept)),
        )
        best_score[alive] = top

        # the k best extensions that did not end stay live, each in its row (stable_slots)
        live_key, live_pos = torch.where(ends, -torch.inf, cand_key).topk(k, dim=1)
        live_score = cand_score.gather(1, live_pos).masked_fill(live_key.isneginf(), -torch.inf)
        parent = cand_row.gather(1, live_pos) - rows
        at = torch.empty_like(parent).scatter_(
            1, stable_slots(parent), torch.arange(k, device=device).expand(b, k)
        )
        scores = live_score.gather(1, at)
        index = (rows + parent.gather(1, at)).view(-1)
        tokens = torch.cat(
            [tokens[index], cand_tok.gather(1, live_pos.gather(1, at)).view(-1, 1)], dim=1
        )

        if stop == "transformers":  # the best live one scored at its length, t + 1 tokens
            bound = scores.amax(1) / lp(t + 1)
        else:
            bound = scores.amax(1) / lp_max.clamp(min=lp(t + 2))
        now_done = done | best_score[alive, -1].ge(bound) | ml.le(t)
        if stop == "beam":
            ended = ended + ends[:, :k].sum(1)
            now_done |= ended.ge(k)
        n_done = int(now_done.sum())  # the step's one wait for the device
        if n_done == b:
            break
        if step.can_shrink and n_done:
            keep = keep_order(now_done)
            alive, ml, lp_max, scores, ended = (
                alive[keep],
                ml[keep],
                lp_max[keep],
                scores[keep],
                ended[keep],
            )
            index = index.view(b, k)[keep].view(-1)
            tokens = tokens.view(b, k, -1)[keep].view(index.size(0), -1)
            rows = torch.arange(keep.size(0), device=device)[:, None] * k
            done = done[keep]
            step.reorder(index, keep)
        else:
            done = now_done
            step.reorder(index)
    return best_seq[:, :n], best_score[:, :n]
