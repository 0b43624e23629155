"""A run's config: the settings (`s2s.core.setup.settings`) merged from a preset YAML and overrides.

A preset names its task (`task.name`); the task section is then checked against that task's own
`Config` dataclass. Any unknown key or wrongly typed value fails at once with the dotted key and the
nearest valid one; values out of the range a field declares, non-finite numbers and broken relations
(heads dividing d_model, ...) fail the same way (`s2s.core.contract.checks.check_sections`, once the
config is merged), before any data is read. Each component receives only its own section. Preset
files stay YAML; task keys are typed by the task's own Config once `task.name` is known.

Command-line overrides `KEY=VALUE` are split at the first "=", and the value converted only by
the declared type of its field (`typed_value`): a string is kept exactly (a "#", a newline,
"no", "null" or "${...}" included), a number is Python's int() or float() of it, a bool is
true/false/yes/no/1/0 (any case), an Optional field takes null or none as None, an Enum field
one of its values. Path fields get a leading `~` expanded.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..contract import checks
from ..errors import ConfigError
from .settings import SECTIONS, Config, MemberConfig


def _preset_dir() -> Path:
    """The presets travel inside the package as `s2s.tasks` (the repository's tasks/ folder)."""
    import s2s.tasks

    return Path(s2s.tasks.__file__).resolve().parent


PRESET_DIR = _preset_dir()
#: the entry-point group of plugin presets: `NAME = "package"`, an importable package whose
#: `*.yaml` files are presets (as `s2s.tasks` is the built-in ones')
PRESET_GROUP = "s2s.presets"


def _preset_folders(registry=None) -> list[tuple[Path, str]]:
    """(folder, origin) of every place presets come from: the built-in `s2s.tasks`, each
    `s2s.presets` entry point's package, and the `presets/` folder beside each `--plugin` the
    registry loaded. A package that cannot be imported is a ConfigError naming the entry point."""
    import importlib.util
    from importlib.metadata import entry_points

    folders = [(PRESET_DIR, "s2s (built-in)")]
    for ep in entry_points(group=PRESET_GROUP):
        where = f"entry point {ep.name} = {ep.value} ({ep.dist.name if ep.dist else '?'})"
        try:
            spec = importlib.util.find_spec(ep.value)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"presets of {where}: cannot import {ep.value!r}: {e}") from None
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(f"presets of {where}: {ep.value!r} is not an importable package")
        folders += [(Path(p), where) for p in spec.submodule_search_locations]
    folders += list(getattr(registry, "preset_folders", ()))
    return folders


def presets(registry=None) -> dict[str, list[tuple[Path, str]]]:
    """Preset name -> the (file, origin) of each place that has one of that name (one file found
    twice, through an editable install and an entry point say, counts once)."""
    found: dict[str, list[tuple[Path, str]]] = {}
    for folder, origin in _preset_folders(registry):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            places = found.setdefault(path.stem, [])
            if all(p.resolve() != path.resolve() for p, _ in places):
                places.append((path, origin))
    return dict(sorted(found.items()))


def preset_names(registry=None) -> list[str]:
    return list(presets(registry))


