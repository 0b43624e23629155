"""The input pipeline on a GPU: the next update's batches built on a worker thread, in pinned
memory, while the device computes (`Prefetch`)."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch


class Prefetch:
    """Batches built ahead on a worker thread, in pinned memory, so that their copy to a GPU is
    asynchronous and the host's gathering of ids overlaps the device's work. Only on CUDA: on
    CPU the worker would take a core from the computation, and each batch is built when used.

    `ahead(member, plan)` starts building the batches whose index arrays `plan()` returns (the
    next update's, as the trainer predicts them); `take(member, batches)` returns the tensors of
    `batches`, those built ahead when they are the same pairs, else built now. A wrong guess (a
    skipped update draws another member) costs only the work done ahead: what a step trains on
    depends on its index arrays alone."""

    def __init__(self, device: torch.device):
        self.pool = (
            ThreadPoolExecutor(1, thread_name_prefix="s2s-batches")
            if device.type == "cuda"
            else None
        )
        self.pending = None  # (member, future of (index arrays, batches))

    def _build(self, member, plan) -> tuple[list, list]:
        indices = plan()
        batches = [member.batch("train", idx) for idx in indices]
        if self.pool is not None:
            batches = [
                {k: v.pin_memory() if torch.is_tensor(v) else v for k, v in b.items()}
                for b in batches
            ]
        return indices, batches

    def ahead(self, member, stream) -> None:
        """Start building this process's batches of the next update of `stream` (a Stream of
        `member`), from a copy of it: the stream itself does not move."""
        if self.pool is not None:
            peek = copy.copy(stream)
            self.pending = (member, self.pool.submit(self._build, member, peek.update_batches))

    def take(self, member, batches: list) -> list[dict]:
        pending, self.pending = self.pending, None
        if pending is not None and pending[0] is member:
            indices, built = pending[1].result()
            if len(indices) == len(batches) and all(
                np.array_equal(a, b) and getattr(a, "epoch", None) == getattr(b, "epoch", None)
                for a, b in zip(indices, batches)
            ):
                return built
        return self._build(member, lambda: batches)[1]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
