"""launch: a PyOpenCL kernel with SVMArray arguments, every rule checked first.

SVMArrays pass as SVM pointers; memory reached only through pointers stored in SVM is
registered with ``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_PTRS)`` (system memory with
``CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM``); map state is checked and the event is
recorded on every array involved, so ``free()`` and pools wait for the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray, byte_extent
from svmkit.arrays.numpy_owned import allocation_of
from svmkit.driver import calls
from svmkit.errors import InvalidContextError, InvalidValueError
from svmkit.events.record import WaitFor, wait_list
from svmkit.ops.placeholder import placeholder
from svmkit.policy import Granularity
from svmkit.resources._cpool import numpy_argument
from svmkit.resources.base import Allocation, record_events
from svmkit.rules import check_kernel_context, check_queue, context_of

__all__ = ["TRACKED_KERNELS", "launch"]


def launch(
    queue: cl.CommandQueue | None,
    kernel: cl.Kernel,
    global_size: Any,
    local_size: Any,
    *args: Any,
    uses: Iterable[Any] = (),
    wait_for: WaitFor = None,
    **options: Any,
) -> cl.Event:
    """Enqueue ``kernel`` with SVMArray arguments; returns the event.

    Calling a kernel of an :class:`svmkit.Program` (``prg.NAME(queue, ...)``) is this
    very function (:class:`svmkit.Kernel` binds it as ``__call__``, so the kernel comes
    first and swaps places with the queue: no second call on the hot path); ``options``
    are PyOpenCL's other keywords (``global_offset``...), passed on.

    Parameters
    ----------
    args:
        Kernel arguments.  SVMArrays pass as SVM pointers (element 0); a zero-element
        array, which allocates nothing, passes the context's placeholder allocation
        (see :mod:`svmkit.ops.placeholder`: NVIDIA's OpenCL refuses NULL there).  An object with
        ``kernel_arg`` and ``svm_pointers`` attributes (a :class:`~svmkit.WorkQueue`)
        passes as ``kernel_arg`` and has its ``svm_pointers`` registered.  Anything else
        passes to PyOpenCL unchanged, but for a NumPy array (``ndim >= 1``): one that
        ``sk.numpy_allocator`` made (or a view of one) passes as an SVM pointer and gets
        the event recorded on its allocation; one in other host memory, which no device
        can address, is an ``InvalidValueError``.
    uses:
        SVMArrays, allocator-made NumPy arrays (or work queues) the kernel reaches only
        through pointers stored in SVM; registered with
        ``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_PTRS)``.  That list
        takes only ``clSVMAlloc`` memory; for SYSTEM arrays (arguments or ``uses``) the
        kernel gets ``CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM`` instead, the spec's way
        to say it may follow pointers into system allocations.

    Raises
    ------
    InvalidContextError
        Kernel, queue, array or event of another context.
    InvalidValueError
        A NumPy array in host memory that is not svmkit's as an argument (pass an SVMArray:
        ``sk.asarray``, or allocate it inside ``sk.numpy_allocator``).
    MapStateError
        An array argument or ``uses`` entry overlaps a mapped coarse-grain region; each
        counts as written unless its policy's access is ``READ_ONLY``.
    UseAfterFreeError
        An array was freed.
    SVMError
        An event of ``wait_for`` failed (``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST``).

    Notes
    -----
    The event is recorded on every array involved, so ``free()`` and pools wait for the
    kernel.  The SVM pointers registered stay registered on the kernel object until the
    next ``launch`` of it replaces them.
    """
    if type(queue) is not _COMMAND_QUEUE:
        if type(queue) in TRACKED_KERNELS:
            queue, kernel = kernel, queue  # an sk.Kernel's call: `k(queue, ...)` binds k first
        if type(queue) is not _COMMAND_QUEUE:
            if queue is None:
                queue = check_queue(None, context_of(kernel))
            elif not isinstance(queue, cl.CommandQueue):
                queue = check_queue(queue, context_of(kernel))  # raises
    try:
        context = queue._svmkit_context  # type: ignore[union-attr]  # (context_of's cache)
    except AttributeError:
        context = context_of(queue)
    if getattr(kernel, "_svmkit_context", None) is not context:  # (context_of's cache)
        check_kernel_context(kernel, context)
    # (one walk of the list: events of this context, none failed)
    wait = wait_list(context, wait_for, "launch()") if wait_for is not None else None
    allocs: list[Allocation] = []
    others: list[Any] = []
    pointers: list[int] = []
    system = False  # any SYSTEM array involved
    call_args: list[Any] | None = None  # a copy of args, made when one is replaced
    i = -1
    for arg in args:
        i += 1
        if type(arg) in _plain_types:
            continue  # a plain scalar: no attribute probing (slow on NumPy scalars)
        if isinstance(arg, SVMArray):
            alloc = arg.for_command(context, None, "a kernel argument", "launch()")
            allocs.append(alloc)
            if not alloc.ptr:  # a zero-byte array allocates nothing
                call_args = call_args or list(args)
                call_args[i] = placeholder(context)
            elif alloc.policy.granularity is _SYSTEM:
                system = True
        elif type(arg) is _NDARRAY and arg.ndim:  # memory of sk.numpy_allocator's
            try:  # (the address table's lookup and the kept SVM pointer, in C)
                found = numpy_argument(arg, _SVM_POINTER)
            except ValueError:  # a strided view: its pointer is made below
                found = None
            if found is not None and (found[0].context is context or found[0].context == context):
                alloc, pointer = found
            else:  # not svmkit's or another context's (both raise), or a strided view
                alloc = _numpy_argument(i, arg, context)
                pointer = _svm_pointer(arg, alloc)
            allocs.append(alloc)
            if call_args is None:
                call_args = list(args)
            call_args[i] = pointer
            if alloc.policy.granularity is _SYSTEM:
                system = True
        elif isinstance(arg, _PLAIN_BASES):
            _plain_types.add(type(arg))  # (next time one set lookup decides)
        elif isinstance(arg, np.ndarray) and arg.ndim:  # (a subclass of ndarray)
            alloc = _numpy_argument(i, arg, context)
            allocs.append(alloc)
            call_args = call_args or list(args)
            call_args[i] = _svm_pointer(arg, alloc)
            if alloc.policy.granularity is _SYSTEM:
                system = True
        elif hasattr(arg, "kernel_arg") and hasattr(arg, "svm_pointers"):
            call_args = call_args or list(args)
            call_args[i] = arg.kernel_arg
            pointers.extend(arg.svm_pointers)
            others.append(arg)
    for used in uses:
        if isinstance(used, SVMArray):
            alloc = used.for_command(context, None, "a `uses` entry", "launch()")
            allocs.append(alloc)
            if _listable(alloc):
                pointers.append(alloc.ptr + used.offset)
            elif alloc.policy.granularity is _SYSTEM:
                system = True
        elif isinstance(used, np.ndarray) and used.ndim:
            alloc = _numpy_argument(-1, used, context)
            allocs.append(alloc)
            if _listable(alloc):
                pointers.append(int(used.__array_interface__["data"][0]))
            elif alloc.policy.granularity is _SYSTEM:
                system = True
        elif hasattr(used, "svm_pointers"):
            pointers.extend(used.svm_pointers)
            others.append(used)
        else:
            raise InvalidValueError(
                f"uses= takes SVMArrays, NumPy arrays made inside sk.numpy_allocator (or work "
                f"queues), got {type(used).__name__}"
            )
    if pointers or getattr(kernel, "_svmkit_svm_ptrs", False):
        _register_svm_pointers(kernel, pointers, context)
    if system and not getattr(kernel, "_svmkit_fine_grain_system", False):
        _allow_fine_grain_system(kernel)
    event = calls.enqueue_kernel(
        queue,
        kernel,
        global_size,
        local_size,
        args if call_args is None else call_args,
        wait,
        options,
    )
    record_events(allocs, event, queue)
    for other in others:  # a work queue that records its own events
        record = getattr(other, "record", None)
        if callable(record):
            record(event)
    return event


_SYSTEM = Granularity.SYSTEM
_NDARRAY = np.ndarray
_SVM_POINTER = calls.svm_pointer
_COMMAND_QUEUE = cl.CommandQueue
TRACKED_KERNELS: set[type] = set()
"""The kernel classes whose ``__call__`` is :func:`launch` (:class:`svmkit.Kernel` and its
subclasses register themselves)."""
_PLAIN_BASES = (np.generic, int, float, bytes, type(None))
"""Arguments passed to PyOpenCL unchanged without a look at their attributes."""
_plain_types: set[type] = set()
"""The exact types seen to be :data:`_PLAIN_BASES` (a cache of that ``isinstance`` test)."""


def _numpy_argument(index: int, arg: np.ndarray[Any, Any], context: cl.Context) -> Allocation:
    """The svmkit allocation behind a NumPy array given as a kernel argument (``index``;
    -1: a ``uses`` entry): made inside ``sk.numpy_allocator``, of ``context``.

    Raises
    ------
    InvalidValueError, InvalidContextError
        See :func:`_numpy_argument_error`.
    """
    alloc = allocation_of(arg)
    if alloc is None or (alloc.context is not context and alloc.context != context):
        raise _numpy_argument_error(index, arg, alloc)
    return alloc


def _numpy_argument_error(
    index: int, arg: np.ndarray[Any, Any], alloc: Allocation | None
) -> InvalidValueError | InvalidContextError:
    """Why a NumPy array cannot be kernel argument ``index`` (-1: a ``uses`` entry).

    ``InvalidValueError`` when its memory is not svmkit's (``alloc`` None): a kernel reaches
    memory through SVM pointers, and PyOpenCL would pass the array's bytes by value
    (``CL_INVALID_ARG_SIZE``); ``InvalidContextError`` when its allocation belongs to
    another context.
    """
    what = "a `uses` entry" if index < 0 else f"kernel argument {index}"
    if alloc is None:
        return InvalidValueError(
            f"{what} is a NumPy array (shape {arg.shape}, dtype {arg.dtype}) in host memory, "
            "which the device cannot address; copy it into SVM with sk.asarray(ctx, array), "
            "or create it inside `with sk.numpy_allocator():` so that NumPy allocates it in SVM"
        )
    return InvalidContextError(
        f"{what} is a NumPy array in SVM of another context ({alloc!r}); copy it with "
        "sk.asarray(ctx, array)"
    )


def _svm_pointer(arg: np.ndarray[Any, Any], alloc: Allocation) -> cl.SVM:
    """PyOpenCL's SVM pointer to element 0 of ``arg`` (a strided view: from element 0 to
    the end of the bytes it touches, as :class:`SVMArray` does)."""
    try:
        return _SVM_POINTER(arg)  # contiguous (C or Fortran order)
    except ValueError:  # PyOpenCL: "ndarray is not contiguous"
        first = int(arg.__array_interface__["data"][0]) - alloc.ptr
        return _SVM_POINTER(alloc.u8[first : byte_extent(arg)[1] - alloc.ptr])


def _listable(alloc: Allocation) -> bool:
    """Whether ``CL_KERNEL_EXEC_INFO_SVM_PTRS`` may name this allocation.

    The list takes pointers into ``clSVMAlloc`` memory: not SYSTEM memory (announced with
    ``CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM``) and not the NULL pointer of a
    zero-byte array, which allocates nothing (Intel's CPU runtime answers
    ``CL_INVALID_VALUE`` for either).
    """
    return alloc.ptr != 0 and alloc.policy.granularity is not Granularity.SYSTEM


def _register_svm_pointers(kernel: cl.Kernel, pointers: list[int], context: cl.Context) -> None:
    """``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_PTRS)`` for ``pointers``.

    The setting persists on the kernel object.  A launch without pointers after one with
    them replaces the stale list by the context's placeholder allocation (the spec offers
    no way to clear it, and NVIDIA's driver crashes enqueueing a kernel whose list names
    freed memory), so memory freed since is never named to the driver again.
    """
    if pointers:
        listed = tuple(pointers)
    elif getattr(kernel, "_svmkit_svm_ptrs", False):
        listed = (placeholder(context).ptr,)  # nothing stale is named any more
    else:
        return
    calls.set_svm_pointers(kernel, listed)
    setattr(kernel, "_svmkit_svm_ptrs", bool(pointers))  # noqa: B010 (a pyopencl object)


def _allow_fine_grain_system(kernel: cl.Kernel) -> None:
    """``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM, CL_TRUE)``, once.

    The setting persists on the kernel object and is harmless for later launches that
    use no system memory, so it is never cleared.
    """
    calls.allow_fine_grain_system(kernel)
    setattr(kernel, "_svmkit_fine_grain_system", True)  # noqa: B010 (a pyopencl object)
