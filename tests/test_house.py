"""The engine's house rules: wings that import only downward, no circles, the formatter's
width, one place for errors, plugins that stand on the engine alone."""

from __future__ import annotations

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from s2s.core import errors

ENGINE = Path(s2s.core.__file__).resolve().parent


#: the wings of the engine, lowest first: a module imports only its own wing and those below
#: it ("" is the root: errors, files, text and progress bars; "tokenizers" the vocabularies;
#: "contract" what a plugin implements)
WINGS = [
    "",
    "tokenizers",
    "contract",
    "setup",
    "data",
    "nn",
    "decode",
    "runs",
    "training",
    "inference",
    "apps",
]


def _module_name(path: Path) -> str:
    """s2s.core.WING.MODULE of an engine file (a package's __init__ is the package)."""
    parts = path.relative_to(ENGINE).with_suffix("").parts
    return ".".join(("s2s.core", *parts[: -1 if parts[-1] == "__init__" else None]))


def _imports() -> dict[str, set[str]]:
    """Engine module -> the engine modules it imports, anywhere in it (inside functions too)."""
    modules = {_module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(base) if node.level else ""
                module = ".".join(filter(None, (base, node.module)))
                # `from . import x`: x may be a module of the package or a name in it
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            else:
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in WINGS) else ""


def test_every_engine_module_lives_in_a_wing():
    for module in _imports():
        assert _wing(module) in WINGS, module
    root = {m for m in _imports() if _wing(m) == ""}
    assert root == {f"s2s.core{x}" for x in ("", ".errors", ".files", ".progress", ".textio")}, root


def test_a_wing_imports_only_the_wings_below_it():
    """Imports inside functions count: they run as surely as the module-level ones, later. The
    package itself (`s2s.core`) is the plugin author's one import: it exports the names of the
    root, the tokenizers and the contract, and imports those wings alone."""
    graph = _imports()
    wings = {_wing(dep) for dep in graph["s2s.core"]}
    assert wings <= {"", "tokenizers", "contract"}, graph["s2s.core"]
    upward = [
        f"{module} imports {dep}"
        for module, deps in graph.items()
        if module != "s2s.core"
        for dep in deps
        if WINGS.index(_wing(dep)) > WINGS.index(_wing(module))
    ]
    assert not upward, upward


def test_inference_and_apps_use_training_only_for_the_trainer():
    """What a run left on disk (its directory, checkpoints, log and result) and its processes
    are the runs wing's: inference and apps read them there, and reach into training only to
    train (`s2s train`, a sweep's runs, the quickstart)."""
    graph = _imports()
    used = {
        f"{module} imports {dep}"
        for module, deps in graph.items()
        if _wing(module) in ("inference", "apps")
        for dep in deps
        if _wing(dep) == "training" and dep != "s2s.core.training.trainer"
    }
    assert not used, sorted(used)


