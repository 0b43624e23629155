"""Structured configs: one dataclass per component, merged from a preset YAML and CLI overrides.

A preset names its task (`task.name`); the task section is then checked against that task's own
`Config` dataclass. Any unknown key or wrongly typed value fails at once with the dotted key and
the nearest valid one; values out of the range a field declares (`s2s.core.checks`), non-finite numbers and broken relations
(heads dividing d_model, ...) fail the same way, before any data is read. Each component
receives only its own section.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .checks import PROBABILITY, NOT_EMPTY, Allowed, above, at_least, check_section, setting
from .errors import ConfigError


@dataclass
class ModelConfig:
    """The Transformer of section 3: N layers in each stack, d_model, d_ff, h heads, P_drop."""

    layers: int = setting(6, at_least(1))
    d_model: int = setting(512, at_least(1))
    d_ff: int = setting(2048, at_least(1))
    heads: int = setting(8, at_least(1))
    dropout: float = setting(0.1, PROBABILITY)
    attention_dropout: float = setting(0.0, PROBABILITY)
    pre_norm: bool = False  # the paper is post-norm: LayerNorm(x + Dropout(Sublayer(x)))
    # the pre-softmax projection is the target embedding: None = only with a shared vocabulary
    # (section 3.4 ties all three); a small separate target vocabulary learns a little faster untied
    tie_output: Optional[bool] = None
    max_positions: int = setting(1024, at_least(2))


@dataclass
class OptimConfig:
    """Adam and the warm-up schedule of section 5.3, label smoothing of 5.4.

    lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    """

    lr_scale: float = setting(1.0, above(0))
    warmup: int = setting(4000, at_least(1))
    beta1: float = setting(0.9, PROBABILITY)
    beta2: float = setting(0.98, PROBABILITY)
    eps: float = setting(1e-9, above(0))
    weight_decay: float = setting(0.0, at_least(0))
    clip_norm: float = setting(0.0, at_least(0, "0 = no clipping"))  # 0 = no clipping, as in the paper
    label_smoothing: float = setting(0.1, PROBABILITY)
    max_updates: int = setting(100_000, at_least(1))
    update_freq: int = setting(1, at_least(1))  # gradient accumulation: batches per update


@dataclass
class DataConfig:
    """Token-count batching: a batch holds about max_tokens source and max_tokens target tokens."""

    max_tokens: int = setting(25_000, at_least(1))
    max_len: int = setting(1024, at_least(1))  # pairs with a longer side (in tokens) are dropped from training
    max_len_ratio: float = setting(0.0, Allowed(lambda v: v == 0 or v >= 1, "0 (no ratio filter) or a number >= 1"))  # 0 = no ratio filter; otherwise drop pairs with len ratio above it
    cache_dir: str = setting(".cache/s2s", NOT_EMPTY)  # prepared data, keyed by the task section


class Stop(str, Enum):
    """Beam search's stopping rule (s2s.core.task.DecodeDefaults says what each means)."""

    bound = "bound"
    beam = "beam"

    def __str__(self) -> str:
        return self.value


class SearchPrecision(str, Enum):
    """The model search runs with (s2s.core.precision.for_inference): fp32, bf16, or dynamic
    int8 linear layers (CPU)."""

    fp32 = "fp32"
    bf16 = "bf16"
    int8 = "int8"

    def __str__(self) -> str:
        return self.value


@dataclass
class DecodeConfig:
    """Decoding; None means the task's default."""

    beam: Optional[int] = setting(None, at_least(1))
    alpha: Optional[float] = setting(None, at_least(0))
    max_len_a: Optional[float] = setting(None, at_least(0))
    max_len_b: Optional[int] = setting(None, at_least(0))
    stop: Optional[Stop] = None  # when beam search leaves a sentence: bound (exact) or beam (fairseq's)
    max_sentences: int = setting(128, at_least(1))  # sentences decoded together
    precision: SearchPrecision = SearchPrecision.fp32  # fp32 | bf16 | int8 (CPU): the model searched with


