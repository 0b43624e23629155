"""Registration both ways: entry points for installed plugins, --plugin for one in development.

The plugin is the one printed in docs/plugins.md ("Write your own task"), taken from that page itself,
so the documentation cannot drift from what works.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s2s.core.errors import RegistryError
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from s2s.core.training.trainer import train
from conftest import ROOT

PLUGIN_DOC = ROOT / "docs" / "plugins.md"


def readme_plugin() -> str:
    text = PLUGIN_DOC.read_text(encoding="utf-8")
    section = text[text.index("# Write your own task") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.fixture
def plugin_file(tmp_path):
    code = readme_plugin()
    assert len(code.splitlines()) <= 60
    path = tmp_path / "chars_task.py"
    path.write_text(code)
    data = tmp_path / "chars"
    data.mkdir()
    words = [
        "transformer",
        "attention",
        "encoder",
        "decoder",
        "beam",
        "search",
        "label",
        "smoothing",
        "layer",
        "norm",
        "residual",
        "dropout",
        "softmax",
        "embedding",
        "position",
        "warmup",
    ]
    for split, n in (("train", 400), ("valid", 16), ("test", 16)):
        lines = [f"{w}\t{w[::-1]}" for w in (words * (n // len(words) + 1))[:n]]
        (data / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return path, data


def test_builtin_tasks_come_from_entry_points(registry):
    for name in ("demo", "translation", "parsing"):
        assert name in registry.names()
        assert registry.origin(name).startswith("entry point")


def test_plugin_by_file_and_by_module(plugin_file, monkeypatch):
    path, _ = plugin_file
    reg = Registry.installed([str(path)])
    assert reg.get("chars").name == "chars" and "plugin file" in reg.origin("chars")
    monkeypatch.syspath_prepend(str(path.parent))
    reg = Registry.installed(["chars_task:CharTask"])
    assert (
        reg.get("chars").__name__ == "CharTask"
        and reg.origin("chars") == "--plugin chars_task:CharTask"
    )


@pytest.mark.slow
def test_readme_plugin_trains_a_few_steps(plugin_file, tiny):
    path, data = plugin_file
    reg = Registry.installed([str(path)])
    preset = path.parent / "chars.yaml"
    preset.write_text(f"task:\n  name: chars\n  data_dir: {data}\n")
    cfg = load_config(
        str(preset),
        tiny(
            "optim.max_updates=6",
            "optim.warmup=2",
            "run.valid_interval=3",
            "run.save_interval=3",
            "data.max_tokens=400",
        ),
        registry=reg,
    )
    result = train(cfg, reg, quiet=True)
    assert result["update"] == 6 and "accuracy" in result["test"]
    run = Path(cfg.run.dir)
    assert (run / "vocab.json").is_file() and not (
        run / "src_vocab.json"
    ).exists()  # the shared default
    task = reg.get("chars")(cfg.task)
    task.load_vocab(run)
    assert task.shared_vocab and type(task.tgt_vocab).__name__ == "CharTokenizer"
    assert task.decode_target(task.encode_target(["beam"])[0]) == "beam"
    source = path.parent / "words.txt"
    source.write_text("beam\nsearch\nlayer\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "generate",
            str(run),
            "--input",
            str(source),
            "--plugin",
            str(path),
            "--beam",
            "2",
            "-q",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(
        " " not in line for line in lines
    )  # characters joined back into words


def test_s2s_tasks_lists_every_task_with_its_origin(plugin_file):
    path, _ = plugin_file
    out = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", "tasks", "--plugin", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in ("demo", "translation", "parsing", "chars"):
        assert re.search(rf"^{name}\s", out, re.M), out
    assert "plugin file" in out


def test_bad_plugin_specs_are_named(tmp_path):
    with pytest.raises(RegistryError, match="nosuchmodule"):
        Registry.installed(["nosuchmodule:X"])
    with pytest.raises(RegistryError, match="does not exist"):
        Registry.installed([str(tmp_path / "missing.py")])
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(RegistryError, match="no Task subclass"):
        Registry.installed([str(tmp_path / "empty.py")])


@pytest.mark.slow
def test_readme_plugin_joins_a_multi_task_run_unchanged(plugin_file, tiny, tmp_path):
    """The same plugin, written only against the public interface, shares a model with the demo."""
    path, data = plugin_file
    reg = Registry.installed([str(path)])
    preset = tmp_path / "mixed.yaml"
    preset.write_text(
        f"tasks:\n  chars:\n    task: {{name: chars, data_dir: {data}}}\n"
        "  demo:\n    preset: demo\n    task: {train_size: 300, valid_size: 8, test_size: 8}\n"
    )
    cfg = load_config(
        str(preset),
        tiny(
            "optim.max_updates=8",
            "optim.warmup=2",
            "run.valid_interval=4",
            "run.save_interval=4",
            "data.max_tokens=400",
            "run.seed=2",
        ),
        registry=reg,
    )  # seed 1 draws chars 8 times in 8
    result = train(cfg, reg, quiet=True)
    assert result["update"] == 8 and all(n > 0 for n in result["member_updates"].values())
    assert "accuracy" in result["test"]["chars"] and "bleu" in result["test"]["demo"]
    src = tmp_path / "words.txt"
    src.write_text("beam\nsoftmax\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "s2s.core.apps.cli",
            "generate",
            cfg.run.dir,
            "--task",
            "chars",
            "--input",
            str(src),
            "--plugin",
            str(path),
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2, out.stderr[-2000:]


def test_docs_plugin_prepares_again_after_its_train_file_is_edited(plugin_file, tmp_path, caplog):
    """The plugin reads its files with plain open(): the cache still fingerprints them."""
    from s2s.core.data.members import build_task
    from s2s.core.data.cache import MANIFEST
    from s2s.core.data.nodes import prepare_data

    path, data = plugin_file
    reg = Registry.installed([str(path)])
    cfg = load_config(
        None,
        ["task.name=chars", f"task.data_dir={data}", f"data.cache_dir={tmp_path / 'cache'}"],
        registry=reg,
    )
    first = prepare_data(build_task(cfg.task, reg), cfg.data, quiet=True)
    inputs = json.loads((first.directory / MANIFEST).read_text())["inputs"]
    assert {Path(p).name for p in inputs} == {"train.tsv", "valid.tsv", "test.tsv"}
    assert len(first.splits["train"]) == 400

    with open(data / "train.tsv", "a") as f:
        f.write("beam\tmaeb\n")
    with caplog.at_level("INFO", logger="s2s"):
        again = prepare_data(build_task(cfg.task, reg), cfg.data, quiet=True)
    assert len(again.splits["train"]) == 401
    assert any("train.tsv changed" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]
