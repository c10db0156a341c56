"""NumPy's whole ``ndarray`` surface on :class:`~svmkit.SVMArray`, from one table.

:func:`install` (run when svmkit is imported) puts on the class every public name of
``numpy.ndarray`` that svmkit gives no meaning of its own, the operators, indexing,
``__array_ufunc__``, ``__array_function__``, ``__array_interface__``, iteration and
``repr``/``str``.  Each name is one of a few kinds, and each kind is one function here:

* **reads** (the default: ``sum``, ``argmax``, ``sort``'s cousins, ``dot``, ``item``...)
  and **writes** (``fill``, ``sort``, ``partition``, ``put``, ``setfield``; in-place
  operators, item assignment): NumPy's method runs on the memory after the work recorded
  on every SVMArray operand, under the host-access rule for that access (COARSE: mapped,
  else :class:`~svmkit.MapStateError`), inside ``numpy_allocator`` of the array's
  resource; results come back as :meth:`~svmkit.interop.numpy_protocol.Operands.wrap`
  says (SVMArrays of the array's resource or views of its memory, NumPy scalars);
* **views** (``T``, ``mT``, ``real``, ``imag``, ``transpose``, ``swapaxes``, ``squeeze``,
  ``diagonal``, ``reshape``, ``view``, ``to_device``): SVMArray views of the allocation,
  made without touching memory (so COARSE arrays need no map);
* **exports** (``data``, ``ctypes``, ``flat``, ``__array_interface__``): taken from the
  host view (``a.host``), so they keep the memory alive past ``free()``;
* **metadata** (``flags``, ``device``): read from a fresh NumPy view of the layout;
* **refused**: ``resize`` (an allocation's size is fixed) and ``setflags`` (the policy
  and map state decide what the host may do): :class:`~svmkit.InvalidValueError`.

Names svmkit already gives a meaning (``base``, ``copy``, ``get``, ``set``, ``free``,
``__array__``, ``__dlpack__``, ``ptr``, ``shape``...: whatever the class defines) are left
alone; ``copy``, ``astype`` and ``tolist`` keep svmkit's versions (every granularity).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from svmkit.arrays.array import SVMArray
from svmkit.errors import InvalidValueError, SVMError
from svmkit.interop import numpy_protocol as protocol
from svmkit.interop.numpy_protocol import Operands, allocating, operand

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["BINARY_OPERATORS", "install", "kind_of"]

VIEWS = frozenset(
    {"T", "mT", "real", "imag", "transpose", "swapaxes", "squeeze", "diagonal", "to_device"}
)
EXPORTS = frozenset({"data", "ctypes", "flat"})
METADATA = frozenset({"flags", "device"})
WRITES = {  # name: (reads, writes) of the array itself
    "fill": (False, True),
    "put": (False, True),
    "setfield": (False, True),
    "sort": (True, True),
    "partition": (True, True),
    "itemset": (False, True),  # (NumPy < 2)
}
REFUSED = {
    "resize": (
        "in-place resize of an SVMArray: its allocation has a fixed size; "
        "use np.resize(a, shape) for a new array"
    ),
    "setflags": (
        "setflags() of an SVMArray: its policy and the map state decide what the host may "
        "do with the memory"
    ),
}
METADATA_FUNCTIONS = frozenset({np.shape, np.ndim, np.size})
"""NumPy functions that read only an array's layout (no host access, no wait)."""
WRITES_FIRST = frozenset(
    {np.copyto, np.place, np.put, np.putmask, np.fill_diagonal, np.put_along_axis}
)
"""NumPy functions that write their first argument in place."""

