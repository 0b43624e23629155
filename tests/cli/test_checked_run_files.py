"""A run directory's files are checked against the checkpoint (issue 24): `s2s generate` and
`s2s export` refuse a config.yaml whose model or task settings (or members) differ from the
config stored in the checkpoint, and a vocabulary file that differs from the one recorded there
(or is gone); `s2s train` refuses to resume a multi-task run whose members are listed in
another order. Overrides of decode.* and run.* still work, and a checkpoint that records none of
this (an old one) still decodes.

Every case goes through the real command line (`s2s.core.apps.cli.main` in-process) and asserts exit
2, one message line naming the file and key at fault, no traceback, and that every file under
the run directory hashes the same before and after. One tiny demo run and one tiny multi-task
run are trained per module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from cli_checks import fails, s2s, snapshot
from omegaconf import OmegaConf
from s2s.core.apps.cli import main
from s2s.core.setup.config import preset_path
from s2s.core.runs import checkpoint
from conftest import TINY_MODEL

TINY = [
    *TINY_MODEL,
    "run.quiet=true",
    "run.log_interval=1",
    "optim.max_updates=2",
    "run.valid_interval=2",
    "run.save_interval=1",
]
SIZES = ("train_size=200", "valid_size=10", "test_size=10")
SOURCES = "the cat sees a dog\na big man holds the ball\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny demo run, a trained tiny multi-task run and a source file."""
    root = tmp_path_factory.mktemp("checked_run_files")
    run, multi = root / "run", root / "multi"
    assert (
        main(
            [
                "train",
                "demo",
                "-q",
                *TINY,
                *(f"task.{s}" for s in SIZES),
                f"run.dir={run}",
                f"data.cache_dir={root / 'cache'}",
            ]
        )
        == 0
    )
    members = [f"tasks.{m}.task.{s}" for m in ("translate", "parse") for s in SIZES]
    multi_args = [
        *TINY,
        *members,
        "data.max_tokens=300",
        f"run.dir={multi}",
        f"data.cache_dir={root / 'cache'}",
    ]
    assert main(["train", "multitask_demo", "-q", *multi_args]) == 0
    src = root / "src.txt"
    src.write_text(SOURCES, encoding="utf-8")
    return {"root": root, "run": run, "multi": multi, "multi_args": multi_args, "src": src}


def run_copy(world, name: str, source: str = "run") -> Path:
    target = world["root"] / name
    shutil.copytree(world[source], target)
    return target


