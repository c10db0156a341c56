"""NumPy on SVM memory: operands, results, ufuncs and the operators' fast path.

FINE and SYSTEM memory is host memory (spec: the host may access fine-grain buffer and
system SVM at any time, ordered after the commands that use it), so NumPy computes on it
in place: every SVMArray operand first waits for the commands svmkit recorded on it, then
NumPy runs on the array's own layout (:attr:`SVMArray.unchecked_view`: no export, the
memory is only touched while the call runs).  COARSE memory is host memory only while
mapped: an operand follows the host-access rule (:meth:`SVMArray.check_host_access`,
else :class:`~svmkit.MapStateError`).

An array result is an SVMArray of the first SVMArray operand's context and policy,
allocated by that operand's resource (its *template*), with no copy on the way:

* ufuncs whose result shape and dtype are known beforehand write straight into a new
  SVMArray (``out=``);
* everything else runs inside ``allocating_from(resource)`` (FINE, SYSTEM), so NumPy
  allocates its result from the template's resource and :func:`~svmkit.arrays.importing.
  adopt` wraps it without copying; a result NumPy made elsewhere is copied into the
  resource (and a COARSE result is filled while mapped ``"w_invalidate"``).

A result that is a view of an operand's memory (a transpose, ``out=``, a split) is an
SVMArray view of that operand's allocation; 0-d results are NumPy scalars.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from svmkit.arrays.array import byte_extent
from svmkit.arrays.creation import _new
from svmkit.arrays.numpy_owned import adopt, allocation_of
from svmkit.driver import fork
from svmkit.errors import InvalidValueError, MapStateError
from svmkit.events import wait_pending
from svmkit.mapping import mapped
from svmkit.resources.exports import export_base
from svmkit.resources.numpy_allocator import allocating_from

if TYPE_CHECKING:
    from svmkit.arrays.array import SVMArray

__all__ = [
    "NoHostInterface",
    "Operands",
    "allocating",
    "array_interface",
    "array_of",
    "array_ufunc",
    "astype",
    "binary",
    "copy",
    "fill",
    "inplace",
    "new_result",
    "operand",
    "tolist",
]

_SCALARS = (int, float, complex, bool)
_BOOL = np.dtype(bool)
_dtypes: dict[tuple[Any, ...], tuple[np.dtype[Any], ...] | None] = {}
_DTYPES_LIMIT = 4096
_svm: type[SVMArray] | None = None


def _svm_array_type() -> type[SVMArray]:
    global _svm
    if _svm is None:
        from svmkit.arrays.array import SVMArray

        _svm = SVMArray
    return _svm


def operand(a: SVMArray, reads: bool = True, writes: bool = False) -> np.ndarray[Any, Any]:
    """The array's own layout for NumPy to compute on, after its recorded commands.

    ``reads``/``writes``: how NumPy touches it (an input is read; ``out=`` written).
    Raises :class:`~svmkit.UseAfterFreeError` after ``free()`` and, for COARSE memory
    not mapped for that access, :class:`~svmkit.MapStateError` (the host-access rule).
    """
    alloc = a.allocation
    if alloc.freed or fork.forked or alloc.policy.needs_map:
        a.check_host_access(reads, writes)  # (live, of this process, mapped for it)
    record = alloc._events
    if record:
        wait_pending(record.pending())
    return a.unchecked_view


def fill(out: SVMArray, compute: Callable[[np.ndarray[Any, Any]], Any]) -> SVMArray:
    """Run ``compute(view)`` to write a new result array: on its memory (FINE, SYSTEM), or
    on the view of a ``"w_invalidate"`` map of it (COARSE: the host writes coarse-grain
    SVM only while it is mapped)."""
    if not out.policy.needs_map:
        compute(out.unchecked_view)
        return out
    with mapped(None, out, "w_invalidate") as view:
        compute(view)
    return out


def allocating(template: SVMArray) -> contextlib.AbstractContextManager[Any]:
    """Where NumPy's own allocations go while it computes for ``template``: its resource
    (FINE, SYSTEM), or NumPy's memory for COARSE templates (the host may not write
    coarse-grain memory outside a map; the result is copied in while mapped)."""
    alloc = template.allocation
    if alloc.policy.needs_map:
        return contextlib.nullcontext()
    return allocating_from(alloc.resource)


def new_result(template: SVMArray, value: np.ndarray[Any, Any]) -> SVMArray:
    """``value`` (a new NumPy array) as an SVMArray of ``template``'s resource: adopted
    without a copy when ``template``'s resource allocated it (inside :func:`allocating`),
    else copied into a new array of that resource."""
    if value.dtype.hasobject:
        raise InvalidValueError(
            f"a NumPy result of dtype {value.dtype} holds Python objects, which cannot live "
            "in SVM (devices cannot read them): convert with .get() first"
        )
    owner = allocation_of(value)  # the allocation NumPy's handler made for it, if any
    if owner is not None and template.allocation.resource.owns(owner):
        adopted = adopt(value)
        if adopted is not None:
            return adopted
    out = _new(template.allocation.resource, value.shape, value.dtype, 0)
    return fill(out, lambda view: np.copyto(view, value))


class Operands:
    """The SVMArrays of one NumPy call, each swapped for its memory (:func:`operand`),
    and how the call's result comes back (:meth:`wrap`)."""

    __slots__ = ("arrays", "views")

    def __init__(self) -> None:
        self.arrays: list[SVMArray] = []
        self.views: list[np.ndarray[Any, Any]] = []

    def take(self, value: Any, reads: bool = True, writes: bool = False) -> Any:
        """``value`` for NumPy: an SVMArray becomes its memory (checked and waited for),
        lists and tuples are searched; anything else stays."""
        t = type(value)
        if t is list or t is tuple:
            return t(self.take(v, reads, writes) for v in value)
        if isinstance(value, _svm_array_type()):
            return self.array(value, reads, writes)
        return value

    def array(self, a: SVMArray, reads: bool = True, writes: bool = False) -> Any:
        """:meth:`take` of an SVMArray."""
        view = operand(a, reads, writes)
        self.arrays.append(a)
        self.views.append(view)
        return view

    def take_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for NumPy: ``out=`` is written, the others are read."""
        for key, value in kwargs.items():
            writes = key == "out"
            kwargs[key] = self.take(value, not writes, writes)
        return kwargs

    def owner(self, value: np.ndarray[Any, Any]) -> SVMArray | None:
        """The operand whose allocation holds ``value``'s bytes (a view NumPy made of it),
        or None."""
        if value.base is None:
            return None
        lo, hi = byte_extent(value)
        for a in self.arrays:
            alloc = a.allocation
            if alloc.nbytes and alloc.ptr <= lo and hi <= alloc.ptr + alloc.nbytes:
                return a
        return None

    def wrap(self, template: SVMArray, result: Any) -> Any:
        """NumPy's ``result`` for the caller: an operand's memory as that SVMArray (or a
        view of it), a new array as an SVMArray of ``template``'s resource, a 0-d array as
        its NumPy scalar; tuples and lists of them likewise; anything else as it is."""
        if isinstance(result, np.ndarray):
            for a, view in zip(self.arrays, self.views):
                if result is view:
                    return a
            owner = self.owner(result)
            if owner is not None:
                return owner.view_of(result)
            if result.ndim == 0:
                return result[()]
            return new_result(template, result)
        if isinstance(result, (tuple, list)):
            items = [self.wrap(template, r) for r in result]
            if hasattr(result, "_fields"):  # a named tuple (np.unique_all, linalg results)
                return type(result)(*items)
            return type(result)(items)
        return result


def array_of(a: SVMArray, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
    """``a.__array__(dtype, copy)`` with NumPy 2's ``copy=`` rules.

    ``copy=True``: a new NumPy array (after recorded work; a read).  ``None``: the memory
    itself (an export, see :mod:`svmkit.resources.exports`; ``a.host``) unless ``dtype``
    needs a cast.  ``False``: the memory itself, or ``ValueError`` when a cast is needed.
    COARSE: the host-access rule of ``a.host`` (``MapStateError`` outside ``mapped``).
    """
    want = None if dtype is None else np.dtype(dtype)
    if copy:
        return np.array(operand(a), dtype=want, copy=True)
    view = a.host
    if want is None or want == view.dtype:
        return view
    if copy is False:
        raise ValueError(
            f"Unable to avoid copy while creating an array as requested: the SVMArray holds "
            f"{view.dtype}, {want} was asked for with copy=False"
        )
    return view.astype(want)


class NoHostInterface(MapStateError, AttributeError):
    """A COARSE array's ``__array_interface__`` while no map lets the host read it: a
    :class:`~svmkit.MapStateError` that NumPy reads as a missing attribute, so that
    ``np.asarray(a)`` and ``np.array(a)`` fall back to ``__array__`` (which tells a view,
    allowed under every map, from a copy, a read)."""


def array_interface(a: SVMArray) -> dict[str, Any]:
    """``a.__array_interface__``: an export (NumPy's array made from it keeps the memory
    alive past ``free()``, as ``a.host`` does), after recorded work.  COARSE: only while
    maps for reading cover it (else :class:`NoHostInterface`), read-only unless maps for
    writing cover it too."""
    alloc = a.allocation
    if alloc.policy.needs_map:
        try:
            writable = a.check_host_access(reads=True)
        except MapStateError as exc:
            raise NoHostInterface(str(exc)) from None
    else:
        writable = a.check_host_access()
    record = alloc._events
    if record:
        wait_pending(record.pending())
    view = a.unchecked_view
    if not alloc.nbytes:  # a zero-byte array has no memory to keep
        return dict(view.view().__array_interface__)
    data: np.ndarray[Any, Any] = export_base(alloc)
    if not writable:
        data = data.view()
        data.flags.writeable = False
    return {
        "version": 3,
        "shape": view.shape,
        "typestr": view.dtype.str,
        "descr": view.dtype.descr,
        "strides": None if view.flags.c_contiguous else view.strides,
        "data": data,  # a buffer: NumPy keeps it as the array's base
        "offset": a.offset,
    }


# -- ufuncs and operators ---------------------------------------------------------------------


def _resolve(ufunc: np.ufunc, key: tuple[Any, ...]) -> tuple[np.dtype[Any], ...] | None:
    """The output dtypes of ``ufunc`` for operand dtypes (Python scalar types are weak,
    NEP 50), memoised; None when NumPy must decide (it raises the right error)."""
    try:
        return _dtypes[key]
    except KeyError:
        pass
    try:
        dtypes = ufunc.resolve_dtypes(key[1:] + (None,) * ufunc.nout)
        result: tuple[np.dtype[Any], ...] | None = tuple(dtypes[ufunc.nin :])
    except (TypeError, ValueError, np.exceptions.DTypePromotionError):
        result = None
    if len(_dtypes) >= _DTYPES_LIMIT:
        _dtypes.clear()
    _dtypes[key] = result
    return result


def _dtype_key(x: Any) -> Any:
    t = type(x)
    if t is bool:
        return _BOOL
    if t in _SCALARS:
        return t  # a weak Python scalar (NEP 50)
    return x.dtype


def _dispatch(ufunc: np.ufunc, a: SVMArray, other: Any, reflected: bool) -> Any:
    """``a <op> other`` through NumPy's override dispatch (``NotImplemented`` for an
    operand that opts out of ufuncs, as ``NDArrayOperatorsMixin`` does)."""
    if getattr(type(other), "__array_ufunc__", False) is None:
        return NotImplemented
    return ufunc(other, a) if reflected else ufunc(a, other)


def binary(ufunc: np.ufunc, a: SVMArray, other: Any, reflected: bool = False) -> Any:
    """``a <op> other`` (``other <op> a`` when ``reflected``) for an elementwise ufunc of
    one output, without NumPy's override dispatch: the fast path of the operators."""
    alloc = a.allocation
    coarse = alloc.policy.needs_map
    if coarse or alloc.freed:
        a.check_host_access(reads=True)  # raises the right error
    record = alloc._events
    if record:
        wait_pending(record.pending())
    x = a.unchecked_view
    t = type(other)
    if t is type(a):
        y = operand(other)
    elif t in _SCALARS or isinstance(other, (np.ndarray, np.generic)):
        y = other
    else:  # lists, other array types: NumPy's dispatch decides
        return _dispatch(ufunc, a, other, reflected)
    if reflected:
        dtypes = _resolve(ufunc, (ufunc, _dtype_key(y), x.dtype))
    else:
        dtypes = _resolve(ufunc, (ufunc, x.dtype, _dtype_key(y)))
    if dtypes is None:
        return _dispatch(ufunc, a, other, reflected)
    if t in _SCALARS or y.shape == x.shape:
        shape = x.shape
    else:
        shape = np.broadcast_shapes(x.shape, y.shape)
    out = _new(alloc.resource, shape, dtypes[0], 0)
    if coarse:
        if reflected:
            return fill(out, lambda view: ufunc(y, x, out=view))
        return fill(out, lambda view: ufunc(x, y, out=view))
    if reflected:
        ufunc(y, x, out=out.unchecked_view)
    else:
        ufunc(x, y, out=out.unchecked_view)
    return out