BINARY_OPERATORS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "matmul": np.matmul,
    "truediv": np.true_divide,
    "floordiv": np.floor_divide,
    "mod": np.remainder,
    "divmod": np.divmod,
    "pow": np.power,
    "lshift": np.left_shift,
    "rshift": np.right_shift,
    "and": np.bitwise_and,
    "xor": np.bitwise_xor,
    "or": np.bitwise_or,
}
COMPARISONS = {
    "lt": np.less,
    "le": np.less_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
UNARY_OPERATORS = {"neg": np.negative, "pos": np.positive, "abs": np.absolute, "invert": np.invert}
CONVERSIONS = ("__bool__", "__int__", "__float__", "__complex__", "__index__", "__contains__")
"""Dunders that read the values like a method (NumPy's rules: one element, or an error)."""


def kind_of(name: str) -> str:
    """The kind of ``numpy.ndarray``'s public ``name`` on an SVMArray (see the module doc):
    ``"views"``, ``"exports"``, ``"metadata"``, ``"writes"``, ``"refused"``, ``"own"``
    (svmkit's own version) or ``"reads"``."""
    if name in _OWN:
        return "own"
    if name in VIEWS:
        return "views"
    if name in EXPORTS:
        return "exports"
    if name in METADATA:
        return "metadata"
    if name in WRITES:
        return "writes"
    if name in REFUSED:
        return "refused"
    return "reads"


# -- one function per kind ---------------------------------------------------------------------


def call_method(
    a: SVMArray, name: str, reads: bool, writes: bool, args: tuple[Any, ...], kwargs: Any
) -> Any:
    """``a.<name>(*args, **kwargs)``: NumPy's method on the memory (see the module doc)."""
    ops = Operands()
    view = ops.take(a, reads, writes)
    if args:
        args = ops.take(args)
    if kwargs:
        ops.take_kwargs(kwargs)
    with allocating(a):
        result = getattr(view, name)(*args, **kwargs)
    return ops.wrap(a, result)


def _as_view(a: SVMArray, result: Any) -> Any:
    """A view NumPy made of ``a``'s layout, as an SVMArray view (a new array, as
    ``imag`` of real values, as an SVMArray of ``a``'s resource)."""
    if isinstance(result, np.ndarray):
        lo, hi = (a.allocation.ptr + x for x in a.byte_range())
        start = result.__array_interface__["data"][0]
        if result.base is not None and lo <= start <= hi:
            return a.view_of(result)
        return protocol.new_result(a, result)
    return result


def call_view(a: SVMArray, name: str, args: tuple[Any, ...] | None, kwargs: Any) -> Any:
    """``a.<name>`` (an attribute when ``args`` is None) of the views kind: no memory is
    touched, so no map is needed and nothing is waited for."""
    a.live()
    value = getattr(a.unchecked_view, name)
    return _as_view(a, value if args is None else value(*args, **kwargs))


def reshape(a: SVMArray, *shape: Any, order: Any = "C") -> SVMArray:
    """A view with another shape (NumPy's rules; no copy, so the layout must allow it,
    else :class:`~svmkit.InvalidValueError`)."""
    a.live()
    new_shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
    try:
        view = np.reshape(a.unchecked_view, new_shape, order=order, copy=False)
    except ValueError as exc:
        raise InvalidValueError(
            f"cannot reshape {a.shape} to {new_shape} without copying: {exc}"
        ) from exc
    return a.view_of(view)


def view(a: SVMArray, dtype: Any = None, type: Any = None) -> Any:
    """The same bytes seen as another dtype (NumPy's ``ndarray.view`` rules): an SVMArray
    view; with a NumPy array ``type``, that type's view of ``a.host`` (an export)."""
    if type is not None or (isinstance(dtype, builtins.type) and issubclass(dtype, np.ndarray)):
        host = a.host
        return host.view(dtype, type) if type is not None else host.view(dtype)
    a.live()
    layout = a.unchecked_view
    return a.view_of(layout.view() if dtype is None else layout.view(dtype))


def export(a: SVMArray, name: str) -> Any:
    """``a.<name>`` of the exports kind, from the host view (it keeps the memory alive)."""
    return getattr(a.host, name)


def metadata(a: SVMArray, name: str) -> Any:
    """``a.<name>`` of the metadata kind, from a fresh NumPy view of the layout (writes
    to what it returns, as ``a.flags.writeable = False``, change nothing shared)."""
    a.live()
    return getattr(a.unchecked_view.view(), name)


def refused(a: SVMArray, name: str) -> Any:
    """``a.<name>()`` of the refused kind."""
    raise InvalidValueError(REFUSED[name])


def byteswap(a: SVMArray, inplace: bool = False) -> Any:
    """``numpy.ndarray.byteswap``: in place writes the memory, else a new SVMArray."""
    return call_method(a, "byteswap", True, bool(inplace), (), {"inplace": inplace})


def array_function(
    a: SVMArray, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``SVMArray.__array_function__``: ``func`` (``np.concatenate``, ``np.where``...) with
    NumPy on the operands' memory; results as the methods' are."""
    for t in types:
        if not issubclass(t, (SVMArray, np.ndarray)):
            return NotImplemented
    if func in METADATA_FUNCTIONS:
        return func(*[x.unchecked_view if isinstance(x, SVMArray) else x for x in args], **kwargs)
    ops = Operands()
    kwargs.pop("like", None)
    if func in WRITES_FIRST and args:
        args = (ops.take(args[0], False, True), *ops.take(args[1:]))
    else:
        args = ops.take(args)
    ops.take_kwargs(kwargs)
    template = ops.arrays[0] if ops.arrays else a
    with allocating(template):
        result = func(*args, **kwargs)
    return ops.wrap(template, result)


def _is_basic_key(key: Any) -> bool:
    """Whether ``key`` is NumPy basic indexing (a view, never a copy)."""
    items = key if isinstance(key, tuple) else (key,)
    return all(
        (isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)))
        or isinstance(k, slice)
        or k is None
        or k is Ellipsis
        for k in items
    )


def getitem(a: SVMArray, key: Any) -> Any:
    """``a[key]``: basic indexing is an SVMArray view (or, for one element, its NumPy
    scalar, read after recorded work); any other key (masks, index arrays, SVMArrays
    among them) gives a new SVMArray of ``a``'s resource, as NumPy copies."""
    if _is_basic_key(key):
        a.live()
        items = key if isinstance(key, tuple) else (key,)
        view = a.unchecked_view[tuple(items) + (Ellipsis,)]
        if view.ndim == 0 and not any(k is Ellipsis or k is None for k in items):
            operand(a)  # (the host-access rule, after recorded work)
            return view[()]
        return a.view_of(view)
    ops = Operands()
    layout = ops.take(a)
    key = ops.take(key)
    with allocating(a):
        result = layout[key]
    return ops.wrap(a, result)


def setitem(a: SVMArray, key: Any, value: Any) -> None:
    """``a[key] = value``: NumPy writes into the memory (after recorded work on ``a`` and
    on SVMArrays in ``key`` and ``value``; COARSE: mapped for writing)."""
    ops = Operands()
    layout = ops.take(a, False, True)
    layout[ops.take(key)] = ops.take(value)


def iterate(a: SVMArray) -> Iterator[Any]:
    """``iter(a)``: ``a[0], a[1], ...`` (views, or NumPy scalars for 1-d arrays)."""
    if not a.ndim:
        raise TypeError("iteration over a 0-d SVMArray")
    return (a[i] for i in range(len(a)))


def _shown(a: SVMArray) -> np.ndarray[Any, Any] | str:
    """The values ``repr``/``str`` show, after recorded work, or, where the host may not
    read them (freed, COARSE not mapped for reading), the line shown instead; never
    raises and never reads memory the host may not touch."""
    if a.freed:
        return f"<{a.describe()} {a.policy} freed>"
    try:
        return operand(a)
    except SVMError as exc:
        where = f"at {a.allocation.ptr + a.offset:#x}"
        return f"<{a.describe()} {a.policy} {where}: values not shown ({type(exc).__name__})>"


def array_repr(a: SVMArray) -> str:
    """NumPy's ``repr`` of the values as ``SVMArray(...)``, plus the policy."""
    values = _shown(a)
    if isinstance(values, str):
        return values
    body = np.array_repr(values)[len("array(") : -1]
    return "SVMArray(" + body.replace("\n", "\n   ") + f", policy={a.policy})"


def array_str(a: SVMArray) -> str:
    """NumPy's ``str`` of the values, then the policy."""
    values = _shown(a)
    if isinstance(values, str):
        return values
    return f"{np.array_str(values)} {a.policy}"


_OWN: dict[str, Callable[..., Any]] = {
    "astype": protocol.astype,
    "copy": protocol.copy,
    "tolist": protocol.tolist,
    "reshape": reshape,
    "view": view,
    "byteswap": byteswap,
}
"""Public names of ``ndarray`` with a function of their own here."""


# -- installing ------------------------------------------------------------------------------


def _named(function: Callable[..., Any], name: str, doc: str) -> Callable[..., Any]:
    function.__name__ = name
    function.__qualname__ = f"SVMArray.{name}"
    function.__doc__ = doc
    return function


def _member(name: str) -> Any:
    """What ``SVMArray.<name>`` is for ``numpy.ndarray``'s public ``name``."""
    kind = kind_of(name)
    doc = f"``numpy.ndarray.{name}`` on the SVM memory ({kind}; see svmkit.interop.numpy_surface)."
    is_method = callable(getattr(np.ndarray, name))
    if kind == "own":
        return _named(_OWN[name], name, _OWN[name].__doc__ or doc)
    if kind == "refused":
        return _named(lambda self, *args, **kwargs: refused(self, name), name, doc)
    if kind == "views":
        if is_method:
            return _named(lambda self, *a, **k: call_view(self, name, a, k), name, doc)
        return property(lambda self: call_view(self, name, None, None), doc=doc)
    if kind == "exports":
        return property(lambda self: export(self, name), doc=doc)
    if kind == "metadata":
        return property(lambda self: metadata(self, name), doc=doc)
    reads, writes = WRITES.get(name, (True, False))
    if is_method:
        return _named(lambda self, *a, **k: call_method(self, name, reads, writes, a, k), name, doc)
    return property(lambda self: call_method_attribute(self, name), doc=doc)


def call_method_attribute(a: SVMArray, name: str) -> Any:
    """An attribute of the reads kind (one a later NumPy adds): read on the memory."""
    ops = Operands()
    with allocating(a):
        result = getattr(ops.take(a), name)
    return ops.wrap(a, result)


def _operators() -> dict[str, Callable[..., Any]]:
    """The arithmetic, reflected, in-place, comparison, bitwise and unary operators.

    Elementwise ufuncs of one output take :func:`~svmkit.interop.numpy_protocol.binary`
    (no override dispatch); ``@`` and ``divmod`` go through NumPy's dispatch to
    ``__array_ufunc__``, which knows their shapes."""
    ops: dict[str, Callable[..., Any]] = {}

    def forward(ufunc: np.ufunc) -> Callable[..., Any]:
        if ufunc.signature is None and ufunc.nout == 1:
            return lambda self, other: protocol.binary(ufunc, self, other)
        return lambda self, other: protocol._dispatch(ufunc, self, other, False)

    def reflected(ufunc: np.ufunc) -> Callable[..., Any]:
        if ufunc.signature is None and ufunc.nout == 1:
            return lambda self, other: protocol.binary(ufunc, self, other, True)
        return lambda self, other: protocol._dispatch(ufunc, self, other, True)

    def in_place(ufunc: np.ufunc) -> Callable[..., Any]:
        return lambda self, other: protocol.inplace(ufunc, self, other)

    def unary(ufunc: np.ufunc) -> Callable[..., Any]:
        return lambda self: ufunc(self)

    for name, ufunc in BINARY_OPERATORS.items():
        ops[f"__{name}__"] = forward(ufunc)
        ops[f"__r{name}__"] = reflected(ufunc)
        if ufunc.nout == 1:
            ops[f"__i{name}__"] = in_place(ufunc)
    for name, ufunc in COMPARISONS.items():
        ops[f"__{name}__"] = forward(ufunc)
    for name, ufunc in UNARY_OPERATORS.items():
        ops[f"__{name}__"] = unary(ufunc)
    return {name: _named(f, name, f"``numpy.ndarray.{name}``.") for name, f in ops.items()}


def _conversion(name: str) -> Callable[..., Any]:
    return _named(
        lambda self, *a: call_method(self, name, True, False, a, {}),
        name,
        f"``numpy.ndarray.{name}`` of the values.",
    )


def _dunders() -> dict[str, Any]:
    """The protocol methods: operators, conversions, indexing, iteration, repr, NumPy's
    override protocols, ``copy.copy``/``copy.deepcopy``."""
    members: dict[str, Any] = dict(_operators())
    members.update({name: _conversion(name) for name in CONVERSIONS})
    members.update(
        {
            "__array_ufunc__": lambda self, ufunc, method, *inputs, **kwargs: protocol.array_ufunc(
                self, ufunc, method, inputs, kwargs
            ),
            "__array_function__": lambda self, func, types, args, kwargs: array_function(
                self, func, types, args, kwargs
            ),
            "__array_interface__": property(protocol.array_interface),
            "__getitem__": getitem,
            "__setitem__": setitem,
            "__iter__": iterate,
            "__repr__": array_repr,
            "__str__": array_str,
            "__copy__": protocol.copy,
            "__deepcopy__": lambda self, memo: protocol.copy(self),
        }
    )
    return members


def public_names() -> list[str]:
    """``numpy.ndarray``'s public names (``dir``, without a leading underscore)."""
    return [name for name in dir(np.ndarray) if not name.startswith("_")]


def install(cls: type[Any]) -> None:
    """Give ``cls`` NumPy's ``ndarray`` surface: every public name it does not define
    itself, and the protocol methods (see the module doc).  PyOpenCL's ``SVM`` is a
    nanobind type, which allows no second base class, so the members are set on the
    class.  Elementwise ``==`` makes the class unhashable, as in NumPy."""
    own = vars(cls)
    for name in public_names():
        if name not in own:
            setattr(cls, name, _member(name))
    for name, member in _dunders().items():
        setattr(cls, name, member)
    cls.__hash__ = None  # type: ignore[assignment]


install(SVMArray)
