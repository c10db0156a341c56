"""The package's structure: layers import only downward, no import circle, one chokepoint.

DESIGN.md lists the layers in their order of dependence.  These tests read the source of
every module, function bodies included, and fail on

* an upward import anywhere (module level, inside a function, or through
  ``importlib.import_module``) except the one sanctioned way up: the protocol methods of
  ``SVMArray`` that are one-line delegations to their interop function (DESIGN.md "One
  sanctioned way up");
* an import circle among module-level imports;
* a driver call outside :mod:`svmkit.driver`: a call of a ``pyopencl`` module attribute
  (``cl.Kernel(...)``, ``cl.enqueue_marker(...)``, ``cl.wait_for_events(...)``), a method
  that reaches the driver (``.wait()``, ``.finish()``, a queue's ``.flush()``, ``.build()``,
  ``.get_info()``...) or a driver-querying property (``.command_execution_status``).
  ``isinstance`` checks, ``cl.`` constants and types in annotations, and the base-class
  constructors of ``SVMArray``, ``sk.Program`` and ``sk.Kernel`` are not calls.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
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

# The one sanctioned way up (DESIGN.md): methods of this class, in this module, whose body
# is an import from the interop layer and one ``return``.
PROTOCOL_CLASS = ("svmkit.arrays.array", "SVMArray")
PROTOCOL_TARGET = "svmkit.interop"

# Methods whose call reaches the driver, whatever object they are called on.
DRIVER_METHODS = {
    "build",
    "compile",
    "finish",
    "get_arg_info",
    "get_build_info",
    "get_devices",
    "get_info",
    "get_profiling_info",
    "get_work_group_info",
    "set_arg",
    "set_args",
    "set_status",
}
# Standard-library modules whose methods share a name with a driver method (``re.compile``).
NOT_DRIVER_OBJECTS = {"re", "ast", "builtins"}
# ``.wait()`` with no argument is ``clWaitForEvents`` (threading's waits take a timeout or
# are not called so); ``.flush()`` on a queue is ``clFlush`` (a stream's is not).
DRIVER_PROPERTIES = {"command_execution_status"}
# Base classes whose constructor a subclass may call as ``cl.<name>.__init__(self, ...)``.
BASE_CLASSES = {"SVM", "Program", "Kernel"}

# Driver calls allowed outside svmkit.driver, by (module, enclosing function, called
# expression): none today.  Each entry must still match a call (the test says when one can
# be dropped).
ALLOWED: set[tuple[str, str, str]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _layer(name: str) -> int:
    for index, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    return len(LAYERS)  # the package's __init__: the top


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


@dataclass
class Import:
    """One import of an svmkit module: where it stands and what it names."""

    targets: set[str]
    line: int
    scope: tuple[str, ...]  # enclosing classes and functions, outermost first
    module_level: bool
    sanctioned: bool = False


@dataclass
class Scan:
    """What one module's source holds: its svmkit imports and its driver calls."""

    imports: list[Import] = field(default_factory=list)
    driver_calls: list[tuple[int, str, str]] = field(default_factory=list)  # line, fn, call


def _import_targets(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name.split(".")[0] == "svmkit"}
    module = node.module if isinstance(node, ast.ImportFrom) and node.level == 0 else None
    if module and module.split(".")[0] == "svmkit":
        assert isinstance(node, ast.ImportFrom)
        return {module} | {f"{module}.{a.name}" for a in node.names}
    if (  # importlib.import_module("svmkit...") / __import__("svmkit...")
        isinstance(node, ast.Call)
        and ast.unparse(node.func) in {"importlib.import_module", "import_module", "__import__"}
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and str(node.args[0].value).split(".")[0] == "svmkit"
    ):
        return {str(node.args[0].value)}
    return set()


