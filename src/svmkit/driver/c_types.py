"""OpenCL C scalar type names (OpenCL C 6.1.1, as ``clGetKernelArgInfo``'s
``CL_KERNEL_ARG_TYPE_NAME`` gives them: "float*", "uint") and NumPy's fixed-size types."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["c_type_of", "dtype_of", "pointee", "scalar_parameter_dtype"]

_C_TYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(dt)
    for names, dt in (
        (("char", "signed char"), np.int8),
        (("uchar", "unsigned char"), np.uint8),
        (("short",), np.int16),
        (("ushort", "unsigned short"), np.uint16),
        (("int",), np.int32),
        (("uint", "unsigned int", "unsigned"), np.uint32),
        (("long",), np.int64),
        (("ulong", "unsigned long"), np.uint64),
        (("half",), np.float16),
        (("float",), np.float32),
        (("double",), np.float64),
        (("size_t", "uintptr_t"), np.uintp),
        (("ptrdiff_t", "intptr_t"), np.intp),
    )
    for name in names
}
_QUALIFIERS = {"const", "volatile", "restrict", "__global", "global", "__constant", "constant"}


def dtype_of(type_name: str) -> np.dtype[Any] | None:
    """The NumPy dtype of a scalar OpenCL C type name, or None (vector, struct...)."""
    words = [w for w in type_name.replace("*", " ").split() if w not in _QUALIFIERS]
    return _C_TYPES.get(" ".join(words))


def pointee(type_name: str) -> np.dtype[Any] | None:
    """The element dtype of a pointer parameter ("float*"), or None if not a known one."""
    if not type_name.rstrip().endswith("*"):
        return None
    return dtype_of(type_name.rstrip()[:-1])


def c_type_of(dtype: np.dtype[Any]) -> str:
    """The OpenCL C name of a NumPy dtype (for messages)."""
    for name, dt in _C_TYPES.items():
        if dt == dtype:
            return name
    return str(dtype)


def scalar_parameter_dtype(type_name: str) -> np.dtype[Any] | None:
    """The dtype of a by-value scalar parameter; None for a pointer or another type."""
    return None if "*" in type_name else dtype_of(type_name)