def inplace(ufunc: np.ufunc, a: SVMArray, other: Any) -> SVMArray:
    """``a <op>= other``: NumPy reads ``a`` and writes the result into its memory."""
    ops = Operands()
    x = ops.take(a, True, True)
    ufunc(x, ops.take(other), out=x)
    return a


def array_ufunc(a: SVMArray, ufunc: np.ufunc, method: str, inputs: Any, kwargs: Any) -> Any:
    """``SVMArray.__array_ufunc__``: compute with NumPy on the operands' memory."""
    svm = type(a)
    ops = Operands()
    args: list[Any] = []
    for v in inputs:
        if isinstance(v, svm):
            args.append(ops.array(v))
        elif hasattr(v, "__array_ufunc__") and not isinstance(v, (np.ndarray, np.generic)):
            return NotImplemented  # another array type: let it (or NumPy) decide
        else:
            args.append(ops.take(v))
    if method == "at" and ops.views and args[0] is ops.views[0]:
        operand(ops.arrays[0], True, True)  # ufunc.at(a, ...) writes its first operand
    out = kwargs.get("out")
    if out is not None:
        kwargs["out"] = ops.take(tuple(out), False, True)
    template = ops.arrays[0] if ops.arrays else a
    call = getattr(ufunc, method)
    if out is not None:
        call(*args, **kwargs)
        return out[0] if len(out) == 1 else tuple(out)
    if method == "__call__" and ufunc.nout == 1 and ufunc.signature is None and not kwargs:
        dtypes = _resolve(ufunc, (ufunc, *(_dtype_key(x) for x in args)))
        if dtypes is not None:  # shape and dtype known: NumPy writes the new array
            shapes = [x.shape for x in args if isinstance(x, (np.ndarray, np.generic))]
            same = all(s == shapes[0] for s in shapes)
            shape = shapes[0] if same else np.broadcast_shapes(*shapes)
            result = _new(template.allocation.resource, shape, dtypes[0], 0)
            return fill(result, lambda view: call(*args, out=view))
    with allocating(template):
        value = call(*args, **kwargs)
    return ops.wrap(template, value)


