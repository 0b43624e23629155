"""The tasks of a run: one, or several sharing one model (its members), and the model over them.

A run trains its members: the one task of `task`, or the members listed under `tasks` (see
config.MemberConfig). Each member keeps its own tokenisation, vocabulary, prepared data, decoding
defaults, constraint and metric; a task needs no change to join. A member is its task in the run's
id space (`s2s.core.data.idspace`); which member an update trains is `s2s.core.training.schedule`.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError, DataError, TrainingError
from ..setup.settings import Stop
from ..contract.task import Constraint, DecodeDefaults, Task
from . import joint
from .idspace import N_SPECIAL, IdMap, MappedConstraint, join
from .augment import Augment
from .cache import padded
from .nodes import prepare_data
from .shards import Nodes


class Member:
    """One task of the run, as the trainer and the search see it: ids in the run's space.

    `encode_source`, `decode_target`, `constraint`, `postprocess`, `prepare_source`, `display`,
    `score`, `statistics` and `decoding` are the task's, mapped into the run's id space, so that
    batched decoding (`s2s.core.decode.batched`) serves a member exactly as it serves a task.
    """

    def __init__(
        self, name: str, task: Task, weight: float = 1.0, select: float = 1.0, alone: bool = True
    ):
        self.name, self.task, self.weight, self.select = name, task, weight, select
        self.stage_weights: list[float] = []  # its weight in stages 1, 2, ... (multitask.stages)
        # a run's only member keeps a single-task run's names: figures `bleu`, not `NAME/bleu`;
        # test.hyp.txt, not test.NAME.hyp.txt; vocabulary files in the run directory itself
        self.prefix = "" if alone else f"{name}/"
        self.infix = "" if alone else f".{name}"
        self.vocab_subdir = Path() if alone else Path("vocab") / name
        self.ids = IdMap()
        self.tgt_vocab = 0  # the run's target vocabulary size (set by `join`)
        # side -> number of the vocabulary it shares with other members (`s2s.core.data.joint`);
        # None: the run shares none (multitask.shared_vocab off)
        self.share: dict[str, int] | None = None
        self.data = None  # s2s.core.data.cache.Prepared, once prepared
        self.augment = None  # s2s.core.data.augment.Augment: noise on training sources

    @property
    def decoding(self):
        return self.task.decoding

    @property
    def terminology(self) -> bool:
        return self.task.terminology

    def batch(self, split: str, indices) -> dict:
        """The padded tensors of `split`'s pairs `indices` (see data.Split.batch), in run ids;
        training sources noised (`augment`) when `indices` carry their epoch (`batches.taken`)."""
        epoch = getattr(indices, "epoch", None)
        if split == "train" and self.augment is not None and epoch is not None:
            srcs, tgts = self.data.splits[split].ids(indices)
            b = padded(self.augment.sources(self.task, srcs, indices, epoch), tgts)
        else:
            b = self.data.splits[split].batch(indices)
        return {
            **b,
            "src": self.ids.src(b["src"]),
            "tgt_in": self.ids.tgt(b["tgt_in"]),
            "tgt_out": self.ids.tgt(b["tgt_out"]),
        }

    def encode_source(self, lines: Sequence[str]) -> list[list[int]]:
        ids = self.task.encode_source(lines)
        off, token = self.ids.src_offset, self.ids.task_token
        head = [] if token is None else [token]
        return [head + [i + off if i >= N_SPECIAL else i for i in seq] for seq in ids]

    def decode_target(self, ids: Sequence[int]) -> str:
        return self.task.decode_target(self.ids.tgt_back(ids))

    def encode_target(self, lines: Sequence[str]) -> list[list[int]]:
        off = self.ids.tgt_offset
        return [
            [i + off if i >= N_SPECIAL else i for i in seq]
            for seq in self.task.encode_target(lines)
        ]

    @property
    def tgt_vocab_size(self) -> int:
        """The run's target ids, which a search for this member ranges over."""
        return self.tgt_vocab

    def postprocess(self, hypothesis: str, source: str) -> str:
        return self.task.postprocess(hypothesis, source)

    def prepare_source(self, lines: Sequence[str]) -> list[str]:
        return self.task.prepare_source(lines)

    def output_target(self, output: str, source: str) -> str:
        return self.task.output_target(output, source)

    def display(self, output: str) -> str:
        return self.task.display(output)

    def constraint(self, sources: Sequence[str]) -> Constraint | None:
        inner = self.task.constraint(sources)
        if self.ids.task_token is None:
            return inner
        return MappedConstraint(
            inner, len(sources), self.ids.tgt_offset, self.task.tgt_vocab_size, self.tgt_vocab
        )

    def score(self, hypotheses, references, sources=None):
        return self.task.score(hypotheses, references, sources)

    def statistics(self, hypotheses, references, sources=None):
        return self.task.statistics(hypotheses, references, sources)


