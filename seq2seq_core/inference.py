"""Inference: a trained model from its run directory, and source lines turned into output lines.

`load_for_inference` reads a run directory (or a checkpoint in one) back into the config, the
task and the model. `hypotheses` is what `s2s generate`, validation and test evaluation share: encode the sources,
decode them in batches of similar length with the task's defaults (overridden by the decode
section) and turn ids back into text. `translate` applies the task's post-processing to them
(`s2s generate`); validation and test hand `Task.score` the hypotheses with their sources, so
that a task counts what its post-processing did there, and `postprocess` keeps no state.
Input typed by a person (`s2s generate`, the server) goes through the task's `prepare_source`
first (`prepared`: parsing tokenises raw text); words the vocabulary lacks are named (`unknown_words`).
`load_run` is the public way to a run's model and decoding settings (docs/export.md uses it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import numbers
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import islice
from pathlib import Path
from typing import IO, Iterable, Sequence

import torch
from omegaconf import OmegaConf

from . import checkpoint, precision, textio
from .config import load_config
from .data import chunks
from .decoding import generate, sentences_per_batch
from .distributed import resolve_device
from .errors import CheckpointError, ConfigError, DataError, UsageError, plugin_error
from .files import no_such_run, remove_stale_temporaries, replacing
from .members import Member, build_members, decode_settings, load_vocabularies, pick
from .model import Transformer
from .progress import progress
from .task import DecodeDefaults, Score, Task
from .vocab import EOS, PAD, UNK

log = logging.getLogger("s2s")


def run_dir_of(path: str | Path) -> Path:
    """The run directory that `path` (a run directory, or a checkpoint file in one) belongs to."""
    p = Path(path)
    if not p.exists():
        raise no_such_run(p, "run directory or checkpoint file")
    run_dir = p if p.is_dir() else p.parent.parent if p.parent.name == "checkpoints" else p.parent
    if not (run_dir / "config.yaml").is_file():
        raise UsageError(f"{p} holds no config.yaml: not a run directory of `s2s train`" if run_dir == p else
                         f"{p}: not a checkpoint file in a run directory of `s2s train` ({run_dir} holds no config.yaml)")
    return run_dir


def load_for_inference(path: str | Path, registry, overrides=(), task: str | None = None):
    """(cfg, member, model) from a run directory (the checkpoint its run tested) or a checkpoint
    file inside one. The member is the run's task `task` (None: its only one) in the run's id
    space, which `translate` serves as it serves a task; the model is on the configured device,
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
    check_config(cfg, members, state, run_dir, p, overrides)
    check_members(members, state, run_dir, p)
    checkpoint.check_tokenizer_files(state, run_dir, p)
    sizes = load_vocabularies(members, run_dir)  # the run's id space
    model = Transformer(cfg.model, *sizes)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(f"the checkpoint in {p} does not fit {run_dir / 'config.yaml'} "
                              f"({(str(e).splitlines() or [''])[0]})") from None
    device = resolve_device(cfg.run.device)
    model.to(device).eval()
    log.info("loaded %s (update %s)", p, state.get("update", "?"))
    return cfg, member, precision.for_inference(model, precision.resolve(cfg.decode.precision, device, "decode.precision"))


@dataclasses.dataclass(frozen=True)
class Run:
    """A trained run ready to decode: what `load_run` returns."""

    cfg: object  # the run's config (with the overrides)
    member: Member  # the run's task (of a multi-task run: the member asked for) in the run's id space
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
        return translate(self.model, self.member, lines, self.settings, next(self.model.parameters()).device,
                         self.cfg.decode.max_sentences, raw=True)


def load_run(path: str | Path, overrides: Sequence[str] = (), task: str | None = None, plugins: Sequence[str] = ()) -> Run:
    """The run at `path` (a run directory of `s2s train`, or a checkpoint file in one) as
    `s2s generate PATH key=value ...` loads it: the checkpoint the run tested, the config with
    `overrides` (e.g. "decode.beam=1", "run.device=cpu"), the member `task` of a multi-task run,
    tasks registered by the installed plugins and `plugins` (as --plugin takes them)."""
    from .registry import Registry

    cfg, member, model = load_for_inference(path, Registry.installed(list(plugins)), overrides, task)
    return Run(cfg, member, model, decode_settings(member, cfg.decode))


