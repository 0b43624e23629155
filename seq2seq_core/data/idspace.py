"""The id space of a run's members: where each member's ids sit in the model's embeddings.

With one member the run's ids are the task's own. With several, the engine maps
each member's ids into one space: the specials (`s2s.core.SPECIALS`) are shared and
the other ids of member k are shifted past those of the members before it, so no two members share
an embedding or output row. Every source then starts with its member's task token (Johnson et
al., 2017), placed after all the source vocabularies. When every member shares one vocabulary
between its source and target, the run does too (source and target spaces are one and all
embeddings are tied, section 3.4); otherwise the two spaces are separate. Members that share
vocabularies (`multitask.shared_vocab`, `s2s.core.data.joint`) share their rows too, in one space
with every embedding tied. The search for a
member may write only that member's target ids (`MappedConstraint`), under the member's own
constraint if it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..errors import DataError
from ..contract.task import Constraint
from ..tokenizers import SPECIALS

N_SPECIAL = len(SPECIALS)


@dataclass
class IdMap:
    """A member's ids in the run's space: specials as they are, id i >= N_SPECIAL at i + offset."""

    src_offset: int = 0
    tgt_offset: int = 0
    task_token: int | None = None  # the source's first id; None for a single-task run

    def src(self, ids: torch.Tensor) -> torch.Tensor:
        """Source rows [B, S] of member ids -> [B, 1 + S] run ids, the task token first."""
        mapped = (
            torch.where(ids >= N_SPECIAL, ids + self.src_offset, ids) if self.src_offset else ids
        )
        if self.task_token is None:
            return mapped
        return torch.cat([torch.full_like(mapped[:, :1], self.task_token), mapped], dim=1)

    def tgt(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where(ids >= N_SPECIAL, ids + self.tgt_offset, ids) if self.tgt_offset else ids

    def tgt_back(self, ids: Sequence[int]) -> list[int]:
        return [i - self.tgt_offset if i >= N_SPECIAL else i for i in ids]


def join(members: list) -> tuple[int, int, bool]:
    """Give each member (`s2s.core.data.members.Member`) its place in one id space; (source size,
    target size, shared) of the run.

    Call once every member's vocabulary is built or loaded.
    """
    if len(members) == 1:
        task = members[0].task
        members[0].tgt_vocab = task.tgt_vocab_size
        return task.src_vocab_size, task.tgt_vocab_size, task.shared_vocab
    if members[0].share is not None:
        return _join_shared(members)
    shared = all(m.task.shared_vocab for m in members)
    src = tgt = N_SPECIAL
    for m in members:
        m.ids = IdMap(src_offset=src - N_SPECIAL, tgt_offset=(src if shared else tgt) - N_SPECIAL)
        src += m.task.src_vocab_size - N_SPECIAL
        tgt += m.task.tgt_vocab_size - N_SPECIAL
    for k, m in enumerate(members):  # the task tokens, after every vocabulary
        m.ids.task_token = src + k
    src += len(members)
    tgt = src if shared else tgt
    for m in members:
        m.tgt_vocab = tgt
    return src, tgt, shared


def _join_shared(members: list) -> tuple[int, int, bool]:
    """`join` for a run whose members share vocabularies (`s2s.core.data.joint`): one space for
    source and target, every embedding tied (section 3.4). Each vocabulary has one block of
    rows: a shared one (`Member.share`) the same block in every member that shares it, a
    member's own vocabulary one block for both its sides when it shares it between them."""
    blocks: dict = {}  # group number or (member, vocabulary object) -> (first row, size)
    end = N_SPECIAL
    for k, m in enumerate(members):
        offsets = {}
        for side in ("src", "tgt"):
            vocab = m.task.src_vocab if side == "src" else m.task.tgt_vocab
            key = m.share[side] if side in m.share else (k, id(vocab))
            if key not in blocks:
                blocks[key] = (end, len(vocab))
                end += len(vocab) - N_SPECIAL
            elif blocks[key][1] != len(
                vocab
            ):  # a shared vocabulary read back from each member's files
                raise DataError(
                    f"task {m.name!r}: its {side} vocabulary has {len(vocab)} tokens, the one "
                    f"it shares with other members {blocks[key][1]}: the run's vocabulary files "
                    "differ"
                )
            offsets[side] = blocks[key][0] - N_SPECIAL
        m.ids = IdMap(src_offset=offsets["src"], tgt_offset=offsets["tgt"])
    for k, m in enumerate(members):  # the task tokens, after every vocabulary
        m.ids.task_token = end + k
    end += len(members)
    for m in members:
        m.tgt_vocab = end
    return end, end, True


class MappedConstraint(Constraint):
    """A member's constraint (None: none) in the run's id space, where the member may write
    only its own target ids: the member's ids i >= N_SPECIAL sit at i + offset, its specials
    where they are, and every other id of the run is never allowed."""

    def __init__(
        self, inner: Constraint | None, n: int, offset: int, member_vocab: int, run_vocab: int
    ):
        self.inner, self.n = inner, n
        self.columns = torch.cat(
            [torch.arange(N_SPECIAL), torch.arange(N_SPECIAL, member_vocab) + offset]
        )
        self.offset, self.run_vocab = offset, run_vocab
        self.outside = (
            None  # 0 at the member's ids, -inf elsewhere: what `score` adds without a constraint
        )

    def initial(self, device) -> tuple:
        self.columns = self.columns.to(device)
        if self.inner is None:
            self.outside = torch.full((self.run_vocab,), float("-inf"), device=device)
            self.outside[self.columns] = 0.0
        return (
            self.inner.initial(device)
            if self.inner is not None
            else (torch.zeros(self.n, device=device),)
        )

    def advance(self, state: tuple, tokens) -> tuple:
        if self.inner is None:
            return state
        member = torch.where(tokens >= N_SPECIAL, tokens - self.offset, tokens)
        # a row out of the search may hold another member's id: any in-range id keeps its state
        # usable
        return self.inner.advance(state, member.clamp(0, len(self.columns) - 1))

    def _spread(self, member: torch.Tensor, fill) -> torch.Tensor:
        out = member.new_full((member.size(0), self.run_vocab), fill)
        out[:, self.columns] = member
        return out

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        if self.inner is None:
            mask = torch.ones(
                remaining.size(0), len(self.columns), dtype=torch.bool, device=remaining.device
            )
        else:
            mask = self.inner.allowed(state, remaining)
        return self._spread(mask, False)

    def score(self, state: tuple, logp: torch.Tensor, remaining) -> torch.Tensor:
        if self.inner is None:  # one add on the hot path, no gather and scatter
            return logp + self.outside.to(logp.dtype)
        member = self.inner.score(state, logp.index_select(1, self.columns), remaining)
        return self._spread(member, float("-inf"))
