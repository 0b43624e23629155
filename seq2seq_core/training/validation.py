"""Validation: each member's dev loss and metric, shared out over the processes and gathered,
so that every process gets the same figures.

The record holds the loss, nll and ppl over all members' dev tokens, each member's figures
(under `MEMBER/...` keys when there are several: loss, nll, ppl, then its metric's, the primary
first, the order the console line reads them in), `select`: the mean of the members' primary
figures weighted by their `select` weights, the one figure a run is compared and selected by
(a single task's is its primary figure), and `seconds`: what validating took (it counts in
run.max_minutes).

Validation searches for the figure, not for the output: each dev hypothesis stops at
DEV_LENGTH times its reference's tokens (`LengthCap`; under the task's own limit). Beyond it, a
hypothesis's precision (n-grams, brackets) is below 1 / DEV_LENGTH whatever it holds, and young
models that write on to the task's limit (parsing's source + 300 tokens) are what made early
validations slow. Dev is searched in decode.precision: bf16 and int8 moved the 64-sentence dev
F1 of a 10-minute parser by 1.9 and 1.4 (docs/performance.md), more than a figure to select
checkpoints by may move.
`run.valid_beam` searches dev with a smaller beam than the task's (at most the task's): a
figure to compare checkpoints by, not the one reported, at a fraction of the search's cost.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from ..data.members import Member, decode_settings
from ..data.batches import token_batches
from ..decode.batched import Decoder
from ..contract.resampling import scored
from ..contract.task import Constraint
from ..tokenizers import EOS
from . import heap
from .rng import rng_preserved

DEV_LENGTH = 2.0


class LengthCap(Constraint):
    """`inner` (a constraint, or None) with sentence b's output cut at caps[b] tokens before
    EOS: at its cap a row may only end, with EOS's own probability, and `inner` is told the
    tokens left under the cap, so that what it admits can still finish."""

    def __init__(self, inner: Constraint | None, caps: torch.Tensor, vocab_size: int):
        self.inner, self.caps, self.V = inner, caps, vocab_size

    def initial(self, device) -> tuple:
        self.caps = self.caps.to(device)
        inner = self.inner.initial(device) if self.inner is not None else ()
        return (torch.arange(self.caps.size(0), device=device), self.caps.clone(), *inner)

    def advance(self, state: tuple, tokens) -> tuple:
        sent, cap, *inner = state
        inner = inner if self.inner is None else self.inner.advance(tuple(inner), tokens)
        return (sent, cap - 1, *inner)  # cap: the tokens a row may still write

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        left = torch.minimum(remaining, state[1])
        if self.inner is not None:
            return self.inner.allowed(state[2:], left)
        mask = left.gt(0)[:, None].expand(-1, self.V).clone()
        mask[:, EOS] = True
        return mask

    def score(self, state: tuple, logp: torch.Tensor, remaining) -> torch.Tensor:
        at_cap = state[1].le(0)[:, None]
        eos = logp[:, EOS].clone()
        scored = (
            logp
            if self.inner is None
            else self.inner.score(state[2:], logp, torch.minimum(remaining, state[1]))
        )
        scored = scored.masked_fill_(at_cap, float("-inf"))
        scored[:, EOS] = torch.where(at_cap[:, 0], eos, scored[:, EOS])
        return scored


class _Capped:
    """A member as dev search serves it: its own, but each source's output capped (LengthCap)."""

    def __init__(self, member: Member, caps: dict[str, int], vocab_size: int):
        self.member, self.caps, self.V = member, caps, vocab_size

    def __getattr__(self, name):
        return getattr(self.member, name)

    def constraint(self, sources):
        return LengthCap(
            self.member.constraint(sources), torch.tensor([self.caps[s] for s in sources]), self.V
        )


@dataclass(frozen=True)
class DevModels:
    """The model as validation runs it: `net` as training computes it, under `autocast` (the
    run's precision), for the dev loss; `search` the copy dev search decodes with
    (decode.precision)."""

    net: torch.nn.Module
    search: torch.nn.Module
    autocast: Callable


def dev_loss(models: DevModels, member: Member, group, cfg) -> torch.Tensor:
    """Sums (label-smoothed loss, nll, target tokens) over the member's dev pairs, all processes,
    in batches of data.max_tokens."""
    valid = member.data.splits["valid"]
    batches = token_batches(
        valid.src_lens, valid.tgt_lens, cfg.data.max_tokens, seed=0, shuffle=False
    )
    sums = torch.zeros(3, dtype=torch.float64, device=group.device)
    for idx in batches[group.rank :: group.world]:
        b = member.batch("valid", idx)
        with models.autocast():
            loss, nll = models.net(
                b["src"].to(group.device),
                b["tgt_in"].to(group.device),
                b["tgt_out"].to(group.device),
                cfg.optim.label_smoothing,
            )
        sums += torch.stack(
            [
                loss.double(),
                nll.double(),
                torch.tensor(float(b["ntokens"]), dtype=torch.float64, device=group.device),
            ]
        )
    return group.sum(sums)


