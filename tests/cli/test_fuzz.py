"""Fuzzing: random input ends in a result or a one-line error of the project, never a crash.

Bounded: S2S_FUZZ_EXAMPLES examples per test (default 40, always the same ones); set, the
examples are random. The long run, 7 tests x 15,000 = 105,000 examples:

    S2S_FUZZ_EXAMPLES=15000 python -m pytest -q tests/cli/test_fuzz.py
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from s2s.core.apps.cli import main
from s2s.core.contract.checks import declared
from s2s.core.errors import ConfigError, DataError, RegistryError
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from s2s.core.setup.settings import SECTIONS
from s2s.data_recipes import treebank
from s2s.plugins.parsing.linearise import delinearise

EXAMPLES = int(os.environ.get("S2S_FUZZ_EXAMPLES", "40"))
fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("S2S_FUZZ_EXAMPLES"),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)  # capsys: read every example

SEPARATORS = ["\n", "\r\n", "\r", "\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x85"]
TREE_TOKENS = [
    "(",
    ")",
    "(S",
    ")S",
    "(NP",
    ")NP",
    "(VP",
    ")VP",
    "XX",
    "NN",
    "(TOP",
    ")TOP",
    "((",
    "))",
    "-NONE-",
    "dog",
    "the",
    ".",
    ",",
    "",
]
WORD = st.text(
    st.characters(blacklist_categories=("Cs", "Z", "C"), blacklist_characters="()"),
    min_size=1,
    max_size=6,
)


@pytest.fixture(scope="module")
def registry():
    return Registry.installed()


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory(prefix="s2s-fuzz-") as d:
        yield Path(d)


def _score(task: str, folder: Path, ref: bytes, hyp: bytes, src: bytes | None = None) -> int:
    (folder / "ref").write_bytes(ref)
    (folder / "hyp").write_bytes(hyp)
    args = [
        "score",
        task,
        "--ref",
        str(folder / "ref"),
        "--hyp",
        str(folder / "hyp"),
        "--json",
        "-q",
    ]
    if src is not None:
        (folder / "src").write_bytes(src)
        args += ["--src", str(folder / "src")]
    return main(args)


def _lines(tokens: st.SearchStrategy) -> st.SearchStrategy:
    """Text of a few lines, each joined from `tokens`, with any line separator between them."""
    line = st.lists(tokens, max_size=12).map(" ".join)
    return st.lists(st.tuples(line, st.sampled_from(SEPARATORS)), max_size=6).map(
        lambda parts: "".join(a + b for a, b in parts)
    )


@pytest.mark.parametrize("task", ["translation", "parsing", "demo"])
@fuzz
@given(ref=st.binary(max_size=200), hyp=st.binary(max_size=200))
def test_score_random_bytes(folder, capsys, task, ref, hyp):
    assert _score(task, folder, ref, hyp) in (0, 2)
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err


@pytest.mark.parametrize("task", ["translation", "parsing", "demo"])
@fuzz
@given(
    ref=_lines(st.sampled_from(TREE_TOKENS) | WORD),
    hyp=_lines(st.sampled_from(TREE_TOKENS) | WORD),
    src=st.none() | _lines(WORD),
)
def test_score_random_tokens(folder, capsys, task, ref, hyp, src):
    code = _score(task, folder, ref.encode(), hyp.encode(), None if src is None else src.encode())
    assert code in (0, 2)
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err


@fuzz
@given(
    text=st.binary(max_size=300) | _lines(st.sampled_from(TREE_TOKENS) | WORD).map(str.encode),
    skip=st.booleans(),
)
def test_tree_reading(folder, text, skip):
    path = folder / "trees.txt"
    path.write_bytes(text)
    try:
        trees = list(treebank.line_trees(path, skip_malformed=skip))
    except DataError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    for tree in trees:
        assert treebank.to_string(tree).count("(") == treebank.to_string(tree).count(")")


@fuzz
@given(
    tokens=st.lists(st.sampled_from(TREE_TOKENS) | WORD, max_size=40),
    words=st.lists(WORD.filter(lambda w: w.strip() == w and w.split() == [w]), max_size=12),
    scheme=st.sampled_from(["vinyals", "tags"]),
)
def test_delinearise_any_tokens(tokens, words, scheme):
    tree, repaired = delinearise(" ".join(tokens), words, scheme)  # a decoder's output line
    assert isinstance(tree, str) and isinstance(repaired, bool)
    if words:  # a well-formed tree over exactly the words
        (read,) = treebank.read_trees([tree], "delinearised")
        assert read.leaves() == words


KEYS = sorted(key for name, cls in SECTIONS.items() for key, _ in declared(cls, f"{name}.")) + [
    "task.mode",
    "task.train_size",
    "task.seed",
    "model.pre_norm",
    "decode.stop",
    "run.precision",
    "model.nope",
    "nosection.x",
    "task.name",
    "run",
]
VALUES = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True).map(repr),
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "true",
            "null",
            "",
            "[]",
            "{}",
            "${x}",
            "'",
            "cpu",
            "bound",
            "bf16",
            "parse",
            "1e400",
            "0x10",
        ]
    ),
    st.text(max_size=8),
)


@fuzz
@given(overrides=st.lists(st.tuples(st.sampled_from(KEYS), VALUES).map("=".join), max_size=5))
def test_config_overrides(registry, overrides):
    try:
        cfg = load_config("demo", overrides, registry=registry)
    except (ConfigError, RegistryError) as e:
        assert "\n" not in str(e).strip()
        return
    assert cfg.model.d_model % cfg.model.heads == 0 and cfg.optim.warmup >= 1
