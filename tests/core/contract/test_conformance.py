"""The conformance kit (`s2s.core.task_checks`, `s2s check-task`): a sound task passes every
check; each broken task below fails the check of what it breaks, in one line naming the cause;
demo, translation and parsing pass on tiny data.

The tasks here are written as a plugin author would, with `s2s.core`'s names: a character-level
task reading tab-separated files (its tokenizer keeps spaces), and variants of it, each
breaking one thing."""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults

import inspect
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import MULTI30K, NLTK_DATA, corpus, multi30k_slice
from s2s.core import DataError, DecodeDefaults, Score, Task, TaskConfig, task_checks
from s2s.core.contract.checks import at_least, setting
from s2s.core.contract.conformance import CHECKS, checks_of
from s2s.core.contract.resampling import SentenceStatistics
from s2s.core.tokenizers import SPECIALS, UNK
from s2s.core.errors import CheckFailed, ConfigError


class Chars:
    """One id per character, spaces included: the tokenizer of a character-level task."""

    def __init__(self, chars=()):
        self.itos = list(SPECIALS) + sorted(set(chars) - set(SPECIALS))
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self):
        return len(self.itos)

    def encode(self, lines):
        return [[self.stoi.get(c, UNK) for c in line] for line in lines]

    def decode(self, ids):
        return "".join(self.itos[i] for i in ids if i >= len(SPECIALS))

    def save(self, path):
        Path(path).write_text(json.dumps(self.itos), encoding="utf-8")

    @classmethod
    def load(cls, path):
        chars = cls()
        chars.itos = json.loads(Path(path).read_text(encoding="utf-8"))
        chars.stoi = {c: i for i, c in enumerate(chars.itos)}
        return chars


def write_data(folder: Path) -> Path:
    """Tiny tab-separated splits: a phrase and its words reversed (spaces, non-ASCII letters)."""
    rng = np.random.default_rng(0)
    words = ["ab", "cde", "fé", "ghî", "xyz", "mno", "pq", "rst", "üv"]
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 200), ("valid", 12), ("test", 12)):
        lines = []
        for _ in range(n):
            phrase = list(rng.choice(words, size=rng.integers(1, 5)))
            lines.append(" ".join(phrase) + "\t" + " ".join(reversed(phrase)))
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@dataclass
class ReverseConfig(TaskConfig):
    data_dir: str = ""
    max_chars: int = setting(100, at_least(1))


class Reverse(Task):
    """Reverse the words of a phrase, character by character; exact-match accuracy."""

    name = "reverse"
    Config = ReverseConfig
    decoding = DecodeDefaults(beam=2, alpha=0.6, max_len_a=1.5, max_len_b=5)
    Vocab = Chars

    def read_split(self, split):
        path = Path(self.cfg.data_dir) / f"{split}.tsv"
        if not path.is_file():
            raise DataError(f"{path} does not exist")
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8").rstrip("\n")
                except UnicodeDecodeError:
                    raise DataError(f"{path}, line {n}: not UTF-8") from None
                source, sep, target = line.partition("\t")
                if not sep:
                    raise DataError(f"{path}, line {n}: no tab between source and target")
                yield source, target

    def build_vocab(self, pairs):
        self.src_vocab = self.tgt_vocab = Chars(c for s, t in pairs for c in s + t)

    def score(self, hypotheses, references, sources=None):
        right = sum(h == r for h, r in zip(hypotheses, references))
        return Score("accuracy", 100.0 * right / len(references))

    def statistics(self, hypotheses, references, sources=None):
        rows = np.array([[h == r] for h, r in zip(hypotheses, references)], dtype=float)
        return SentenceStatistics(
            rows.reshape(-1, 1), lambda totals: {"accuracy": 100 * totals[:, 0] / len(rows)}
        )


DATA = write_data(Path(tempfile.mkdtemp(prefix="s2s-kit-test-")))
CONFIG = {"data_dir": str(DATA)}