# -- methods whose meaning is svmkit's ------------------------------------------------------


def astype(
    a: SVMArray,
    dtype: Any,
    order: str = "K",
    casting: Any = "unsafe",
    subok: bool = True,
    copy: bool = True,
) -> SVMArray:
    """``a.astype(dtype)``: a new SVMArray of ``a``'s resource, C-ordered (``a`` itself
    when ``copy=False`` and the dtype matches)."""
    x = operand(a)
    want = np.dtype(dtype)
    if not copy and want == x.dtype:
        return a
    if want.hasobject:
        raise InvalidValueError(f"astype({want}): Python objects cannot live in SVM")
    out = _new(a.allocation.resource, x.shape, want, 0)
    return fill(out, lambda view: np.copyto(view, x, casting=casting))


def _host_readable(a: SVMArray) -> bool:
    """Whether the host may read ``a``'s memory now (FINE, SYSTEM, or COARSE mapped for
    reading: the host-access rule); COARSE otherwise is read by a device copy."""
    alloc = a.live()
    if not alloc.policy.needs_map:
        return True
    try:
        a.check_host_access(reads=True)
    except MapStateError:
        return False
    return True


def copy(a: SVMArray) -> SVMArray:
    """``a.copy()``: a new SVMArray of ``a``'s resource with the same contents (every
    granularity: COARSE arrays outside a map for reading are copied by the device, after
    recorded work)."""
    out = _new(a.allocation.resource, a.shape, a.dtype, 0)
    if _host_readable(a):
        return fill(out, lambda view: np.copyto(view, operand(a)))
    out.set(a.get())
    return out


def tolist(a: SVMArray) -> Any:
    """``a.tolist()`` after recorded work (every granularity: COARSE memory outside a map
    for reading is read with ``a.get()``)."""
    if _host_readable(a):
        return operand(a).tolist()
    return a.get().tolist()
