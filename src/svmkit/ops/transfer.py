"""fill, copy, migrate: validate every spec rule, then one driver call.

Each operation checks its arguments with the rules in :mod:`svmkit.rules` before the
driver sees them, records the command's event on every array it touches (so ``free()``
and pools wait for it) and returns the ``pyopencl.Event``.  Ordering follows OpenCL: an
operation runs after earlier commands of its (in-order) queue and its ``wait_for``
events, not after other queues' work on the same arrays.

The hot path is attribute and dictionary work; the driver is reached through
:mod:`svmkit.driver.calls`, the one module that talks to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.arrays.numpy_owned import as_operand, svm_operand
from svmkit.capabilities import capabilities
from svmkit.driver import calls
from svmkit.errors import InvalidValueError, UnsupportedError
from svmkit.events.record import WaitFor, wait_list
from svmkit.events.release import release_after
from svmkit.policy import Granularity
from svmkit.resources.base import Allocation, record_event, record_events
from svmkit.rules import (
    check_contiguous,
    check_fill_target,
    check_migrate_to,
    check_no_overlap,
    check_pattern,
    check_pattern_max,
    check_queue,
    check_same_nbytes,
    check_wait_status,
    context_of,
)

__all__ = ["copy", "fill", "migrate"]


def _marker(queue: cl.CommandQueue, wait: list[cl.Event] | None) -> cl.Event:
    """The event of an operation with nothing to do (zero bytes): a marker, so ordering
    still holds; no SVM command is given a NULL pointer or size 0."""
    return calls.enqueue_marker(queue, wait)


# -- fill -------------------------------------------------------------------------------


def fill(
    queue: cl.CommandQueue | None,
    dst: SVMArray | np.ndarray[Any, Any],
    value: Any,
    *,
    wait_for: WaitFor = None,
) -> cl.Event:
    """Fill ``dst`` with ``value`` (``clEnqueueSVMMemFill``); returns the event.

    Parameters
    ----------
    value:
        A scalar (Python number, NumPy scalar or 0-d array), cast to ``dst.dtype``; or a
        1-D pattern array, whose raw bytes are repeated whatever its dtype.

    Raises
    ------
    InvalidValueError
        Pattern size not in {1, 2, 4, 8, 16, 32, 64, 128} or above the device's largest
        vector type; ``dst.ptr`` not aligned to it; ``dst.nbytes`` not a multiple of it;
        ``dst`` not contiguous (spec, clEnqueueSVMMemFill: ``CL_INVALID_VALUE``).
    InvalidContextError, MapStateError, UseAfterFreeError
        See ``docs/CONFORMANCE.md`` (every spec rule and its error).
    SVMError
        An event of ``wait_for`` failed, whatever the size
        (``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST``).

    Notes
    -----
    Fills exactly the bytes of ``dst`` (a view fills only the view): PyOpenCL's fill
    covers the whole SVM pointer object it is given, and an SVMArray's pointer object
    spans exactly its own bytes.  Does not block.
    """
    if not isinstance(dst, SVMArray):
        dst = svm_operand(dst, "fill()'s destination")
    alloc = dst.live()
    context = alloc.context
    queue = check_queue(queue, context)
    wait = wait_list(context, wait_for) if wait_for is not None else None
    view = dst.unchecked_view
    pattern = check_pattern(value, view.dtype)
    if pattern.nbytes > 64:  # every device supports 64-byte vectors (int16)
        check_pattern_max(pattern.nbytes, capabilities(context).max_alignment)
    if not dst.contiguous:
        check_contiguous(view, "fill destination")
    if wait:
        check_wait_status(wait, "fill()")
    nbytes = view.nbytes
    if not nbytes:
        return _marker(queue, wait)
    check_fill_target(alloc.ptr + dst.offset, nbytes, pattern.nbytes)
    dst.check_command(alloc, True, "fill()")
    event = calls.enqueue_fill(queue, dst, pattern, wait)
    record_event(alloc, event, queue)
    return event


# -- copy -------------------------------------------------------------------------------


def _host_side(obj: Any, name: str, writes: bool) -> tuple[Any, int, int]:
    """``(pointer object, address, nbytes)`` of a NumPy side of a copy, checked."""
    if isinstance(obj, np.ndarray):
        check_contiguous(obj, name)
        if writes and not obj.flags.writeable:
            raise InvalidValueError(f"copy destination {name} is a read-only NumPy array")
        pointer = calls.svm_pointer(obj) if obj.size else obj
        return pointer, obj.__array_interface__["data"][0], obj.nbytes
    raise InvalidValueError(
        f"copy {name} must be an SVMArray or a NumPy array, got {type(obj).__name__}"
    )


def copy(
    queue: cl.CommandQueue | None,
    dst: SVMArray | np.ndarray[Any, Any],
    src: SVMArray | np.ndarray[Any, Any],
    *,
    blocking: bool = True,
    wait_for: WaitFor = None,
) -> cl.Event:
    """Copy the bytes of ``src`` into ``dst`` (``clEnqueueSVMMemcpy``); returns the event.

    Either side may be an SVMArray or a NumPy array (host memory).  With
    ``blocking=False`` the call returns at once; a NumPy side is kept alive until the copy
    finished.

    Raises
    ------
    InvalidValueError
        A side not contiguous, sizes differ, ``dst`` a read-only NumPy array.
    CopyOverlapError
        Source and destination bytes overlap (spec: ``CL_MEM_COPY_OVERLAP``).
    InvalidContextError
        An array, the queue or a ``wait_for`` event of another context
        (spec: ``CL_INVALID_CONTEXT``).
    MapStateError, UseAfterFreeError
        See ``docs/CONFORMANCE.md`` (every spec rule and its error).
    SVMError
        An event of ``wait_for`` failed, whatever the size
        (``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST``).
    """
    if not isinstance(dst, SVMArray):
        dst = as_operand(dst)  # (an allocator-made ndarray is SVM, not plain host memory)
    if not isinstance(src, SVMArray):
        src = as_operand(src)
    context = dst.allocation.context if isinstance(dst, SVMArray) else _context_of(src, queue)
    queue = check_queue(queue, context)
    wait = wait_list(context, wait_for) if wait_for is not None else None
    # (each SVM side: the array's rules in one call, in the order of its errors)
    dst_alloc: Allocation | None = None
    src_alloc: Allocation | None = None
    if isinstance(dst, SVMArray):
        dst_alloc, dst_ptr, nbytes = dst.for_transfer(context, True, "dst", "copy() dst")
        dst_ptr_obj: Any = dst
    else:
        dst_ptr_obj, dst_ptr, nbytes = _host_side(dst, "dst", True)
    if isinstance(src, SVMArray):
        src_alloc, src_ptr, src_nbytes = src.for_transfer(context, False, "src", "copy() src")
        src_ptr_obj: Any = src
    else:
        src_ptr_obj, src_ptr, src_nbytes = _host_side(src, "src", False)
    if nbytes != src_nbytes:
        check_same_nbytes(nbytes, src_nbytes)
    check_no_overlap(dst_ptr, src_ptr, nbytes)  # (never true of zero bytes)
    if wait:
        check_wait_status(wait, "a blocking copy" if blocking else "copy()")
    if not nbytes:
        event = _marker(queue, wait)
        if blocking:
            calls.wait(event, "a zero-byte copy's marker")
        return event
    if blocking:
        event = calls.copy_and_wait(queue, dst_ptr_obj, src_ptr_obj, wait)
    else:
        event = calls.enqueue_copy(queue, dst_ptr_obj, src_ptr_obj, wait)
    if dst_alloc is not None and src_alloc is not None:  # (SVM to SVM: the common case)
        record_events((dst_alloc, src_alloc), event, queue)
        return event
    host_sides: tuple[Any, ...] = ()
    if dst_alloc is not None:
        record_event(dst_alloc, event, queue)
    else:
        host_sides += (dst_ptr_obj,)
    if src_alloc is not None:
        record_event(src_alloc, event, queue)
    else:
        host_sides += (src_ptr_obj,)
    if not blocking and host_sides:
        # Only the NumPy side: an SVM side's memory already waits for the event (its
        # free is ordered after it), and holding the array would keep a dropped array
        # from being freed until the copy finished.
        release_after([event], _KeepAlive(host_sides))
    return event


def _context_of(src: Any, queue: Any) -> cl.Context:
    """The context of a copy into host memory: that of its SVM source, else the queue's."""
    if isinstance(src, SVMArray):
        return src.allocation.context
    if isinstance(queue, cl.CommandQueue):
        return context_of(queue)
    raise InvalidValueError("copy between two NumPy arrays needs a queue")


