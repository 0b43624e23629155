"""Search: greedy decoding and batched beam search with the GNMT length penalty.

The paper decodes with beam size 4 and length penalty alpha = 0.6 (section 6.1), the penalty of
Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^alpha. A hypothesis scores sum_i log p(y_i) / lp(Y),
where Y counts the output tokens including the final EOS (so an empty output has |Y| = 1 and
every hypothesis, even one stopped at the maximum length, is scored the same way: one ending
there is forced to EOS, whose log-probability it pays).

The maximum output length of a sentence is int(max_len_a * |x| + max_len_b) tokens before EOS,
|x| counting the source's non-pad tokens (its EOS included), and at most what the model's
positions allow. PAD and BOS are never generated.

A constraint (`s2s.core.contract.task.Constraint`, from `Task.constraint`) narrows the search to the
outputs a task admits: its state rides along with every hypothesis as rows of tensors, advanced
by the token each row takes and moved with the rows when the beam is reordered, and at each step
the tokens it does not allow get log-probability -inf (the others keep the model's own).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..contract.checks import SEED_MAX, number_problem, shown, whole_number_problem
from ..setup.settings import Stop
from ..contract.task import DecodeDefaults
from ..contract.vocab import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / lp(Y)


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


@dataclass(frozen=True)
class Wanted:
    """What a caller asks of a search beyond the task's settings (`DecodeDefaults`): `n`
    outputs a source, the n best of the beam search (n at most the beam) or, with `sampling`,
    n drawn ones; with `mbr` (a utility: chrf, bleu) ranked by their expected utility against
    each other (minimum Bayes risk), not by score. `incremental=False` recomputes the decoder
    over the whole prefix at each step instead of keeping its cache (the same outputs, slower:
    what tests and the speed benchmark compare the cache with)."""

    n: int = 1
    sampling: Sampling | None = None
    incremental: bool = True
    mbr: str | None = None  # rank the n outputs by expected utility (s2s.core.decode.mbr)

    def problem(self, beam: int) -> str | None:
        """What is wrong with what is asked of a search with this beam, as `option value: why`
        (the sampling settings', `Sampling.problem`), or None."""
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            return f"nbest {shown(self.n)}: must be a whole number, 1 or more"
        if self.sampling is None and self.n > beam:
            return (
                f"nbest {self.n}: above the beam ({beam}); a beam search keeps at most its beam "
                "of outputs (raise the beam, or draw them with sampling)"
            )
        return None if self.sampling is None else self.sampling.problem()

    def rows(self, beam: int) -> int:
        """The rows (hypotheses) a sentence takes in the search: n drawn outputs, else the
        beam."""
        return self.n if self.sampling is not None else beam


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


class _Stepper:
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
                if _accepts(model.init_cache, "capacity")
                else model.init_cache(self.memory, src_pad)
            )
            self.memory = self.src_pad = None  # the cache holds what the steps read of them
        # finished sentences leave the batch, unless the model's cache cannot drop sentences
        self.can_shrink = self.cache is None or _accepts(model.reorder_cache, "keep")
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


def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


STOPS = tuple(str(s) for s in Stop)  # beam search's stopping rules (DecodeDefaults.stop)

SENTENCES = {
    "cpu": 128
}  # decode.max_sentences=0: sentences decoded together, by device type (others: 1,024)


def sentences_per_batch(max_sentences: int, device) -> int:
    """decode.max_sentences as set, or for 0 the device's own: 128 on a CPU (more only grows the
    cache a step reads), 1,024 on a GPU (whose products need many rows to keep it busy)."""
    return max_sentences or SENTENCES.get(torch.device(device).type, 1024)


ROWS_PER_SEARCH = {"cpu": 512}  # hypotheses searched at once, by device type (none given: all)


