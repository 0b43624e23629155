"""Training: the loop of section 5, with validation, checkpoints and exact resume.

One update = `optim.update_freq` token-count batches per process, all of one member of the run
(`s2s.core.data.members`: one task, or several sharing the model); the loss is summed over tokens
and divided by the number of target tokens in the whole update (all batches, all processes),
so 2 processes with batch B, 1 process with batch 2B and 1 process with batch B and update_freq
2 take the same step. Each process trains on its own share of the batches
(DistributedDataParallel over `s2s.core.runs.distributed.Group`); only rank 0 writes files.

One training holds a run directory at a time (`s2s.core.runs.directory.claim`). Running the
same command on the same run directory resumes from the newest readable checkpoint: model,
optimiser, loss scale, update count and every member's data position, which is one sequence of
batches for all processes (`s2s.core.training.schedule`); every batch's dropout masks are drawn
from a seed of its update and slot. So a resumed run follows the same path as one never stopped,
bit for bit on CPU at the same process count, and within the reduction's rounding at any other
count with the same global batch (processes x optim.update_freq). Validation
(`s2s.core.training.validation`) runs with the RNG states saved and restored around it.
Figures go to RUN_DIR/metrics.jsonl (`s2s.core.training.runlog`, the train records summed up by
`s2s.core.training.tally`). Where a run starts (fresh, resumed, or from
another run's weights) is `s2s.core.training.start`'s; at the end `s2s.core.training.result`
chooses the model to test on dev (`select`), tests it (`test`) and writes result.json.
"""

from __future__ import annotations

import contextlib
import json
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
from ..contract.task import better
from ..tokenizers import PAD
from ..runs import checkpoint, directory
from ..runs.distributed import Group
from . import result, start, transfer
from .prefetch import Prefetch
from .rng import seed_dropout, seed_everything
from .runlog import RunLog
from .schedule import Mix, Share, Stream, dropout_seed
from .tally import Tally
from .validation import DevModels, evaluate_dev

log = logging.getLogger("s2s")
clock = time.monotonic  # what run.save_minutes is measured with (tests substitute their own)


