"""The tasks of a run: one, or several sharing one model, in one id space, on one schedule.

A run trains its members: the one task of `task`, or the members listed under `tasks` (see
config.MemberConfig). Each member keeps its own tokenisation, vocabulary, prepared data,
decoding defaults, constraint and metric; a task needs no change to join.

Id space. With one member the run's ids are the task's own. With several, the engine maps
each member's ids into one space: the specials (`s2s.core.vocab.SPECIALS`) are shared and the
other ids of member k are shifted past those of the members before it, so no two members share
an embedding or output row. Every source then starts with its member's task token (Johnson et
al., 2017), placed after all the source vocabularies. When every member shares one vocabulary
between its source and target, the run does too (source and target spaces are one and all
embeddings are tied, section 3.4); otherwise the two spaces are separate. The search for a
member may write only that member's target ids (`MappedConstraint`), under the member's own
constraint if it has one.

Schedule. Every batch is of one member, and update u trains one member, drawn with
probability p_k proportional to weight_k * n_k^(1/T) (n_k training pairs, T =
multitask.temperature) from a generator seeded with (run.seed, u): every process draws the same
member, and a resumed run draws what the unbroken run would have. Each member's batches come in
its own stream of epochs (`Stream`), whose position the checkpoint keeps.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from omegaconf import OmegaConf

from .config import ConfigError, task_section
from .data import epoch_batches
from .task import Constraint, DataError, Task
from .vocab import SPECIALS

N_SPECIAL = len(SPECIALS)


@dataclass
class IdMap:
    """A member's ids in the run's space: specials as they are, id i >= N_SPECIAL at i + offset."""

    src_offset: int = 0
    tgt_offset: int = 0
    task_token: int | None = None  # the source's first id; None for a single-task run

    def src(self, ids: torch.Tensor) -> torch.Tensor:
        """Source rows [B, S] of member ids -> [B, 1 + S] run ids, the task token first."""
        mapped = torch.where(ids >= N_SPECIAL, ids + self.src_offset, ids) if self.src_offset else ids
        if self.task_token is None:
            return mapped
        return torch.cat([torch.full_like(mapped[:, :1], self.task_token), mapped], dim=1)

    def tgt(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.where(ids >= N_SPECIAL, ids + self.tgt_offset, ids) if self.tgt_offset else ids

    def tgt_back(self, ids: Sequence[int]) -> list[int]:
        return [i - self.tgt_offset if i >= N_SPECIAL else i for i in ids]


class Member:
    """One task of the run, as the trainer and the search see it: ids in the run's space.

    `encode_source`, `decode_target`, `constraint`, `postprocess`, `score` and `decoding` are
    the task's, mapped into the run's id space, so that `s2s.core.evaluate.translate` serves a
    member exactly as it serves a task.
    """

    def __init__(self, name: str, task: Task, weight: float = 1.0, select: float = 1.0):
        self.name, self.task, self.weight, self.select = name, task, weight, select
        self.ids = IdMap()
        self.tgt_vocab = 0  # the run's target vocabulary size (set by `join`)
        self.data = None  # s2s.core.data.Prepared, once prepared

    @property
    def decoding(self):
        return self.task.decoding

    def batch(self, split: str, indices) -> dict:
        """The padded tensors of `split`'s pairs `indices` (see data.Split.batch), in run ids."""
        b = self.data.splits[split].batch(indices)
        return {**b, "src": self.ids.src(b["src"]), "tgt_in": self.ids.tgt(b["tgt_in"]),
                "tgt_out": self.ids.tgt(b["tgt_out"])}

    def encode_source(self, lines: Sequence[str]) -> list[list[int]]:
        ids = self.task.encode_source(lines)
        off, token = self.ids.src_offset, self.ids.task_token
        head = [] if token is None else [token]
        return [head + [i + off if i >= N_SPECIAL else i for i in seq] for seq in ids]

    def decode_target(self, ids: Sequence[int]) -> str:
        return self.task.decode_target(self.ids.tgt_back(ids))

    def postprocess(self, hypothesis: str, source: str) -> str:
        return self.task.postprocess(hypothesis, source)

    def constraint(self, sources: Sequence[str]) -> Constraint | None:
        inner = self.task.constraint(sources)
        if self.ids.task_token is None:
            return inner
        return MappedConstraint(inner, len(sources), self.ids.tgt_offset, self.task.tgt_vocab_size,
                                self.tgt_vocab)

    def score(self, hypotheses, references, sources=None):
        return self.task.score(hypotheses, references, sources)


def build_task(section, registry) -> Task:
    """The task that a task section (with its `name`) names; a ValueError of the task's
    constructor is about that section."""
    task_cls = registry.get(section.name)
    try:
        return task_cls(task_section(section))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def build_members(cfg, registry) -> list[Member]:
    """The run's members: its one task (named after the task), or those of `tasks`, in order."""
    if cfg.tasks is None:
        return [Member(cfg.task.name, build_task(cfg.task, registry))]
    return [Member(name, build_task(m.task, registry), m.weight, m.select) for name, m in cfg.tasks.items()]


def data_config(cfg):
    """The data section the members are prepared with: in a multi-task run a training source
    must leave room for its task token (data.max_len at most model.max_positions - 1)."""
    if cfg.tasks is None:
        return cfg.data
    return OmegaConf.merge(cfg.data, {"max_len": min(cfg.data.max_len, cfg.model.max_positions - 1)})


