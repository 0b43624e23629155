"""The processes of a run: rank, world size and device, and the few collectives training uses.

Launched by `torchrun`, each process trains on its own share of the batches (NCCL on GPU, gloo
on CPU); one process alone needs no process group, and every collective is then the identity.
`agreed` is what keeps a failure from hanging a run: what fails on one process fails on all.

Two timeouts (run settings): the collectives of training fail after run.timeout_minutes (NCCL's
watchdog would otherwise stop a run whose peer hangs only after its own default), while what the
others wait for rank 0 to do alone -- first data preparation, the test decode, averaging
checkpoints -- waits up to run.wait_minutes, over a second, gloo group (`waits`): those phases
take hours on a big corpus, and a waiting process must not be killed meanwhile.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import ConfigError, TrainingError


#: why torchrun's restarts need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (torch 2.5 to 2.13 at least)
SHARED_STORE = (
    "torchrun shares its rendezvous store with the processes it starts, and a restarted group "
    "can read the failed group's addresses there (pytorch/pytorch#135712): launch torchrun "
    "with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in its environment for --max-restarts"
)


def env_int(name: str, default: int = 0) -> int:
    """The whole number in environment variable `name` (torchrun's RANK, WORLD_SIZE,
    GROUP_RANK, ...), or `default` when it is unset or empty; a ConfigError naming the variable
    and its value for anything else (a launcher's typo was an internal ValueError)."""
    text = os.environ.get(name, "")
    if not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"environment variable {name}={text[:40]!r}: must be a whole number"
        ) from None


def _warn_of_a_shared_store(rank: int) -> None:
    """Rank 0 warns at the start of a run whose restarts would fail to connect (`SHARED_STORE`):
    torchrun --max-restarts > 0 with the store shared."""
    restarts = env_int("TORCHELASTIC_MAX_RESTARTS")
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if rank == 0 and restarts and shared:
        logging.getLogger("s2s").warning("--max-restarts %d: %s", restarts, SHARED_STORE)


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The device `run.device` names for this process. Under torchrun (LOCAL_RANK set, or
    `local_rank` given) `cuda` and `auto` mean cuda:LOCAL_RANK, one GPU per process; cuda:N
    with several processes on the node would put them all on one GPU, and is refused."""
    if local_rank is None:
        local_rank = env_int("LOCAL_RANK")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    elif name.startswith("cuda:") and env_int("LOCAL_WORLD_SIZE", 1) > 1:
        raise ConfigError(
            f"run.device={name}: under torchrun each of the node's "
            f"{os.environ['LOCAL_WORLD_SIZE']} processes takes its own GPU, cuda:LOCAL_RANK; set "
            "run.device=cuda (or auto), and CUDA_VISIBLE_DEVICES to choose the GPUs"
        )
    device = torch.device(name)
    if device.type == "cuda" and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"run.device={name}: this process (LOCAL_RANK={local_rank}) sees "
            f"{torch.cuda.device_count()} CUDA device(s); start at most that many processes a node"
        )
    return device


class Group:
    """This process's place in the run (from torchrun's environment) and its collectives:
    `timeout_minutes` for those of training, `wait_minutes` for waiting on rank 0 alone."""

    def __init__(
        self, device_name: str, timeout_minutes: float = 10.0, wait_minutes: float = 720.0
    ):
        self.rank = env_int("RANK")
        self.world = env_int("WORLD_SIZE", 1)
        self.local_rank = env_int("LOCAL_RANK")
        self.device = resolve_device(device_name, self.local_rank)
        self.waits = None  # the gloo group that waits run.wait_minutes
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1:
            _warn_of_a_shared_store(self.rank)
            try:
                if not dist.is_initialized():
                    dist.init_process_group(
                        "nccl" if self.device.type == "cuda" else "gloo",
                        timeout=timedelta(minutes=timeout_minutes),
                    )
                self.waits = dist.new_group(backend="gloo", timeout=timedelta(minutes=wait_minutes))
            except RuntimeError as e:  # torch.distributed's errors (DistError) included
                if not env_int("TORCHELASTIC_RESTART_COUNT"):
                    raise
                reason = str(e).splitlines()[0]
                raise TrainingError(
                    f"torchrun restarted the processes, which could not connect ({reason}); "
                    f"{SHARED_STORE}"
                ) from None

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
        if (
            self.world > 1
        ):  # every process's error, and rank 0's result, in one exchange (run.wait_minutes)
            shares = self.gather(
                (
                    None if error is None else f"{type(error).__name__}: {error}",
                    value if self.rank == 0 and error is None else None,
                ),
                self.waits,
            )
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

    def gather(self, obj, group=None) -> list:
        """Every process's `obj`, in rank order."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=group)
        return out

    def rank0_says(self, flag: bool) -> bool:
        """Rank 0's flag on every process (its clock decides when to save or stop), exchanged
        on the host over the gloo group: no wait for the device, as a flag on a GPU would cost."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)])
        dist.broadcast(t, src=0, group=self.waits)
        return bool(t.item())

    def broadcast(self, tensors) -> None:
        """Rank 0's values of `tensors` (on this process's device) into every process's."""
        if self.world > 1:
            for t in tensors:
                dist.broadcast(t, src=0)

    def close(self) -> None:
        if self.world > 1 and dist.is_initialized():
            dist.barrier(group=self.waits)  # leave together, however long rank 0 tests: a gloo
            dist.destroy_process_group()  # process that tears its group down while a peer
            # still decodes the test set can abort at exit
