"""Treebank recipes: WSJ in LDC's layout, one-tree-per-line files, preprocessing, bad input."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from conftest import NLTK_DATA, needs
from omegaconf import OmegaConf
from s2s.core.errors import DataError
from s2s.core.tokenizers import SPECIALS, UNK
from s2s.data_recipes.treebank import (
    Preprocessing,
    ReadStats,
    line_trees,
    preprocess,
    read_trees,
    to_string,
)
from s2s.plugins.parsing import ParsingConfig, ParsingTask
from conftest import ROOT

# A tree as LDC99T42 writes it: blank outer bracket, function tags, co-indices, empty elements.
MRG_TREE = """\
( (S 
    (NP-SBJ-1 (DT The) (NN {word}) )
    (VP (VBD said) 
      (SBAR (-NONE- 0) 
        (S 
          (NP-SBJ (-NONE- *T*-1) )
          (VP (VBD rose) 
            (NP-EXT (CD 5) (NN %) )))))
    (. .) ))
"""
PREPROCESSED = "(TOP (S (NP (DT The) (NN {word})) (VP (VBD said) (SBAR (S (VP (VBD rose) (NP (CD 5) (NN %)))))) (. .)))"


def write_ldc(root: Path, trees_per_file: int = 2) -> Path:
    """<root>/parsed/mrg/wsj/00 .. 24, one file per section; the noun names the section."""
    for s in range(25):
        d = root / "parsed" / "mrg" / "wsj" / f"{s:02d}"
        d.mkdir(parents=True)
        trees = [MRG_TREE.format(word=f"sec{s:02d}")] * trees_per_file
        (d / f"wsj_{s:02d}01.mrg").write_text("\n".join(trees))
    return root


def task_for(**kw) -> ParsingTask:
    return ParsingTask(OmegaConf.structured(ParsingConfig(**kw)))


def test_wsj_recipe_standard_split(tmp_path):
    task = task_for(corpus="wsj", wsj_root=str(write_ldc(tmp_path / "LDC99T42")))
    split = {name: list(task.read_split(name)) for name in ("train", "valid", "test")}
    assert [len(split[n]) for n in ("train", "valid", "test")] == [40, 2, 2]
    sections = lambda pairs: sorted({src.split()[1] for src, _ in pairs})  # noqa: E731
    assert sections(split["train"]) == [f"sec{s:02d}" for s in range(2, 22)]
    assert sections(split["valid"]) == ["sec22"] and sections(split["test"]) == ["sec23"]
    src, tgt = split["test"][0]
    assert src == "The sec23 said rose 5 % ."  # empty elements gone
    assert tgt == "(S (NP XX XX )NP (VP XX (SBAR (S (VP XX (NP XX XX )NP )VP )S )SBAR )VP XX )S"
    assert list(task.references("test")) == [PREPROCESSED.format(word="sec23")] * 2
    # the rebuilt tree of the target is the reference, as EVALB sees it
    assert (
        task.score([task.postprocess(tgt, src)], [PREPROCESSED.format(word="sec23")]).value == 100.0
    )


def test_wsj_root_may_name_the_sections_directory_and_custom_sections(tmp_path):
    root = write_ldc(tmp_path / "ldc") / "parsed" / "mrg" / "wsj"
    task = task_for(corpus="wsj", wsj_root=str(root), wsj_train="00-01,24", wsj_test="23")
    assert {s.split()[1] for s, _ in task.read_split("train")} == {"sec00", "sec01", "sec24"}


def test_wsj_missing_pieces_are_named(tmp_path):
    with pytest.raises(DataError, match="task.wsj_root"):
        list(task_for(corpus="wsj").read_split("train"))
    with pytest.raises(DataError, match="no WSJ sections"):
        list(task_for(corpus="wsj", wsj_root=str(tmp_path)).read_split("train"))
    root = write_ldc(tmp_path / "ldc")
    (root / "parsed/mrg/wsj/22/wsj_2201.mrg").unlink()
    with pytest.raises(DataError, match="section 22"):
        list(task_for(corpus="wsj", wsj_root=str(root)).read_split("valid"))


def test_malformed_tree_error_names_file_and_line(tmp_path):
    root = write_ldc(tmp_path / "ldc")
    bad = root / "parsed/mrg/wsj/23/wsj_2301.mrg"
    lines = bad.read_text().splitlines()
    second = MRG_TREE.count("\n") + 2  # the line the second tree starts on (after a blank line)
    last = second + MRG_TREE.count("\n") - 2  # index of its last line
    assert lines[last].endswith(".) ))")
    lines[last] = lines[last][:-2]  # it loses two ")"
    bad.write_text("\n".join(lines + [MRG_TREE.format(word="after")]))
    task = task_for(corpus="wsj", wsj_root=str(root))
    with pytest.raises(DataError) as err:
        list(task.read_split("test"))
    assert str(bad) in str(err.value) and f"line {second}:" in str(err.value)
    assert "skip_malformed" in str(err.value)

    task = task_for(corpus="wsj", wsj_root=str(root), skip_malformed=True)
    words = [s.split()[1] for s, _ in task.read_split("test")]
    assert words == ["sec23", "after"]  # the tree after the bad one is still read
    assert task.read_stats["test"].malformed == 1


def test_empty_file_and_stray_bracket_are_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match=f"{empty}: no trees"):
        list(line_trees(empty))
    stats = ReadStats()
    assert list(line_trees(empty, skip_malformed=True, stats=stats)) == [] and stats.malformed == 1
    stray = tmp_path / "stray.txt"
    stray.write_text("(S (NP (NN a)) (VP (VB b)))\n(S (NP (NN a))) (VP (VB b)))\n")
    with pytest.raises(DataError, match=f"{stray}, line 2: malformed tree: closing bracket"):
        list(line_trees(stray))
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("(S (NP the (NN a)) (VP (VB b)))\n")
    with pytest.raises(DataError, match="line 1: malformed tree: word 'the' beside"):
        list(line_trees(mixed))


def test_lines_recipe(tmp_path, caplog):
    trees = [
        "( (S (NP-SBJ (NN a)) (VP (VB b))) )",  # raw, blank root
        "(TOP (S (NP (NN a)) (VP (VB b))))",  # already as EVALB's gold files
        "(S (NP (NN a)) (VP (VB b)))",  # bare
        "(S (NP (NN a)) (VP (VB b))",
    ]  # unbalanced
    for name, lines in (("train", trees[:3] + [""]), ("valid", trees[1:2]), ("test", trees)):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    files = {f"{n}_file": str(tmp_path / f"{n}.txt") for n in ("train", "valid", "test")}
    task = task_for(corpus="lines", **files)
    assert list(task.references("train")) == ["(TOP (S (NP (NN a)) (VP (VB b))))"] * 3
    assert list(task.read_split("valid")) == [("a b", "(S (NP XX )NP (VP XX )VP )S")]
    with pytest.raises(DataError, match=r"test.txt, line 4: malformed tree"):
        list(task.read_split("test"))
    with caplog.at_level(logging.WARNING):
        assert (
            len(list(task_for(corpus="lines", skip_malformed=True, **files).read_split("test")))
            == 3
        )
    assert "skipped 1 malformed" in caplog.text
    with pytest.raises(DataError, match="task.test_file"):
        list(task_for(corpus="lines").read_split("test"))


def test_silver_trees_join_the_training_split_only(tmp_path):
    (tmp_path / "gold.txt").write_text("(TOP (S (NN a)))\n")
    (tmp_path / "silver.txt").write_text("(S (NN b))\n(S (NN c))\n")
    files = {f"{n}_file": str(tmp_path / "gold.txt") for n in ("train", "valid", "test")}
    task = task_for(corpus="lines", silver_trees=str(tmp_path / "silver.txt"), **files)
    assert [s for s, _ in task.read_split("train")] == ["a", "b", "c"]
    assert [s for s, _ in task.read_split("valid")] == ["a"]


def test_preprocessing_switches():
    raw = next(iter(read_trees(MRG_TREE.format(word="x").splitlines(), "x")))
    assert to_string(preprocess(raw)) == PREPROCESSED.format(word="x")
    keep_functions = to_string(preprocess(raw, Preprocessing(strip_functions=False)))
    assert "(NP-SBJ-1 (DT The)" in keep_functions and "(NP-EXT" in keep_functions
    keep_empty = to_string(preprocess(raw, Preprocessing(remove_empty=False)))
    assert "(-NONE- *T*-1)" in keep_empty and "(NP (-NONE- *T*-1))" in keep_empty
    assert to_string(preprocess(raw, Preprocessing(root_label=""))).startswith("(S (NP (DT The)")
    lrb = next(iter(read_trees(["((NP-SBJ (-LRB- -LRB-) (NN x) (-RRB- -RRB-)))"], "x")))
    assert to_string(preprocess(lrb)) == "(TOP (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-)))"


def test_a_label_left_empty_by_stripping_is_an_error_naming_file_and_line(tmp_path):
    """`=2` is nothing but a function tag: stripping it would leave an empty label (issue 43)."""
    trees = tmp_path / "trees.txt"
    trees.write_text("(TOP (S (NN a)))\n(TOP (S (NN b) (=2 (VBZ c))))\n")
    files = {f"{n}_file": str(trees) for n in ("train", "valid", "test")}
    task = task_for(corpus="lines", **files)
    with pytest.raises(DataError, match=r"trees.txt, line 2: the label =2 is empty"):
        list(task.read_split("train"))


def test_vocabulary_caps_and_round_trip(tmp_path):
    task = task_for(
        corpus="wsj", wsj_root=str(write_ldc(tmp_path / "ldc")), src_vocab_size=10, src_min_count=1
    )
    task.build_vocab(task.read_split("train"))
    assert task.src_vocab_size == 10 and not task.shared_vocab
    task.save_vocab(tmp_path)
    other = task_for(corpus="wsj")
    other.load_vocab(tmp_path)
    assert other.src_vocab_size == 10 and other.tgt_vocab_size == task.tgt_vocab_size
    src, tgt = next(iter(task.read_split("test")))
    assert other.decode_target(other.encode_target([tgt])[0]) == tgt
    assert 3 in other.encode_source([src])[0]  # the rare section noun is <unk>


def test_source_words_seen_once_are_unk():
    """<unk> must be trained: a word seen once in training is <unk> there, as unseen words are."""
    pairs = [("the dog barks", "(S (NP XX XX )NP (VP XX )VP )S"), ("the cat", "(NP XX XX )NP")]
    once = task_for()
    once.build_vocab(pairs)
    assert once.src_vocab.itos[len(SPECIALS) :] == ["the"]
    assert once.encode_source(["the dog"])[0][:2] == [once.src_vocab.stoi["the"], UNK]
    every = task_for(src_min_count=1)
    every.build_vocab(pairs)
    assert sorted(every.src_vocab.itos[len(SPECIALS) :]) == ["barks", "cat", "dog", "the"]
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry

    with pytest.raises(
        ValueError, match="task.src_min_count=0: must be a number >= 1"
    ):  # when the config loads
        load_config(
            None, ["task.name=parsing", "task.src_min_count=0"], registry=Registry.installed()
        )


@needs(NLTK_DATA)
def test_sample_preprocessing_reproduces_the_evalb_gold_trees():
    """gold.txt of evalb_cases is the NLTK sample stripped as parsing papers strip it."""
    from s2s.data_recipes.treebank import sample_reader

    cases = ROOT / "tests" / "data" / "evalb_cases"
    reader, files = sample_reader(NLTK_DATA), {}
    gold = (cases / "gold.txt").read_text().splitlines()
    sources = (cases / "gold_sources.txt").read_text().split()
    for line, source in zip(gold, sources):
        fid, k = source.split("#")
        if fid not in files:
            files[fid] = list(read_trees(reader.open(fid).read().splitlines(), fid))
        assert to_string(preprocess(files[fid][int(k)])) == line


@needs(NLTK_DATA)
def test_sample_split_by_file():
    from s2s.data_recipes.treebank import sample_files

    assert sample_files("valid") == [f"wsj_{i:04d}.mrg" for i in range(180, 190)]
    task = task_for(corpus="nltk_sample", nltk_data=str(NLTK_DATA))
    assert len(list(task.read_split("test"))) == 118


def test_presets():
    from s2s.core.setup.config import load_config

    for name, vocab in (
        ("wsj_parsing", 16000),
        ("wsj_parsing_semisup", 32000),
        ("ptb_sample_parsing", 16000),
    ):
        cfg = load_config(name, ["task.wsj_root=/ldc"], task_config_cls=ParsingConfig)
        assert cfg.task.name == "parsing" and cfg.task.src_vocab_size == vocab
        if name.startswith("wsj"):
            assert (cfg.model.layers, cfg.model.d_model, cfg.model.heads, cfg.model.dropout) == (
                4,
                1024,
                16,
                0.3,
            )
        assert cfg.run.dir == f"runs/{name}"
        first = (ROOT / "tasks" / f"{name}.yaml").read_text().splitlines()[0]
        assert first.startswith(f"# s2s train {name}")
    assert ParsingTask.decoding.beam == 21 and ParsingTask.decoding.alpha == 0.3
    assert ParsingTask.decoding.max_len_b == 300


def test_s2s_train_wsj_parsing_end_to_end(tmp_path, tiny, capsys):
    """`s2s train wsj_parsing` prepares and trains on an LDC-layout directory."""
    from s2s.core.apps.cli import main

    root = write_ldc(tmp_path / "LDC99T42", trees_per_file=3)
    rc = main(
        [
            "train",
            "wsj_parsing",
            "--json",
            f"task.wsj_root={root}",
            *tiny(
                "optim.max_updates=4",
                "optim.warmup=2",
                "data.max_tokens=400",
                "run.valid_interval=2",
                "run.save_interval=2",
                "run.average_last=0",
                "decode.beam=2",
                "decode.max_len_b=8",
            ),
        ]
    )
    assert rc == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["update"] == 4
    assert "f1" in result["test"] and result["test"]["sentences"] == 3
