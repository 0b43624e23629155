"""`s2s label`: a trained model's outputs for a file of unlabelled text, as a corpus to train on.

Self-training (a parser's trees for raw sentences: a silver treebank, Vaswani et al. 2017's
semi-supervised setting) and back-translation (a reverse model's sources for target-language
sentences: a synthetic parallel corpus, Sennrich et al. 2016) are one job: decode every line
(the beam's best, or a draw: Edunov et al. 2018 found sampled sources train better than beam
ones), keep the outputs the model is most confident of, and write them in the task's own corpus
format (`Task.corpus_files`).

Everything lands in one folder of its own, DIR:
* `label.json`: what the labels are of (the runs, the input file's size and SHA-256, the decoding
  settings, the block size). A second command into DIR with other ones is refused.
* `labels.jsonl`: one JSON object per input line, as `s2s generate --json` writes it, appended a
  block of lines at a time and synced to disk; a killed command resumes after the last whole
  block, and the draws of a resumed sampling run are those of an uninterrupted one (each block
  draws from the seed, and blocks start on the same lines).
* the corpus (e.g. `NAME.trees`, or `NAME.en` and `NAME.de`) and `summary.json`, rewritten from
  labels.jsonl at the end, so another `--keep` re-selects without decoding again.

Confidence is the output's mean log-probability per token under the model (the length-normalised
probability, comparable across lengths); `--keep F` keeps the fraction F of the labelled lines
that score highest. Lines that cannot be decoded (not UTF-8, too long for the model) and lines
whose search found no output are skipped and counted, never silently.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from .. import textio
from ..data.members import decode_settings
from ..decode.search import Wanted
from ..errors import DataError, UsageError
from ..files import atomic_write_text, output_folder, own_outputs, record_outputs, sha256
from ..progress import progress
from .generate import Asked, InputLines, Job, block_size, generate_lines, loaded
from .loading import decoder_of

log = logging.getLogger("s2s")

MANIFEST, LABELS, SUMMARY = "label.json", "labels.jsonl", "summary.json"
NUL = b"\0"  # in no line of text: a file holding one is binary
LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")  # str.splitlines' breaks


@dataclass(frozen=True)
class Labelling:
    """One `s2s label`: the runs (more than one: an ensemble), the text file, the output folder,
    the corpus name, the member of a multi-task run, config overrides, one output a line (the
    best, or a draw) and the fraction of lines kept."""

    runs: Sequence[str]
    input: str
    output: str
    name: str = "synthetic"
    task: str | None = None
    overrides: Sequence[str] = ()
    wanted: Wanted = field(default_factory=Wanted)
    keep: float = 1.0
    quiet: bool = False


def text_lines(path: str) -> int:
    """The number of lines of a text file (plain or .gz); a DataError naming it when it has none
    or holds a NUL byte (a binary file, not text)."""
    lines, offset = 0, 0
    with textio.open_binary(path) as f:  # a .gz file is read decompressed
        for block in iter(lambda: f.read(1 << 20), b""):
            if NUL in block:
                raise DataError(
                    f"{path}: a NUL byte at byte {offset + block.index(NUL)}: a binary file, "
                    "not text (one sentence a line, UTF-8)"
                )
            lines += block.count(b"\n")
            offset += len(block)
            last = block[-1:]
    if offset == 0:
        raise DataError(f"{path} is empty: no lines to label")
    return lines + (last != b"\n")


def label(job: Labelling, registry) -> dict:
    """Label `job.input` into `job.output` (see the module docstring); returns the summary."""
    if not 0 < job.keep <= 1:
        raise UsageError(f"--keep {job.keep}: a fraction of the lines, in (0, 1]")
    if not job.name.strip() or job.name.startswith(".") or any(c in job.name for c in "/\\\0"):
        raise UsageError(
            f"--name {job.name!r}: the corpus files' prefix must be a file name, not empty, not "
            "starting with '.' (a hidden file) and without a folder (e.g. synthetic)"
        )
    folder = Path(job.output)
    total = text_lines(job.input)
    output_folder(folder, "--output")
    own_outputs(folder, [MANIFEST, LABELS, SUMMARY], "--output")
    generate = Job(job.runs, job.input, task=job.task, overrides=job.overrides)
    cfg, member, model = loaded(generate, registry)
    corpus = _corpus(member.task, job.name, [], [])
    own_outputs(folder, list(corpus), "--output")
    for name in (MANIFEST, LABELS, SUMMARY, *corpus):
        if (folder / name).exists() and (folder / name).samefile(job.input):
            raise UsageError(f"--input {job.input} is {name} of --output {folder}: label elsewhere")
    decoder = decoder_of(cfg, member, model)
    block = block_size(decoder)
    wanted = {
        "runs": [str(Path(r).resolve()) for r in job.runs],
        "task": member.name,
        "input": str(Path(job.input).resolve()),
        "input_bytes": os.path.getsize(job.input),
        "input_sha256": sha256(job.input),
        "decode": asdict(decode_settings(member, cfg.decode)),
        "sampling": asdict(job.wanted.sampling) if job.wanted.sampling else None,
        "block": block,
    }
    folder.mkdir(parents=True, exist_ok=True)
    done = _resumed(folder, wanted, total)
    record_outputs(folder, [MANIFEST, LABELS, SUMMARY, *corpus])
    atomic_write_text(folder / MANIFEST, json.dumps(wanted, indent=1) + "\n")
    t0 = time.monotonic()
    if done < total:
        if done:
            log.info("%s: resuming after %d of %d lines", folder / LABELS, done, total)
        asked = Asked(wanted=job.wanted, json=True)
        lines = _FirstLines()
        log.addFilter(lines)
        try:
            with (
                open(folder / LABELS, "a", encoding="utf-8") as f,
                progress(job.quiet, desc="label", unit=" sent", total=total, initial=done) as bar,
            ):
                out = _Synced(f, done, total)
                source = InputLines(textio.raw_lines(job.input), job.input, skip=done)
                generate_lines(decoder, source, out, asked, bar)
        finally:
            log.removeFilter(lines)
        if lines.held:
            log.warning(
                "%s: %d more warning(s) about single lines not shown (unknown words, lines "
                "too long or not UTF-8); summary.json counts the lines left out",
                job.input,
                lines.held,
            )
    summary = select(folder, member.task, job, total)
    summary["decode_seconds"] = round(time.monotonic() - t0, 1)
    atomic_write_text(folder / SUMMARY, json.dumps(summary, indent=1) + "\n")
    return summary


class _FirstLines:
    """A log filter that lets the first SHOWN warnings about single input lines through and
    counts the rest (`held`): a big text file would otherwise bury the log in them."""

    SHOWN = 10

    def __init__(self):
        self.shown = self.held = 0

    def filter(self, record) -> bool:
        if not str(record.msg).startswith("%s, line %d"):
            return True
        if self.shown < self.SHOWN:
            self.shown += 1
            return True
        self.held += 1
        return False


class _Synced:
    """labels.jsonl open for appending: every flush (one a block of lines) also reaches the
    disk, and at most once a minute a log line says how far the labelling is (a progress bar
    shows only on a terminal; this is what a log file gets)."""

    EVERY = 60.0  # seconds between two progress lines

    def __init__(self, f, done: int, total: int):
        self.f, self.done, self.total = f, done, total
        self.start, self.started = time.monotonic(), done
        self.said = self.start

    def write(self, text: str) -> None:
        self.f.write(text)
        self.done += text.count("\n")

    def flush(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        now = time.monotonic()
        if now - self.said >= self.EVERY and self.done < self.total:
            self.said = now
            rate = (self.done - self.started) / (now - self.start)
            log.info(
                "label: %d of %d lines, %.1f lines/s, about %.0f min left",
                self.done,
                self.total,
                rate,
                (self.total - self.done) / rate / 60 if rate else float("inf"),
            )


def _resumed(folder: Path, wanted: dict, total: int) -> int:
    """How many input lines DIR/labels.jsonl already holds whole (its last partial block cut
    off); 0 for a new folder. Labels made with other runs, input or settings are refused."""
    manifest, labels = folder / MANIFEST, folder / LABELS
    if not manifest.is_file():
        if labels.exists():
            labels.unlink()  # our own, from a command killed before its manifest was written
        return 0
    try:
        had = json.loads(manifest.read_text(encoding="utf-8"))
    except ValueError as e:
        raise DataError(f"{manifest} is damaged ({e}): remove the folder or use another") from None
    for key, value in wanted.items():
        if had.get(key) != value:
            raise UsageError(
                f"--output {folder} holds labels of another job ({key} was {had.get(key)!r}, "
                f"now {value!r}): use another folder, or remove this one"
            )
    if not labels.is_file():
        return 0
    kept, size, whole = 0, 0, (0, 0)
    with open(labels, "rb") as f:
        for raw in f:
            try:
                if not raw.endswith(b"\n") or json.loads(raw)["line"] != kept + 1:
                    break
            except (ValueError, KeyError, TypeError):
                break
            kept += 1
            size += len(raw)
            if kept % wanted["block"] == 0 or kept == total:
                whole = (kept, size)
    kept, size = whole
    with open(labels, "r+b") as f:
        f.truncate(size)
    return kept


def select(folder: Path, task, job: Labelling, total: int) -> dict:
    """The corpus of the labelled lines the model is most confident of (`job.keep`), written
    into `folder`, and its summary: lines read, labelled, skipped (why) and kept."""
    rows, skipped = [], {"blank": 0, "undecodable": 0, "no_output": 0}
    labels = textio.iter_lines(folder / LABELS)
    for number, (raw, label_line) in enumerate(zip(textio.raw_lines(job.input), labels), 1):
        outs = json.loads(label_line)["outputs"]
        if not outs:  # not UTF-8, or too long for the model (generate_lines warned)
            skipped["undecodable"] += 1
        elif not raw.strip():
            skipped["blank"] += 1
        elif outs[0]["score"] is None or not outs[0]["output"]:
            skipped["no_output"] += 1
        else:
            confidence = outs[0]["logprob"] / max(1, outs[0]["tokens"])
            source = textio.decode_line(raw, job.input, number)
            output = LINE_BREAKS.sub(" ", outs[0]["output"])  # a drawn output may hold one
            rows.append((confidence, number, source, output))
    if len(rows) + sum(skipped.values()) != total:
        raise DataError(f"{folder / LABELS} holds labels of {number} lines, the input {total}")
    ranked = sorted(rows, key=lambda r: (-r[0], r[1]))
    kept = sorted(ranked[: round(job.keep * len(ranked))], key=lambda r: r[1])
    files = _corpus(task, job.name, [r[2] for r in kept], [r[3] for r in kept])
    for name, lines in files.items():
        atomic_write_text(folder / name, "".join(line + "\n" for line in lines))
    if skipped["undecodable"] or skipped["no_output"]:
        log.warning(
            "%s: %d line(s) could not be decoded (not UTF-8, too long for the model) and %d had "
            "no output within the length limit; none of them is in the corpus",
            job.input,
            skipped["undecodable"],
            skipped["no_output"],
        )
    return {
        "lines": total,
        "labelled": len(rows),
        **skipped,
        "kept": len(kept),
        "dropped_by_keep": len(rows) - len(kept),
        "keep": job.keep,
        "lowest_kept_confidence": round(min(r[0] for r in kept), 4) if kept else None,
        "files": sorted(files),
    }


def _corpus(task, name: str, sources: list[str], outputs: list[str]) -> dict[str, list[str]]:
    files = task.corpus_files(name, sources, outputs)
    if files is None:
        raise UsageError(
            f"task {task.name!r} writes no corpus of its outputs (its plugin defines no "
            "Task.corpus_files): nothing to train on"
        )
    for file in files:
        if Path(file).name != file or file in (MANIFEST, LABELS, SUMMARY):
            raise UsageError(f"--name {name}: the corpus file {file!r} must be a plain new name")
    return files
