"""Exception classes of svmkit, and the one place that knows OpenCL error names.

Every error svmkit raises on purpose derives from :class:`SVMError` and carries
``.cl_error``: the OpenCL error name the specification gives for the condition, or
``None`` where the condition is svmkit's own.  Classes that narrow a built-in
(``ValueError``, ``MemoryError``) derive from it too, so ``except ValueError`` keeps
working for code that does not know svmkit.

:func:`translate` maps a ``pyopencl.Error`` to the matching svmkit class; the driver
chokepoint (:mod:`svmkit.driver.calls`) raises it ``from`` the original for every call.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BuildError",
    "CopyOverlapError",
    "InvalidContextError",
    "InvalidValueError",
    "MapStateError",
    "OutOfMemoryError",
    "QueueClosed",
    "SVMError",
    "UnsupportedError",
    "UseAfterFreeError",
    "WorkQueueTimeout",
    "cl_error_name",
    "error_for_name",
    "translate",
]


class SVMError(Exception):
    """Base class of every error svmkit raises on purpose.

    Parameters
    ----------
    message:
        What was given, what the rule is, and (for capability problems) which device.
    cl_error:
        The OpenCL error name for the condition (``"CL_INVALID_VALUE"``...) or ``None``
        where the condition is svmkit's own.
    """

    default_cl_error: str | None = None

    def __init__(self, message: str, *, cl_error: str | None = None) -> None:
        super().__init__(message)
        self.cl_error: str | None = cl_error if cl_error is not None else self.default_cl_error

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args[0] if self.args else "", dict(self.__dict__)))


def _rebuild(cls: type[SVMError], message: str, state: dict[str, Any]) -> SVMError:
    # Every attribute of an svmkit error is a keyword of its constructor.
    return cls(message, **state)


class InvalidValueError(SVMError, ValueError):
    """A spec ``CL_INVALID_VALUE`` condition: bad flags, alignment, size, pattern, range, mode."""

    default_cl_error = "CL_INVALID_VALUE"


class CopyOverlapError(InvalidValueError):
    """A copy whose source and destination bytes overlap (``CL_MEM_COPY_OVERLAP``)."""

    default_cl_error = "CL_MEM_COPY_OVERLAP"


class UnsupportedError(SVMError):
    """A capability that some device in the context lacks."""

    default_cl_error = None


class InvalidContextError(SVMError, ValueError):
    """Queue, array, event or pool from different contexts (``CL_INVALID_CONTEXT``)."""

    default_cl_error = "CL_INVALID_CONTEXT"


class MapStateError(SVMError):
    """Host access to an unmapped coarse-grain array, or a command on a mapped one."""

    default_cl_error = None


class UseAfterFreeError(SVMError):
    """Any use of an array (or a view of it) after it was freed."""

    default_cl_error = None


class OutOfMemoryError(SVMError, MemoryError):
    """An allocation failed or a limit of svmkit's was reached.

    ``nbytes`` is the size asked for; ``limit_bytes``, ``in_use_bytes``, ``cached_bytes``
    and ``fragmented_bytes`` carry the figures the raiser knew (``None`` if not).
    """

    default_cl_error = None

    def __init__(
        self,
        message: str,
        *,
        nbytes: int,
        cl_error: str | None = None,
        limit_bytes: int | None = None,
        in_use_bytes: int | None = None,
        cached_bytes: int | None = None,
        fragmented_bytes: int | None = None,
    ) -> None:
        super().__init__(message, cl_error=cl_error)
        self.nbytes = nbytes
        self.limit_bytes = limit_bytes
        self.in_use_bytes = in_use_bytes
        self.cached_bytes = cached_bytes
        self.fragmented_bytes = fragmented_bytes


class QueueClosed(SVMError):
    """``pop`` on a work queue that is closed and drained; ``push`` after ``close()``."""

    default_cl_error = None


class WorkQueueTimeout(SVMError, TimeoutError):
    """A blocking work-queue call ran out of time; ``pushed`` leading items went in.

    Both an :class:`SVMError` and a :class:`TimeoutError`, as every timeout of a blocking
    svmkit call is (``except TimeoutError`` keeps working for code that does not know svmkit).
    """

    default_cl_error = None

    def __init__(self, message: str, pushed: int = 0, *, cl_error: str | None = None) -> None:
        super().__init__(message, cl_error=cl_error)
        self.pushed = pushed


class BuildError(SVMError):
    """An OpenCL C source failed to build (``CL_BUILD_PROGRAM_FAILURE``).

    ``build_log`` holds each device's compiler log, under the device's name;
    ``device_logs`` maps each device's name to its log alone.
    """

    default_cl_error = "CL_BUILD_PROGRAM_FAILURE"

    def __init__(
        self,
        message: str,
        *,
        cl_error: str | None = None,
        build_log: str = "",
        device_logs: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message, cl_error=cl_error)
        self.build_log = build_log
        self.device_logs: dict[str, str] = dict(device_logs or {})


# OpenCL error codes that SVM calls can return (cl.h), by value.
_CL_ERROR_NAMES: dict[int, str] = {
    -4: "CL_MEM_OBJECT_ALLOCATION_FAILURE",
    -5: "CL_OUT_OF_RESOURCES",
    -6: "CL_OUT_OF_HOST_MEMORY",
    -8: "CL_MEM_COPY_OVERLAP",
    -1001: "CL_PLATFORM_NOT_FOUND_KHR",
    -11: "CL_BUILD_PROGRAM_FAILURE",
    -30: "CL_INVALID_VALUE",
    -33: "CL_INVALID_DEVICE",
    -34: "CL_INVALID_CONTEXT",
    -36: "CL_INVALID_COMMAND_QUEUE",
    -38: "CL_INVALID_MEM_OBJECT",
    -45: "CL_INVALID_PROGRAM_EXECUTABLE",
    -43: "CL_INVALID_BUILD_OPTIONS",
    -46: "CL_INVALID_KERNEL_NAME",
    -48: "CL_INVALID_KERNEL",
    -49: "CL_INVALID_ARG_INDEX",
    -51: "CL_INVALID_ARG_SIZE",
    -52: "CL_INVALID_KERNEL_ARGS",
    -54: "CL_INVALID_WORK_GROUP_SIZE",
    -57: "CL_INVALID_EVENT_WAIT_LIST",
    -58: "CL_INVALID_EVENT",
    -59: "CL_INVALID_OPERATION",
    -61: "CL_INVALID_BUFFER_SIZE",
    -14: "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
}

_CLASS_FOR_NAME: dict[str, type[SVMError]] = {
    "CL_INVALID_VALUE": InvalidValueError,
    "CL_INVALID_BUILD_OPTIONS": InvalidValueError,
    "CL_INVALID_KERNEL_NAME": InvalidValueError,
    "CL_INVALID_ARG_INDEX": InvalidValueError,
    "CL_BUILD_PROGRAM_FAILURE": BuildError,
    "CL_MEM_COPY_OVERLAP": CopyOverlapError,
    "CL_INVALID_CONTEXT": InvalidContextError,
    "CL_INVALID_OPERATION": UnsupportedError,
    "CL_MEM_OBJECT_ALLOCATION_FAILURE": OutOfMemoryError,
    "CL_OUT_OF_RESOURCES": OutOfMemoryError,
    "CL_OUT_OF_HOST_MEMORY": OutOfMemoryError,
}


def cl_error_name(code: int) -> str:
    """The ``CL_...`` name of an OpenCL error code (``"CL_ERROR_<code>"`` if unknown)."""
    return _CL_ERROR_NAMES.get(code, f"CL_ERROR_{code}")


def cl_error_code(exc: BaseException) -> int | None:
    """The OpenCL error code a ``pyopencl.Error`` carries (``None`` where it carries none;
    PyOpenCL's ``code`` is a method)."""
    try:
        code = getattr(exc, "code", None)
        code = code() if callable(code) else code
    except Exception:
        return None
    return code if isinstance(code, int) else None


def translate(exc: BaseException, *, what: str, nbytes: int = 0) -> SVMError:
    """The svmkit error for a driver error raised by PyOpenCL while doing ``what``.

    A ``pyopencl.Error`` with a known code becomes the matching class with ``cl_error``
    set; any other driver code becomes a plain :class:`SVMError` carrying its name.
    """
    code = cl_error_code(exc)
    name = cl_error_name(code) if code is not None else None
    return error_for_name(name, f"{what} failed in the OpenCL driver: {exc}", nbytes=nbytes)


def error_for_name(name: str | None, message: str, *, nbytes: int = 0) -> SVMError:
    """The svmkit error of the class that matches OpenCL error ``name``."""
    cls = _CLASS_FOR_NAME.get(name or "", SVMError)
    if name and name not in message:
        message = f"{message} ({name})"
    if cls is OutOfMemoryError:
        return OutOfMemoryError(message, nbytes=nbytes, cl_error=name)
    return cls(message, cl_error=name)
