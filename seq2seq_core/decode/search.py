"""Search: greedy decoding and batched beam search with the GNMT length penalty.

The paper decodes with beam size 4 and length penalty alpha = 0.6 (section 6.1), the penalty of
Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^alpha. A hypothesis scores sum_i log p(y_i) / lp(Y),
where Y counts the output tokens including the final EOS (so an empty output has |Y| = 1 and
every hypothesis, even one stopped at the maximum length, is scored the same way: one ending
there is forced to EOS, whose log-probability it pays).

The maximum output length of a sentence is int(max_len_a * |x| + max_len_b) tokens before EOS,
|x| counting the source's non-pad tokens (its EOS included), and at most what the model's
positions allow. PAD and BOS are never generated.

A constraint (`s2s.core.task.Constraint`, from `Task.constraint`) narrows the search to the
outputs a task admits: its state rides along with every hypothesis as rows of tensors, advanced
by the token each row takes and moved with the rows when the beam is reordered, and at each step
the tokens it does not allow get log-probability -inf (the others keep the model's own).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from ..vocab import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / lp(Y)


def length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^alpha, for a number or a tensor of lengths."""
    return ((5.0 + length) / 6.0) ** alpha


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


class _Stepper:
    """Next-token log-probabilities for the prefixes of the sentences still searched, incrementally
    or by recomputing; `reorder` moves hypotheses and, where the model allows, drops sentences."""

    def __init__(
        self,
        model,
        memory: Tensor,
        src_pad: Tensor,
        incremental: bool,
        capacity: int,
        constraint=None,
        state: tuple | None = None,
    ):
        self.model, self.memory, self.src_pad = model, memory, src_pad
        self.constraint, self.state = (
            constraint,
            state,
        )  # the constraint's state: one row per sentence
        self.cache = None
        if incremental:
            self.cache = (
                model.init_cache(memory, src_pad, capacity=capacity)
                if _accepts(model.init_cache, "capacity")
                else model.init_cache(memory, src_pad)
            )
        # finished sentences leave the batch, unless the model's cache cannot drop sentences
        self.can_shrink = self.cache is None or _accepts(model.reorder_cache, "keep")
        self.banned = torch.tensor([PAD, BOS], device=memory.device)
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
        at_max = max_len.eq(t) if t in self._ends_at else None
        if at_max is not None:
            eos = logp[at_max, EOS]  # the model's, even where a constraint would not allow it
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

    def reorder(self, index: Tensor, keep: Tensor | None = None) -> None:
        """Row i continues row index[i]; with `keep`, only those sentences (ascending) remain."""
        if keep is not None:
            self.memory, self.src_pad = (
                self.memory.index_select(0, keep),
                self.src_pad.index_select(0, keep),
            )
        if self.state is not None:
            self.state = tuple(s.index_select(0, index) for s in self.state)
        if self.cache is not None:
            if keep is None:
                self.model.reorder_cache(self.cache, index)
            else:
                self.model.reorder_cache(self.cache, index, keep=keep)


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


SENTENCES = {
    "cpu": 128
}  # decode.max_sentences=0: sentences decoded together, by device type (others: 1,024)


def sentences_per_batch(max_sentences: int, device) -> int:
    """decode.max_sentences as set, or for 0 the device's own: 128 on a CPU (more only grows the
    cache a step reads), 1,024 on a GPU (whose products need many rows to keep it busy)."""
    return max_sentences or SENTENCES.get(torch.device(device).type, 1024)


ROWS_PER_SEARCH = {"cpu": 512}  # hypotheses searched at once, by device type (none given: all)