def _pyopencl_names(tree: ast.Module) -> set[str]:
    """Names bound to the ``pyopencl`` module or to one of its attributes (``from pyopencl
    import X``) anywhere in the module."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "pyopencl":
                    names.add(a.asname or "pyopencl")
                elif a.name.startswith("pyopencl.") and a.asname is None:
                    names.add("pyopencl")  # (`import pyopencl.array` binds `pyopencl`)
        elif isinstance(node, ast.ImportFrom) and node.module == "pyopencl" and node.level == 0:
            names.update(a.asname or a.name for a in node.names)
    return names


def _driver_names(tree: ast.Module) -> set[str]:
    """Names bound to modules of :mod:`svmkit.driver` (``from svmkit.driver import calls``):
    their functions are the chokepoint, whatever they are called."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("svmkit.driver"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(
                a.asname for a in node.names if a.asname and a.name.startswith("svmkit.driver")
            )
    return names


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _driver_call(node: ast.AST, cl_names: set[str], driver_names: set[str]) -> str | None:
    """The called expression if ``node`` calls the driver, else None."""
    if isinstance(node, ast.Attribute) and node.attr in DRIVER_PROPERTIES:
        if isinstance(node.ctx, ast.Load) and _root(node) not in cl_names:  # (not the enum)
            return ast.unparse(node)
        return None
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    text = ast.unparse(func)
    if _root(func) in cl_names:
        if (  # a base-class constructor: cl.SVM.__init__(self, ...)
            isinstance(func, ast.Attribute)
            and func.attr == "__init__"
            and isinstance(func.value, ast.Attribute)
            and func.value.attr in BASE_CLASSES
            and _root(func.value) in cl_names
        ):
            return None
        if text.startswith("pyopencl.array.") or text.startswith("cl.array."):
            return None  # pyopencl.array is a library over the driver, not the driver
        return text
    if not isinstance(func, ast.Attribute) or _root(func) in driver_names:
        return None
    receiver = ast.unparse(func.value)
    if receiver in NOT_DRIVER_OBJECTS:
        return None
    if func.attr in DRIVER_METHODS:
        return text
    if func.attr == "wait" and not node.args and not node.keywords:
        return text
    if func.attr == "flush" and "queue" in receiver.lower():
        return text
    return None


