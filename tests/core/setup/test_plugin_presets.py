"""Presets that plugins ship: an installed plugin's through the `s2s.presets` entry-point group,
a `--plugin FILE.py`'s from the `presets/` folder beside the file; `s2s tasks` names where each
comes from, and a name two places give is refused in one line naming both."""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults

import subprocess
import sys
import textwrap

import pytest

from s2s.core.errors import ConfigError
from s2s.core.setup.config import load_config, preset_path, presets
from s2s.core.setup.registry import Registry

PLUGIN = """
from dataclasses import dataclass

from s2s.core import Task, TaskConfig


@dataclass
class EchoConfig(TaskConfig):
    size: int = 10


class Echo(Task):
    name = "echo_{tag}"
    Config = EchoConfig
"""


def _plugin_file(folder, tag: str, presets_named=("echo_tiny",)):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"echo_{tag}.py"
    path.write_text(PLUGIN.replace("{tag}", tag), encoding="utf-8")
    (folder / "presets").mkdir(exist_ok=True)
    for name in presets_named:
        (folder / "presets" / f"{name}.yaml").write_text(
            f"task: {{name: echo_{tag}, size: 3}}\nmodel: {{layers: 1}}\n", encoding="utf-8"
        )
    return path


def test_a_plugin_files_presets_are_found_beside_it(tmp_path):
    path = _plugin_file(tmp_path / "mine", "a")
    registry = Registry.installed([str(path)])
    assert preset_path("echo_tiny", registry) == tmp_path / "mine" / "presets" / "echo_tiny.yaml"
    cfg = load_config("echo_tiny", registry=registry)
    assert cfg.task.name == "echo_a" and cfg.task.size == 3 and cfg.model.layers == 1
    with pytest.raises(ConfigError, match="unknown preset 'echo_tiny'"):
        preset_path("echo_tiny", Registry.installed())  # without --plugin: not there


def test_s2s_tasks_lists_a_plugins_presets_with_their_origin(tmp_path):
    path = _plugin_file(tmp_path / "mine", "b")
    out = subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", "tasks", "--plugin", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("echo_tiny "))
    assert f"plugin file {path}" in line, out
    assert any(x.startswith("demo ") and "built-in" in x for x in out.splitlines()), out


def test_a_preset_name_from_two_places_is_refused_naming_both(tmp_path):
    path = _plugin_file(tmp_path / "mine", "c", presets_named=("demo",))
    registry = Registry.installed([str(path)])
    with pytest.raises(ConfigError) as e:
        load_config("demo", registry=registry)
    message = str(e.value)
    assert "\n" not in message and "two places" in message, message
    assert (
        "s2s (built-in)" in message and str(tmp_path / "mine" / "presets" / "demo.yaml") in message
    )
    # the other presets stay usable, and a YAML path always names one file
    assert preset_path("wmt14_en_de_base", registry).name == "wmt14_en_de_base.yaml"
    assert load_config(str(tmp_path / "mine" / "presets" / "demo.yaml"), registry=registry)


def test_an_installed_plugins_presets_come_through_the_entry_point_group(tmp_path, monkeypatch):
    """A distribution on sys.path declaring `[s2s.presets] shapes = shapes_pkg.presets`, as an
    installed wheel does."""
    site = tmp_path / "site"
    package = site / "shapes_pkg" / "presets"
    package.mkdir(parents=True)
    (site / "shapes_pkg" / "__init__.py").write_text("", encoding="utf-8")
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "shapes_demo.yaml").write_text(
        "task: {name: demo, train_size: 30}\n", encoding="utf-8"
    )
    info = site / "shapes_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shapes-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        textwrap.dedent("""\
        [s2s.presets]
        shapes = shapes_pkg.presets
        """)
    )
    monkeypatch.syspath_prepend(str(site))
    found = presets()
    ((path, origin),) = found["shapes_demo"]
    assert path == package / "shapes_demo.yaml"
    assert origin == "entry point shapes = shapes_pkg.presets (shapes-pkg)"
    assert load_config("shapes_demo", registry=Registry.installed()).task.train_size == 30