class _KeepAlive:
    """A release that holds host buffers until the copy that reads/writes them finished."""

    __slots__ = ("objects",)

    def __init__(self, objects: tuple[Any, ...]) -> None:
        self.objects = objects

    def __call__(self) -> None:
        self.objects = ()


# -- migrate ----------------------------------------------------------------------------


def migrate(
    queue: cl.CommandQueue | None,
    arrays: SVMArray | np.ndarray[Any, Any] | Iterable[SVMArray | np.ndarray[Any, Any]],
    *,
    to: str = "device",
    content_undefined: bool = False,
    wait_for: WaitFor = None,
) -> cl.Event:
    """Migrate exactly the byte ranges of ``arrays`` (``clEnqueueSVMMigrateMem``).

    ``to="device"`` moves them to the queue's device, ``to="host"`` to the host
    (``CL_MIGRATE_MEM_OBJECT_HOST``); ``content_undefined=True`` adds
    ``CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED``.  A strided view migrates the byte span it
    touches.  Counts as a read for map-state checks.

    Raises
    ------
    InvalidValueError
        Empty list, ``to`` not "device"/"host" (spec: ``CL_INVALID_VALUE`` if
        ``num_svm_pointers`` is zero); a SYSTEM array (spec: each range must lie in a
        ``clSVMAlloc`` allocation).
    UnsupportedError
        The queue's device predates OpenCL 2.1 (no ``clEnqueueSVMMigrateMem``).
    InvalidContextError, MapStateError, UseAfterFreeError
        See ``docs/CONFORMANCE.md`` (every spec rule and its error).
    SVMError
        An event of ``wait_for`` failed, whatever the size
        (``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST``).
    """
    if isinstance(arrays, np.ndarray):
        arrays = as_operand(arrays)
    items = [arrays] if isinstance(arrays, SVMArray) else list(arrays)
    if not items:
        raise InvalidValueError(
            "migrate() needs at least one array (spec: CL_INVALID_VALUE "
            "if num_svm_pointers is zero)"
        )
    flags = check_migrate_to(to, content_undefined)
    first = items[0]
    if not isinstance(first, SVMArray):
        first = items[0] = svm_operand(first, "each entry of migrate()'s list")
    context = first.allocation.context
    queue = check_queue(queue, context)
    wait = wait_list(context, wait_for) if wait_for is not None else None
    if not _can_migrate(queue):
        raise UnsupportedError(
            f"{queue.device.name} does not support clEnqueueSVMMigrateMem (needs OpenCL 2.1)",
            cl_error="CL_INVALID_OPERATION",
        )
    pointers = []
    allocs = []
    for a in items:
        if not isinstance(a, SVMArray):
            a = svm_operand(a, "each entry of migrate()'s list")
        alloc = a.for_command(context, False, "an array to migrate", "migrate()")
        if alloc.policy.granularity is Granularity.SYSTEM:
            raise InvalidValueError(
                "migrate() of SYSTEM memory: clEnqueueSVMMigrateMem needs ranges inside "
                "clSVMAlloc allocations"
            )
        if a.contiguous:
            if not a.nbytes:
                continue  # size 0 would migrate the whole allocation
            pointers.append(a)
        else:
            lo, hi = a.byte_range()
            if lo == hi:
                continue
            pointers.append(calls.svm_pointer(alloc.u8[lo:hi]))
        allocs.append(alloc)
    if wait:
        check_wait_status(wait, "migrate()")
    if not pointers:
        return _marker(queue, wait)
    event = calls.enqueue_migrate(queue, pointers, flags, wait)
    record_events(allocs, event, queue)
    return event


def _can_migrate(queue: cl.CommandQueue) -> bool:
    """Whether the queue's device has ``clEnqueueSVMMigrateMem`` (OpenCL >= 2.1), cached
    on the queue."""
    try:
        return queue._svmkit_migrate  # type: ignore[no-any-return]
    except AttributeError:
        value = bool(capabilities(queue.device).migrate)
        try:
            queue._svmkit_migrate = value
        except AttributeError:
            pass
        return value