def vocab_dir(run_dir: Path, member: Member, members: list[Member]) -> Path:
    """Where a run keeps a member's vocabulary files: the run directory itself for a single
    task (as before multi-task runs), RUN_DIR/vocab/MEMBER for each of several."""
    return Path(run_dir) if len(members) == 1 else Path(run_dir) / "vocab" / member.name


def load_vocabularies(members: list[Member], run_dir: Path) -> None:
    """Every member's vocabulary from a run directory, then the run's id space."""
    for m in members:
        where = vocab_dir(run_dir, m, members)
        try:
            m.task.load_vocab(where)
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 -- a tokenizer library's own errors, e.g. on a damaged file
            raise DataError(f"cannot read the vocabulary files in {where}: {type(e).__name__}: "
                            f"{(str(e).splitlines() or [''])[0]}") from None
    join(members)


def pick(members: list[Member], name: str | None) -> Member:
    """The member called `name` (None: the only one)."""
    names = [m.name for m in members]
    if name is None:
        if len(members) > 1:
            raise ConfigError(f"this run trained several tasks ({', '.join(names)}): choose one with --task")
        return members[0]
    if name not in names:
        raise ConfigError(f"--task {name!r}: this run's tasks are {', '.join(names)}")
    return members[names.index(name)]


def join(members: list[Member]) -> tuple[int, int, bool]:
    """Give each member its place in one id space; (source size, target size, shared) of the run.

    Call once every member's vocabulary is built or loaded.
    """
    if len(members) == 1:
        task = members[0].task
        members[0].tgt_vocab = task.tgt_vocab_size
        return task.src_vocab_size, task.tgt_vocab_size, task.shared_vocab
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


class MappedConstraint(Constraint):
    """A member's constraint (None: none) in the run's id space, where the member may write
    only its own target ids: the member's ids i >= N_SPECIAL sit at i + offset, its specials
    where they are, and every other id of the run is never allowed."""

    def __init__(self, inner: Constraint | None, n: int, offset: int, member_vocab: int, run_vocab: int):
        self.inner, self.n = inner, n
        self.columns = torch.cat([torch.arange(N_SPECIAL), torch.arange(N_SPECIAL, member_vocab) + offset])
        self.offset, self.run_vocab = offset, run_vocab
        self.outside = None  # 0 at the member's ids, -inf elsewhere: what `score` adds without a constraint

    def initial(self, device) -> tuple:
        self.columns = self.columns.to(device)
        if self.inner is None:
            self.outside = torch.full((self.run_vocab,), float("-inf"), device=device)
            self.outside[self.columns] = 0.0
        return self.inner.initial(device) if self.inner is not None else (torch.zeros(self.n, device=device),)

    def advance(self, state: tuple, tokens) -> tuple:
        if self.inner is None:
            return state
        member = torch.where(tokens >= N_SPECIAL, tokens - self.offset, tokens)
        # a row out of the search may hold another member's id: any in-range id keeps its state usable
        return self.inner.advance(state, member.clamp(0, len(self.columns) - 1))

    def _spread(self, member: torch.Tensor, fill) -> torch.Tensor:
        out = member.new_full((member.size(0), self.run_vocab), fill)
        out[:, self.columns] = member
        return out

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        if self.inner is None:
            mask = torch.ones(remaining.size(0), len(self.columns), dtype=torch.bool, device=remaining.device)
        else:
            mask = self.inner.allowed(state, remaining)
        return self._spread(mask, False)

    def score(self, state: tuple, logp: torch.Tensor, remaining) -> torch.Tensor:
        if self.inner is None:  # one add on the hot path, no gather and scatter
            return logp + self.outside.to(logp.dtype)
        member = self.inner.score(state, logp.index_select(1, self.columns), remaining)
        return self._spread(member, float("-inf"))


def probabilities(members: list[Member], temperature: float) -> np.ndarray:
    """p_k proportional to weight_k * n_k^(1/T), n_k = member k's training pairs."""
    sizes = np.array([len(m.data.splits["train"]) for m in members], dtype=np.float64)
    weights = np.array([m.weight for m in members], dtype=np.float64)
    p = weights * sizes ** (1.0 / temperature)
    return p / p.sum()


def draw(p: np.ndarray, seed: int, update: int) -> int:
    """The member that update `update` (counted from 1) trains: a function of (seed, update) only."""
    if len(p) == 1:
        return 0
    return int(np.random.default_rng([seed, update]).choice(len(p), p=p))


class Stream:
    """One member's training batches from a position (epoch, batches taken in it), epoch after epoch."""

    def __init__(self, member: Member, max_tokens: int, seed: int, rank: int, world: int):
        self.member, self.max_tokens, self.seed, self.rank, self.world = member, max_tokens, seed, rank, world
        self.epoch, self.pos, self._batches = 0, 0, None

    def next(self) -> np.ndarray:
        if self._batches is None:
            self._batches = epoch_batches(self.member.data.splits["train"], self.max_tokens, self.seed,
                                          self.epoch, self.rank, self.world)
        if self.pos == len(self._batches):
            self.epoch, self.pos = self.epoch + 1, 0
            self._batches = None
            return self.next()
        self.pos += 1
        return self._batches[self.pos - 1]

    def state(self) -> list[int]:
        return [self.epoch, self.pos]

    def restore(self, state: Sequence[int]) -> None:
        self.epoch, self.pos = int(state[0]), int(state[1])
        self._batches = None
