"""safetensors: a run as `model.safetensors` (the weights, each tied tensor once, no pickle),
`config.json` (the model section, vocabulary sizes, sharing, the task) and the task's vocabulary
files (`s2s export --to safetensors`); `load_safetensors` builds the engine's Transformer from
them again."""

from __future__ import annotations

import json
from pathlib import Path

from ...tokenizers import SPECIALS
from ...nn.model import Transformer
from ...setup.settings import ModelConfig


def save_safetensors(model: Transformer, cfg, task, out: Path) -> None:
    """model.safetensors + config.json + the task's vocabulary files."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_model

    save_model(model, str(out / "model.safetensors"))  # a tied tensor is stored once
    meta = {
        "format": "s2s",
        "model": OmegaConf.to_container(cfg.model),
        "task": OmegaConf.to_container(cfg.task),
        "src_vocab_size": task.src_vocab_size,
        "tgt_vocab_size": task.tgt_vocab_size,
        "shared_vocab": bool(task.shared_vocab),
        "special_ids": dict(zip(SPECIALS, range(len(SPECIALS)))),
    }
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    task.save_vocab(out)


def load_safetensors(directory) -> Transformer:
    """The engine's Transformer from a safetensors export (model.safetensors + config.json)."""
    from safetensors.torch import load_model

    d = Path(directory)
    meta = json.loads((d / "config.json").read_text(encoding="utf-8"))
    model = Transformer(
        ModelConfig(**meta["model"]),
        meta["src_vocab_size"],
        meta["tgt_vocab_size"],
        meta["shared_vocab"],
    )
    load_model(model, str(d / "model.safetensors"))
    return model.eval()
