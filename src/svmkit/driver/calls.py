"""Every call svmkit makes into an OpenCL implementation, in one place.

This module is the chokepoint between svmkit and the driver (DESIGN: one chokepoint to the
driver).  Each function makes exactly one driver call, through

* PyOpenCL's extension entry points (``pyopencl._cl._enqueue_svm_*``, ``_Program``), which
  its public wrappers call after dispatching on argument types svmkit has already
  checked: the pin on PyOpenCL's private API touches this file only;
* PyOpenCL's objects where no dispatch is left to skip: event waits and status queries,
  user events, ``clFinish``/``clFlush``, the creation of contexts, queues and kernels, and
  the kernel queries svmkit needs (callers above this layer never touch those directly);
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

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl
from pyopencl import _cl as _cl  # (re-exported: benchmarks and tests stub it)

from svmkit.driver import entrypoints
from svmkit.driver.c_types import scalar_parameter_dtype
from svmkit.errors import (
    BuildError,
    InvalidValueError,
    SVMError,
    UnsupportedError,
    cl_error_code,
    cl_error_name,
    error_for_name,
    translate,
)

__all__ = [
    "copy_and_wait",
    "raise_for_failed",
    "event_complete",
    "event_status",
    "finish",
    "flush",
    "kernel_arg_type_name",
    "kernel_names",
    "new_kernel",
    "new_queue",
    "new_user_event",
    "platform_devices",
    "platforms",
    "chosen_devices",
    "set_event_status",
    "wait",
    "wait_enqueued",
    "wait_for_events",
    "enqueue_copy",
    "enqueue_fill",
    "enqueue_kernel",
    "enqueue_map",
    "enqueue_marker",
    "enqueue_migrate",
    "enqueue_unmap",
    "map_and_wait",
    "new_context",
    "new_program",
    "set_svm_pointers",
    "allow_fine_grain_system",
    "build_logs",
    "build_program",
    "svm_alloc",
    "svm_free",
    "svm_pointer",
]

Wait = list[cl.Event] | None


svm_pointer = cl.SVM
"""PyOpenCL's SVM pointer object over a contiguous host-addressable NumPy view."""

_COMPLETE = int(cl.command_execution_status.COMPLETE)


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


def copy_and_wait(queue: cl.CommandQueue, dst: Any, src: Any, after: Wait) -> cl.Event:
    """A blocking ``clEnqueueSVMMemcpy``, made as a non-blocking copy plus a wait (GIL);
    returns the completed event.  NumPy sides are wrapped as SVM pointer objects (the
    driver reads host memory through the same entry point)."""
    if isinstance(dst, np.ndarray):
        dst = cl.SVM(dst)
    if isinstance(src, np.ndarray):
        src = cl.SVM(src)
    event = enqueue_copy(queue, dst, src, after or None)
    wait_enqueued(event, "clEnqueueSVMMemcpy")
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


def map_and_wait(queue: cl.CommandQueue, flags: int, svm: Any, after: Wait) -> cl.Event:
    """A blocking ``clEnqueueSVMMap``, made as a non-blocking map plus a wait (GIL);
    returns the completed event."""
    event = enqueue_map(queue, flags, svm, after)
    wait_enqueued(event, "clEnqueueSVMMap")
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
    options: dict[str, Any] | None = None,
) -> cl.Event:
    """``clSetKernelArg`` for each argument, then ``clEnqueueNDRangeKernel``.

    NumPy scalars are set from their bytes (PyOpenCL's ``Kernel._set_arg_buf``): PyOpenCL's
    generic ``set_arg``, which its ``Kernel.__call__`` uses for a kernel without scalar
    argument dtypes, spends about 9 µs on each NumPy scalar, on every driver, where the
    driver's ``clSetKernelArg`` takes 0.1.  Every other argument goes through ``set_arg``.
    A NumPy scalar goes from its bytes only where those are the bytes PyOpenCL's call
    passes: to an :class:`svmkit.Kernel` without ``set_scalar_arg_dtypes``, or to a
    parameter whose type (``clGetKernelArgInfo``) is the scalar's own.  Whatever that fast
    setting cannot take (a scalar of another type, a Python number for a kernel whose
    ``set_scalar_arg_dtypes`` PyOpenCL converts it with, a scalar of another size than the
    kernel's parameter, an argument count that differs from the kernel's, a raw kernel
    whose driver kept no argument info) goes to PyOpenCL's own call, with its conversions
    and its errors.  ``options`` are PyOpenCL's
    other keywords (``global_offset``...), for PyOpenCL's call too.  An
    :class:`svmkit.Kernel` overrides the call with :func:`svmkit.launch`."""
    try:
        if not options and _set_args_from_bytes(kernel, args):
            return _cl.enqueue_nd_range_kernel(
                queue, kernel, global_size, local_size, wait_for=wait
            )
        if options:
            return _cl.Kernel.__call__(
                kernel, queue, global_size, local_size, *args, wait_for=wait, **options
            )
        return _cl.Kernel.__call__(kernel, queue, global_size, local_size, *args, wait_for=wait)
    except cl.Error as exc:
        raise translate(exc, what=f"enqueueing kernel {kernel.function_name}") from exc


