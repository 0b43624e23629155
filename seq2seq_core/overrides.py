"""Command-line overrides `KEY=VALUE`: the value as the user typed it, typed by the field it sets.

The text is split at the first "=", and the value converted only by the declared type of its
field (`typed_value`): a string is kept exactly (a "#", a newline, "no", "null" or "${...}"
included), a number is Python's int() or float() of it, a bool is true/false/yes/no/1/0 (any
case), an Optional field takes null or none as None, an Enum field one of its values. Path
fields (`checks.is_path`) get a leading `~` expanded.
"""
from __future__ import annotations

import dataclasses
import os
import re
import typing
from enum import Enum
from typing import Any, Union

from .checks import is_path
from .errors import ConfigError
from .settings import Config

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
        raise ConfigError(f"bad override {str(item)!r}: write KEY=VALUE with a dotted key, e.g. model.layers=3")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{key}={value!r}: '{'.'.join(parts[:i + 1])}' is a setting, not a section")
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
    except Exception:  # noqa: BLE001 -- a plugin's annotation that does not resolve: builtins by name
        return {f.name: _BUILTIN_TYPES.get(f.type, Any) if isinstance(f.type, str) else f.type
                for f in dataclasses.fields(cls)}


def typed_section(where: str, values: dict, cls) -> dict:
    """`values` (a section of dataclass `cls`) with each typed-as-given string converted by the
    type its field declares; values from YAML are left to omegaconf."""
    types = _field_types(cls)
    out = {}
    for key, value in values.items():
        dotted, tp = f"{where}.{key}", types.get(key, Any)
        if isinstance(value, dict):
            out[key] = typed_section(dotted, value, tp) if dataclasses.is_dataclass(tp) else plain(value)
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
            raise ConfigError(f"{key}={text!r}: must be one of {', '.join(values)}{orelse}{hint}") from None
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
            return yaml.safe_load(text)
        except yaml.YAMLError:
            raise ConfigError(f"{key}={text!r}: must be a YAML list or mapping") from None
    return _escaped(text)  # str, Any and any other type: the string as typed


def expand_paths(values: dict, cls) -> dict:
    """A leading `~` of every path field of `cls` (`checks.is_path`) expanded."""
    for f in dataclasses.fields(cls):
        value = values.get(f.name)
        if is_path(f) and isinstance(value, str) and value.startswith("~"):
            values[f.name] = os.path.expanduser(value)
    return values
