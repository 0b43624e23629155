"""Training: the loop of section 5, with validation, checkpoints and exact resume.

One update = `optim.update_freq` token-count batches per process, all of one member of the run
(`s2s.core.data.members`: one task, or several sharing the model); the loss is summed over tokens
and divided by the number of target tokens in the whole update (all batches, all processes),
so 2 processes with batch B, 1 process with batch 2B and 1 process with batch B and update_freq
2 take the same step. Each process trains on its own share of the batches
(DistributedDataParallel over `s2s.core.training.distributed.Group`); only rank 0 writes files.

One training holds a run directory at a time (`s2s.core.training.rundir.claim`). Running the same
command on the same run directory resumes from the newest readable checkpoint: model, optimiser, loss scale, update count, every member's data position and every
process's RNG states. Validation (`s2s.core.training.validation`) runs with the RNG states saved and
restored around it, so a resumed run follows the same path as one never stopped, bit for bit
on CPU. Figures go to RUN_DIR/metrics.jsonl (`s2s.core.training.runlog`); the end of a run, the
model chosen on dev and its test figures, is `s2s.core.training.result`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ..data.members import Member, build_members, prepare_members
from ..errors import TrainingError
from ..files import atomic_write_text
from ..nn import precision
from ..nn.model import Transformer
from ..nn.optim import adam, lrate
from ..vocab import PAD
from . import checkpoint, result, rundir, transfer
from .distributed import Group
from .prefetch import Prefetch
from .rng import rng_state, seed_everything, set_rng_state
from .runlog import RunLog
from .schedule import Stream, draw, probabilities
from .validation import evaluate_dev

log = logging.getLogger("s2s")
clock = time.monotonic  # what run.save_minutes is measured with (tests substitute their own)


class Trainer:
    """One training run: `step()` takes one update, `run()` trains until optim.max_updates (or
    run.max_minutes) with logging, validation and checkpoints, then selects and tests the model."""

    def __init__(self, cfg, registry, quiet: bool = False):
        self.cfg, self.run_dir = cfg, Path(cfg.run.dir)
        self.group = g = Group(cfg.run.device, cfg.run.timeout_minutes, cfg.run.wait_minutes)
        self.device = g.device
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        self.lock = None  # rank 0's hold on the run directory

        def claim():
            self.lock = rundir.claim(self.run_dir)

        g.agreed(claim, rank0_only=True)
        self.members = build_members(cfg, registry)
        if len(self.members) > 1 and not cfg.model.pre_norm and g.rank == 0:
            log.warning(
                "a multi-task run with model.pre_norm=false: in post-norm layers the encoder can learn to "
                "ignore its source behind the task token every source shares (docs/multitask.md); "
                "model.pre_norm=true avoids it"
            )
        sizes = prepare_members(
            self.members, cfg, g, quiet or cfg.run.quiet
        )  # the data, early checks; the id space

        torch.manual_seed(cfg.run.seed)  # the same initial parameters on every process
        self.model = Transformer(cfg.model, *sizes).to(self.device)
        seed_everything(cfg.run.seed * 1000 + g.rank)  # each process its own dropout stream
        self.n_params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        self.tokenizer = {
            "prepared": {m.name: str(m.data.directory) for m in self.members},
            "files": {},
        }

        self.precision = precision.resolve(cfg.run.precision, self.device)
        self.search_precision = precision.resolve(
            cfg.decode.precision, self.device, "decode.precision"
        )
        # net: the model as the run's precision computes it (fp32 parameters in every case)
        self.net, self.autocast = precision.for_training(self.model, self.precision, self.device)
        self.ddp = self.net
        if g.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.net, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )
        self.optimizer = adam(self.model.parameters(), cfg.optim)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.p = probabilities(self.members, cfg.multitask.temperature)
        self.streams = [
            Stream(m, cfg.data.max_tokens, cfg.run.seed, g.rank, g.world) for m in self.members
        ]
        self.prefetch = Prefetch(self.device)  # on a GPU, the next update's batches built meanwhile

        self.update, self.skipped_updates, self.nonfinite_in_row, self.elapsed = 0, 0, 0, 0.0
        self.member_updates = [0] * len(self.members)  # the updates each member has trained
        self.best = None  # {"update", "select"}: the validated model with the highest dev figure
        self.validated = None  # (update, figure) of this process's latest validation
        state, path = checkpoint.resume(self.run_dir, g)
        if state is not None:
            trained, names = state.get("tasks"), [m.name for m in self.members]
            if (
                trained is not None and list(trained) != names
            ):  # each member's ids would index another's rows
                raise TrainingError(
                    f"checkpoint {path} was trained with the tasks {', '.join(map(str, trained))} in "
                    f"this order, this config lists {', '.join(names)}: list the same tasks in the "
                    "checkpoint's order (as RUN_DIR/config.yaml does) or train in a new run.dir"
                )
            try:
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
                self.scaler.load_state_dict(state["scaler"])
                # written before multi-task runs: one stream, kept as (epoch, batch_pos)
                positions = state.get("streams") or {
                    self.members[0].name: [state["epoch"], state["batch_pos"]]
                }
                for s in self.streams:
                    s.restore(positions[s.member.name])
            except (RuntimeError, ValueError, KeyError) as e:
                raise TrainingError(
                    f"checkpoint {path} does not fit this config ({str(e).splitlines()[0]}); "
                    "resume with the config it was written with (RUN_DIR/config.yaml) or "
                    "train in a new run.dir"
                ) from None
            self.update = state["update"]
            done = state.get("member_updates") or {self.members[0].name: self.update}
            self.member_updates = [done[m.name] for m in self.members]
            self.skipped_updates = state.get("skipped_updates", 0)
            self.nonfinite_in_row = state.get("nonfinite_in_row", 0)
            self.best, self.elapsed = state.get("best"), state.get("elapsed", 0.0)
            rngs = state["rng"]
            if len(rngs) == g.world:
                set_rng_state(rngs[g.rank])
            else:  # the data is now shared out differently: continue at the same share of each epoch
                for s in self.streams:
                    s.pos = s.pos * len(rngs) // g.world
                if g.rank == 0:
                    log.warning(
                        "checkpoint %s was written by %d processes, now %d: the data position is "
                        "approximate and the RNG streams restart",
                        path,
                        len(rngs),
                        g.world,
                    )
            if g.rank == 0:
                log.info("resumed from %s at update %d", path, self.update)
        elif cfg.run.init_from:  # a new run that starts from another run's weights
            transfer.keep(self, transfer.init_from(self.model, self.members, cfg, registry))

        def write_run_files():  # a resumed run keeps the vocabulary its checkpoints were trained with
            # parameters in fp32 plus Adam's two moments: 12 bytes a parameter per checkpoint
            rundir.check_run_dir(
                self.run_dir, need_bytes=self.n_params * 12 * (cfg.run.keep_last + 1)
            )
            for m in self.members:
                where = self.run_dir / m.vocab_subdir
                self.tokenizer["files"].update(
                    checkpoint.save_tokenizer(m.task, self.run_dir, where, state is not None)
                )

        g.agreed(write_run_files, rank0_only=True)
        g.agreed(
            lambda: atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg)),
            rank0_only=True,
        )
        self.log = RunLog(self.run_dir, quiet or cfg.run.quiet, writer=g.rank == 0)
        self.log.start(self.update)
        self._t0 = time.monotonic()
        self._last_save = clock()

    def _elapsed(self) -> float:
        """Training seconds so far, summed over the runs that led to this point."""
        return self.elapsed + time.monotonic() - self._t0

    def record(self, record: dict) -> None:
        self.log(record, self._elapsed())

    # -- checkpoints --------------------------------------------------------------------------
    def _model_state(self) -> dict:
        """The model at this update with what reads it back: config, tokenizer, tasks."""
        return {
            "model": self.model.state_dict(),
            "update": self.update,
            "tokenizer": self.tokenizer,
            "config": OmegaConf.to_container(self.cfg, enum_to_str=True),
            "tasks": [m.name for m in self.members],
        }

    def _state(self) -> dict:
        rngs = self.group.gather(
            rng_state()
        )  # every rank's, so that each resumes its own dropout stream
        return {
            **self._model_state(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "streams": {s.member.name: s.state() for s in self.streams},
            "world": self.group.world,
            "member_updates": dict(zip((m.name for m in self.members), self.member_updates)),
            "skipped_updates": self.skipped_updates,
            "nonfinite_in_row": self.nonfinite_in_row,
            "best": self.best,
            "elapsed": self._elapsed(),
            "rng": rngs,
        }

    def write(self, write, what: str, kept: str):
        """Run `write` on rank 0 and return what it returns, on every process; an OSError
        becomes one TrainingError naming `what`, everywhere."""

        def guarded():
            try:
                return write()
            except OSError as e:
                raise TrainingError(f"cannot write {what}: {e}; {kept}") from None

        return self.group.agreed(guarded, rank0_only=True)

    def save(self) -> None:
        state = self._state()  # every rank joins the RNG gather
        self.write(
            lambda: checkpoint.save(state, self.run_dir, self.update, self.cfg.run.keep_last),
            f"the checkpoint of update {self.update} into {checkpoint.checkpoint_dir(self.run_dir)}",
            "the earlier checkpoints are intact",
        )
        self._last_save = clock()

    def _save_due(self, last: bool) -> bool:
        """Every run.save_interval updates, at the end, and when run.save_minutes have passed."""
        run = self.cfg.run
        if last or self.update % run.save_interval == 0:
            return True
        if run.save_minutes <= 0:
            return False
        return self.group.rank0_says(clock() - self._last_save >= 60 * run.save_minutes)

    # -- one update ---------------------------------------------------------------------------
    def gradients(self, member: Member, batches: list) -> dict:
        """Forward and backward over `batches` (update_freq of them) of `member`.

        Gradients end up as d(sum of token losses of the whole update) / (its target tokens):
        each process scales its loss by world / total tokens, and DDP averages over processes.
        """
        cfg, g = self.cfg, self.group
        data = self.prefetch.take(member, batches)
        # copies from pinned memory on a GPU, asynchronous; the tokens counted on the device (no sync)
        tensors = [
            {k: b[k].to(self.device, non_blocking=True) for k in ("src", "tgt_in", "tgt_out")}
            for b in data
        ]
        ntokens = g.sum(sum(t["tgt_out"].ne(PAD).sum() for t in tensors).float())
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        for i, t in enumerate(tensors):
            sync = i == len(data) - 1
            ctx = self.ddp.no_sync() if (g.world > 1 and not sync) else contextlib.nullcontext()
            with ctx:
                with self.autocast():
                    loss, nll = self.ddp(
                        t["src"], t["tgt_in"], t["tgt_out"], cfg.optim.label_smoothing
                    )
                self.scaler.scale(loss * g.world / ntokens).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        return {
            "loss_sum": loss_sum,
            "nll_sum": nll_sum,
            "ntokens": ntokens,
            "local_tokens": sum(b["ntokens"] for b in data),
            "local_sentences": sum(map(len, batches)),
        }

    def step(self, batches: list | None = None) -> dict | None:
        """One update: draw the member, take its next update_freq batches (or `batches`, index
        arrays of its training split, for a benchmark that times chosen batches), and step the
        optimiser if loss and gradients are finite on every process.

        Returns the update's figures (member, loss_sum, nll_sum, ntokens on the device; lr;
        this process's tokens and sentences), or None when the update was skipped: parameters
        and optimiser state untouched (with fp16 the loss scale is lowered), counted, and after
        run.max_nonfinite in a row training stops, the checkpoints written so far, all from
        finite updates, left as they are. A skipped update is not counted in optim.max_updates.
        """
        cfg = self.cfg
        k = draw(self.p, cfg.run.seed, self.update + 1)
        if batches is None:
            batches = [self.streams[k].next() for _ in range(cfg.optim.update_freq)]
        out = self.gradients(self.members[k], batches)
        # the next update's batches (if this one counts) are built while the device catches up
        following = draw(self.p, cfg.run.seed, self.update + 2)
        self.prefetch.ahead(self.members[following], self.streams[following], cfg.optim.update_freq)
        out["member"], out["lr"] = (
            k,
            lrate(self.update + 1, cfg.model.d_model, cfg.optim.warmup, cfg.optim.lr_scale),
        )
        for group in self.optimizer.param_groups:
            group["lr"] = out["lr"]
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if cfg.optim.clip_norm > 0:  # the total norm is non-finite iff a gradient is
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_norm)
        else:
            norm = (
                torch.nn.utils.get_total_norm(grads)
                if grads
                else torch.zeros((), device=self.device)
            )
        # one process's NaN skips the update everywhere: the step's one wait for the device
        finite = bool(
            self.group.all(torch.isfinite(out["loss_sum"]) & torch.isfinite(norm).to(self.device))
        )
        if finite:
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if finite:
            self.nonfinite_in_row = 0
            self.update += 1
            self.member_updates[k] += 1
            return out
        self.skipped_updates += 1
        self.nonfinite_in_row += 1
        if self.group.rank == 0:
            log.warning(
                "update %d: non-finite loss or gradient, update skipped (%d in a row, %d in all)",
                self.update + 1,
                self.nonfinite_in_row,
                self.skipped_updates,
            )
        if self.nonfinite_in_row >= cfg.run.max_nonfinite:
            kept = checkpoint.listed(self.run_dir)
            self.record(
                {
                    "kind": "stopped",
                    "update": self.update,
                    "reason": "non-finite",
                    "in_a_row": self.nonfinite_in_row,
                    "skipped": self.skipped_updates,
                }
            )
            raise TrainingError(
                f"{self.nonfinite_in_row} non-finite updates in a row after update {self.update} "
                f"(run.max_nonfinite={cfg.run.max_nonfinite}): training stopped. The last good "
                f"checkpoint is {kept[-1] if kept else 'none (none was written yet)'}; it resumes from there, "
                "e.g. with a lower optim.lr_scale, optim.clip_norm > 0 or run.precision=fp32"
            )
        return None

    def validate(self) -> tuple[dict, float]:
        """The valid record of this update and its selection figure (s2s.core.training.validation)."""
        return evaluate_dev(
            self.net,
            precision.for_inference(self.model, self.search_precision),
            self.members,
            self.group,
            self.cfg,
            self.autocast,
            self.update,
        )

    def _keep_if_best(self, figure: float) -> None:
        """Write RUN_DIR/checkpoint_best.pt when this update's dev figure is the highest so far
        (an earlier model keeps a tie): the model, its update and figure, config and tokenizer."""
        self.validated = (self.update, figure)
        if self.best is not None and figure <= self.best["select"]:
            return
        self.best = {"update": self.update, "select": figure}
        state = {**self._model_state(), "select": figure}
        self.write(
            lambda: checkpoint.atomic_save(state, self.run_dir / checkpoint.BEST),
            str(self.run_dir / checkpoint.BEST),
            "the previous best model is intact",
        )

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        from ..progress import progress

        self.model.train()
        # since the last train record, per member: loss, nll and target tokens of the updates,
        # summed on the device and read once per record; this process's tokens, sentences, updates
        since = torch.zeros(len(self.members), 3, dtype=torch.float64, device=self.device)
        counts = [[0, 0, 0] for _ in self.members]
        t_log = time.time()
        bar = progress(
            self.log.quiet or self.group.rank != 0,
            total=cfg.optim.max_updates,
            initial=self.update,
            desc="train",
            unit=" upd",
            dynamic_ncols=True,
        )
        if cfg.run.max_minutes > 0 and self.group.rank == 0:
            log.info(
                "run.max_minutes=%g counts training time across resumes: updates, validation and checkpoints "
                "(%.1f min so far); not data preparation, nor the averaging, dev re-score and test decode "
                "that follow the budget",
                cfg.run.max_minutes,
                self._elapsed() / 60,
            )
        last = self.update >= cfg.optim.max_updates or self._out_of_time()
        while not last:
            out = self.step()
            if out is None:
                continue
            bar.update(1)
            since[out["member"]] += torch.stack(
                [out["loss_sum"], out["nll_sum"], out["ntokens"]]
            ).double()
            c = counts[out["member"]]
            c[0], c[1], c[2] = c[0] + out["local_tokens"], c[1] + out["local_sentences"], c[2] + 1
            if (
                self.update % cfg.run.log_interval == 0
            ):  # the only point where figures leave the device
                now = time.time()
                self.record(self._train_record(since, counts, out["lr"], now - t_log))
                since.zero_()
                counts = [[0, 0, 0] for _ in self.members]
                t_log = now
            last = self.update == cfg.optim.max_updates or self._out_of_time()
            if last:
                self._say_budget_spent("the last validation and checkpoint")
            if (
                self.update % cfg.run.valid_interval == 0 and self.update >= cfg.run.valid_after
            ) or last:
                record, figure = self.validate()
                self.record(record)
                self._keep_if_best(figure)
                if (
                    not last and self._out_of_time()
                ):  # spent while validating: this update, just validated, is the last
                    last = True
                    self._say_budget_spent("its validation done; the last checkpoint")
            if self._save_due(last):
                self.save()
        bar.close()
        return self.finish()

    def _train_record(self, since: torch.Tensor, counts: list, lr: float, seconds: float) -> dict:
        """Loss and nll per target token over the updates since the last record (and per member
        in a multi-task run, with its number of those updates), the learning rate, and the
        target tokens a second of all processes."""
        losses = self.group.sum(since[:, :2].clone()).tolist()  # the updates' losses, all processes
        ntokens = since[:, 2].tolist()  # each update's count is already every process's
        tokens, sentences = self.group.sum(
            torch.tensor(
                [sum(c[0] for c in counts), sum(c[1] for c in counts)],
                dtype=torch.float64,
                device=self.device,
            )
        ).tolist()

        def per_token(rows):
            n = sum(ntokens[k] for k in rows)
            return {
                "loss": sum(losses[k][0] for k in rows) / n,
                "nll": sum(losses[k][1] for k in rows) / n,
            }

        trained = [k for k in range(len(self.members)) if counts[k][2] > 0]
        record = {
            "kind": "train",
            "update": self.update,
            **per_token(trained),
            "lr": lr,
            "tgt_tokens_per_s": round(tokens / seconds, 1),
            "sentences": int(sentences),
            "skipped": self.skipped_updates,
        }
        for k in trained:  # a lone member's own figures are the run's (its prefix is empty)
            prefix = self.members[k].prefix
            record.update(
                {f"{prefix}{key}": v for key, v in per_token([k]).items()},
                **{f"{prefix}updates": counts[k][2]},
            )
        return record

    def _say_budget_spent(self, then: str) -> None:
        """Log (rank 0) that run.max_minutes ended the run at this update, and what follows it."""
        if self.update < self.cfg.optim.max_updates and self.group.rank == 0:
            log.info(
                "run.max_minutes=%g reached at update %d (%.1f min of training): %s, then the model chosen "
                "and tested, outside the budget",
                self.cfg.run.max_minutes,
                self.update,
                self._elapsed() / 60,
                then,
            )

    def _out_of_time(self) -> bool:
        """True once run.max_minutes of training (across resumes) have passed by rank 0's clock."""
        if self.cfg.run.max_minutes <= 0:
            return False
        return self.group.rank0_says(self._elapsed() >= 60 * self.cfg.run.max_minutes)

    def finish(self) -> dict:
        """Select the model to test on the dev figure, then test every member (`s2s.core.training.result`)."""
        chosen = {
            "update": self.update,
            "skipped_updates": self.skipped_updates,
            **result.select(self),
            "member_updates": dict(zip((m.name for m in self.members), self.member_updates)),
        }
        return result.test(self, chosen) if self.group.rank == 0 else chosen

    def close(self) -> None:
        self.prefetch.close()
        self.log.close()
        if self.lock is not None:
            self.lock.close()


def train(cfg, registry, quiet: bool = False) -> dict:
    trainer = None
    try:
        trainer = Trainer(cfg, registry, quiet)
        result = trainer.run()
        trainer.group.close()
        return result
    finally:
        if trainer is not None:
            trainer.close()
        if int(os.environ.get("WORLD_SIZE", 1)) > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
