"""Checkpoints in a run directory: atomic writes, the last K kept, fall-back, averaging.

A checkpoint is one file `checkpoints/checkpoint_{update:08d}.pt` holding the model, optimiser,
update count, data position, RNG states and config. It is read with torch.load(weights_only=True),
so loading one never executes pickled code. Averaging follows section 6.1: the element-wise mean
of the parameters of the last 5 (base) or 20 (big) checkpoints.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

log = logging.getLogger("s2s")
PATTERN = re.compile(r"checkpoint_(\d{8})\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def listed(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    d = checkpoint_dir(run_dir)
    return sorted(p for p in d.glob("checkpoint_*.pt") if PATTERN.search(p.name)) if d.is_dir() else []


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temporary name, fsync, rename: a crash leaves the old file or the new."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save(state: dict, run_dir: Path, update: int, keep_last: int) -> Path:
    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"checkpoint_{update:08d}.pt"
    atomic_save(state, path)
    for old in listed(run_dir)[:-keep_last] if keep_last > 0 else []:
        old.unlink()
    return path


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def load_latest(run_dir: Path) -> tuple[dict, Path] | tuple[None, None]:
    """The newest checkpoint that reads back; a damaged one is reported by name and passed over."""
    for path in reversed(listed(run_dir)):
        try:
            return load(path), path
        except Exception as e:  # truncated or corrupted file
            log.warning("checkpoint %s is unreadable (%s); falling back to the previous one", path, e)
    return None, None


def average(paths: list[Path]) -> dict:
    """Element-wise mean of the model parameters of `paths` (the first one's other entries kept)."""
    if not paths:
        raise ValueError("no checkpoints to average")
    first = load(paths[0])
    total = {k: v.double().clone() if v.is_floating_point() else v for k, v in first["model"].items()}
    for path in paths[1:]:
        model = load(path)["model"]
        if model.keys() != total.keys():
            raise ValueError(f"{path} holds other parameters than {paths[0]}")
        for k, v in model.items():
            if v.is_floating_point():
                total[k] += v.double()
    n = len(paths)
    first["model"] = {k: (v / n).to(first["model"][k].dtype) if v.is_floating_point() else v
                      for k, v in total.items()}
    first["averaged"] = [str(p) for p in paths]
    first.pop("optimizer", None)
    return first