# model settings that training alone reads: a resume may change them, the weights mean the same
_TRAINING_ONLY = ("dropout", "attention_dropout")


def _paths(task) -> set:
    """The fields of a task's section that say where its files are (as `config.expand_paths`
    finds them) or how input text is read (metadata `input`, e.g. parsing's `tokenize`): moving
    the data changes nothing the weights mean, the vocabulary is checked apart."""
    return {f.name for f in dataclasses.fields(task.Config)
            if f.metadata.get("path", f.name.endswith("_dir") or f.name == "nltk_data") or f.metadata.get("input")}


def _first_difference(mine, theirs, key: str, skip=()):
    """(key, mine, theirs) of the first setting under `key` (but its keys `skip`) whose values
    differ; a setting the checkpoint's config lacks (added to the schema since) takes its default
    and is not compared."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for k, v in mine.items():
            if k in theirs and k not in skip:
                found = _first_difference(v, theirs[k], f"{key}.{k}")
                if found:
                    return found
        return None
    return None if mine == theirs else (key, mine, theirs)


def config_difference(cfg, saved: dict, members) -> tuple | None:
    """(key, value in `cfg`, value in `saved`) of the first setting that decides what the weights
    mean (the model section, the task section or the members: names, order and task sections)
    and differs between `cfg`, whose members are `members`, and `saved`, a checkpoint's config;
    None when they agree."""
    mine = OmegaConf.to_container(cfg, enum_to_str=True)
    found = _first_difference(mine.get("model"), saved.get("model"), "model", _TRAINING_ONLY)
    if found:
        return found
    paths = {m.name: _paths(m.task) for m in members}
    ours, theirs = mine.get("tasks"), saved.get("tasks")
    if ours is None and theirs is None:
        return _first_difference(mine.get("task"), saved.get("task"), "task", set().union(*paths.values()))
    if not isinstance(ours, dict) or not isinstance(theirs, dict) or list(ours) != list(theirs):
        return ("tasks", list(ours) if isinstance(ours, dict) else None,
                list(theirs) if isinstance(theirs, dict) else None)
    for name, member in ours.items():
        found = _first_difference((member or {}).get("task"), (theirs[name] or {}).get("task"),
                                  f"tasks.{name}.task", paths.get(name, ()))
        if found:
            return found
    return None


def _shown(value) -> str:
    text = "absent" if value is None else ", ".join(map(str, value)) if isinstance(value, list) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_config(cfg, members, state: dict, run_dir: Path, path: Path, overrides=()) -> None:
    """A CheckpointError naming RUN_DIR/config.yaml, the first differing key and both values when
    the config (with the command line's overrides) and the one stored in the checkpoint at `path`
    disagree on what the weights mean. A checkpoint without a config passes."""
    saved = state.get("config")
    if not isinstance(saved, dict):
        return
    found = config_difference(cfg, saved, members)
    if found is None:
        return
    key, mine, theirs = found
    parts = key.split(".")
    overridden = {str(o).partition("=")[0].strip().lstrip("+~") for o in overrides} & \
        {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
    where = f"{run_dir / 'config.yaml'}{' with the overrides' if overridden else ''}"
    raise CheckpointError(f"{where} does not match checkpoint {path}: {key} is {_shown(mine)} there but "
                          f"{_shown(theirs)} in the checkpoint, whose weights were trained with it; "
                          f"set {key} back to {_shown(theirs)}")


def check_members(members, state: dict, run_dir: Path, path: Path) -> None:
    """A CheckpointError when the members built from RUN_DIR/config.yaml are not the checkpoint's
    tasks in its order (each member's ids would index another member's rows)."""
    trained = state.get("tasks")
    names = [m.name for m in members]
    if trained is not None and list(trained) != names:
        raise CheckpointError(f"{run_dir / 'config.yaml'} lists the tasks {', '.join(names)} but checkpoint {path} "
                              f"was trained with {', '.join(map(str, trained))} in this order; list the same tasks in "
                              "the checkpoint's order")


def source_batch(ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Source rows as the model takes them: ids + EOS, right-padded with PAD, [B, S]."""
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD, dtype=torch.long)
    for row, seq in enumerate(ids):
        src[row, :len(seq) + 1] = torch.tensor(list(seq) + [EOS])
    return src


