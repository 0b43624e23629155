"""A sweep's plan: its variants (a `--grid` of values, or a YAML list of override mappings,
each optionally named) and what each run gets (`Sweep`); no torch, so that the command line
reads them while it parses."""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ... import textio
from ...errors import ConfigError, UsageError

MANIFEST, LOCK = "sweep.json", ".lock"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,=+-]*")
UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
BUDGET_KEYS = {"updates": "optim.max_updates", "minutes": "run.max_minutes"}
#: the other key of each budget, lifted so that only the budget stops training (a common override
#: wins)
LIFTED = {"updates": ("run.max_minutes", "0"), "minutes": ("optim.max_updates", "10000000")}


@dataclass
class Variant:
    name: str
    overrides: list[str]  # KEY=VALUE, as `s2s train` takes them


@dataclass
class Sweep:
    preset: str
    variants: list[Variant]
    budget: dict  # {"updates": N} or {"minutes": M}
    directory: Path
    common: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    seeds: int = 1  # runs of each variant, with run.seed 1..seeds (SWEEP_DIR/NAME/seedS)
    # each trained run's settings as loaded (the preset's content, not its name): `configs`
    resolved: dict = field(default_factory=dict)

    def run_dir(self, variant: Variant) -> Path:
        return Path(self.directory) / variant.name

    def trained(self) -> list[Variant]:
        """The runs the sweep trains: each variant, or with seeds each variant's seed runs
        (named NAME/seedS, `run.seed=S` added)."""
        if self.seeds == 1:
            return list(self.variants)
        return [
            Variant(f"{v.name}/seed{s}", [*v.overrides, f"run.seed={s}"])
            for v in self.variants
            for s in range(1, self.seeds + 1)
        ]

    def seed_runs(self, variant: Variant) -> list[Variant]:
        """The runs of one of the user's variants (itself without seeds)."""
        return [t for t in self.trained() if t.name.partition("/seed")[0] == variant.name]

    def overrides(self, variant: Variant) -> list[str]:
        """What `s2s train` gets for `variant`: common, budget, the variant's own, run.dir."""
        ((kind, value),) = self.budget.items()
        lifted_key, lifted = LIFTED[kind]
        lift = [] if lifted_key in keys(self.common) else [f"{lifted_key}={lifted}"]
        return [
            *self.common,
            *lift,
            f"{BUDGET_KEYS[kind]}={value}",
            *variant.overrides,
            f"run.dir={self.run_dir(variant)}",
        ]

    def manifest(self) -> dict:
        return {
            "preset": self.preset,
            "common": list(self.common),
            "budget": dict(self.budget),
            "seeds": self.seeds,
            "variants": [{"name": v.name, "overrides": list(v.overrides)} for v in self.variants],
            "resolved": self.resolved,
        }


def keys(overrides) -> list[str]:
    return [o.partition("=")[0] for o in overrides]


def _derived_names(variants: list[list[str]]) -> list[str]:
    """Filesystem-safe names from the overrides: `heads-1_dropout-0` (the keys' last parts, or
    the whole keys where those collide), `base` for no overrides; made unique with a suffix."""

    def name(overrides, whole):
        parts = [
            f"{k if whole else k.rpartition('.')[2]}-{v}"
            for k, _, v in (o.partition("=") for o in overrides)
        ]
        text = UNSAFE.sub("_", "_".join(parts)).lstrip("._-")[:80]
        return text or "base"

    names = [name(o, False) for o in variants]
    if len(set(names)) < len(names):
        names = [name(o, True) for o in variants]
    counts, seen = Counter(names), Counter()
    for i, n in enumerate(names):
        seen[n] += 1
        names[i] = f"{n}-{seen[n]}" if counts[n] > 1 else n
    return names


def grid(options: list[str]) -> list[Variant]:
    """The cartesian product of `--grid KEY=V1,V2,...` options (the first key varies slowest)."""
    axes = []
    for option in options:
        key, sep, text = option.partition("=")
        values = text.split(",")
        if not sep or not key or not all(values):
            raise UsageError(
                f"--grid {option}: write KEY=V1,V2,... (e.g. --grid model.heads=1,2,4)"
            )
        if key in (k for k, _ in axes):
            raise UsageError(
                f"--grid {option}: {key} is varied twice; give its values in one --grid"
            )
        if len(set(values)) < len(values):
            raise UsageError(f"--grid {option}: a value is given twice")
        axes.append((key, values))
    combos = [
        [f"{k}={v}" for (k, _), v in zip(axes, combo)]
        for combo in itertools.product(*(v for _, v in axes))
    ]
    return [Variant(n, o) for n, o in zip(_derived_names(combos), combos)]


def spelled(value) -> str:
    """A YAML value as the command line would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return json.dumps(value) if isinstance(value, list) else str(value)


def _flat(mapping: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={spelled(value)}")
    return out


def read_variants(path: str | Path) -> list[Variant]:
    """A YAML list of override mappings (`- {name: heads1, model.heads: 1}`; nested sections work
    too)."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--variants {path}: no such file")
    try:
        items = yaml.safe_load("\n".join(textio.read_lines(path)))  # invalid UTF-8: file, line
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(
            f"{path}{f', line {mark.line + 1}' if mark else ''}: not YAML "
            f"({getattr(e, 'problem', None) or 'cannot parse'})"
        ) from None
    if not isinstance(items, list) or not items:
        raise ConfigError(
            f"{path}: must be a YAML list of variants (mappings of KEY: VALUE, each with an "
            "optional name)"
        )
    given, overrides = [], []
    for i, item in enumerate(items, 1):
        item = {} if item is None else item  # `- ` alone: the preset as it is
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: variant {i} must be a mapping of KEY: VALUE, got {item!r}")
        item = dict(item)
        name = item.pop("name", None)
        if name is not None and not NAME.fullmatch(str(name)):
            raise ConfigError(
                f"{path}: variant {i} name {name!r}: letters, digits and _ . , = + - only (it "
                "names a folder)"
            )
        given.append(None if name is None else str(name))
        overrides.append(_flat(item))
    derived = _derived_names(overrides)
    names = [g or d for g, d in zip(given, derived)]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"{path}: two variants are named {n!r}; name them apart (name: ...)")
    return [Variant(n, o) for n, o in zip(names, overrides)]


def grid_item(text: str) -> str:
    """A --grid value: KEY=V1,V2 (argparse names the flag when this refuses one)."""
    key, eq, values = text.partition("=")
    if not (key and eq and values):
        raise argparse.ArgumentTypeError(
            f"takes KEY=V1,V2 (e.g. --grid model.heads=1,2), got {text!r}"
        )
    return text