def test_no_import_circles():
    graph, state, path = _imports(), {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                raise AssertionError(" -> ".join(path[path.index(dep) :] + [dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_a_format_imports_no_other_format():
    """inference/formats/ holds a module a format; what two formats share lives in `common`."""
    formats = "s2s.core.inference.formats"
    for module, deps in _imports().items():
        if module.startswith(f"{formats}.") and module != f"{formats}.common":
            crossing = sorted(
                d for d in deps if d.startswith(f"{formats}.") and d != f"{formats}.common"
            )
            assert not crossing, f"{module} imports {crossing[0]}"


def test_the_formatter_and_pyflakes_pass_on_the_whole_repository():
    """ruff format at width 100 and pyflakes (pyproject's [tool.ruff]) instead of a line cap:
    a long module is a prompt to look for a seam, not a failure."""
    repository = ENGINE.parent
    for check in (["format", "--check"], ["check"]):
        done = subprocess.run(
            [sys.executable, "-m", "ruff", *check, "."],
            cwd=repository,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, (
            f"ruff {' '.join(check)}:\n{done.stdout[-3000:]}{done.stderr[-1000:]}"
        )


#: a command line of each command, parsed as the shell would give it
PARSED = [
    ["tasks"],
    ["prepare", "demo", "data.max_tokens=300"],
    ["train", "demo", "-q", "model.layers=2"],
    ["generate", "runs/x", "--input", "in.txt", "--beam", "2", "--sampling", "--top-p", "0.9"],
    ["label", "runs/x", "--input", "in.txt", "--output", "out", "--keep", "0.5"],
    ["score", "demo", "--hyp", "h.txt", "--ref", "r.txt", "--ci"],
    ["rerank", "runs/x", "--input", "n.txt", "--weights", "1,0.5"],
    ["average", "runs/x", "--last", "2"],
    ["export", "runs/x", "--to", "safetensors", "--output", "out"],
    ["import", "Helsinki-NLP/opus-mt-en-de", "--output", "runs/y"],
    ["plot", "runs/x"],
    ["sweep", "demo", "--grid", "model.heads=1,2", "--budget-updates", "5", "--dir", "d"],
    ["attention", "runs/x", "--input", "in.txt", "--output", "out"],
    ["serve", "runs/x", "--port", "0", "--precision", "fp32"],
    ["quickstart", "optim.max_updates=10"],
]


def test_the_command_line_starts_and_parses_without_torch():
    """`s2s --help`, each command's --help and the parsing of a command line of each import no
    torch (a second and more) and no matplotlib: a command imports its work when it runs. The
    imports inside `run` of apps/cli's modules are there for this test."""
    code = textwrap.dedent(
        f"""
        import argparse, contextlib, io, sys
        from s2s.core.apps.cli import build_parser, main
        parser = build_parser()
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for argv in (["--help"], *([c, "--help"] for c in commands.choices)):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
                main(argv)
        for argv in {PARSED!r}:
            assert parser.parse_known_args(argv)[0].command == argv[0], argv
        print(" ".join(m for m in ("torch", "matplotlib") if m in sys.modules))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"the command line's start-up imports {done.stdout}"


def test_every_error_class_lives_in_errors():
    for path in ENGINE.rglob("*.py"):
        if path.name == "errors.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = [
            n.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ClassDef) and n.name.endswith("Error")
        ]
        assert not classes, f"{path.name} defines {classes}: error classes belong in errors.py"
    assert all(
        issubclass(getattr(errors, n), errors.S2SError)
        for n in dir(errors)
        if n.endswith("Error") and n != "S2SError"
    )


def test_a_plugin_imports_the_engine_not_another_plugin():
    """Each built-in plugin stands on the engine alone (what several share, as subword
    vocabularies, lives in the engine), so any one of them can be taken out or replaced."""
    import ast

    plugins = ENGINE.parent / "plugins"
    for plugin in (p for p in plugins.iterdir() if (p / "__init__.py").exists()):
        for path in plugin.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
                others = [
                    n
                    for n in names
                    if n.startswith("s2s.plugins.") and n.split(".")[2] != plugin.name
                ]
                assert not others, f"{path.relative_to(plugins)} imports {others}"


def test_a_plugin_enters_the_engine_by_its_front_door():
    """A built-in plugin imports the engine as an outside plugin may: `from s2s.core import
    NAMES`, names that `s2s.core.__all__` exports, never a module inside the engine."""
    plugins = ENGINE.parent / "plugins"
    public = set(s2s.core.__all__)
    for path in sorted(plugins.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                inside = [a.name for a in node.names if a.name.startswith("s2s.core")]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("s2s.core"):
                names = {a.name for a in node.names}
                inside = [node.module] if node.module != "s2s.core" else sorted(names - public)
            else:
                continue
            where = f"{path.relative_to(plugins)}, line {node.lineno}"
            assert not inside, f"{where} imports {inside}: import from s2s.core (its __all__)"


def test_docs_layout_names_every_engine_module_in_its_wing():
    """docs/layout.md describes each wing's modules in one clause; a new module is added there."""
    layout = (ENGINE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    sections = re.split(r"^\*\*", layout, flags=re.M)[1:]
    named = {
        (section.split("**")[0].strip("()`").removeprefix("The root"), name)
        for section in sections
        for name in re.findall(r"^- `([\w/]+)`", section, flags=re.M)
    }
    for path in ENGINE.rglob("*.py"):
        parts = path.relative_to(ENGINE).parts
        if len(parts) > 1 and parts[-1] == "__init__.py":
            continue  # a wing's own docstring
        wing = "" if len(parts) == 1 else parts[0]
        name = f"{parts[1]}/" if len(parts) > 2 else path.stem
        assert (wing, name) in named, f"docs/layout.md does not name {'/'.join(parts)}"


def test_no_test_imports_bench():
    """The tests stand on the project and their own fixtures, never on bench/ (a benchmark may be
    changed or removed for its figures' sake): a builder both use lives in a fixture module under
    tests/ (tests/core/inference/*_fixture.py) and the benchmark imports it from there."""
    tests = Path(__file__).resolve().parent
    importing = re.compile(r"^\s*(?:from\s+bench(?:\.|\s)|import\s+bench\b)", flags=re.M)
    found = [
        f"{path.relative_to(tests.parent)}, line {text.count(chr(10), 0, m.start()) + 1}"
        for path in sorted(tests.rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for m in importing.finditer(text)
    ]
    assert not found, f"tests import bench/: {found}"
