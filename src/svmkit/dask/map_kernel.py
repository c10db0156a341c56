"""``map_kernel``: an OpenCL kernel applied to every chunk of a Dask array.

Each chunk is copied into SVM drawn from the worker's current resource (its pool),
the kernel runs with one work-item per element as ``kernel(out, in, *scalars)``, and
the result is copied back to a NumPy chunk.  Only copies move data (``SVMArray.set`` and
``get``, ``clEnqueueSVMMemcpy``), so coarse-grain SVM, the only kind some drivers offer,
serves as well as fine-grain.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from svmkit.arrays.creation import empty
from svmkit.dask import worker
from svmkit.dask._types import ARRAY_KINDS, check_scalar
from svmkit.errors import InvalidValueError
from svmkit.ops import launch

__all__ = ["map_kernel", "run_chunk"]


def map_kernel(x: Any, source: str, kernel: str, *scalars: Any, dtype: Any = None) -> Any:
    """A lazy Dask array: ``kernel`` of ``source`` applied to each chunk of ``x``.

    Parameters
    ----------
    x:
        A Dask array (anything else goes through ``dask.array.asarray``) of integers or
        floating point numbers.
    source:
        OpenCL C source defining ``kernel``; built once per worker process.
    kernel:
        The kernel's name.  It is called as ``kernel(out, in, *scalars)`` with one
        work-item per element (``get_global_id(0)`` indexes the chunk in C order).
    scalars:
        Converted to the kernel's parameter types (``clGetKernelArgInfo``), refusing
        values a type cannot hold.
    dtype:
        The output's dtype; ``None``: ``x``'s.

    Raises
    ------
    InvalidValueError
        At once for a kernel name absent from ``source``, a non-numeric dtype or scalar;
        when computed, for a kernel whose parameters do not match (count, pointer types,
        scalar types) or a name the built program lacks (``CL_INVALID_KERNEL_NAME``).
    BuildError
        When computed, if ``source`` does not build; the message holds the build log.
    """
    import dask.array as da

    arr = da.asarray(x)
    out_dtype = np.dtype(arr.dtype if dtype is None else dtype)
    for role, dt in (("input", arr.dtype), ("output", out_dtype)):
        if dt.kind not in ARRAY_KINDS or not dt.isnative:
            raise InvalidValueError(
                f"map_kernel moves integer and floating-point arrays in native byte order; "
                f"the {role} dtype is {dt}"
            )
    if not isinstance(source, str) or not isinstance(kernel, str):
        raise InvalidValueError(
            f"source and kernel must be strings, got {type(source).__name__} and "
            f"{type(kernel).__name__}"
        )
    if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(kernel)}(?![A-Za-z0-9_])", source):
        raise InvalidValueError(
            f"the source never mentions a kernel named {kernel!r}",
            cl_error="CL_INVALID_KERNEL_NAME",
        )
    for i, value in enumerate(scalars):
        check_scalar(value, i)
    return arr.map_blocks(
        run_chunk,
        source,
        kernel,
        scalars,
        out_dtype.str,
        dtype=out_dtype,
        meta=np.empty((0,) * arr.ndim, out_dtype),
        token=f"map_kernel-{kernel}",
    )


def run_chunk(
    block: np.ndarray[Any, Any], source: str, kernel: str, scalars: tuple[Any, ...], dtype: str
) -> np.ndarray[Any, Any]:
    """One chunk through the kernel on this worker (set up on first use)."""
    out_dtype = np.dtype(dtype)
    host = np.ascontiguousarray(block)
    state = worker.state()
    entry = state.programs.kernel(source, kernel)
    args = entry.arguments(host.dtype, out_dtype, scalars)
    if host.size == 0:
        return np.empty(host.shape, out_dtype)
    queue = state.queue()
    src = empty(state.context, host.shape, host.dtype, policy=state.policy)
    try:
        dst = empty(state.context, host.shape, out_dtype, policy=state.policy)
        try:
            src.set(host, queue)
            launch(queue, entry.kernel, (host.size,), None, dst, src, *args)
            return dst.get(queue)
        finally:
            dst.free()
    finally:
        src.free()
