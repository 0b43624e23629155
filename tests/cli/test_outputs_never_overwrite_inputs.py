"""Nothing already on disk is lost (issue 24): export, average and generate never delete or
overwrite what they did not write, nor their own inputs; a plugin's prints, bad scores and bad
names fail or go aside without spoiling anything.

Every case goes through the real command line (`s2s.core.apps.cli.main` in-process, or
`python -m s2s.core.apps.cli` where stdout itself is under test) and asserts the exit code, one
message line naming the file, key or plugin at fault, no traceback, and that every file under
the paths involved hashes the same before and after. One tiny demo run is trained per module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import fails, s2s, snapshot
from conftest import TINY_MODEL
from s2s.core.apps.cli import main
from s2s.core.runs import checkpoint

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
SOURCES = "the cat sees a dog\na big man holds the ball\nevery bird likes the tree\n"


def train(root: Path, name: str, *extra: str) -> Path:
    run = root / name
    assert (
        main(
            [
                "train",
                "demo",
                "-q",
                *TINY,
                *DEMO,
                f"run.dir={run}",
                f"data.cache_dir={root / 'cache'}",
                *extra,
            ]
        )
        == 0
    )
    return run


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny demo run (two rolling checkpoints) and a source file."""
    root = tmp_path_factory.mktemp("nothing_lost")
    run = train(root, "run")
    src = root / "src.txt"
    src.write_text(SOURCES, encoding="utf-8")
    return {"root": root, "run": run, "src": src}


def run_copy(world, name: str) -> Path:
    target = world["root"] / name
    if not target.exists():
        shutil.copytree(world["run"], target)
    return target


# -- 1. export --force replaces only a previous export ----------------------------------------
def export(capsys, run, out, *extra):
    return s2s(capsys, "export", run, "--to", "safetensors", "--output", out, "-q", *extra)


def test_export_force_refuses_the_run_directory(world, capsys):
    before = snapshot(world["root"])
    fails(
        export(capsys, world["run"], world["run"], "--force"),
        before,
        world["run"],
        "is the run directory",
    )


def test_export_force_refuses_a_folder_that_holds_the_run(world, capsys):
    before = snapshot(world["root"])
    fails(
        export(capsys, world["run"], world["root"], "--force"),
        before,
        world["root"],
        "contains the run directory",
    )


def test_export_force_refuses_a_folder_with_other_files(world, capsys):
    folder = world["root"] / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("my notes\n")
    before = snapshot(world["root"])
    fails(export(capsys, world["run"], folder, "--force"), before, folder, "s2s_export.json")


def test_export_force_refuses_an_export_with_a_file_added(world, capsys):
    folder = world["root"] / "exported_plus"
    assert export(capsys, world["run"], folder)[0] == 0
    (folder / "README.txt").write_text("added by hand\n")
    before = snapshot(world["root"])
    fails(export(capsys, world["run"], folder, "--force"), before, folder, "README.txt")


def test_export_force_replaces_a_previous_export(world, capsys):
    folder = world["root"] / "exported"
    assert export(capsys, world["run"], folder)[0] == 0
    marker = json.loads((folder / "s2s_export.json").read_text())
    assert marker["format"] == "safetensors" and marker["source"] == str(world["run"].resolve())
    assert sorted(marker["files"]) == ["config.json", "model.safetensors", "vocab.json"]
    before = snapshot(world["run"])
    assert export(capsys, world["run"], folder)[0] == 2  # not without --force
    assert export(capsys, world["run"], folder, "--force")[0] == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "s2s_export.json",
        "vocab.json",
    ]
    assert not [
        p for p in world["root"].iterdir() if ".tmp" in p.name
    ]  # the temporary folder is gone
    assert snapshot(world["run"]) == before


# -- 2. average never writes over its inputs; different models are refused -------------------
def test_average_output_is_one_of_the_inputs(world, capsys):
    a, b = checkpoint.listed(world["run"])[-2:]
    before = snapshot(world["root"])
    fails(s2s(capsys, "average", a, b, "--output", b), before, b, "is the input")


def test_average_last_output_is_one_of_the_inputs(world, capsys):
    last = checkpoint.listed(world["run"])[-1]
    before = snapshot(world["root"])
    fails(
        s2s(capsys, "average", world["run"], "--last", "2", "--output", last),
        before,
        last,
        "is the input",
    )


