"""The engine's house rules (issue 22): no import circles, short modules, one place for errors."""
from __future__ import annotations

import ast
from pathlib import Path

import s2s.core  # noqa: F401  before torch: the CPU runtime defaults
from s2s.core import errors

ENGINE = Path(s2s.core.__file__).resolve().parent


def _imports() -> dict[str, set[str]]:
    """Engine module -> the engine modules it imports at module level (what runs on import)."""
    graph = {}
    for path in sorted(ENGINE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found = set()
        for node in tree.body:  # module level only: an import inside a function is no circle
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("s2s.core."):
                found.add(node.module.split(".")[2])
        graph[path.stem] = found & {p.stem for p in ENGINE.glob("*.py")}
    return graph


def test_no_import_circles():
    graph, state, path = _imports(), {}, []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                raise AssertionError(" -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_no_engine_file_over_400_lines():
    long = {p.name: n for p in ENGINE.glob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert not long, long


def test_every_error_class_lives_in_errors():
    for path in ENGINE.glob("*.py"):
        if path.name == "errors.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = [n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name.endswith("Error")]
        assert not classes, f"{path.name} defines {classes}: error classes belong in errors.py"
    assert all(issubclass(getattr(errors, n), errors.S2SError) for n in dir(errors)
               if n.endswith("Error") and n != "S2SError")


def test_a_plugin_imports_the_engine_not_another_plugin():
    """Each built-in plugin stands on the engine alone (what several share, as subword
    vocabularies, lives in the engine), so any one of them can be taken out or replaced."""
    import ast

    plugins = ENGINE.parent / "plugins"
    for plugin in (p for p in plugins.iterdir() if (p / "__init__.py").exists()):
        for path in plugin.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                others = [n for n in names if n.startswith("s2s.plugins.") and n.split(".")[2] != plugin.name]
                assert not others, f"{path.relative_to(plugins)} imports {others}"
