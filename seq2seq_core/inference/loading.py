"""Inference: a trained model from its run directory, and source lines turned into output lines.

`load_for_inference` reads a run directory (or a checkpoint in one) back into the config, the
task and the model. `hypotheses` is what `s2s generate`, validation and test evaluation share: encode the sources,
decode them in batches of similar length with the task's defaults (overridden by the decode
section) and turn ids back into text. `decode_sources` applies the task's post-processing to them
(`s2s generate`); validation and test hand `Task.score` the hypotheses with their sources, so
that a task counts what its post-processing did there, and `postprocess` keeps no state.
Input typed by a person (`s2s generate`, the server) goes through the task's `prepare_source`
first (`prepared_sources`: parsing tokenises raw text); words the vocabulary lacks are named (`unknown_words`).
`load_run` is the public way to a run's model and decoding settings (docs/export.md uses it).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Sequence

from ..data.members import (
    Member,
    build_members,
    decode_settings,
    load_vocabularies,
    pick,
)
from ..decode.batched import decode_sources
from ..errors import CheckpointError
from ..nn import precision
from ..nn.model import Transformer
from ..setup.config import load_config
from ..task import DecodeDefaults, Task
from ..training import checkpoint
from ..training.agreement import Read, check_config, check_members
from ..training.distributed import resolve_device
from ..training.rundir import run_dir_of

log = logging.getLogger("s2s")


def load_for_inference(path: str | Path, registry, overrides=(), task: str | None = None):
    """(cfg, member, model) from a run directory (the checkpoint its run tested) or a checkpoint
    file inside one. The member is the run's task `task` (None: its only one) in the run's id
    space, which `decode_sources` serves as it serves a task; the model is on the configured device,
    in decode.precision, in eval mode."""
    p = Path(path)
    run_dir = run_dir_of(p)
    # checked against today's schema: settings added since the run was trained take their defaults
    cfg = load_config(run_dir / "config.yaml", list(overrides), registry=registry)
    members = build_members(cfg, registry)
    member = pick(members, task)
    if p.is_dir():
        state, p = checkpoint.tested(run_dir)
        if state is None:
            raise CheckpointError(f"{run_dir} holds no checkpoint")
    else:
        state = checkpoint.load(p)
    # the run directory's files must be those the weights were trained with (issue 24)
    read = Read(state, p, run_dir)
    check_config(cfg, members, read, overrides)
    check_members(members, read)
    checkpoint.check_tokenizer_files(state, run_dir, p)
    sizes = load_vocabularies(members, run_dir)  # the run's id space
    model = Transformer(cfg.model, *sizes)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(
            f"the checkpoint in {p} does not fit {run_dir / 'config.yaml'} "
            f"({(str(e).splitlines() or [''])[0]})"
        ) from None
    device = resolve_device(cfg.run.device)
    model.to(device).eval()
    log.info("loaded %s (update %s)", p, state.get("update", "?"))
    return (
        cfg,
        member,
        precision.for_inference(
            model, precision.resolve(cfg.decode.precision, device, "decode.precision")
        ),
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """A trained run ready to decode: what `load_run` returns."""

    cfg: object  # the run's config (with the overrides)
    member: (
        Member  # the run's task (of a multi-task run: the member asked for) in the run's id space
    )
    model: Transformer  # on cfg.run.device, in decode.precision, in eval mode
    settings: DecodeDefaults  # beam, alpha, max_len_a, max_len_b, stop: the task's defaults with the decode section's

    @property
    def task(self) -> Task:
        """The task itself: its tokenisation (`prepare_source`, `encode_source`), its `tokenizers()`."""
        return self.member.task

    def max_length(self, source_tokens: int) -> int:
        """The most target tokens `s2s generate` writes (before its </s>) for a source of
        `source_tokens` ids (its </s> included): int(max_len_a * n + max_len_b), at most
        model.max_positions - 1."""
        n = int(self.settings.max_len_a * source_tokens + self.settings.max_len_b)
        return max(0, min(n, self.model.max_positions - 1))

    def generate(self, lines: Sequence[str]) -> list[str]:
        """`s2s generate`'s output lines for input lines (raw text, prepared by the task)."""
        return decode_sources(
            self.model,
            self.member,
            lines,
            self.settings,
            next(self.model.parameters()).device,
            self.cfg.decode.max_sentences,
            raw=True,
        )


def load_run(
    path: str | Path,
    overrides: Sequence[str] = (),
    task: str | None = None,
    plugins: Sequence[str] = (),
) -> Run:
    """The run at `path` (a run directory of `s2s train`, or a checkpoint file in one) as
    `s2s generate PATH key=value ...` loads it: the checkpoint the run tested, the config with
    `overrides` (e.g. "decode.beam=1", "run.device=cpu"), the member `task` of a multi-task run,
    tasks registered by the installed plugins and `plugins` (as --plugin takes them)."""
    from ..setup.registry import Registry

    cfg, member, model = load_for_inference(
        path, Registry.installed(list(plugins)), overrides, task
    )
    return Run(cfg, member, model, decode_settings(member, cfg.decode))
