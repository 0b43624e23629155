"""Starting a run from another run's weights (`run.init_from`): fine-tuning and transfer.

A new run (one with no checkpoint of its own yet) takes the model weights of the checkpoint
another run tested, or of a checkpoint file. Everything else starts fresh, as a new run does:
optimiser state, the schedule's step, the best-so-far dev figure and the data position; each can
be kept instead with `run.init_keep` (optimizer, schedule, best, data), which the `Trainer` takes
from the checkpoint `init_from` returns. Fresh is the default because a fine-tuning run usually
trains other data, often another task, and carrying Adam's moments, a decayed learning rate or
the old run's best figure into it is what fairseq's users most often have to undo by hand (its
--reset-* flags).

The model's shape must be the source's, but for the vocabulary: the rows of the embeddings and
of the output projection are copied by token string, each token the new run's vocabulary shares
with the source's taking the source's row, the others keeping their fresh initialisation. A
source with several members gives the rows of one of them (`run.init_member`); its task tokens
are not carried. Once the new run has saved a checkpoint it resumes from that, never again from
its source.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.idspace import N_SPECIAL
from ..data.members import build_members, load_vocabularies, pick
from ..errors import CheckpointError, ConfigError, UsageError
from ..nn.model import depths
from ..setup.config import load_config
from ..runs import checkpoint
from ..runs.directory import run_dir_of

log = logging.getLogger("s2s")

#: the parameters indexed by vocabulary rows, and the side each belongs to
VOCAB_ROWS = {
    "src_embed.weight": "src",
    "tgt_embed.weight": "tgt",
    "out.weight": "tgt",
    "out.bias": "tgt",
}
#: the model settings that decide a parameter's shape (pre_norm: the final LayerNorms, and what
#: every one normalises; activation: what the feed-forward weights were trained through)
SHAPE_KEYS = (
    "d_model",
    "d_ff",
    "heads",
    "d_k",
    "d_v",
    "positions",
    "max_positions",
    "tie_output",
    "pre_norm",
    "output_bias",
    "activation",
)


def tokens_of(vocab) -> list[str] | None:
    """The token string of every id of a vocabulary, or None when it does not say."""
    if hasattr(vocab, "itos"):
        return list(vocab.itos)
    if hasattr(vocab, "to_tokenizers"):
        by_id = {i: t for t, i in vocab.to_tokenizers().get_vocab().items()}
        return [by_id.get(i) for i in range(len(vocab))]
    return None


def rows(member, side: str) -> dict[str, int] | None:
    """Token string -> row of the run's space, for one member's source or target vocabulary."""
    vocab = member.task.src_vocab if side == "src" else member.task.tgt_vocab
    tokens = tokens_of(vocab)
    if tokens is None:
        return None
    offset = member.ids.src_offset if side == "src" else member.ids.tgt_offset
    return {t: (i + offset if i >= N_SPECIAL else i) for i, t in enumerate(tokens) if t is not None}


@dataclass
class Source:
    """The checkpoint run.init_from names, checked: its state, the member whose rows carry."""

    state: dict
    member: object


def checked_source(cfg, registry) -> Source:
    """The source run.init_from names, with every check that needs no model of this run (it
    exists and holds a checkpoint, its vocabulary files are those its weights were trained
    with, its shape is this run's, run.init_member names one of its members, run.init_keep's
    schedule leaves updates to train): a ConfigError
    naming run.init_from, before this run claims its directory or prepares its data."""
    where = cfg.run.init_from
    path = Path(where)
    try:
        run_dir = run_dir_of(path)
    except UsageError as e:
        raise ConfigError(f"run.init_from={where!r}: {e}") from None
    state, source_file = (
        checkpoint.tested(run_dir) if path.is_dir() else (checkpoint.load(path), path)
    )
    if state is None:
        raise ConfigError(f"run.init_from={where!r}: {run_dir} holds no checkpoint")
    done, most = state.get("update", 0), cfg.optim.max_updates
    if "schedule" in cfg.run.init_keep and done >= most:
        raise ConfigError(
            f"run.init_keep=[schedule]: the source {source_file} is at update {done}, already at "
            f"optim.max_updates={most}, so this run would train nothing; raise optim.max_updates "
            "above it (the updates count on from the source's) or drop schedule from run.init_keep"
        )
    # the source's vocabulary files must be those its weights were trained with, as generate
    # checks: with another one, its rows would carry other words (issue 43)
    try:
        checkpoint.check_tokenizer_files(state, run_dir, source_file)
    except CheckpointError as e:
        raise ConfigError(f"run.init_from={where!r}: {e}") from None
    registry.adopt(checkpoint.task_origins(run_dir), run_dir)  # its tasks, without --plugin
    source_cfg = load_config(run_dir / "config.yaml", registry=registry)
    mine, theirs = depths(cfg.model), depths(source_cfg.model)
    if mine != theirs and len(set(mine)) == len(set(theirs)) == 1:  # alike stacks: model.layers
        raise ConfigError(
            f"run.init_from={where!r}: the stacks have {theirs[0]} layers there and {mine[0]} "
            f"here; set model.layers={theirs[0]} (the weights have the source's shape)"
        )
    for key, mine, theirs in zip(("encoder_layers", "decoder_layers"), mine, theirs):
        if mine != theirs:
            raise ConfigError(
                f"run.init_from={where!r}: the {key.split('_')[0]} has {theirs} layers there and "
                f"{mine} here; set model.{key}={theirs} (the weights have the source's shape)"
            )
    for key in SHAPE_KEYS:
        mine, theirs = cfg.model.get(key), source_cfg.model.get(key)
        if mine != theirs:
            raise ConfigError(
                f"run.init_from={where!r}: model.{key} is {theirs!r} there and {mine!r} here; "
                f"set model.{key}={theirs} (the weights have the source's shape)"
            )
    sources = build_members(source_cfg, registry)
    load_vocabularies(sources, run_dir)
    try:
        source = pick(sources, cfg.run.init_member or None)
    except ConfigError as e:
        raise ConfigError(
            f"run.init_from={where!r}: {e}".replace("--task", "run.init_member")
        ) from None
    return Source(state, source)


def init_from(model: torch.nn.Module, members, cfg, source: Source) -> dict:
    """Load the weights of the checked `source` (run.init_from) into `model` (the new run's,
    over `members`' id space) and return its checkpoint, whose other parts run.init_keep may
    take."""
    where, state, source = cfg.run.init_from, source.state, source.member
    theirs, mine = state["model"], model.state_dict()
    loaded, carried = {}, {}
    for name, tensor in mine.items():
        if name not in theirs:
            raise ConfigError(f"run.init_from={where!r}: the source has no parameter {name}")
        if name not in VOCAB_ROWS:
            if theirs[name].shape != tensor.shape:
                raise ConfigError(
                    f"run.init_from={where!r}: {name} is {list(theirs[name].shape)} there and "
                    f"{list(tensor.shape)} here"
                )
            loaded[name] = theirs[name]
            continue
        side = VOCAB_ROWS[name]
        new = tensor.clone()
        old_rows, copied = rows(source, side), 0
        for m in members:
            new_rows = rows(m, side)
            if old_rows is None or new_rows is None:
                raise ConfigError(
                    f"run.init_from={where!r}: task {m.name!r} or the source cannot list its "
                    "tokens (a Vocabulary without itos or to_tokenizers), so rows cannot be matched"
                )
            for token, row in new_rows.items():
                if token in old_rows and old_rows[token] < theirs[name].size(0):
                    new[row] = theirs[name][old_rows[token]]
                    copied += 1
        loaded[name] = new
        carried[side] = (copied, new.size(0))
    model.load_state_dict(loaded)
    log.info(
        "run.init_from %s (%s): every weight carried; vocabulary rows carried by token: source %d "
        "of %d, target %d of %d (the others fresh)",
        where,
        source.name,
        *carried.get("src", carried["tgt"]),
        *carried["tgt"],
    )
    return state
