"""The newcomer's path (issue 26): the README's own-corpus commands and raw-text parsing example run
as printed, the export snippets of docs/export.md give `s2s generate --beam 1`'s lines, and each
friction a new user met is gone.

The README's commands run in a fresh folder through bash, exactly as printed, with one change:
`s2s train` gets `SHRINK` appended (a tiny model, a few updates), so that a test trains in
seconds instead of the preset's 15 minutes. Real corpora come from the shared data.
"""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch (s2s.core.RUNTIME_ENV)

import io  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from conftest import MULTI30K, NLTK_DATA, SHARED, needs  # noqa: E402
from s2s.core.apps.cli import build_parser, main  # noqa: E402
from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
EXPORT_DOC = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
SHRINK = (
    "model.layers=1 model.d_model=64 model.d_ff=128 model.heads=2 optim.max_updates=60 optim.warmup=30 "
    "optim.lr_scale=2 run.valid_interval=60 run.save_interval=60 run.valid_max_sentences=8 run.threads=1 "
    "run.max_minutes=0"
)


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end > 0 else None]


def blocks(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


def bash(line: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """One command line as printed (`s2s train` with SHRINK appended), run by bash in `cwd`."""
    if re.match(r"s2s train \S+", line):
        line = f"{line} {SHRINK}"
    environment = {**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})}
    result = subprocess.run(
        ["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=600, env=environment
    )
    assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
    return result


# -- the own-corpus path, as the README prints it ---------------------------------------------------
@pytest.fixture(scope="module")
def own_corpus(tmp_path_factory):
    """The README's five commands, run in a fresh folder on corpus.en / corpus.de (the first 1,300
    Multi30k training pairs); (folder, the commands, their results)."""
    if not MULTI30K.exists():
        pytest.skip(f"real corpus not found: {MULTI30K}")
    where = tmp_path_factory.mktemp("own")
    for lang in ("en", "de"):
        lines = (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").split("\n")[:1300]
        (where / f"corpus.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    commands = [
        line
        for line in blocks(section(README, "Your own data"), "bash")[0].splitlines()
        if line.strip()
    ]
    return where, commands, [bash(line, where) for line in commands]


@pytest.mark.slow
def test_the_readme_own_corpus_commands_run_as_printed(own_corpus):
    where, commands, results = own_corpus
    assert len(commands) == 5 and commands[0].startswith("python -m s2s.data_recipes split")
    assert [c.split()[1] for c in commands[1:]] == ["train", "generate", "score", "export"]
    for split, n in (("train", 300), ("valid", 500), ("test", 500)):  # the split's defaults
        for lang in ("en", "de"):
            assert (
                len(
                    (where / "my_data" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
                )
                == n
            )
    assert (where / "runs" / "own_translation" / "result.json").is_file()
    hyps = (where / "test.hyp.de").read_text(encoding="utf-8").split("\n")
    assert len(hyps) == 501 and hyps[-1] == ""  # one line out per line in
    assert "loaded runs/own_translation/" in results[2].stderr  # generate names its checkpoint
    assert results[3].stdout.startswith("bleu ") and "nrefs:1" in results[3].stdout
    assert (where / "my_model" / "model.bin").is_file()


@pytest.mark.slow
@needs(MULTI30K)
def test_the_export_snippets_give_generate_beam_1s_lines(own_corpus):
    """docs/export.md's CTranslate2 and Hugging Face snippets, run as printed on the run and the
    export of the README's commands, print `s2s generate --beam 1`'s lines."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    where = own_corpus[0]
    sentences = (where / "my_data" / "test.en").read_text(encoding="utf-8").splitlines()[:40]
    (where / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    doc = section(EXPORT_DOC, "Decoding an export as `s2s generate --beam 1` does")
    lines = [line for line in blocks(doc, "bash")[0].splitlines() if line.strip()]
    bash(lines[0], where)  # the Hugging Face export
    expected = bash(lines[1], where).stdout  # s2s generate --beam 1
    snippets = blocks(doc, "python")
    assert len(snippets) == 2 and "ctranslate2" in snippets[0] and "transformers" in snippets[1]

    def same(expected):
        for snippet in snippets:
            out = subprocess.run(
                [sys.executable, "-c", snippet],
                cwd=where,
                capture_output=True,
                text=True,
                timeout=600,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
            assert out.returncode == 0, out.stderr[-3000:]
            assert out.stdout == expected

    same(expected)
    assert (
        len(expected.splitlines()) == 40 and sum(map(bool, expected.splitlines())) >= 30
    )  # German, not nothing
    # where the limit cuts every line: the run's decode.max_len_b=3 (a setting of how to decode, not of the weights)
    from omegaconf import OmegaConf

    config = where / "runs" / "own_translation" / "config.yaml"
    cfg = OmegaConf.load(config)
    cfg.decode.max_len_b = 3
    config.write_text(OmegaConf.to_yaml(cfg), encoding="utf-8")
    cut = bash(lines[1], where).stdout
    assert cut != expected and all(
        len(c) <= len(e) for c, e in zip(cut.splitlines(), expected.splitlines())
    )
    same(cut)


# -- raw text in, as the README prints it -----------------------------------------------------------
@pytest.mark.slow
@needs(NLTK_DATA)
def test_the_readme_raw_text_parsing_example_runs_as_printed(tmp_path):
    """The README's raw-text example (a parser trained a few updates as `s2s train
    ptb_sample_parsing` trains it, with S2S_SHARED_DATA set and no way to download) gives a tree
    whose leaves are the Penn Treebank tokens the README's tree shows, indented."""
    from nltk.tree import Tree

    part = section(README, "Your own data")
    train, command = blocks(part, "bash")[1].splitlines()
    assert train == "s2s train ptb_sample_parsing run.max_minutes=10", train
    shown = Tree.fromstring(blocks(part, "text")[0])
    offline = {
        "S2S_SHARED_DATA": str(SHARED),
        "HOME": str(tmp_path / "home"),  # no nltk_data of the user's
        "S2S_NLTK_INDEX_URL": "http://127.0.0.1:9/index.xml",
        "NLTK_DATA": "",
    }  # a download would fail
    bash(
        f"{train} decode.beam=2", tmp_path, offline
    )  # SHRINK appended: a few updates, not 10 minutes
    out = bash(command, tmp_path).stdout
    tree = Tree.fromstring(out)
    assert (
        tree.leaves()
        == shown.leaves()
        == ["Profits", "rose", "10", "%", "in", "the", "quarter", "."]
    )
    assert out.count("\n") > 2 and out.endswith(
        "\n\n"
    )  # indented, one phrase a line, a blank line after


@pytest.mark.slow
@needs(NLTK_DATA)
def test_own_parsing_trains_on_tree_files_and_parses_raw_text(tmp_path):
    """own_parsing on train/valid/test.trees written from the treebank sample as they are (function
    tags, -NONE- elements and all), then a raw sentence parsed into a tree over its PTB tokens."""
    from nltk.tree import Tree
    from s2s.data_recipes.treebank import sample_trees, to_string

    trees = tmp_path / "my_trees"
    trees.mkdir()
    for split, n in (("train", 400), ("valid", 10), ("test", 10)):
        lines = [to_string(t) for _, t in zip(range(n), sample_trees(NLTK_DATA, split, prep=None))]
        (trees / f"{split}.trees").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "-NONE-" in (trees / "train.trees").read_text(encoding="utf-8")
    bash("s2s train own_parsing task.data_dir=my_trees decode.beam=2", tmp_path)
    out = bash('echo "I don\'t know, he said." | s2s generate runs/own_parsing', tmp_path).stdout
    assert Tree.fromstring(out).leaves() == ["I", "do", "n't", "know", ",", "he", "said", "."]


def test_penn_treebank_tokens():
    from s2s.plugins.parsing import ptb_tokens

    assert (
        ptb_tokens("Profits rose 10% in the quarter.")
        == "Profits rose 10 % in the quarter .".split()
    )
    assert (
        ptb_tokens("They don't expect (much).") == "They do n't expect -LRB- much -RRB- .".split()
    )
    assert ptb_tokens('He said "no".') == ["He", "said", "``", "no", "''", "."]


def test_parsing_prepares_raw_text_unless_told_and_displays_a_tree():
    from omegaconf import OmegaConf
    from s2s.plugins.parsing import ParsingConfig, ParsingTask

    task = ParsingTask(OmegaConf.structured(ParsingConfig()))
    assert task.prepare_source(["I don't know."]) == ["I do n't know ."]
    task = ParsingTask(OmegaConf.structured(ParsingConfig(tokenize=False)))
    assert task.prepare_source(["I  do n't know ."]) == ["I do n't know ."]
    # pre-tokenised brackets as the treebank writes them: never a phrase's bracket in the tree
    assert task.prepare_source(["f(x) ( a ) [b] {c}"]) == [
        "f-LRB-x-RRB- -LRB- a -RRB- -LSB-b-RSB- -LCB-c-RCB-"
    ]
    drawn = task.display("(TOP (S (NP (PRP I)) (VP (VBP know)) (. .)))")
    assert drawn.splitlines()[0] == "(TOP" and len(drawn.splitlines()) > 1
    assert task.display("not a tree (") == "not a tree ("


# -- frictions ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def logged_demo_run(tmp_path_factory):
    """A demo run trained a few updates (through the command line, its console lines captured)."""
    where = tmp_path_factory.mktemp("demo")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "train",
            "demo",
            f"run.dir={where / 'run'}",
            f"data.cache_dir={where / 'cache'}",
            "model.layers=1",
            "model.d_model=32",
            "model.d_ff=64",
            "model.heads=2",
            "optim.max_updates=10",
            "run.log_interval=1",
            "run.valid_interval=10",
            "run.save_interval=10",
            "run.valid_max_sentences=8",
            "run.threads=1",
            "task.train_size=2000",
            "run.max_minutes=0.001",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return where / "run", result.stderr


@pytest.mark.slow
def test_log_lines_read_cleanly_and_the_budget_says_what_it_counts(logged_demo_run):
    _, log = logged_demo_run
    assert " INFO " not in log and "kind train" not in log
    assert re.search(r"^\d\d:\d\d:\d\d train update 1: loss ", log, re.M)
    assert (
        "run.max_minutes=0.001 counts training time across resumes: updates, validation and checkpoints"
        in log
    )
    assert "not data preparation, nor the averaging, dev re-score and test decode" in log
    assert re.search(r"run.max_minutes=0.001 reached at update \d+", log)


@pytest.mark.slow
def test_generate_names_its_checkpoint_and_words_never_seen(logged_demo_run, capsys, caplog):
    from s2s.core.inference.generate import Job, generate_file
    from s2s.core.setup.registry import Registry

    out = io.StringIO()
    sys_stdin = sys.stdin
    try:
        sys.stdin = io.TextIOWrapper(io.BytesIO(b"the dog sees a cat\nThe dog sees a cat.\n"))
        with caplog.at_level(logging.INFO, logger="s2s"):
            number, bad, _ = generate_file(Job([logged_demo_run[0]]), Registry.installed(), out)
    finally:
        sys.stdin = sys_stdin
    assert (number, bad) == (2, 0) and len(out.getvalue().splitlines()) == 2
    from s2s.core.inference import load_run  # the public way gives generate's lines

    assert (
        load_run(logged_demo_run[0]).generate(["the dog sees a cat", "The dog sees a cat."])
        == out.getvalue().splitlines()
    )
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("loaded ") and "checkpoint" in m for m in messages), messages
    unseen = [m for m in messages if "never seen" in m]
    assert (
        len(unseen) == 1
        and unseen[0].startswith("<stdin>, line 2:")
        and "The" in unseen[0]
        and "cat." in unseen[0]
    )


@pytest.mark.slow
def test_a_short_runs_plots_count_seconds(logged_demo_run, tmp_path):
    from s2s.core.apps.plot import plot_run, time_unit

    assert (
        time_unit(90) == ("seconds", 1.0)
        and time_unit(600) == ("minutes", 60.0)
        and time_unit(5 * 3600)[0] == "hours"
    )
    assert {p.name for p in plot_run(logged_demo_run[0], tmp_path)} >= {"loss.png", "lr.png"}


def test_a_mistyped_run_directory_is_named_as_itself(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for argv in (
        ["generate", "runs/demoo"],
        ["export", "runs/demoo", "--to", "safetensors", "--output", "x"],
        ["plot", "runs/demoo"],
        ["average", "runs/demoo", "--last", "2"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "runs/demoo: no such run directory" in err and "runs holds" not in err, err


def test_options_before_the_command_and_help_everywhere():
    parser = build_parser()
    args = parser.parse_args(["-v", "tasks"])
    assert (
        args.verbose
        and parser.parse_args(["tasks", "-v"]).verbose
        and not parser.parse_args(["tasks"]).verbose
    )
    assert parser.parse_args(["-q", "--plugin", "m:C", "tasks"]).plugin == ["m:C"]
    commands = next(
        a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"
    ).choices
    for name in ("tasks", "score", "average", "quickstart"):
        assert commands[name].description, name
    helps = {a.dest: a.help for a in commands["generate"]._actions} | {
        a.dest: a.help for a in commands["score"]._actions
    }
    for dest in ("beam", "alpha", "max_len_a", "max_len_b", "ref", "hyp", "src", "pretty"):
        assert helps[dest], dest


def test_a_plugin_module_in_the_current_folder(tmp_path):
    (tmp_path / "my_chars.py").write_text(
        "from s2s.core.contract.task import Task\n\nclass Chars(Task):\n    name = 'chars'\n",
        encoding="utf-8",
    )
    result = subprocess.run(
        ["s2s", "tasks", "--plugin", "my_chars:Chars"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"^chars\s+--plugin my_chars:Chars$", result.stdout, re.M)


def test_train_with_a_task_name_names_its_presets(capsys):
    assert main(["train", "translation"]) == 2
    err = capsys.readouterr().err
    assert (
        "'translation' is a task, not a preset" in err
        and "own_translation" in err
        and "multi30k_en_de" in err
    )


def test_a_presets_split_names_are_named_when_the_files_differ(tmp_path, capsys):
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (tmp_path / f"{split}.{lang}").write_text("a b\nc d\n", encoding="utf-8")
    argv = [
        "prepare",
        "multi30k_en_de",
        "task.source=text",
        f"task.data_dir={tmp_path}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "task.vocab_size=300",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "val.en does not exist" in err and "task.valid_prefix=val" in err, err


def test_the_shared_data_is_read_and_nothing_downloaded(monkeypatch, tmp_path):
    from s2s.data_recipes import multi30k, treebank

    if not (MULTI30K / "val.en").exists() or not NLTK_DATA.exists():
        pytest.skip(f"real corpus not found: {SHARED}")
    monkeypatch.setenv("S2S_SHARED_DATA", str(SHARED))
    monkeypatch.setenv("S2S_DATA_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(
        treebank, "fetch_sample", lambda *a: pytest.fail("tried to download the treebank")
    )
    monkeypatch.setattr(
        multi30k, "fetch_gzip", lambda *a, **k: pytest.fail("tried to download Multi30k")
    )
    assert multi30k.fetch(splits=["val"], langs=["en", "de"]) == SHARED / "multi30k"
    assert len(treebank.sample_reader(None).fileids()) > 100
    monkeypatch.setenv("S2S_SHARED_DATA", str(tmp_path / "empty"))
    with pytest.raises(
        s2s.core.errors.DataError,
        match=r"S2S_SHARED_DATA=.*\(nothing is downloaded while it is set\)",
    ):
        multi30k.fetch(splits=["val"], langs=["en"])
    assert not (tmp_path / "home").exists()


def test_fetching_goes_on_past_a_corpus_that_fails(monkeypatch, tmp_path, capsys):
    from s2s.data_recipes import multi30k, treebank
    from s2s.data_recipes.__main__ import main as fetch_main

    monkeypatch.delenv("S2S_SHARED_DATA", raising=False)
    calls = []

    def fail(name):
        def fetch(directory=None, *rest, **kw):
            calls.append(name)
            Path(directory).mkdir(parents=True)  # as a download begins
            raise s2s.core.errors.DataError(f"{name} is offline")

        return fetch

    monkeypatch.setattr(multi30k, "fetch", fail("multi30k"))
    monkeypatch.setattr(treebank, "fetch_sample", fail("treebank"))
    assert fetch_main(["multi30k", "treebank", "--dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert calls == ["multi30k", "treebank"]
    assert (
        "multi30k: error: multi30k is offline" in err
        and "treebank: error: treebank is offline" in err
    )
    assert "failed: multi30k, treebank (2 of 2)" in err
    assert not (tmp_path / "data").exists()  # no empty folder left behind


def test_split_writes_the_own_translation_files(tmp_path, capsys):
    from s2s.data_recipes.__main__ import main as recipes

    for lang in ("en", "de"):
        (tmp_path / f"corpus.{lang}").write_text(
            "".join(f"{lang} {i}\n" for i in range(50)), encoding="utf-8"
        )
    argv = [
        "split",
        str(tmp_path / "corpus.en"),
        str(tmp_path / "corpus.de"),
        "--dir",
        str(tmp_path / "d"),
        "--valid",
        "5",
        "--test",
        "5",
    ]
    assert recipes(argv) == 0
    got = {
        p.name: (tmp_path / "d" / p.name).read_text(encoding="utf-8").splitlines()
        for p in (tmp_path / "d").iterdir()
    }
    assert sorted(got) == sorted(
        f"{s}.{lang}" for s in ("train", "valid", "test") for lang in ("en", "de")
    )
    assert [len(got[f"{s}.en"]) for s in ("train", "valid", "test")] == [40, 5, 5]
    for s in ("train", "valid", "test"):  # aligned, in corpus order
        assert [x.split()[1] for x in got[f"{s}.en"]] == [x.split()[1] for x in got[f"{s}.de"]]
        assert got[f"{s}.en"] == sorted(got[f"{s}.en"], key=lambda x: int(x.split()[1]))
    assert (
        recipes(argv) == 2 and "exists already" in capsys.readouterr().err
    )  # nothing written over


def test_the_plugin_example_yaml_has_a_small_model():
    """Item 1 of the issue: docs/plugins.md's example preset sizes the model and its batches."""
    import yaml

    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    preset = next(yaml.safe_load(b) for b in blocks(text, "yaml") if "task:" in b and "model:" in b)
    assert preset["model"]["d_model"] <= 256 and preset["model"]["layers"] <= 3
    assert preset["data"]["max_tokens"] <= 4000


def test_own_presets_name_their_files_in_their_header():
    for name, files in (
        ("own_translation", "train.SRC train.TGT  valid.SRC valid.TGT  test.SRC test.TGT"),
        ("own_parsing", "train.trees  valid.trees  test.trees"),
    ):
        text = (ROOT / "tasks" / f"{name}.yaml").read_text(encoding="utf-8")
        header = text[: text.index("\ntask:")]
        assert files in header and f"s2s train {name} task.data_dir=DIR" in header