def edit_config(run: Path, change) -> None:
    """Rewrite RUN/config.yaml with `change` applied to its contents (a dict)."""
    data = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"))
    change(data)
    (run / "config.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def generate(capsys, world, run, *extra):
    return s2s(capsys, "generate", run, "--input", world["src"], "-q", *extra)


def export(capsys, world, run, name: str):
    return s2s(capsys, "export", run, "--to", "safetensors", "--output", world["root"] / name, "-q")


# -- 1. config.yaml against the checkpoint's config --------------------------------------------
def test_an_edited_model_setting_is_refused_naming_config_yaml_and_the_key(world, capsys):
    run = run_copy(world, "d_ff")
    edit_config(run, lambda c: c["model"].update(d_ff=128))
    before = snapshot(world["root"])
    line = fails(
        generate(capsys, world, run), before, run / "config.yaml", "model.d_ff", "128", "64"
    )
    assert "checkpoint" in line
    fails(
        export(capsys, world, run, "exported_d_ff"),
        before,
        run / "config.yaml",
        "model.d_ff",
        "128",
        "64",
    )
    assert not (world["root"] / "exported_d_ff").exists()


def test_an_edited_task_setting_is_refused_naming_the_key(world, capsys):
    """The same vocabulary and shapes: before, this decoded with the wrong task, exit 0."""
    run = run_copy(world, "mode")
    edit_config(run, lambda c: c["task"].update(mode="parse"))
    before = snapshot(world["root"])
    fails(
        generate(capsys, world, run),
        before,
        run / "config.yaml",
        "task.mode",
        "'parse'",
        "'translate'",
    )
    fails(export(capsys, world, run, "exported_mode"), before, run / "config.yaml", "task.mode")


def test_a_model_override_on_the_command_line_is_refused_too(world, capsys):
    before = snapshot(world["root"])
    fails(
        generate(capsys, world, world["run"], "model.heads=4"),
        before,
        world["run"] / "config.yaml",
        "with the overrides",
        "model.heads",
        "4",
        "2",
    )


def test_decode_and_run_overrides_still_work(world, capsys):
    before = snapshot(world["run"])
    code, out, err = generate(capsys, world, world["run"], "decode.beam=2", "run.device=cpu")
    assert code == 0, err
    assert len(out.splitlines()) == len(SOURCES.splitlines())
    code, out2, err = generate(capsys, world, world["run"], "--beam", "2", "decode.max_sentences=1")
    assert code == 0, err
    assert out2 == out
    assert snapshot(world["run"]) == before


def test_settings_only_training_reads_may_differ(world, capsys):
    """Dropout does not change what the weights mean: a resume may change it, decoding ignores it."""
    run = run_copy(world, "dropout")
    edit_config(run, lambda c: c["model"].update(dropout=0.3, attention_dropout=0.2))
    code, out, err = generate(capsys, world, run)
    assert code == 0, err
    assert len(out.splitlines()) == len(SOURCES.splitlines())


def test_a_checkpoint_that_records_no_config_tokenizer_or_tasks_still_decodes(world, capsys):
    run = run_copy(world, "old")
    state = checkpoint.load(checkpoint.listed(run)[-1])
    for key in ("config", "tokenizer", "tasks"):
        state.pop(key, None)
    checkpoint.atomic_save(state, run / "old.pt")
    code, out, err = generate(capsys, world, run / "old.pt")
    assert code == 0, err
    assert len(out.splitlines()) == len(SOURCES.splitlines())


# -- 2. the tokenizer files against the hashes the checkpoint records ------------------------
def test_a_replaced_vocabulary_file_is_refused_naming_it(world, capsys):
    """Same length, two words swapped: before, it decoded other words with exit 0."""
    run = run_copy(world, "vocab_replaced")
    tokens = json.loads((run / "vocab.json").read_text(encoding="utf-8"))
    tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
    (run / "vocab.json").write_text(json.dumps(tokens, ensure_ascii=False), encoding="utf-8")
    before = snapshot(world["root"])
    fails(generate(capsys, world, run), before, run / "vocab.json", "differs", "checkpoint")
    fails(export(capsys, world, run, "exported_vocab"), before, run / "vocab.json", "differs")


def test_a_deleted_vocabulary_file_is_refused_naming_it(world, capsys):
    run = run_copy(world, "vocab_deleted")
    (run / "vocab.json").unlink()
    before = snapshot(world["root"])
    fails(generate(capsys, world, run), before, run / "vocab.json", "missing", "checkpoint")
    fails(
        generate(capsys, world, checkpoint.listed(run)[-1]), before, run / "vocab.json", "missing"
    )


# -- 3. the members' order ---------------------------------------------------------------------
def test_a_multitask_run_resumed_with_its_members_reordered_is_refused(world, capsys):
    data = OmegaConf.to_container(OmegaConf.load(preset_path("multitask_demo")))
    data["tasks"] = dict(reversed(list(data["tasks"].items())))
    assert list(data["tasks"]) == ["parse", "translate"]
    swapped = world["root"] / "swapped.yaml"
    swapped.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    before = snapshot(world["multi"])
    newest = checkpoint.listed(world["multi"])[-1]
    fails(
        s2s(capsys, "train", swapped, "-q", *world["multi_args"], "optim.max_updates=4"),
        before,
        newest,
        "translate, parse",
        "parse, translate",
    )
    # the same preset in its own order resumes
    assert (
        s2s(capsys, "train", "multitask_demo", "-q", *world["multi_args"], "optim.max_updates=3")[0]
        == 0
    )


def test_a_multitask_config_yaml_with_its_members_reordered_is_refused(world, capsys):
    run = run_copy(world, "multi_swapped", "multi")
    edit_config(run, lambda c: c.update(tasks=dict(reversed(list(c["tasks"].items())))))
    before = snapshot(world["root"])
    fails(
        generate(capsys, world, run, "--task", "parse"),
        before,
        run / "config.yaml",
        "tasks",
        "parse, translate",
        "translate, parse",
    )


def test_a_multitask_member_vocabulary_is_checked_too(world, capsys):
    run = run_copy(world, "multi_vocab", "multi")
    (run / "vocab" / "parse" / "vocab.json").unlink()
    before = snapshot(world["root"])
    fails(
        generate(capsys, world, run, "--task", "translate"),
        before,
        run / "vocab" / "parse" / "vocab.json",
        "missing",
    )


def test_where_a_task_reads_its_data_is_not_compared():
    """A corpus moved (task.data_dir) means the same weights; its language does not."""
    from s2s.core.data.members import build_members
    from s2s.core.setup.config import load_config
    from s2s.core.setup.registry import Registry
    from s2s.core.runs.agreement import config_difference

    registry = Registry.installed()
    cfg = load_config("multi30k_en_de", registry=registry)
    members = build_members(cfg, registry)
    saved = OmegaConf.to_container(cfg, enum_to_str=True)
    assert config_difference(cfg, saved, members) is None
    saved["task"]["data_dir"] = "/elsewhere"
    saved["model"]["dropout"] = 0.3
    assert config_difference(cfg, saved, members) is None
    saved["task"]["src_lang"] = "fr"
    assert config_difference(cfg, saved, members) == ("task.src_lang", "en", "fr")
