"""The processes of a run: rank, world size and device, and the few collectives training uses.

Launched by `torchrun`, each process trains on its own share of the batches (NCCL on GPU, gloo
on CPU); one process alone needs no process group, and every collective is then the identity.
`agreed` is what keeps a failure from hanging a run: what fails on one process fails on all.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .errors import TrainingError


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


class Group:
    """This process's place in the run (from torchrun's environment) and its collectives."""

    def __init__(self, device_name: str):
        self.rank = int(os.environ.get("RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.device = resolve_device(device_name, int(os.environ.get("LOCAL_RANK", 0)))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    def agreed(self, fn, rank0_only: bool = False):
        """Run fn on every process (or on rank 0 only) and return rank 0's result on every
        process; if it fails anywhere it fails everywhere, so that no process waits forever in
        a collective for one that has stopped."""
        error = value = None
        if self.rank == 0 or not rank0_only:
            try:
                value = fn()
            except Exception as e:  # noqa: BLE001 -- re-raised below, on every process
                error = e
        if self.world > 1:  # every process's error, and rank 0's result, in one exchange
            shares = self.gather((None if error is None else f"{type(error).__name__}: {error}",
                                  value if self.rank == 0 and error is None else None))
            failed = [(r, m) for r, (m, _) in enumerate(shares) if m is not None]
            if failed and error is None:
                raise TrainingError(f"process {failed[0][0]} failed: {failed[0][1]}")
            value = shares[0][1]
        if error is not None:
            raise error
        return value

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t

    def all(self, flag: torch.Tensor) -> torch.Tensor:
        """True where every process says True."""
        if self.world == 1:
            return flag
        flag = flag.float()
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return flag.bool()

    def gather(self, obj) -> list:
        """Every process's `obj`, in rank order."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.barrier()  # leave together: a gloo process that tears its group down while a
            dist.destroy_process_group()  # peer still decodes the test set can abort at exit
