"""The package's structure: layers import only downward, no import circle, one chokepoint.

DESIGN.md lists the layers in their order of dependence; these tests read the source (module-
level imports only: the protocol methods of ``SVMArray`` may import upward inside their
bodies, the one sanctioned way up) and fail on an upward import, a circle, or a driver call
outside :mod:`svmkit.driver`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import svmkit

PACKAGE = Path(svmkit.__file__).parent

# DESIGN.md's layers, lowest first; a module may import from its own layer and below.
LAYERS = [
    ("svmkit._version", "svmkit.errors"),
    ("svmkit.driver",),
    ("svmkit.capabilities",),
    ("svmkit.policy",),
    ("svmkit.events",),
    ("svmkit.resources",),
    ("svmkit.rules",),
    ("svmkit.arrays",),
    ("svmkit.mapping",),
    ("svmkit.ops",),
    ("svmkit.programs",),
    ("svmkit.interop",),
    ("svmkit.workqueue",),
    ("svmkit.dask",),
    ("svmkit.cli",),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _module_level_imports(path: Path) -> set[str]:
    """svmkit modules imported at module level (not under ``if TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("svmkit"))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("svmkit"):
                    found.add(node.module)
                    found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If):
                test = node.test
                if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


def _layer(name: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    return len(LAYERS)  # the package's __init__: the top


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {t for t in _module_level_imports(path) if t in modules}
        # Importing a submodule initialises its parent packages first: not an edge.
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in _modules() if m != "svmkit" and _layer(m) == len(LAYERS)]
    assert unplaced == []


def test_no_module_imports_upward():
    upward = [
        f"{src} -> {dst}"
        for src, targets in _graph().items()
        for dst in targets
        if src != "svmkit" and _layer(dst) > _layer(src)
    ]
    assert upward == []


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt == "svmkit":
                continue
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state and module != "svmkit":
            walk(module, [module])
    assert circles == []


def test_only_the_driver_package_reaches_pyopencl_private_entry_points():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("svmkit.driver"):
            continue
        text = path.read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "pyopencl"
                and any(a.name == "_cl" for a in node.names)
            ):
                offenders.append(f"{name}: from pyopencl import _cl")
            if isinstance(node, ast.Attribute) and node.attr == "_cl":
                offenders.append(f"{name}: ._cl")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"cl", "pyopencl"}
                and node.attr.startswith("enqueue_")
            ):
                offenders.append(f"{name}: cl.{node.attr}")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "svmkit.driver"
                and any(a.name == "entrypoints" for a in node.names)
            ):
                offenders.append(f"{name}: imports the ctypes entry points")
    assert offenders == []
