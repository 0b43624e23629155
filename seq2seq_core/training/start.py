"""The state a run starts from, and what of it a checkpoint carries.

A run starts at update 0 (a new run), from this run's newest readable checkpoint (a resumed run:
model, optimiser, loss scale, every member's data position and the counters below), or from the
weights of another run's checkpoint (`run.init_from`, `s2s.core.training.transfer`) with what
`run.init_keep` takes besides (optimiser, schedule, best, data) and every other part reset, as a
new run's. A resumed run continues exactly with any number of processes whose global batch
(data.max_tokens and processes x optim.update_freq) is the checkpoint's (`check_global_batch`).

`Start` holds the counters that are not tensors (the update, each member's updates, the skipped
ones, the best validated model, the training time): `Start.read` takes them from a checkpoint,
`Start.written` gives them to the next one. `begin` loads the rest into the parts the Trainer set
up and returns the Start; the Trainer keeps the counters as it trains.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..errors import ConfigError, TrainingError
from ..runs import checkpoint
from ..runs.agreement import Read, check_members
from . import transfer

log = logging.getLogger("s2s")


@dataclass
class Start:
    """The counters of a run at the update it starts from (and, as the Trainer trains, at any
    update): `Start.read` takes them from a checkpoint, `written` gives them to one."""

    update: int = 0
    #: the updates each member has trained, in the order of the run's members
    member_updates: list = field(default_factory=list)
    skipped_updates: int = 0
    nonfinite_in_row: int = 0
    #: {"update", "select", "higher_is_better"}: the validated model with the best dev figure
    best: dict | None = None
    stale: int = 0  # validations since the best one (run.patience)
    elapsed: float = 0.0  # training seconds, summed over the runs that led to this update
    resumed: bool = False  # read from this run's own checkpoint

    @classmethod
    def fresh(cls, members) -> Start:
        """Update 0 of a new run."""
        return cls(member_updates=[0] * len(members))

    @classmethod
    def read(cls, state: dict, members) -> Start:
        """The counters of checkpoint `state` (one written before multi-task runs counts every
        update as its one member's)."""
        update = state["update"]
        done = state.get("member_updates") or {members[0].name: update}
        return cls(
            update=update,
            member_updates=[done[m.name] for m in members],
            skipped_updates=state.get("skipped_updates", 0),
            nonfinite_in_row=state.get("nonfinite_in_row", 0),
            best=state.get("best"),
            stale=state.get("stale", 0),
            elapsed=state.get("elapsed", 0.0),
            resumed=True,
        )

    def written(self, members) -> dict:
        """The counters as a checkpoint holds them (`read` takes them back)."""
        return {
            "update": self.update,
            "member_updates": dict(zip((m.name for m in members), self.member_updates)),
            "skipped_updates": self.skipped_updates,
            "nonfinite_in_row": self.nonfinite_in_row,
            "best": self.best,
            "stale": self.stale,
            "elapsed": self.elapsed,
        }

    @classmethod
    def of(cls, holder) -> Start:
        """The counters `holder` (a Trainer) has now, which carries them under the same names."""
        return cls(**{f.name: getattr(holder, f.name) for f in fields(cls) if f.name != "resumed"})


def global_batch(cfg, processes: int) -> dict:
    """What the data position counts in: an update takes processes x update_freq batches of
    max_tokens from each member's one sequence (`schedule.Stream`)."""
    return {
        "max_tokens": cfg.data.max_tokens,
        "update_freq": cfg.optim.update_freq,
        "processes": processes,
    }


def check_global_batch(state: dict, path: Path, now: dict) -> None:
    """A run resumes with any number of processes, continuing exactly, when its global
    batch is the checkpoint's: the same data.max_tokens and the same processes x
    optim.update_freq (batches an update takes from the sequence); otherwise a TrainingError
    says which changed and how to keep it."""
    was = state.get("global_batch")
    if was is None:
        return  # an older checkpoint: `resume` places its data position
    slots_was = was["update_freq"] * was["processes"]
    slots_now = now["update_freq"] * now["processes"]
    if was["max_tokens"] == now["max_tokens"] and slots_was == slots_now:
        return
    keep = f"data.max_tokens={was['max_tokens']} and processes x optim.update_freq = {slots_was}"
    if slots_was % now["processes"] == 0:
        keep += f" (optim.update_freq={slots_was // now['processes']} on {now['processes']})"
    raise TrainingError(
        f"checkpoint {path} was trained with updates of {slots_was} batches of "
        f"data.max_tokens={was['max_tokens']} ({was['processes']} process(es) x "
        f"optim.update_freq {was['update_freq']}), now {slots_now} of {now['max_tokens']} "
        f"({now['processes']} x {now['update_freq']}): resume with {keep}, or train in a "
        "new run.dir"
    )


def begin(trainer, registry, source) -> Start:
    """Where `trainer`'s run starts: this run's newest readable checkpoint (`resume`), else the
    weights of run.init_from (and what run.init_keep takes, `keep_from_source`; `source` when the
    Trainer checked it before claiming the run directory), else update 0."""
    state, path = checkpoint.resume(trainer.run_dir, trainer.group)
    if state is not None:
        return resume(trainer, state, path)
    start = Start.fresh(trainer.members)
    if trainer.cfg.run.init_from:  # a new run that starts from another run's weights
        source = source or transfer.checked_source(trainer.cfg, registry)
        kept = transfer.init_from(trainer.model, trainer.members, trainer.cfg, source)
        keep_from_source(trainer, start, kept)
    return start


def resume(trainer, state: dict, path: Path) -> Start:
    """Continue from checkpoint `state` (read from `path`): model, optimiser, loss scale, every
    member's data position into `trainer`'s parts, and the counters returned; with any number of
    processes whose global batch is the checkpoint's (`check_global_batch`)."""
    g, members, streams = trainer.group, trainer.members, trainer.streams
    check_members(members, Read(state, path, trainer.run_dir), resuming=True)
    check_global_batch(state, path, global_batch(trainer.cfg, g.world))
    try:
        trainer.model.load_state_dict(state["model"])
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.scaler.load_state_dict(state["scaler"])
        # written before multi-task runs: one stream, kept as (epoch, batch_pos)
        positions = state.get("streams") or {members[0].name: [state["epoch"], state["batch_pos"]]}
        for s in streams:
            s.restore(positions[s.member.name])
    except (RuntimeError, ValueError, KeyError) as e:
        raise TrainingError(
            f"checkpoint {path} does not fit this config ({str(e).splitlines()[0]}); "
            "resume with the config it was written with (RUN_DIR/config.yaml) or "
            "train in a new run.dir"
        ) from None
    start = Start.read(state, members)
    if "global_batch" not in state and len(state.get("rng", ())) > 1:
        # written before the data was one sequence for all processes: each process held a
        # position in its own share of every epoch, so all of them together had taken
        # about `world` times as many batches
        for s in streams:
            s.pos *= len(state["rng"])
        if g.rank == 0:
            log.warning(
                "checkpoint %s was written by %d processes by an older s2s, with a data "
                "position of each process's own: the position is approximate",
                path,
                len(state["rng"]),
            )
    if g.rank == 0:
        log.info("resumed from %s at update %d", path, start.update)
    return start


def keep_from_source(trainer, start: Start, state: dict) -> None:
    """What run.init_keep takes from the source checkpoint of run.init_from besides the
    weights (`s2s.core.training.transfer`): the optimiser state into `trainer`'s optimiser, the
    schedule's step and the best dev figure into `start`, the data position into its streams."""
    kept = set(trainer.cfg.run.init_keep)
    if "optimizer" in kept:
        try:
            trainer.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, ValueError, RuntimeError) as e:
            raise ConfigError(
                "run.init_keep=optimizer: the source's optimiser state does not fit this "
                f"model ({str(e).splitlines()[0]}); it needs the same vocabulary and parameters"
            ) from None
    if "schedule" in kept:
        start.update = state["update"]
    if "best" in kept:
        start.best = state.get("best")
    if "data" in kept:
        positions = state.get("streams") or {}
        for s in trainer.streams:
            if s.member.name not in positions:
                raise ConfigError(
                    "run.init_keep=data: the source has no data position for task "
                    f"{s.member.name!r}"
                )
            s.restore(positions[s.member.name])
