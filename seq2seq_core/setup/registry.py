"""Where tasks come from: the `s2s.tasks` entry-point group, or `--plugin module:Class | file.py`.

Installed plugins (the built-in ones included) declare themselves in their package metadata:

    [project.entry-points."s2s.tasks"]
    mytask = "my_package.module:MyTask"

A plugin under development is loaded with `--plugin my_module:MyTask` (a module importable from
the current folder, or installed) or `--plugin path/to/file.py` (a file defines one or more `Task`
subclasses; each is registered under its `name`).

Each task's origin is kept as a record (`record`) that a run writes beside its checkpoints (an
entry point with its distribution and version, `module:Class`, or a file with its SHA-256), so
that a run loads its task again without `--plugin` (`adopt`), and says in one line what to do
when the file moved or changed. Two tasks of one name from two places are refused, and so is a
task written for a contract this s2s does not keep (`Task.contract_version`).

A plugin ships presets too: an installed one through the `s2s.presets` entry-point group
(`NAME = "my_package.presets"`, a package whose `*.yaml` files are presets), a `--plugin` one as
the `*.yaml` files of a `presets/` folder beside its file (`s2s.core.setup.config.presets`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
from importlib.metadata import entry_points
from pathlib import Path

from ..errors import RegistryError
from ..files import sha256
from ..contract.task import CONTRACT_VERSION, Task

GROUP = "s2s.tasks"
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # what a task name may be
VERSION = re.compile(r"(\d+)\.(\d+)")  # a contract version, major.minor
log = logging.getLogger("s2s")


def _current_folder_importable() -> None:
    """Let `--plugin module:Class` import a module in the current folder, as `python -m` would:
    the `s2s` script's sys.path starts with its own folder, not the current one. The folder comes
    last, so an installed module of the same name still wins."""
    cwd = os.getcwd()
    if not any(
        Path(p or ".").resolve() == Path(cwd).resolve() for p in sys.path if isinstance(p, str)
    ):
        sys.path.append(cwd)


def described(record: dict) -> str:
    """A task's origin record in words: "entry point demo = s2s.plugins.demo:DemoTask (s2s
    0.1.0)", "--plugin my_module:MyTask", "plugin file /a/b.py"."""
    kind = record.get("kind")
    if kind == "entry point":
        return (
            f"entry point {record.get('name')} = {record.get('value')} "
            f"({record.get('distribution') or '?'} {record.get('version') or '?'})"
        )
    if kind == "module":
        return f"--plugin {record.get('spec')}"
    return f"plugin file {record.get('path')}"


def contract_problem(task_cls: type) -> str | None:
    """Why this s2s cannot run `task_cls` by the contract version it declares, or None: a
    version that is not "major.minor", another major version, or a newer minor one."""
    declared = getattr(task_cls, "contract_version", None)
    if declared is None:
        return None
    ours = tuple(int(x) for x in VERSION.fullmatch(CONTRACT_VERSION).groups())
    found = VERSION.fullmatch(declared) if isinstance(declared, str) else None
    if found is None:
        return (
            f"declares contract_version {declared!r}: write it as major.minor, e.g. "
            f"{CONTRACT_VERSION!r}"
        )
    theirs = tuple(int(x) for x in found.groups())
    if theirs[0] != ours[0] or theirs[1] > ours[1]:
        newer = theirs > ours
        return (
            f"was written for s2s contract {declared}, this s2s keeps contract {CONTRACT_VERSION}: "
            + (
                "upgrade s2s (pip install -U s2s)"
                if newer
                else f"use the plugin's release written for contract {ours[0]}.x"
            )
        )
    return None