def decode_settings(task: Task, decode_cfg) -> DecodeDefaults:
    """A task's decoding defaults (`task.decoding`) with any field the run's decode section sets."""
    chosen = {f.name: getattr(decode_cfg, f.name) for f in fields(DecodeDefaults)}
    return replace(task.decoding, **{k: v for k, v in chosen.items() if v is not None})


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
    """The run's members: its one task (named after the task), or those of `tasks`, in order,
    each with decoding settings that a search can use."""
    if cfg.tasks is None:
        members = [Member(cfg.task.name, build_task(cfg.task, registry))]
    else:
        members = [
            Member(name, build_task(m.task, registry), m.weight, m.select, alone=False)
            for name, m in cfg.tasks.items()
        ]
        for m, section in zip(members, cfg.tasks.values()):
            m.stage_weights = list(section.stage_weights)
        if cfg.multitask.shared_vocab:
            joint.assign(members)
    for m in members:
        m.augment = Augment.of(cfg.data, cfg.run.seed)
        decoding = decode_settings(m.task, cfg.decode)
        stops = [str(s) for s in Stop]
        if decoding.beam < 1 or str(decoding.stop) not in stops:
            raise ConfigError(
                f"task {m.name!r}: decoding {decoding} is not usable "
                f"(beam >= 1, stop {' | '.join(stops)}); set decode.beam / decode.stop"
            )
    return members


def data_config(cfg):
    """The data section the members are prepared with: in a multi-task run a training source
    must leave room for its task token (data.max_len at most model.max_positions - 1)."""
    if cfg.tasks is None:
        return cfg.data
    return OmegaConf.merge(
        cfg.data, {"max_len": min(cfg.data.max_len, cfg.model.max_positions - 1)}
    )


def load_vocabularies(members: list[Member], run_dir: Path) -> tuple[int, int, bool]:
    """Every member's vocabulary from a run directory; returns the run's id space
    (`idspace.join`)."""
    for m in members:
        where = Path(run_dir) / m.vocab_subdir
        try:
            m.task.load_vocab(where)
        except DataError:
            raise
        except Exception as e:  # noqa: BLE001 -- a tokenizer library's errors (a damaged file)
            raise DataError(
                f"cannot read the vocabulary files in {where}: {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0]}"
            ) from None
    return join(members)


def pick(members: list[Member], name: str | None) -> Member:
    """The member called `name` (None: the only one)."""
    names = [m.name for m in members]
    if name is None:
        if len(members) > 1:
            raise ConfigError(
                f"this run trained several tasks ({', '.join(names)}): choose one with --task"
            )
        return members[0]
    if name not in names:
        raise ConfigError(f"--task {name!r}: this run's tasks are {', '.join(names)}")
    return members[names.index(name)]


def prepare_members(
    members: list[Member], cfg, group, quiet: bool, nodes: Nodes = Nodes()
) -> tuple[int, int, bool]:
    """Each member's data (rank 0 prepares it or checks its cache, the others then read the
    cache; with several `nodes`, node 0 is rank 0 and the others help it: `nodes`), and what
    would otherwise fail after training: the splits training needs, dev and test pairs too long
    for the model (`cache.Prepared.open`). Returns the run's id space (`idspace.join`)."""
    data_cfg = data_config(cfg)
    groups = joint.assign(members) if members[0].share is not None else []

    # with several nodes, the first process of each builds (those of a vocabulary of their own)
    builds = group.rank == 0 or (nodes.rank > 0 and group.local_rank == 0)

    def read(rank0: bool):
        if builds == rank0:
            # members sharing a vocabulary are prepared with it, beneath it in the cache
            shared_cfg = (
                OmegaConf.merge(
                    data_cfg, {"cache_dir": str(joint.build(members, groups, cfg, data_cfg))}
                )
                if groups
                else data_cfg
            )
            for m in members:  # a source of several members starts with its task token
                m.data = prepare_data(
                    m.task,
                    shared_cfg if m.share else data_cfg,
                    quiet=quiet or not rank0,
                    fit=(cfg.model.max_positions, bool(m.prefix)),
                    nodes=nodes if rank0 and not m.share else Nodes(),
                )

    group.agreed(lambda: read(True), rank0_only=nodes.count == 1)
    group.agreed(lambda: read(False))
    for m in members:
        # a member that only adds training pairs (select 0 beside others) needs no dev split
        dev_optional = len(members) > 1 and m.select == 0
        for needed in ("train",) if dev_optional else ("train", "valid"):
            if needed not in m.data.splits:
                raise TrainingError(f"task {m.name!r} has no {needed!r} split")
    if all("valid" not in m.data.splits for m in members):
        raise TrainingError("no member has a 'valid' split: at least one must have dev pairs")
    return join(members)