_NP_GENERIC = np.generic


def _set_args_from_bytes(kernel: cl.Kernel, args: tuple[Any, ...] | list[Any]) -> bool:
    """Set ``args`` on ``kernel``, NumPy scalars from their bytes; False (nothing promised
    about what was set) where PyOpenCL's own call must decide: another argument count than
    the kernel's, a NumPy scalar whose bytes may not be what PyOpenCL passes (see
    :func:`_parameters`), or a setting the driver or PyOpenCL refused."""
    try:
        count, exact = kernel._svmkit_params
    except AttributeError:
        count, exact = kernel._svmkit_params = _parameters(kernel)
    if len(args) != count:
        return False
    try:
        set_bytes, set_arg = kernel._set_arg_buf, kernel.set_arg
        for i, arg in enumerate(args):
            if isinstance(arg, _NP_GENERIC):
                if exact is not None:
                    want = exact[i]
                    if want is None or (arg.dtype is not want and arg.dtype != want):
                        return False
                set_bytes(i, arg)
            else:
                set_arg(i, arg)
    except (cl.Error, TypeError, ValueError, AttributeError):  # (AttributeError: no
        return False  # _set_arg_buf in this PyOpenCL)
    return True


def _parameters(kernel: cl.Kernel) -> tuple[int, tuple[np.dtype[Any] | None, ...] | None]:
    """``kernel``'s parameter count, and which NumPy scalars go from their bytes: ``None``
    (any: a kernel that says it has no ``set_scalar_arg_dtypes``, ``_svmkit_untyped``,
    whose PyOpenCL call passes a NumPy scalar's bytes too), else per parameter the one
    dtype that does (``clGetKernelArgInfo``'s type of a by-value parameter: PyOpenCL's
    conversion to it leaves such a scalar as it is; ``None`` for a pointer, another type,
    or every parameter when the driver kept no argument info)."""
    count = int(kernel.num_args)
    if getattr(kernel, "_svmkit_untyped", False):
        return count, None
    try:
        names = [str(kernel.get_arg_info(i, cl.kernel_arg_info.TYPE_NAME)) for i in range(count)]
    except cl.Error:  # CL_KERNEL_ARG_INFO_NOT_AVAILABLE (a program built from a binary)
        return count, (None,) * count
    return count, tuple(scalar_parameter_dtype(name) for name in names)


def enqueue_kernel_as_set(
    queue: cl.CommandQueue, kernel: cl.Kernel, global_size: Any, local_size: Any, wait: Wait
) -> cl.Event:
    """``clEnqueueNDRangeKernel`` with the arguments already set on ``kernel`` (no
    ``clSetKernelArg``: a caller that owns the kernel and launches it over the same
    arguments again; NVIDIA's OpenCL spends several µs per SVM pointer argument set)."""
    try:
        return _cl.enqueue_nd_range_kernel(queue, kernel, global_size, local_size, wait_for=wait)
    except cl.Error as exc:
        raise translate(exc, what=f"enqueueing kernel {kernel.function_name}") from exc


