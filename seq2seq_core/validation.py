"""Validation: each member's dev loss and metric, shared out over the processes and gathered,
so that every process gets the same figures.

The record holds the loss, nll and ppl over all members' dev tokens, each member's figures
(under `MEMBER/...` keys when there are several), and `select`: the mean of the members'
primary figures weighted by their `select` weights, the one figure a run is compared and
selected by (a single task's is its primary figure).
"""
from __future__ import annotations

import math

import torch

from .data import token_batches
from .inference import checked_score, hypotheses
from .members import Member
from .rng import rng_preserved
from .members import decode_settings


def dev_loss(net, member: Member, group, max_tokens: int, eps: float, autocast) -> torch.Tensor:
    """Sums (label-smoothed loss, nll, target tokens) over the member's dev pairs, all processes."""
    valid = member.data.splits["valid"]
    batches = token_batches(valid.src_lens, valid.tgt_lens, max_tokens, seed=0, shuffle=False)
    sums = torch.zeros(3, dtype=torch.float64, device=group.device)
    for idx in batches[group.rank::group.world]:
        b = member.batch("valid", idx)
        with autocast():
            loss, nll = net(b["src"].to(group.device), b["tgt_in"].to(group.device), b["tgt_out"].to(group.device), eps)
        sums += torch.stack([loss.double(), nll.double(), torch.tensor(float(b["ntokens"]), dtype=torch.float64,
                                                                       device=group.device)])
    return group.sum(sums)


def dev_score(search_model, member: Member, group, cfg):
    """The member's metric on (the first run.valid_max_sentences of) its dev sentences."""
    sources, refs = member.data.texts("valid")
    if cfg.run.valid_max_sentences:
        sources, refs = sources[:cfg.run.valid_max_sentences], refs[:cfg.run.valid_max_sentences]
    hyps = hypotheses(search_model, member, sources[group.rank::group.world],
                      decode_settings(member.task, cfg.decode), group.device, cfg.decode.max_sentences)
    shares = group.gather(hyps)
    hyps = [shares[i % group.world][i // group.world] for i in range(len(sources))]
    return checked_score(member, member.score(hyps, refs, sources))


def _per_token(sums: torch.Tensor) -> dict:
    loss, nll, n = sums.tolist()
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 700.0))}


def _figures(sums: torch.Tensor, score) -> dict:
    record = {**_per_token(sums), score.name: score.value}
    record.update({k: v for k, v in score.figures.items()  # e.g. sentences a metric left out
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in record})
    return record


def validate(net, search_model, members: list[Member], group, cfg, autocast, update: int) -> tuple[dict, float]:
    """The valid record of `update` and the figure the run selects its checkpoint by: the
    task's primary figure (higher is better), or a multi-task run's `select`. The RNG states are
    restored afterwards, so that validating (or not) never changes the dropout masks of later
    updates."""
    record = {"kind": "valid", "update": update}
    with rng_preserved():
        net.eval()
        try:
            with torch.no_grad():
                results = [(m, dev_loss(net, m, group, cfg.data.max_tokens, cfg.optim.label_smoothing, autocast),
                            dev_score(search_model, m, group, cfg)) for m in members]
        finally:
            net.train()
    # a lone member's figures are the run's own: its prefix is empty and its loss the run's
    record.update(_per_token(sum(sums for _, sums, _ in results)))
    weights = sum(m.select for m in members)
    record["select"] = sum(m.select * score.value for m, _, score in results) / weights if weights else 0.0
    for m, sums, score in results:
        record.update({f"{m.prefix}{k}": v for k, v in _figures(sums, score).items()})
    return record, record["select"]
