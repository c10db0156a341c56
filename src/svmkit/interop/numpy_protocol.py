"""NumPy protocol for SVM arrays: ``__array__``, ufuncs, operators, reductions, methods.

FINE and SYSTEM memory is host memory (spec: the host may access fine-grain buffer and
system SVM at any time, ordered after the commands that use it), so NumPy computes on it
in place: every SVMArray operand first waits for the commands svmkit recorded on it, then
NumPy runs on the array's own view (no export: the operand's memory is only read while
the call runs).  An array result is a new SVMArray of the first SVMArray operand's context
and policy drawn from the current resource (a pool by default), allocated before NumPy
runs and passed as ``out=``, so large results are written once.  COARSE memory is not host
memory outside a map: such operands raise :class:`~svmkit.MapStateError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from svmkit.arrays.creation import _new
from svmkit.driver import fork
from svmkit.errors import MapStateError
from svmkit.events import wait_pending
from svmkit.mapping import mapped
from svmkit.resources.current import current_resource

if TYPE_CHECKING:
    from svmkit.arrays.array import SVMArray

__all__ = [
    "array_of",
    "array_ufunc",
    "binary",
    "inplace",
    "method",
    "to_svm",
]

_SCALARS = (int, float, complex, bool)
_BOOL = np.dtype(bool)
_dtypes: dict[tuple[Any, ...], tuple[np.dtype[Any], ...] | None] = {}
_DTYPES_LIMIT = 4096


def _svm_array_type() -> type[SVMArray]:
    from svmkit.arrays.array import SVMArray

    return SVMArray


def operand(a: SVMArray, reads: bool = True, writes: bool = False) -> np.ndarray[Any, Any]:
    """The array's own view for NumPy to compute on, after its recorded commands.

    ``reads``/``writes``: how NumPy touches it (an input is read; ``out=`` written).
    Raises :class:`~svmkit.UseAfterFreeError` after ``free()`` and, for COARSE memory
    not mapped for that access, :class:`~svmkit.MapStateError` (the host-access rule,
    ``SVMArray._check_host_access``).
    """
    alloc = a._alloc
    if alloc.freed or fork.forked or alloc.policy.needs_map:
        a._check_host_access(reads, writes)  # (live, of this process, mapped for it)
    record = alloc._events
    if record:
        wait_pending(record.pending())
    return a._view


def _fill(out: SVMArray, compute: Callable[[np.ndarray[Any, Any]], Any]) -> SVMArray:
    """Run ``compute(view)`` to write a new result array: on its memory (FINE, SYSTEM), or
    on the view of a ``"w_invalidate"`` map of it (COARSE: the host writes coarse-grain
    SVM only while it is mapped)."""
    if not out._alloc.policy.needs_map:
        compute(out._view)
        return out
    with mapped(None, out, "w_invalidate") as view:
        compute(view)
    return out


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


def _new_like(first: SVMArray, shape: tuple[int, ...], dtype: np.dtype[Any]) -> SVMArray:
    alloc = first._alloc
    return _new(current_resource(alloc.context, alloc.policy), shape, dtype, 0)


def to_svm(first: SVMArray, value: Any) -> Any:
    """A NumPy result as an SVMArray like ``first`` (arrays; scalars stay NumPy scalars)."""
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return value[()]
        out = _new_like(first, value.shape, value.dtype)
        return _fill(out, lambda view: np.copyto(view, value))
    if isinstance(value, tuple):
        return tuple(to_svm(first, v) for v in value)
    return value


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


def binary(ufunc: np.ufunc, a: SVMArray, other: Any, reflected: bool = False) -> Any:
    """``a <op> other`` (``other <op> a`` when ``reflected``) for the common operators,
    without NumPy's override dispatch: the fast path of the operators."""
    svm = type(a)
    alloc = a._alloc
    coarse = alloc.policy.needs_map
    if coarse or alloc.freed:
        a._check_host_access(reads=True)  # raises the right error
    record = alloc._events
    if record:
        wait_pending(record.pending())
    x = a._view
    t = type(other)
    if t is svm:
        y = operand(other)
    elif t in _SCALARS or isinstance(other, (np.ndarray, np.generic)):
        y = other
    else:  # lists, other array types: NumPy's dispatch decides
        return ufunc(other, a) if reflected else ufunc(a, other)
    if reflected:
        dtypes = _resolve(ufunc, (ufunc, _dtype_key(y), x.dtype))
    else:
        dtypes = _resolve(ufunc, (ufunc, x.dtype, _dtype_key(y)))
    if dtypes is None:
        return ufunc(other, a) if reflected else ufunc(a, other)
    if t in _SCALARS or y.shape == x.shape:
        shape = x.shape
    else:
        shape = np.broadcast_shapes(x.shape, y.shape)
    out = _new(current_resource(alloc.context, alloc.policy), shape, dtypes[0], 0)
    if coarse:
        if reflected:
            return _fill(out, lambda view: ufunc(y, x, out=view))
        return _fill(out, lambda view: ufunc(x, y, out=view))
    if reflected:
        ufunc(y, x, out=out._view)
    else:
        ufunc(x, y, out=out._view)
    return out


