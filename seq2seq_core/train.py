"""Training: the loop of section 5, with validation, checkpoints and exact resume.

One update = `optim.update_freq` token-count batches per process; the loss is summed over
tokens and divided by the number of target tokens in the whole update (all batches, all
processes), so 2 processes with batch B, 1 process with batch 2B and 1 process with batch B
and update_freq 2 take the same step. Launched by `torchrun`, each process trains on its own
share of the batches (DistributedDataParallel, NCCL on GPU, gloo on CPU); validation is shared
out and gathered so that every process gets the same figures; only rank 0 writes files, and a
failure on one process stops them all instead of leaving the others waiting.

Running the same command on the same run directory resumes from the newest readable
checkpoint: model, optimiser, loss scale, update count, data position and every process's RNG
states. Validation runs with the RNG states saved and restored around it, so a resumed run
follows the same path as one never stopped, bit for bit on CPU.

Figures go to RUN_DIR/metrics.jsonl (one JSON object per line: kind train | valid | test |
stopped, update, elapsed training seconds, ...) and, when tensorboard is installed, to
RUN_DIR/tensorboard; `s2s plot RUN_DIR` draws them.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from . import checkpoint, precision
from .config import ConfigError, task_section
from .data import epoch_batches, prepare, token_batches
from .evaluate import decode_settings, translate
from .model import Transformer
from .optim import adam, lrate
from .task import Task
from .vocab import atomic_write_text

log = logging.getLogger("s2s")
clock = time.monotonic  # what run.save_minutes is measured with (tests substitute their own)


class TrainingError(RuntimeError):
    pass


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        name = f"cuda:{local_rank}"
    return torch.device(name)


def build_task(cfg, registry) -> Task:
    """The task of cfg.task.name; a ValueError of its constructor is about its config section."""
    task_cls = registry.get(cfg.task.name)
    try:
        return task_cls(task_section(cfg))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def build_model(cfg, task: Task) -> Transformer:
    return Transformer(cfg.model, task.src_vocab_size, task.tgt_vocab_size, task.shared_vocab)


def check_fits(data, max_positions: int) -> None:
    """Fail before training when a dev or test pair cannot fit the model's positions (training
    pairs are filtered by data.max_len <= model.max_positions), naming the split and line."""
    for name, split in data.splits.items():
        if name == "train":
            continue
        too_long = np.flatnonzero(np.maximum(split.src_lens, split.tgt_lens) > max_positions)
        if len(too_long):
            i = int(too_long[0])
            raise TrainingError(
                f"{name} split, line {i + 1} of {data.directory / f'{name}.src.txt'}: "
                f"{int(split.src_lens[i])} source / {int(split.tgt_lens[i])} target tokens (with </s>) do not "
                f"fit model.max_positions={max_positions} ({len(too_long)} such pair(s) in {name}); "
                "raise model.max_positions or shorten them")


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save_tokenizer(task: Task, run_dir: Path) -> dict:
    """Write the task's vocabulary files into run_dir and return {file name: sha256}.

    They are what `s2s generate` reads; a run directory that holds checkpoints keeps the
    vocabulary they were trained with, so a different one is refused rather than written.
    """
    with tempfile.TemporaryDirectory(dir=run_dir, prefix=".vocab") as tmp:
        task.save_vocab(Path(tmp))
        files = {p.relative_to(tmp).as_posix(): _sha256(p) for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
        if checkpoint.listed(run_dir):
            changed = [n for n, h in files.items() if (run_dir / n).is_file() and _sha256(run_dir / n) != h]
            if changed:
                raise TrainingError(f"{', '.join(str(run_dir / n) for n in changed)}: the task's vocabulary now "
                                    "differs from the one this run's checkpoints were trained with; resume "
                                    "with the original data and config, or train in a new run.dir")
        for name in files:
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(tmp) / name, run_dir / name)
    return files


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # CPU and every CUDA device


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


@contextlib.contextmanager
def rng_preserved():
    """Leave the RNG states as they were: what runs inside cannot shift the training streams."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def tensorboard_writer(run_dir: Path, purge_step: int):
    """A SummaryWriter under run_dir/tensorboard when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # optional: metrics.jsonl holds the same figures
        return None
    return SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge_step)


class Trainer:
    """Holds what one training run needs; `run()` trains until optim.max_updates."""

    def __init__(self, cfg, registry, quiet: bool = False):
        self.cfg = cfg
        self.quiet = quiet or cfg.run.quiet
        self.rank = int(os.environ.get("RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.device = resolve_device(cfg.run.device, int(os.environ.get("LOCAL_RANK", 0)))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.run_dir = Path(cfg.run.dir)
        self.precision = precision.resolve(cfg.run.precision, self.device)
        self.search_precision = precision.resolve(cfg.decode.precision, self.device, "decode.precision")
        self.tb = None

        self.task = build_task(cfg, registry)

        def check_and_prepare():  # before any data work: an unwritable run dir fails at once
            check_run_dir(self.run_dir, need_bytes=0)
            self.data = prepare(self.task, cfg.data, quiet=self.quiet)

        def read_cache():
            if self.rank != 0:
                self.data = prepare(self.task, cfg.data, quiet=True)

        self._agreed(check_and_prepare, rank0_only=True)  # one process prepares,
        self._agreed(read_cache)  # the others read its cache
        for needed in ("train", "valid"):
            if needed not in self.data.splits:
                raise TrainingError(f"task {self.task.name!r} has no {needed!r} split")
        check_fits(self.data, cfg.model.max_positions)  # checked now, not after the training
        decoding = decode_settings(self.task, cfg.decode)
        if decoding.beam < 1 or str(decoding.stop) not in ("bound", "beam"):
            raise TrainingError(f"task {self.task.name!r}: decoding {decoding} is not usable "
                                "(beam >= 1, stop bound | beam); set decode.beam / decode.stop")

        torch.manual_seed(cfg.run.seed)  # the same initial parameters on every process
        self.model = build_model(cfg, self.task).to(self.device)
        seed_everything(cfg.run.seed * 1000 + self.rank)  # each process its own dropout stream
        self.n_params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        self.tokenizer = {"prepared": str(self.data.directory), "files": {}}

        def write_run_files():
            # parameters in fp32 plus Adam's two moments: 12 bytes a parameter per checkpoint
            check_run_dir(self.run_dir, need_bytes=self.n_params * 12 * (cfg.run.keep_last + 1))
            self.tokenizer["files"] = save_tokenizer(self.task, self.run_dir)

        self._agreed(write_run_files, rank0_only=True)
        # net: the model as the run's precision computes it (fp32 parameters in every case)
        self.net, self.autocast = precision.for_training(self.model, self.precision, self.device)
        self.ddp = self.net
        if self.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.net, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.optimizer = adam(self.model.parameters(), cfg.optim)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.update, self.epoch, self.batch_pos = 0, 0, 0
        self.skipped_updates, self.nonfinite_in_row, self.elapsed = 0, 0, 0.0
        self._resume()
        self._agreed(lambda: atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg)),
                     rank0_only=True)
        if self.rank == 0:
            self.tb = tensorboard_writer(self.run_dir, purge_step=self.update + 1)
        self._t0 = time.monotonic()
        self._last_save = clock()

    # -- helpers ------------------------------------------------------------------------------
    def _agreed(self, fn, rank0_only: bool = False) -> None:
        """Run fn on every process (or on rank 0 only); if it fails anywhere it fails everywhere,
        so that no process waits forever in a collective for one that has stopped."""
        error = None
        if self.rank == 0 or not rank0_only:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 -- re-raised below, on every process
                error = e
        if self.world > 1:
            errors = [None] * self.world
            dist.all_gather_object(errors, None if error is None else f"{type(error).__name__}: {error}")
            failed = [(r, m) for r, m in enumerate(errors) if m is not None]
            if failed and error is None:
                raise TrainingError(f"process {failed[0][0]} failed: {failed[0][1]}")
        if error is not None:
            raise error

    def _elapsed(self) -> float:
        """Training seconds so far, summed over the runs that led to this point."""
        return self.elapsed + time.monotonic() - self._t0

    def _log(self, record: dict) -> None:
        if self.rank != 0:
            return
        record["elapsed"] = round(self._elapsed(), 1)
        with open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in record.items():
                if key not in ("update", "elapsed") and isinstance(value, (int, float)):
                    self.tb.add_scalar(f"{record['kind']}/{key}", value, record["update"])
        if not self.quiet or record.get("kind") != "train":
            shown = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())
            log.info(shown)

    def _trim_metrics(self) -> None:
        """Drop records of updates after the resumed one (they will be redone) and torn lines."""
        path = self.run_dir / "metrics.jsonl"
        if self.rank != 0 or not path.is_file():
            return
        kept = [r for r in read_metrics(self.run_dir) if r["update"] <= self.update]
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))

    def _state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "update": self.update, "epoch": self.epoch,
                "batch_pos": self.batch_pos, "world": self.world, "skipped_updates": self.skipped_updates,
                "nonfinite_in_row": self.nonfinite_in_row, "elapsed": self._elapsed(),
                "rng": self._gather_rng(), "config": OmegaConf.to_container(self.cfg, enum_to_str=True),
                "tokenizer": self.tokenizer, "task": self.task.name}

    def _gather_rng(self) -> list:
        """Every rank's RNG states, so that each resumes its own dropout stream."""
        mine = rng_state()
        if self.world == 1:
            return [mine]
        states = [None] * self.world
        dist.all_gather_object(states, mine)
        return states

    def _resume(self) -> None:
        """Continue from the newest readable checkpoint, which rank 0 picks for everyone."""
        found, state = [None], None

        def pick():
            nonlocal state
            had = checkpoint.listed(self.run_dir)
            state, path = checkpoint.load_latest(self.run_dir, set_aside=True)
            found[0] = None if path is None else str(path)
            if had and path is None:
                log.warning("no readable checkpoint in %s: training starts from update 0",
                            checkpoint.checkpoint_dir(self.run_dir))

        def read():  # the run directory is shared (one node, or a shared filesystem)
            nonlocal state
            if self.rank != 0:
                state = checkpoint.load(found[0])

        self._agreed(pick, rank0_only=True)
        if self.world > 1:
            dist.broadcast_object_list(found, src=0)
        path = found[0]
        if path is None:
            self._trim_metrics()
            return
        self._agreed(read)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise TrainingError(f"checkpoint {path} does not fit this config ({str(e).splitlines()[0]}); "
                                "resume with the config it was written with (RUN_DIR/config.yaml) or "
                                "train in a new run.dir") from None
        self.update, self.epoch, self.batch_pos = state["update"], state["epoch"], state["batch_pos"]
        self.skipped_updates = state.get("skipped_updates", 0)
        self.nonfinite_in_row = state.get("nonfinite_in_row", 0)
        self.elapsed = state.get("elapsed", 0.0)
        rngs = state["rng"]
        if len(rngs) == self.world:
            set_rng_state(rngs[self.rank])
        else:  # the data is now shared out differently: continue at the same share of the epoch
            self.batch_pos = self.batch_pos * len(rngs) // self.world
            if self.rank == 0:
                log.warning("checkpoint %s was written by %d processes, now %d: the data position is "
                            "approximate and the RNG streams restart", path, len(rngs), self.world)
        self._trim_metrics()
        if self.rank == 0:
            log.info("resumed from %s at update %d", path, self.update)

    def _save(self) -> None:
        state = self._state()  # every rank joins the RNG gather

        def write():
            try:
                checkpoint.save(state, self.run_dir, self.update, self.cfg.run.keep_last)
            except OSError as e:
                raise TrainingError(f"cannot write the checkpoint of update {self.update} into "
                                    f"{checkpoint.checkpoint_dir(self.run_dir)}: {e}; the earlier "
                                    "checkpoints are intact") from None

        self._agreed(write, rank0_only=True)
        self._last_save = clock()

    def _save_due(self, last: bool) -> bool:
        """Every run.save_interval updates, at the end, and when run.save_minutes have passed."""
        run = self.cfg.run
        if last or self.update % run.save_interval == 0:
            return True
        if run.save_minutes <= 0:
            return False
        due = torch.tensor(float(clock() - self._last_save >= 60 * run.save_minutes), device=self.device)
        if self.world > 1:
            dist.broadcast(due, src=0)  # rank 0's clock decides for everyone
        return bool(due)

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
        """Forward and backward over `batches` (update_freq of them); the optimiser step is `_apply`'s.

        Gradients end up as d(sum of token losses of the whole update) / (its target tokens):
        each process scales its loss by world / total tokens, and DDP averages over processes.
        """
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
                    loss, nll = self.ddp(b["src"].to(self.device, non_blocking=True),
                                         b["tgt_in"].to(self.device, non_blocking=True),
                                         b["tgt_out"].to(self.device), cfg.optim.label_smoothing)
                self.scaler.scale(loss * self.world / ntokens).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        lr = lrate(self.update + 1, cfg.model.d_model, cfg.optim.warmup, cfg.optim.lr_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if cfg.optim.clip_norm > 0:  # the total norm is non-finite iff a gradient is
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=self.device)
        finite = torch.isfinite(loss_sum) & torch.isfinite(norm).to(self.device)
        if self.world > 1:
            finite = finite.float()
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # one process's NaN skips the update everywhere
            finite = finite.bool()
        return {"loss_sum": loss_sum, "nll_sum": nll_sum, "ntokens": ntokens, "lr": lr, "finite": finite,
                "local_tokens": sum(b["ntokens"] for b in data), "local_sentences": sum(map(len, batches))}

    def _apply(self, out: dict) -> bool:
        """Take the optimiser step if loss and gradients are finite on every process.

        Otherwise the update is skipped (parameters and optimiser state untouched; with fp16
        the loss scale is lowered) and counted; after run.max_nonfinite in a row training stops,
        with the checkpoints written so far, all from finite updates, left as they are.
        """
        finite = bool(out["finite"])
        if finite:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if finite:
            self.nonfinite_in_row = 0
            return True
        self.skipped_updates += 1
        self.nonfinite_in_row += 1
        if self.rank == 0:
            log.warning("update %d: non-finite loss or gradient, update skipped (%d in a row, %d in all)",
                        self.update + 1, self.nonfinite_in_row, self.skipped_updates)
        if self.nonfinite_in_row >= self.cfg.run.max_nonfinite:
            kept = checkpoint.listed(self.run_dir)
            self._log({"kind": "stopped", "update": self.update, "reason": "non-finite",
                       "in_a_row": self.nonfinite_in_row, "skipped": self.skipped_updates})
            raise TrainingError(
                f"{self.nonfinite_in_row} non-finite updates in a row after update {self.update} "
                f"(run.max_nonfinite={self.cfg.run.max_nonfinite}): training stopped. The last good "
                f"checkpoint is {kept[-1] if kept else 'none (none was written yet)'}; it resumes from there, "
                "e.g. with a lower optim.lr_scale, optim.clip_norm > 0 or run.precision=fp32")
        return False

    def validate(self) -> dict:
        """Dev loss and the task's metric, shared out over the processes and gathered.

        The RNG states are restored afterwards, so that validating (or not) never changes the
        dropout masks of later updates.
        """
        with rng_preserved():
            return self._validate()

    def _validate(self) -> dict:
        cfg = self.cfg
        valid = self.data.splits["valid"]
        record = {"kind": "valid", "update": self.update}
        batches = token_batches(valid.src_lens, valid.tgt_lens, cfg.data.max_tokens, seed=0, shuffle=False)
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, nll, target tokens
        self.model.eval()
        with torch.no_grad():
            for idx in batches[self.rank::self.world]:
                b = valid.batch(idx)
                with self.autocast():
                    loss, nll = self.net(b["src"].to(self.device), b["tgt_in"].to(self.device),
                                         b["tgt_out"].to(self.device), cfg.optim.label_smoothing)
                sums[0] += loss.double()
                sums[1] += nll.double()
                sums[2] += b["ntokens"]
        self.model.train()
        if self.world > 1:
            dist.all_reduce(sums)
        loss, nll, n = sums.tolist()
        record.update(loss=loss / n, nll=nll / n, ppl=math.exp(min(nll / n, 700.0)))

        sources, refs = self.data.texts("valid")
        if cfg.run.valid_max_sentences:
            sources, refs = sources[:cfg.run.valid_max_sentences], refs[:cfg.run.valid_max_sentences]
        hyps = translate(precision.for_inference(self.model, self.search_precision), self.task,
                         sources[self.rank::self.world],
                         decode_settings(self.task, cfg.decode), self.device, cfg.decode.max_sentences)
        if self.world > 1:
            shares = [None] * self.world
            dist.all_gather_object(shares, hyps)
            hyps = [shares[i % self.world][i // self.world] for i in range(len(sources))]
        score = self.task.score(hyps, refs, sources)
        record[score.name] = score.value
        record.update({k: v for k, v in score.figures.items()  # e.g. sentences a metric left out
                       if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in record})
        return record

    def run(self) -> dict:
        cfg = self.cfg
        from .progress import progress

        self.model.train()
        stream = self._batches()
        t_log, tokens_since, sentences_since = time.time(), 0, 0
        bar = progress(self.quiet or self.rank != 0, total=cfg.optim.max_updates, initial=self.update,
                       desc="train", unit=" upd", dynamic_ncols=True)
        last = self.update >= cfg.optim.max_updates or self._out_of_time()
        while not last:
            out = self.train_step([next(stream) for _ in range(cfg.optim.update_freq)])
            tokens_since += out["local_tokens"]
            sentences_since += out["local_sentences"]
            if not self._apply(out):
                continue  # a skipped update is not counted in optim.max_updates
            self.update += 1
            bar.update(1)
            if self.update % cfg.run.log_interval == 0:  # the only point where figures leave the device
                figures = torch.stack([out["loss_sum"], out["nll_sum"],
                                       torch.tensor(float(tokens_since), device=self.device),
                                       torch.tensor(float(sentences_since), device=self.device)])
                if self.world > 1:
                    dist.all_reduce(figures)  # the whole update's loss, every process's tokens and pairs
                (loss, nll, tokens, sentences), ntok, now = figures.tolist(), float(out["ntokens"]), time.time()
                self._log({"kind": "train", "update": self.update, "loss": loss / ntok, "nll": nll / ntok,
                           "lr": out["lr"], "tgt_tokens_per_s": round(tokens / (now - t_log), 1),
                           "sentences": int(sentences), "skipped": self.skipped_updates})
                t_log, tokens_since, sentences_since = now, 0, 0
            last = self.update == cfg.optim.max_updates or self._out_of_time()
            if self.update % cfg.run.valid_interval == 0 or last:
                self._log(self.validate())
            if self._save_due(last):
                self._save()
        bar.close()
        return self.finish()

    def _out_of_time(self) -> bool:
        """True once run.max_minutes of training (across resumes) have passed; all ranks agree."""
        if self.cfg.run.max_minutes <= 0:
            return False
        over = torch.tensor(float(self._elapsed() >= 60 * self.cfg.run.max_minutes), device=self.device)
        if self.world > 1:
            dist.all_reduce(over, op=dist.ReduceOp.MAX)
        return bool(over)

    def finish(self) -> dict:
        """Average the last checkpoints if configured, then evaluate on the test split."""
        cfg = self.cfg
        result = {"update": self.update, "skipped_updates": self.skipped_updates}
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
            hyps = translate(precision.for_inference(self.model, self.search_precision), self.task, sources,
                             decode_settings(self.task, cfg.decode),
                             self.device, cfg.decode.max_sentences)
            atomic_write_text(self.run_dir / "test.hyp.txt", "".join(h + "\n" for h in hyps))
            score = self.task.score(hyps, refs, sources)
            result["test"] = score.as_dict()
            self._log({"kind": "test", "update": self.update, score.name: score.value})
        atomic_write_text(self.run_dir / "result.json", json.dumps(result, indent=1))
        return result

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def read_metrics(run_dir: Path) -> list[dict]:
    """The run's records, oldest first; a torn last line (a killed run) is passed over."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: not a run directory of `s2s train`")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "update" in record:
            records.append(record)
    return records



def train(cfg, registry, quiet: bool = False) -> dict:
    trainer = None
    try:
        trainer = Trainer(cfg, registry, quiet)
        result = trainer.run()
        if dist.is_initialized():  # leave together: a gloo process that tears its group down
            dist.barrier()         # while a peer still decodes the test set can abort at exit
        return result
    finally:
        if trainer is not None:
            trainer.close()
        if int(os.environ.get("WORLD_SIZE", 1)) > 1 and dist.is_initialized():
            dist.destroy_process_group()