def test_average_output_named_like_a_rolling_checkpoint(world, capsys):
    out = world["run"] / "checkpoints" / "checkpoint_00000099.pt"
    before = snapshot(world["root"])
    fails(
        s2s(capsys, "average", world["run"], "--last", "2", "--output", out),
        before,
        out,
        "rolling checkpoint",
    )


def test_average_output_is_the_best_checkpoint(world, capsys):
    out = world["run"] / checkpoint.BEST
    before = snapshot(world["root"])
    fails(
        s2s(capsys, "average", world["run"], "--last", "2", "--output", out),
        before,
        out,
        "best validated model",
    )


@pytest.fixture(scope="module")
def other_models(world):
    """A run with another model shape (d_ff) and a run with another vocabulary (task.seed)."""
    return {
        "shape": train(world["root"], "run_dff", "model.d_ff=32"),
        "vocab": train(world["root"], "run_seed", "task.seed=7", "task.train_size=60"),
    }


def test_average_of_models_with_different_shapes(world, other_models, capsys):
    a, b = checkpoint.listed(world["run"])[-1], checkpoint.listed(other_models["shape"])[-1]
    out = world["root"] / "avg_shapes.pt"
    before = snapshot(world["root"])
    fails(s2s(capsys, "average", a, b, "--output", out), before, a, b, "different shapes")


def test_average_of_models_with_different_vocabularies(world, other_models, capsys):
    a, b = checkpoint.listed(world["run"])[-1], checkpoint.listed(other_models["vocab"])[-1]
    # the same shapes (as many words: the grammar's lexicon), other words in the rows
    out = world["root"] / "avg_vocab.pt"
    before = snapshot(world["root"])
    fails(
        s2s(capsys, "average", a, b, "--output", out),
        before,
        a,
        b,
        "different vocabularies",
        "vocab.json",
    )


def test_average_of_one_runs_checkpoints_still_works(world, capsys, caplog):
    """The average keeps its newest input's update and data position (issue 43: it kept the
    oldest's), names its inputs and their updates, and says so when loaded."""
    out = world["run"] / "avg_ok.pt"  # a new file in the run: allowed
    assert s2s(capsys, "average", world["run"], "--last", "2", "--output", out)[0] == 0
    state = checkpoint.load(out)
    inputs = checkpoint.listed(world["run"])[-2:]
    newest = checkpoint.load(inputs[-1])
    assert len(state["averaged"]) == 2 and state["averaged_updates"] == [1, 2]
    assert state["update"] == newest["update"] == 2
    assert state["streams"] == newest["streams"]
    assert "optimizer" not in state
    from s2s.core.inference import load_for_inference
    from s2s.core.setup.registry import Registry

    with caplog.at_level("INFO", logger="s2s"):
        load_for_inference(out, Registry.installed())
    out.unlink()
    assert "the average of 2 checkpoints, updates 1 to 2" in caplog.text


# -- 3. generate: never over its input; which checkpoint a run directory means --------------
def test_generate_output_is_the_input(world, capsys):
    src = world["root"] / "in_out.txt"
    src.write_text(SOURCES)
    before = snapshot(world["root"])
    fails(
        s2s(capsys, "generate", world["run"], "--input", src, "--output", src, "-q"),
        before,
        src,
        "is the input",
    )