def scan_source(module: str, source: str) -> Scan:
    """Every svmkit import and every driver call of ``module``'s ``source``."""
    tree = ast.parse(source)
    cl_names = _pyopencl_names(tree)
    driver_names = _driver_names(tree)
    scan = Scan()

    def visit(node: ast.AST, scope: tuple[str, ...], in_function: bool, delegation: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:  # (the TYPE_CHECKING branch is never run)
                visit(child, scope, in_function, delegation)
            return
        targets = _import_targets(node)
        if targets:
            line = getattr(node, "lineno", 0)
            scan.imports.append(Import(targets, line, scope, not in_function, delegation))
        call = _driver_call(node, cl_names, driver_names)
        if call is not None:
            line = getattr(node, "lineno", 0)
            scan.driver_calls.append((line, scope[-1] if scope else "", call))
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                child_delegation = (
                    (module, node.name) == PROTOCOL_CLASS
                    and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                    and _is_delegation(child)
                )
                visit(child, (*scope, node.name), in_function, child_delegation)
            for part in (*node.bases, *node.keywords, *node.decorator_list):
                visit(part, scope, in_function, False)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            name = getattr(node, "name", "<lambda>")
            inner = (*scope, name)
            for sub in ast.iter_child_nodes(node):
                visit(sub, inner, True, delegation)
            return
        for sub in ast.iter_child_nodes(node):
            visit(sub, scope, in_function, delegation)

    for statement in tree.body:
        visit(statement, (), False, False)
    return scan


def _is_delegation(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``fn``'s body is ``[docstring] from svmkit.interop... import f; return ...``."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (
        len(body) == 2
        and isinstance(body[0], ast.ImportFrom)
        and (body[0].module or "").startswith(PROTOCOL_TARGET + ".")
        and isinstance(body[1], ast.Return)
    )


def upward_imports(module: str, scan: Scan, known: set[str] | None = None) -> list[str]:
    """``module -> target`` for each import of a higher layer that is not sanctioned."""
    if module == "svmkit":
        return []
    found = []
    for imp in scan.imports:
        for target in sorted(imp.targets):
            if known is not None and target not in known:
                continue
            if _layer(target) > _layer(module):
                sanctioned = imp.sanctioned and (
                    target == PROTOCOL_TARGET or target.startswith(PROTOCOL_TARGET + ".")
                )
                if not sanctioned:
                    where = ".".join(imp.scope) or "module level"
                    found.append(f"{module}:{imp.line} ({where}) -> {target}")
    return found


def driver_calls_outside_driver(module: str, scan: Scan) -> list[str]:
    """``module:line (function) call`` for each driver call not allowed in ``module``."""
    if module == "svmkit.driver" or module.startswith("svmkit.driver."):
        return []
    return [
        f"{module}:{line} ({fn}) {call}"
        for line, fn, call in scan.driver_calls
        if (module, fn, call) not in ALLOWED
    ]


def _scans() -> dict[str, Scan]:
    return {name: scan_source(name, path.read_text()) for name, path in _modules().items()}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, scan in _scans().items():
        targets = {t for imp in scan.imports if imp.module_level for t in imp.targets}
        targets &= set(modules)
        # Importing a submodule initialises its parent packages first: not an edge.
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


# -- the package -----------------------------------------------------------------------------


def test_every_module_belongs_to_a_layer():
    unplaced = [m for m in _modules() if m != "svmkit" and _layer(m) == len(LAYERS)]
    assert unplaced == []


def test_no_module_imports_upward_anywhere():
    known = set(_modules())
    upward = [u for name, scan in _scans().items() for u in upward_imports(name, scan, known)]
    assert upward == []


def test_the_protocol_delegations_are_seen_and_sanctioned():
    # The walk reaches the method bodies: SVMArray's delegations import upward, sanctioned.
    scan = _scans()["svmkit.arrays.array"]
    sanctioned = {imp.scope[-1] for imp in scan.imports if imp.sanctioned}
    assert {"__dlpack__", "__reduce__", "to_cl_array", "__array__"} <= sanctioned


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


def test_no_driver_call_outside_the_driver_package():
    offenders = [
        c for name, scan in _scans().items() for c in driver_calls_outside_driver(name, scan)
    ]
    assert offenders == []


def test_every_allowed_driver_call_still_exists():
    # An entry that matches nothing moved behind driver/calls.py: drop it from ALLOWED.
    seen = {
        (name, fn, call) for name, scan in _scans().items() for _, fn, call in scan.driver_calls
    }
    assert sorted(ALLOWED - seen) == []


def test_only_the_driver_package_reaches_pyopencl_private_entry_points():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("svmkit.driver"):
            continue
        tree = ast.parse(path.read_text())
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
                isinstance(node, ast.ImportFrom)
                and node.module == "svmkit.driver"
                and any(a.name == "entrypoints" for a in node.names)
            ):
                offenders.append(f"{name}: imports the ctypes entry points")
    assert offenders == []


# -- the checker itself, on small sources --------------------------------------------------


def _calls(module: str, source: str) -> list[str]:
    scan = scan_source(module, textwrap.dedent(source))
    return [call for _, _, call in scan.driver_calls if (module, _, call) not in ALLOWED]


def _up(module: str, source: str) -> list[str]:
    return upward_imports(module, scan_source(module, textwrap.dedent(source)))