# -- events ----------------------------------------------------------------------------------


def event_status(event: cl.Event) -> int:
    """``clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)``: ``CL_COMPLETE`` (0), a
    positive state still on its way, or a negative error code (the command failed)."""
    try:
        return int(event.command_execution_status)
    except cl.Error as exc:
        raise translate(exc, what="clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)") from exc


def event_complete(event: cl.Event) -> bool:
    """Whether ``event`` finished: its execution status is ``CL_COMPLETE`` or an error
    (``clGetEventInfo``; on every hot path that prunes recorded events, so no more than
    the one query and a comparison)."""
    try:
        return bool(event.command_execution_status <= _COMPLETE)
    except cl.Error as exc:
        raise translate(exc, what="clGetEventInfo(CL_EVENT_COMMAND_EXECUTION_STATUS)") from exc


def wait(event: cl.Event, what: str = "a command") -> None:
    """``clWaitForEvents`` on one event; a command that failed (or waited for an event
    that failed: ``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST``) raises its typed error.
    ``what`` names the command in the message.  A driver whose wait returns success for
    an event that failed (NVIDIA's, for a user event set to an error) is answered from
    the event's status."""
    wait_enqueued(event, what)
    raise_for_failed((event,), f"waiting for {what} failed")


def wait_enqueued(event: cl.Event, what: str) -> None:
    """``clWaitForEvents`` on the event of a command svmkit just enqueued (a blocking
    copy or map, an unmap): its wait list was checked for failed events before the
    enqueue (``rules.check_wait_status``) or is empty (an unmap's), so no status query
    follows on this hot path; a failed wait raises its typed error."""
    try:
        event.wait()
    except cl.Error as exc:
        raise translate(exc, what=f"waiting for {what}") from exc


def wait_for_events(events: list[cl.Event]) -> None:
    """``clWaitForEvents`` on every event of a non-empty list (failures as :func:`wait`)."""
    what = f"{len(events)} events"
    try:
        cl.wait_for_events(events)
    except cl.Error as exc:
        raise translate(exc, what=f"waiting for {what}") from exc
    raise_for_failed(events, f"waiting for {what} failed")


def raise_for_failed(events: Iterable[cl.Event], message: str) -> None:
    """Raise ``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST`` (an :class:`~svmkit.SVMError`)
    for the first of ``events`` whose execution status is an error (negative), ``message``
    saying what waited for it: the spec's answer of ``clWaitForEvents`` and of a blocking
    command whose wait list holds such an event."""
    for event in events:
        status = event_status(event)
        if status < 0:
            raise error_for_name(
                "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
                f"{message} (status {status})",
            )


def new_user_event(context: cl.Context) -> cl.UserEvent:
    """``clCreateUserEvent``: an event of ``context`` that the host completes with
    :func:`set_event_status`."""
    try:
        return cl.UserEvent(context)
    except cl.Error as exc:
        raise translate(exc, what="clCreateUserEvent") from exc


def set_event_status(event: cl.UserEvent, status: int = _COMPLETE) -> None:
    """``clSetUserEventStatus``: ``CL_COMPLETE`` (default) or a negative error code."""
    try:
        event.set_status(status)
    except cl.Error as exc:
        raise translate(exc, what=f"clSetUserEventStatus({status})") from exc


# -- platforms, contexts, command queues -----------------------------------------------------


def platforms() -> list[cl.Platform]:
    """``clGetPlatformIDs``: the platforms the ICD loader lists, in its order; an empty list
    when it lists none (``CL_PLATFORM_NOT_FOUND_KHR``, the ``cl_khr_icd`` loader's answer)."""
    try:
        return list(cl.get_platforms())
    except cl.Error as exc:
        if _error_name(exc) == "CL_PLATFORM_NOT_FOUND_KHR":
            return []
        raise translate(exc, what="clGetPlatformIDs") from exc


