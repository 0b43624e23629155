"""Settings that declare the values they allow, beside their defaults.

A config dataclass (the engine's sections and every task's `Config`) writes

    layers: int = setting(6, at_least(1))
    scheme: str = setting("vinyals", one_of(*SCHEMES))

and `check_section` tests every such field when the config loads, before any data is read,
failing with one line that names the dotted key, the value and what is allowed. None (a
setting left to a default elsewhere, e.g. the task's decoding) always passes.

A field may also be a path (`setting("", path=True)`; by default a field whose name ends in
`_dir`, or is `nltk_data`): a leading `~` is expanded when the config loads. A config dataclass
may check relations between its own fields in a static method `check_relations(section, where)`
that raises `ConfigError` (e.g. translation's vocab_size against its tokenizer's smallest size).
`check_sections` runs all of it over a loaded config, after it has been merged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..errors import ConfigError


class Allowed(NamedTuple):
    """A test of a value and, in words, what passes it; `hint`, given a failing value, may add
    a suggestion to the message (e.g. the lower-case form of a language code)."""

    test: Callable[[Any], bool]
    text: str
    hint: Callable[[Any], str] | None = None


def setting(default: Any, allowed: Allowed | None = None, path: bool | None = None):
    """A dataclass field with its default and the values it allows; `path`: a file or folder
    whose leading `~` is expanded (None: by its name, `*_dir` or `nltk_data`)."""
    metadata = {"allowed": allowed} if allowed else {}
    if path is not None:
        metadata["path"] = path
    return dataclasses.field(default=default, metadata=metadata)


def setting_list(allowed: Allowed):
    """A list field, empty by default, with the values it allows."""
    return dataclasses.field(default_factory=list, metadata={"allowed": allowed})


def in_range(lo, hi, what: str = "a number") -> Allowed:
    return Allowed(lambda v: lo <= v <= hi, f"{what} in [{lo}, {hi}]")


def at_least(lo, note: str = "") -> Allowed:
    return Allowed(lambda v: v >= lo, f"a number >= {lo}{f' ({note})' if note else ''}")


def above(lo) -> Allowed:
    return Allowed(lambda v: v > lo, f"a number > {lo}")


PROBABILITY = Allowed(lambda v: 0 <= v < 1, "a probability in [0, 1)")

#: the largest seed anything takes (run.seed, a sampling seed, a resampling seed): numpy's and
#: torch's generators take every seed up to it, and a batch's seed made from it still fits
SEED_MAX = 2**32 - 1


def shown(value, width: int = 40) -> str:
    """`value` as an error message shows it: its repr, cut to `width` characters with "..."."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def whole_number_problem(value, lo: int, hi: int) -> str | None:
    """What keeps `value` from being a whole number in [lo, hi] (a bool is none), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be a whole number in [{lo}, {hi}]"
    return None if lo <= value <= hi else f"must be a whole number in [{lo}, {hi}]"


def number_problem(value, lo: float, hi: float, low_open: bool = False) -> str | None:
    """What keeps `value` from being a finite number in [lo, hi] ((lo, hi] with `low_open`), or
    None: inf, nan and values beyond the bounds are refused alike."""
    interval = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number in {interval}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number in {interval}"
    ok = (lo < value if low_open else lo <= value) and value <= hi  # an int of any size compares
    return None if ok else f"must be a finite number in {interval}"


NOT_EMPTY = Allowed(lambda v: bool(str(v).strip()), "not empty")


def one_of(*values) -> Allowed:
    return Allowed(lambda v: v in values, f"one of {', '.join(map(str, values))}")


def declared(cls, prefix: str = "") -> Iterator[tuple[str, Allowed]]:
    """(dotted key, what it allows) of every field of dataclass `cls` that declares it."""
    for f in dataclasses.fields(cls):
        if "allowed" in f.metadata:
            yield f"{prefix}{f.name}", f.metadata["allowed"]


def check_section(where: str, cls, section) -> None:
    """Every declared range of `cls` on the config `section` (its key prefix `where`)."""
    for f in dataclasses.fields(cls):
        allowed = f.metadata.get("allowed")
        value = section.get(f.name) if hasattr(section, "get") else getattr(section, f.name, None)
        if allowed is None or value is None:
            continue
        try:
            ok = allowed.test(value)
        except TypeError:
            ok = False
        if not ok:
            try:
                hint = allowed.hint(value) if allowed.hint else ""
            except (TypeError, ValueError, AttributeError):
                hint = ""
            raise ConfigError(f"{where}.{f.name}={value!r}: must be {allowed.text}{hint}")
    relations = getattr(cls, "check_relations", None)
    if callable(relations):
        relations(section, where)


def check_sections(cfg, sections: Iterable[tuple[str, type, Any]]) -> None:
    """No NaN or infinity anywhere in `cfg`, then every (key prefix, dataclass, section) of
    `sections`: its declared ranges and its relations (`check_section`)."""
    try:
        _finite("", OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as e:  # an interpolation that does not resolve
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(
            f"bad value for '{key}': {str(getattr(e, 'msg', e)).splitlines()[0]}"
        ) from None
    for where, cls, section in sections:
        check_section(where, cls, section)


def _finite(prefix: str, node) -> None:
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, value in items:
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{dotted}={value}: must be a finite number")
        _finite(dotted, value)
