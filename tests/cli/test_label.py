"""`s2s label` through the real command line: self-training and back-translation end to end at
tiny size, a killed labelling resumed without redoing lines, and bad input in one line each."""

from __future__ import annotations

import json
import random

import pytest
from cli_checks import fails, s2s, snapshot
from s2s.data_recipes import treebank
from conftest import TINY_MODEL

WORDS = "the a dog cat man woman sees likes runs sits big small red house park street".split()
TINY = [
    *TINY_MODEL,
    "run.quiet=true",
    "optim.max_updates=3",
    "run.valid_interval=3",
    "run.valid_max_sentences=4",
    "decode.beam=2",
]


@pytest.fixture(autouse=True)
def _info(caplog):
    """s2s's log lines at INFO (data counts, resuming) in caplog."""
    with caplog.at_level("INFO", logger="s2s"):
        yield


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) for _ in range(n)]


def _german(line: str) -> str:
    return " ".join(w + "en" for w in line.split())


def _tree(line: str) -> str:
    w = line.split()
    rest = " ".join(f"(NN {x})" for x in w[3:])
    return f"(TOP (S (NP (DT {w[0]}) (NN {w[1]})) (VP (VBZ {w[2]}) {rest})))"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny parser (own_parsing) and a tiny DE->EN reverse translator, with raw text for each."""
    from s2s.core.apps.cli import main

    root = tmp_path_factory.mktemp("label")
    trees, text = root / "trees", root / "text"
    trees.mkdir()
    text.mkdir()
    for split, size, seed in (("train", 40, 1), ("valid", 4, 2), ("test", 4, 3)):
        lines = _sentences(size, seed)
        (trees / f"{split}.trees").write_text("\n".join(map(_tree, lines)) + "\n")
        (text / f"{split}.en").write_text("\n".join(lines) + "\n")
        (text / f"{split}.de").write_text("\n".join(map(_german, lines)) + "\n")
    cache = root / "cache"
    parser, reverse = root / "parser", root / "reverse"
    args = [f"data.cache_dir={cache}", *TINY]
    assert main(["train", "own_parsing", f"task.data_dir={trees}", f"run.dir={parser}", *args]) == 0
    assert (
        main(
            [
                "train",
                "own_translation",
                f"task.data_dir={text}",
                "task.src_lang=de",
                "task.tgt_lang=en",
                "task.vocab_size=300",
                f"run.dir={reverse}",
                *args,
            ]
        )
        == 0
    )
    raw = root / "raw.en"
    raw.write_text("\n".join(_sentences(12, 7)[:6] + ["", *_sentences(12, 7)[6:]]) + "\n")
    mono = root / "mono.de"
    mono.write_text("\n".join(map(_german, _sentences(20, 8))) + "\n")
    return {
        "root": root,
        "trees": trees,
        "text": text,
        "parser": parser,
        "reverse": reverse,
        "raw": raw,
        "mono": mono,
    }


def test_self_training_writes_a_silver_treebank_that_trains(world, tmp_path, capsys, caplog):
    silver = tmp_path / "silver"
    code, out, err = s2s(
        capsys, "label", world["parser"], "--input", world["raw"], "--output", silver, "--keep",
        "0.5", "-q",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((silver / "summary.json").read_text())
    assert summary["lines"] == 13 and summary["blank"] == 1 and summary["labelled"] == 12
    assert summary["kept"] == 6 and summary["dropped_by_keep"] == 6
    assert "kept 6" in out and f"{silver}/synthetic.trees" in out
    trees = list(treebank.line_trees(silver / "synthetic.trees"))  # the silver trees parse
    raw = [line for line in world["raw"].read_text().splitlines() if line]
    assert len(trees) == 6 and all(" ".join(treebank.leaves(t)) in raw for t in trees)
    labels = [json.loads(x) for x in (silver / "labels.jsonl").read_text().splitlines()]
    assert [x["line"] for x in labels] == list(range(1, 14))
    run = tmp_path / "run"
    code, _, err = s2s(
        capsys, "train", "own_parsing", f"task.data_dir={world['trees']}",
        f"task.silver_trees={silver / 'synthetic.trees'}", f"run.dir={run}",
        f"data.cache_dir={tmp_path / 'cache'}", *TINY, "run.quiet=false",
    )  # fmt: skip
    assert code == 0 and "train: 46 pairs kept" in caplog.text, err  # 40 gold + 6 silver


def test_backtranslation_trains_the_tagged_synthetic_member(world, tmp_path, capsys, caplog):
    labels = tmp_path / "bt"
    code, _, err = s2s(
        capsys, "label", world["reverse"], "--input", world["mono"], "--output", labels,
        "--sampling", "--seed", "2", "-q",
    )  # fmt: skip
    assert code == 0, err
    mono = world["mono"].read_text().splitlines()
    assert (labels / "synthetic.de").read_text().splitlines() == mono  # the real side, in order
    synthetic = (labels / "synthetic.en").read_text().splitlines()
    assert len(synthetic) == len(mono) and all(synthetic)
    run = tmp_path / "run"
    code, _, err = s2s(
        capsys, "train", "backtranslation", f"tasks.parallel.task.data_dir={world['text']}",
        f"tasks.synthetic.task.data_dir={labels}", "tasks.parallel.task.vocab_size=300",
        "tasks.synthetic.task.vocab_size=300", f"run.dir={run}",
        f"data.cache_dir={tmp_path / 'cache'}", *TINY, "run.quiet=false",
    )  # fmt: skip
    assert code == 0, err
    assert "train: 20 pairs kept" in caplog.text  # the synthetic member's pairs
    result = json.loads((run / "result.json").read_text())
    assert list(result["test"]) == ["parallel"]  # no dev or test split of the synthetic member
    assert (run / "test.parallel.hyp.txt").is_file()
    # a reverse model of other languages (DE->EN labels for an FR forward model): named, nothing made
    other = tmp_path / "other"
    before = snapshot(labels, world["text"])
    fails(
        s2s(
            capsys,
            "train",
            "backtranslation",
            f"tasks.parallel.task.data_dir={world['text']}",
            f"tasks.synthetic.task.data_dir={labels}",
            "tasks.synthetic.task.tgt_lang=fr",
            f"run.dir={other}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *TINY,
        ),  # fmt: skip
        before,
        labels / "synthetic.fr",
    )
    assert not other.exists()


def test_a_killed_labelling_resumes_after_its_last_whole_block(world, tmp_path, capsys, caplog):
    """Cut labels.jsonl as a kill would (mid-line), drop the corpus and summary: the same
    command decodes only the rest, and the labels equal an uninterrupted run's (draws too)."""
    argv = ["label", world["reverse"], "--input", world["mono"], "--sampling", "--seed", "5"]
    argv += ["-q", "decode.max_sentences=2"]  # blocks of 2 lines
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert s2s(capsys, *argv, "--output", whole)[0] == 0
    assert s2s(capsys, *argv, "--output", cut)[0] == 0
    text = (cut / "labels.jsonl").read_text()
    lines = text.splitlines(keepends=True)
    (cut / "labels.jsonl").write_text("".join(lines[:7]) + lines[7][:10])
    (cut / "summary.json").unlink()
    (cut / "synthetic.en").unlink()
    code, _, err = s2s(capsys, *argv[:-2], "decode.max_sentences=2", "--output", cut)
    assert code == 0 and "resuming after 6 of 20 lines" in caplog.text, err
    assert (cut / "labels.jsonl").read_text() == (whole / "labels.jsonl").read_text()
    assert (cut / "synthetic.en").read_text() == (whole / "synthetic.en").read_text()