def platform_devices(platform: cl.Platform, device_type: Any = None) -> list[cl.Device]:
    """``clGetDeviceIDs``: the devices of ``platform`` (of ``device_type``, default all), in
    its order."""
    try:
        if device_type is None:
            return list(platform.get_devices())
        return list(platform.get_devices(device_type=device_type))
    except cl.Error as exc:
        raise translate(exc, what="clGetDeviceIDs") from exc


def chosen_devices() -> list[cl.Device]:
    """The devices ``PYOPENCL_CTX`` selects, by PyOpenCL's own rules (``platform[:device]``,
    by index or part of the name); a selection that matches nothing is an
    :class:`~svmkit.UnsupportedError` (PyOpenCL raises a bare ``RuntimeError``)."""
    try:
        return list(cl.choose_devices(interactive=False))
    except cl.Error as exc:
        raise translate(exc, what="selecting devices by PYOPENCL_CTX") from exc
    except RuntimeError as exc:  # "input did not match any platform/device"
        raise UnsupportedError(f"PYOPENCL_CTX selects no device: {exc}") from exc


def new_context(devices: list[cl.Device]) -> cl.Context:
    """``clCreateContext`` over ``devices``."""
    try:
        return cl.Context(devices)
    except cl.Error as exc:
        raise translate(exc, what="clCreateContext") from exc


def new_queue(
    context: cl.Context, device: cl.Device | None = None, properties: int = 0
) -> cl.CommandQueue:
    """``clCreateCommandQueueWithProperties`` on ``device`` (default: the context's first)
    with ``properties`` (default: none, an in-order queue)."""
    try:
        return cl.CommandQueue(context, device or context.devices[0], properties)
    except cl.Error as exc:
        raise translate(exc, what="clCreateCommandQueueWithProperties") from exc


def finish(queue: cl.CommandQueue) -> None:
    """``clFinish``: block until every command of ``queue`` completed."""
    try:
        queue.finish()
    except cl.Error as exc:
        raise translate(exc, what="clFinish") from exc


def flush(queue: cl.CommandQueue) -> None:
    """``clFlush``: hand ``queue``'s commands to the device without waiting."""
    try:
        queue.flush()
    except cl.Error as exc:
        raise translate(exc, what="clFlush") from exc


# -- kernels -----------------------------------------------------------------------------------


def new_kernel(program: cl.Program, name: str) -> cl.Kernel:
    """``clCreateKernel``: a new kernel object (own argument state) of a built program."""
    try:
        return cl.Kernel(program, name)
    except cl.Error as exc:
        raise translate(exc, what=f"clCreateKernel({name!r})") from exc


def kernel_names(program: cl.Program) -> list[str]:
    """``clGetProgramInfo(CL_PROGRAM_KERNEL_NAMES)`` of a built program, as a list."""
    try:
        text = program.get_info(cl.program_info.KERNEL_NAMES)
    except cl.Error as exc:
        raise translate(exc, what="clGetProgramInfo(CL_PROGRAM_KERNEL_NAMES)") from exc
    return [n for n in str(text).split(";") if n]


def kernel_arg_type_name(kernel: cl.Kernel, index: int) -> str:
    """``clGetKernelArgInfo(CL_KERNEL_ARG_TYPE_NAME)`` of parameter ``index``; a driver that
    kept no argument info (a program built from a binary) answers
    ``CL_KERNEL_ARG_INFO_NOT_AVAILABLE``, raised as an :class:`~svmkit.SVMError`."""
    try:
        return str(kernel.get_arg_info(index, cl.kernel_arg_info.TYPE_NAME))
    except cl.Error as exc:
        raise translate(exc, what=f"clGetKernelArgInfo({index}, CL_KERNEL_ARG_TYPE_NAME)") from exc


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