class Trainer:
    """One training run: `step()` takes one update, `run()` trains until optim.max_updates (or
    run.max_minutes) with logging, validation and checkpoints, then selects and tests the model."""

    def __init__(self, cfg, registry, quiet: bool = False):
        """Set up a run from `cfg`, its tasks from `registry`, step by step: the processes and
        the run directory, the members and their data, the model and its optimiser, each
        member's stream of batches; then where training starts (this run's newest checkpoint,
        another run's weights, or update 0), the run's files and its log."""
        self.cfg, self.run_dir = cfg, Path(cfg.run.dir)
        quiet = quiet or cfg.run.quiet
        self._setup_processes()
        # a new run's source is checked before the run directory is claimed (nothing left behind)
        fresh = cfg.run.init_from and not checkpoint.listed(self.run_dir)
        source = transfer.checked_source(cfg, registry) if fresh else None
        self._setup_run_dir()
        try:
            sizes = self._setup_members(registry, quiet)
            self._setup_model(sizes)
            self._setup_optimizer()
            self._setup_data()
            resumed = self._start_from(registry, source)
        except BaseException:  # a new run that fails in setup leaves no folder behind
            if self.lock is not None:
                directory.release(self.run_dir, self.lock)
                self.lock = None
            raise
        self._write_run_files(resumed)
        self._setup_log(quiet)

    # -- setup, in the order __init__ takes it -------------------------------------------------
    def _setup_processes(self) -> None:
        """This process's place in the run (torchrun's environment), its device and threads."""
        run = self.cfg.run
        self.group = Group(run.device, run.timeout_minutes, run.wait_minutes)
        self.device = self.group.device
        if run.threads:
            torch.set_num_threads(run.threads)

    def _setup_run_dir(self) -> None:
        """Rank 0's hold on the run directory (`directory.claim`): one training at a time."""
        self.lock = None

        def claim():
            self.lock = directory.claim(self.run_dir)

        self.group.agreed(claim, rank0_only=True)

    def _setup_members(self, registry, quiet: bool) -> tuple:
        """The run's members (`s2s.core.data.members`) with their data prepared and checked;
        returns the sizes of the id space they share."""
        self.members = build_members(self.cfg, registry)
        # where each task came from, recorded so that the run loads it again without --plugin
        self.origins = {m.task.name: registry.record(m.task.name) for m in self.members}
        if len(self.members) > 1 and not self.cfg.model.pre_norm and self.group.rank == 0:
            log.warning(
                "a multi-task run with model.pre_norm=false: in post-norm layers the encoder can "
                "learn to ignore its source behind the task token every source shares "
                "(docs/multitask.md); model.pre_norm=true avoids it"
            )
        return prepare_members(self.members, self.cfg, self.group, quiet)

    def _setup_model(self, sizes: tuple) -> None:
        """The model, the same initial parameters on every process (dropout draws from a seed
        of each batch's update and slot, `schedule.dropout_seed`); the model as the run's
        precision computes it (`net`, fp32 parameters in every case), wrapped for
        DistributedDataParallel over several processes (`ddp`)."""
        cfg, g = self.cfg, self.group
        torch.manual_seed(cfg.run.seed)
        self.model = Transformer(cfg.model, *sizes).to(self.device)
        seed_everything(cfg.run.seed * 1000 + g.rank)
        self.n_params = sum(p.numel() for p in {id(p): p for p in self.model.parameters()}.values())
        self.tokenizer = {
            "prepared": {m.name: str(m.data.directory) for m in self.members},
            "files": {},
        }
        self.precision = precision.resolve(cfg.run.precision, self.device)
        self.search_precision = precision.resolve_search(cfg.decode.precision, self.device)
        self.net, self.autocast = precision.for_training(self.model, self.precision, self.device)
        self.ddp = self.net
        if g.world > 1:
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.net, device_ids=[self.device.index] if self.device.type == "cuda" else None
            )

    def _setup_optimizer(self) -> None:
        """Adam (section 5.3) and, for fp16, the loss scale."""
        self.optimizer = adam(self.model.parameters(), self.cfg.optim)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def _setup_data(self) -> None:
        """Which member each update trains (`p`), each member's stream of batches, and on a GPU
        the next update's batches built meanwhile (`prefetch`)."""
        cfg, g = self.cfg, self.group
        self.mix = Mix(self.members, cfg.multitask.temperature, cfg.multitask.stages)
        self.share = Share(g.rank, g.world, cfg.optim.update_freq)
        self.streams = [
            Stream(m, cfg.data.max_tokens, cfg.run.seed, self.share) for m in self.members
        ]
        self.prefetch = Prefetch(self.device)

    def _start_from(self, registry, source) -> bool:
        """Where training starts (`s2s.core.training.start.begin`): this run's newest readable
        checkpoint, else the weights of run.init_from (and what run.init_keep takes), else
        update 0. The Trainer takes the counters it starts from; True when resumed."""
        begun = start.begin(self, registry, source)
        for name, value in vars(begun).items():
            if name != "resumed":
                setattr(self, name, value)
        # (update, figure, higher_is_better) of this process's latest validation
        self.validated = None
        return begun.resumed

    def _write_run_files(self, resumed: bool) -> None:
        """Rank 0 checks the run directory has room for the checkpoints, writes each member's
        vocabulary files (a resumed run keeps those its checkpoints were trained with), then
        RUN_DIR/config.yaml and where its tasks came from (RUN_DIR/task_origins.json)."""

        def vocabularies():
            # parameters in fp32 plus Adam's two moments: 12 bytes a parameter per checkpoint
            directory.check_run_dir(
                self.run_dir, need_bytes=self.n_params * 12 * (self.cfg.run.keep_last + 1)
            )
            for m in self.members:
                where = self.run_dir / m.vocab_subdir
                self.tokenizer["files"].update(
                    checkpoint.save_tokenizer(m.task, self.run_dir, where, resumed)
                )

        self.group.agreed(vocabularies, rank0_only=True)
        self.group.agreed(
            lambda: atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(self.cfg)),
            rank0_only=True,
        )
        self.group.agreed(
            lambda: atomic_write_text(
                self.run_dir / checkpoint.ORIGINS, json.dumps(self.origins, indent=1) + "\n"
            ),
            rank0_only=True,
        )

    def _setup_log(self, quiet: bool) -> None:
        """metrics.jsonl from this update on (`RunLog`), and the clocks of training time and
        of run.save_minutes; a `restart` record when torchrun restarted the processes (its
        TORCHELASTIC_RESTART_COUNT), at the update they resume from."""
        self.log = RunLog(self.run_dir, quiet, writer=self.group.rank == 0)
        self.log.start(self.update)
        self._t0 = time.monotonic()
        self._last_save = clock()
        # torchrun --max-restarts started this group again after a worker failed: say so
        restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
        if restarts:
            self.record({"kind": "restart", "update": self.update, "restarts": restarts})

    def _elapsed(self) -> float:
        """Training seconds so far, summed over the runs that led to this point."""
        return self.elapsed + time.monotonic() - self._t0

    def record(self, record: dict) -> None:
        self.log(record, self._elapsed())

    # -- checkpoints --------------------------------------------------------------------------
    def _model_state(self) -> dict:
        """The model at this update with what reads it back: config, tokenizer, tasks and where
        they came from."""
        return {
            "model": self.model.state_dict(),
            "update": self.update,
            "tokenizer": self.tokenizer,
            "config": OmegaConf.to_container(self.cfg, enum_to_str=True),
            "tasks": [m.name for m in self.members],
            "origins": self.origins,
        }

    def _state(self) -> dict:
        """Everything a resumed run starts from (`s2s.core.training.start`)."""
        counters = start.Start.of(self)
        counters.elapsed = self._elapsed()
        return {
            **self._model_state(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "streams": {s.member.name: s.state() for s in self.streams},
            "world": self.group.world,
            **counters.written(self.members),
            "global_batch": start.global_batch(self.cfg, self.group.world),
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
        state = self._state()
        self.write(
            lambda: checkpoint.save(state, self.run_dir, self.update, self.cfg.run.keep_last),
            f"the checkpoint of update {self.update} into "
            f"{checkpoint.checkpoint_dir(self.run_dir)}",
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
        # copies from pinned memory on a GPU, asynchronous; the tokens counted on the device (no
        # sync)
        tensors = [
            {k: b[k].to(self.device, non_blocking=True) for k in ("src", "tgt_in", "tgt_out")}
            for b in data
        ]
        ntokens = g.sum(sum(t["tgt_out"].ne(PAD).sum() for t in tensors).float())
        loss_sum = torch.zeros((), device=self.device)
        nll_sum = torch.zeros((), device=self.device)
        first_slot = self.share.rank * len(tensors)  # this process's batches in the update
        for i, t in enumerate(tensors):
            # the batch's dropout masks: the same whichever process trains its slot
            seed_dropout(dropout_seed(cfg.run.seed, self.update + 1, first_slot + i), self.device)
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
        k = self.mix.draw(cfg.run.seed, self.update + 1)
        if batches is None:
            batches = self.streams[k].update_batches()
        out = self.gradients(self.members[k], batches)
        # the next update's batches (if this one counts) are built while the device catches up
        following = self.mix.draw(cfg.run.seed, self.update + 2)
        self.prefetch.ahead(self.members[following], self.streams[following])
        out["member"] = k
        out["lr"] = lrate(self.update + 1, cfg.model.d_model, cfg.optim.warmup, cfg.optim.lr_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = out["lr"]
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        if cfg.optim.clip_norm > 0:  # the total norm is non-finite iff a gradient is
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.clip_norm)
        elif grads:
            norm = torch.nn.utils.get_total_norm(grads)
        else:
            norm = torch.zeros((), device=self.device)
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
                f"checkpoint is {kept[-1] if kept else 'none (none was written yet)'}; it resumes "
                "from there, "
                "e.g. with a lower optim.lr_scale, optim.clip_norm > 0 or run.precision=fp32"
            )
        return None

    def validate(self) -> tuple[dict, float]:
        """The valid record of this update and its selection figure
        (s2s.core.training.validation)."""
        search = precision.for_inference(self.model, self.search_precision)
        models = DevModels(self.net, search, self.autocast)
        return evaluate_dev(models, self.members, self.group, self.cfg, self.update)

    def _keep_if_best(self, figure: float, higher: bool) -> bool:
        """Write RUN_DIR/checkpoint_best.pt when this update's dev figure is the best so far,
        better as `higher` says (the task's `Score.higher_is_better`; an earlier model keeps a
        tie): the model, its update, figure and direction, config and tokenizer. Returns
        whether it was; counts the validations since the best (run.patience)."""
        self.validated = (self.update, figure, higher)
        best = self.best
        if best is not None and best.get("higher_is_better", True) != higher:
            if self.group.rank == 0:
                log.warning(
                    "the best dev figure so far (update %d) was better %s, this run's is better "
                    "%s: the two do not compare, update %d's model is the best from here on",
                    best["update"],
                    "higher" if best.get("higher_is_better", True) else "lower",
                    "higher" if higher else "lower",
                    self.update,
                )
            best = None
        if best is not None and not better(figure, best["select"], higher):
            self.stale += 1
            return False
        self.best = {"update": self.update, "select": figure, "higher_is_better": higher}
        self.stale = 0
        state = {**self._model_state(), "select": figure, "higher_is_better": higher}
        self.write(
            lambda: checkpoint.atomic_save(state, self.run_dir / checkpoint.BEST),
            str(self.run_dir / checkpoint.BEST),
            "the previous best model is intact",
        )
        return True

    def _out_of_patience(self) -> bool:
        """True once run.patience validations in a row have not beaten the best (0: never)."""
        patience = self.cfg.run.patience
        return patience > 0 and self.stale >= patience

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        """Train until optim.max_updates (or run.max_minutes), recording, validating and saving
        on the way, then select the model to test and test it (`finish`)."""
        cfg = self.cfg
        from ..progress import progress

        self.model.train()
        prefixes = [m.prefix for m in self.members]
        since, t_log = Tally.zero(prefixes, self.device), time.time()
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
                "run.max_minutes=%g counts training time across resumes: updates, validation and "
                "checkpoints (%.1f min so far); not data preparation, nor the averaging, dev "
                "re-score and test decode that follow the budget",
                cfg.run.max_minutes,
                self._elapsed() / 60,
            )
        last = self.update >= cfg.optim.max_updates or self._out_of_time()
        if not last and self._out_of_patience():  # a run that stopped early, run again
            last = True
            self._say_patience_spent("the model chosen and tested")
        while not last:
            # one update; None when it was skipped (a non-finite loss or gradient)
            out = self.step()
            if out is None:
                continue
            bar.update(1)
            # its figures added to its member's, on the device
            since.add(out)
            # a train record every run.log_interval updates: the only point figures leave the device
            if self.update % cfg.run.log_interval == 0:
                now = time.time()
                seconds, skipped = now - t_log, self.skipped_updates
                self.record(since.record(self.group, self.update, out["lr"], seconds, skipped))
                since, t_log = Tally.zero(prefixes, self.device), now
            # the end: optim.max_updates reached, or run.max_minutes spent
            last = self.update == cfg.optim.max_updates or self._out_of_time()
            if last:
                self._say_budget_spent("the last validation and checkpoint")
            # validation every run.valid_interval updates from run.valid_after on, and at the end
            if (
                self.update % cfg.run.valid_interval == 0 and self.update >= cfg.run.valid_after
            ) or last:
                record, figure = self.validate()
                higher = record.get("select_higher_is_better", True)
                record["best"] = self._keep_if_best(figure, higher)
                self.record(record)
                # the budget spent while validating: this update, just validated, is the last
                if not last and self._out_of_time():
                    last = True
                    self._say_budget_spent("its validation done; the last checkpoint")
                # early stopping: run.patience validations without a better dev figure
                if not last and self._out_of_patience():
                    last = True
                    self._say_patience_spent("the last checkpoint, then the model chosen")
                    self.record({"kind": "stopped", "update": self.update, "reason": "patience"})
            # a checkpoint every run.save_interval updates, after run.save_minutes, and at the end
            if self._save_due(last):
                self.save()
        bar.close()
        return self.finish()

    def _say_budget_spent(self, then: str) -> None:
        """Log (rank 0) that run.max_minutes ended the run at this update, and what follows it."""
        if self.update < self.cfg.optim.max_updates and self.group.rank == 0:
            log.info(
                "run.max_minutes=%g reached at update %d (%.1f min of training): %s, then the "
                "model chosen and tested, outside the budget",
                self.cfg.run.max_minutes,
                self.update,
                self._elapsed() / 60,
                then,
            )

    def _say_patience_spent(self, then: str) -> None:
        """Log (rank 0) that run.patience ended the run early at this update, and what follows."""
        if self.group.rank == 0:
            log.info(
                "run.patience=%d: %d validations without a better dev figure than update %d's "
                "(select %.4g, better %s): stopped at update %d; %s",
                self.cfg.run.patience,
                self.stale,
                self.best["update"],
                self.best["select"],
                "higher" if self.best.get("higher_is_better", True) else "lower",
                self.update,
                then,
            )

    def _out_of_time(self) -> bool:
        """True once run.max_minutes of training (across resumes) have passed by rank 0's clock."""
        if self.cfg.run.max_minutes <= 0:
            return False
        return self.group.rank0_says(self._elapsed() >= 60 * self.cfg.run.max_minutes)

    # -- the end: the model chosen on dev, then tested ------------------------------------------
    def finish(self) -> dict:
        """Select the model to test on the dev figure, then test every member (rank 0); returns
        what result.json records."""
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


def check_before_training(cfg, registry, quiet: bool = False) -> None:
    """What `Trainer.__init__` checks before its first update, without claiming the run
    directory or building the model: a new run's `run.init_from` source, the members with their
    data prepared (or found in the cache) and every dev and test pair fitting
    model.max_positions, and both precisions on the device. `s2s sweep` runs it for every
    variant before the first trains, so that a bad variant stops the sweep before, not half-way.
    """
    if cfg.run.init_from and not checkpoint.listed(Path(cfg.run.dir)):
        transfer.checked_source(cfg, registry)
    group = Group(cfg.run.device, cfg.run.timeout_minutes, cfg.run.wait_minutes)
    prepare_members(build_members(cfg, registry), cfg, group, quiet)
    precision.resolve(cfg.run.precision, group.device)
    precision.resolve_search(cfg.decode.precision, group.device)


def train(cfg, registry, quiet: bool = False) -> dict:
    """Train the run `cfg` describes to its end (`Trainer.run`); returns what result.json holds
    (on rank 0; the other processes' lack the test figures)."""
    trainer = None
    try:
        trainer = Trainer(cfg, registry, quiet)
        outcome = trainer.run()
        trainer.group.close()
        return outcome
    finally:
        if trainer is not None:
            trainer.close()
        if int(os.environ.get("WORLD_SIZE", 1)) > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
