"""The tasks of a run: one, or several sharing one model (its members), and the model over them.

A run trains its members: the one task of `task`, or the members listed under `tasks` (see
config.MemberConfig). Each member keeps its own tokenisation, vocabulary, prepared data,
decoding defaults, constraint and metric; a task needs no change to join. A member is its task
in the run's id space (`s2s.core.idspace`); which member an update trains is `s2s.core.schedule`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from omegaconf import OmegaConf

from .config import task_section
from .errors import ConfigError, DataError
from .idspace import N_SPECIAL, IdMap, MappedConstraint, join
from .model import Transformer
from .task import Constraint, Task


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


def build_model(cfg, members: list[Member]) -> Transformer:
    """The Transformer over the members' id space (`idspace.join`)."""
    return Transformer(cfg.model, *join(members))