def search(
    model,
    src: Tensor,
    beam: int,
    alpha: float,
    max_len_a: float,
    max_len_b: int,
    incremental: bool = True,
    stop: str = "bound",
    constraint=None,
) -> list[Hypothesis]:
    """The best hypothesis for each source row of src [B, S] (ids + EOS, right-padded), in order.

    beam == 1 is greedy search; beam > 1 beam search. `incremental=False` recomputes the
    decoder over the whole prefix at each step (same results, slower). The model is put in eval
    mode for the search and given back in the mode it came in. `stop` is beam search's stopping
    rule, "bound" or "beam" (see s2s.core.task.DecodeDefaults). Any model with the Transformer's
    encode / decode / init_cache / decode_step / reorder_cache and `max_positions` will do; when
    its init_cache takes `capacity` it is told the number of steps, and when its reorder_cache
    takes `keep`, sentences leave the batch as soon as their search is over. `constraint`
    (a `s2s.core.task.Constraint` for these B sources) limits the tokens each step may take.

    On a CPU at most ROWS_PER_SEARCH hypotheses (beam x sentences) are searched at once, the
    sentences in order: the self-attention cache of a search grows with its rows times its
    steps (beam 21 over 128 parsing sentences: gigabytes), while products of 1,024 rows already
    run at the machine's rate. A GPU searches the whole batch at once.
    """
    if stop not in ("bound", "beam"):
        raise ValueError(f"stop must be 'bound' or 'beam', not {stop!r}")
    was_training = model.training
    model.eval()
    B = src.size(0)
    per = max(1, ROWS_PER_SEARCH.get(src.device.type, beam * B) // beam)
    try:
        with torch.inference_mode():
            state = (
                None if constraint is None else constraint.initial(src.device)
            )  # one row per sentence
            hyps = []
            for lo in range(0, B, per):
                part = src[lo : lo + per]
                part = part[:, : int(part.ne(PAD).sum(1).max())]  # its own padding only
                rows = None if state is None else tuple(x[lo : lo + per] for x in state)
                hyps += _search(
                    model,
                    part,
                    beam,
                    alpha,
                    max_len_a,
                    max_len_b,
                    incremental,
                    stop,
                    constraint,
                    rows,
                )
    finally:
        model.train(was_training)
    return hyps


def _search(
    model, src, beam, alpha, max_len_a, max_len_b, incremental, stop, constraint, state
) -> list[Hypothesis]:
    """`search` for one part of the batch; `state`: the constraint's initial rows for it."""
    memory, src_pad = model.encode(src)
    src_len = (~src_pad).sum(1)
    max_len = (max_len_a * src_len.double() + max_len_b).long().clamp(0, model.max_positions - 1)
    stepper = _Stepper(
        model,
        memory,
        src_pad,
        incremental,
        capacity=int(max_len.max()) + 1,
        constraint=constraint,
        state=state,
    )
    if beam == 1:
        seqs, scores = _greedy(stepper, max_len, alpha)
    else:
        seqs, scores = _beam_search(stepper, max_len, beam, alpha, stop)
    hyps = []
    for seq, score in zip(seqs.tolist(), scores.tolist()):
        out = seq[1:]  # drop BOS; keep what precedes the first EOS
        hyps.append(Hypothesis(out[: out.index(EOS)] if EOS in out else out, score))
    return hyps


def _greedy(step: _Stepper, max_len: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
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
        ends = next_tok.eq(EOS) & live
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
                keep = _keep_order(~live)
                alive, ml, acc, live = alive[keep], ml[keep], acc[keep], live[keep]
                tokens = torch.cat([tokens[keep], next_tok[keep, None]], dim=1)
                step.reorder(keep, keep)
                continue
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
    return seqs, logp_sum / length_penalty(length.float(), alpha)


def _stable_slots(parent: Tensor) -> Tensor:
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


def _keep_order(done: Tensor) -> Tensor:
    """The sentences that remain, in the order their rows will have: the last ones fill the
    places of those that leave, so that only their rows move (not all that follow a gap)."""
    stay = (~done).nonzero().squeeze(1)
    m = stay.size(0)
    keep = torch.arange(m, device=done.device)
    holes = done[:m].nonzero().squeeze(1)
    keep[holes] = stay[stay.ge(m)]
    return keep


def _beam_search(
    step: _Stepper, max_len: Tensor, k: int, alpha: float, stop: str
) -> tuple[Tensor, Tensor]:
    """Beam search over B sentences at once, k live hypotheses each (b*k rows, sentence-major).

    Each step takes the 2k best extensions of a sentence's live hypotheses: those ending in EOS
    are candidates for the sentence's best finished hypothesis, the k best others stay live.
    A sentence is done once no live hypothesis can beat its best finished one. That is decidable
    because log-probabilities are <= 0: a live hypothesis with sum s and final length L scores at
    most s / lp(L) (its sum can only fall), and L lies between its current length + 1 and
    max_len + 1, so it scores at most s / max(lp(current + 1), lp(max_len + 1)); with alpha >= 0
    that is s / lp(max_len + 1). A done sentence leaves the batch (its rows stop being computed);
    at max_len every live hypothesis is forced to end, so all are done then. The live
    hypotheses of a sentence keep their rows where they can (`_stable_slots`): their order in
    the beam is not their rank.
    """
    B, device = max_len.size(0), max_len.device
    best_score = torch.full((B,), -torch.inf, device=device)
    best_seq = torch.full((B, int(max_len.max()) + 2), PAD, dtype=torch.long, device=device)
    alive = torch.arange(B, device=device)  # the sentences of the batch, original numbers
    done = torch.zeros(B, dtype=torch.bool, device=device)  # stays all False when the batch shrinks
    rows = torch.arange(B, device=device)[:, None] * k  # first row of each sentence
    tokens = torch.full((B * k, 1), BOS, dtype=torch.long, device=device)
    scores = torch.full((B, k), -torch.inf, device=device)
    scores[:, 0] = 0.0  # one live hypothesis at the start, so the beam holds no duplicates
    ml, lp_max = max_len, length_penalty(max_len.float() + 1, alpha)
    ended = torch.zeros(B, dtype=torch.long, device=device)
    ml_rows = None
    for t in range(int(max_len.max()) + 1):
        b = alive.size(0)
        if ml_rows is None or ml_rows.size(0) != b * k:
            ml_rows = ml.repeat_interleave(k)
        logp = step(tokens, ml_rows, t)  # [b*k, V]
        V = logp.size(1)
        # the 2k best extensions of each sentence, over its k hypotheses' V tokens
        cand_score, cand_idx = top_k(logp.add_(scores.view(-1, 1)).view(b, k * V), 2 * k)  # [b, 2k]
        cand_row = rows + torch.div(cand_idx, V, rounding_mode="floor")
        cand_tok = cand_idx % V
        ends = cand_tok.eq(EOS)

        # best finished candidate of this step, |Y| = t + 1; it replaces the best so far where better
        fin = torch.where(ends, cand_score, -torch.inf) / length_penalty(t + 1, alpha)
        fin_score, fin_pos = fin.max(dim=1)
        better = fin_score.gt(best_score[alive]) & ~done
        fin_row = cand_row.gather(1, fin_pos[:, None]).squeeze(1)
        best_seq[alive, : t + 2] = torch.where(
            better[:, None],
            torch.cat(
                [tokens[fin_row], torch.full((b, 1), EOS, dtype=torch.long, device=device)], dim=1
            ),
            best_seq[alive, : t + 2],
        )
        best_score[alive] = torch.where(better, fin_score, best_score[alive])

        # the k best extensions that did not end stay live, each in its row (_stable_slots)
        live_score, live_pos = torch.where(ends, -torch.inf, cand_score).topk(k, dim=1)
        parent = cand_row.gather(1, live_pos) - rows
        at = torch.empty_like(parent).scatter_(
            1, _stable_slots(parent), torch.arange(k, device=device).expand(b, k)
        )
        scores = live_score.gather(1, at)
        index = (rows + parent.gather(1, at)).view(-1)
        tokens = torch.cat(
            [tokens[index], cand_tok.gather(1, live_pos.gather(1, at)).view(-1, 1)], dim=1
        )

        bound = scores.amax(1) / lp_max.clamp(min=length_penalty(t + 2, alpha))
        now_done = done | best_score[alive].ge(bound) | ml.le(t)
        if stop == "beam":
            ended = ended + ends[:, :k].sum(1)
            now_done |= ended.ge(k)
        n_done = int(now_done.sum())  # the step's one wait for the device
        if n_done == b:
            break
        if step.can_shrink and n_done:
            keep = _keep_order(now_done)
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
    return best_seq, best_score
