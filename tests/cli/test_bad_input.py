"""Bad input and faults through the real command line, as a new user meets them.

Every case runs `python -m s2s.core.apps.cli ...` in a subprocess and asserts: the exit code (2 for
a known failure), a one-line message that names the file, line or key at fault, no traceback,
and that nothing already on disk changed (every file under the paths involved hashes the same
before and after). One tiny demo run and one tiny translation corpus are made once per module.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from s2s.core.apps.cli import main
from cli_checks import fails, snapshot
from conftest import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "run.quiet=true",
    "run.log_interval=1",
]
DEMO = [
    "task.train_size=200",
    "task.valid_size=10",
    "task.test_size=10",
    "optim.max_updates=2",
    "run.valid_interval=2",
    "run.save_interval=1",
]
EN = [
    "a man rides a horse .",
    "two dogs play in the snow .",
    "a woman reads a book .",
    "children run on the beach .",
    "a cat sleeps on the sofa .",
    "the boy kicks a ball .",
]
DE = [
    "ein mann reitet ein pferd .",
    "zwei hunde spielen im schnee .",
    "eine frau liest ein buch .",
    "kinder rennen am strand .",
    "eine katze schläft auf dem sofa .",
    "der junge tritt einen ball .",
]


def s2s(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        timeout=300,
        env=env,
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny demo run, and a tiny parallel corpus with a preset that reads it."""
    root = tmp_path_factory.mktemp("bad_input")
    run, cache = root / "run", root / "cache"
    assert main(["train", "demo", *TINY, *DEMO, f"run.dir={run}", f"data.cache_dir={cache}"]) == 0
    corpus = root / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.en").write_text("".join(s + "\n" for s in EN), encoding="utf-8")
        (corpus / f"{split}.de").write_text("".join(s + "\n" for s in DE), encoding="utf-8")
    return {"root": root, "run": run, "cache": cache, "corpus": corpus}


def translation_preset(world, name: str, corpus: Path, **task) -> Path:
    """A preset YAML for the translation task on `corpus` (with `task` fields overridden)."""
    section = {
        "name": "translation",
        "source": "text",
        "data_dir": str(corpus),
        "vocab_size": 300,
        **task,
    }
    lines = ["task:"] + [f"  {k}: {json.dumps(v)}" for k, v in section.items()]
    lines += [
        "model: {layers: 1, d_model: 32, d_ff: 64, heads: 2}",
        f"data: {{cache_dir: {json.dumps(str(world['root'] / ('cache_' + name)))}}}",
        f"run: {{dir: {json.dumps(str(world['root'] / ('run_' + name)))}, threads: 1, quiet: true}}",
    ]
    path = world["root"] / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def corpus_copy(world, name: str) -> Path:
    target = world["root"] / f"corpus_{name}"
    shutil.copytree(world["corpus"], target)
    return target


# -- settings: one line naming the dotted key, the value and what is allowed -----------------
CONFIG_CASES = [
    ("model.heads=3", "model.heads=3"),  # does not divide d_model=32
    ("optim.warmup=0", "optim.warmup"),
    ("run.log_interval=0", "run.log_interval"),
    ("run.valid_interval=0", "run.valid_interval"),
    ("run.save_interval=0", "run.save_interval"),
    ("optim.lr_scale=-1", "optim.lr_scale"),
    ("optim.update_freq=0", "optim.update_freq"),
    ("decode.beam=0", "decode.beam"),
    ("model.dropout=1.5", "model.dropout"),
    ("optim.label_smoothing=-0.1", "optim.label_smoothing"),
    ("optim.lr_scale=nan", "optim.lr_scale"),
    ("optim.eps=inf", "optim.eps"),
    ("data.max_tokens=0", "data.max_tokens"),
    ("model.layers=0", "model.layers"),
    ("model.dmodel=64", "model.d_model"),  # unknown key: the nearest valid one
    ("model.layers=abc", "model.layers"),  # wrong type
    ("run.device=gpu", "run.device"),
    ("run.precision=fp8", "run.precision"),
    ("data.max_len=5000", "data.max_len"),  # longer than model.max_positions
    ("run.average_last=9", "run.average_last"),  # more than run.keep_last
    ("run=0", "'run' is a section"),  # a whole section set to a value (found by the fuzzing)
    ("decode.stop=never", "decode.stop"),
    ("optim.beta2=1.0", "optim.beta2"),
    ("task.mode=dance", "task.mode"),  # the task's own check
    ("task.train_sise=5", "task.train_size"),
    ("modle.layers=2", "model"),  # unknown section
    ("run.init_member=parse", "run.init_member is set but run.init_from is not"),  # issue 43
    ("run.init_keep=[schedule]", "run.init_keep is set but run.init_from is not"),
]


