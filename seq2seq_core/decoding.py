"""Search: greedy decoding and batched beam search with the GNMT length penalty.

The paper decodes with beam size 4 and length penalty alpha = 0.6 (section 6.1), the penalty of
Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^alpha. A hypothesis scores sum_i log p(y_i) / lp(Y),
where Y counts the output tokens including the final EOS (so an empty output has |Y| = 1 and
every hypothesis, even one stopped at the maximum length, is scored the same way: one ending
there is forced to EOS, whose log-probability it pays).

The maximum output length of a sentence is int(max_len_a * |x| + max_len_b) tokens before EOS,
|x| counting the source's non-pad tokens (its EOS included), and at most what the model's
positions allow. PAD and BOS are never generated.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq_core.vocab import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / lp(Y)


def length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^alpha, for a number or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


class _Stepper:
    """Next-token log-probabilities for a batch of prefixes, incrementally or by recomputing."""

    def __init__(self, model, memory: Tensor, src_pad: Tensor, incremental: bool):
        self.model, self.memory, self.src_pad = model, memory, src_pad
        self.cache = model.init_cache(memory, src_pad) if incremental else None

    def __call__(self, tokens: Tensor, max_len: Tensor, t: int) -> Tensor:
        """tokens [n, t+1] (BOS and t outputs) -> log-probs [n, V]; rows at max_len may only end."""
        if self.cache is not None:
            logits = self.model.decode_step(tokens[:, -1], self.cache)
        else:
            logits = self.model.decode(tokens, self.memory, self.src_pad)[:, -1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        logp[:, [PAD, BOS]] = -torch.inf
        at_max = max_len.eq(t)
        if at_max.any():  # hypotheses that reached the maximum length are finalised with EOS
            eos = logp[at_max, EOS]
            logp[at_max] = -torch.inf
            logp[at_max, EOS] = eos
        return logp

    def reorder(self, index: Tensor) -> None:
        if self.cache is not None:
            self.model.reorder_cache(self.cache, index)


def generate(model, src: Tensor, beam: int, alpha: float, max_len_a: float, max_len_b: int,
             incremental: bool = True) -> list[Hypothesis]:
    """The best hypothesis for each source row of src [B, S] (ids + EOS, right-padded), in order.

    beam == 1 is greedy search; beam > 1 beam search. `incremental=False` recomputes the
    decoder over the whole prefix at each step (same results, slower). The model is put in eval
    mode for the search and given back in the mode it came in. Any model with the Transformer's
    encode / decode / init_cache / decode_step / reorder_cache and `max_positions` will do.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            memory, src_pad = model.encode(src)
            src_len = (~src_pad).sum(1)
            max_len = (max_len_a * src_len.double() + max_len_b).long().clamp(0, model.max_positions - 1)
            stepper = _Stepper(model, memory, src_pad, incremental)
            if beam == 1:
                seqs, scores = _greedy(stepper, max_len, alpha)
            else:
                seqs, scores = _beam_search(stepper, max_len, beam, alpha)
    finally:
        model.train(was_training)
    hyps = []
    for seq, score in zip(seqs.tolist(), scores.tolist()):
        out = seq[1:]  # drop BOS; keep what precedes the first EOS
        hyps.append(Hypothesis(out[: out.index(EOS)] if EOS in out else out, score))
    return hyps


def _greedy(step: _Stepper, max_len: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """Take the most probable token at each step until every row has produced EOS."""
    B = max_len.size(0)
    tokens = torch.full((B, 1), BOS, dtype=torch.long, device=max_len.device)
    logp_sum = torch.zeros(B, device=max_len.device)
    length = torch.zeros(B, dtype=torch.long, device=max_len.device)  # |Y| once finished
    for t in range(int(max_len.max()) + 1):
        logp, next_tok = step(tokens, max_len, t).max(dim=-1)
        live = length.eq(0)
        logp_sum += torch.where(live, logp, 0.0)
        length = torch.where(live & next_tok.eq(EOS), t + 1, length)
        tokens = torch.cat([tokens, torch.where(live, next_tok, EOS)[:, None]], dim=1)
        if length.gt(0).all():
            break
    return tokens, logp_sum / length_penalty(length.float(), alpha)


def _beam_search(step: _Stepper, max_len: Tensor, k: int, alpha: float) -> tuple[Tensor, Tensor]:
    """Beam search over B sentences at once, k live hypotheses each (B*k rows, sentence-major).

    Each step takes the 2k best extensions of a sentence's live hypotheses: those ending in EOS
    are candidates for the sentence's best finished hypothesis, the k best others stay live.
    A sentence is done once no live hypothesis can beat its best finished one. That is decidable
    because log-probabilities are <= 0: a live hypothesis with sum s and final length L scores at
    most s / lp(L) (its sum can only fall), and L lies between its current length + 1 and
    max_len + 1, so it scores at most s / max(lp(current + 1), lp(max_len + 1)); with alpha >= 0
    that is s / lp(max_len + 1). The batch stops when every sentence is done; at max_len every
    live hypothesis is forced to end, so all are done then.
    """
    B, device = max_len.size(0), max_len.device
    rows = torch.arange(B, device=device)[:, None] * k  # first row of each sentence
    tokens = torch.full((B * k, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((B, k), -torch.inf, device=device)
    scores[:, 0] = 0.0  # one live hypothesis at the start, so the beam holds no duplicates
    best_score = torch.full((B,), -torch.inf, device=device)
    best_seq = torch.full((B, int(max_len.max()) + 2), PAD, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    lp_max = length_penalty(max_len.float() + 1, alpha)
    for t in range(int(max_len.max()) + 1):
        logp = step(tokens, max_len.repeat_interleave(k), t)  # [B*k, V]
        V = logp.size(-1)
        cand = (scores[:, :, None] + logp.view(B, k, V)).view(B, k * V)
        cand_score, cand_idx = cand.topk(2 * k, dim=1)  # [B, 2k]
        cand_row = rows + torch.div(cand_idx, V, rounding_mode="floor")
        cand_tok = cand_idx % V
        ends = cand_tok.eq(EOS)

        # best finished candidate of this step, |Y| = t + 1
        fin = torch.where(ends, cand_score, -torch.inf) / length_penalty(t + 1, alpha)
        fin_score, fin_pos = fin.max(dim=1)
        better = fin_score.gt(best_score) & ~done
        if better.any():
            fin_row = cand_row.gather(1, fin_pos[:, None]).squeeze(1)
            seq = torch.cat([tokens[fin_row], torch.full_like(fin_row, EOS)[:, None]], dim=1)
            best_seq[:, : t + 2] = torch.where(better[:, None], seq, best_seq[:, : t + 2])
            best_score = torch.where(better, fin_score, best_score)

        # the k best extensions that did not end stay live
        scores, live_pos = torch.where(ends, -torch.inf, cand_score).topk(k, dim=1)
        index = cand_row.gather(1, live_pos).view(-1)
        tokens = torch.cat([tokens[index], cand_tok.gather(1, live_pos).view(-1, 1)], dim=1)
        step.reorder(index)

        bound = scores[:, 0] / lp_max.clamp(min=length_penalty(t + 2, alpha))
        done |= best_score.ge(bound) | max_len.le(t)
        if done.all():
            break
    return best_seq, best_score