def test_run_directory_means_the_checkpoint_result_json_names(world, capsys):
    """A hand-made average beside the run does not replace the model the run tested; the help says so."""
    run = run_copy(world, "run_hand_average")
    assert s2s(capsys, "average", run, "--last", "2")[0] == 0  # RUN/checkpoint_average.pt, by hand
    named = json.loads((run / "result.json").read_text())["checkpoint"]
    assert named != checkpoint.AVERAGE and checkpoint.tested(run)[1] == run / named
    outputs = {}
    for which in (run, run / named, run / checkpoint.AVERAGE):
        out = world["root"] / f"gen_{len(outputs)}.txt"
        assert (
            s2s(
                capsys,
                "generate",
                which,
                "--input",
                world["src"],
                "--output",
                out,
                "-q",
                "--beam",
                "1",
            )[0]
            == 0
        )
        outputs[which] = out.read_text()
    assert outputs[run] == outputs[run / named]
    for command in ("generate", "export"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "result.json" in text and "checkpoint_average.pt" in text, text


# -- 4. what a plugin prints goes to stderr, never among generate's output lines -------------
LOUD = """
from s2s.plugins.demo import DemoTask

print("NOISE when the plugin is imported")


class LoudTask(DemoTask):
    name = "loud"

    def encode_source(self, lines):
        print("NOISE from encode_source")
        return super().encode_source(lines)

    def postprocess(self, hypothesis, source):
        print("NOISE from postprocess")
        return hypothesis
"""


@pytest.fixture(scope="module")
def loud_run(world):
    """A tiny run of the `loud` task (LOUD) and its plugin file."""
    plugin = world["root"] / "loud_task.py"
    plugin.write_text(LOUD)
    return train(world["root"], "run_loud", "--plugin", str(plugin), "task.name=loud"), plugin


def test_plugin_prints_go_to_stderr_not_into_the_output(world, loud_run):
    run, plugin = loud_run
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "generate",
            str(run),
            "--plugin",
            str(plugin),
            "--input",
            str(world["src"]),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert len(lines) == 4 and lines[-1] == "" and not any("NOISE" in line for line in lines), (
        result.stdout
    )
    for noise in (
        "NOISE when the plugin is imported",
        "NOISE from encode_source",
        "NOISE from postprocess",
    ):
        assert noise in result.stderr, result.stderr


POSTPROCESS_NONE = """
from s2s.plugins.demo import DemoTask


class SilentLoudTask(DemoTask):
    name = "loud"

    def postprocess(self, hypothesis, source):
        return None
"""


def test_plugin_postprocess_that_returns_no_line(world, loud_run, capsys):
    run, _ = loud_run
    plugin = world["root"] / "postprocess_none.py"
    plugin.write_text(POSTPROCESS_NONE)
    out = world["root"] / "none_out.txt"
    before = snapshot(world["root"])
    fails(
        s2s(
            capsys,
            "generate",
            run,
            "--plugin",
            plugin,
            "--input",
            world["src"],
            "--output",
            out,
            "-q",
        ),
        before,
        "'loud'",
        "SilentLoudTask",
        plugin,
        "postprocess",
        "NoneType",
    )


# -- 5. a plugin's score is checked where the engine receives it -----------------------------
BAD_SCORES = """
from s2s.core.contract.task import Score
from s2s.plugins.demo import DemoTask


class NotAScore(DemoTask):
    name = "not_a_score"

    def score(self, hypotheses, references, sources=None):
        return 12.5


class NanScore(DemoTask):
    name = "nan_score"

    def score(self, hypotheses, references, sources=None):
        return Score("bleu", float("nan"))


class TextScore(DemoTask):
    name = "text_score"

    def score(self, hypotheses, references, sources=None):
        return Score("bleu", "high")
"""
SCORE_CASES = [
    ("not_a_score", "NotAScore", "not a s2s.core.Score"),
    ("nan_score", "NanScore", "not finite"),
    ("text_score", "TextScore", "not a number"),
]


@pytest.mark.parametrize("task,cls,why", SCORE_CASES, ids=[c[0] for c in SCORE_CASES])
def test_plugin_score_that_is_no_score(world, capsys, task, cls, why):
    plugin = world["root"] / "bad_scores.py"
    plugin.write_text(BAD_SCORES)
    ref = world["root"] / "ref.txt"
    ref.write_text(SOURCES)
    before = snapshot(world["root"])
    fails(
        s2s(capsys, "score", task, "--plugin", plugin, "--ref", ref, "--hyp", ref),
        before,
        repr(task),
        cls,
        plugin,
        "score",
        why,
    )


def test_checked_score_passes_a_good_score_as_a_float():
    import numpy as np
    from s2s.core.contract.task import Score, checked_score
    from s2s.plugins.demo import DemoTask

    score = checked_score(DemoTask.__new__(DemoTask), Score("bleu", np.float32(3.5), {"n": 1}))
    assert type(score.value) is float and score.value == 3.5 and json.dumps(score.as_dict())


# -- 6. task names are identifiers ------------------------------------------------------------
@pytest.mark.parametrize("name", ["../x", "my task", "9lives"])
def test_task_name_is_not_an_identifier(world, capsys, name):
    plugin = world["root"] / "badly_named.py"
    plugin.write_text(
        f"from s2s.plugins.demo import DemoTask\n\n\nclass BadlyNamed(DemoTask):\n    name = {name!r}\n"
    )
    before = snapshot(world["root"])
    fails(s2s(capsys, "tasks", "--plugin", plugin), before, plugin, "BadlyNamed", repr(name))


# -- 7. temporaries of killed processes are removed by the next writer; live ones stay -------
@pytest.fixture
def pids():
    """(a PID that is gone, a PID that is alive)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with pytest.raises(ProcessLookupError):
            os.kill(gone.pid, 0)
        yield gone.pid, alive.pid
    finally:
        alive.kill()
        alive.wait()


def leave_temporaries(folder: Path, gone: int, alive: int) -> tuple[list[Path], list[Path]]:
    """Stale temporaries (removed) and others (kept) in `folder`."""
    folder.mkdir(exist_ok=True)
    stale = [
        folder / f".out.txt.tmp{gone}",
        folder / f".export.tmp{gone}",
        folder / f".write_probe{gone}",
    ]
    kept = [
        folder / f".out.txt.tmp{alive}",
        folder / f".export.tmp{alive}",
        folder / f".write_probe{alive}",
        folder / ".notes.tmpfile",
        folder / "keep.tmp1",
    ]
    for p in stale + kept:
        if "export" in p.name:
            p.mkdir()
            (p / "model.safetensors").write_bytes(b"half")
        else:
            p.write_text("half")
    return stale, kept


@pytest.mark.parametrize("command", ["export", "average", "generate"])
def test_stale_temporaries_are_removed_live_ones_kept(world, capsys, pids, command):
    folder = world["root"] / f"temps_{command}"
    stale, kept = leave_temporaries(folder, *pids)
    before = snapshot(world["run"], *kept)
    argv = {
        "export": ["export", world["run"], "--to", "safetensors", "--output", folder / "exported"],
        "average": ["average", world["run"], "--last", "2", "--output", folder / "avg.pt"],
        "generate": [
            "generate",
            world["run"],
            "--input",
            world["src"],
            "--output",
            folder / "out.txt",
        ],
    }[command]
    code, _, err = s2s(capsys, *argv, "-q")
    assert code == 0, err
    assert not [p for p in stale if p.exists()]
    assert snapshot(world["run"], *kept) == before


def test_remove_stale_temporaries_alone(tmp_path, pids):
    from s2s.core.files import remove_stale_temporaries

    stale, kept = leave_temporaries(tmp_path / "f", *pids)
    assert sorted(remove_stale_temporaries(tmp_path / "f")) == sorted(stale)
    assert all(p.exists() for p in kept) and remove_stale_temporaries(tmp_path / "missing") == []


# -- 8. the beam is bounded by the target vocabulary ------------------------------------------
@pytest.mark.parametrize(
    "option,needle",
    [(["--beam", "100000"], "--beam=100000"), (["decode.beam=100000"], "decode.beam=100000")],
)
def test_beam_larger_than_the_vocabulary(world, capsys, option, needle):
    out = world["root"] / "beam_out.txt"
    before = snapshot(world["root"])
    message = fails(
        s2s(
            capsys,
            "generate",
            world["run"],
            "--input",
            world["src"],
            "--output",
            out,
            "-q",
            *option,
        ),
        before,
        needle,
        "target vocabulary",
    )
    assert "tokens" in message


@pytest.mark.slow
def test_generate_never_writes_over_a_file_of_a_run(demo_runs, tmp_path, capsys):
    """`s2s generate --output` naming a run's own config, checkpoint or result is refused before
    decoding (issue 43); a new file in a run directory is fine."""
    run = demo_runs["untrained"]
    src = tmp_path / "in.txt"
    src.write_text("the dog sees a cat\n")
    checkpoint_file = next((run / "checkpoints").glob("*.pt"))
    for target in (run / "config.yaml", checkpoint_file, run / "result.json"):
        before = snapshot(run)
        result = s2s(capsys, "generate", run, "--input", src, "--output", target)
        fails(
            result, before, "--output", "is a file of run directory", "write the output elsewhere"
        )
    fresh = run / "generated.txt"
    code, _, err = s2s(capsys, "generate", run, "--input", src, "--output", fresh)
    assert code == 0 and fresh.read_text().count("\n") == 1, err
    fresh.unlink()


@pytest.mark.slow
def test_average_never_replaces_the_tested_model(demo_runs, tmp_path, capsys):
    """A run whose result.json names checkpoint_average.pt as tested: `s2s average RUN --last K`
    would write that file; it is refused, and --output elsewhere works (issue 43)."""
    run = tmp_path / "run"
    shutil.copytree(demo_runs["untrained"], run)
    code, _, err = s2s(
        capsys, "average", run, "--last", "1", "--output", run / "checkpoint_average.pt"
    )
    assert code == 0, err
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result, "checkpoint": "checkpoint_average.pt"}))
    before = snapshot(run)
    fails(s2s(capsys, "average", run, "--last", "1"), before, "result.json names as tested")
    code, _, err = s2s(capsys, "average", run, "--last", "1", "--output", tmp_path / "avg.pt")
    assert code == 0 and (tmp_path / "avg.pt").is_file(), err


@pytest.mark.slow
def test_fine_tuning_checks_the_source_vocabulary(demo_runs, tmp_path, capsys):
    """run.init_from a run whose vocab.json is not the one its weights were trained with: a
    one-line error before training, as generate gives (issue 43), nothing written."""
    source = tmp_path / "source"
    shutil.copytree(demo_runs["a"], source)
    shutil.copy(demo_runs["parser"] / "vocab.json", source / "vocab.json")
    run = tmp_path / "tuned"  # the source is checked before the run directory is claimed
    before = snapshot(source)
    result = s2s(capsys, "train", "demo", *TINY, f"run.dir={run}", f"run.init_from={source}", "-q")
    fails(result, before, "run.init_from=", "vocab.json differs from the vocabulary")
    assert not run.exists()  # nothing left behind: no claimed, empty run directory
    missing = tmp_path / "no_such_run"
    result = s2s(capsys, "train", "demo", *TINY, f"run.dir={run}", f"run.init_from={missing}")
    fails(result, before, "run.init_from=", "no such run directory")
    assert not run.exists()


@pytest.mark.parametrize("command", ["attention", "plot"])
def test_maps_and_plots_never_write_over_a_users_file(demo_runs, tmp_path, capsys, command):
    """`s2s attention --output DIR` and `s2s plot --output DIR` write fixed names: into a folder
    holding a file of that name that s2s did not write they fail in one line, before any work,
    changing nothing; into their own earlier output they write again."""
    run = demo_runs["a"]
    mine = tmp_path / "mine"
    mine.mkdir()
    lines = tmp_path / "in.txt"
    lines.write_text("the cat sees a dog\n")
    argv = ["plot", run] if command == "plot" else ["attention", run, "--input", lines]
    users = mine / ("loss.png" if command == "plot" else "1.cross.layer1.png")
    users.write_bytes(b"the user's own picture")
    (mine / "notes.txt").write_text("the user's notes\n")
    before = snapshot(mine, run)
    fails(s2s(capsys, *argv, "--output", mine), before, users.name, "s2s did not write it")
    ours = tmp_path / "ours"
    assert s2s(capsys, *argv, "--output", ours)[0] == 0
    written = sorted(p.name for p in ours.iterdir())
    assert s2s(capsys, *argv, "--output", ours)[0] == 0  # its own earlier output: again
    assert sorted(p.name for p in ours.iterdir()) == written
    code, _, err = s2s(capsys, *argv, "--output", run)
    assert code == 2 and "run directory" in err


def test_os_errors_and_malformed_files_are_one_line(tmp_path, capsys):
    """Issue 43's one-line errors: the split recipe with a file where its folder goes, a
    variants file that is not UTF-8 (file and line), `s2s prepare` of a multi-task preset."""
    from s2s.data_recipes.__main__ import main as recipes

    (tmp_path / "c.en").write_text("a b\nc d\ne f\ng h\n")
    (tmp_path / "c.de").write_text("x y\nz w\nq r\ns t\n")
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("mine\n")
    before = snapshot(tmp_path)
    code = recipes(
        ["split", str(tmp_path / "c.en"), str(tmp_path / "c.de"), "--dir"]
        + [str(in_the_way), "--valid", "1", "--test", "1"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: {in_the_way}: File exists"], err
    assert snapshot(*before) == before
    variants = tmp_path / "v.yaml"
    variants.write_bytes(b"- {model.heads: 1}\n- \xc8\xff\n")
    before = snapshot(variants)
    result = s2s(
        capsys,
        "sweep",
        "demo",
        "--variants",
        variants,
        "--budget-updates",
        "2",
        "--dir",
        tmp_path / "sw",
    )
    fails(result, before, "v.yaml, line 2", "UTF-8")
    code, out, err = s2s(
        capsys,
        "prepare",
        "multitask_demo",
        f"data.cache_dir={tmp_path / 'cache'}",
        "-q",
        "tasks.translate.task.train_size=50",
        "tasks.parse.task.train_size=50",
    )
    assert code == 0 and "translate train: 50 pairs" in out and "parse vocabulary" in out, err
