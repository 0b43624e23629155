"""The random number streams of a run: seeded at the start, and kept as they were around work
that draws from them besides training (validation, `rng_preserved`). Training's dropout does not
depend on them: each batch reseeds from its update and slot (`s2s.core.training.schedule`)."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CPU and every CUDA device


def seed_dropout(seed: int, device: torch.device) -> None:
    """Seed the generator that `device`'s dropout draws from (a batch's, `schedule.dropout_seed`):
    only that one; torch.manual_seed would seed every backend's generator at every batch."""
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)  # the current device's generator
    else:
        torch.default_generator.manual_seed(seed)


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state()[1].tolist(),
        "numpy_pos": int(np.random.get_state()[2]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(
        ("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0)
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def rng_preserved():
    """Leave the RNG states as they were: what runs inside cannot shift the training streams."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