def test_bad_input_is_one_line_and_changes_nothing(world, tmp_path, capsys):
    parser, raw = world["parser"], world["raw"]
    empty, binary = tmp_path / "empty.txt", tmp_path / "binary.txt"
    empty.write_bytes(b"")
    binary.write_bytes(b"the dog\n\x00\x01\x02 barks\n")
    out = tmp_path / "out"
    before = snapshot(tmp_path, parser)
    for argv, needles in (
        (["--input", empty, "--output", out], [empty, "is empty"]),
        (["--input", binary, "--output", out], [binary, "NUL byte at byte 8"]),
        (["--input", raw, "--output", out, "--keep", "0"], ["--keep 0"]),
        (["--input", raw, "--output", out, "--keep", "1.5"], ["--keep 1.5"]),
        (["--input", raw, "--output", out, "--top-k", "3"], ["--top-k 3", "--sampling"]),
        (["--input", raw, "--output", parser], [parser, "run directory"]),
        (["--input", tmp_path / "none.txt", "--output", out], ["none.txt", "no such file"]),
        (["--input", raw, "--output", empty], [empty, "is a file"]),
        (["--input", raw, "--output", empty / "x"], [empty, "not a folder"]),
    ):
        fails(s2s(capsys, "label", parser, *map(str, argv)), before, *needles)
    assert not out.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "synthetic.trees").write_text("(TOP (S (NN my) (NN own)))\n")
    before = snapshot(mine)
    fails(
        s2s(capsys, "label", parser, "--input", raw, "--output", mine),
        before,
        mine,
        "synthetic.trees",
    )
    done = tmp_path / "done"
    assert s2s(capsys, "label", parser, "--input", raw, "--output", done, "-q")[0] == 0
    before = snapshot(done)
    fails(
        s2s(capsys, "label", parser, "--input", raw, "--output", done, "--beam", "1"),
        before,
        done,
        "another job",
        "decode",
    )
    own = done / "synthetic.trees"  # its own output as its input: it would write over it
    fails(
        s2s(capsys, "label", parser, "--input", own, "--output", done),
        before,
        own,
        "label elsewhere",
    )


def test_a_silver_file_that_is_not_trees_is_named_with_its_line(world, tmp_path, capsys):
    silver = tmp_path / "silver.trees"
    silver.write_text("(TOP (S (NN a) (NN b)))\n(TOP (S (NN a) (NN b)\n")
    before = snapshot(world["trees"], silver)
    fails(
        s2s(
            capsys,
            "train",
            "own_parsing",
            f"task.data_dir={world['trees']}",
            f"task.silver_trees={silver}",
            f"run.dir={tmp_path / 'run'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            *TINY,
        ),  # fmt: skip
        before,
        silver,
        "line 2",
    )


def test_a_gzipped_text_file_labels_as_the_plain_one(world, tmp_path, capsys):
    import gzip

    packed = tmp_path / "raw.en.gz"
    packed.write_bytes(gzip.compress(world["raw"].read_bytes()))
    for source, out in ((world["raw"], tmp_path / "plain"), (packed, tmp_path / "packed")):
        assert s2s(capsys, "label", world["parser"], "--input", source, "--output", out)[0] == 0
    plain, unpacked = tmp_path / "plain", tmp_path / "packed"
    assert (plain / "synthetic.trees").read_text() == (unpacked / "synthetic.trees").read_text()
    assert json.loads((unpacked / "summary.json").read_text())["lines"] == 13
