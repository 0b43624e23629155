"""Importers: a model the field trained elsewhere as an s2s run directory.

`s2s import SOURCE --output RUN_DIR` reads an OPUS-MT model (Hugging Face's MarianMTModel
layout, from a folder or by hub name: `marian`), an `s2s export --to huggingface` of a run s2s
trained (`marian.read_export`), a fairseq Transformer checkpoint with its dictionaries and
BPE codes (`fairseq`), or an NLLB-200 / M2M100 model (s2s.core.inference.formats.m2m100). It writes what `s2s train` would have: config.yaml, the vocabulary files
and one checkpoint, so that generate, serve, score, export, attention, label and
`run.init_from` take it as any other run. The config's `origin` records the source, its
revision and every file read with its SHA-256. The run directory is written into
`.NAME.tmpPID` beside it and renamed at the end: a failed import leaves nothing. What maps and
what is refused: docs/pretrained.md.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from omegaconf import OmegaConf

from ...data import moses_bpe, pieces
from ...data.members import build_members
from ...errors import ImportModelError
from ...files import remove_stale_temporaries, sha256
from ...nn.model import Transformer
from ...setup.config import load_config
from ...runs import checkpoint
from ..export import MARKER
from ..formats import m2m100
from . import fairseq, marian
from .common import ImportJob

FILES = {pieces.KIND: pieces.FILES, moses_bpe.KIND: moses_bpe.FILES}  # the vocabularies' files


def import_model(job: ImportJob, registry) -> Path:
    """Write the run directory `job.output` for the model at `job.source`; returns it."""
    out = Path(job.output)
    if out.exists() or out.is_symlink():
        raise ImportModelError(f"--output {out} exists: import into a new run directory")
    path = Path(job.source)
    is_fairseq = path.suffix == ".pt" or (path.is_dir() and fairseq.checkpoint_in(path) is not None)
    ours = path.is_dir() and (path / MARKER).is_file() and not (path / "source.spm").is_file()
    if is_fairseq or ours:
        found = fairseq.read(job) if is_fairseq else marian.read_export(path)
    else:
        folder, revision = marian.resolve(job)
        found = m2m100.read(job, folder, revision) if m2m100.is_m2m100(folder) else marian.read(job)
    found.config["run"] = {"dir": str(out)}
    if found.config["task"].get("tokenizer") in FILES:  # where fine-tuning reads it
        found.config["task"]["vocab_from"] = str(out.resolve())
    cfg = load_config(None, _as_overrides(found.config), registry=registry)
    cfg.origin = found.origin
    src, tgt = found.src_vocab, found.tgt_vocab
    shared = src is tgt or getattr(src, "id_space", None) == getattr(tgt, "id_space", 0)
    model = Transformer(cfg.model, len(src), len(tgt), shared)
    state = found.state(model)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ImportModelError(
            f"{found.weights_file}: the weights do not fit {found.config_file} "
            f"({(str(e).splitlines() or [''])[0]})"
        ) from None
    _write_run(out, cfg, model, src, tgt, registry)
    return out


def _as_overrides(cfg: dict) -> list[str]:
    """A config dict as the `key=value` overrides that load_config types and checks."""
    out = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            out.append(f"{prefix}={str(value).lower() if isinstance(value, bool) else value}")

    walk("", cfg)
    return out


def _write_run(out: Path, cfg, model, src_vocab, tgt_vocab, registry) -> None:
    """config.yaml, the vocabulary files and checkpoints/checkpoint_00000000.pt, written into
    `.NAME.tmpPID` beside `out` and renamed at the end: a failed import leaves nothing."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        [member] = build_members(cfg, registry)
        member.task.src_vocab, member.task.tgt_vocab = src_vocab, tgt_vocab
        member.task.save_vocab(tmp)  # the files, and their names, the task reads back
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / "config.yaml").write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
        state = {
            "model": model.state_dict(),
            "update": 0,
            "tokenizer": {"files": files},
            "config": OmegaConf.to_container(cfg, enum_to_str=True),
            "tasks": [cfg.task.name],
        }
        checkpoint.save(state, tmp, 0, keep_last=1)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
