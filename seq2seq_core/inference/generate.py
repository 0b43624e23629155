"""`s2s generate`: a file (or stdin) of source lines to a file (or stdout) of output lines, one
out for every line in, a line that cannot be decoded named and left empty.

Beyond the single best (`Asked`): the n best or n drawn outputs of each line with their scores,
outputs that continue a given target prefix, and the model's score of given target lines instead
of a search; every output of every line goes through the task's tokenisation, constraint and
post-processing. With n > 1 (or `json`) each line's answer is one JSON object (docs/decoding.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from itertools import islice
from typing import IO, Iterable, NamedTuple, Sequence

import torch

from .. import textio
from ..data.members import decode_settings
from ..decode.batched import Decoder, Forced, prepared_sources, unknown_words
from ..decode.given import checked_terms, line_targets, model_targets, prefix_problem
from ..decode.search import Wanted, sentences_per_batch
from ..decode.terminology import line_terms, placeable, read_terms, target_spellings
from ..errors import ConfigError, DataError, UsageError
from ..files import remove_stale_temporaries, replaced_file, replacing
from ..progress import progress
from .loading import decoder_of, load_for_inference

log = logging.getLogger("s2s")


@dataclass(frozen=True)
class Asked:
    """What `s2s generate` is asked for besides the single best output of each line."""

    wanted: Wanted = Wanted()  # the n best, or n drawn
    json: bool = False  # a JSON object a line with every output's scores (always when n > 1)
    pretty: bool = False  # each output as the task displays it (`Task.display`)
    prefixes: str | None = None  # a file: the target prefix of each input line ("" for none)
    terms: str | None = None  # a file of `source term<TAB>target term` lines (terminology)
    line_terms: str | None = None  # a file: each input line's target terms, TAB-separated
    targets: str | None = None  # a file: the target lines to score instead of searching

    def as_json(self) -> bool:
        """A JSON object a line: asked for, or n outputs a line (but one MBR chose from them)."""
        several = self.wanted.n > 1 and self.wanted.mbr is None
        return self.json or several or self.targets is not None


@dataclass(frozen=True)
class Job:
    """One `s2s generate`: the runs (more than one: an ensemble), input and output files (None:
    stdin, stdout), the member of a multi-task run, config overrides, what is asked."""

    runs: Sequence[str]
    input: str | None = None
    output: str | None = None
    task: str | None = None
    overrides: Sequence[str] = ()
    quiet: bool = False
    asked: Asked = field(default_factory=Asked)
    beam_setting: str = "decode.beam"  # how the command line names the beam, for errors


@dataclass(frozen=True)
class InputLines:
    """Raw source lines (bytes without "\\n"), the name warnings give them (a file, <stdin>),
    and how many of the first were decoded before (a resumed `s2s label`): those are passed
    over, and numbering goes on from them."""

    raw: Iterable[bytes]
    name: str
    skip: int = 0


class Counts(NamedTuple):
    """What `s2s generate` wrote: lines read, lines that could not be decoded, and lines for
    which the search found no output within the length limit (both got an empty line)."""

    lines: int
    undecodable: int
    without_output: int


def generate_lines(
    decoder: Decoder, lines: InputLines, out: IO[str], asked=Asked(), progress=None
) -> Counts:
    """Write one output line to `out` for every raw source line of `lines`, in order, and
    return the `Counts`.

    A line that cannot be decoded (invalid UTF-8, too long for the model's positions) gets an
    empty output line (JSON: no outputs) and a warning naming `name` and its line number; the
    rest goes on. Words the vocabulary never saw are named in a warning with their line. A
    prefix or target file is read whole, and so is then the input: the two must have as many
    lines, and every prefix or target must be usable, before the first output is written."""
    task, name = decoder.task, lines.name
    side = _side_lines(asked)
    pairs = _term_pairs(task, asked)
    given = _given_terms(task, asked)
    raw = iter(lines.raw)
    number = sum(1 for _ in islice(raw, lines.skip))
    read = _read_sources(raw, number, name, task, decoder.model.max_positions)
    if side is not None or given is not None:
        read = list(read)
        if side is not None:
            side = _check_side(decoder, side, read, asked, name)
        if given is not None:
            _check_count(asked.line_terms, given, read, name)
        read = iter(read)
    bad = missing = 0
    while chunk := list(islice(read, block_size(decoder))):
        first = chunk[0][0]
        number = chunk[-1][0]
        good = [i for i, (_, line) in enumerate(chunk) if line is not None]
        bad += len(chunk) - len(good)
        sources, numbers = [chunk[i][1] for i in good], [first + i for i in good]
        extra = None if side is None else [side[n - 1] for n in numbers]
        if asked.targets is not None:
            answers = _rated(decoder, sources, extra)
        else:
            terms = None
            if pairs is not None or given is not None:
                here = line_terms(task, sources, pairs or [])
                for found_here, line_number in zip(here, numbers):
                    have = {target for _, target, _ in found_here}
                    found_here += [
                        ("", target, target_spellings(task, target))
                        for target in (given[line_number - 1] if given else [])
                        if target not in have
                    ]
                terms = _placed_terms(decoder, sources, here, numbers, name)
            found = decoder.outputs(sources, asked.wanted, Forced(extra, terms), progress=progress)
            for i, outs in zip(good, found):
                if not outs[0].found:
                    missing += 1
                    log.warning(
                        "%s, line %d: the search found no output within the length limit "
                        "(decode.max_len_a, max_len_b) that the task's constraint admits: an "
                        "empty output line",
                        name,
                        first + i,
                    )
            answers = _answers(decoder, sources, found, asked)
        result = [{"outputs": []} if asked.as_json() else ""] * len(chunk)
        for i, answer in zip(good, answers):
            result[i] = answer
        if asked.as_json():
            result = [
                json.dumps(
                    _finite({"line": first + i, **answer}), ensure_ascii=False, allow_nan=False
                )
                for i, answer in enumerate(result)
            ]
        if asked.targets is not None and progress is not None:
            progress.update(len(sources))
        out.write("".join(h + "\n" for h in result))
        out.flush()
    return Counts(number, bad, missing)


def _read_sources(raw, number: int, name: str, task, max_positions: int):
    """(line number, its source or None: `_source_line`) of each raw line after the first
    `number`, lazily."""
    for raw_line in raw:
        number += 1
        yield number, _source_line(raw_line, name, number, task, max_positions)


def block_size(decoder: Decoder) -> int:
    """The input lines `generate_lines` reads, decodes and writes at a time: what one call of
    `outputs` shares out over the threads (a resumed `s2s label` starts on a block's edge)."""
    per_batch = sentences_per_batch(decoder.max_sentences, decoder.device)
    return per_batch * max(1, torch.get_num_threads())


def _term_pairs(task, asked: Asked):
    """The term file's (source, target) pairs, identical ones merged, or None (`checked_terms`:
    a special token, an unspellable term, a source term with two targets name the file and
    line); a task whose outputs have no target words (a parser's trees) refuses one."""
    if asked.terms is None:
        return None
    if not task.terminology:
        raise UsageError(
            f"--terms {asked.terms}: task {task.name!r} writes no target words for source terms "
            "(its outputs are built from the source's own words)"
        )
    pairs = read_terms(asked.terms)
    return checked_terms(task, pairs, lambda i: f"{asked.terms}, line {i + 1}")


def _given_terms(task, asked: Asked) -> list[list[str]] | None:
    """The target terms of each line of the --line-terms file, read whole, or None; a term that
    cannot be used names the file and line (`line_targets`)."""
    if asked.line_terms is None:
        return None
    if not task.terminology:
        raise UsageError(
            f"--line-terms {asked.line_terms}: task {task.name!r} writes no target words for "
            "terms (its outputs are built from the source's own words)"
        )
    given = []
    for number, line in enumerate(textio.read_lines(asked.line_terms), 1):
        terms = line_targets(task, line)
        if isinstance(terms, str):
            raise UsageError(f"{asked.line_terms}, line {number}: {terms}")
        given.append(terms)
    return given


def _check_count(path: str, side: list, read: list, name: str) -> None:
    """A side file has a line for every input line, else a UsageError naming both."""
    total = read[-1][0] if read else 0
    if total != len(side):
        raise UsageError(f"{path} has {len(side)} line(s), {name} {total}: one a line of input")


def _placed_terms(decoder: Decoder, sources, found, numbers, name) -> list[list[list[int]]]:
    """The target ids of the terms each line holds (`line_terms`' triples); terms beyond what
    the line's length limit fits are named in a warning with the line, and left out of that
    line's constraint."""
    task, max_positions = decoder.task, decoder.model.max_positions
    placed = []
    for source, terms, number in zip(sources, found, numbers):
        k = placeable(task, source, terms, decoder.settings, max_positions)
        if k < len(terms):
            log.warning(
                "%s, line %d: the term(s) %s do not fit the output's length limit with the "
                "others (decode.max_len_a, max_len_b): left out of this line's constraint",
                name,
                number,
                ", ".join(repr(t[1]) for t in terms[k:]),
            )
        placed.append([target for _, _, target in terms[:k]])
    return placed


def _side_lines(asked: Asked) -> list[str] | None:
    """The lines of the prefix or target file, read whole (errors name the file and line)."""
    path = asked.prefixes or asked.targets
    return None if path is None else textio.read_lines(path)


def _check_side(
    decoder: Decoder, side: list[str], read: list, asked: Asked, name: str
) -> list[str]:
    """Before any output: the prefix or target file has a line for every input line, and each
    of them can be used (`prefix_problem` with its line's source; a target as the model writes
    it, `model_targets`, within the model's positions); else a UsageError naming the file and
    line. Returns the side lines as they are used (targets as the model writes them)."""
    path, task = asked.prefixes or asked.targets, decoder.task
    _check_count(path, side, read, name)
    settings, limit = decoder.settings, decoder.model.max_positions
    used = [(number, source) for number, source in read if source is not None]
    if asked.targets is None:
        for number, source in used:
            problem = prefix_problem(task, source, side[number - 1], settings, limit)
            if problem:
                raise UsageError(f"{path}, line {number}: {problem}")
        return side
    side = list(side)  # a line whose input cannot be decoded is not scored: kept as it is
    given = model_targets(
        task,
        [source for _, source in used],
        [side[number - 1] for number, _ in used],
        lambda i: f"{path}, line {used[i][0]}",
    )
    for (number, _), line, ids in zip(used, given, task.encode_target(given)):
        if len(ids) + 1 > limit:
            raise UsageError(
                f"{path}, line {number}: {len(ids) + 1} target tokens; the model takes at most "
                f"{limit} (model.max_positions)"
            )
        side[number - 1] = line
    return side


def _finite(value):
    """A JSON answer with every number that is not finite (NaN, infinities: the scores of a model
    whose weights are broken, or of a target it cannot write) as null: a bare NaN is not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _answers(decoder: Decoder, sources, found, asked: Asked) -> list:
    """Each line's answer: its best output, as the task displays it with `pretty`; or with
    `asked.as_json()` a JSON object with every output, its score and the model's log-probability."""
    if not asked.as_json():
        texts = [outs[0].text.replace("\r", " ").replace("\n", " ") for outs in found]
        if asked.pretty:
            return [decoder.task.display(t).rstrip("\n") + "\n" if t else "" for t in texts]
        return texts
    flat = [(i, out) for i, outs in enumerate(found) for out in outs]
    rated = decoder.target_scores([sources[i] for i, _ in flat], [out.tokens for _, out in flat])
    answers = [[] for _ in found]
    for (i, out), r in zip(flat, rated):
        answers[i].append(
            {
                "output": out.text,
                "score": round(out.score, 4) if out.found else None,  # None: no output found
                "logprob": round(r.logprob, 4) if out.found else None,
                "tokens": len(r.tokens) if out.found else 0,
                **({} if out.utility is None else {"utility": round(out.utility, 4)}),
            }
        )
    return [{"outputs": a} for a in answers]


def _rated(decoder: Decoder, sources, targets) -> list[dict]:
    """The model's log-probabilities of the given target lines (`_check_side` checked them), one
    JSON object each."""
    ids = decoder.task.encode_target(list(targets))
    return [r.as_dict() for r in decoder.target_scores(sources, ids)]


def _source_line(raw: bytes, name: str, number: int, task, max_positions: int) -> str | None:
    """The source of one input line (`prepared_sources`), or None (with a warning) when it cannot be
    decoded."""
    try:
        line = prepared_sources(task, [textio.decode_line(raw, name, number)])[0]
    except DataError as e:
        log.warning("%s; its output line is empty", e)
        return None
    try:
        ids = task.encode_source([line])[0]
    except DataError as e:  # a multilingual model's language code typed into the text
        raise UsageError(f"{name}, line {number}: {e}") from None
    unknown = unknown_words(task, line, ids)
    if unknown:
        shown = ", ".join(unknown[:10]) + (
            f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        )
        log.warning(
            "%s, line %d: %d word(s) the model has never seen (not in its vocabulary, read as "
            "<unk>): %s",
            name,
            number,
            len(unknown),
            shown,
        )
    n = len(ids) + 1  # + EOS
    if n > max_positions:
        log.warning(
            "%s, line %d: %d source tokens do not fit model.max_positions=%d; its output line is "
            "empty",
            name,
            number,
            n,
            max_positions,
        )
        return None
    return line


def loaded(job: Job, registry) -> tuple:
    """(cfg, member, model) of the job's run (or ensemble), its beam and n-best checked."""
    from .loading import load_ensemble

    if len(job.runs) > 1:
        cfg, member, model = load_ensemble(job.runs, registry, job.overrides, job.task)
    else:
        cfg, member, model = load_for_inference(job.runs[0], registry, job.overrides, job.task)
    wanted = job.asked.wanted
    beam, vocab = decode_settings(member, cfg.decode).beam, member.task.tgt_vocab_size
    if beam > vocab:
        raise ConfigError(
            f"{job.beam_setting}={beam}: the beam is larger than the target vocabulary of "
            f"{job.runs[0]} ({vocab} tokens)"
        )
    problem = wanted.problem(beam)  # the check the server and the Python API make
    if problem:
        raise UsageError(f"--{problem}")
    return cfg, member, model


def generate_file(job: Job, registry, stdout) -> Counts:
    """`s2s generate`: decode the lines of `job.input` (None: stdin) with the run (or ensemble)
    into `job.output` (None: `stdout`); returns the `Counts`. A regular output file (a link's
    target) appears complete at the end; a device, a pipe or /dev/stdout is written as it goes
    (`files.replacing`)."""
    cfg, member, model = loaded(job, registry)
    raw = (
        textio.raw_lines(job.input)
        if job.input
        else (line[:-1] if line.endswith(b"\n") else line for line in sys.stdin.buffer)
    )
    output = job.output
    replaced = replaced_file(output) if output else None
    if replaced is not None:
        remove_stale_temporaries(replaced.parent)
    try:
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(replacing(output)) if output else stdout
            bar = stack.enter_context(progress(job.quiet, desc="generate", unit=" sent"))
            lines = InputLines(raw, job.input or "<stdin>")
            return generate_lines(decoder_of(cfg, member, model), lines, out, job.asked, bar)
    except OSError as e:  # a full disk, a closed pipe (reading errors are DataErrors)
        if isinstance(e, BrokenPipeError) and not output:
            raise  # the reader of stdout stopped early (`| head`): the command ends quietly
        raise UsageError(f"cannot write {output or '<stdout>'}: {e.strerror or e}") from None