def inplace(ufunc: np.ufunc, a: SVMArray, other: Any) -> SVMArray:
    """``a <op>= other``: NumPy reads ``a`` and writes the result into its memory."""
    x = operand(a, writes=True)
    y = operand(other) if isinstance(other, _svm_array_type()) else other
    ufunc(x, y, out=x)
    return a


def _unwrap(
    values: Any, svm: type[SVMArray], writes: bool = False
) -> tuple[list[Any], SVMArray | None, bool]:
    """Operands for NumPy (read, or written when ``writes``: ``out=``), the first SVMArray
    among them, and whether all are known."""
    out: list[Any] = []
    first: SVMArray | None = None
    known = True
    for v in values:
        if isinstance(v, svm):
            first = first or v
            out.append(operand(v, not writes, writes))
        else:
            if hasattr(v, "__array_ufunc__") and not isinstance(v, (np.ndarray, np.generic)):
                known = False  # another array type: let it (or NumPy) decide
            out.append(v)
    return out, first, known


def array_ufunc(a: SVMArray, ufunc: np.ufunc, method: str, inputs: Any, kwargs: Any) -> Any:
    """``SVMArray.__array_ufunc__``: compute with NumPy on the operands' memory."""
    svm = type(a)
    args, first, known = _unwrap(inputs, svm)
    if not known:
        return NotImplemented
    out = kwargs.get("out")
    if out is not None:
        outs, out_first, known = _unwrap(out, svm, writes=True)
        if not known:
            return NotImplemented
        first = first or out_first
        kwargs["out"] = tuple(outs)
    if first is None:
        first = a
    call = getattr(ufunc, method)
    if out is not None:
        call(*args, **kwargs)
        return out[0] if len(out) == 1 else tuple(out)
    if method == "__call__" and ufunc.nout == 1 and not kwargs:
        key = (ufunc, *(_dtype_key(x) for x in args))
        dtypes = _resolve(ufunc, key)
        if dtypes is not None:
            shapes = [x.shape for x in args if isinstance(x, (np.ndarray, np.generic))]
            same = all(s == shapes[0] for s in shapes)
            shape = shapes[0] if same else np.broadcast_shapes(*shapes)
            result = _new_like(first, shape, dtypes[0])
            if result._alloc.policy.needs_map:
                return _fill(result, lambda view: call(*args, out=view))
            call(*args, out=result._view)
            return result
    return to_svm(first, call(*args, **kwargs))


def method(a: SVMArray, name: str, *args: Any, **kwargs: Any) -> Any:
    """``a.sum()``, ``a.mean()``, ...: NumPy's method on the array's memory; an array
    result becomes an SVMArray (``out=`` an SVMArray is written in place)."""
    x = operand(a)
    out = kwargs.get("out")
    if isinstance(out, _svm_array_type()):
        kwargs["out"] = operand(out, False, True)
        getattr(x, name)(*args, **kwargs)
        return out
    return to_svm(a, getattr(x, name)(*args, **kwargs))


def astype(a: SVMArray, dtype: Any, copy: bool = True) -> SVMArray:
    """``a.astype(dtype)``: a new SVMArray (``a`` itself when ``copy=False`` and the dtype
    matches)."""
    x = operand(a)
    want = np.dtype(dtype)
    if not copy and want == x.dtype:
        return a
    out = _new_like(a, x.shape, want)
    return _fill(out, lambda view: np.copyto(view, x, casting="unsafe"))


def _host_readable(a: SVMArray) -> bool:
    """Whether the host may read ``a``'s memory now (FINE, SYSTEM, or COARSE mapped for
    reading: the host-access rule); COARSE otherwise is read by a device copy."""
    alloc = a._live()
    if not alloc.policy.needs_map:
        return True
    try:
        a._check_host_access(reads=True)
    except MapStateError:
        return False
    return True


def copy(a: SVMArray) -> SVMArray:
    """``a.copy()``: a new SVMArray with the same contents (every granularity: COARSE
    arrays outside a map for reading are copied by the device, after recorded work)."""
    out = _new_like(a, a.shape, a.dtype)
    if _host_readable(a):
        return _fill(out, lambda view: np.copyto(view, operand(a)))
    out.set(a.get())
    return out


def tolist(a: SVMArray) -> Any:
    """``a.tolist()`` after recorded work (every granularity: COARSE memory outside a map
    for reading is read with ``a.get()``)."""
    if _host_readable(a):
        return operand(a).tolist()
    return a.get().tolist()