@pytest.mark.slow
@pytest.mark.parametrize("override,needle", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_setting(world, override, needle):
    run = world["root"] / "never"
    before = snapshot(world["run"], world["cache"], run)
    result = s2s(
        "train",
        "demo",
        *TINY,
        f"run.dir={run}",
        f"data.cache_dir={world['cache']}",
        override,
        cwd=world["root"],
    )
    fails(result, before, needle)


def test_unknown_preset(world):
    fails(
        s2s("train", "demoo", cwd=world["root"]),
        snapshot(world["root"] / "runs"),
        "'demoo'",
        "'demo'",
    )


@pytest.mark.slow
def test_broken_preset_yaml(world):
    path = world["root"] / "broken.yaml"
    path.write_text("task: {name: demo\nmodel: [\n", encoding="utf-8")
    fails(s2s("train", str(path), cwd=world["root"]), snapshot(path), str(path))


@pytest.mark.slow
def test_unknown_task(world):
    fails(
        s2s("train", "demo", "task.name=nosuch", cwd=world["root"]),
        snapshot(world["run"]),
        "'nosuch'",
    )


@pytest.mark.slow
def test_override_without_value(world):
    fails(
        s2s("train", "demo", "model.layers", cwd=world["root"]),
        snapshot(world["run"]),
        "model.layers",
    )


# -- data ------------------------------------------------------------------------------------
def _prepare_fails(world, name: str, corpus: Path, *needles: str, **task):
    preset = translation_preset(world, name, corpus, **task)
    before = snapshot(corpus, preset, world["root"] / f"cache_{name}")
    message = fails(s2s("prepare", str(preset), cwd=world["root"]), before, *needles)
    leftovers = (
        list((world["root"] / f"cache_{name}").glob(".*"))
        if (world["root"] / f"cache_{name}").is_dir()
        else []
    )
    assert not leftovers, leftovers  # no temporary folder left behind
    return message


def test_parallel_files_differ_in_length(world):
    corpus = corpus_copy(world, "length")
    (corpus / "train.de").write_text("".join(s + "\n" for s in DE[:-1]), encoding="utf-8")
    _prepare_fails(world, "length", corpus, str(corpus / "train.de"), "has 5")


@pytest.mark.slow
def test_invalid_utf8(world):
    corpus = corpus_copy(world, "utf8")
    data = (corpus / "train.en").read_bytes().split(b"\n")
    data[2] = b"a man \xff\xfe rides"
    (corpus / "train.en").write_bytes(b"\n".join(data))
    _prepare_fails(world, "utf8", corpus, str(corpus / "train.en"), "line 3", "UTF-8")


@pytest.mark.slow
def test_corrupt_gz(world):
    corpus = corpus_copy(world, "gz")
    (corpus / "train.de").unlink()
    (corpus / "train.de.gz").write_bytes(b"\x1f\x8b\x08\x00 this is not deflate data at all")
    _prepare_fails(world, "gz", corpus, str(corpus / "train.de.gz"))


@pytest.mark.slow
def test_truncated_gz(world):
    corpus = corpus_copy(world, "gzcut")
    (corpus / "train.de").unlink()
    whole = gzip.compress(("".join(s + "\n" for s in DE) * 50).encode())
    (corpus / "train.de.gz").write_bytes(whole[: len(whole) // 2])
    _prepare_fails(world, "gzcut", corpus, str(corpus / "train.de.gz"))


@pytest.mark.slow
def test_missing_corpus_file(world):
    corpus = corpus_copy(world, "missing")
    (corpus / "valid.de").unlink()
    _prepare_fails(world, "missing", corpus, "valid.de")


@pytest.mark.slow
def test_empty_corpus_files(world):
    corpus = corpus_copy(world, "empty")
    (corpus / "train.en").write_bytes(b"")
    (corpus / "train.de").write_bytes(b"")
    _prepare_fails(world, "empty", corpus, str(corpus / "train.en"), "empty")


@pytest.mark.slow
def test_data_dir_not_set(world):
    _prepare_fails(world, "nodir", world["corpus"], "task.data_dir", data_dir="")


@pytest.mark.slow
def test_same_languages(world):
    _prepare_fails(world, "samelang", world["corpus"], "task.src_lang", tgt_lang="en")


def _tree_preset(world, name: str, train: Path) -> Path:
    good = world["root"] / "good_trees.txt"
    good.write_text("(TOP (S (NP (DT the) (NN dog)) (VP (VBZ barks))))\n", encoding="utf-8")
    path = world["root"] / f"{name}.yaml"
    path.write_text(
        f"task: {{name: parsing, corpus: lines, train_file: {json.dumps(str(train))}, "
        f"valid_file: {json.dumps(str(good))}, test_file: {json.dumps(str(good))}}}\n"
        f"data: {{cache_dir: {json.dumps(str(world['root'] / ('cache_' + name)))}}}\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.slow
def test_malformed_tree(world):
    trees = world["root"] / "bad_trees.txt"
    trees.write_text(
        "(TOP (S (NP (DT a) (NN cat))))\n(TOP (S (NP (DT a) (NN cat)))\n(TOP (X y))\n",
        encoding="utf-8",
    )
    preset = _tree_preset(world, "trees", trees)
    fails(
        s2s("prepare", str(preset), cwd=world["root"]),
        snapshot(trees, preset),
        str(trees),
        "line 2",
    )


@pytest.mark.slow
def test_tree_file_invalid_utf8(world):
    trees = world["root"] / "bad_bytes_trees.txt"
    trees.write_bytes(b"(TOP (S (NP (DT a) (NN cat))))\n(TOP (S (NP (DT \xc3\x28) (NN cat))))\n")
    preset = _tree_preset(world, "treebytes", trees)
    fails(
        s2s("prepare", str(preset), cwd=world["root"]),
        snapshot(trees, preset),
        str(trees),
        "line 2",
        "UTF-8",
    )


@pytest.mark.slow
def test_tree_file_missing(world):
    preset = _tree_preset(world, "treemissing", world["root"] / "no_such_trees.txt")
    fails(s2s("prepare", str(preset), cwd=world["root"]), snapshot(preset), "no_such_trees.txt")


@pytest.mark.slow
def test_dev_sentence_longer_than_positions(world):
    run = world["root"] / "run_positions"
    cache = world["root"] / "cache_positions"
    result = s2s(
        "train",
        "demo",
        *TINY,
        *DEMO,
        "model.max_positions=6",
        "data.max_len=6",
        f"run.dir={run}",
        f"data.cache_dir={cache}",
        cwd=world["root"],
    )
    fails(result, {}, "valid split", "line", "model.max_positions=6")
    assert not list(run.glob("checkpoints/*.pt")), "it failed before training"


@pytest.mark.slow
def test_cache_dir_is_a_file(world):
    blocker = world["root"] / "a_file"
    blocker.write_text("not a folder\n")
    result = s2s("prepare", "demo", *DEMO, f"data.cache_dir={blocker / 'cache'}", cwd=world["root"])
    fails(result, snapshot(blocker), "data.cache_dir", str(blocker))


@pytest.mark.slow
def test_run_dir_is_a_file(world):
    blocker = world["root"] / "a_file_run"
    blocker.write_text("not a folder\n")
    result = s2s(
        "train",
        "demo",
        *TINY,
        *DEMO,
        f"run.dir={blocker / 'run'}",
        f"data.cache_dir={world['cache']}",
        cwd=world["root"],
    )
    fails(result, snapshot(blocker, world["cache"]), str(blocker))


@pytest.mark.slow
def test_resume_with_another_model(world):
    result = s2s(
        "train",
        "demo",
        *TINY,
        *DEMO,
        "model.d_model=64",
        f"run.dir={world['run']}",
        f"data.cache_dir={world['cache']}",
        cwd=world["root"],
    )
    fails(result, snapshot(world["run"], world["cache"]), "checkpoint", str(world["run"]))


# -- plugins -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_plugin_file_import_error(world):
    plugin = world["root"] / "broken_plugin.py"
    plugin.write_text("import no_such_module_anywhere\n")
    fails(
        s2s("tasks", "--plugin", str(plugin), cwd=world["root"]),
        snapshot(plugin),
        str(plugin),
        "no_such_module_anywhere",
    )


@pytest.mark.slow
def test_plugin_file_syntax_error(world):
    plugin = world["root"] / "syntax_plugin.py"
    plugin.write_text("def broken(:\n")
    fails(s2s("tasks", "--plugin", str(plugin), cwd=world["root"]), snapshot(plugin), str(plugin))


@pytest.mark.slow
def test_plugin_module_missing(world):
    fails(
        s2s("tasks", "--plugin", "no_such_pkg.tasks:MyTask", cwd=world["root"]),
        {},
        "no_such_pkg.tasks",
    )


@pytest.mark.slow
def test_plugin_class_missing(world):
    fails(s2s("tasks", "--plugin", "json:NoTask", cwd=world["root"]), {}, "'json'", "NoTask")


def test_plugin_file_missing(world):
    fails(s2s("tasks", "--plugin", "nothere.py", cwd=world["root"]), {}, "nothere.py")


# -- generate ----------------------------------------------------------------------------------
@pytest.fixture
def src(world):
    path = world["root"] / "src.txt"
    path.write_text("the dog sees a cat\na cat runs\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_generate_not_a_run_dir(world, src):
    fails(
        s2s("generate", str(world["corpus"]), "--input", str(src), cwd=world["root"]),
        snapshot(world["corpus"], src),
        str(world["corpus"]),
        "config.yaml",
    )


@pytest.mark.slow
def test_generate_missing_input(world):
    fails(
        s2s("generate", str(world["run"]), "--input", "nope.txt", cwd=world["root"]),
        snapshot(world["run"]),
        "nope.txt",
    )


@pytest.mark.slow
def test_generate_output_folder_missing(world, src):
    out = world["root"] / "no_folder" / "out.txt"
    fails(
        s2s(
            "generate",
            str(world["run"]),
            "--input",
            str(src),
            "--output",
            str(out),
            cwd=world["root"],
        ),
        snapshot(world["run"], src, out.parent),
        str(out.parent),
    )


@pytest.mark.slow
def test_generate_output_is_a_directory(world, src):
    fails(
        s2s(
            "generate",
            str(world["run"]),
            "--input",
            str(src),
            "--output",
            str(world["corpus"]),
            cwd=world["root"],
        ),
        snapshot(world["run"], src, world["corpus"]),
        str(world["corpus"]),
    )


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/dev/full").exists(), reason="needs /dev/full (a disk that is always full)"
)
def test_generate_disk_full(world, src):
    import stat

    fails(
        s2s(
            "generate",
            str(world["run"]),
            "--input",
            str(src),
            "--output",
            "/dev/full",
            cwd=world["root"],
        ),
        snapshot(world["run"], src),
        "cannot write /dev/full",
        "No space left",
    )
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # written to, not replaced


@pytest.mark.slow
def test_generate_empty_input(world):
    empty = world["root"] / "empty_src.txt"
    empty.write_bytes(b"")
    out = world["root"] / "empty_src.out"
    result = s2s(
        "generate",
        str(world["run"]),
        "--input",
        str(empty),
        "--output",
        str(out),
        cwd=world["root"],
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr.decode()
    assert out.read_bytes() == b""


def test_generate_bad_beam(world, src):
    fails(
        s2s("generate", str(world["run"]), "--input", str(src), "--beam", "0", cwd=world["root"]),
        snapshot(world["run"], src),
        "decode.beam",
    )


@pytest.mark.slow
def test_generate_bad_max_len_a(world, src):
    fails(
        s2s(
            "generate",
            str(world["run"]),
            "--input",
            str(src),
            "--max-len-a",
            "-1",
            cwd=world["root"],
        ),
        snapshot(world["run"], src),
        "decode.max_len_a",
    )


@pytest.mark.slow
def test_generate_unknown_override(world, src):
    fails(
        s2s("generate", str(world["run"]), "decode.beem=2", "--input", str(src), cwd=world["root"]),
        snapshot(world["run"], src),
        "decode.beam",
    )


@pytest.mark.slow
def test_generate_damaged_vocabulary(world, src):
    run = world["root"] / "run_badvocab"
    shutil.copytree(world["run"], run)
    (run / "vocab.json").write_bytes(b'["<pad>", "<s>", \x00\xff')
    fails(
        s2s("generate", str(run), "--input", str(src), cwd=world["root"]),
        snapshot(run, src),
        str(run / "vocab.json"),
    )


@pytest.mark.slow
def test_generate_damaged_checkpoint_file(world, src):
    run = world["root"] / "run_badckpt"
    shutil.copytree(world["run"], run)
    ckpt = sorted((run / "checkpoints").glob("*.pt"))[-1]
    data = bytearray(ckpt.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    ckpt.write_bytes(bytes(data))
    fails(
        s2s("generate", str(ckpt), "--input", str(src), cwd=world["root"]),
        snapshot(run, src),
        str(ckpt),
    )


@pytest.mark.slow
def test_generate_checkpoint_not_a_checkpoint(world, src):
    bogus = world["run"] / "config.yaml"
    fails(
        s2s("generate", str(bogus), "--input", str(src), cwd=world["root"]),
        snapshot(world["run"], src),
        str(bogus),
    )


# -- score -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_score_line_counts_differ(world):
    ref, hyp = world["root"] / "ref3.txt", world["root"] / "hyp2.txt"
    ref.write_text("a\nb\nc\n")
    hyp.write_text("a\nb\n")
    fails(
        s2s("score", "translation", "--ref", str(ref), "--hyp", str(hyp), cwd=world["root"]),
        snapshot(ref, hyp),
        str(hyp),
        str(ref),
    )


def test_score_missing_file(world):
    ref = world["root"] / "ref3.txt"
    ref.write_text("a\nb\nc\n")
    fails(
        s2s(
            "score", "translation", "--ref", str(ref), "--hyp", "missing_hyp.txt", cwd=world["root"]
        ),
        snapshot(ref),
        "missing_hyp.txt",
    )


@pytest.mark.slow
def test_score_invalid_utf8(world):
    ref, hyp = world["root"] / "ref_u.txt", world["root"] / "hyp_u.txt"
    ref.write_text("a b\nc d\n")
    hyp.write_bytes(b"a b\nc \xe9 d\n")
    fails(
        s2s("score", "translation", "--ref", str(ref), "--hyp", str(hyp), cwd=world["root"]),
        snapshot(ref, hyp),
        str(hyp),
        "line 2",
    )


@pytest.mark.slow
def test_score_unknown_task(world):
    ref = world["root"] / "ref3.txt"
    ref.write_text("a\nb\nc\n")
    fails(
        s2s("score", "translatoin", "--ref", str(ref), "--hyp", str(ref), cwd=world["root"]),
        snapshot(ref),
        "'translatoin'",
    )


# -- average -----------------------------------------------------------------------------------
def test_average_last_zero(world):
    fails(
        s2s("average", str(world["run"]), "--last", "0", cwd=world["root"]),
        snapshot(world["run"]),
        "--last 0",
    )


@pytest.mark.slow
def test_average_missing_checkpoint(world):
    fails(s2s("average", "nope.pt", cwd=world["root"]), snapshot(world["run"]), "nope.pt")


@pytest.mark.slow
def test_average_output_folder_missing(world):
    out = world["root"] / "no_folder" / "avg.pt"
    fails(
        s2s("average", str(world["run"]), "--last", "2", "--output", str(out), cwd=world["root"]),
        snapshot(world["run"], out.parent),
        str(out.parent),
    )


@pytest.mark.slow
def test_average_run_without_checkpoints(world):
    empty = world["root"] / "empty_run"
    empty.mkdir(exist_ok=True)
    fails(s2s("average", str(empty), "--last", "2", cwd=world["root"]), snapshot(empty), str(empty))


@pytest.mark.slow
def test_plot_not_a_run_dir(world):
    fails(
        s2s("plot", str(world["corpus"]), cwd=world["root"]),
        snapshot(world["corpus"]),
        "metrics.jsonl",
    )


# -- faults that are repaired, and lines that must not shift ---------------------------------
@pytest.mark.slow
def test_generate_one_line_out_per_line_in(world):
    src = world["root"] / "odd_lines.txt"
    src.write_bytes(
        "the dog sees a cat\r\nbad \xff line\n".encode("latin-1")
        + "a cat\u2028runs\x0bfast\n\nlast".encode("utf-8")
    )
    out = world["root"] / "odd_lines.out"
    result = s2s(
        "generate",
        str(world["run"]),
        "--input",
        str(src),
        "--output",
        str(out),
        "-q",
        cwd=world["root"],
    )
    err = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in err, err
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 6 and lines[-1] == "", lines  # 5 lines in, 5 out
    assert lines[1] == "" and "line 2" in err  # the bad line: empty output and a warning


@pytest.mark.slow
def test_score_line_separators_inside_sentences(world):
    ref, hyp = world["root"] / "ref_sep.txt", world["root"] / "hyp_sep.txt"
    text = "a man\u2028rides a horse .\ntwo dogs\x1cplay .\r\nthe end .\n"
    ref.write_text(text, encoding="utf-8")
    hyp.write_text(text, encoding="utf-8")
    result = s2s(
        "score", "translation", "--ref", str(ref), "--hyp", str(hyp), "--json", cwd=world["root"]
    )
    assert result.returncode == 0, result.stderr.decode()
    score = json.loads(result.stdout)
    assert score["bleu"] == 100.0 and score["sentences"] == 3


@pytest.mark.slow
def test_damaged_and_stale_cache_are_rebuilt(world):
    corpus = corpus_copy(world, "stale")
    preset = translation_preset(world, "stale", corpus)
    assert s2s("prepare", str(preset), cwd=world["root"]).returncode == 0
    cache = next(
        p for p in (world["root"] / "cache_stale").iterdir() if p.is_dir()
    )  # beside its .lock file
    (cache / "valid.src.bin").write_bytes(b"\x00" * 8)  # damaged
    result = s2s("prepare", str(preset), cwd=world["root"])
    assert result.returncode == 0 and "valid.src.bin is damaged" in result.stderr.decode()
    (corpus / "train.de").write_text("".join(s + "\n" for s in reversed(DE)), encoding="utf-8")
    result = s2s("prepare", str(preset), cwd=world["root"])
    assert result.returncode == 0 and "train.de changed" in result.stderr.decode()
    orphan = cache.parent / f".{cache.name}.tmp-999999999"
    orphan.mkdir()
    (cache / "prepared.json").write_text("{")  # a torn manifest
    result = s2s("prepare", str(preset), cwd=world["root"])
    assert result.returncode == 0 and "manifest" in result.stderr.decode()
    assert not orphan.exists()
    assert s2s("prepare", str(preset), cwd=world["root"]).stderr.decode().count("rebuilt") == 0


@pytest.mark.slow
def test_unforeseen_error_is_one_line_and_v_shows_the_traceback(world):
    plugin = world["root"] / "boom_plugin.py"
    plugin.write_text(
        "from s2s.core.contract.task import Task\n\n\nclass Boom(Task):\n    name = 'boom'\n\n"
        "    def read_split(self, split):\n        return iter([('a', 'b')])\n\n"
        "    def build_vocab(self, pairs):\n        return 1 / 0\n"
    )
    preset = world["root"] / "boom.yaml"
    preset.write_text(
        f"task: {{name: boom}}\ndata: {{cache_dir: {json.dumps(str(world['root'] / 'cache_boom'))}}}\n"
    )
    before = snapshot(plugin, preset)
    message = fails(
        s2s("prepare", str(preset), "--plugin", str(plugin), cwd=world["root"]),
        before,
        "internal error: ZeroDivisionError",
        "-v",
        code=1,
    )
    assert message.startswith("s2s prepare: error: internal error")
    verbose = s2s("prepare", str(preset), "--plugin", str(plugin), "-v", cwd=world["root"])
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr.decode()


def test_out_of_memory_names_the_setting():
    from s2s.core.errors import explain

    assert explain(MemoryError(), "train") == (
        "out of memory (MemoryError): lower data.max_tokens (or the model's size)",
        2,
    )
    assert "decode.max_sentences" in explain(MemoryError("CUDA out of memory"), "generate")[0]


def test_tree_of_depth_100000(tmp_path):
    from s2s.data_recipes import treebank

    depth = 100_000
    path = tmp_path / "deep.txt"
    path.write_text(
        "(TOP " + "(S-SBJ " * depth + "(NN x)" + ")" * (depth + 1) + "\n", encoding="utf-8"
    )
    (tree,) = treebank.line_trees(path)  # read, preprocessed (function tags stripped), rebuilt
    text = treebank.to_string(tree)
    assert (
        text.count("(S ") == depth
        and text.count("(TOP ") == 1
        and text.endswith("(NN x)" + ")" * (depth + 1))
    )


def test_training_tree_of_depth_2000(tmp_path):
    """A deep training tree is read, linearised and filtered by length, never a RecursionError;
    a deep output tree is displayed on one line."""
    from omegaconf import OmegaConf
    from s2s.plugins.parsing import ParsingConfig, ParsingTask

    flat = "(S (NP (DT the) (NN dog)) (VP (VBZ barks)))"
    deep = "(TOP " + "(S " * 2000 + "(NN x)" + ")" * 2001
    for split, lines in (("train", [flat] * 8 + [deep]), ("valid", [flat]), ("test", [flat])):
        (tmp_path / f"{split}.trees").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = s2s(
        "train",
        "own_parsing",
        *TINY,
        f"task.data_dir={tmp_path}",
        f"run.dir={tmp_path / 'run'}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "optim.max_updates=1",
        "run.quiet=false",
        cwd=tmp_path,
    )
    err = out.stderr.decode()
    assert out.returncode == 0 and "Traceback" not in err, err
    assert "train: 8 pairs kept, 1 dropped (max_len 1), in 1 shard(s)" in err
    task = ParsingTask(OmegaConf.structured(ParsingConfig()))
    assert task.display(deep) == deep