def checked_score(task, result) -> Score:
    """`result`, what `task.score` returned, if it is a Score whose value is a finite number
    (as a float); else a PluginError naming the plugin and `score`. The engine calls it where
    it receives a score: `s2s score`, validation and test."""
    if not isinstance(result, Score):
        raise plugin_error(task, "score", f"returned {type(result).__name__}, not a s2s.core.task.Score")
    value = result.value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise plugin_error(task, "score", f"returned a Score whose value is {type(value).__name__} "
                                          f"{value!r:.40}, not a number")
    if not math.isfinite(value):
        raise plugin_error(task, "score", f"returned a Score whose value is {value} (not finite)")
    if not isinstance(result.name, str) or not result.name or not isinstance(result.figures, dict):
        raise plugin_error(task, "score", "returned a Score without a name (str) or whose figures are not a dict")
    return result if type(value) is float else replace(result, value=float(value))


def prepared(task: Task | Member, lines: Sequence[str]) -> list[str]:
    """Input lines as the task's sources (`Task.prepare_source`: parsing tokenises raw text)."""
    inner = task.task if isinstance(task, Member) else task
    out = inner.prepare_source(list(lines))
    if not isinstance(out, list) or len(out) != len(lines) or not all(isinstance(x, str) for x in out):
        raise plugin_error(inner, "prepare_source", f"returned {type(out).__name__}, not a list of "
                                                    f"{len(lines)} str (one a line)")
    return out


def unknown_words(task: Task | Member, source: str, ids: Sequence[int]) -> list[str]:
    """The words of a (prepared) source line that its ids `ids` read as <unk>: the vocabulary
    never saw them, so the model cannot know what they mean."""
    if UNK not in ids:
        return []
    return [w for w in dict.fromkeys(source.split()) if UNK in task.encode_source([w])[0]]


def translate(model, task: Task, sources: Sequence[str], settings: DecodeDefaults, device,
              max_sentences: int = 0, progress=None, raw: bool = False) -> list[str]:
    """The task's output line for every source line, in input order: `hypotheses`, post-processed.
    `raw`: the lines are input as a person types it (`s2s generate`, the server), made into
    sources first (`prepared`); else they are sources already (a split's, say)."""
    sources = prepared(task, sources) if raw else sources
    hyps = hypotheses(model, task, sources, settings, device, max_sentences, progress)
    out = [task.postprocess(h, s) for h, s in zip(hyps, sources)]
    for line in out:
        if not isinstance(line, str):
            raise plugin_error(task, "postprocess", f"returned {type(line).__name__}, not a str")
    return out


@torch.no_grad()
def hypotheses(model, task: Task, sources: Sequence[str], settings: DecodeDefaults, device,
               max_sentences: int = 0, progress=None) -> list[str]:
    """The decoded target string (before post-processing) for every source line, in input order.

    On a CPU with n > 1 intra-op threads, n batches are searched at once, each on one thread:
    a step's operations are small (a few hundred rows), and splitting each of them over threads
    pays a synchronisation per operation that independent batches do not. On a GPU batches go
    one after the other.
    """
    if not sources:
        return []
    was_training = model.training
    model.eval()
    ids = task.encode_source(list(sources))
    if not hasattr(ids, "__len__") or len(ids) != len(sources):
        got = f"{len(ids)} id lists" if hasattr(ids, "__len__") else type(ids).__name__
        raise plugin_error(task, "encode_source", f"returned {got} for {len(sources)} lines, not one id list a line")
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)

    def search(batch: list[int]) -> list[str]:
        src = source_batch([ids[i] for i in batch])
        hyps = generate(model, src.to(device), beam=settings.beam, alpha=settings.alpha,
                        max_len_a=settings.max_len_a, max_len_b=settings.max_len_b, stop=settings.stop,
                        constraint=task.constraint([sources[i] for i in batch]))
        lines = [task.decode_target(h.tokens) for h in hyps]
        for line in lines:
            if not isinstance(line, str):
                raise plugin_error(task, "decode_target", f"returned {type(line).__name__}, not a str")
        return lines

    batches = list(chunks(order, sentences_per_batch(max_sentences, device)))
    threads = torch.get_num_threads()
    workers = min(threads, len(batches)) if torch.device(device).type == "cpu" else 1
    try:
        if workers > 1:
            torch.set_num_threads(1)
        with ThreadPoolExecutor(workers) as pool:
            for batch, lines in zip(batches, pool.map(search, batches)):
                for i, line in zip(batch, lines):
                    out[i] = line
                if progress is not None:
                    progress.update(len(batch))
    finally:
        torch.set_num_threads(threads)
        model.train(was_training)
    return out


