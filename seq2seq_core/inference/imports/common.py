"""What every importer shares: the job, what a reader hands back, and reading JSON and weights
files with one-line errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ...errors import ImportModelError

WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class ImportJob:
    """One `s2s import`: the source (a folder or a hub name), the run directory to write, the
    languages (None: from the tokenizer's config or the model's name), the hub revision."""

    source: str
    output: str
    src_lang: str | None = None
    tgt_lang: str | None = None
    revision: str | None = None


@dataclass
class Imported:
    """What a reader made of a source: the run's config (a dict), the record of where it came
    from, the two vocabularies, and a function from the new model to its state dict."""

    config: dict
    origin: dict
    src_vocab: object
    tgt_vocab: object
    state: Callable
    weights_file: Path
    config_file: Path


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ImportModelError(f"{path} is missing: not a Hugging Face model folder") from None
    except (OSError, ValueError) as e:
        raise ImportModelError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise ImportModelError(f"{path}: not a JSON object")
    return value


def read_weights(folder: Path) -> tuple[Path, dict]:
    for name in WEIGHTS:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return path, load_file(str(path))
            return path, torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 -- truncated or damaged files raise many kinds
            raise ImportModelError(
                f"{path} is unreadable (truncated or damaged?): {type(e).__name__}: "
                f"{(str(e).splitlines() or [''])[0]}"
            ) from None
    raise ImportModelError(f"{folder} holds no weights ({' or '.join(WEIGHTS)})")