def preset_path(preset: str, registry=None) -> Path:
    """A preset name (built-in, a plugin's, or beside a `--plugin` the registry loaded) or a path
    to a YAML file. A name two places give is a ConfigError naming both."""
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"preset file {p} does not exist")
        return p
    known = presets(registry)
    places = known.get(preset, [])
    if len(places) > 1:
        raise ConfigError(
            f"preset {preset!r} comes from two places: "
            + " and ".join(f"{path} ({origin})" for path, origin in places)
            + "; rename one of them, or give the YAML file's path"
        )
    if places:
        return places[0][0]
    near = difflib.get_close_matches(preset, list(known), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise ConfigError(f"unknown preset {preset!r}{hint}; known presets: {', '.join(known)}")


def _nearest(key: str, valid: list[str], section: str = "") -> str:
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    prefix = f"{section}." if section else ""
    return f"; did you mean '{prefix}{near[0]}'?" if near else f"; valid keys: {', '.join(valid)}"


def _check_keys(section: str, given: dict, schema) -> None:
    """Name an unknown key with its nearest valid neighbour, before omegaconf merges."""
    valid = list(schema.keys())
    for key, value in given.items():
        if key not in valid:
            raise ConfigError(
                f"unknown config key '{section}.{key}'{_nearest(key, valid, section)}"
            )
        sub = schema[key]
        if (
            isinstance(sub, DictConfig)
            and isinstance(value, dict)
            and section != ""
            and key != "task"
        ):
            _check_keys(f"{section}.{key}", value, sub)


def _merge(schema: DictConfig, section: str, data: dict) -> DictConfig:
    try:
        return OmegaConf.merge(schema, data)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(getattr(e, "msg", e)).splitlines()[0]
        if "is not a ListConfig" in msg:  # omegaconf's words for a value that is no list
            msg = "must be a list ([a, b])"
        raise ConfigError(f"bad value for '{section}{key}': {msg}") from None


_MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# -- overrides: values as the user typed them, typed by the field they set ----------------------
class _Typed(str):
    """An override's value exactly as typed on the command line, not yet typed by its field."""


_SECTION_KEYS = {f.name for f in dataclasses.fields(Config)}
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
_NULL = ("null", "none")
_INTERPOLATION = re.compile(r"(\\*)\$\{")


def add_override(data: dict, item: str) -> None:
    """Put override `KEY=VALUE` (split at the first "=") into the nested dict `data`."""
    key, sep, value = str(item).partition("=")
    parts = key.split(".")
    if not sep or not all(p.strip() for p in parts):
        raise ConfigError(
            f"bad override {str(item)!r}: write KEY=VALUE with a dotted key, e.g. model.layers=3"
        )
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(
                f"{key}={value!r}: '{'.'.join(parts[: i + 1])}' is a setting, not a section"
            )
        node = child
    if isinstance(node.get(parts[-1]), dict) or (len(parts) == 1 and key in _SECTION_KEYS):
        raise ConfigError(f"{key}={value!r}: '{key}' is a section; set its keys ({key}.KEY=VALUE)")
    node[parts[-1]] = _Typed(value)


def _escaped(text: str) -> str:
    """`text` as omegaconf keeps a literal string: "${" is not an interpolation."""
    return _INTERPOLATION.sub(lambda m: m.group(1) * 2 + "\\${", text)


def plain(value):
    """`value` with every typed-as-given string made a plain (escaped) string."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return _escaped(str(value)) if isinstance(value, _Typed) else value


_BUILTIN_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _field_types(cls) -> dict:
    """Field name -> declared type of dataclass `cls` (string annotations resolved)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 -- a plugin's annotation that does not resolve: by name
        return {
            f.name: _BUILTIN_TYPES.get(f.type, Any) if isinstance(f.type, str) else f.type
            for f in dataclasses.fields(cls)
        }


def typed_section(where: str, values: dict, cls) -> dict:
    """`values` (a section of dataclass `cls`) with each typed-as-given string converted by the
    type its field declares; values from YAML are left to omegaconf."""
    types = _field_types(cls)
    out = {}
    for key, value in values.items():
        dotted, tp = f"{where}.{key}", types.get(key, Any)
        if isinstance(value, dict):
            out[key] = (
                typed_section(dotted, value, tp) if dataclasses.is_dataclass(tp) else plain(value)
            )
        elif isinstance(value, _Typed):
            out[key] = typed_value(dotted, str(value), tp)
        else:
            out[key] = value
    return out


def typed_value(key: str, text: str, tp):
    """The value of setting `key` (declared type `tp`) that the string `text` stands for."""
    nullable = False
    if typing.get_origin(tp) is Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(tp))
        if nullable and text.strip().lower() in _NULL:
            return None
        tp = args[0] if len(args) == 1 else Any
    orelse = " (or null)" if nullable else ""
    if tp is bool:
        lowered = text.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise ConfigError(f"{key}={text!r}: must be true or false (yes/no, 1/0){orelse}")
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(text)
        except ValueError:
            values = [str(m.value) for m in tp]
            near = [v for v in values if v.lower() == text.strip().lower()]
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                f"{key}={text!r}: must be one of {', '.join(values)}{orelse}{hint}"
            ) from None
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{key}={text!r}: must be a whole number{orelse}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{key}={text!r}: must be a number{orelse}") from None
    if typing.get_origin(tp) in (list, dict, tuple) or tp in (list, dict, tuple):
        import yaml

        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{key}={text!r}: must be a YAML list or mapping") from None
        kind = typing.get_origin(tp) or tp
        if kind in (list, tuple) and not isinstance(value, list):
            raise ConfigError(
                f"{key}={text!r}: must be a list in brackets, e.g. {key}=[{text.strip() or 'a'}]"
                + (" (a comma-separated list)" if "," in text else "")
            )
        if kind is dict and not isinstance(value, dict):
            raise ConfigError(f"{key}={text!r}: must be a mapping in braces, e.g. {key}={{a: 1}}")
        return value
    return _escaped(text)  # str, Any and any other type: the string as typed


