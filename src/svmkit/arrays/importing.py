"""What ``sk.asarray`` accepts besides NumPy arrays: DLPack producers, buffer-protocol
objects and ``pyopencl.array`` arrays.

A ``pyopencl.array.Array`` that ``SVMArray.to_cl_array`` made is svmkit memory: it comes
back as an SVMArray over the same allocation (zero-copy).  Everything else is read on the
host (through DLPack with ``device="cpu"``, so a producer on another device copies to the
host if it can, else :class:`BufferError`) and then copied into SVM by the caller.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.resources.exports import HostOwner

__all__ = ["adopt", "host_data", "is_cl_array", "svm_of_cl_array"]


def is_cl_array(obj: Any) -> bool:
    """Whether ``obj`` is a ``pyopencl.array.Array`` (without importing that module)."""
    return any(
        t.__module__ == "pyopencl.array" and t.__name__ == "Array" for t in type(obj).__mro__
    )


def svm_of_cl_array(ctx: cl.Context, obj: Any) -> SVMArray | None:
    """An SVMArray over the memory of a ``to_cl_array`` bridge of ``ctx`` (None for any
    other PyOpenCL array, or one whose SVMArray was freed)."""
    data = obj.base_data
    mem = data.mem if isinstance(data, cl.SVM) else None
    if not isinstance(mem, np.ndarray):
        return None
    owner: Any = mem
    while isinstance(owner, np.ndarray) and getattr(owner, "record", None) is None:
        owner = owner.base
    if not isinstance(owner, HostOwner):
        return None
    alloc = owner.record.alloc
    if alloc is None or alloc.freed or alloc.context != ctx:
        return None
    offset = int(mem.__array_interface__["data"][0]) - alloc.ptr + int(obj.offset)
    view: np.ndarray[Any, Any] = np.ndarray(
        obj.shape, obj.dtype, buffer=alloc.u8, offset=offset, strides=obj.strides
    )
    return SVMArray(alloc, view)


def host_data(obj: Any, dtype: Any) -> np.ndarray[Any, Any]:
    """``obj`` as a NumPy array on the host (no copy where NumPy can avoid one)."""
    if is_cl_array(obj):
        host: np.ndarray[Any, Any] = obj.get()
        return host if dtype is None else host.astype(dtype, copy=False)
    if hasattr(obj, "__dlpack__") and not isinstance(obj, np.ndarray):
        try:
            host = np.from_dlpack(obj, device="cpu")
        except TypeError:  # a producer that predates DLPack 1.0's keywords
            host = np.from_dlpack(obj)
        return host if dtype is None else host.astype(dtype, copy=False)
    return np.asarray(obj, dtype=dtype)


def adopt(nd: np.ndarray[Any, Any]) -> SVMArray | None:
    """A zero-copy SVMArray over ``nd`` when an svmkit NumPy allocator made its memory,
    else None (placeholder: no svmkit allocator exists yet, so always None)."""
    return None
