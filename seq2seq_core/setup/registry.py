"""Where tasks come from: the `s2s.tasks` entry-point group, or `--plugin module:Class | file.py`.

Installed plugins (the built-in ones included) declare themselves in their package metadata:

    [project.entry-points."s2s.tasks"]
    mytask = "my_package.module:MyTask"

A plugin under development is loaded with `--plugin my_module:MyTask` (a module importable from
the current folder, or installed) or `--plugin path/to/file.py` (a file defines one or more `Task`
subclasses; each is registered under its `name`).

A plugin ships presets too: an installed one through the `s2s.presets` entry-point group
(`NAME = "my_package.presets"`, a package whose `*.yaml` files are presets), a `--plugin` one as
the `*.yaml` files of a `presets/` folder beside its file (`s2s.core.setup.config.presets`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

from ..errors import RegistryError
from ..contract.task import Task

GROUP = "s2s.tasks"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # what a task name may be


def _current_folder_importable() -> None:
    """Let `--plugin module:Class` import a module in the current folder, as `python -m` would:
    the `s2s` script's sys.path starts with its own folder, not the current one. The folder comes
    last, so an installed module of the same name still wins."""
    cwd = os.getcwd()
    if not any(
        Path(p or ".").resolve() == Path(cwd).resolve() for p in sys.path if isinstance(p, str)
    ):
        sys.path.append(cwd)


class Registry:
    """Task classes by name, with the place each came from."""

    def __init__(self):
        self._tasks: dict[str, type[Task]] = {}
        self._origin: dict[str, str] = {}
        self._pending: dict[str, object] = {}  # entry points not imported yet
        #: (folder, origin) of the presets beside each `--plugin` loaded: its `presets/` folder
        self.preset_folders: list[tuple[Path, str]] = []

    @classmethod
    def installed(cls, plugins: list[str] = ()) -> "Registry":
        reg = cls()
        for ep in entry_points(group=GROUP):
            reg._pending[ep.name] = ep
            reg._origin[ep.name] = f"entry point {ep.value} ({ep.dist.name if ep.dist else '?'})"
        for spec in plugins:
            reg.load_plugin(spec)
        return reg

    def register(self, task_cls: type[Task], origin: str) -> None:
        if not (inspect.isclass(task_cls) and issubclass(task_cls, Task)):
            raise RegistryError(f"{origin}: {task_cls!r} is not a subclass of s2s.core.Task")
        name = getattr(task_cls, "name", None)
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{origin}: task class {task_cls.__name__} sets no `name`")
        if not NAME.fullmatch(name):  # it names folders (the prepared cache) and config keys
            raise RegistryError(
                f"{origin}: task class {task_cls.__name__} has name {name!r}: a task name is "
                "a letter followed by letters, digits and _ (e.g. my_task2)"
            )
        self._tasks[name] = task_cls
        self._pending.pop(name, None)
        self._origin[name] = origin

    def load_plugin(self, spec: str) -> list[str]:
        """Register the task(s) of `module:Class`, `module` or a `.py` file path; return names."""
        path = Path(spec)
        if spec.endswith(".py") or path.is_file():
            if not path.is_file():
                raise RegistryError(f"plugin file {spec} does not exist")
            mod_name = f"s2s_plugin_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module
            try:
                module_spec.loader.exec_module(module)
            except Exception as e:  # noqa: BLE001 -- whatever the plugin's code raises
                del sys.modules[mod_name]
                raise RegistryError(
                    f"plugin file {spec} failed to import: {type(e).__name__}: {e}"
                ) from None
            classes = [
                c
                for c in vars(module).values()
                if inspect.isclass(c)
                and issubclass(c, Task)
                and c is not Task
                and c.__module__ == mod_name
                and getattr(c, "name", None)
            ]
            origin = f"plugin file {path}"
        else:
            mod_name, _, attr = spec.partition(":")
            _current_folder_importable()
            try:
                module = importlib.import_module(mod_name)
            except Exception as e:  # noqa: BLE001 -- ImportError, or what the module's code raises
                raise RegistryError(
                    f"cannot import plugin module {mod_name!r}: {type(e).__name__}: {e}"
                ) from None
            if attr:
                if not hasattr(module, attr):
                    raise RegistryError(f"plugin module {mod_name!r} has no attribute {attr!r}")
                classes = [getattr(module, attr)]
            else:
                classes = [
                    c
                    for c in vars(module).values()
                    if inspect.isclass(c)
                    and issubclass(c, Task)
                    and c is not Task
                    and c.__module__ == module.__name__
                    and getattr(c, "name", None)
                ]
            origin = f"--plugin {spec}"
        if not classes:
            raise RegistryError(f"plugin {spec} defines no Task subclass with a name")
        beside = Path(getattr(module, "__file__", None) or path).resolve().parent / "presets"
        if beside.is_dir():
            self.preset_folders.append((beside, origin))
        for c in classes:
            self.register(c, origin)
        return [c.name for c in classes]

    def not_a_preset(self, name: str) -> None:
        """A ConfigError naming the presets of task `name` when a command given `name` as its
        PRESET (`s2s train translation`) meant a task: a task's name is not a preset's."""
        from omegaconf import OmegaConf

        from ..errors import ConfigError
        from .config import presets

        known = presets(self)
        if name in known or name not in self.names() or Path(name).exists():
            return
        ours = [
            p
            for p, places in known.items()
            if (OmegaConf.load(places[0][0]).get("task") or {}).get("name") == name
        ]
        own = [p for p in ours if p.startswith("own_")]
        raise ConfigError(
            f"{name!r} is a task, not a preset: train a preset of it "
            f"({', '.join(ours) or 'none yet'}) "
            "or a YAML file of your own"
            + (
                f"; on your own files: s2s train {own[0]} task.data_dir=DIR (docs/own-data.md)"
                if own
                else ""
            )
        )

    def names(self) -> list[str]:
        return sorted(set(self._tasks) | set(self._pending))

    def origin(self, name: str) -> str:
        return self._origin[name]

    def get(self, name: str) -> type[Task]:
        if name in self._pending:
            ep = self._pending.pop(name)
            try:
                self.register(ep.load(), self._origin[name])
            except Exception as e:
                raise RegistryError(
                    f"task {name!r} ({self._origin[name]}) failed to load: {type(e).__name__}: {e}"
                ) from None
        if name not in self._tasks:
            known = self.names()
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise RegistryError(f"unknown task {name!r}{hint}; known tasks: {', '.join(known)}")
        return self._tasks[name]
