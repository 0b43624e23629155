"""Checkpoints in a run directory: atomic writes, the last K kept, fall-back, averaging.

A checkpoint is one file `checkpoints/checkpoint_{update:08d}.pt` holding the model, optimiser,
update count, data position, RNG states, config and tokenizer reference. It is written to a
temporary name, fsynced and renamed, so a crash leaves the old file or the new one, never half
of one. It is read with torch.load(weights_only=True), so loading one never executes pickled
code, after every entry of the file has passed its CRC-32 check (torch.load alone reads a file
with flipped bytes without complaint). Averaging follows section 6.1: the element-wise mean of
the parameters of the last 5 (base) or 20 (big) checkpoints. Beside them a run keeps
`checkpoint_best.pt`, its validated model with the best dev figure (the highest, or the lowest
where the task's score is better lower: `Score.higher_is_better`, recorded beside the figure);
at the end it tests whichever of the two scores better on dev, and names it in result.json
(`checkpoint`).

The vocabulary files a run's checkpoints were trained with are part of them: written into the
run directory with their SHA-256 recorded in every checkpoint (`save_tokenizer`), and checked
against it before a checkpoint is decoded with (`check_tokenizer_files`). So is where each task
came from (`s2s.core.setup.registry`'s records: an entry point, `module:Class`, or a plugin file
with its SHA-256): in every checkpoint and in RUN_DIR/task_origins.json (`task_origins`), which
the commands that use a run read to load its tasks without `--plugin`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import zipfile
from pathlib import Path

import torch

from ..errors import CheckpointError, TrainingError, UsageError
from ..files import (
    output_file,
    remove_stale_temporaries,
    replaced_file,
    replacing,
    sha256,
    writable,
)

log = logging.getLogger("s2s")
PATTERN = re.compile(r"checkpoint_(\d{8})\.pt$")
AVERAGE = "checkpoint_average.pt"  # RUN_DIR/: the mean of the last run.average_last checkpoints
BEST = "checkpoint_best.pt"  # RUN_DIR/: the validated model with the best dev figure
ORIGINS = "task_origins.json"  # RUN_DIR/: task name -> where it came from (a registry record)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def listed(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    d = checkpoint_dir(run_dir)
    return (
        sorted(p for p in d.glob("checkpoint_*.pt") if PATTERN.search(p.name)) if d.is_dir() else []
    )


def atomic_save(obj, path: Path) -> None:
    """torch.save `obj` to `path` whole (`files.replacing`): the old file or the new."""
    ser = torch.serialization
    crc = ser.get_crc32_options() if hasattr(ser, "get_crc32_options") else None
    if crc is False:
        ser.set_crc32_options(True)  # `load` checks every entry against its CRC
    try:
        with replacing(path, "wb") as f:
            torch.save(obj, f)
    finally:
        if crc is False:
            ser.set_crc32_options(False)


def save(state: dict, run_dir: Path, update: int, keep_last: int) -> Path:
    """Write checkpoint_{update}.pt, then delete all but the newest `keep_last` (0 = keep all)."""
    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    for stale in d.glob(".checkpoint_*.pt.tmp*"):  # left by a process killed while saving
        stale.unlink(missing_ok=True)
    path = d / f"checkpoint_{update:08d}.pt"
    atomic_save(state, path)
    for old in listed(run_dir)[:-keep_last] if keep_last > 0 else []:
        old.unlink()
    return path


def load(path: Path) -> dict:
    """A checkpoint's contents; a truncated or damaged file raises CheckpointError naming it."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            raise CheckpointError(f"checkpoint {path} is damaged: entry {bad} fails its CRC check")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except FileNotFoundError:
        raise
    except Exception as e:  # zipfile.BadZipFile, EOFError, unpickling errors, ...
        raise CheckpointError(f"checkpoint {path} is unreadable: {type(e).__name__}: {e}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"checkpoint {path} holds no model state")
    return state


def load_latest(run_dir: Path, set_aside: bool = False) -> tuple[dict, Path] | tuple[None, None]:
    """The newest checkpoint that reads back; a damaged one is reported by name and passed over.

    With `set_aside`, each damaged file newer than the one returned is renamed to *.damaged, so
    that neither a later resume nor averaging picks it up again.
    """
    for path in reversed(listed(run_dir)):
        try:
            return load(path), path
        except CheckpointError as e:
            if set_aside:
                aside = path.with_name(path.name + ".damaged")
                os.replace(path, aside)
                log.warning(
                    "%s; moved it to %s and falling back to the previous checkpoint", e, aside.name
                )
            else:
                log.warning("%s; falling back to the previous checkpoint", e)
    return None, None


def resume(run_dir: Path, group) -> tuple[dict | None, Path | None]:
    """The checkpoint a run continues from, which rank 0 picks (`load_latest`, damaged files
    set aside) and every process reads; (None, None) for a new run. A run that has checkpoints
    or has finished (result.json) but has no readable checkpoint is an error, not a fresh start
    that would overwrite its history."""
    found = [None, None]

    def pick():
        had = [p.name for p in listed(run_dir)]
        found[:] = load_latest(run_dir, set_aside=True)
        history = had + (["result.json"] if (Path(run_dir) / "result.json").is_file() else [])
        if found[1] is None and history:
            raise TrainingError(
                f"{run_dir} has trained before ({', '.join(history[:3])}) but holds no readable "
                f"checkpoint in {checkpoint_dir(run_dir)}: restore one, or train in a new run.dir"
            )
        return None if found[1] is None else str(found[1])

    path = group.agreed(pick, rank0_only=True)
    if path is None:
        return None, None
    return (found[0] if group.rank == 0 else load(path)), Path(path)


def tested(run_dir: Path) -> tuple[dict, Path] | tuple[None, None]:
    """(contents, path) of the checkpoint a run directory stands for: the one `s2s train`
    tested (result.json's "checkpoint"), else the average, else the newest readable one."""
    run_dir = Path(run_dir)
    result = run_dir / "result.json"
    if result.is_file():
        try:
            name = json.loads(result.read_text()).get("checkpoint")
        except (ValueError, AttributeError):
            name = None
            log.warning("%s is unreadable: using the average or the newest checkpoint", result)
        if name and (run_dir / name).is_file():
            return load(run_dir / name), run_dir / name
        if name:
            log.warning(
                "%s names %s, which is gone: using the average or the newest checkpoint",
                result,
                name,
            )
    if (run_dir / AVERAGE).is_file():
        return load(run_dir / AVERAGE), run_dir / AVERAGE
    return load_latest(run_dir)


def task_origins(run_dir: Path) -> dict:
    """Where each task of a run came from, {task name: record} as RUN_DIR/task_origins.json
    holds it ({} for a run written before runs recorded it); a damaged file is a CheckpointError
    naming it."""
    path = Path(run_dir) / ORIGINS
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        raise CheckpointError(
            f"{path} is unreadable ({e}): it says where the run's tasks came from; delete it and "
            "pass --plugin MODULE:CLASS|FILE.py"
        ) from None
    if not isinstance(found, dict):
        raise CheckpointError(
            f"{path} holds {type(found).__name__}, not an object of task origins; delete it and "
            "pass --plugin MODULE:CLASS|FILE.py"
        )
    return found


def tokenizer_files(state: dict) -> dict:
    """The vocabulary files a checkpoint was trained with, {path in the run directory: sha256}
    ({} for a checkpoint that records none)."""
    tokenizer = state.get("tokenizer")
    files = tokenizer.get("files") if isinstance(tokenizer, dict) else None
    return dict(files) if isinstance(files, dict) else {}


def check_tokenizer_files(state: dict, run_dir: Path, path: Path) -> None:
    """A CheckpointError naming the first vocabulary file recorded in `state` (the checkpoint at
    `path`) that is missing from `run_dir` or whose SHA-256 differs: with another vocabulary the
    model's rows are other words."""
    for name, digest in sorted(tokenizer_files(state).items()):
        file = Path(run_dir) / name
        if not file.is_file():
            raise CheckpointError(
                f"{file} is missing: checkpoint {path} was trained with it (the vocabulary "
                "of its rows); restore it from a copy of the run directory"
            )
        try:
            now = sha256(file)
        except OSError as e:
            raise CheckpointError(
                f"{file}: cannot read the vocabulary checkpoint {path} was trained with: "
                f"{e.strerror or e}"
            ) from None
        if now != digest:
            raise CheckpointError(
                f"{file} differs from the vocabulary checkpoint {path} was trained with "
                f"(sha256 {now[:12]}..., not {str(digest)[:12]}...): its rows would be other "
                "words; restore the file the run wrote"
            )


def average(paths: list[Path]) -> dict:
    """Element-wise mean of the model parameters of `paths`. The other entries are the newest
    input's (the highest update: its update, data position, member updates, best figure), so
    that what is kept from an average (a schedule) continues from where its last input was;
    `averaged` names the inputs and `averaged_updates` their updates.

    Checkpoints of models of other shapes, or trained with other vocabularies (the hashes of the
    tokenizer files they record), are refused, naming both files: their rows mean other words."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    first = load(paths[0])
    newest, updates = {k: v for k, v in first.items() if k != "model"}, [first.get("update")]
    total = {
        k: v.double().clone() if v.is_floating_point() else v for k, v in first["model"].items()
    }
    vocab = (
        (first.get("tokenizer") or {}).get("files")
        if isinstance(first.get("tokenizer"), dict)
        else None
    )
    for path in paths[1:]:
        state = load(path)
        model = state["model"]
        if model.keys() != total.keys():
            raise CheckpointError(
                f"{path} holds other parameters than {paths[0]}: models of different "
                "configs cannot be averaged"
            )
        for k, v in model.items():
            if v.shape != total[k].shape:
                raise CheckpointError(
                    f"{path} and {paths[0]} hold models of different shapes ({k}: "
                    f"{list(v.shape)} and {list(total[k].shape)}): different configs or "
                    "vocabularies cannot be averaged"
                )
        other = (
            (state.get("tokenizer") or {}).get("files")
            if isinstance(state.get("tokenizer"), dict)
            else None
        )
        if vocab and other and vocab != other:
            differ = sorted(n for n in set(vocab) | set(other) if vocab.get(n) != other.get(n))
            raise CheckpointError(
                f"{path} and {paths[0]} were trained with different vocabularies "
                f"({', '.join(differ)} {'differs' if len(differ) == 1 else 'differ'}): "
                "their rows are different words"
            )
        for k, v in model.items():
            if v.is_floating_point():
                total[k] += v.double()
        updates.append(state.get("update"))
        if isinstance(state.get("update"), int) and state["update"] > (newest.get("update") or 0):
            newest = {k: v for k, v in state.items() if k != "model"}
    n = len(paths)
    averaged = {
        **newest,
        "model": {
            k: (v / n).to(first["model"][k].dtype) if v.is_floating_point() else v
            for k, v in total.items()
        },
        "averaged": [str(p) for p in paths],
        "averaged_updates": updates,
    }
    for key in ("optimizer", "scaler", "rng"):  # they belong to one point of training, not the mean
        averaged.pop(key, None)
    return averaged


def described(state: dict) -> str:
    """How a loaded checkpoint is named in the log: its update, or an average's inputs."""
    updates = [u for u in state.get("averaged_updates") or [] if isinstance(u, int)]
    if state.get("averaged") and updates:
        return (
            f"the average of {len(state['averaged'])} checkpoints, updates {min(updates)} to "
            f"{max(updates)}"
        )
    return f"update {state.get('update', '?')}"


def average_files(
    inputs: list[str], last: int | None, output: str | None
) -> tuple[list[Path], Path]:
    """`s2s average`: the mean of checkpoint files `inputs`, or of the `last` K of one run
    directory, written to `output` (default RUN_DIR/checkpoint_average.pt, or
    ./checkpoint_average.pt); never over one of its inputs, a rolling checkpoint or a run's best
    model. Returns (the checkpoints averaged, the file written)."""
    if last is not None:
        if last < 1:
            raise UsageError(f"--last {last}: must be a number >= 1")
        if len(inputs) != 1 or not Path(inputs[0]).is_dir():
            raise UsageError("--last K takes one run directory")
        paths = listed(Path(inputs[0]))[-last:]
        if not paths:
            raise UsageError(f"{inputs[0]} holds no checkpoints (checkpoints/checkpoint_*.pt)")
        if len(paths) < last:
            log.warning("only %d checkpoints in %s", len(paths), inputs[0])
    else:
        paths = [Path(p) for p in inputs]
        for p in paths:
            if not p.is_file():
                raise UsageError(f"{p}: no such checkpoint file")
    given = Path(output or (Path(inputs[0]) / AVERAGE if last else AVERAGE))
    writable(given, "--output")
    out = (replaced_file(given) or given) if given.is_symlink() else given  # a link: its target
    for p in paths:  # no command writes over its own inputs
        if out.exists() and out.samefile(p):
            raise UsageError(f"--output {out} is the input {p}: write the average elsewhere")
    if out.parent.name == "checkpoints" and PATTERN.fullmatch(out.name):
        raise UsageError(
            f"--output {out} is named like a rolling checkpoint in {out.parent}, which "
            "training deletes, resumes from and averages: write the average elsewhere"
        )
    if out.name == BEST and (out.parent / "config.yaml").is_file():
        raise UsageError(
            f"--output {out} is the run's best validated model: write the average elsewhere"
        )
    tested_file = _tested_file(out)
    if tested_file is not None and out.exists() and out.samefile(tested_file):
        raise UsageError(
            f"--output {out} is the model its run's result.json names as tested (the one "
            "`s2s generate` decodes): write the average elsewhere (--output FILE)"
        )
    output_file(given, "--output", replaces=[AVERAGE])  # no other file of a run either
    remove_stale_temporaries(out.parent)
    atomic_save(average(paths), out)
    return paths, out


def _tested_file(out: Path) -> Path | None:
    """The checkpoint that the result.json of the run `out` lies in names as tested, or None."""
    from ..files import run_of

    run = run_of(out)
    result = None if run is None else run / "result.json"
    if result is None or not result.is_file():
        return None
    try:
        named = json.loads(result.read_text(encoding="utf-8")).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return None
    return run / named if isinstance(named, str) else None


def save_tokenizer(task, run_dir: Path, directory: Path, resuming: bool) -> dict:
    """Write the task's vocabulary files into `directory` (in run_dir) and return {file: sha256}.

    They are what `s2s generate` reads; a resumed run keeps the vocabulary its checkpoints
    were trained with, so a different one is refused rather than written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".vocab") as tmp:
        task.save_vocab(Path(tmp))
        files = {
            p.relative_to(tmp).as_posix(): sha256(p)
            for p in sorted(Path(tmp).rglob("*"))
            if p.is_file()
        }
        if resuming:
            changed = [
                n
                for n, h in files.items()
                if (directory / n).is_file() and sha256(directory / n) != h
            ]
            if changed:
                raise TrainingError(
                    f"{', '.join(str(directory / n) for n in changed)}: the task's vocabulary now "
                    "differs from the one this run's checkpoints were trained with; resume "
                    "with the original data and config, or train in a new run.dir"
                )
        for name in files:
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(Path(tmp) / name, directory / name)
    return {(directory / n).relative_to(run_dir).as_posix(): h for n, h in files.items()}