def expand_paths(values: dict, cls) -> dict:
    """A leading `~` of every path field of `cls` expanded: one declared so (`checks.setting`), or
    by default one named `*_dir` or `nltk_data`."""
    for f in dataclasses.fields(cls):
        value = values.get(f.name)
        path = f.metadata.get("path", f.name.endswith("_dir") or f.name == "nltk_data")
        if path and isinstance(value, str) and value.startswith("~"):
            values[f.name] = os.path.expanduser(value)
    return values


def load_config(
    preset: str | Path | None, overrides: list[str] = (), task_config_cls=None, registry=None
) -> DictConfig:
    """Merge preset YAML and `key=value` overrides over the defaults and validate everything.

    The task section is checked against the `Config` dataclass of the task that `task.name`
    names, found through `registry` (a `s2s.core.setup.registry.Registry`). Override values are
    typed by their field's declared type (see the module docstring).
    """
    data: dict = {}
    if preset is not None:
        path = preset_path(str(preset), registry)
        raw = _load_yaml(path)
        if not isinstance(raw, DictConfig):
            raise ConfigError(f"preset {path} must be a mapping of sections")
        data = OmegaConf.to_container(raw, resolve=False)
    for item in overrides:
        add_override(data, item)
    _from_import(data)

    schema = OmegaConf.structured(Config)
    top = [k for k in schema.keys()]
    for key, value in data.items():
        if key not in top:
            raise ConfigError(f"unknown config section '{key}'{_nearest(key, top)}")
        if key == "origin":  # s2s import's record of where the weights came from, as written
            continue
        if key not in ("task", "tasks"):
            if not isinstance(value, dict):
                raise ConfigError(f"config section '{key}' must be a mapping, got {plain(value)!r}")
            _check_keys(key, value, schema[key])
            data[key] = expand_paths(typed_section(key, value, SECTIONS[key]), SECTIONS[key])
    members = data.pop("tasks", None)
    task_data = data.pop("task", None)
    if members is not None:
        if task_data:
            raise ConfigError(
                "the config has both 'task' (one task) and 'tasks' (a multi-task run); keep one"
            )
        members, member_classes = _members(members, registry, task_config_cls)
    else:
        if task_data is not None and not isinstance(task_data, dict):
            raise ConfigError(f"config section 'task' must be a mapping, got {plain(task_data)!r}")
        task_cfg, task_cls = _task_section(dict(task_data or {}), "task", registry, task_config_cls)

    merged = _merge(schema, "", data)
    OmegaConf.set_struct(merged, False)
    if members is None:
        merged.task = task_cfg
    else:
        merged.task = {}
        merged.tasks = members
    OmegaConf.set_struct(merged, True)
    # what each section allows, the task's own section included, once everything is merged
    sections = [(name, cls, merged[name]) for name, cls in SECTIONS.items()]
    if members is None:
        sections.append(("task", task_cls, merged.task))
    else:
        for name, cls in member_classes.items():
            sections += [
                (f"tasks.{name}", MemberConfig, merged.tasks[name]),
                (f"tasks.{name}.task", cls, merged.tasks[name].task),
            ]
    checks.check_sections(
        merged, [*sections, ("", Config, merged)]
    )  # relations between sections last
    return merged


def _from_import(data: dict) -> None:
    """A run that starts from an `s2s import` (run.init_from names a run directory, or a
    checkpoint in one, whose config records an `origin`) takes the import's model, decode and
    data settings, and its task's where the task is the same, wherever the preset and the
    command line set none: the shape, vocabulary, lengths and decoding its weights come with
    (docs/pretrained.md). A setting given that contradicts the weights' shape is refused by the
    transfer's check (s2s.core.training.transfer), in one line naming it."""
    source = (data.get("run") or {}).get("init_from")
    if not source or data.get("tasks"):
        return
    path = Path(str(source)).expanduser()
    found = [d for d in (path, path.parent, path.parent.parent) if (d / "config.yaml").is_file()]
    if not found:
        return  # the transfer's check names what is missing
    try:
        saved = OmegaConf.to_container(OmegaConf.load(found[0] / "config.yaml"))
    except Exception:  # noqa: BLE001 -- the transfer's check reads it again and says why
        return
    if not isinstance(saved, dict) or not saved.get("origin") or saved.get("tasks"):
        return
    for section in ("model", "decode", "data"):
        data[section] = {**(saved.get(section) or {}), **(data.get(section) or {})}
    task, theirs = data.get("task") or {}, saved.get("task") or {}
    if str(task.get("name", theirs.get("name"))) == theirs.get("name"):
        data["task"] = {**theirs, **task}


