"""Outside formats, one module a format holding both its directions where both exist: `marian`
(OPUS-MT), `m2m100` (NLLB-200, M2M100), `fairseq`, `huggingface`, `ctranslate2`,
`safetensors`; what they share is in `common`, and no format module imports another. This
package is the two commands' front door.

`s2s import SOURCE --output RUN_DIR` reads an OPUS-MT model (Hugging Face's MarianMTModel
layout, from a folder or by hub name: `marian`), an NLLB-200 or M2M100 model (`m2m100`), an
`s2s export --to huggingface` of a run s2s trained (`huggingface.read_export`), or a fairseq
Transformer checkpoint with its dictionaries and BPE codes (`fairseq`). It writes what
`s2s train` would have: config.yaml, the vocabulary files and one checkpoint, so that
generate, serve, score, export, attention, label and `run.init_from` take it as any other
run. The config's `origin` records the source, its revision and every file read with its
SHA-256. The run directory is written into
`.NAME.tmpPID` beside it and renamed at the end: a failed import leaves nothing. What maps and
what is refused: docs/pretrained.md.

`s2s export RUN_DIR --to FORMAT --output DIR` (`export`) reads the run the way `s2s generate
RUN_DIR` does (its config.yaml, vocabulary and the checkpoint `s2s train` tested, which
result.json names, else checkpoint_average.pt, else the newest checkpoint: `checkpoint.tested`)
and writes it as safetensors, CTranslate2 or Hugging Face's MarianMTModel (an imported OPUS-MT
model in its own form). Every export folder holds `s2s_export.json` (MARKER): the format, the
source run and the files written. `--force` replaces a folder only when it is empty or holds one
such export and nothing else; the run directory, a folder that contains it and a folder with
other files are refused. The export is written into `.DIR.tmpPID` beside DIR and renamed at the
end.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from ...tokenizers import MosesBPE, Pieces
from ...data.members import build_members
from ...errors import ExportError, ImportModelError
from ...files import output_folder, remove_stale_temporaries, sha256
from ...nn.model import Transformer
from ...setup.config import load_config
from ...runs import checkpoint
from . import ctranslate2, fairseq, huggingface, m2m100, marian, safetensors
from .common import MARKER, ImportJob
from .ctranslate2 import QUANTIZATIONS

__all__ = ["ExportJob", "ImportJob", "export", "import_model"]

FILES = {Pieces.KIND: Pieces.FILES, MosesBPE.KIND: MosesBPE.FILES}  # the vocabularies' files
FORMATS = ("ctranslate2", "huggingface", "safetensors")  # what `s2s export --to` writes


def import_model(job: ImportJob, registry) -> Path:
    """Write the run directory `job.output` for the model at `job.source`; returns it."""
    out = Path(job.output)
    if out.exists() or out.is_symlink():
        raise ImportModelError(f"--output {out} exists: import into a new run directory")
    path = Path(job.source)
    if job.revision is not None and (path.exists() or path.is_symlink()):
        raise ImportModelError(
            f"--revision {job.revision}: {path} is a local {'folder' if path.is_dir() else 'file'}"
            ", which has no revisions; --revision names a version of a hub model (OWNER/NAME)"
        )
    if path.is_dir() and (path / "config.yaml").is_file():
        raise ImportModelError(
            f"{path} holds config.yaml: an s2s run directory, which every command takes as it is "
            f"(s2s generate {path} --input FILE); import reads models trained elsewhere"
        )
    is_fairseq = path.suffix == ".pt" or (path.is_dir() and fairseq.checkpoint_in(path) is not None)
    ours = path.is_dir() and (path / MARKER).is_file() and not (path / "source.spm").is_file()
    ours = ours and not m2m100.is_m2m100(path)  # an import's export: read as its class
    if is_fairseq or ours:
        found = fairseq.read(job) if is_fairseq else huggingface.read_export(path)
    else:
        folder, revision = marian.resolve(job)  # a folder, or a hub model fetched
        found = m2m100.read(job, folder, revision) if m2m100.is_m2m100(folder) else marian.read(job)
    found.config["run"] = {"dir": str(out)}
    if found.config["task"].get("tokenizer") in FILES:  # where fine-tuning reads it
        found.config["task"]["vocab_from"] = str(out.resolve())
    cfg = load_config(None, _as_overrides(found.config), registry=registry)
    cfg.origin = found.origin
    src, tgt = found.src_vocab, found.tgt_vocab
    shared = src is tgt or getattr(src, "id_space", None) == getattr(tgt, "id_space", 0)
    with _Shapes():  # the parameters' names, shapes and ties, and no memory
        model = Transformer(cfg.model, len(src), len(tgt), shared)
    weights = _placed(model, found.state(model), found)
    _write_run(out, cfg, weights, src, tgt, registry)
    return out


class _Shapes(torch.overrides.TorchFunctionMode):
    """While it is on, torch.empty makes tensors on the meta device (shapes without memory:
    the parameters of torch's layers are made by it) and torch.nn.init's functions leave their
    tensor as it is: a Transformer built then has its parameters' names, shapes and ties, what
    an import places the source's tensors by, and holds no weights. The rest (the position
    table, a buffer) is made as ever: on the meta device, computing it would go through torch's
    reference operations, whose import (torch._dynamo) costs seconds and 100 MB."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty:
            kwargs["device"] = "meta"
        elif getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _placed(model: Transformer, state: dict, found) -> dict:
    """The checkpoint's model state: the imported tensors under the keys, in the order and with
    the ties of `model`'s own state dict (its parameters on the meta device: no memory), each
    tensor moved into place once, not copied into a model first. The import thus holds the run's
    weights and, while they are made, one of the source's tensors at a time, never the source,
    a model and the checkpoint's copy at once. A missing, an unexpected or a misshapen tensor is
    refused as load_state_dict refuses it; a tied tensor (one matrix under several names) is
    stored once, as the model's state dict holds it."""
    wanted = model.state_dict(keep_vars=True)  # the Parameters themselves: ties by identity
    missing = [k for k in wanted if k not in state]
    unexpected = [k for k in state if k not in wanted]
    misfit = [k for k in wanted if k in state and state[k].shape != wanted[k].shape]

    def refuse(what):
        raise ImportModelError(
            f"{found.weights_file}: the weights do not fit {found.config_file} ({what})"
        )

    if missing or unexpected:
        refuse(f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    if misfit:
        k = misfit[0]
        refuse(f"{k!r} has shape {list(state[k].shape)}, the model needs {list(wanted[k].shape)}")
    placed = model.state_dict()  # the same keys, order and metadata that load_state_dict reads
    first = {}
    for key, param in wanted.items():
        owner = first.setdefault(id(param), key)
        if owner != key:
            placed[key] = placed[owner]
            continue
        tensor = state[key].detach().to(param.dtype)
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone(memory_format=torch.contiguous_format)  # a view: not its memory
        placed[key] = tensor
    return placed


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


def _write_run(out: Path, cfg, weights: dict, src_vocab, tgt_vocab, registry) -> None:
    """config.yaml, the vocabulary files and checkpoints/checkpoint_00000000.pt holding
    `weights` (the model's state dict; torch.save writes each tensor's memory as it is, no copy),
    written into `.NAME.tmpPID` beside `out` and renamed at the end: a failed import leaves
    nothing."""
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
            "model": weights,
            "update": 0,
            "tokenizer": {"files": files},
            "config": OmegaConf.to_container(cfg, enum_to_str=True),
            "tasks": [cfg.task.name],
        }
        checkpoint.save(state, tmp, 0, keep_last=1)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class ExportJob:
    """One `s2s export`: the run, the format (`FORMATS`), the output folder, CTranslate2's
    quantization (`QUANTIZATIONS`; None: its default), and whether a previous export there may
    be replaced."""

    run_dir: str
    to: str
    output: str
    quantization: str | None = None
    force: bool = False


