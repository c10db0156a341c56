"""Every call svmkit makes into an OpenCL implementation, in one place.

This module is the chokepoint between svmkit and the driver (DESIGN: one chokepoint to the
driver).  Each function makes exactly one driver call, through

* PyOpenCL's extension entry points (``pyopencl._cl._enqueue_svm_*``, ``_Program``), which
  its public wrappers call after dispatching on argument types svmkit has already
  checked: the pin on PyOpenCL's private API touches this file only;
* the ctypes bindings of :mod:`svmkit.driver.entrypoints` for what PyOpenCL lacks
  (``clSVMAlloc``/``clSVMFree`` under svmkit's control, ``clSetKernelExecInfo``);

translates driver failures into svmkit's typed errors (``from`` the driver's error), and
applies the driver workarounds that concern a single call:

* **blocking commands are enqueued non-blocking, then waited for.**  PyOpenCL holds the
  GIL inside a blocking SVM copy or map, so a ``wait_for`` event that another Python
  thread must complete (a ``cl.UserEvent``, a work queue's producer) would deadlock;
* **exact fills.**  PyOpenCL's public ``enqueue_svm_memfill`` ignores ``byte_count``; the
  entry point used here fills exactly the bytes of the SVM pointer object it is given.

``benchmarks/ops.py`` replaces ``_cl`` below by a stub to measure svmkit's own cost per
operation, so every enqueue reads the module attribute at call time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
from pyopencl import _cl as _cl  # (re-exported: benchmarks and tests stub it)

from svmkit.driver import entrypoints
from svmkit.errors import cl_error_name, error_for_name, translate

__all__ = [
    "copy_and_wait",
    "enqueue_copy",
    "enqueue_fill",
    "enqueue_kernel",
    "enqueue_map",
    "enqueue_marker",
    "enqueue_migrate",
    "enqueue_unmap",
    "map_and_wait",
    "new_program",
    "set_svm_pointers",
    "allow_fine_grain_system",
    "svm_alloc",
    "svm_free",
    "svm_pointer",
]

Wait = list[cl.Event] | None

svm_pointer = cl.SVM
"""PyOpenCL's SVM pointer object over a contiguous host-addressable NumPy view."""


# -- allocation ----------------------------------------------------------------------------


def svm_alloc(context: cl.Context, flags: int, size: int, alignment: int) -> int:
    """``clSVMAlloc``; the address, or 0 when the driver returned NULL (it gives no code)."""
    return entrypoints.svm_alloc(context, flags, size, alignment)


def svm_free(context: cl.Context, ptr: int) -> None:
    """``clSVMFree``: returns at once; the caller orders it after every use of ``ptr``.

    ``clEnqueueSVMFree`` is never used: PoCL 3.0 keeps the caller's pointer array and
    double-frees.
    """
    entrypoints.svm_free(context, ptr)


# -- commands --------------------------------------------------------------------------------


def enqueue_marker(queue: cl.CommandQueue, wait: Wait = None) -> cl.Event:
    """``clEnqueueMarkerWithWaitList``: an event after ``wait`` (or all earlier commands)."""
    try:
        return cl.enqueue_marker(queue, wait_for=wait or None)
    except cl.Error as exc:
        raise translate(exc, what="clEnqueueMarkerWithWaitList") from exc


def enqueue_fill(queue: cl.CommandQueue, dst: Any, pattern: Any, wait: Wait) -> cl.Event:
    """``clEnqueueSVMMemFill`` over exactly the bytes of the SVM pointer object ``dst``."""
    try:
        return _cl._enqueue_svm_memfill(queue, dst, pattern, None, wait)
    except cl.Error as exc:
        raise translate(exc, what="clEnqueueSVMMemFill") from exc


def enqueue_copy(queue: cl.CommandQueue, dst: Any, src: Any, wait: Wait) -> cl.Event:
    """``clEnqueueSVMMemcpy`` (non-blocking) between SVM pointer objects or host buffers."""
    try:
        return _cl._enqueue_svm_memcpy(queue, 0, dst, src, wait, None)
    except cl.Error as exc:
        raise translate(exc, what="clEnqueueSVMMemcpy", nbytes=_nbytes(src)) from exc


