"""The spec's argument rules for SVM commands, one small function each.

Every ``clEnqueueSVM*`` call svmkit makes is checked here first (DESIGN: validate once,
in one place): a bad call never reaches the driver, which may crash, return NULL or give
another error code.  Each function names the spec rule it enforces and raises the svmkit
error whose ``cl_error`` is the code the spec gives.  All checks are O(1) attribute and
dictionary work (``check_wait_for`` is O(len(wait_for))).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from svmkit.driver.per_context import canonical_context
from svmkit.driver.queues import default_queue
from svmkit.errors import (
    CopyOverlapError,
    InvalidContextError,
    InvalidValueError,
    UseAfterFreeError,
)
from svmkit.events.record import check_wait_status  # (the wait-list rules live together)

if TYPE_CHECKING:
    from svmkit.resources.base import Allocation

__all__ = [
    "MAP_FLAGS",
    "PATTERN_SIZES",
    "check_command",
    "check_contiguous",
    "check_fill_target",
    "check_kernel_context",
    "check_map_mode",
    "check_migrate_to",
    "check_no_overlap",
    "check_pattern",
    "check_pattern_max",
    "check_queue",
    "check_same_context",
    "check_same_nbytes",
    "check_wait_status",
    "context_of",
    "is_contiguous",
    "use_after_free",
]

PATTERN_SIZES = frozenset({1, 2, 4, 8, 16, 32, 64, 128})
"""clEnqueueSVMMemFill: ``pattern_size`` must be one of these."""

MAP_FLAGS: dict[str, int] = {
    "r": int(cl.map_flags.READ),
    "w": int(cl.map_flags.WRITE),
    "rw": int(cl.map_flags.READ | cl.map_flags.WRITE),
    "w_invalidate": int(cl.map_flags.WRITE_INVALIDATE_REGION),
}
"""``mapped`` modes and their ``cl_map_flags`` (spec: Memory Map Flags table)."""

_MIGRATE_TO = {"device": 0, "host": int(cl.mem_migration_flags.HOST)}


def check_queue(queue: Any, context: cl.Context) -> cl.CommandQueue:
    """The queue to use for a command on memory of ``context``.

    ``None`` means svmkit's default queue of the context.  Spec (every
    ``clEnqueueSVM*``): ``CL_INVALID_COMMAND_QUEUE`` for a queue that is not a valid host
    command-queue; memory from ``clSVMAlloc`` must come from the queue's context
    (``CL_INVALID_CONTEXT``).
    """
    if queue is None:
        return default_queue(context)
    if type(queue) is cl.CommandQueue and getattr(queue, "_svmkit_context", None) is context:
        return queue  # (a queue of this very context, seen before: the hot path)
    if not isinstance(queue, cl.CommandQueue):
        raise InvalidValueError(
            f"queue must be a pyopencl.CommandQueue, got {type(queue).__name__}",
            cl_error="CL_INVALID_COMMAND_QUEUE",
        )
    queue_context = context_of(queue)
    if queue_context is not context and queue_context != context:
        raise InvalidContextError(
            "the queue belongs to another context than the array it would use; SVM from "
            "clSVMAlloc must be used with queues of the context it was allocated in"
        )
    return queue


def use_after_free(what: str) -> UseAfterFreeError:
    """The error for any use of ``what`` (an array or view) after it was freed (spec,
    clSVMFree: using memory after it was freed is undefined)."""
    return UseAfterFreeError(
        f"this {what} was freed (free(), enqueue_free() or the end of a `with` block); "
        "its memory may already belong to another array"
    )


def check_same_context(alloc: Allocation, context: cl.Context, name: str) -> None:
    """Memory from ``clSVMAlloc`` must belong to the queue's context (``CL_INVALID_CONTEXT``)."""
    if alloc.context is not context and alloc.context != context:
        raise InvalidContextError(
            f"{name} belongs to another context than the queue (spec: SVM allocated with "
            "clSVMAlloc must come from the context of the command-queue)"
        )


def context_of(obj: Any) -> cl.Context:
    """``obj.context`` of a queue or kernel, cached on the object.

    Each ``.context`` read is a driver query that creates a new ``Context`` object; on a
    busy driver such queries contend with its worker threads, so the hot path asks once.
    """
    try:
        return obj._svmkit_context
    except AttributeError:
        context = canonical_context(obj.context)
        try:
            obj._svmkit_context = context
        except AttributeError:
            pass
        return context


def check_kernel_context(kernel: cl.Kernel, context: cl.Context) -> None:
    """The kernel's and the queue's contexts must match (``CL_INVALID_CONTEXT``)."""
    kernel_context = context_of(kernel)
    if kernel_context is not context and kernel_context != context:
        raise InvalidContextError("the kernel belongs to another context than the queue")


def check_command(alloc: Allocation, lo: int, hi: int, writes: bool, what: str) -> None:
    """Map-state rule for a command on bytes ``[lo, hi)`` of ``alloc`` (spec,
    clEnqueueSVMMap: a region mapped for writing may not be used by commands; one mapped
    for reading may not be written)."""
    state = alloc.map_state
    if state is not None and state.stop:
        state.check_command(lo, hi, writes, what)


def is_contiguous(view: np.ndarray[Any, Any]) -> bool:
    """Whether a view's bytes form one gap-free run (C or Fortran order)."""
    flags = view.flags
    return bool(flags.c_contiguous or flags.f_contiguous)


def check_contiguous(view: np.ndarray[Any, Any], name: str) -> None:
    """SVM commands take one pointer and a size: the bytes must form one run."""
    flags = view.flags
    if not (flags.c_contiguous or flags.f_contiguous):
        raise InvalidValueError(
            f"{name} must be contiguous (a pointer and a byte count describe the region of "
            f"an SVM command); got strides {view.strides} for shape {view.shape}"
        )


