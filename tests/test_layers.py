"""The package's layers, as docs/architecture.md states them: nothing imports upwards, and no
two modules import each other (directly or round a longer circle), lazy imports included."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "commsched"

# Bottom up. A module may import from its own layer and the layers below it.
LAYERS: list[set[str]] = [
    {"_C", "config", "bandwidth", "ops", "compression", "compression_math", "torch_compat",
     "outputs"},
    {"plan"},
    {"sim"},
    {"world"},
    {"runtime"},
    {"optimizer", "grad_scaler", "params", "kfac", "checkpoint", "join"},
    {"__init__", "__main__", "info", "bench", "reporting", "lightning"},
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """Every commsched module `name` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("commsched"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("commsched"):
                continue
            for alias in node.names:
                # `from .. import world`: the name is a module of its own (its package's
                # __init__ runs first, as for every import, and is no edge of its own)
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in known or submodule == "commsched._C"
                          else target)
    return {m for m in found if m in known or m == "commsched._C"} - {name}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, members in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module}: its folder or file '{top}' has no layer in LAYERS")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        _layer(module)


def test_nothing_imports_upwards() -> None:
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in _graph().items() for t in targets if _layer(t) > _layer(m)]
    assert not upward, "\n".join(upward)


def test_the_package_imports_no_benchmark_harness() -> None:
    # The harnesses that write the project's reports (benchmarks/harness) are left out of the
    # wheel: the package must run without them.
    found = []
    for name, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            found += [f"{name} imports {t}" for t in targets if t.split(".")[0] == "benchmarks"]
    assert not found, "\n".join(found)


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_circles() -> None:
    graph = _graph()
    # A package's __init__ re-exports its modules; a module importing a sibling through the
    # package (`from ..world import World`) then closes a circle only if the package's own
    # __init__ imports that module back, which is what this test is after.
    cycle = _find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    assert _layer("commsched.runtime.session") > _layer("commsched.world.bootstrap")
    with pytest.raises(AssertionError, match="no layer"):
        _layer("commsched.somewhere_new")
