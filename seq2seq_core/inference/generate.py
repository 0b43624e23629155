"""`s2s generate`: a file (or stdin) of source lines to a file (or stdout) of output lines, one
out for every line in, a line that cannot be decoded named and left empty.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from itertools import islice
from pathlib import Path
from typing import IO, Iterable

import torch

from .. import textio
from ..data.members import decode_settings
from ..decode.batched import decode_sources, prepared_sources, unknown_words
from ..decode.search import sentences_per_batch
from ..errors import ConfigError, DataError, UsageError
from ..files import remove_stale_temporaries, replacing
from ..progress import progress
from .loading import load_for_inference

log = logging.getLogger("s2s")


def generate_lines(
    model,
    task,
    cfg,
    raw: Iterable[bytes],
    name: str,
    out: IO[str],
    progress=None,
    pretty: bool = False,
) -> tuple[int, int]:
    """Write one output line to `out` for every raw source line (bytes without "\\n"), in
    order, and return (lines read, lines that could not be decoded).

    A line that cannot be decoded (invalid UTF-8, too long for the model's positions) gets an
    empty output line and a warning naming `name` and its line number; the rest goes on. Words
    the vocabulary never saw are named in a warning with their line. `pretty`: each output as
    the task displays it (`Task.display`, parsing: an indented tree), a blank line after each."""
    settings = decode_settings(task, cfg.decode)
    device = next(model.parameters()).device
    block = sentences_per_batch(cfg.decode.max_sentences, device) * max(
        1, torch.get_num_threads()
    )  # what one decode_sources call shares out
    raw = iter(raw)
    number = bad = 0
    while chunk := list(islice(raw, block)):
        lines = []
        for raw_line in chunk:
            number += 1
            lines.append(_source_line(raw_line, name, number, task, model.max_positions))
        good = [i for i, line in enumerate(lines) if line is not None]
        hyps = decode_sources(
            model,
            task,
            [lines[i] for i in good],
            settings,
            device,
            cfg.decode.max_sentences,
            progress=progress,
        )
        result = [""] * len(lines)
        for i, h in zip(good, hyps):
            result[i] = h.replace("\r", " ").replace("\n", " ")
        bad += len(lines) - len(good)
        if pretty:
            result = [task.display(h).rstrip("\n") + "\n" if h else "" for h in result]
        out.write("".join(h + "\n" for h in result))
        out.flush()
    return number, bad


def _source_line(raw: bytes, name: str, number: int, task, max_positions: int) -> str | None:
    """The source of one input line (`prepared_sources`), or None (with a warning) when it cannot be decoded."""
    try:
        line = prepared_sources(task, [textio.decode_line(raw, name, number)])[0]
    except DataError as e:
        log.warning("%s; its output line is empty", e)
        return None
    ids = task.encode_source([line])[0]
    unknown = unknown_words(task, line, ids)
    if unknown:
        shown = ", ".join(unknown[:10]) + (
            f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        )
        log.warning(
            "%s, line %d: %d word(s) the model has never seen (not in its vocabulary, read as <unk>): %s",
            name,
            number,
            len(unknown),
            shown,
        )
    n = len(ids) + 1  # + EOS
    if n > max_positions:
        log.warning(
            "%s, line %d: %d source tokens do not fit model.max_positions=%d; its output line is empty",
            name,
            number,
            n,
            max_positions,
        )
        return None
    return line


def generate_file(
    path,
    registry,
    overrides,
    task: str | None,
    input: str | None,
    output: str | None,
    stdout,
    beam_setting: str = "decode.beam",
    quiet: bool = False,
    pretty: bool = False,
) -> tuple[int, int]:
    """`s2s generate`: decode the lines of `input` (None: stdin) with the run at `path` into
    `output` (None: `stdout`); returns (lines, lines that could not be decoded). A regular output
    file appears complete at the end (`files.replacing`); a device or a pipe is written as it goes."""
    cfg, member, model = load_for_inference(path, registry, overrides, task)
    beam, vocab = (
        decode_settings(member, cfg.decode).beam,
        member.task.tgt_vocab_size,
    )  # the member's own words
    if beam > vocab:
        raise ConfigError(
            f"{beam_setting}={beam}: the beam is larger than the target vocabulary of {path} "
            f"({vocab} tokens)"
        )
    raw = (
        textio.raw_lines(input)
        if input
        else (line[:-1] if line.endswith(b"\n") else line for line in sys.stdin.buffer)
    )
    regular = output and (Path(output).is_file() or not Path(output).exists())
    if regular:
        remove_stale_temporaries(Path(output).parent)
    try:
        with contextlib.ExitStack() as stack:
            out = (
                stack.enter_context(replacing(output))
                if regular
                else stack.enter_context(open(output, "w", encoding="utf-8"))
                if output
                else stdout
            )
            bar = stack.enter_context(progress(quiet, desc="generate", unit=" sent"))
            return generate_lines(
                model, member, cfg, raw, input or "<stdin>", out, progress=bar, pretty=pretty
            )
    except OSError as e:  # a full disk, a closed pipe (reading errors are DataErrors)
        raise UsageError(f"cannot write {output or '<stdout>'}: {e.strerror or e}") from None