def test_checker_finds_driver_calls_inside_functions():
    source = """
        import pyopencl as cl
        from pyopencl import UserEvent as make_event

        def f(queue, event, program, ctx):
            event.wait()
            queue.finish()
            queue.flush()
            program.build(options=[])
            k = cl.Kernel(program, "k")
            cl.enqueue_marker(queue)
            cl.wait_for_events([event])
            make_event(ctx)
            return event.command_execution_status < 0

        class C:
            def m(self, queue, event):
                return lambda: (
                    self.queues[0].flush(), event.set_status(0), cl.CommandQueue(queue.context)
                )
    """
    assert _calls("svmkit.ops.transfer", source) == [
        "event.wait",
        "queue.finish",
        "queue.flush",
        "program.build",
        "cl.Kernel",
        "cl.enqueue_marker",
        "cl.wait_for_events",
        "make_event",
        "event.command_execution_status",
        "self.queues[0].flush",
        "event.set_status",
        "cl.CommandQueue",
    ]
    assert _calls("svmkit.driver.calls", source) != []  # scanned, but allowed there:
    assert (
        driver_calls_outside_driver(
            "svmkit.driver.calls", scan_source("x", textwrap.dedent(source))
        )
        == []
    )


def test_checker_allows_what_is_not_a_driver_call():
    source = """
        from __future__ import annotations
        import re
        import threading
        import pyopencl as cl

        class A(cl.SVM):
            def __init__(self, view: cl.SVM, queue: cl.CommandQueue | None = None) -> None:
                cl.SVM.__init__(self, view)

        class P(cl.Program):
            def __init__(self, ctx: cl.Context, src: str) -> None:
                super().__init__(ctx, src)

        class K(cl.Kernel):
            def __init__(self, program: cl.Program, name: str) -> None:
                cl.Kernel.__init__(self, program, name)

        def f(x, stream, done: threading.Event, events: list[cl.Event]) -> int:
            if isinstance(x, cl.Event) or issubclass(type(x), cl.Error):
                pass
            stream.flush()
            done.wait(0.1)
            pattern = re.compile("x")
            flags = int(cl.map_flags.READ | cl.map_flags.WRITE)
            return flags & int(cl.command_execution_status.COMPLETE)
    """
    assert _calls("svmkit.arrays.array", source) == []


def test_checker_finds_lazy_and_dynamic_upward_imports():
    source = """
        import importlib

        def f():
            from svmkit.ops import fill
            import svmkit.interop.dlpack
            return importlib.import_module("svmkit.cli.main"), fill

        class SVMArray:
            def __dlpack__(self):
                from svmkit.interop.dlpack import dlpack
                x = 1
                return dlpack(self)
    """
    found = _up("svmkit.events.record", source)
    assert [f.split(" -> ")[1] for f in found] == [
        "svmkit.ops",
        "svmkit.ops.fill",
        "svmkit.interop.dlpack",
        "svmkit.cli.main",
        "svmkit.interop.dlpack",  # in a class of this name elsewhere: not the sanctioned one
        "svmkit.interop.dlpack.dlpack",
    ]
    # In svmkit.arrays.array, a two-statement SVMArray method is still not a delegation.
    assert _up("svmkit.arrays.array", source)[-2:] == [
        "svmkit.arrays.array:11 (SVMArray.__dlpack__) -> svmkit.interop.dlpack",
        "svmkit.arrays.array:11 (SVMArray.__dlpack__) -> svmkit.interop.dlpack.dlpack",
    ]


def test_checker_sanctions_only_the_one_line_protocol_delegations():
    source = """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from svmkit.interop.cl_array import CLAllocator

        class SVMArray:
            def __reduce__(self):
                \"\"\"Pickle through the interop layer.\"\"\"
                from svmkit.interop.pickling import reduce

                return reduce(self)

            def sneaky(self):
                from svmkit.workqueue import WorkQueue

                return WorkQueue
    """
    found = _up("svmkit.arrays.array", source)
    # the delegation to interop is sanctioned; a delegation to another layer is not
    assert [f.split(" -> ")[1] for f in found] == [
        "svmkit.workqueue",
        "svmkit.workqueue.WorkQueue",
    ]
    # the same method in another module has no sanction
    assert len(_up("svmkit.resources.pool", source)) == 2 + 2