# -- the broken tasks: each breaks one thing ----------------------------------------------------
class SpaceDropping(Chars):
    """docs/plugins.md's old tokenizer: characters joined by spaces, spaces removed on decoding."""

    def encode(self, lines):
        return super().encode(["".join(line.split(" ")) for line in lines])


class DropsSpaces(Reverse):
    Vocab = SpaceDropping

    def build_vocab(self, pairs):
        self.src_vocab = self.tgt_vocab = SpaceDropping(c for s, t in pairs for c in s + t)


class ConstantScore(Reverse):
    def score(self, hypotheses, references, sources=None):
        return Score("accuracy", 50.0)

    statistics = Task.statistics


class ErrorRateUndeclared(Reverse):
    """An error rate (lower is better) that says nothing of its direction."""

    def score(self, hypotheses, references, sources=None):
        wrong = sum(h != r for h, r in zip(hypotheses, references))
        return Score("error_rate", 100.0 * wrong / len(references))

    statistics = Task.statistics


class StatisticsOff(Reverse):
    def statistics(self, hypotheses, references, sources=None):
        rows = np.array([[h == r] for h, r in zip(hypotheses, references)], dtype=float)
        return SentenceStatistics(rows.reshape(-1, 1), lambda t: {"accuracy": t[:, 0]})


class RawOpen(Reverse):
    """Reads with open(): a missing file is a FileNotFoundError, bad bytes a UnicodeDecodeError."""

    def read_split(self, split):
        with open(Path(self.cfg.data_dir) / f"{split}.tsv", encoding="utf-8") as f:
            for line in f:
                source, _, target = line.rstrip("\n").partition("\t")
                yield source, target


@dataclass
class AssertingConfig(TaskConfig):
    data_dir: str = ""
    max_chars: int = 100

    @staticmethod
    def check_relations(section, where):
        assert section.max_chars > 0, "max_chars must be positive"


class AssertingConfigTask(Reverse):
    Config = AssertingConfig


class ZeroBeam(Reverse):
    decoding = DecodeDefaults(beam=0)


class TooShort(Reverse):
    decoding = DecodeDefaults(beam=2, max_len_a=0.0, max_len_b=3)


class Forgetful(Chars):
    """save writes the characters in another order than their ids."""

    def save(self, path):
        Path(path).write_text(json.dumps(sorted(self.itos, reverse=True)), encoding="utf-8")


class ForgetfulTask(Reverse):
    Vocab = Forgetful

    def build_vocab(self, pairs):
        self.src_vocab = self.tgt_vocab = Forgetful(c for s, t in pairs for c in s + t)


class FromZero(Chars):
    """Ids that start at 0, over the engine's <pad>, <s> and </s>."""

    def encode(self, lines):
        return [[max(0, i - 4) for i in ids] for ids in super().encode(lines)]


class FromZeroTask(Reverse):
    def build_vocab(self, pairs):
        self.src_vocab = self.tgt_vocab = FromZero(c for s, t in pairs for c in s + t)


class Impure(Reverse):
    calls = 0

    def postprocess(self, hypothesis, source):
        Impure.calls += 1
        return f"{hypothesis} {Impure.calls}"


class EmptyCrash(Reverse):
    def score(self, hypotheses, references, sources=None):
        per = [len(r) / len(h) for h, r in zip(hypotheses, references)]
        return Score("ratio", -abs(1 - sum(per) / len(per)))


@dataclass
class NoDefaultConfig(TaskConfig):
    data_dir: str


class NoDefault(Reverse):
    Config = NoDefaultConfig