def copy_and_wait(queue: cl.CommandQueue, dst: Any, src: Any, wait: Wait) -> cl.Event:
    """A blocking ``clEnqueueSVMMemcpy``, made as a non-blocking copy plus a wait (GIL);
    returns the completed event.  NumPy sides are wrapped as SVM pointer objects (the
    driver reads host memory through the same entry point)."""
    if isinstance(dst, np.ndarray):
        dst = cl.SVM(dst)
    if isinstance(src, np.ndarray):
        src = cl.SVM(src)
    event = enqueue_copy(queue, dst, src, wait or None)
    try:
        event.wait()
    except cl.Error as exc:
        raise translate(exc, what="waiting for clEnqueueSVMMemcpy") from exc
    return event


def enqueue_migrate(
    queue: cl.CommandQueue, pointers: list[Any], flags: int, wait: Wait
) -> cl.Event:
    """``clEnqueueSVMMigrateMem`` of exactly the given SVM pointer objects' bytes."""
    try:
        return _cl._enqueue_svm_migrate_mem(queue, pointers, flags, wait)
    except cl.Error as exc:
        raise translate(exc, what="clEnqueueSVMMigrateMem") from exc


def enqueue_map(queue: cl.CommandQueue, flags: int, svm: Any, wait: Wait) -> cl.Event:
    """``clEnqueueSVMMap`` (non-blocking) of the bytes of the SVM pointer object ``svm``."""
    try:
        return _cl._enqueue_svm_map(queue, 0, flags, svm, wait or None, None)
    except cl.Error as exc:
        raise translate(exc, what="clEnqueueSVMMap") from exc


def map_and_wait(queue: cl.CommandQueue, flags: int, svm: Any, wait: Wait) -> cl.Event:
    """A blocking ``clEnqueueSVMMap``, made as a non-blocking map plus a wait (GIL);
    returns the completed event."""
    event = enqueue_map(queue, flags, svm, wait)
    try:
        event.wait()
    except cl.Error as exc:
        raise translate(exc, what="waiting for clEnqueueSVMMap") from exc
    return event


def enqueue_unmap(queue: cl.CommandQueue, svm: Any) -> cl.Event:
    """``clEnqueueSVMUnmap`` of a region mapped with :func:`enqueue_map`."""
    try:
        return _cl._enqueue_svm_unmap(queue, svm, None)
    except cl.Error as exc:
        raise translate(exc, what="clEnqueueSVMUnmap") from exc


def enqueue_kernel(
    queue: cl.CommandQueue,
    kernel: cl.Kernel,
    global_size: Any,
    local_size: Any,
    args: tuple[Any, ...] | list[Any],
    wait: Wait,
) -> cl.Event:
    """``clSetKernelArg`` for each argument, then ``clEnqueueNDRangeKernel``."""
    try:
        return kernel(queue, global_size, local_size, *args, wait_for=wait)
    except cl.Error as exc:
        raise translate(exc, what=f"enqueueing kernel {kernel.function_name}") from exc


# -- kernel execution info -----------------------------------------------------------------


def set_svm_pointers(kernel: cl.Kernel, pointers: tuple[int, ...]) -> None:
    """``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_PTRS, pointers)``."""
    _check_exec_info(entrypoints.set_kernel_exec_info_svm_ptrs(kernel, pointers), "SVM_PTRS")


def allow_fine_grain_system(kernel: cl.Kernel) -> None:
    """``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM, CL_TRUE)``."""
    code = entrypoints.set_kernel_exec_info_fine_grain_system(kernel, True)
    _check_exec_info(code, "SVM_FINE_GRAIN_SYSTEM")


def _check_exec_info(code: int, name: str) -> None:
    """Raise the typed error for a failed ``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_<name>)``."""
    if code:
        raise error_for_name(
            cl_error_name(code), f"clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_{name}) failed"
        )


# -- programs ----------------------------------------------------------------------------------


def new_program(context: cl.Context, source: str, *, cached: bool = True) -> Any:
    """A program object for ``source`` (``clCreateProgramWithSource``); build it with
    ``.build(options, devices)``.  ``cached=False`` bypasses PyOpenCL's binary cache (the
    extension's own ``_Program``), for probes whose build log must be the compiler's."""
    try:
        return cl.Program(context, source) if cached else _cl._Program(context, source)
    except cl.Error as exc:
        raise translate(exc, what="clCreateProgramWithSource") from exc


def _nbytes(obj: Any) -> int:
    return int(getattr(obj, "nbytes", 0) or 0)