def dev_score(search_model, member: Member, group, cfg):
    """The member's metric on (the first run.valid_max_sentences of) its dev sentences, each
    hypothesis capped at DEV_LENGTH times its reference's length."""
    sources, refs = member.data.texts("valid")
    if cfg.run.valid_max_sentences:
        sources, refs = sources[: cfg.run.valid_max_sentences], refs[: cfg.run.valid_max_sentences]
    caps: dict[str, int] = {}
    for src, ids in zip(sources, member.task.encode_target(refs)):
        caps[src] = max(caps.get(src, 0), math.ceil(DEV_LENGTH * len(ids)))
    searched = _Capped(member, caps, member.tgt_vocab or member.task.tgt_vocab_size)
    settings = decode_settings(member.task, cfg.decode)
    if cfg.run.valid_beam:
        settings = replace(settings, beam=min(settings.beam, cfg.run.valid_beam))
    decoder = Decoder(search_model, searched, settings, group.device, cfg.decode.max_sentences)
    hyps = decoder.generate(sources[group.rank :: group.world], postprocess=False)
    heap.release()  # the search's caches, free now, are not kept on top of training's heap
    shares = group.gather(hyps)
    hyps = [shares[i % group.world][i // group.world] for i in range(len(sources))]
    return scored(member, hyps, refs, sources)  # with intervals where the task gives them


def _per_token(sums: torch.Tensor) -> dict:
    loss, nll, n = sums.tolist()
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 700.0))}


def _figures(sums: torch.Tensor, score) -> dict:
    record = {**_per_token(sums), score.name: score.value, **bounds(score)}
    record.update(
        {
            k: v
            for k, v in score.figures.items()  # e.g. sentences a metric left out
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in record
        }
    )
    return record


def bounds(score) -> dict:
    """The primary figure's 95% interval as record fields (`bleu_low`, `bleu_high`), if any."""
    found = score.intervals.get(score.name)
    if not found:
        return {}
    return {f"{score.name}_low": found["low"], f"{score.name}_high": found["high"]}


def selection(weighted: list) -> tuple[float, bool]:
    """The figure a run selects its checkpoint by, from (weight, Score) of each member, and
    whether it is better higher: the weighted mean of the members' primary figures, in their
    direction when all members agree (a lone member's figure is its own: BLEU, or an error
    rate that is better lower); when they disagree, each figure that is better lower enters
    negated, and the mean is better higher. 0.0 (better higher) when no member has weight."""
    weights = sum(w for w, _ in weighted)
    if not weights:
        return 0.0, True
    directions = {score.higher_is_better for w, score in weighted if w}
    higher = directions != {False}
    sign = {True: 1.0, False: 1.0 if len(directions) == 1 else -1.0}
    mean = sum(w * sign[score.higher_is_better] * score.value for w, score in weighted) / weights
    return mean, higher


def evaluate_dev(
    models: DevModels, members: list[Member], group, cfg, update: int
) -> tuple[dict, float]:
    """The valid record of `update` and the figure the run selects its checkpoint by: the
    task's primary figure, or a multi-task run's `select` (`selection`); the record's
    `select_higher_is_better` says which way it is better. The RNG states are restored
    afterwards, so that validating (or not) never changes the dropout masks of later
    updates."""
    record = {"kind": "valid", "update": update}
    t0 = time.monotonic()
    with rng_preserved():
        models.net.eval()
        try:
            with torch.no_grad():
                results = [
                    (m, dev_loss(models, m, group, cfg), dev_score(models.search, m, group, cfg))
                    for m in members
                    if "valid" in m.data.splits  # a member with select 0 may have none
                ]
        finally:
            models.net.train()
    # a lone member's figures are the run's own: its prefix is empty and its loss the run's
    record.update(_per_token(sum(sums for _, sums, _ in results)))
    record["select"], record["select_higher_is_better"] = selection(
        [(m.select, score) for m, _, score in results]
    )
    for m, sums, score in results:
        record.update({f"{m.prefix}{k}": v for k, v in _figures(sums, score).items()})
    record["seconds"] = round(time.monotonic() - t0, 2)
    return record, record["select"]
