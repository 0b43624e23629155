"""A run's config: the settings (`s2s.core.settings`) merged from a preset YAML and overrides.

A preset names its task (`task.name`); the task section is then checked against that task's own
`Config` dataclass. Any unknown key or wrongly typed value fails at once with the dotted key and
the nearest valid one; values out of the range a field declares (`s2s.core.checks`), non-finite numbers and broken relations
(heads dividing d_model, ...) fail the same way, before any data is read. Each component
receives only its own section.

Command-line overrides are taken as typed (`s2s.core.overrides`); task keys are typed by the
task's own Config once `task.name` is known. Preset files stay YAML. The settings themselves,
with their defaults and allowed values, are `s2s.core.settings`.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .checks import check_section
from .errors import ConfigError
from .overrides import add_override, expand_paths, plain, typed_section
from .settings import SECTIONS, Config, MemberConfig


def _preset_dir() -> Path:
    """The presets travel inside the package as `s2s.tasks` (the repository's tasks/ folder)."""
    import s2s.tasks

    return Path(s2s.tasks.__file__).resolve().parent


PRESET_DIR = _preset_dir()


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(preset: str) -> Path:
    """A preset name (a file in tasks/) or a path to a YAML file."""
    p = Path(preset)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"preset file {p} does not exist")
        return p
    candidate = PRESET_DIR / f"{preset}.yaml"
    if candidate.is_file():
        return candidate
    known = preset_names()
    near = difflib.get_close_matches(preset, known, n=1)
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
            raise ConfigError(f"unknown config key '{section}.{key}'{_nearest(key, valid, section)}")
        sub = schema[key]
        if isinstance(sub, DictConfig) and isinstance(value, dict) and section != "" and key != "task":
            _check_keys(f"{section}.{key}", value, sub)


def _merge(schema: DictConfig, section: str, data: dict) -> DictConfig:
    try:
        return OmegaConf.merge(schema, data)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        msg = str(getattr(e, "msg", e)).splitlines()[0]
        raise ConfigError(f"bad value for '{section}{key}': {msg}") from None


_MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _finite(prefix: str, node) -> None:
    """No NaN or infinity anywhere, the task's own section included."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{dotted}={value}: must be a finite number")
        _finite(dotted, value)


def validate(cfg: DictConfig) -> None:
    """Every range and relation of the engine's settings; one line naming key, value and rule."""
    try:
        _finite("", OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as e:  # an interpolation that does not resolve
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(f"bad value for '{key}': {str(getattr(e, 'msg', e)).splitlines()[0]}") from None
    for name, cls in SECTIONS.items():
        check_section(name, cls, cfg[name])
    m, d, r = cfg.model, cfg.data, cfg.run
    if m.d_model % 2:
        raise ConfigError(f"model.d_model={m.d_model}: must be an even number (the sinusoidal positions "
                          f"pair a sine and a cosine per frequency), e.g. {m.d_model + 1}")
    if m.d_model % m.heads:
        divisors = [h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0]
        raise ConfigError(f"model.heads={m.heads}: must divide model.d_model={m.d_model} "
                          f"(d_k = d_model / h), e.g. {', '.join(map(str, divisors[-4:]))}")
    if d.max_len > m.max_positions:
        raise ConfigError(f"data.max_len={d.max_len}: must be <= model.max_positions={m.max_positions} "
                          "(a longer training pair would not fit the model's positions)")
    for name, member in (cfg.tasks or {}).items():
        check_section(f"tasks.{name}", MemberConfig, member)
        for key, (lo, hi) in (("weight", WEIGHT_RANGE), ("select", (0, WEIGHT_RANGE[1]))):
            if not lo <= member[key] <= hi:
                raise ConfigError(f"tasks.{name}.{key}={member[key]!r}: must be in [{lo:g}, {hi:g}] (weights "
                                  "are relative: beyond that the sampling probabilities overflow)")
    if cfg.tasks is not None and cfg.multitask.temperature < MIN_TEMPERATURE:
        raise ConfigError(f"multitask.temperature={cfg.multitask.temperature!r}: must be >= {MIN_TEMPERATURE} "
                          "(a member's n^(1/temperature) overflows below that)")
    if r.average_last > r.keep_last:
        raise ConfigError(f"run.average_last={r.average_last}: must be <= run.keep_last={r.keep_last} "
                          "(only the kept checkpoints can be averaged)")
    _check_device(str(r.device))


#: multi-task sampling, p_k ~ weight_k * n_k^(1/T) in float64 (s2s.core.schedule): with n_k up to
#: 10^12 pairs, 1/T * ln(10^12) + ln(weight) stays far below ln(float64 max) ~ 709.8
MIN_TEMPERATURE = 0.05
WEIGHT_RANGE = (1e-6, 1e6)


def _check_device(device: str) -> None:
    """run.device names a device this build of torch has (torch is imported only to ask)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "torch sees no CUDA device"
            raise ConfigError(f"run.device={device!r}: {why}; use run.device=cpu (or auto)")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"run.device={device!r}: there are {torch.cuda.device_count()} CUDA devices "
                              f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
    elif device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            raise ConfigError(f"run.device={device!r}: this machine or torch build has no MPS device; "
                              "use run.device=cpu (or auto)")


def load_config(preset: str | Path | None, overrides: list[str] = (), task_config_cls=None,
                registry=None) -> DictConfig:
    """Merge preset YAML and `key=value` overrides over the defaults and validate everything.

    The task section is checked against the `Config` dataclass of the task that `task.name`
    names, found through `registry` (a `s2s.core.registry.Registry`). Override values are
    typed by their field's declared type (see the module docstring).
    """
    data: dict = {}
    if preset is not None:
        path = preset_path(str(preset))
        raw = _load_yaml(path)
        if not isinstance(raw, DictConfig):
            raise ConfigError(f"preset {path} must be a mapping of sections")
        data = OmegaConf.to_container(raw, resolve=False)
    for item in overrides:
        add_override(data, item)

    schema = OmegaConf.structured(Config)
    top = [k for k in schema.keys()]
    for key, value in data.items():
        if key not in top:
            raise ConfigError(f"unknown config section '{key}'{_nearest(key, top)}")
        if key not in ("task", "tasks"):
            if not isinstance(value, dict):
                raise ConfigError(f"config section '{key}' must be a mapping, got {plain(value)!r}")
            _check_keys(key, value, schema[key])
            data[key] = expand_paths(typed_section(key, value, SECTIONS[key]), SECTIONS[key])
    members = data.pop("tasks", None)
    task_data = data.pop("task", None)
    if members is not None:
        if task_data:
            raise ConfigError("the config has both 'task' (one task) and 'tasks' (a multi-task run); keep one")
        members = _members(members, registry, task_config_cls)
    else:
        if task_data is not None and not isinstance(task_data, dict):
            raise ConfigError(f"config section 'task' must be a mapping, got {plain(task_data)!r}")
        task_cfg = _task_section(dict(task_data or {}), "task", registry, task_config_cls)

    merged = _merge(schema, "", data)
    OmegaConf.set_struct(merged, False)
    if members is None:
        merged.task = task_cfg
    else:
        merged.task = {}
        merged.tasks = members
    OmegaConf.set_struct(merged, True)
    validate(merged)
    return merged


def single_task(cfg: DictConfig, what: str) -> DictConfig:
    """`cfg` itself when it has one task; a multi-task config fails naming its members (for a
    command that needs one task, e.g. `s2s score`)."""
    if cfg.tasks is None:
        return cfg
    members = ", ".join(f"{name} ({m.task.name})" for name, m in cfg.tasks.items())
    raise ConfigError(f"{what} is a multi-task config (members {members}); name one member's task or "
                      "its single-task preset instead")


def _load_yaml(path: Path, context: str = ""):
    """A YAML preset; a file that cannot be read or parsed is a ConfigError naming it (and the line)."""
    try:
        return OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 -- yaml errors carry the line; OSError the reason
        mark = getattr(e, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
        what = getattr(e, "problem", None) or getattr(e, "strerror", None) or \
            (str(e).splitlines() or [type(e).__name__])[0]
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
    check_section(where, task_config_cls, section)  # the ranges the task declares beside its fields
    return OmegaConf.merge({"name": plain(name)}, section)


def _members(members, registry, task_config_cls=None) -> dict:
    """The members of a multi-task config, each with its complete, checked task section."""
    if not isinstance(members, dict) or not members:
        raise ConfigError("'tasks' must map member names to members (preset: NAME or task: {name: ...})")
    schema = OmegaConf.structured(MemberConfig)
    out = {}
    for name, member in members.items():
        where = f"tasks.{name}"
        if not _MEMBER_NAME.fullmatch(str(name)):
            raise ConfigError(f"{where}: a member name is letters, digits, '_', '.' or '-' (it names files)")
        if not isinstance(member, dict):
            raise ConfigError(f"{where} must be a mapping (preset, task, weight, select), got {plain(member)!r}")
        _check_keys(where, member, schema)
        section = {}
        if member.get("preset"):
            ref = str(member["preset"])
            try:
                path = preset_path(ref)
            except ConfigError as e:
                raise ConfigError(f"{where}.preset={ref!r}: {e}") from None
            preset = OmegaConf.to_container(_load_yaml(path, f"{where}.preset={ref!r}: "))
            if not isinstance(preset, dict) or not isinstance(preset.get("task"), dict):
                raise ConfigError(f"{where}.preset={ref!r}: not a single-task preset "
                                  "(it has no task section)")
            section = dict(preset["task"])
        if not isinstance(member.get("task", {}), dict):
            raise ConfigError(f"{where}.task must be a task section (a mapping)")
        section.update(member.get("task") or {})
        task = _task_section(section, f"{where}.task", registry, task_config_cls)
        rest = typed_section(where, {k: v for k, v in member.items() if k not in ("task", "preset")}, MemberConfig)
        rest = _merge(schema, f"{where}.", rest)
        # the task section is complete now: the run's config.yaml no longer needs the preset
        out[str(name)] = {"preset": "", "task": OmegaConf.to_container(task), "weight": rest.weight,
                          "select": rest.select}
    return out
