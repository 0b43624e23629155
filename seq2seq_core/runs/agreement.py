"""A checkpoint checked against the config and tasks that would use it, once for resume,
`s2s generate`, export and fine-tuning: the settings its weights were trained with
(`config_difference`, `check_config`) and its tasks in their order (`check_members`). The
checkpoint is handed over as `Read`: what it holds and where it was read from, which the errors
name.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from omegaconf import OmegaConf

from ..errors import CheckpointError

log = logging.getLogger("s2s")


_TRAINING_ONLY = ("dropout", "attention_dropout")


@dataclasses.dataclass(frozen=True)
class Read:
    """A checkpoint as read: its contents, its file, and the run directory whose config.yaml
    and vocabulary files serve it (what a refusal names)."""

    state: dict
    path: Path
    run_dir: Path


def _paths(task) -> set:
    """The fields of a task's section that say where its files are (as `config.expand_paths`
    finds them) or how input text is read (metadata `input`, e.g. parsing's `tokenize`): moving
    the data changes nothing the weights mean, the vocabulary is checked apart."""
    return {
        f.name
        for f in dataclasses.fields(task.Config)
        if f.metadata.get("path", f.name.endswith("_dir") or f.name == "nltk_data")
        or f.metadata.get("input")
    }


def _first_difference(mine, theirs, key: str, skip=()):
    """(key, mine, theirs) of the first setting under `key` (but its keys `skip`) whose values
    differ; a setting the checkpoint's config lacks (added to the schema since) takes its default
    and is not compared."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for k, v in mine.items():
            if k in theirs and k not in skip:
                found = _first_difference(v, theirs[k], f"{key}.{k}")
                if found:
                    return found
        return None
    return None if mine == theirs else (key, mine, theirs)


def config_difference(cfg, saved: dict, members) -> tuple | None:
    """(key, value in `cfg`, value in `saved`) of the first setting that decides what the weights
    mean (the model section, the task section or the members: names, order and task sections)
    and differs between `cfg`, whose members are `members`, and `saved`, a checkpoint's config;
    None when they agree."""
    mine = OmegaConf.to_container(cfg, enum_to_str=True)
    found = _first_difference(mine.get("model"), saved.get("model"), "model", _TRAINING_ONLY)
    if found:
        return found
    paths = {m.name: _paths(m.task) for m in members}
    ours, theirs = mine.get("tasks"), saved.get("tasks")
    if ours is None and theirs is None:
        return _first_difference(
            mine.get("task"), saved.get("task"), "task", set().union(*paths.values())
        )
    if not isinstance(ours, dict) or not isinstance(theirs, dict) or list(ours) != list(theirs):
        return (
            "tasks",
            list(ours) if isinstance(ours, dict) else None,
            list(theirs) if isinstance(theirs, dict) else None,
        )
    for name, member in ours.items():
        found = _first_difference(
            (member or {}).get("task"),
            (theirs[name] or {}).get("task"),
            f"tasks.{name}.task",
            paths.get(name, ()),
        )
        if found:
            return found
    return None


def _shown(value) -> str:
    text = (
        "absent"
        if value is None
        else ", ".join(map(str, value))
        if isinstance(value, list)
        else repr(value)
    )
    return text if len(text) <= 80 else text[:77] + "..."


def check_config(cfg, members, read: Read, overrides=()) -> None:
    """A CheckpointError naming RUN_DIR/config.yaml, the first differing key and both values when
    the config (with the command line's overrides) and the one stored in the checkpoint `read`
    disagree on what the weights mean. A checkpoint without a config passes."""
    saved = read.state.get("config")
    if not isinstance(saved, dict):
        return
    found = config_difference(cfg, saved, members)
    if found is None:
        return
    key, mine, theirs = found
    parts = key.split(".")
    overridden = {str(o).partition("=")[0].strip().lstrip("+~") for o in overrides} & {
        ".".join(parts[:n]) for n in range(1, len(parts) + 1)
    }
    where = f"{read.run_dir / 'config.yaml'}{' with the overrides' if overridden else ''}"
    raise CheckpointError(
        f"{where} does not match checkpoint {read.path}: {key} is {_shown(mine)} there but "
        f"{_shown(theirs)} in the checkpoint, whose weights were trained with it; "
        f"set {key} back to {_shown(theirs)}"
    )


def check_members(members, read: Read, resuming: bool = False) -> None:
    """A CheckpointError when `members` are not the tasks of the checkpoint `read` in its order:
    each member's ids would index another member's rows. `resuming`: the members are those of the
    config a run resumes with (the command's, which RUN_DIR/config.yaml is not yet), not those
    of RUN_DIR/config.yaml, which `s2s generate` and export read."""
    trained = read.state.get("tasks")
    names = [m.name for m in members]
    if trained is None or list(trained) == names:
        return
    config = read.run_dir / "config.yaml"
    listing = "this config" if resuming else str(config)
    remedy = f", as {config} does, or train in a new run.dir" if resuming else ""
    raise CheckpointError(
        f"{listing} lists the tasks {', '.join(names)} but checkpoint {read.path} was trained "
        f"with {', '.join(map(str, trained))} in this order; list the same tasks in the "
        f"checkpoint's order{remedy}"
    )
