"""Tracked kernels: ``sk.Program`` and ``sk.Kernel``, whose call is :func:`svmkit.launch`.

:func:`svmkit.build_program` returns a :class:`Program`; ``prg.NAME`` is a :class:`Kernel`,
a ``pyopencl.Kernel`` whose call validates its arguments, registers SVM pointers and
records the event on every SVM argument (so ``free()`` and pools wait for it), exactly
as ``sk.launch`` does.  Kernels are made once per program and thread: a kernel's argument
values are state on the kernel object, and the spec says "it is not safe to call
clSetKernelArg ... from multiple host threads on the same cl_kernel object at the same
time", so threads never share one.
"""

from __future__ import annotations

import threading
from typing import Any

import pyopencl as cl

from svmkit.driver import calls
from svmkit.errors import InvalidValueError, SVMError, translate
from svmkit.ops.kernel_launch import TRACKED_KERNELS, launch

__all__ = ["Kernel", "Program"]


_get = object.__getattribute__


class _ThreadKernels(threading.local):
    """Per thread: the kernels made in it, by name."""

    def __init__(self) -> None:
        self.kernels: dict[str, Kernel] = {}


class Program(cl.Program):  # type: ignore[misc]
    """A built ``pyopencl.Program`` whose kernels are tracked (:class:`Kernel`).

    ``prg.NAME`` and ``Kernel(prg, "NAME")`` give the calling thread's kernel ``NAME``
    (made on first use, then the same object); ``all_kernels()`` gives them all.
    PyOpenCL's ``RepeatedKernelRetrieval`` warning does not apply: retrieving again costs
    a dictionary lookup.
    """

    def __init__(self, built: Any) -> None:
        super().__init__(built)
        self._svmkit_threads = _ThreadKernels()

    def _svmkit_kernels(self) -> dict[str, Kernel]:
        """The calling thread's kernels of this program, by name."""
        kernels: dict[str, Kernel] = _get(self, "_svmkit_threads").kernels
        return kernels

    def __getattribute__(self, name: str) -> Any:
        # The calling thread's kernels first: `prg.NAME(queue, ...)` in a loop then costs
        # one dictionary lookup, not a failed attribute lookup before __getattr__.
        try:
            known = _get(self, "_svmkit_threads").kernels.get(name)
        except AttributeError:  # (while PyOpenCL's constructor runs)
            known = None
        return known if known is not None else _get(self, name)

    def __getattr__(self, name: str) -> Kernel:
        if name.startswith("_"):  # (PyOpenCL's and svmkit's own attributes, while unset)
            raise AttributeError(name)
        try:
            return Kernel(self, name)
        except InvalidValueError as exc:
            raise AttributeError(
                f"{name!r} is neither an attribute of the program nor one of its kernels "
                f"({', '.join(calls.kernel_names(self)) or 'none'})"
            ) from exc

    def all_kernels(self) -> list[Kernel]:
        """The calling thread's :class:`Kernel` of every kernel in the program."""
        return [Kernel(self, name) for name in calls.kernel_names(self)]


class Kernel(cl.Kernel):  # type: ignore[misc]
    """A ``pyopencl.Kernel`` whose call is :func:`svmkit.launch`.

    ``Kernel(prg, "NAME")`` of a :class:`Program` returns the calling thread's kernel
    (the object ``prg.NAME`` gives); of a plain ``pyopencl.Program``, a new kernel.
    ``set_args`` followed by ``pyopencl.enqueue_nd_range_kernel`` bypasses the call and
    is not tracked (tell svmkit with :func:`svmkit.record`).
    """

    _svmkit_ready = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        TRACKED_KERNELS.add(cls)

    def __new__(cls, program: Any, name: str) -> Kernel:
        if isinstance(program, Program):
            known = program._svmkit_kernels().get(name)
            if known is not None:
                return known
        self: Kernel = super().__new__(cls)
        return self

    def __init__(self, program: Any, name: str) -> None:
        if self._svmkit_ready:
            return  # the thread's kernel, returned by __new__
        try:
            super().__init__(program, name)
        except cl.Error as exc:
            error: SVMError = translate(exc, what=f"clCreateKernel({name!r})")
            raise error from exc
        self._svmkit_ready = True
        self._svmkit_untyped = True  # (until set_scalar_arg_dtypes: see enqueue_kernel)
        if isinstance(program, Program):
            program._svmkit_kernels()[name] = self

    def set_arg_types(self, arg_types: Any) -> None:
        """PyOpenCL's ``set_arg_types``; scalars are then set as PyOpenCL converts them
        (:func:`svmkit.driver.calls.enqueue_kernel`)."""
        self._svmkit_untyped = False
        self.__dict__.pop("_svmkit_params", None)
        super().set_arg_types(arg_types)

    set_scalar_arg_dtypes = set_arg_types

    __call__ = launch
    """:func:`svmkit.launch` of this kernel: ``k(queue, global_size, local_size, *args,
    uses=(), wait_for=None, **pyopencl_keywords)`` (``global_offset``... pass on to
    PyOpenCL); returns the event.  (The function itself, bound: ``launch`` takes the kernel
    from its first place.)"""


TRACKED_KERNELS.add(Kernel)
