"""Kernel parameter types: OpenCL C type names to NumPy, and scalars converted to them.

``clGetKernelArgInfo(CL_KERNEL_ARG_TYPE_NAME)`` (OpenCL 1.2, available when a program is
built with ``-cl-kernel-arg-info``) names each parameter's type ("float*", "uint").  The
spec's scalar data types (OpenCL C 6.1.1) map to NumPy's fixed-size types; a scalar
argument is converted to its parameter's type, refusing values the type cannot hold
(``CL_INVALID_ARG_VALUE``) instead of truncating them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from svmkit.driver.c_types import c_type_of, dtype_of, pointee
from svmkit.errors import InvalidValueError

__all__ = [
    "ARRAY_KINDS",
    "c_type_of",
    "check_scalar",
    "convert_scalar",
    "dtype_of",
    "fallback_dtype",
    "pointee",
]

ARRAY_KINDS = "iuf"
"""NumPy kinds map_kernel moves: signed and unsigned integers, floating point."""


def check_scalar(value: Any, index: int) -> None:
    """Refuse a scalar that is not a real number (client side, before any graph runs)."""
    ok = (
        value.dtype.kind in "biuf"
        if isinstance(value, np.generic)
        else isinstance(value, (bool, int, float))
    )
    if not ok:
        raise InvalidValueError(
            f"scalar argument {index} must be a real number (int, float, bool or a NumPy "
            f"scalar), got {type(value).__name__} {value!r}",
            cl_error="CL_INVALID_ARG_VALUE",
        )


def convert_scalar(value: Any, dtype: np.dtype[Any], where: str) -> np.generic:
    """``value`` as a scalar of ``dtype``; InvalidValueError if it cannot hold it exactly
    (an integer out of range, a fraction for an integer type, a float beyond the range).
    """
    if dtype.kind in "iu":
        integral = isinstance(value, (bool, int, np.integer, np.bool_)) or (
            isinstance(value, (float, np.floating)) and float(value).is_integer()
        )
        info = np.iinfo(dtype)
        if not integral or not info.min <= int(value) <= info.max:
            raise InvalidValueError(
                f"{where} has type {c_type_of(dtype)}, which cannot hold {value!r} "
                f"(integers from {info.min} to {info.max})",
                cl_error="CL_INVALID_ARG_VALUE",
            )
        return dtype.type(int(value))  # type: ignore[no-any-return]
    with np.errstate(over="ignore"):
        converted = dtype.type(value)
    if np.isinf(converted) and not np.isinf(float(value)):
        raise InvalidValueError(
            f"{where} has type {c_type_of(dtype)}, which cannot hold {value!r} (out of range)",
            cl_error="CL_INVALID_ARG_VALUE",
        )
    return converted  # type: ignore[no-any-return]


def fallback_dtype(value: Any, out_dtype: np.dtype[Any]) -> np.dtype[Any]:
    """A scalar's type where the driver gives no argument info: NumPy scalars keep
    theirs; Python integers are ``int`` (``long`` if too large); Python floats take the
    output's floating type, else ``float``."""
    if isinstance(value, np.generic):
        return value.dtype
    if isinstance(value, (bool, int)):
        info = np.iinfo(np.int32)
        return np.dtype(np.int32 if info.min <= value <= info.max else np.int64)
    return out_dtype if out_dtype.kind == "f" else np.dtype(np.float32)
