"""The conformance kit: the checks a task must pass before the engine trains it, for its author.

`task_checks(MyTask, config={...})` gives them as pytest parameters, one test id a check, for a
plugin's own tests (the way scikit-learn's `parametrize_with_checks` does for estimators):

    @pytest.mark.parametrize("check", task_checks(MyTask, config={"size": 200}))
    def test_my_task_conforms(check):
        check()

and `s2s check-task NAME` runs the same checks from the command line. Each check tests one thing
the engine relies on (that a target line survives encoding and decoding, spaces and non-ASCII
text included; that references score best against themselves, in the direction the score
declares; that the per-sentence statistics add up to the corpus figures; that the config refuses
bad values in one line; ...) and fails with one line (`CheckFailed`) saying what broke and
where: the split and line, the key, the file; a check that cannot apply to the task (no data
file to break in a task that makes its own data) says why (`s2s check-task` prints `n/a`, pytest
skips it with the reason). A check the author knows fails is declared with a
reason (`known_failures={"check name": "why"}`): pytest then expects it to fail, and says so
when it passes.

Checks share one task, built once with the vocabulary trained on the task's own training split,
so the whole kit costs about one tiny training run: `round_trip` trains a one-layer model for a
few dozen updates with the `s2s` commands an author runs (`s2s train`, `s2s generate`,
`s2s score`, in processes of their own), reloads it and scores its outputs. Give the task a
`config` whose splits are small: the kit reads them whole.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable

from ..errors import CheckFailed, ConfigError, DataError
from . import checks
from .task import DecodeDefaults, Score, Task, TaskConfig, checked_score
from ..tokenizers import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary

#: how many lines of a split the checks that go line by line look at
LINES = 300
#: a line of text no task's data is likely to hold: letters outside ASCII, spaces inside
NON_ASCII = "naïve café über Ωmega 東京 ß"


class Subject:
    """The task under test, built once and shared by the checks: its class, its config section
    (an omegaconf object with `Config`'s fields), its splits read, and one instance whose
    vocabulary is trained on the training split."""

    def __init__(self, task_cls: type[Task], config=None, plugin: str | None = None):
        self.cls = task_cls
        self.given = dict(config or {})
        self.given.pop("name", None)
        self.plugin = plugin
        self._cfg = None
        self._task: Task | Exception | None = None
        self._pairs: dict[str, list | Exception] = {}
        self.reading = False  # True while check splits_read runs: it reports the error itself
        self.building = False  # the same for check vocab_built
        # the checks' files (a vocabulary, a copy of the data, the round trip's run), removed
        # with the subject
        self._tmp = tempfile.TemporaryDirectory(
            prefix=f"s2s-check-{getattr(task_cls, 'name', 'x')}-"
        )
        self.tmp = Path(self._tmp.name)

    @property
    def cfg(self):
        if self._cfg is None:
            self._cfg = self.section(self.given)
        return self._cfg

    def section(self, values: dict):
        """`Config`'s section with `values` over its defaults; a bad value is a CheckFailed."""
        from omegaconf import OmegaConf

        try:
            return OmegaConf.merge(OmegaConf.structured(self.cls.Config), values)
        except Exception as e:  # noqa: BLE001 -- omegaconf's own errors: a key or a type
            first = str(getattr(e, "msg", e)).splitlines()[0]
            raise CheckFailed(f"the config given does not fit {self.cls.Config.__name__}: {first}")

    def fresh(self, cfg=None) -> Task:
        """A new instance of the task on `cfg` (default: the config given)."""
        return self.cls(self.cfg if cfg is None else cfg)

    def pairs(self, split: str) -> list[tuple[str, str]]:
        """The pairs of `split`, read once; when reading failed, every check needing them says
        so in a line pointing at the check that names the cause."""
        if split not in self._pairs:
            try:
                self._pairs[split] = list(self.fresh().read_split(split))
            except Exception as e:  # noqa: BLE001 -- said by check splits_read
                self._pairs[split] = e
        found = self._pairs[split]
        if isinstance(found, Exception):
            if self.reading:
                raise found
            raise CheckFailed(
                f"needs read_split({split!r}), which raised {type(found).__name__} "
                "(check splits_read says where)"
            )
        return found

    def some(self, split: str) -> list[tuple[str, str]]:
        return self.pairs(split)[:LINES]

    @property
    def task(self) -> Task:
        """The instance with its vocabulary trained on the training split; when building it
        failed, every check needing it says so in a line pointing at check vocab_built."""
        if self._task is None:
            task = self.fresh()
            pairs = self.pairs("train")
            try:
                task.build_vocab(iter(pairs))
                self._task = task
            except Exception as e:  # noqa: BLE001 -- said by check vocab_built
                self._task = e
        if isinstance(self._task, Exception):
            if self.building:
                raise self._task
            raise CheckFailed(
                f"needs build_vocab, which raised {type(self._task).__name__} "
                "(check vocab_built says where)"
            )
        return self._task

    def held_out(self) -> list[tuple[str, str]]:
        """Held-out pairs to score and decode: the valid split's first LINES."""
        pairs = self.some("valid")
        if len(pairs) < 2:
            raise CheckFailed(f"the valid split has {len(pairs)} pairs; the checks need 2 or more")
        return pairs


@dataclass(frozen=True)
class TaskCheck:
    """One check of one task: call it to run it; it raises CheckFailed with one line, or
    returns why it does not apply to this task (a task that reads no file has no file to name),
    None when it ran and passed."""

    name: str
    subject: Subject = dataclasses.field(repr=False)
    run: Callable[[Subject], str | None] = dataclasses.field(repr=False)
    doc: str = ""

    def __call__(self) -> str | None:
        try:
            return self.run(self.subject)
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001 -- whatever the task's code raised, in one line
            what = _line(e)
            raise CheckFailed(
                f"{type(e).__name__} raised{f': {what}' if what else ''}{_where(e)}"
            ) from e

    def __str__(self) -> str:
        return self.name


def _line(error: BaseException, width: int = 160) -> str:
    """The first line of an error's message, cut to `width` characters."""
    text = (str(error).splitlines() or [""])[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def _where(error: BaseException) -> str:
    """ " (in FILE, line N, in FUNCTION)": the innermost frame of the traceback outside s2s."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    engine = str(Path(__file__).resolve().parent.parent)
    outside = [f for f in frames if not str(Path(f.filename).resolve()).startswith(engine)]
    if not outside:
        return ""
    f = outside[-1]
    return f" (in {f.filename}, line {f.lineno}, in {f.name})"


# -- the checks ---------------------------------------------------------------------------------
def check_name_and_config(s: Subject) -> None:
    """A name the engine can use for folders and keys; a Config dataclass whose fields have
    defaults; the splits training needs."""
    import re

    name = getattr(s.cls, "name", None)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise CheckFailed(
            f"{s.cls.__name__}.name = {name!r}: set a name of a letter, then letters, digits, _"
        )
    config = s.cls.Config
    if not (dataclasses.is_dataclass(config) and issubclass(config, TaskConfig)):
        raise CheckFailed(f"{s.cls.__name__}.Config: make it a @dataclass subclassing TaskConfig")
    for f in dataclasses.fields(config):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise CheckFailed(f"{config.__name__}.{f.name} has no default: give it one")
    missing = [split for split in ("train", "valid") if split not in s.fresh().splits]
    if missing:
        raise CheckFailed(f"splits {tuple(s.fresh().splits)} lack {', '.join(missing)}")


def check_config_defaults_valid(s: Subject) -> None:
    """The config given passes the checks its fields declare, and check_relations."""
    try:
        checks.check_section("task", s.cls.Config, s.cfg)
    except ConfigError as e:
        raise CheckFailed(f"the config given is refused: {_line(e)}") from None


def _bad_values(field: dataclasses.Field, allowed) -> list:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    if kind in ("int", "float"):
        candidates = [-1, 0, -(10**9), 10**9]
    elif kind == "str":
        candidates = ["", "not-a-valid-choice"]
    elif kind == "bool":
        return []
    else:
        candidates = [-1, "", "not-a-valid-choice"]
    if allowed is None:
        return candidates[:1] if kind in ("int", "float") else []
    found = []
    for value in candidates:
        try:
            ok = allowed.test(value)
        except TypeError:
            ok = False
        if not ok:
            found.append(value)
    return found[:1]


def check_config_rejects_bad_values(s: Subject) -> None:
    """A value a field declares it refuses (and -1 for an undeclared number) is refused with one
    line naming the key, a ConfigError, never another exception or a second line."""
    from omegaconf import OmegaConf

    base = OmegaConf.to_container(s.cfg)
    for f in dataclasses.fields(s.cls.Config):
        allowed = f.metadata.get("allowed")
        for value in _bad_values(f, allowed):
            key = f"task.{f.name}"
            try:
                section = OmegaConf.merge(
                    OmegaConf.structured(s.cls.Config), {**base, f.name: value}
                )
            except Exception:  # noqa: BLE001 -- a value of another type: omegaconf refuses it
                continue
            try:
                checks.check_section("task", s.cls.Config, section)
            except ConfigError as e:
                message = str(e)
                if "\n" in message:
                    raise CheckFailed(f"{key}={value!r} is refused on several lines: keep one")
                if allowed is not None and f.name not in message:
                    raise CheckFailed(f"{key}={value!r} is refused without naming {key}: {message}")
            except Exception as e:  # noqa: BLE001 -- check_relations raising something else
                raise CheckFailed(
                    f"{key}={value!r}: check_relations raised {type(e).__name__} ({_line(e)}); "
                    f"raise s2s.core.errors.ConfigError naming {key} instead"
                ) from None
            else:
                if allowed is not None:
                    raise CheckFailed(
                        f"{key}={value!r} passes although {key} allows {allowed.text}"
                    )


_STOPS = ("bound", "beam", "transformers")
_PENALTIES = ("gnmt", "power")


def check_decoding_defaults(s: Subject) -> None:
    """`decoding` is a DecodeDefaults of values the search takes."""
    d = s.fresh().decoding
    if not isinstance(d, DecodeDefaults):
        raise CheckFailed(f"decoding is {type(d).__name__}: make it s2s.core.DecodeDefaults(...)")

    def whole(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def number(v, lo):
        return (
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= lo
        )

    problems = [
        (not whole(d.beam, 1), f"beam={d.beam!r}: a whole number >= 1"),
        (not number(d.alpha, 0), f"alpha={d.alpha!r}: a finite number >= 0"),
        (not number(d.max_len_a, 0), f"max_len_a={d.max_len_a!r}: a finite number >= 0"),
        (not whole(d.max_len_b, 0), f"max_len_b={d.max_len_b!r}: a whole number >= 0"),
        (not whole(d.min_len, 0), f"min_len={d.min_len!r}: a whole number >= 0"),
        (d.stop not in _STOPS, f"stop={d.stop!r}: one of {', '.join(_STOPS)}"),
        (
            d.length_penalty not in _PENALTIES,
            f"length_penalty={d.length_penalty!r}: one of {', '.join(_PENALTIES)}",
        ),
    ]
    for broken, what in problems:
        if broken:
            raise CheckFailed(f"decoding.{what}")
    if number(d.max_len_a, 0) and whole(d.max_len_b, 0) and d.max_len_a + d.max_len_b < 1:
        raise CheckFailed("decoding: max_len_a + max_len_b < 1 leaves no room for one token")


def check_splits_read(s: Subject) -> None:
    """Every split the task names reads as (str, str) pairs of one line each; train and valid
    are not empty."""
    for split in s.fresh().splits:
        s.reading = True
        try:
            pairs = s.pairs(split)
        finally:
            s.reading = False
        if split in ("train", "valid") and not pairs:
            raise CheckFailed(f"read_split({split!r}) yields no pairs")
        for n, pair in enumerate(pairs, 1):
            if not (
                isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
            ):
                raise CheckFailed(
                    f"read_split({split!r}), pair {n}: {pair!r:.60} is not a (str, str) tuple"
                )
            if any("\n" in x for x in pair):
                raise CheckFailed(f"read_split({split!r}), pair {n}: a side holds a newline")


def _path_fields(config) -> list[str]:
    """Config fields that name files or folders: declared so, or named `*_dir`, `*_file`,
    `*_path` or `nltk_data`."""
    return [
        f.name
        for f in dataclasses.fields(config)
        if f.metadata.get(
            "path", f.name.endswith(("_dir", "_file", "_path")) or f.name == "nltk_data"
        )
    ]


def check_missing_data_named(s: Subject) -> str | None:
    """With every file or folder setting pointed at an empty folder, read_split raises a
    DataError naming a path there (a task whose data is generated passes)."""
    from omegaconf import OmegaConf

    fields = [f for f in _path_fields(s.cls.Config) if s.cfg.get(f)]
    if not fields:
        return "no file or folder setting: the task makes its own data"
    empty = s.tmp / "empty"
    empty.mkdir(exist_ok=True)
    values = {**OmegaConf.to_container(s.cfg), **{f: str(empty) for f in fields}}
    try:
        list(s.fresh(s.section(values)).read_split("train"))
    except DataError as e:
        if str(empty) not in str(e):
            raise CheckFailed(
                f"with {', '.join('task.' + f for f in fields)} an empty folder, read_split's "
                f"DataError names no file there: {_line(e)}"
            ) from None
        return
    except Exception as e:  # noqa: BLE001 -- FileNotFoundError and the like
        raise CheckFailed(
            f"with {', '.join('task.' + f for f in fields)} an empty folder, read_split raised "
            f"{type(e).__name__} ({_line(e)}): raise s2s.core.DataError naming the file"
        ) from None
    raise CheckFailed(
        f"with {', '.join('task.' + f for f in fields)} an empty folder, read_split('train') "
        "raised nothing: missing data must raise s2s.core.DataError naming the file"
    )


def check_bad_line_named(s: Subject) -> str | None:
    """A line of invalid UTF-8 in a data file (a copy, under the task's data folder) is read
    past or refused with a DataError naming the file and the line."""
    import shutil

    from omegaconf import OmegaConf

    from ..files import recording

    fields = [f for f in _path_fields(s.cls.Config) if s.cfg.get(f) and Path(s.cfg[f]).is_dir()]
    if not fields:
        return "no data folder setting: the task reads no data file"
    with recording() as seen:
        list(s.fresh().read_split("train"))
    folder = Path(s.cfg[fields[0]]).resolve()
    texts = sorted(p for p in map(Path, seen) if p.is_relative_to(folder) and p.suffix != ".gz")
    target = next((p for p in texts if _text_lines(p) >= 3), None)
    if target is None:
        return f"no plain text file of three lines or more read from {folder}"
    copy = s.tmp / "bad_line"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    broken = copy / target.relative_to(folder)
    lines = broken.read_bytes().split(b"\n")
    lines[1] = b"\xff\xfe not UTF-8 \xc3"
    broken.write_bytes(b"\n".join(lines))
    values = {**OmegaConf.to_container(s.cfg), fields[0]: str(copy)}
    try:
        list(s.fresh(s.section(values)).read_split("train"))
    except DataError as e:
        message = str(e)
        if broken.name not in message or "2" not in message:
            raise CheckFailed(
                f"invalid UTF-8 at {broken}, line 2: the DataError names not the file and line "
                f"({_line(e)})"
            ) from None
    except Exception as e:  # noqa: BLE001 -- UnicodeDecodeError and the like
        raise CheckFailed(
            f"invalid UTF-8 at {broken}, line 2: read_split raised {type(e).__name__}; raise "
            "s2s.core.DataError naming the file and the line"
        ) from None


def _text_lines(path: Path) -> int:
    try:
        return path.read_text(encoding="utf-8").count("\n")
    except (OSError, UnicodeDecodeError):
        return 0


def check_vocab_built(s: Subject) -> None:
    """build_vocab sets src_vocab and tgt_vocab, Vocabulary objects with more than the four
    specials."""
    s.building = True
    try:
        task = s.task
    finally:
        s.building = False
    for side in ("src_vocab", "tgt_vocab"):
        vocab = getattr(task, side)
        if vocab is None:
            raise CheckFailed(f"build_vocab did not set self.{side}")
        if not isinstance(vocab, Vocabulary):
            raise CheckFailed(
                f"self.{side} is a {type(vocab).__name__}, without the Vocabulary protocol's "
                "len, encode, decode, save and load"
            )
        if len(vocab) <= len(SPECIALS):
            raise CheckFailed(f"self.{side} holds {len(vocab)} entries, no more than the specials")


def _ids_problem(ids, size: int) -> str | None:
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return f"encodes to {type(ids).__name__} {ids!r:.40}, not a list of ints"
    bad = [i for i in ids if i in (PAD, BOS, EOS) or not 0 <= i < size]
    if bad:
        return f"encodes to id {bad[0]}: ids 0-2 are the engine's (<pad> <s> </s>), all < {size}"
    return None


def check_ids_in_range(s: Subject) -> None:
    """Encoded lines are lists of ids in the vocabulary, none of them <pad>, <s> or </s>."""
    task = s.task
    pairs = s.some("train") + s.some("valid")
    for side, encode, size in (
        ("source", task.encode_source, task.src_vocab_size),
        ("target", task.encode_target, task.tgt_vocab_size),
    ):
        lines = [p[0] if side == "source" else p[1] for p in pairs]
        encoded = encode(lines)
        if len(encoded) != len(lines):
            raise CheckFailed(f"encode_{side} of {len(lines)} lines gave {len(encoded)} id lists")
        for n, ids in enumerate(encoded, 1):
            problem = _ids_problem(ids, size)
            if problem:
                raise CheckFailed(f"{side} line {n} {lines[n - 1][:60]!r} {problem}")
        ids = [i for found in encoded for i in found]
        if ids and ids.count(UNK) > len(ids) / 2:
            raise CheckFailed(
                f"{100 * ids.count(UNK) / len(ids):.0f}% of the {side} tokens of the training "
                "and valid lines are <unk>: the vocabulary misses most of the task's own text"
            )


def _round_trip(s: Subject, side: str, lines: list[str], what: str) -> None:
    """CheckFailed naming the first line of `lines` without <unk> that does not come back from
    encoding and decoding (a line with <unk> cannot)."""
    task = s.task
    if side == "target":
        encoded, decode = task.encode_target(lines), task.decode_target
    else:
        encoded, decode = task.encode_source(lines), task.src_vocab.decode
    for n, (line, ids) in enumerate(zip(lines, encoded), 1):
        if UNK in ids:
            continue
        back = decode(ids)
        if back != line:
            raise CheckFailed(
                f"{what}, line {n}: {line[:60]!r} comes back from encode_{side} and "
                f"decode as {back[:60]!r}{_difference(line, back)}"
            )


def _difference(line: str, back: str) -> str:
    if line.replace(" ", "") == back.replace(" ", ""):
        return " (spaces lost or added: the tokenizer must keep them)"
    return ""


def check_target_round_trip(s: Subject) -> None:
    """Every training and valid target line without <unk> comes back from encode_target and
    decode_target as it was."""
    for split in ("train", "valid"):
        _round_trip(s, "target", [t for _, t in s.some(split)], f"target of split {split}")


def check_source_round_trip(s: Subject) -> None:
    """Every training and valid source line without <unk> comes back from encode_source and
    the source vocabulary's decode as it was."""
    for split in ("train", "valid"):
        _round_trip(s, "source", [x for x, _ in s.some(split)], f"source of split {split}")


def _generated(s: Subject, side: int, n: int = 100) -> list[str]:
    """Lines of the side's own words (split at spaces) in new orders and lengths, one space
    between words, as a model may write them."""
    words = [w for pair in s.some("train") for w in pair[side].split(" ") if w]
    rng = random.Random(1234)
    return [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(n)] if words else []


def check_generated_text_round_trip(s: Subject) -> None:
    """Lines made of the training targets' words in new orders (spaces between them) come back
    from encode_target and decode_target as they were, where they have no <unk>."""
    _round_trip(s, "target", _generated(s, 1), "generated target text")


def check_non_ascii_text(s: Subject) -> None:
    """Text with letters outside ASCII encodes to ids in the vocabulary (unknown ones <unk>), and
    comes back as it was where it has no <unk>: the task's own non-ASCII words, and a line of
    foreign letters."""
    task = s.task
    own = [w for pair in s.some("train") for w in pair[1].split(" ") if not w.isascii()]
    lines = [NON_ASCII, *(" ".join(own[i : i + 5]) for i in range(0, min(len(own), 200), 5))]
    encoded = task.encode_target(lines)
    for n, (line, ids) in enumerate(zip(lines, encoded), 1):
        problem = _ids_problem(ids, task.tgt_vocab_size)
        if problem:
            raise CheckFailed(f"non-ASCII target text, line {n} {line[:60]!r} {problem}")
        if not isinstance(task.decode_target(ids), str):
            raise CheckFailed(f"decode_target of non-ASCII line {n} returned no str")
    _round_trip(s, "target", lines, "non-ASCII target text")


def check_vocab_save_load(s: Subject) -> None:
    """save_vocab then load_vocab (in a new instance) gives vocabularies of the same sizes,
    sharing and ids."""
    task = s.task
    folder = s.tmp / "vocab"
    folder.mkdir(exist_ok=True)
    task.save_vocab(folder)
    again = s.fresh()
    again.load_vocab(folder)
    for what, a, b in (
        ("source size", task.src_vocab_size, again.src_vocab_size),
        ("target size", task.tgt_vocab_size, again.tgt_vocab_size),
        ("shared_vocab", task.shared_vocab, again.shared_vocab),
    ):
        if a != b:
            raise CheckFailed(f"after save_vocab and load_vocab the {what} is {b}, was {a}")
    pairs = s.some("valid")[:50] + s.some("train")[:50]
    for side, x, y in (
        ("source", task.encode_source, again.encode_source),
        ("target", task.encode_target, again.encode_target),
    ):
        lines = [p[0] if side == "source" else p[1] for p in pairs]
        for n, (before, after) in enumerate(zip(x(lines), y(lines)), 1):
            if before != after:
                raise CheckFailed(
                    f"after save_vocab and load_vocab, {side} line {n} {lines[n - 1][:50]!r} "
                    "encodes to other ids (does Vocab.load read what save wrote?)"
                )


def check_max_length_covers_references(s: Subject) -> None:
    """Every valid target fits the decoding's length limit, max_len_a * source tokens +
    max_len_b: a search cannot write a longer output."""
    task = s.task
    d = task.decoding
    pairs = s.held_out()
    sources = task.encode_source([p[0] for p in pairs])
    targets = task.encode_target([p[1] for p in pairs])
    for n, (x, y) in enumerate(zip(sources, targets), 1):
        limit = int(d.max_len_a * len(x) + d.max_len_b)
        if len(y) > limit:
            raise CheckFailed(
                f"valid line {n}: the reference has {len(y)} tokens, but decoding allows "
                f"{d.max_len_a} * {len(x)} + {d.max_len_b} = {limit} for its source: raise "
                "decoding.max_len_a or max_len_b"
            )


def check_postprocess(s: Subject) -> None:
    """postprocess returns a str, the same one twice (it is a pure function), and prepare_source
    one str a line."""
    task = s.task
    pairs = s.held_out()
    for n, (src, tgt) in enumerate(pairs, 1):
        decoded = task.decode_target(task.encode_target([tgt])[0])
        first, second = task.postprocess(decoded, src), task.postprocess(decoded, src)
        if not isinstance(first, str):
            raise CheckFailed(f"postprocess of valid line {n} returned {type(first).__name__}")
        if first != second:
            raise CheckFailed(f"postprocess of valid line {n} returned two outputs for one input")
    prepared = task.prepare_source([src for src, _ in pairs])
    if len(prepared) != len(pairs) or not all(isinstance(x, str) for x in prepared):
        raise CheckFailed(f"prepare_source of {len(pairs)} lines did not return {len(pairs)} strs")


def check_output_target_inverse(s: Subject) -> None:
    """output_target undoes postprocess: a reference's output (what `s2s generate` writes) made
    back into a target line is the line the model writes."""
    task = s.task
    for n, (src, tgt) in enumerate(s.held_out(), 1):
        ids = task.encode_target([tgt])[0]
        if UNK in ids:
            continue
        decoded = task.decode_target(ids)
        back = task.output_target(task.postprocess(decoded, src), src)
        if back != decoded:
            raise CheckFailed(
                f"valid line {n}: output_target(postprocess(target)) is {back[:50]!r}, not "
                f"the target {decoded[:50]!r}"
            )


def _outputs(s: Subject) -> tuple[list[str], list[str], list[str]]:
    """(sources, references, other lines): the valid split's sources and targets (what
    validation scores), and the targets each shifted to the next source."""
    pairs = s.held_out()
    sources = [p[0] for p in pairs]
    refs = [p[1] for p in pairs]
    shifted = refs[1:] + refs[:1]
    return sources, refs, shifted


def _better(score: Score, a: float, b: float) -> bool:
    return a > b if getattr(score, "higher_is_better", True) else a < b


def check_score_valid(s: Subject) -> None:
    """score returns a Score with a finite value and a name, the same for the same lines."""
    task = s.task
    sources, refs, shifted = _outputs(s)
    first = checked_score(task, task.score(shifted, refs, sources))
    second = checked_score(task, task.score(shifted, refs, sources))
    if first.value != second.value:
        raise CheckFailed(f"score of the same lines gave {first.value} then {second.value}")
    if not isinstance(first.figures, dict) or not all(isinstance(k, str) for k in first.figures):
        raise CheckFailed("Score.figures must map figure names (str) to values")


def check_references_score_best(s: Subject) -> None:
    """The references scored against themselves beat other lines (each reference shifted to
    the next source's), in the direction the Score declares (`higher_is_better`)."""
    task = s.task
    sources, refs, shifted = _outputs(s)
    if len(set(refs)) < 2:
        raise CheckFailed("the valid split's references are all the same line: nothing to rank")
    best = checked_score(task, task.score(refs, refs, sources))
    other = checked_score(task, task.score(shifted, refs, sources))
    if not _better(best, best.value, other.value):
        way = "higher" if getattr(best, "higher_is_better", True) else "lower"
        raise CheckFailed(
            f"references against themselves score {best.name} {best.value}, other lines "
            f"{other.value}: the references must score best ({way} is better)"
        )


def check_empty_outputs_scored(s: Subject) -> None:
    """Empty outputs (a model may write nothing) get a finite score, no better than the
    references'."""
    task = s.task
    sources, refs, _ = _outputs(s)
    empty = checked_score(task, task.score([""] * len(refs), refs, sources))
    best = checked_score(task, task.score(refs, refs, sources))
    if _better(empty, empty.value, best.value):
        raise CheckFailed(
            f"empty outputs score {empty.value}, better than the references' {best.value}"
        )


def check_statistics_combine(s: Subject) -> str | None:
    """statistics (when the task gives them) has one row a sentence, and the figures of the
    summed rows are score's figures."""
    task = s.task
    sources, refs, shifted = _outputs(s)
    hyps = [r if i % 2 else h for i, (h, r) in enumerate(zip(shifted, refs))]
    stats = task.statistics(hyps, refs, sources)
    if stats is None:
        return "the task gives no per-sentence statistics"
    rows = getattr(stats, "rows", None)
    if rows is None or getattr(rows, "shape", (0,))[0] != len(hyps):
        raise CheckFailed(
            f"statistics of {len(hyps)} sentences has {getattr(rows, 'shape', ['no'])[0]} rows"
        )
    score = checked_score(task, task.score(hyps, refs, sources))
    wanted = {score.name: score.value, **score.figures}
    corpus = stats.corpus()
    shared = [k for k in corpus if k in wanted]
    if score.name not in corpus:
        raise CheckFailed(f"statistics gives no {score.name!r}, score's primary figure")
    for key in shared:
        a, b = float(corpus[key]), float(wanted[key])
        if not math.isclose(a, b, rel_tol=1e-6, abs_tol=0.006):
            raise CheckFailed(
                f"the statistics' summed rows give {key} {a:.4f}, score gives {b:.4f}: they "
                "must agree"
            )


def check_round_trip(s: Subject) -> None:
    """A one-layer model trained for a few dozen updates with `s2s train`, reloaded by
    `s2s generate` and its outputs scored by `s2s score`: one output a source line, a finite
    figure (the commands an author runs, each in a process of its own)."""
    from omegaconf import OmegaConf

    folder = s.tmp / "round_trip"
    folder.mkdir(exist_ok=True)
    plugin = _plugin_spec(s)
    preset = {
        "task": {"name": s.cls.name, **OmegaConf.to_container(s.cfg)},
        "model": {"layers": 1, "d_model": 32, "d_ff": 64, "heads": 2},
        "optim": {"max_updates": 30, "warmup": 10},
        "data": {"cache_dir": str(folder / "cache"), "max_tokens": 1000},
        "decode": {"beam": 2},  # the machinery, not the search, is under test
        "run": {
            "dir": str(folder / "run"),
            "valid_interval": 30,
            "save_interval": 30,
            "log_interval": 10,
            "threads": 1,
            "device": "cpu",
            "quiet": True,
        },
    }
    (folder / "tiny.yaml").write_text(json.dumps(preset), encoding="utf-8")
    pairs = s.held_out()[:8]
    task = s.task
    sources = [p[0] for p in pairs]
    (folder / "src.txt").write_text("".join(x + "\n" for x in sources), encoding="utf-8")
    (folder / "ref.txt").write_text(
        "".join(task.postprocess(t, x) + "\n" for x, t in pairs), encoding="utf-8"
    )
    overrides = [f"task.{k}={v}" for k, v in OmegaConf.to_container(s.cfg).items()]
    _s2s(folder, "train", str(folder / "tiny.yaml"), *plugin)
    _s2s(
        folder,
        "generate",
        str(folder / "run"),
        "--input",
        str(folder / "src.txt"),
        "--output",
        str(folder / "hyp.txt"),
        *plugin,
    )
    outputs = (folder / "hyp.txt").read_text(encoding="utf-8").split("\n")[:-1]
    if len(outputs) != len(sources):
        raise CheckFailed(f"s2s generate wrote {len(outputs)} lines for {len(sources)} sources")
    found = _s2s(
        folder,
        "score",
        s.cls.name,
        *overrides,
        "--ref",
        str(folder / "ref.txt"),
        "--hyp",
        str(folder / "hyp.txt"),
        "--src",
        str(folder / "src.txt"),
        "--json",
        *plugin,
    )
    try:
        figure = next(iter(json.loads(found.splitlines()[-1]).values()))
    except (ValueError, IndexError, StopIteration):
        raise CheckFailed(f"s2s score printed no JSON object: {found[-100:]!r}") from None
    if not isinstance(figure, (int, float)) or not math.isfinite(figure):
        raise CheckFailed(f"s2s score gave {figure!r}, not a finite figure")


def _plugin_spec(s: Subject) -> list[str]:
    """The `--plugin` the commands need to find the task: none for an installed one; the file a
    `--plugin FILE.py` came from; else `module:Class`."""
    if s.plugin:  # a file's path made absolute: the commands run in another folder
        is_file = s.plugin.endswith(".py") or Path(s.plugin).is_file()
        return ["--plugin", str(Path(s.plugin).resolve()) if is_file else s.plugin]
    value = f"{s.cls.__module__}:{s.cls.__qualname__}"
    if any(ep.name == s.cls.name and ep.value == value for ep in entry_points(group="s2s.tasks")):
        return []
    module = sys.modules.get(s.cls.__module__)
    if s.cls.__module__.startswith("s2s_plugin_") and getattr(module, "__file__", None):
        return ["--plugin", module.__file__]
    if "<locals>" in s.cls.__qualname__:
        raise CheckFailed(
            f"{s.cls.__qualname__} is defined inside a function: the s2s commands import it as "
            "module:Class, so define it at a module's top level"
        )
    return ["--plugin", value]


def _s2s(cwd: Path, *args: str) -> str:
    """`s2s ARGS` in a process of its own (the importable modules of this one), its stdout; a
    CheckFailed with its last line when it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise CheckFailed(f"s2s {args[0]} failed: {last}")
    return done.stdout


#: every check, in the order they run (cheap first); name -> function
CHECKS: dict[str, Callable[[Subject], None]] = {
    "name_and_config": check_name_and_config,
    "config_defaults_valid": check_config_defaults_valid,
    "config_rejects_bad_values": check_config_rejects_bad_values,
    "decoding_defaults": check_decoding_defaults,
    "splits_read": check_splits_read,
    "missing_data_named": check_missing_data_named,
    "bad_line_named": check_bad_line_named,
    "vocab_built": check_vocab_built,
    "ids_in_range": check_ids_in_range,
    "target_round_trip": check_target_round_trip,
    "source_round_trip": check_source_round_trip,
    "generated_text_round_trip": check_generated_text_round_trip,
    "non_ascii_text": check_non_ascii_text,
    "vocab_save_load": check_vocab_save_load,
    "max_length_covers_references": check_max_length_covers_references,
    "postprocess": check_postprocess,
    "output_target_inverse": check_output_target_inverse,
    "score_valid": check_score_valid,
    "references_score_best": check_references_score_best,
    "empty_outputs_scored": check_empty_outputs_scored,
    "statistics_combine": check_statistics_combine,
    "round_trip": check_round_trip,
}


def checks_of(
    task_cls: type[Task], config=None, plugin: str | None = None, only=None, skip=()
) -> list[TaskCheck]:
    """The kit's checks of `task_cls` on its `config` section (a dict of its fields; the defaults
    for the rest), sharing one task: every check, or those named in `only`, less `skip`.
    `plugin`: the `--plugin` the s2s commands need to find the task (found by itself for an
    installed task, a --plugin file's and an importable module's)."""
    if not (inspect.isclass(task_cls) and issubclass(task_cls, Task)):
        raise TypeError(f"{task_cls!r} is not a subclass of s2s.core.Task")
    unknown = [n for n in (*(only or ()), *skip) if n not in CHECKS]
    if unknown:
        raise CheckFailed(f"no check named {unknown[0]!r}; the checks: {', '.join(CHECKS)}")
    subject = Subject(task_cls, config, plugin)
    return [
        TaskCheck(name, subject, run, inspect.getdoc(run) or "")
        for name, run in CHECKS.items()
        if (only is None or name in only) and name not in skip
    ]


def task_checks(
    task_cls: type[Task], config=None, known_failures: dict | None = None, **options
) -> list:
    """The kit's checks of `task_cls` as pytest parameters, each with its own id (the check's
    name); a check named in `known_failures` (name -> the reason) is expected to fail (pytest's
    strict xfail: it reports the check when it passes); a check that does not apply to the task
    is skipped with its reason. `config` and the other `options` (`plugin`, `only`, `skip`) as
    `checks_of` takes them."""
    import pytest

    def skipping(run):
        def checked(subject: Subject) -> None:
            why_not = run(subject)
            if why_not:
                pytest.skip(f"not applicable: {why_not}")

        return checked

    known = dict(known_failures or {})
    unknown = [n for n in known if n not in CHECKS]
    if unknown:
        raise CheckFailed(
            f"known_failures names no check {unknown[0]!r}; the checks: {', '.join(CHECKS)}"
        )
    return [
        pytest.param(
            dataclasses.replace(check, run=skipping(check.run)),
            id=check.name,
            marks=[pytest.mark.xfail(reason=known[check.name], raises=CheckFailed, strict=True)]
            if check.name in known
            else [],
        )
        for check in checks_of(task_cls, config, **options)
    ]
