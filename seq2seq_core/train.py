"""Training: the loop of section 5, with validation, checkpoints and exact resume.

One update = `optim.update_freq` token-count batches per process; the loss is summed over
tokens and divided by the number of target tokens in the whole update (all batches, all
processes), so 2 processes with batch B, 1 process with batch 2B and 1 process with batch B
and update_freq 2 take the same step. Launched by `torchrun`, each process trains on its own
share of the batches (DistributedDataParallel, NCCL on GPU, gloo on CPU); only rank 0 writes.

Running the same command on the same run directory resumes from the newest readable
checkpoint: model, optimiser, update count, data position and RNG states, so the resumed run
follows the same path as one never stopped.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from . import checkpoint
from .config import task_section
from .data import Prepared, epoch_batches, prepare
from .evaluate import decode_settings, translate, valid_loss
from .model import Transformer
from .optim import adam, label_smoothed_loss, lrate
from .task import Task
from .vocab import atomic_write_text

log = logging.getLogger("s2s")


class TrainingError(RuntimeError):
    pass


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


def autocast_for(device: torch.device, precision: str):
    """A context factory for the run's precision: fp32, or bf16 / fp16 autocast."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def build_task(cfg, registry) -> Task:
    return registry.get(cfg.task.name)(task_section(cfg))


def build_model(cfg, task: Task) -> Transformer:
    return Transformer(cfg.model, task.src_vocab_size, task.tgt_vocab_size, task.shared_vocab)