def single_task(cfg: DictConfig, what: str) -> DictConfig:
    """`cfg` itself when it has one task; a multi-task config fails naming its members (for a
    command that needs one task, e.g. `s2s score`)."""
    if cfg.tasks is None:
        return cfg
    members = ", ".join(f"{name} ({m.task.name})" for name, m in cfg.tasks.items())
    raise ConfigError(
        f"{what} is a multi-task config (members {members}); name one member's task or "
        "its single-task preset instead"
    )


def _load_yaml(path: Path, context: str = ""):
    """A YAML preset; a file that cannot be read or parsed is a ConfigError naming it (and the
    line)."""
    try:
        return OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 -- yaml errors carry the line; OSError the reason
        mark = getattr(e, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
        what = (
            getattr(e, "problem", None)
            or getattr(e, "strerror", None)
            or (str(e).splitlines() or [type(e).__name__])[0]
        )
        raise ConfigError(f"{context}cannot read preset {where}: {what}") from None


def _task_section(task_data: dict, where: str, registry, task_config_cls=None) -> DictConfig:
    """The task section `task_data` (with its `name`) checked against its task's Config."""
    name = task_data.pop("name", None)
    if name is None:
        raise ConfigError(f"the config names no task: set '{where}.name' (see `s2s tasks`)")
    if isinstance(name, dict) or not isinstance(name, str):
        raise ConfigError(f"{where}.name={plain(name)!r}: must be a task name (see `s2s tasks`)")
    if task_config_cls is None:
        task_config_cls = registry.get(str(name)).Config
    task_schema = OmegaConf.structured(task_config_cls)
    _check_keys(where, task_data, task_schema)
    task_data = expand_paths(typed_section(where, task_data, task_config_cls), task_config_cls)
    section = _merge(task_schema, f"{where}.", task_data)
    return OmegaConf.merge({"name": plain(name)}, section), task_config_cls


def _members(members, registry, task_config_cls=None) -> dict:
    """The members of a multi-task config, each with its complete, checked task section."""
    if not isinstance(members, dict) or not members:
        raise ConfigError(
            "'tasks' must map member names to members (preset: NAME or task: {name: ...})"
        )
    schema = OmegaConf.structured(MemberConfig)
    out, classes = {}, {}
    for name, member in members.items():
        where = f"tasks.{name}"
        if not _MEMBER_NAME.fullmatch(str(name)):
            raise ConfigError(
                f"{where}: a member name is letters, digits, '_', '.' or '-' (it names files)"
            )
        if not isinstance(member, dict):
            raise ConfigError(
                f"{where} must be a mapping (preset, task, weight, select), got {plain(member)!r}"
            )
        _check_keys(where, member, schema)
        section = {}
        if member.get("preset"):
            ref = str(member["preset"])
            try:
                path = preset_path(ref, registry)
            except ConfigError as e:
                raise ConfigError(f"{where}.preset={ref!r}: {e}") from None
            preset = OmegaConf.to_container(_load_yaml(path, f"{where}.preset={ref!r}: "))
            if not isinstance(preset, dict) or not isinstance(preset.get("task"), dict):
                raise ConfigError(
                    f"{where}.preset={ref!r}: not a single-task preset (it has no task section)"
                )
            section = dict(preset["task"])
        if not isinstance(member.get("task", {}), dict):
            raise ConfigError(f"{where}.task must be a task section (a mapping)")
        section.update(member.get("task") or {})
        task, classes[str(name)] = _task_section(
            section, f"{where}.task", registry, task_config_cls
        )
        rest = typed_section(
            where, {k: v for k, v in member.items() if k not in ("task", "preset")}, MemberConfig
        )
        rest = _merge(schema, f"{where}.", rest)
        # the task section is complete now: the run's config.yaml no longer needs the preset
        out[str(name)] = {
            "preset": "",
            "task": OmegaConf.to_container(task),
            "weight": rest.weight,
            "select": rest.select,
            "stage_weights": list(rest.stage_weights),
        }
    return out, classes
