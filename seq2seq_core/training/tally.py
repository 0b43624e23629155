"""The figures of the updates between two train records, per member: what the loop adds up.

Loss, nll and target tokens are summed on the device as each update ends and read once per
record (`run.log_interval`), so that no update waits for the device to report them; this
process's target tokens, sentences and updates are counted on the host. `Tally.record` turns
them into the train record metrics.jsonl holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Tally:
    """The updates since the last train record, one entry per member: loss, nll and target
    tokens of every process, summed in float64 on the device; this process's target tokens,
    sentences and updates."""

    prefixes: list[str]  # each member's key prefix in a record ("" for a lone member)
    loss: torch.Tensor
    nll: torch.Tensor
    target_tokens: torch.Tensor
    tokens: list[int]
    sentences: list[int]
    updates: list[int]

    @classmethod
    def zero(cls, prefixes: list[str], device: torch.device) -> Tally:
        """Nothing yet, for the members whose key prefixes are `prefixes`."""
        n = len(prefixes)

        def sums():
            return torch.zeros(n, dtype=torch.float64, device=device)

        return cls(list(prefixes), sums(), sums(), sums(), [0] * n, [0] * n, [0] * n)

    def add(self, out: dict) -> None:
        """One update's figures (what `Trainer.step` returns) to its member's."""
        k = out["member"]
        self.loss[k] += out["loss_sum"]
        self.nll[k] += out["nll_sum"]
        self.target_tokens[k] += out["ntokens"]  # every process's already
        self.tokens[k] += out["local_tokens"]
        self.sentences[k] += out["local_sentences"]
        self.updates[k] += 1

    def record(self, group, update: int, lr: float, seconds: float, skipped: int) -> dict:
        """The train record of `update`: loss and nll per target token over the updates tallied
        (and per member in a multi-task run, with its number of those updates), the learning
        rate `lr`, the target tokens a second of all processes over `seconds`, and the `skipped`
        updates of the run. Every process takes part (the sums are over processes)."""
        losses, nlls = group.sum(torch.stack([self.loss, self.nll])).tolist()
        target_tokens = self.target_tokens.tolist()
        here = torch.tensor(
            [sum(self.tokens), sum(self.sentences)], dtype=torch.float64, device=self.loss.device
        )
        tokens, sentences = group.sum(here).tolist()

        def per_token(rows):
            n = sum(target_tokens[k] for k in rows)
            return {"loss": sum(losses[k] for k in rows) / n, "nll": sum(nlls[k] for k in rows) / n}

        trained = [k for k, n in enumerate(self.updates) if n > 0]
        record = {
            "kind": "train",
            "update": update,
            **per_token(trained),
            "lr": lr,
            "tgt_tokens_per_s": round(tokens / seconds, 1),
            "sentences": int(sentences),
            "skipped": skipped,
        }
        for k in trained:  # a lone member's own figures are the run's (its prefix is empty)
            prefix = self.prefixes[k]
            record.update(
                {f"{prefix}{key}": v for key, v in per_token([k]).items()},
                **{f"{prefix}updates": self.updates[k]},
            )
        return record
