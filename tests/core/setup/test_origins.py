"""Where a task comes from, kept and checked: a registry's records (entry point, module:Class,
file with its SHA-256), a run's recorded origin loaded again without --plugin (`adopt`) or one
line saying what to do, two tasks of one name refused naming both, a task's contract version,
and a plugin file with relative imports."""

from __future__ import annotations

import hashlib

import pytest
from s2s.core import CONTRACT_VERSION
from s2s.core.errors import RegistryError
from s2s.core.setup.registry import Registry

TASK = """
from s2s.plugins.demo import DemoTask


class Mine(DemoTask):
    name = "{name}"
{extra}
"""


def plugin(folder, file: str = "mine.py", name: str = "mine", extra: str = ""):
    path = folder / file
    path.write_text(TASK.format(name=name, extra=extra))
    return path


def test_records_say_where_each_task_came_from(tmp_path, monkeypatch):
    path = plugin(tmp_path)
    reg = Registry.installed([str(path)])
    demo = reg.record("demo")
    assert demo["kind"] == "entry point" and demo["distribution"] == "s2s" and demo["version"]
    assert reg.record("mine") == {
        "kind": "file",
        "path": str(path.resolve()),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    monkeypatch.syspath_prepend(str(tmp_path))
    assert Registry.installed(["mine:Mine"]).record("mine") == {
        "kind": "module",
        "spec": "mine:Mine",
    }


def test_a_recorded_file_loads_without_plugin(tmp_path):
    path = plugin(tmp_path)
    recorded = {"mine": Registry.installed([str(path)]).record("mine")}
    reg = Registry.installed()
    assert "mine" not in reg.names()
    reg.adopt(recorded, "runs/x")
    assert reg.get("mine").__name__ == "Mine"


def test_a_moved_or_changed_file_gets_one_line_saying_what_to_do(tmp_path):
    path = plugin(tmp_path)
    recorded = {"mine": Registry.installed([str(path)]).record("mine")}
    path.write_text(path.read_text() + "# edited\n")
    with pytest.raises(RegistryError) as changed:
        Registry.installed().adopt(recorded, "runs/x")
    message = str(changed.value)
    assert message.startswith(f"runs/x was trained with the plugin file {path.resolve()} (sha256 ")
    assert "has changed since" in message and f"pass --plugin {path.resolve()}" in message
    assert "\n" not in message and "did you mean" not in message
    # as it is now, when asked for
    reg = Registry.installed([str(path)])
    reg.adopt(recorded, "runs/x")
    assert reg.get("mine").__name__ == "Mine"
    path.rename(tmp_path / "elsewhere.py")
    with pytest.raises(RegistryError, match=r"which is missing: pass --plugin NEW_PATH"):
        Registry.installed().adopt(recorded, "runs/x")
    # given its new place, the run uses it
    reg = Registry.installed([str(tmp_path / "elsewhere.py")])
    reg.adopt(recorded, "runs/x")
    assert reg.get("mine").__name__ == "Mine"


def test_a_recorded_module_or_distribution_that_is_gone_is_named():
    with pytest.raises(RegistryError, match=r"^runs/x was trained with task 'gone' of --plugin"):
        Registry.installed().adopt({"gone": {"kind": "module", "spec": "no_such_mod:T"}}, "runs/x")
    record = {
        "kind": "entry point",
        "name": "gone",
        "value": "gone_pkg:T",
        "distribution": "gone-pkg",
        "version": "2.0",
    }
    with pytest.raises(RegistryError, match=r"not installed: pip install gone-pkg==2\.0$"):
        Registry.installed().adopt({"gone": record}, "runs/x")


def test_two_tasks_of_one_name_are_refused_naming_both(tmp_path):
    with pytest.raises(RegistryError) as e:
        Registry.installed([str(plugin(tmp_path, "again.py", name="demo"))])
    message = str(e.value)
    assert message.startswith("task 'demo' is defined twice: by entry point demo = ")
    assert f"by plugin file {(tmp_path / 'again.py').resolve()}" in message
    with pytest.raises(RegistryError, match="defined twice"):
        Registry.installed([str(plugin(tmp_path)), str(plugin(tmp_path, "other.py"))])
    # one file given twice, or a built-in class reached by module, is one task
    path = plugin(tmp_path)
    assert "mine" in Registry.installed([str(path), str(path)]).names()
    reg = Registry.installed(["s2s.plugins.demo:DemoTask"])
    assert reg.get("demo").__name__ == "DemoTask" and reg.origin("demo").startswith("entry point")


@pytest.mark.parametrize(
    "declared, refused",
    [
        (CONTRACT_VERSION, None),
        ("1.0", None),
        ("1.9", "upgrade s2s"),
        ("2.0", "upgrade s2s"),
        ("0.3", "release written for contract 1.x"),
        ("one", "write it as major.minor"),
    ],
)
def test_a_task_outside_the_contract_is_refused_in_one_line(tmp_path, declared, refused):
    path = plugin(tmp_path, extra=f"    contract_version = {declared!r}")
    if refused is None:
        assert Registry.installed([str(path)]).get("mine").contract_version == declared
        return
    with pytest.raises(RegistryError) as e:
        Registry.installed([str(path)])
    assert str(e.value).startswith("task 'mine' (plugin file ") and refused in str(e.value)


def test_a_plugin_file_with_relative_imports_says_what_to_do(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("X = 1\n")
    (package / "task.py").write_text("from .helpers import X\n")
    with pytest.raises(RegistryError) as e:
        Registry.installed([str(package / "task.py")])
    message = str(e.value)
    assert "uses relative imports" in message and "--plugin PACKAGE.MODULE:CLASS" in message
    assert "ImportError" not in message and "no known parent package" not in message


def test_a_recorded_module_whose_task_was_renamed_is_no_did_you_mean(tmp_path, monkeypatch):
    plugin(tmp_path, "renamed.py", name="mine2")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry.installed()
    reg.adopt({"mine": {"kind": "module", "spec": "renamed:Mine"}}, "runs/x")
    with pytest.raises(RegistryError) as e:
        reg.get("mine")
    assert str(e.value) == (
        "runs/x was trained with task 'mine', which its plugin no longer defines: pass --plugin "
        "MODULE:CLASS|FILE.py of the task it was trained with"
    )
