"""One small coarse-grain SVM allocation per context, for where a driver needs a pointer.

Two places need a valid SVM pointer that no array supplies:

* a zero-element array allocates nothing (its ``ptr`` is 0), and NVIDIA's OpenCL refuses
  a NULL argument for a kernel whose argument was an SVM pointer before
  (``CL_INVALID_KERNEL_ARGS``) while refusing a NULL SVM pointer too;
* ``CL_KERNEL_EXEC_INFO_SVM_PTRS`` persists on a kernel object and the spec offers no way
  to clear it (an empty list is ``CL_INVALID_VALUE``); a list that still names freed
  memory crashes NVIDIA's next enqueue of the kernel, so it is replaced by this one.

The placeholder is never written or read by svmkit's kernels and lives as long as its
context.
"""

from __future__ import annotations

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.arrays.creation import empty
from svmkit.driver.per_context import PerContext
from svmkit.policy import Policy
from svmkit.resources.svm import SVMResource

__all__ = ["placeholder"]

_PLACEHOLDER_BYTES = 128  # the largest alignment any device needs (long16)


def _make(ctx: cl.Context) -> SVMArray:
    return empty(ctx, _PLACEHOLDER_BYTES, np.uint8, resource=SVMResource(ctx, Policy.coarse()))


_placeholders: PerContext[SVMArray] = PerContext(_make)


def placeholder(ctx: cl.Context) -> SVMArray:
    """The context's placeholder allocation (made on first use)."""
    return _placeholders.get(ctx)