def export(job: ExportJob, registry) -> Path:
    """Write the run's model (what `s2s generate RUN_DIR` decodes with) in format `job.to` into
    `job.output`."""
    from ...runs.directory import run_dir_of
    from .. import load_for_inference

    run_dir, to, output, quantization = job.run_dir, job.to, job.output, job.quantization

    if to not in FORMATS:
        raise ExportError(f"unknown export format {to!r}: choose one of {', '.join(FORMATS)}")
    if quantization is not None and to != "ctranslate2":
        raise ExportError(f"--quantization applies to --to ctranslate2 only, not {to}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ExportError(
            f"unknown quantization {quantization!r}: choose one of {', '.join(QUANTIZATIONS)}"
        )
    out = Path(output)
    replaceable(out, run_dir_of(run_dir), job.force)
    config = Path(run_dir) / "config.yaml"
    if config.is_file() and OmegaConf.load(config).get("tasks"):
        raise ExportError(
            f"{run_dir} is a multi-task run: export takes single-task runs (the formats "
            "have no place for the members' task tokens and joined vocabularies)"
        )
    # the weights as trained (fp32), whatever precision the run searches in
    overrides = ["run.device=cpu", "decode.precision=fp32"]
    cfg, member, model = load_for_inference(run_dir, registry, overrides)
    task = member.task
    # written beside `output` and renamed at the end: a failed export leaves `output` as it was
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out.parent)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        if to == "safetensors":
            safetensors.save_safetensors(model, cfg, task, tmp)
        elif to == "ctranslate2":
            ctranslate2.to_ctranslate2(model, task, tmp, quantization)
        elif m2m100.numbered(task.src_vocab):  # an NLLB-200 / M2M100 import: its own class
            m2m100.to_m2m100(model, cfg, task, tmp)
        elif isinstance(task.src_vocab, Pieces):  # an OPUS-MT import: back in its own form
            marian.to_marian(model, cfg, task, tmp)
        else:
            huggingface.to_huggingface(model, cfg, task, tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        marker = {"format": to, "source": str(run_dir_of(run_dir).resolve()), "files": files}
        # what `s2s import` needs to make the run again from a Hugging Face export: the run's
        # own settings (the export decodes in fp32 on the CPU whatever the run's are)
        own = OmegaConf.load(run_dir_of(run_dir) / "config.yaml")
        sections = ("task", "model", "decode")
        marker["config"] = {k: OmegaConf.to_container(own[k], enum_to_str=True) for k in sections}
        (tmp / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
        if out.exists():
            replaceable(
                out, run_dir_of(run_dir), job.force
            )  # again: nothing came into it meanwhile
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def replaceable(out: Path, run_dir: Path, force: bool) -> None:
    """Refuse an --output that an export may not write: a file, the run directory or a folder
    that contains it; a non-empty folder without --force; with --force, a folder holding
    anything but one previous export (its MARKER and the files the marker lists)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ExportError(
            f"{out} is {'a link' if out.is_symlink() else 'a file'}, not a folder to export into"
        )
    target, run = out.resolve(), run_dir.resolve()
    if target == run or target in run.parents:
        raise ExportError(
            f"--output {out} {'is' if target == run else 'contains'} the run directory {run_dir}: "
            "export into a folder of its own"
        )
    output_folder(out, "--output")  # not below a file, nor a run's own folder
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ExportError(
            f"{out} exists and is not empty (use --force to replace a previous export)"
        )
    try:
        listed = json.loads((out / MARKER).read_text(encoding="utf-8"))["files"]
        allowed = {MARKER, *listed} | {
            parent.as_posix() for f in listed for parent in Path(f).parents
        }
    except (OSError, ValueError, KeyError, TypeError):
        raise ExportError(
            f"--force: {out} holds no previous s2s export ({MARKER}): "
            "refusing to delete a folder s2s did not write; choose another --output"
        ) from None
    other = sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*")
        if p.relative_to(out).as_posix() not in allowed
    )
    if other:
        raise ExportError(
            f"--force: {out} holds "
            f"{other[0]}{f' and {len(other) - 1} more' if len(other) > 1 else ''}, which no "
            "previous export wrote: refusing to delete it; move it or choose another --output"
        )