def sentences_per_search(width: int, sentences: int, device) -> int:
    """How many of `sentences` one search takes at once with `width` rows (hypotheses) a
    sentence: at most ROWS_PER_SEARCH rows on the device, all the sentences where it sets none."""
    limit = ROWS_PER_SEARCH.get(torch.device(device).type, width * sentences)
    return max(1, limit // width)


def search(
    model,
    src: Tensor,
    settings: DecodeDefaults,
    constraint=None,
    incremental: bool = True,
) -> list[Hypothesis]:
    """The best hypothesis for each source row of src [B, S]: the first of `nbest`'s lists."""
    found = nbest(model, src, settings, Wanted(incremental=incremental), constraint)
    return [best for best, *_ in found]


def nbest(
    model,
    src: Tensor,
    settings: DecodeDefaults,
    wanted: Wanted = Wanted(),
    constraint=None,
) -> list[list[Hypothesis]]:
    """The `wanted.n` best hypotheses for each source row of src [B, S] (ids + EOS,
    right-padded), best first, in the order of the rows (fewer where the search finished fewer:
    a maximum length of 0 admits one output), searched with the beam, length penalty, maximum
    length and stopping rule of `settings`.

    settings.beam == 1 is greedy search (n must be 1); beam > 1 beam search, n at most the
    beam, whose first hypothesis does not depend on n. With `wanted.sampling`, n outputs are
    drawn for each source instead (`_sample`; the beam plays no part), ranked by score. The
    model is put in eval mode for the search and given back in the mode it came in.
    `settings.stop` is beam search's stopping rule, "bound" or "beam" (see
    s2s.core.contract.task.DecodeDefaults). Any model with the
    Transformer's encode / decode / init_cache / decode_step / reorder_cache and
    `max_positions` will do (an `s2s.core.decode.ensemble.Ensemble` does); when its init_cache
    takes `capacity` it is told the number of steps, and when its reorder_cache takes `keep`,
    sentences leave the batch as soon as their search is over. `constraint` (a
    `s2s.core.contract.task.Constraint` for these B sources) limits the tokens each step may take.

    On a CPU at most ROWS_PER_SEARCH hypotheses (beam x sentences) are searched at once, the
    sentences in order: the self-attention cache of a search grows with its rows times its
    steps (beam 21 over 128 parsing sentences: gigabytes), while products of 1,024 rows already
    run at the machine's rate. A GPU searches the whole batch at once.
    """
    beam, n, sampling = settings.beam, wanted.n, wanted.sampling
    if settings.stop not in STOPS:
        raise ValueError(f"stop must be one of {', '.join(STOPS)}, not {settings.stop!r}")
    if sampling is None and not 1 <= n <= beam:
        raise ValueError(f"n must be between 1 and the beam ({beam}), not {n}")
    width = wanted.rows(beam)
    was_training = model.training
    model.eval()
    B = src.size(0)
    per = sentences_per_search(width, B, src.device)
    try:
        with torch.inference_mode():
            state = (
                None if constraint is None else constraint.initial(src.device)
            )  # one row per sentence
            found = []
            for lo in range(0, B, per):
                part = src[lo : lo + per]
                part = part[:, : int(part.ne(PAD).sum(1).max())]  # its own padding only
                rows = None if state is None else tuple(x[lo : lo + per] for x in state)
                memory, src_pad = model.encode(part)
                src_len = (~src_pad).sum(1)
                max_len = (settings.max_len_a * src_len.double() + settings.max_len_b).long()
                max_len = max_len.clamp(0, model.max_positions - 1)
                stepper = _Stepper(
                    model,
                    (memory, src_pad),
                    int(max_len.max()) + 1,
                    wanted.incremental,
                    None if constraint is None else (constraint, rows),
                    truncate=settings.stop == "transformers",
                    min_len=settings.min_len,
                )
                if sampling is not None:
                    generators = sentence_generators(sampling.seed, part)
                    seqs, scores = _sample(stepper, max_len, penalty(settings), wanted, generators)
                elif beam == 1:
                    seqs, scores = _greedy(stepper, max_len, penalty(settings))
                    seqs, scores = seqs[:, None], scores[:, None]
                else:
                    seqs, scores = _beam_search(stepper, max_len, settings, n)
                stepper.release()
                found += _hypotheses(seqs, scores)
    finally:
        model.train(was_training)
    return found


def _hypotheses(seqs: Tensor, scores: Tensor) -> list[list[Hypothesis]]:
    """Rows [B, n, L] (BOS, outputs, EOS, PAD) with scores [B, n] as hypotheses, those that
    finished (a score above -inf) only."""
    found = []
    for row_seqs, row_scores in zip(seqs.tolist(), scores.tolist()):
        hyps = []
        for seq, score in zip(row_seqs, row_scores):
            if score == -torch.inf and hyps:
                continue
            out = [x for x in seq[1:] if x != PAD]  # drop BOS; keep what precedes the first EOS
            hyps.append(Hypothesis(out[: out.index(EOS)] if EOS in out else out, score))
        found.append(hyps)
    return found


def _greedy(step: _Stepper, max_len: Tensor, lp) -> tuple[Tensor, Tensor]:
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
                keep = _keep_order(~live)
                alive, ml, acc, live = alive[keep], ml[keep], acc[keep], live[keep]
                tokens = torch.cat([tokens[keep], next_tok[keep, None]], dim=1)
                step.reorder(keep, keep)
                continue
        tokens = torch.cat([tokens, next_tok[:, None]], dim=1)
    return seqs, logp_sum / lp(length.float())


def _sample(
    step: _Stepper, max_len: Tensor, lp, wanted: Wanted, generators: list
) -> tuple[Tensor, Tensor]:
    """n outputs drawn for each of B sentences (b*n rows, sentence-major) [B, n, L], best score
    first, and their scores [B, n]: the sum of the log-probabilities the search sees (the model's,
    after the constraint), untempered, over lp(Y), as beam search scores.

    Each row draws its next token from softmax(logp / temperature) (`_draw`); rows that have
    ended take EOS until their sentence leaves the batch, once its n rows have ended."""
    n, sampling = wanted.n, wanted.sampling
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
        next_tok = _draw(_filtered(logp, sampling), uniform)
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
            keep = _keep_order(done)
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


def _draw(x: Tensor, uniform: Tensor) -> Tensor:
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


def _filtered(logp: Tensor, sampling: Sampling) -> Tensor:
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
    step: _Stepper, max_len: Tensor, settings: DecodeDefaults, n: int = 1
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
    hypotheses of a sentence keep their rows where they can (`_stable_slots`): their order in
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
    return best_seq[:, :n], best_score[:, :n]