class Precision(str, Enum):
    """Arithmetic of training (s2s.core.precision says what each means): fp32, bf16 with fp32
    master weights, fp16 autocast with dynamic loss scaling, or auto (bf16 where the device has
    it natively, else fp32); any other value fails when the config is loaded."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    auto = "auto"

    def __str__(self) -> str:
        return self.value


@dataclass
class RunConfig:
    """Where and how a run happens, and how often it validates, logs and saves."""

    dir: str = setting("runs/default", NOT_EMPTY)
    seed: int = 1
    device: str = setting("auto", Allowed(lambda v: bool(_DEVICE.fullmatch(str(v))), "auto, cpu, mps, cuda or cuda:N"))  # auto | cpu | cuda | cuda:N
    threads: int = setting(0, at_least(0, "0 = torch's default"))  # torch intra-op threads on CPU; 0 = torch's default
    precision: Precision = Precision.fp32  # fp32 | bf16 | fp16 | auto; fp32 unless you ask
    log_interval: int = setting(100, at_least(1))
    valid_interval: int = setting(1000, at_least(1))  # updates between validations (loss and task metric; the best model is kept)
    valid_max_sentences: int = setting(0, at_least(0, "0 = all"))  # decode at most this many dev sentences for the metric (0 = all)
    save_interval: int = setting(1000, at_least(1))  # updates between checkpoints
    max_minutes: float = setting(0.0, at_least(0, "0 = off"))  # also stop after this many minutes of training, across resumes (0 = off)
    save_minutes: float = setting(0.0, at_least(0, "0 = off"))  # also save when this many minutes passed since the last save (0 = off)
    keep_last: int = setting(5, at_least(1))  # checkpoints kept
    average_last: int = setting(0, at_least(0, "0 = none"))  # at the end, average the last K checkpoints (0 = none); tested unless the best validated model scores higher on dev
    max_nonfinite: int = setting(10, at_least(1))  # stop after this many non-finite updates in a row
    quiet: bool = False


@dataclass
class MultitaskConfig:
    """Several tasks in one model (`tasks`, see s2s.core.members): update u trains one member,
    drawn with probability proportional to weight * (training pairs)^(1/temperature)."""

    temperature: float = setting(1.0, above(0))  # 1: in proportion to size; larger: closer to uniform


@dataclass
class MemberConfig:
    """One member of a multi-task preset: a task section, or a single-task preset whose task
    section it takes (with `task` keys overriding it), a sampling weight and the weight of its
    metric in the selection figure (the weighted mean of the members' primary figures)."""

    preset: str = ""
    task: Any = field(default_factory=dict)
    weight: float = setting(1.0, above(0))
    select: float = setting(1.0, at_least(0))


@dataclass
class Config:
    task: Any = field(default_factory=dict)
    tasks: Any = None  # multi-task: member name -> MemberConfig (then no `task` section)
    multitask: MultitaskConfig = field(default_factory=MultitaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    run: RunConfig = field(default_factory=RunConfig)


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


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
_MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: the engine's sections, each checked against its dataclass's declared ranges
SECTIONS = {"model": ModelConfig, "optim": OptimConfig, "data": DataConfig, "decode": DecodeConfig,
            "run": RunConfig, "multitask": MultitaskConfig}


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
    if m.d_model % m.heads:
        divisors = [h for h in range(1, min(m.d_model, 64) + 1) if m.d_model % h == 0]
        raise ConfigError(f"model.heads={m.heads}: must divide model.d_model={m.d_model} "
                          f"(d_k = d_model / h), e.g. {', '.join(map(str, divisors[-4:]))}")
    if d.max_len > m.max_positions:
        raise ConfigError(f"data.max_len={d.max_len}: must be <= model.max_positions={m.max_positions} "
                          "(a longer training pair would not fit the model's positions)")
    for name, member in (cfg.tasks or {}).items():
        check_section(f"tasks.{name}", MemberConfig, member)
    if r.average_last > r.keep_last:
        raise ConfigError(f"run.average_last={r.average_last}: must be <= run.keep_last={r.keep_last} "
                          "(only the kept checkpoints can be averaged)")


def load_config(preset: str | Path | None, overrides: list[str] = (), task_config_cls=None,
                registry=None) -> DictConfig:
    """Merge preset YAML and `key=value` overrides over the defaults and validate everything.

    The task section is checked against the `Config` dataclass of the task that `task.name`
    names, found through `registry` (a `s2s.core.registry.Registry`).
    """
    raw = OmegaConf.create()
    if preset is not None:
        path = preset_path(str(preset))
        try:
            raw = OmegaConf.load(path)
        except Exception as e:  # yaml errors carry the line
            mark = getattr(e, "problem_mark", None)
            where = f"{path}, line {mark.line + 1}" if mark is not None else str(path)
            what = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"cannot read preset {where}: {what}") from None
        if not isinstance(raw, DictConfig):
            raise ConfigError(f"preset {path} must be a mapping of sections")
    try:
        cli = OmegaConf.from_dotlist(list(overrides))
    except Exception as e:
        raise ConfigError(f"bad override in {list(overrides)}: {str(e).splitlines()[0]}") from None
    for key, value in cli.items():  # a whole section set to a value: `run=[]`, `model=3`
        if not isinstance(value, DictConfig) and isinstance(raw.get(key), DictConfig):
            raise ConfigError(f"{key}={value}: '{key}' is a section; "
                              f"set its keys ({key}.KEY=VALUE)")
    try:
        raw = OmegaConf.merge(raw, cli)
    except (OmegaConfBaseException, TypeError, ValueError) as e:
        raise ConfigError(f"bad override in {list(overrides)}: {(str(e).splitlines() or [''])[0]}") from None
    data = OmegaConf.to_container(raw, resolve=False)

    schema = OmegaConf.structured(Config)
    top = [k for k in schema.keys()]
    for key, value in data.items():
        if key not in top:
            raise ConfigError(f"unknown config section '{key}'{_nearest(key, top)}")
        if key not in ("task", "tasks"):
            if not isinstance(value, dict):
                raise ConfigError(f"config section '{key}' must be a mapping, got {value!r}")
            _check_keys(key, value, schema[key])
    members = data.pop("tasks", None)
    task_data = data.pop("task", None)
    if members is not None:
        if task_data:
            raise ConfigError("the config has both 'task' (one task) and 'tasks' (a multi-task run); keep one")
        members = _members(members, registry, task_config_cls)
    else:
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


def _task_section(task_data: dict, where: str, registry, task_config_cls=None) -> DictConfig:
    """The task section `task_data` (with its `name`) checked against its task's Config."""
    name = task_data.pop("name", None)
    if name is None:
        raise ConfigError(f"the config names no task: set '{where}.name' (see `s2s tasks`)")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name={name!r}: must be a task name (see `s2s tasks`)")
    if task_config_cls is None:
        task_config_cls = registry.get(name).Config
    task_schema = OmegaConf.structured(task_config_cls)
    _check_keys(where, task_data, task_schema)
    section = _merge(task_schema, f"{where}.", task_data)
    check_section(where, task_config_cls, section)  # the ranges the task declares beside its fields
    return OmegaConf.merge({"name": name}, section)


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
            raise ConfigError(f"{where} must be a mapping (preset, task, weight, select), got {member!r}")
        _check_keys(where, member, schema)
        section = {}
        if member.get("preset"):
            preset = OmegaConf.to_container(OmegaConf.load(preset_path(str(member["preset"]))))
            if not isinstance(preset, dict) or not isinstance(preset.get("task"), dict):
                raise ConfigError(f"{where}.preset={member['preset']!r}: not a single-task preset "
                                  "(it has no task section)")
            section = dict(preset["task"])
        if not isinstance(member.get("task", {}), dict):
            raise ConfigError(f"{where}.task must be a task section (a mapping)")
        section.update(member.get("task") or {})
        task = _task_section(section, f"{where}.task", registry, task_config_cls)
        rest = _merge(schema, f"{where}.", {k: v for k, v in member.items() if k not in ("task", "preset")})
        # the task section is complete now: the run's config.yaml no longer needs the preset
        out[str(name)] = {"preset": "", "task": OmegaConf.to_container(task), "weight": rest.weight,
                          "select": rest.select}
    return out


def task_section(section: DictConfig) -> DictConfig:
    """A task section without its `name`, as the task's Config expects it."""
    section = OmegaConf.to_container(section)
    section.pop("name", None)
    return OmegaConf.create(section)