def build_program(
    context: cl.Context,
    source: str,
    options: Sequence[str] = (),
    devices: Sequence[cl.Device] | None = None,
    *,
    cached: bool = True,
) -> Any:
    """``clCreateProgramWithSource`` plus ``clBuildProgram``: the extension's built program.

    ``options`` get PyOpenCL's defaults added (its include path, ``PYOPENCL_BUILD_OPTIONS``)
    as ``pyopencl.Program.build`` adds them.  ``cached`` keeps PyOpenCL's binary cache
    (where the driver keeps none of its own, as ``Program.build`` decides); ``False``
    builds from source, for programs that must keep ``-cl-kernel-arg-info`` and for probes
    whose build log must be the compiler's.  ``pyopencl.Program.build`` is not used: on a
    failure it saves each source to a temporary file it never deletes and repeats the
    error's prefix.

    Raises
    ------
    BuildError
        The source failed to build (``CL_BUILD_PROGRAM_FAILURE``); the message and
        ``build_log`` hold each device's log under its name.
    InvalidValueError
        The options were refused (``CL_INVALID_BUILD_OPTIONS``).
    """
    options_bytes, include_path = cl.Program._process_build_options(context, list(options))
    if cached and not _driver_caches_builds(context):
        from pyopencl.cache import create_built_program_from_source_cached

        try:
            program, _ = create_built_program_from_source_cached(
                context,
                source,
                options_bytes,
                devices,
                cache_dir=getattr(context, "cache_dir", None),
                include_path=include_path,
            )
            return program
        except (cl.Error, KeyError):
            # A failure (or PyOpenCL 2026.1's KeyError while handling one): the source
            # build below raises the typed error with each device's log.
            pass
    program = new_program(context, source, cached=False)
    try:
        program.build(options_bytes, devices)
    except cl.Error as exc:
        raise _build_error(context, options_bytes, devices, program, exc) from exc
    return program


def _driver_caches_builds(context: cl.Context) -> bool:
    """Whether PyOpenCL leaves caching to the driver (as ``Program.build`` decides)."""
    from pyopencl.characterize import has_src_build_cache

    return bool(getattr(cl, "_PYOPENCL_NO_CACHE", False)) or bool(
        has_src_build_cache(context.devices[0])
    )


def _build_error(
    context: cl.Context,
    options: bytes,
    devices: Sequence[cl.Device] | None,
    program: Any,
    exc: BaseException,
) -> SVMError:
    """The typed error of a failed build, with each device's log (spec, clBuildProgram:
    ``CL_BUILD_PROGRAM_FAILURE`` "if there is a failure to build the program executable",
    ``CL_INVALID_BUILD_OPTIONS`` "if the build options specified by options are invalid")."""
    name = _error_name(exc)
    if name not in (None, "CL_BUILD_PROGRAM_FAILURE", "CL_INVALID_BUILD_OPTIONS"):
        return translate(exc, what="clBuildProgram")
    targets = list(devices or context.devices)
    logs = build_logs(program, targets)
    build_log = "\n".join(f"{name}:\n{text}" for name, text in logs.items())
    names = ", ".join(logs)
    if name == "CL_INVALID_BUILD_OPTIONS":
        return InvalidValueError(
            f"clBuildProgram refused the build options {options.decode(errors='replace')!r} "
            f"on {names} (CL_INVALID_BUILD_OPTIONS):\n{build_log}",
            cl_error="CL_INVALID_BUILD_OPTIONS",
        )
    return BuildError(
        f"clBuildProgram failed on {names} (CL_BUILD_PROGRAM_FAILURE):\n{build_log}",
        build_log=build_log,
        device_logs=logs,
    )


def build_logs(program: Any, devices: Sequence[cl.Device]) -> dict[str, str]:
    """``clGetProgramBuildInfo(CL_PROGRAM_BUILD_LOG)`` of each device, by device name
    (empty where the driver gives none)."""
    logs: dict[str, str] = {}
    for device in devices:
        try:
            text = program.get_build_info(device, cl.program_build_info.LOG)
        except (cl.Error, AttributeError):
            text = ""
        logs[str(device.name).strip()] = str(text or "").strip()
    return logs


def _error_name(exc: BaseException) -> str | None:
    """The ``CL_...`` name of a driver error's code (``None`` where it carries none)."""
    code = cl_error_code(exc)
    return None if code is None else cl_error_name(code)


def _nbytes(obj: Any) -> int:
    return int(getattr(obj, "nbytes", 0) or 0)
