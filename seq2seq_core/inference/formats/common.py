"""What every importer shares: the job, what a reader hands back, and reading JSON and weights
files with one-line errors."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

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


def layer_weights(model) -> Iterator[tuple[str, str, str]]:
    """(s2s's name, fairseq's name, role) of every linear layer and layer norm of the model's
    stacks, without ".weight" / ".bias"; transformers' MarianMTModel kept fairseq's names. The
    role says what it does to the residual stream: "reads" it (its input columns are d_model),
    "writes" it (its output rows are), or is a "norm" over it."""
    for stack, cross in (("encoder", False), ("decoder", True)):
        for i in range(len(getattr(model, stack))):
            p, q = f"{stack}.{i}", f"{stack}.layers.{i}"
            attentions = [("self_attn", "self_attn", "res1")]
            attentions += [("cross_attn", "encoder_attn", "res2")] if cross else []
            for ours, theirs, residual in attentions:
                for a, b in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj")):
                    yield f"{p}.{ours}.{a}", f"{q}.{theirs}.{b}", "reads"
                yield f"{p}.{ours}.w_o", f"{q}.{theirs}.out_proj", "writes"
                yield f"{p}.{residual}.norm", f"{q}.{theirs}_layer_norm", "norm"
            yield f"{p}.ffn.0", f"{q}.fc1", "reads"
            yield f"{p}.ffn.2", f"{q}.fc2", "writes"
            yield f"{p}.{'res3' if cross else 'res2'}.norm", f"{q}.final_layer_norm", "norm"