#: broken task -> (the check it fails, words its one line says)
BROKEN = {
    DropsSpaces: ("target_round_trip", ["line 1", "spaces lost"]),
    ConstantScore: ("references_score_best", ["must score best"]),
    ErrorRateUndeclared: ("references_score_best", ["higher is better"]),
    StatisticsOff: ("statistics_combine", ["accuracy", "must agree"]),
    RawOpen: ("missing_data_named", ["FileNotFoundError", "DataError"]),
    AssertingConfigTask: ("config_rejects_bad_values", ["task.max_chars=-1", "AssertionError"]),
    ZeroBeam: ("decoding_defaults", ["decoding.beam=0"]),
    TooShort: ("max_length_covers_references", ["valid line", "max_len_a"]),
    ForgetfulTask: ("vocab_save_load", ["save_vocab and load_vocab"]),
    FromZeroTask: ("ids_in_range", ["<pad> <s> </s>"]),
    Impure: ("postprocess", ["two outputs"]),
    EmptyCrash: ("empty_outputs_scored", ["ZeroDivisionError", "test_conformance.py, line"]),
    NoDefault: ("name_and_config", ["data_dir has no default"]),
}


@pytest.mark.parametrize("broken", list(BROKEN), ids=lambda c: c.__name__)
def test_a_broken_task_fails_its_check_in_one_line_naming_the_cause(broken):
    check_name, words = BROKEN[broken]
    (check,) = checks_of(broken, CONFIG, only=[check_name])
    with pytest.raises(CheckFailed) as e:
        check()
    message = str(e.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message


def test_a_file_read_with_open_fails_on_a_bad_line_naming_the_file():
    (check,) = checks_of(RawOpen, CONFIG, only=["bad_line_named"])
    with pytest.raises(CheckFailed, match=r"train\.tsv, line 2: read_split raised UnicodeDecode"):
        check()


def test_a_failed_read_is_named_once_and_pointed_at_by_the_others(tmp_path):
    found = {c.name: c for c in checks_of(Reverse, {"data_dir": str(tmp_path)})}
    with pytest.raises(CheckFailed, match="DataError raised: .*train.tsv does not exist"):
        found["splits_read"]()
    with pytest.raises(CheckFailed, match=r"needs read_split\('train'\).*check splits_read"):
        found["target_round_trip"]()


@pytest.mark.parametrize("check", task_checks(Reverse, config=CONFIG, skip=["round_trip"]))
def test_a_sound_task_passes_every_check(check):
    check()


@pytest.mark.parametrize(
    "check",
    task_checks(
        ConstantScore,
        config=CONFIG,
        only=["score_valid", "references_score_best"],
        known_failures={"references_score_best": "a constant score ranks nothing"},
    ),
)
def test_a_known_failure_is_declared_with_its_reason(check):
    check()


def test_a_check_that_cannot_apply_says_why_and_pytest_skips_it():
    """A task that makes its own data has no file to miss: the check returns its reason and the
    pytest form skips with it, where a pass would hide that nothing was tested."""
    from s2s.plugins.demo import DemoTask

    only = ["missing_data_named"]
    assert "makes its own data" in checks_of(DemoTask, {"train_size": 50}, only=only)[0]()
    (param,) = task_checks(DemoTask, config={"train_size": 50}, only=only)
    with pytest.raises(pytest.skip.Exception, match="not applicable: .*makes its own data"):
        param.values[0]()


def test_the_kit_has_each_check_its_own_id():
    params = task_checks(Reverse, config=CONFIG)
    assert [p.id for p in params] == list(CHECKS) and len(CHECKS) >= 15
    with pytest.raises(CheckFailed, match="no check 'nope'"):
        task_checks(Reverse, config=CONFIG, known_failures={"nope": "?"})
    assert isinstance(ConfigError("x"), Exception)


def _kit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", "check-task", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_task_prints_a_line_a_check_and_fails_with_a_broken_one(tmp_path):
    plugin = tmp_path / "spaces.py"
    header = (
        "import json\nfrom dataclasses import dataclass\nfrom pathlib import Path\n\n"
        "import numpy as np\n\n"
        "from s2s.core import DataError, DecodeDefaults, Score, Task, TaskConfig\n"
        "from s2s.core.contract.checks import at_least, setting\n"
        "from s2s.core.contract.resampling import SentenceStatistics\n"
        "from s2s.core.tokenizers import SPECIALS, UNK\n\n\n"
    )
    spaces = (
        "\n\nclass Spaces(Reverse):\n    name = 'spaces'\n    Vocab = SpaceDropping\n\n"
        "    def build_vocab(self, pairs):\n"
        "        self.src_vocab = self.tgt_vocab = SpaceDropping(c for s, t in pairs for c in s + t)\n"
    )
    parts = [Chars, ReverseConfig, Reverse, SpaceDropping]
    plugin.write_text(
        header + "\n\n".join(inspect.getsource(c) for c in parts) + spaces, encoding="utf-8"
    )
    done = _kit("spaces", f"task.data_dir={DATA}", "--plugin", str(plugin), "--skip", "round_trip")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == len(CHECKS)  # one a check (round_trip skipped), then the count
    failed = [line for line in lines if line.startswith("FAIL")]
    assert failed[0].startswith("FAIL  target_round_trip: target of split train, line 1"), failed
    assert lines[-1].startswith("task 'spaces' (plugin file ") and "checks passed" in lines[-1]


# -- the built-in tasks pass ----------------------------------------------------------------------
def _passes(name: str, *overrides: str, skip=("--skip", "round_trip")) -> None:
    """Every check the task is given passes or says in its line why it does not apply."""
    done = _kit(name, *overrides, *skip)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = len(CHECKS) - bool(skip)
    absent = [line for line in done.stdout.splitlines() if line.startswith("n/a")]
    assert all(": " in line for line in absent), absent  # each with its reason
    figure = f" checks passed, {len(absent)} not applicable" if absent else " checks passed in"
    assert f"{ran - len(absent)} of {ran}{figure}" in done.stdout, done.stdout
    return absent


def _translation(tmp_path) -> list[str]:
    corpus(MULTI30K)
    data = multi30k_slice(tmp_path / "m30k", {"train": 300, "val": 20, "test_2016_flickr": 20})
    return [
        "task.source=text",
        f"task.data_dir={data}",
        "task.valid_prefix=val",
        "task.test_prefix=test_2016_flickr",
        "task.vocab_size=400",
    ]


def _parsing(tmp_path) -> list[str]:
    """150 / 15 / 15 trees of the shared treebank sample, one a line (corpus=lines)."""
    from omegaconf import OmegaConf

    from s2s.plugins.parsing import ParsingConfig, ParsingTask

    sample = OmegaConf.merge(
        OmegaConf.structured(ParsingConfig),
        {"corpus": "nltk_sample", "nltk_data": str(corpus(NLTK_DATA))},
    )
    folder = tmp_path / "trees"
    folder.mkdir()
    for split, n in (("train", 150), ("valid", 15), ("test", 15)):
        trees = [t for _, t in zip(range(n), ParsingTask(sample).references(split))]
        (folder / f"{split}.trees").write_text("\n".join(trees) + "\n", encoding="utf-8")
    return ["task.corpus=lines", f"task.data_dir={folder}"]


DEMO = ["task.train_size=300", "task.valid_size=20", "task.test_size=20"]


def test_demo_translation_and_parsing_pass_the_quick_checks(tmp_path):
    absent = _passes("demo", *DEMO)  # its data is generated: no file to miss or break
    assert [line.split(":")[0].split()[1] for line in absent] == [
        "missing_data_named",
        "bad_line_named",
    ], absent
    _passes("translation", *_translation(tmp_path))
    _passes("parsing", *_parsing(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["demo", "translation", "parsing"])
def test_the_built_in_tasks_pass_the_whole_kit_round_trip_included(name, tmp_path):
    overrides = {
        "demo": lambda: DEMO,
        "translation": lambda: _translation(tmp_path),
        "parsing": lambda: _parsing(tmp_path),
    }[name]()
    _passes(name, *overrides, skip=())


@pytest.mark.slow
def test_a_sound_plugin_passes_the_round_trip():
    (check,) = checks_of(Reverse, CONFIG, only=["round_trip"])
    check()