class Registry:
    """Task classes by name, with the place each came from (in words: `origin`; as a record a
    run keeps: `record`)."""

    def __init__(self):
        self._tasks: dict[str, type[Task]] = {}
        self._records: dict[str, dict] = {}
        self._pending: dict[str, object] = {}  # entry points not imported yet
        self._clashes: dict[str, str] = {}  # name -> why two installed entry points clash
        self._runs: dict[str, str] = {}  # name -> the run whose record loaded it (`adopt`)
        #: (folder, origin) of the presets beside each `--plugin` loaded: its `presets/` folder
        self.preset_folders: list[tuple[Path, str]] = []

    @classmethod
    def installed(cls, plugins: list[str] = ()) -> "Registry":
        reg = cls()
        for ep in entry_points(group=GROUP):
            record = {
                "kind": "entry point",
                "name": ep.name,
                "value": ep.value,
                "distribution": ep.dist.name if ep.dist else None,
                "version": ep.dist.version if ep.dist else None,
            }
            if ep.name in reg._pending and reg._records[ep.name]["value"] != ep.value:
                reg._clashes[ep.name] = _twice(ep.name, reg._records[ep.name], record)
                continue
            reg._pending[ep.name] = ep
            reg._records[ep.name] = record
        for spec in plugins:
            reg.load_plugin(spec)
        return reg

    def register(self, task_cls: type[Task], origin: dict | str) -> None:
        """Add `task_cls` under its `name`, from `origin` (a record, or words for a class
        registered by hand). A name some other class holds already is refused, naming both."""
        record = origin if isinstance(origin, dict) else {"kind": "module", "spec": origin}
        where = described(record)
        if not (inspect.isclass(task_cls) and issubclass(task_cls, Task)):
            raise RegistryError(f"{where}: {task_cls!r} is not a subclass of s2s.core.Task")
        name = getattr(task_cls, "name", None)
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{where}: task class {task_cls.__name__} sets no `name`")
        if not NAME.fullmatch(name):  # it names folders (the prepared cache) and config keys
            raise RegistryError(
                f"{where}: task class {task_cls.__name__} has name {name!r}: a task name is "
                "a letter followed by letters, digits and _ (e.g. my_task2)"
            )
        problem = contract_problem(task_cls)
        if problem:
            raise RegistryError(f"task {name!r} ({where}) {problem}")
        held = self._holder(name, record)
        if held is not None and held is not task_cls:
            raise RegistryError(_twice(name, self._records[name], record))
        if held is task_cls and name in self._records:
            record = self._records[name]  # one class reached two ways: keep the first record
        self._tasks[name] = task_cls
        self._pending.pop(name, None)
        self._records[name] = record

    def _holder(self, name: str, record: dict):
        """The class registered under `name` already (an installed entry point imported to
        compare), or None. A file loaded again (the same path and bytes) holds nothing."""
        if name in self._clashes:
            raise RegistryError(self._clashes[name])
        if name in self._pending:
            ep = self._pending[name]
            if record == self._records[name]:
                return None  # the entry point itself, being imported
            try:
                return ep.load()
            except Exception:  # noqa: BLE001 -- it cannot hold the name if it cannot load
                return None
        if name in self._tasks and self._records.get(name) == record:
            return None
        return self._tasks.get(name)

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
            except ImportError as e:
                del sys.modules[mod_name]
                if "relative import" in str(e):
                    raise RegistryError(
                        f"plugin file {spec} uses relative imports (from . import ...), which a "
                        "file alone cannot: pass its package as --plugin PACKAGE.MODULE:CLASS "
                        "from the folder above the package, or pip install -e the package"
                    ) from None
                raise RegistryError(
                    f"plugin file {spec} failed to import: {type(e).__name__}: {e}"
                ) from None
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
            origins = [{"kind": "file", "path": str(path.resolve()), "sha256": sha256(path)}] * len(
                classes
            )
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
            origins = [
                {"kind": "module", "spec": f"{mod_name}:{attr or getattr(c, '__name__', '?')}"}
                for c in classes
            ]
        if not classes:
            raise RegistryError(f"plugin {spec} defines no Task subclass with a name")
        beside = Path(getattr(module, "__file__", None) or path).resolve().parent / "presets"
        if beside.is_dir():
            self.preset_folders.append((beside, described(origins[0])))
        for c, origin in zip(classes, origins):
            self.register(c, origin)
        return [c.name for c in classes]

    def adopt(self, recorded: dict, run) -> None:
        """Load the tasks a run recorded (`recorded`: task name -> its origin's record, as
        `record` gave it when the run trained) that this registry lacks: the plugin file (when
        its SHA-256 is the same) or module of the run. A task already here (installed, or given
        with --plugin) is used as it is. What cannot be loaded is a RegistryError saying, in one
        line, what to do: a file missing or changed, a module or distribution not installed."""
        for name, record in sorted((recorded or {}).items()):
            if not isinstance(record, dict):
                continue
            if name in self._tasks or name in self._pending:
                mine = self._records.get(name, {})
                if (mine.get("kind"), mine.get("path") or mine.get("spec")) != (
                    record.get("kind"),
                    record.get("path") or record.get("spec"),
                ) and record.get("kind") != "entry point":
                    log.info(
                        "%s was trained with task %r of %s; using %s",
                        run,
                        name,
                        described(record),
                        described(mine),
                    )
                continue
            self._runs[name] = str(run)
            kind = record.get("kind")
            if kind == "file":
                self._adopt_file(name, record, run)
            elif kind == "module":
                try:
                    self.load_plugin(str(record.get("spec")))
                except RegistryError as e:
                    raise RegistryError(
                        f"{run} was trained with task {name!r} of --plugin {record.get('spec')}, "
                        f"which does not load here ({e}): install its package, run s2s from the "
                        "folder that holds it, or pass --plugin MODULE:CLASS|FILE.py"
                    ) from None
            else:
                dist, version = record.get("distribution"), record.get("version")
                raise RegistryError(
                    f"{run} was trained with task {name!r} of {described(record)}, which is not "
                    f"installed: pip install {dist}=={version}"
                    if dist
                    else f"{run} was trained with task {name!r} of {described(record)}, which is "
                    "not installed: install its package, or pass --plugin MODULE:CLASS|FILE.py"
                )

    def _adopt_file(self, name: str, record: dict, run) -> None:
        """Load the plugin file a run recorded for task `name`, when it is there unchanged."""
        path, digest = Path(str(record.get("path"))), str(record.get("sha256"))
        was = f"{run} was trained with the plugin file {path} (sha256 {digest[:12]}...)"
        if not path.is_file():
            raise RegistryError(f"{was}, which is missing: pass --plugin NEW_PATH (its new place)")
        now = sha256(path)
        if now != digest:
            raise RegistryError(
                f"{was}, which has changed since (sha256 now {now[:12]}...): pass --plugin "
                f"{path} to use it as it is now, or restore the file"
            )
        self.load_plugin(str(path))

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
            f"({', '.join(ours) or 'none yet'}) or a YAML file of your own"
            + (
                f"; on your own files: s2s train {own[0]} task.data_dir=DIR (docs/own-data.md)"
                if own
                else ""
            )
        )

    def names(self) -> list[str]:
        return sorted(set(self._tasks) | set(self._pending))

    def origin(self, name: str) -> str:
        """Where task `name` comes from, in words (what `s2s tasks` prints)."""
        return described(self._records[name])

    def record(self, name: str) -> dict:
        """Where task `name` comes from, as a run records it (`adopt` reads it back): kind
        "entry point" (name, value, distribution, version), "module" (spec, module:Class) or
        "file" (path, sha256)."""
        return dict(self._records[name])

    def get(self, name: str) -> type[Task]:
        if name in self._clashes:
            raise RegistryError(self._clashes[name])
        if name in self._pending:
            ep, record = self._pending[name], self._records[name]
            try:
                task_cls = ep.load()
            except Exception as e:
                raise RegistryError(
                    f"task {name!r} ({described(record)}) failed to load: {type(e).__name__}: {e}"
                ) from None
            self.register(task_cls, record)
        if name not in self._tasks and name in self._runs:
            raise RegistryError(
                f"{self._runs[name]} was trained with task {name!r}, which its plugin no longer "
                "defines: pass --plugin MODULE:CLASS|FILE.py of the task it was trained with"
            )
        if name not in self._tasks:
            known = self.names()
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise RegistryError(f"unknown task {name!r}{hint}; known tasks: {', '.join(known)}")
        return self._tasks[name]


def _twice(name: str, first: dict, second: dict) -> str:
    """The one line that refuses a second task of one name."""
    return (
        f"task {name!r} is defined twice: by {described(first)} and by {described(second)}; "
        "rename one (its `name`) or leave one out (uninstall it, or drop its --plugin)"
    )