_pattern_cache: dict[tuple[Any, ...], np.ndarray[Any, Any]] = {}
_PATTERN_CACHE_MAX = 256


def check_pattern(value: Any, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """The fill pattern for ``value``: a scalar cast to ``dtype`` or a 1-D array's bytes.

    Spec (clEnqueueSVMMemFill): ``CL_INVALID_VALUE`` if ``pattern_size`` is not one of
    {1, 2, 4, 8, 16, 32, 64, 128}.  Patterns of Python ints and non-zero floats are
    cached per dtype (read-only; the driver copies the pattern at enqueue), so a repeated
    fill casts nothing.  (-0.0 and 0.0 compare equal but differ in bytes: not cached.)
    """
    kind = type(value)
    if kind is int or (kind is float and value != 0.0 and value == value):
        key = (kind, value, dtype)
        cached = _pattern_cache.get(key)
        if cached is not None:
            return cached
        pattern = _checked_pattern(value, dtype)
        if len(_pattern_cache) >= _PATTERN_CACHE_MAX:
            _pattern_cache.clear()
        pattern.flags.writeable = False
        _pattern_cache[key] = pattern
        return pattern
    return _checked_pattern(value, dtype)


def _checked_pattern(value: Any, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    if isinstance(value, np.ndarray) and value.ndim == 1:
        pattern = np.ascontiguousarray(value)
    elif (isinstance(value, np.ndarray) and value.ndim == 0) or np.isscalar(value):
        try:
            pattern = np.asarray(value, dtype=dtype).reshape(1)
        except (OverflowError, ValueError, TypeError) as exc:
            raise InvalidValueError(
                f"fill value {value!r} cannot be cast to the array's dtype {dtype}"
            ) from exc
    else:
        raise InvalidValueError(
            "fill value must be a scalar (Python number, NumPy scalar, 0-d array) or a 1-D "
            f"pattern array, got {type(value).__name__} "
            f"of shape {getattr(value, 'shape', None)}"
        )
    size = pattern.nbytes
    if size not in PATTERN_SIZES:
        raise InvalidValueError(
            f"fill pattern is {size} bytes; clEnqueueSVMMemFill needs a pattern size of 1, 2, "
            "4, 8, 16, 32, 64 or 128 bytes"
        )
    return pattern


def check_pattern_max(size: int, max_pattern: int) -> None:
    """Spec (clEnqueueSVMMemFill): the largest ``pattern_size`` is the size of the
    device's largest integer or floating-point vector type (``CL_INVALID_VALUE``)."""
    if size > max_pattern:
        raise InvalidValueError(
            f"fill pattern is {size} bytes, larger than the device's largest vector type "
            f"({max_pattern} bytes), the spec's maximum pattern_size"
        )


def check_fill_target(ptr: int, nbytes: int, pattern_size: int) -> None:
    """Spec (clEnqueueSVMMemFill): ``svm_ptr`` aligned to ``pattern_size`` and ``size`` a
    multiple of it, else ``CL_INVALID_VALUE``."""
    if ptr % pattern_size:
        raise InvalidValueError(
            f"fill destination at {ptr:#x} is not aligned to the {pattern_size}-byte pattern "
            "(clEnqueueSVMMemFill needs svm_ptr aligned to pattern_size)"
        )
    if nbytes % pattern_size:
        raise InvalidValueError(
            f"fill destination of {nbytes} bytes is not a multiple of the {pattern_size}-byte "
            "pattern (clEnqueueSVMMemFill needs size to be a multiple of pattern_size)"
        )


def check_same_nbytes(dst_nbytes: int, src_nbytes: int) -> None:
    """One ``size`` describes both sides of ``clEnqueueSVMMemcpy``: they must be equal."""
    if dst_nbytes != src_nbytes:
        raise InvalidValueError(
            f"copy needs equal sizes: dst has {dst_nbytes} bytes, src has {src_nbytes}"
        )


def check_no_overlap(dst_ptr: int, src_ptr: int, nbytes: int) -> None:
    """Spec (clEnqueueSVMMemcpy): ``CL_MEM_COPY_OVERLAP`` if ``dst_ptr``, ``src_ptr`` and
    ``size`` give an overlapping copy."""
    if dst_ptr < src_ptr + nbytes and src_ptr < dst_ptr + nbytes:
        raise CopyOverlapError(
            f"copy of {nbytes} bytes from {src_ptr:#x} to {dst_ptr:#x}: source and "
            "destination overlap (clEnqueueSVMMemcpy forbids overlapping copies)"
        )


def check_migrate_to(to: Any, content_undefined: bool) -> int:
    """``cl_mem_migration_flags`` for ``to`` (``"device"`` or ``"host"``), else
    ``InvalidValueError`` (spec: Memory Migration Flags)."""
    try:
        flags = _MIGRATE_TO[to]
    except (KeyError, TypeError):
        raise InvalidValueError(f'to must be "device" or "host", got {to!r}') from None
    if content_undefined:
        flags |= int(cl.mem_migration_flags.CONTENT_UNDEFINED)
    return flags


def check_map_mode(mode: Any) -> int:
    """``cl_map_flags`` for a ``mapped`` mode (spec, clEnqueueSVMMap: ``CL_INVALID_VALUE``
    if the values in ``map_flags`` are not valid)."""
    try:
        return MAP_FLAGS[mode]
    except (KeyError, TypeError):
        raise InvalidValueError(
            f'mode must be "r", "w", "rw" or "w_invalidate", got {mode!r}'
        ) from None