def generate_lines(model, task, cfg, raw: Iterable[bytes], name: str, out: IO[str], progress=None,
                   pretty: bool = False) -> tuple[int, int]:
    """Write one output line to `out` for every raw source line (bytes without "\\n"), in
    order, and return (lines read, lines that could not be decoded).

    A line that cannot be decoded (invalid UTF-8, too long for the model's positions) gets an
    empty output line and a warning naming `name` and its line number; the rest goes on. Words
    the vocabulary never saw are named in a warning with their line. `pretty`: each output as
    the task displays it (`Task.display`, parsing: an indented tree), a blank line after each."""
    settings = decode_settings(task, cfg.decode)
    device = next(model.parameters()).device
    block = sentences_per_batch(cfg.decode.max_sentences, device) * max(1, torch.get_num_threads())  # what one translate call shares out
    raw = iter(raw)
    number = bad = 0
    while chunk := list(islice(raw, block)):
        lines = []
        for raw_line in chunk:
            number += 1
            lines.append(_source_line(raw_line, name, number, task, model.max_positions))
        good = [i for i, line in enumerate(lines) if line is not None]
        hyps = translate(model, task, [lines[i] for i in good], settings, device, cfg.decode.max_sentences,
                         progress=progress)
        result = [""] * len(lines)
        for i, h in zip(good, hyps):
            result[i] = h.replace("\r", " ").replace("\n", " ")
        bad += len(lines) - len(good)
        if pretty:
            inner = task.task if isinstance(task, Member) else task
            result = [inner.display(h).rstrip("\n") + "\n" if h else "" for h in result]
        out.write("".join(h + "\n" for h in result))
        out.flush()
    return number, bad


def _source_line(raw: bytes, name: str, number: int, task, max_positions: int) -> str | None:
    """The source of one input line (`prepared`), or None (with a warning) when it cannot be decoded."""
    try:
        line = prepared(task, [textio.decode_line(raw, name, number)])[0]
    except DataError as e:
        log.warning("%s; its output line is empty", e)
        return None
    ids = task.encode_source([line])[0]
    unknown = unknown_words(task, line, ids)
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        log.warning("%s, line %d: %d word(s) the model has never seen (not in its vocabulary, read as <unk>): %s",
                    name, number, len(unknown), shown)
    n = len(ids) + 1  # + EOS
    if n > max_positions:
        log.warning("%s, line %d: %d source tokens do not fit model.max_positions=%d; its output line is empty",
                    name, number, n, max_positions)
        return None
    return line


def generate_file(path, registry, overrides, task: str | None, input: str | None, output: str | None,
                  stdout, beam_setting: str = "decode.beam", quiet: bool = False, pretty: bool = False) -> tuple[int, int]:
    """`s2s generate`: decode the lines of `input` (None: stdin) with the run at `path` into
    `output` (None: `stdout`); returns (lines, lines that could not be decoded). A regular output
    file appears complete at the end (`files.replacing`); a device or a pipe is written as it goes."""
    cfg, member, model = load_for_inference(path, registry, overrides, task)
    beam, vocab = decode_settings(member, cfg.decode).beam, member.task.tgt_vocab_size  # the member's own words
    if beam > vocab:
        raise ConfigError(f"{beam_setting}={beam}: the beam is larger than the target vocabulary of {path} "
                          f"({vocab} tokens)")
    raw = textio.raw_lines(input) if input else (line[:-1] if line.endswith(b"\n") else line for line in sys.stdin.buffer)
    regular = output and (Path(output).is_file() or not Path(output).exists())
    if regular:
        remove_stale_temporaries(Path(output).parent)
    try:
        with contextlib.ExitStack() as stack:
            out = (stack.enter_context(replacing(output)) if regular else
                   stack.enter_context(open(output, "w", encoding="utf-8")) if output else stdout)
            bar = stack.enter_context(progress(quiet, desc="generate", unit=" sent"))
            return generate_lines(model, member, cfg, raw, input or "<stdin>", out, progress=bar, pretty=pretty)
    except OSError as e:  # a full disk, a closed pipe (reading errors are DataErrors)
        raise UsageError(f"cannot write {output or '<stdout>'}: {e.strerror or e}") from None
