"""Structured configs: one dataclass per component, merged from a preset YAML and CLI overrides.

A preset names its task (`task.name`); the task section is then checked against that task's own
`Config` dataclass. Any unknown key or wrongly typed value fails at once with the dotted key and
the nearest valid one. Each component receives only its own section.
"""
from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException


@dataclass
class ModelConfig:
    """The Transformer of section 3: N layers in each stack, d_model, d_ff, h heads, P_drop."""

    layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    heads: int = 8
    dropout: float = 0.1
    attention_dropout: float = 0.0
    pre_norm: bool = False  # the paper is post-norm: LayerNorm(x + Dropout(Sublayer(x)))
    max_positions: int = 1024


@dataclass
class OptimConfig:
    """Adam and the warm-up schedule of section 5.3, label smoothing of 5.4.

    lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    """

    lr_scale: float = 1.0
    warmup: int = 4000
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 0.0  # 0 = no clipping, as in the paper
    label_smoothing: float = 0.1
    max_updates: int = 100_000
    update_freq: int = 1  # gradient accumulation: batches per update


@dataclass
class DataConfig:
    """Token-count batching: a batch holds about max_tokens source and max_tokens target tokens."""

    max_tokens: int = 25_000
    max_len: int = 1024  # pairs with a longer side (in tokens) are dropped from training
    max_len_ratio: float = 0.0  # 0 = no ratio filter; otherwise drop pairs with len ratio above it
    cache_dir: str = ".cache/s2s"  # prepared data, keyed by the task section


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

    beam: Optional[int] = None
    alpha: Optional[float] = None
    max_len_a: Optional[float] = None
    max_len_b: Optional[int] = None
    stop: Optional[Stop] = None  # when beam search leaves a sentence: bound (exact) or beam (fairseq's)
    max_sentences: int = 128  # sentences decoded together
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

    dir: str = "runs/default"
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads on CPU; 0 = torch's default
    precision: Precision = Precision.fp32  # fp32 | bf16 | fp16 | auto; fp32 unless you ask
    log_interval: int = 100
    valid_interval: int = 1000  # updates between validations (loss and task metric)
    valid_max_sentences: int = 0  # decode at most this many dev sentences for the metric (0 = all)
    save_interval: int = 1000  # updates between checkpoints
    max_minutes: float = 0.0  # also stop after this many minutes of training, across resumes (0 = off)
    save_minutes: float = 0.0  # also save when this many minutes passed since the last save (0 = off)
    keep_last: int = 5  # checkpoints kept
    average_last: int = 0  # at the end, average the last K checkpoints (0 = none)
    max_nonfinite: int = 10  # stop after this many non-finite updates in a row
    quiet: bool = False


@dataclass
class Config:
    task: Any = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    run: RunConfig = field(default_factory=RunConfig)


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key (and the nearest valid one)."""


def _preset_dir() -> Path:
    """The presets travel inside the package as `s2s.tasks` (the repository's tasks/ folder)."""
    import s2s.tasks

    return Path(s2s.tasks.__file__).resolve().parent


PRESET_DIR = _preset_dir()


def _shared(sub: str = "") -> str:
    """`${shared:multi30k}` in a preset: the real-data folder (S2S_SHARED_DATA overrides it)."""
    from s2s.data_recipes import shared_data_dir

    return str(shared_data_dir() / sub)


if not OmegaConf.has_resolver("shared"):
    with warnings.catch_warnings():  # omegaconf 2.4 renames the call; both register the same
        warnings.simplefilter("ignore", UserWarning)
        OmegaConf.register_new_resolver("shared", _shared)


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
            raise ConfigError(f"cannot read preset {path}: {e}") from None
        if not isinstance(raw, DictConfig):
            raise ConfigError(f"preset {path} must be a mapping of sections")
    try:
        cli = OmegaConf.from_dotlist(list(overrides))
    except Exception as e:
        raise ConfigError(f"bad override in {list(overrides)}: {e}") from None
    raw = OmegaConf.merge(raw, cli)
    data = OmegaConf.to_container(raw, resolve=False)

    schema = OmegaConf.structured(Config)
    top = [k for k in schema.keys()]
    for key, value in data.items():
        if key not in top:
            raise ConfigError(f"unknown config section '{key}'{_nearest(key, top)}")
        if key != "task":
            if not isinstance(value, dict):
                raise ConfigError(f"config section '{key}' must be a mapping, got {value!r}")
            _check_keys(key, value, schema[key])
    task_data = dict(data.pop("task", {}) or {})
    name = task_data.pop("name", None)
    if name is None:
        raise ConfigError("the config names no task: set 'task.name' (see `s2s tasks`)")
    if task_config_cls is None:
        task_config_cls = registry.get(name).Config
    task_schema = OmegaConf.structured(task_config_cls)
    _check_keys("task", task_data, task_schema)
    task_cfg = _merge(task_schema, "task.", task_data)

    merged = _merge(schema, "", data)
    OmegaConf.set_struct(merged, False)
    merged.task = OmegaConf.merge({"name": name}, task_cfg)
    OmegaConf.set_struct(merged, True)
    return merged


def task_section(cfg: DictConfig) -> DictConfig:
    """The task's own section, without `name`, as the task's Config expects it."""
    section = OmegaConf.to_container(cfg.task)
    section.pop("name", None)
    return OmegaConf.create(section)
