"""OpenCL C sources shipped with svmkit, and building programs that include them."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyopencl as cl

from svmkit.capabilities import capabilities, opencl_c_versions
from svmkit.driver import calls
from svmkit.ops.kernels import Program

__all__ = ["build_program", "build_options", "kernels_dir", "scope_for"]

log = logging.getLogger("svmkit")


@functools.cache
def kernels_dir() -> Path:
    """Directory of svmkit's OpenCL C headers and kernels (``kernels/`` in the source).

    From an installed package this is ``svmkit/kernels`` inside site-packages; from an
    editable install of a source checkout, the checkout's top-level ``kernels/``.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels", here.parent.parent / "kernels"):
        if (candidate / "svmkit_atomics.h").is_file():
            return candidate
    raise FileNotFoundError("svmkit's OpenCL C kernels were not found next to the package")


def scope_for(ctx: cl.Context) -> str:
    """``memory_scope_all_svm_devices`` where every device has the OpenCL C feature
    ``__opencl_c_atomic_scope_all_devices`` (or OpenCL C 2.x), else
    ``memory_scope_device``."""
    if capabilities(ctx).atomic_scope_all_devices:
        return "memory_scope_all_svm_devices"
    return "memory_scope_device"


def _cl_std(ctx: cl.Context) -> str | None:
    common: set[tuple[int, int]] | None = None
    for device in ctx.devices:
        versions = set(opencl_c_versions(device))
        common = versions if common is None else common & versions
    if not common:
        return None
    major, minor = max(common)
    return f"-cl-std=CL{major}.{minor}"


def build_options(
    ctx: cl.Context, options: Iterable[str] = (), defines: Mapping[str, Any] | None = None
) -> list[str]:
    """The options :func:`build_program` passes: include path, ``-cl-std``, defines."""
    opts = [f"-I{kernels_dir()}"]
    std = _cl_std(ctx)
    if std is not None:
        opts.append(std)
    opts.append(f"-DSVMKIT_SCOPE={scope_for(ctx)}")
    for name, value in (defines or {}).items():
        opts.append(f"-D{name}" if value is None else f"-D{name}={value}")
    opts.extend(options)
    return opts


def build_program(
    ctx: cl.Context,
    source: str,
    *,
    options: Iterable[str] = (),
    defines: Mapping[str, Any] | None = None,
    cache: bool = True,
) -> Program:
    """Build OpenCL C ``source`` for every device of ``ctx`` with svmkit's headers.

    Adds ``-I kernels_dir()``, the highest ``-cl-std`` every device supports and
    ``SVMKIT_SCOPE`` (see :func:`scope_for`); ``defines`` maps names to values
    (``{"WQ_ITEM": "int"}``).  ``cache=False`` builds from source past PyOpenCL's binary
    cache: a program created from a binary may lack what ``-cl-kernel-arg-info`` keeps
    (``clGetKernelArgInfo``: ``CL_KERNEL_ARG_INFO_NOT_AVAILABLE``).

    Returns an :class:`svmkit.Program`: ``prg.NAME`` is a tracked :class:`svmkit.Kernel`
    (its call is :func:`svmkit.launch`).

    A build that succeeds with compiler output (Intel's CPU runtime always reports its
    stages) logs that output on the ``svmkit`` logger at DEBUG level instead of PyOpenCL's
    ``CompilerWarning``.

    Raises
    ------
    BuildError
        The source failed to build (``CL_BUILD_PROGRAM_FAILURE``): ``.build_log`` holds each
        device's log under the device's name.
    InvalidValueError
        Options the compiler refuses (``CL_INVALID_BUILD_OPTIONS``).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", cl.CompilerWarning)
        program = Program(
            calls.build_program(ctx, source, build_options(ctx, options, defines), cached=cache)
        )
    for warning in caught:
        if not issubclass(warning.category, cl.CompilerWarning):
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    if caught and log.isEnabledFor(logging.DEBUG):
        for name, text in calls.build_logs(program, ctx.devices).items():
            log.debug("build log on %s:\n%s", name, text)
    return program
