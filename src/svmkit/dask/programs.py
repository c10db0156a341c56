"""Built programs, once per worker process, and kernels, once per thread.

A worker runs several tasks at once on its threads.  Building a program is done once
per source under a lock; a ``pyopencl.Kernel`` is not: its argument values are state on
the kernel object (``clSetKernelArg``; OpenCL: "it is not safe to call clSetKernelArg
... from multiple host threads on the same cl_kernel object at the same time"), so every
thread gets kernel objects of its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.dask._types import (
    c_type_of,
    convert_scalar,
    dtype_of,
    fallback_dtype,
    pointee,
)
from svmkit.driver import calls
from svmkit.errors import BuildError, InvalidValueError, SVMError
from svmkit.programs import build_program

__all__ = ["BuildError", "KernelEntry", "ProgramCache"]

BUILD_OPTIONS = ("-cl-kernel-arg-info",)


@dataclass
class KernelEntry:
    """One thread's kernel object with its parameter type names (None: no arg info)."""

    kernel: cl.Kernel
    name: str
    type_names: tuple[str, ...] | None

    def arguments(
        self, in_dtype: np.dtype[Any], out_dtype: np.dtype[Any], scalars: tuple[Any, ...]
    ) -> list[np.generic]:
        """The scalars converted to the kernel's parameter types, after checking that the
        kernel takes ``(out, in, *scalars)`` with pointers to ``out_dtype`` and
        ``in_dtype`` (``CL_INVALID_KERNEL_ARGS`` for a wrong count)."""
        expected = 2 + len(scalars)
        if self.kernel.num_args != expected:
            raise InvalidValueError(
                f"kernel {self.name!r} takes {self.kernel.num_args} parameters, but map_kernel "
                f"passes {expected}: (out, in) and {len(scalars)} scalar(s)",
                cl_error="CL_INVALID_KERNEL_ARGS",
            )
        types = self.type_names
        if types is None:
            return [
                convert_scalar(v, fallback_dtype(v, out_dtype), f"scalar {i}")
                for i, v in enumerate(scalars)
            ]
        for index, role, dtype in ((0, "out", out_dtype), (1, "in", in_dtype)):
            declared = pointee(types[index])
            if declared is not None and declared != dtype:
                raise InvalidValueError(
                    f"kernel {self.name!r} declares parameter {index} ({role}) as "
                    f"{types[index]!r}, but the {role} chunks are {dtype} "
                    f"({c_type_of(dtype)}*); pass dtype= or change the kernel",
                    cl_error="CL_INVALID_ARG_VALUE",
                )
        out = []
        for i, value in enumerate(scalars):
            where = f"parameter {i + 2} of kernel {self.name!r}"
            param = dtype_of(types[i + 2])
            if param is None or types[i + 2].rstrip().endswith("*"):
                raise InvalidValueError(
                    f"{where} has type {types[i + 2]!r}; map_kernel passes scalars only to "
                    "scalar parameters of the OpenCL C scalar types",
                    cl_error="CL_INVALID_ARG_VALUE",
                )
            out.append(convert_scalar(value, param, where))
        return out


class ProgramCache:
    """Programs of one context by source (built once), kernels by thread."""

    def __init__(self, context: cl.Context) -> None:
        self.context = context
        self._programs: dict[str, cl.Program | BuildError] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self.builds = 0

    def program(self, source: str) -> cl.Program:
        """``source`` built for the context (once; a failure is remembered and re-raised)."""
        with self._lock:
            built = self._programs.get(source)
            if built is None:
                built = self._programs[source] = self._build(source)
        if isinstance(built, BuildError):
            raise BuildError(str(built), build_log=built.build_log, device_logs=built.device_logs)
        return built

    def _build(self, source: str) -> cl.Program | BuildError:
        self.builds += 1
        try:
            # past PyOpenCL's binary cache: programs from binaries lose argument info
            return build_program(self.context, source, options=BUILD_OPTIONS, cache=False)
        except BuildError as exc:  # the message and build_log carry each device's log
            return exc

    def kernel(self, source: str, name: str) -> KernelEntry:
        """This thread's kernel ``name`` of ``source`` (``CL_INVALID_KERNEL_NAME`` if absent)."""
        kernels: dict[tuple[str, str], KernelEntry] | None = getattr(self._local, "kernels", None)
        if kernels is None:
            kernels = self._local.kernels = {}
        entry = kernels.get((source, name))
        if entry is None:
            entry = kernels[source, name] = self._make_kernel(source, name)
        return entry

    def _make_kernel(self, source: str, name: str) -> KernelEntry:
        program = self.program(source)
        names = calls.kernel_names(program)
        if name not in names:
            raise InvalidValueError(
                f"the source defines no kernel named {name!r} (it defines: "
                f"{', '.join(names) or 'none'})",
                cl_error="CL_INVALID_KERNEL_NAME",
            )
        kernel = calls.new_kernel(program, name)
        return KernelEntry(kernel, name, _type_names(kernel))


def _type_names(kernel: cl.Kernel) -> tuple[str, ...] | None:
    """Each parameter's type name, or None where the driver keeps no argument info."""
    try:
        return tuple(calls.kernel_arg_type_name(kernel, i) for i in range(kernel.num_args))
    except (SVMError, AttributeError):
        return None
