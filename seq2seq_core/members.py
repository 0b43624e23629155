"""The tasks of a run: one, or several sharing one model (its members), and the model over them.

A run trains its members: the one task of `task`, or the members listed under `tasks` (see
config.MemberConfig). Each member keeps its own tokenisation, vocabulary, prepared data,
decoding defaults, constraint and metric; a task needs no change to join. A member is its task
in the run's id space (`s2s.core.idspace`); which member an update trains is `s2s.core.schedule`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf

from .data import prepare as prepare_data
from .errors import ConfigError, DataError, TrainingError
from .idspace import N_SPECIAL, IdMap, MappedConstraint, join
from .model import Transformer
from .task import Constraint, Task, decode_settings


class Member:
    """One task of the run, as the trainer and the search see it: ids in the run's space.

    `encode_source`, `decode_target`, `constraint`, `postprocess`, `score` and `decoding` are
    the task's, mapped into the run's id space, so that `s2s.core.evaluate.translate` serves a
    member exactly as it serves a task.
    """

    def __init__(self, name: str, task: Task, weight: float = 1.0, select: float = 1.0, alone: bool = True):
        self.name, self.task, self.weight, self.select = name, task, weight, select
        # a run's only member keeps a single-task run's names: figures `bleu`, not `NAME/bleu`;
        # test.hyp.txt, not test.NAME.hyp.txt; vocabulary files in the run directory itself
        self.prefix = "" if alone else f"{name}/"
        self.infix = "" if alone else f".{name}"
        self.vocab_subdir = Path() if alone else Path("vocab") / name
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


def task_section(section: DictConfig) -> DictConfig:
    """A task section without its `name`, as the task's Config expects it."""
    section = OmegaConf.to_container(section)
    section.pop("name", None)
    return OmegaConf.create(section)


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
    return [Member(name, build_task(m.task, registry), m.weight, m.select, alone=False)
            for name, m in cfg.tasks.items()]


def data_config(cfg):
    """The data section the members are prepared with: in a multi-task run a training source
    must leave room for its task token (data.max_len at most model.max_positions - 1)."""
    if cfg.tasks is None:
        return cfg.data
    return OmegaConf.merge(cfg.data, {"max_len": min(cfg.data.max_len, cfg.model.max_positions - 1)})


def load_vocabularies(members: list[Member], run_dir: Path) -> None:
    """Every member's vocabulary from a run directory, then the run's id space."""
    for m in members:
        where = Path(run_dir) / m.vocab_subdir
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


def prepare(members: list[Member], cfg, group, quiet: bool) -> None:
    """Each member's data (rank 0 prepares it or checks its cache, the others then read the
    cache), the run's id space, and what would otherwise fail after training: the splits
    training needs, dev and test pairs too long for the model, unusable decoding settings."""
    data_cfg = data_config(cfg)

    def read(rank0: bool):
        if (group.rank == 0) == rank0:
            for m in members:
                m.data = prepare_data(m.task, data_cfg, quiet=quiet or not rank0)

    group.agreed(lambda: read(True), rank0_only=True)
    group.agreed(lambda: read(False))
    join(members)
    for m in members:
        for needed in ("train", "valid"):
            if needed not in m.data.splits:
                raise TrainingError(f"task {m.name!r} has no {needed!r} split")
        _check_fits(m, cfg.model.max_positions)
        decoding = decode_settings(m.task, cfg.decode)
        if decoding.beam < 1 or str(decoding.stop) not in ("bound", "beam"):
            raise TrainingError(f"task {m.name!r}: decoding {decoding} is not usable "
                                "(beam >= 1, stop bound | beam); set decode.beam / decode.stop")


def _check_fits(member: Member, max_positions: int) -> None:
    """Dev and test pairs must fit the model's positions (training pairs are filtered by
    data.max_len); the error names the split and line."""
    extra = member.ids.task_token is not None
    for name, split in member.data.splits.items():
        if name == "train":
            continue
        too_long = np.flatnonzero(np.maximum(split.src_lens + extra, split.tgt_lens) > max_positions)
        if len(too_long):
            i = int(too_long[0])
            raise TrainingError(
                f"{name} split, line {i + 1} of {member.data.directory / f'{name}.src.txt'}: "
                f"{int(split.src_lens[i]) + extra} source / {int(split.tgt_lens[i])} target tokens (with </s>"
                f"{' and the task token' if extra else ''}) do not fit model.max_positions={max_positions} "
                f"({len(too_long)} such pair(s) in {name}); raise model.max_positions or shorten them")


def build_model(cfg, members: list[Member]) -> Transformer:
    """The Transformer over the members' id space (`idspace.join`)."""
    return Transformer(cfg.model, *join(members))
