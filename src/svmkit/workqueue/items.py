"""Item types of a work queue: which NumPy dtypes a ring carries, and their OpenCL C type.

A work queue carries real numbers of up to 8 bytes (``WQ_ITEM`` is the matching OpenCL C
scalar, ``long`` for int64) or records: structured dtypes of up to
:data:`~svmkit.workqueue.layout.MAX_ITEM_BYTES` bytes whose fields are such numbers (or
fixed-size arrays of them), laid out as a C compiler lays out the same struct, that is
equal to the dtype's ``align=True`` form (NumPy's rule for C-compatible structs).  A
struct cannot travel through a ``-D`` define, so :func:`source_for` gives the C prelude
(a ``typedef struct`` and the ``WQ_ITEM`` define) a program puts before
``#include "svmkit_workqueue.h"``.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from svmkit.errors import InvalidValueError
from svmkit.workqueue.layout import MAX_ITEM_BYTES

__all__ = ["RECORD_TYPE", "check_dtype", "is_record", "opencl_type", "source_for"]

#: The C name :func:`source_for` gives a record item type.
RECORD_TYPE = "svmkit_wq_record"

_OPENCL_TYPES = {
    "int8": "char",
    "uint8": "uchar",
    "int16": "short",
    "uint16": "ushort",
    "int32": "int",
    "uint32": "uint",
    "int64": "long",
    "uint64": "ulong",
    "float16": "half",
    "float32": "float",
    "float64": "double",
    "bool": "uchar",
}

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_C_WORDS = """
auto break case char const continue default do double else enum extern float for goto if
inline int long register restrict return short signed sizeof static struct switch typedef
union unsigned void volatile while bool half uchar ushort uint ulong size_t global local
constant private kernel __global __local __constant __private __kernel read_only write_only
read_write image1d_t image2d_t image3d_t sampler_t event_t true false
"""
_RESERVED = frozenset(_C_WORDS.split())


def is_record(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is a structured (record) item type."""
    return dtype.names is not None


def _scalar_name(dt: np.dtype[Any], what: str) -> str:
    if dt.name not in _OPENCL_TYPES or not dt.isnative:
        raise InvalidValueError(
            f"{what} must be a native-order real number of at most 8 bytes (complex types "
            f"are not items), got {dt}"
        )
    return _OPENCL_TYPES[dt.name]


def _check_record(dt: np.dtype[Any]) -> np.dtype[Any]:
    if dt.itemsize > MAX_ITEM_BYTES or dt.itemsize == 0:
        raise InvalidValueError(
            f"a record dtype must have 1 to {MAX_ITEM_BYTES} bytes, got {dt.itemsize} ({dt})"
        )
    assert dt.names is not None and dt.fields is not None
    for name in dt.names:
        field = dt.fields[name][0]
        base = field.base
        if base.names is not None:
            raise InvalidValueError(f"record field {name!r} is itself a record; flatten {dt}")
        _scalar_name(base, f"record field {name!r}")
        if not _IDENTIFIER.match(name) or name in _RESERVED:
            raise InvalidValueError(
                f"record field name {name!r} is not a C identifier a struct member may have"
            )
    aligned = np.dtype([(name, dt.fields[name][0]) for name in dt.names], align=True)
    assert aligned.fields is not None
    if dt != aligned:
        raise InvalidValueError(
            f"a record dtype must equal its align=True form (the layout a C compiler gives "
            f"the struct): {dt} has {dt.itemsize} bytes at offsets "
            f"{[dt.fields[n][1] for n in dt.names]}, the aligned form {aligned.itemsize} at "
            f"{[aligned.fields[n][1] for n in dt.names]}; build it with np.dtype(..., "
            "align=True)"
        )
    return dt


def check_dtype(dtype: Any) -> np.dtype[Any]:
    """``dtype`` as a NumPy dtype a work queue carries, else :class:`InvalidValueError`
    (API.md: a real number of at most 8 bytes, or a record of at most 64 bytes equal to
    its ``align=True`` form)."""
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except TypeError as exc:
        raise InvalidValueError(
            f"dtype must be a NumPy numeric or record type, got {dtype!r}"
        ) from exc
    if is_record(dt):
        return _check_record(dt)
    _scalar_name(dt, "dtype")
    return dt


def opencl_type(dtype: Any) -> str:
    """The OpenCL C type that holds items of ``dtype`` (``WQ_ITEM``): int64 -> ``long``, a
    record -> :data:`RECORD_TYPE` (declared by :func:`source_for`)."""
    dt = check_dtype(dtype)
    return RECORD_TYPE if is_record(dt) else _OPENCL_TYPES[dt.name]


def source_for(dtype: Any) -> str:
    """The OpenCL C prelude for items of ``dtype``, to put before
    ``#include "svmkit_workqueue.h"``: ``#define WQ_ITEM <type>`` and, for a record, the
    ``typedef struct`` it names, with a compile-time check that its size is the dtype's."""
    dt = check_dtype(dtype)
    if not is_record(dt):
        return f"#define WQ_ITEM {_OPENCL_TYPES[dt.name]}\n"
    assert dt.names is not None and dt.fields is not None
    members = []
    for name in dt.names:
        field = dt.fields[name][0]
        dims = "".join(f"[{n}]" for n in field.shape)
        members.append(f"    {_OPENCL_TYPES[field.base.name]} {name}{dims};\n")
    fp16 = any(dt.fields[n][0].base.name == "float16" for n in dt.names)
    return (
        f"/* svmkit work-queue item: NumPy dtype {dt} ({dt.itemsize} bytes) */\n"
        + ("#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n" if fp16 else "")
        + "typedef struct {\n"
        + "".join(members)
        + f"}} {RECORD_TYPE};\n"
        f"typedef char {RECORD_TYPE}_size_check"
        f"[(sizeof({RECORD_TYPE}) == {dt.itemsize}) ? 1 : -1];\n"
        f"#define WQ_ITEM {RECORD_TYPE}\n"
    )