def check_run_dir(run_dir: Path, need_bytes: int) -> None:
    """Fail before training when the run directory is unwritable or the disk too full."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_probe{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise TrainingError(f"run directory {run_dir} is not writable: {e}") from None
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise TrainingError(f"run directory {run_dir}: {free / 2**20:.0f} MiB free, checkpoints "
                            f"need about {need_bytes / 2**20:.0f} MiB (run.keep_last + 1 files)")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state()[1].tolist(),
             "numpy_pos": int(np.random.get_state()[2]), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Trainer:
    """Holds what one training run needs; `run()` trains until optim.max_updates."""

    def __init__(self, cfg, registry, quiet: bool = False):
        self.cfg = cfg
        self.quiet = quiet or cfg.run.quiet
        self.rank = int(os.environ.get("RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.device = resolve_device(cfg.run.device, int(os.environ.get("LOCAL_RANK", 0)))
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.run_dir = Path(cfg.run.dir)
        self.autocast = autocast_for(self.device, cfg.run.precision)

        self.task = build_task(cfg, registry)
        if self.rank == 0:  # one process prepares, the others read the cache
            self.data: Prepared = prepare(self.task, cfg.data, quiet=self.quiet)
        self._barrier()
        if self.rank != 0:
            self.data = prepare(self.task, cfg.data, quiet=True)
        for needed in ("train", "valid"):
            if needed not in self.data.splits:
                raise TrainingError(f"task {self.task.name!r} has no {needed!r} split")

        torch.manual_seed(cfg.run.seed)
        self.model = build_model(cfg, self.task).to(self.device)
        n_params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        if self.rank == 0:
            check_run_dir(self.run_dir, need_bytes=n_params * 12 * (cfg.run.keep_last + 1))
            atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg))
            self.task.save_vocab(self.run_dir)
        self.ddp = (torch.nn.parallel.DistributedDataParallel(self.model) if self.world > 1 else self.model)
        self.optimizer = adam(self.model.parameters(), cfg.optim)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.run.precision == "fp16")
        self.update, self.epoch, self.batch_pos, self.nonfinite_in_row = 0, 0, 0, 0
        self.skipped_updates = 0
        self.n_params = n_params
        self._resume()

    # -- helpers ------------------------------------------------------------------------------
    def _barrier(self):
        if self.world > 1:
            dist.barrier()

    def _log(self, record: dict) -> None:
        if self.rank != 0:
            return
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if not self.quiet or record.get("kind") != "train":
            shown = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())
            log.info(shown)

    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "update": self.update, "epoch": self.epoch,
                "batch_pos": self.batch_pos, "skipped_updates": self.skipped_updates,
                "rng": self._gather_rng(), "config": OmegaConf.to_container(self.cfg),
                "vocab_dir": str(self.data.directory), "task": self.task.name}

    def _gather_rng(self) -> list:
        """Every rank's RNG states, so that each resumes its own dropout stream."""
        mine = rng_state()
        if self.world == 1:
            return [mine]
        states = [None] * self.world
        dist.all_gather_object(states, mine)
        return states

    def _resume(self) -> None:
        state, path = checkpoint.load_latest(self.run_dir)
        if state is None:
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.update, self.epoch, self.batch_pos = state["update"], state["epoch"], state["batch_pos"]
        self.skipped_updates = state["skipped_updates"]
        rngs = state["rng"]
        if len(rngs) != self.world:
            log.warning("checkpoint %s was written by %d processes, now %d: RNG streams restart",
                        path, len(rngs), self.world)
        else:
            set_rng_state(rngs[self.rank])
        if self.rank == 0:
            log.info("resumed from %s at update %d", path, self.update)

    def _save(self) -> None:
        state = self._state()  # every rank joins the RNG gather
        if self.rank == 0:
            checkpoint.save(state, self.run_dir, self.update, self.cfg.run.keep_last)

    def _batches(self):
        """The data stream from the current position: (epoch, position, batch index array)."""
        train = self.data.splits["train"]
        while True:
            batches = epoch_batches(train, self.cfg.data.max_tokens, self.cfg.run.seed, self.epoch,
                                    self.rank, self.world)
            while self.batch_pos < len(batches):
                self.batch_pos += 1
                yield batches[self.batch_pos - 1]
            self.epoch, self.batch_pos = self.epoch + 1, 0

    # -- the loop -----------------------------------------------------------------------------
    def train_step(self, batches: list) -> dict:
        """One update over `batches` (update_freq of them); returns summed loss figures."""
        cfg = self.cfg
        train = self.data.splits["train"]
        data = [train.batch(idx) for idx in batches]
        ntokens = torch.tensor(float(sum(b["ntokens"] for b in data)), device=self.device)
        if self.world > 1:
            dist.all_reduce(ntokens)
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, b in enumerate(data):
            sync = i == len(data) - 1
            ctx = self.ddp.no_sync() if (self.world > 1 and not sync) else contextlib.nullcontext()
            with ctx:
                with self.autocast():
                    logits = self.ddp(b["src"].to(self.device, non_blocking=True),
                                      b["tgt_in"].to(self.device, non_blocking=True))
                loss, nll = label_smoothed_loss(logits, b["tgt_out"].to(self.device), cfg.optim.label_smoothing)
                # world * loss / total tokens: DDP averages gradients over processes
                self.scaler.scale(loss * self.world / ntokens).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        lr = lrate(self.update + 1, cfg.model.d_model, cfg.optim.warmup, cfg.optim.lr_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.unscale_(self.optimizer)
        if cfg.optim.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_norm)
        finite = torch.isfinite(loss_sum) & all_finite_grads(self.model)
        if self.world > 1:
            finite = finite.float()
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
            finite = finite.bool()
        return {"loss_sum": loss_sum, "nll_sum": nll_sum, "ntokens": ntokens, "lr": lr, "finite": finite,
                "local_tokens": sum(b["ntokens"] for b in data)}

    def validate(self) -> dict:
        cfg = self.cfg
        record = {"kind": "valid", "update": self.update}
        record.update(valid_loss(self.model, self.data.splits["valid"], cfg.data.max_tokens,
                                 cfg.optim.label_smoothing, self.device, self.autocast))
        sources, refs = self.data.texts("valid")
        if cfg.run.valid_max_sentences:
            sources, refs = sources[:cfg.run.valid_max_sentences], refs[:cfg.run.valid_max_sentences]
        hyps = translate(self.model, self.task, sources, decode_settings(self.task, cfg.decode),
                         self.device, cfg.decode.max_sentences)
        score = self.task.score(hyps, refs, sources)
        record[score.name] = score.value
        return record

    def run(self) -> dict:
        cfg = self.cfg
        from tqdm import tqdm

        self.model.train()
        stream = self._batches()
        t_log, tokens_since = time.time(), 0
        bar = tqdm(total=cfg.optim.max_updates, initial=self.update, desc="train", unit=" upd",
                   disable=self.quiet or self.rank != 0, dynamic_ncols=True)
        while self.update < cfg.optim.max_updates:
            out = self.train_step([next(stream) for _ in range(cfg.optim.update_freq)])
            if bool(out["finite"]):
                self.scaler.step(self.optimizer)
                self.nonfinite_in_row = 0
            else:
                self.skipped_updates += 1
                self.nonfinite_in_row += 1
                log.warning("update %d: non-finite loss or gradient, update skipped (%d in a row)",
                            self.update + 1, self.nonfinite_in_row)
                if self.nonfinite_in_row >= cfg.run.max_nonfinite:
                    raise TrainingError(f"{self.nonfinite_in_row} non-finite updates in a row at update "
                                        f"{self.update + 1}: stopping; the last good checkpoint is kept "
                                        f"in {checkpoint.checkpoint_dir(self.run_dir)}")
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            self.update += 1
            tokens_since += out["local_tokens"]
            bar.update(1)
            if self.update % cfg.run.log_interval == 0:  # the only point where figures leave the device
                ntok, now = float(out["ntokens"]), time.time()
                self._log({"kind": "train", "update": self.update, "loss": out["loss_sum"].item() / ntok,
                           "nll": out["nll_sum"].item() / ntok, "lr": out["lr"],
                           "tgt_tokens_per_s": round(tokens_since * self.world / (now - t_log), 1),
                           "skipped": self.skipped_updates})
                t_log, tokens_since = now, 0
            if self.update % cfg.run.valid_interval == 0 or self.update == cfg.optim.max_updates:
                self._log(self.validate())
            if self.update % cfg.run.save_interval == 0 or self.update == cfg.optim.max_updates:
                self._save()
        bar.close()
        return self.finish()

    def finish(self) -> dict:
        """Average the last checkpoints if configured, then evaluate on the test split."""
        cfg = self.cfg
        result = {"update": self.update}
        if self.rank != 0:
            return result
        paths = checkpoint.listed(self.run_dir)
        if cfg.run.average_last > 1 and len(paths) > 1:
            avg = checkpoint.average(paths[-cfg.run.average_last:])
            checkpoint.atomic_save(avg, self.run_dir / "checkpoint_average.pt")
            self.model.load_state_dict(avg["model"])
            result["averaged"] = len(avg["averaged"])
        if "test" in self.data.splits:
            sources, refs = self.data.texts("test")
            hyps = translate(self.model, self.task, sources, decode_settings(self.task, cfg.decode),
                             self.device, cfg.decode.max_sentences)
            atomic_write_text(self.run_dir / "test.hyp.txt", "".join(h + "\n" for h in hyps))
            score = self.task.score(hyps, refs, sources)
            result["test"] = score.as_dict()
            self._log({"kind": "test", "update": self.update, score.name: score.value})
        atomic_write_text(self.run_dir / "result.json", json.dumps(result, indent=1))
        return result


def all_finite_grads(model) -> torch.Tensor:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.tensor(True)
    return torch.stack([torch.isfinite(g).all() for g in grads]).all()


def train(cfg, registry, quiet: bool = False) -> dict:
    trainer = Trainer(cfg, registry, quiet)
    try:
        return trainer.run()
    finally:
        if trainer.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
