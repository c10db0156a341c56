"""``pyopencl.array`` bridges: ``SVMArray.to_cl_array`` and ``sk.cl_allocator``.

``a.to_cl_array(queue)`` wraps the array's memory, zero-copy and for every granularity,
as a ``pyopencl.array.Array`` whose data is an export (:mod:`svmkit.resources.exports`):
the memory outlives ``free()`` while the PyOpenCL array (or a view of it) lives, and its
release waits for a marker on ``queue``, since PyOpenCL's kernels are invisible to svmkit.

``sk.cl_allocator(queue, resource=None)`` is an ``allocator=`` for ``pyopencl.array``
drawing from a svmkit resource (a pool, by default the current one), as RMM's
``rmm_cupy_allocator`` does for CuPy.  A block goes back only after a marker enqueued on
``queue`` after PyOpenCL dropped it has completed, so it is never reused under a running
``pyopencl.array`` kernel (the hazard of PyOpenCL's own pools with several queues).  The
drops of one queue share markers, one per burst (:mod:`svmkit.events.epochs`): a block
waits in its queue's epoch, counted as in use, and goes back through the pool's fast path
once the epoch's marker completed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyopencl as cl

from svmkit.driver import calls
from svmkit.driver.per_context import PerContext
from svmkit.errors import InvalidContextError, InvalidValueError
from svmkit.events.epochs import EPOCH_BLOCKS, EPOCH_BYTES, QueueEpochs, queue_epochs
from svmkit.events.release import ensure_release_thread
from svmkit.policy import Policy
from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.current import current_resource
from svmkit.resources.exports import export_base, order_after_queue
from svmkit.rules import check_queue

if TYPE_CHECKING:
    import pyopencl.array as cla

    from svmkit.arrays.array import SVMArray

__all__ = ["CLAllocator", "cl_allocator", "to_cl_array"]

_no_system: PerContext[Policy] = PerContext(lambda ctx: Policy.best(ctx, system=False))


def to_cl_array(a: SVMArray, queue: cl.CommandQueue | None = None) -> cla.Array:
    """``a.to_cl_array(queue)``: a ``pyopencl.array.Array`` over ``a``'s memory (an export;
    ``free()`` of ``a`` also orders after ``queue``'s commands), whose temporaries come
    from :func:`cl_allocator` on ``queue``."""
    import pyopencl.array as cla

    alloc = a.live()
    queue = check_queue(queue, alloc.context)
    if a.size == 0:
        return cla.Array(queue, a.shape, a.dtype, strides=a.strides)
    lo, hi = a.byte_range()
    span = export_base(alloc).view(np.ndarray)[lo:hi]  # keeps the memory alive
    order_after_queue(alloc, queue)
    return cla.Array(
        queue,
        a.shape,
        a.dtype,
        data=calls.svm_pointer(span),
        offset=a.offset - lo,
        strides=a.strides,
        # Its temporaries (results of operations, reduction stages) come from svmkit's pool
        # too: SVM like the array, so a cached PyOpenCL kernel never sees one argument as
        # an SVM pointer in one call and a cl_mem in the next (NVIDIA refuses that switch
        # with CL_INVALID_KERNEL_ARGS).
        allocator=cl_allocator(queue),
    )


class _Block(cl.SVM):  # type: ignore[misc]
    """One allocation lent to ``pyopencl.array``: an SVM pointer whose memory goes back
    through its queue's release epochs (:mod:`svmkit.events.epochs`) when PyOpenCL drops
    it, so only once a marker enqueued after the drop has completed."""

    __slots__ = ("allocation", "epochs")

    allocation: Allocation
    epochs: QueueEpochs

    def __del__(self) -> None:
        # QueueEpochs.release of a block below EPOCH_BYTES, inline (a finaliser per block).
        try:
            epochs = self.epochs
            released = epochs.released
            released.append(self.allocation)
            if len(released) >= EPOCH_BLOCKS or not QueueEpochs.ticking:
                epochs.after_append()
        except Exception:  # never raise from a finaliser (interpreter may be exiting)
            pass


class _LargeBlock(_Block):
    """A block of ``EPOCH_BYTES`` or more: released with a marker of its own."""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            self.epochs.release(self.allocation)
        except Exception:  # never raise from a finaliser (interpreter may be exiting)
            pass


class CLAllocator:
    """An ``allocator=`` for ``pyopencl.array`` (see :func:`cl_allocator`)."""

    __slots__ = ("context", "epochs", "policy", "queue", "resource")

    def __init__(self, queue: cl.CommandQueue, resource: MemoryResource | None = None) -> None:
        if not isinstance(queue, cl.CommandQueue):
            raise InvalidValueError(
                f"cl_allocator needs a pyopencl.CommandQueue, got {type(queue).__name__}"
            )
        if resource is not None:
            if not isinstance(resource, MemoryResource):
                raise InvalidValueError(f"resource must be a memory resource, got {resource!r}")
            if resource.context != queue.context:
                raise InvalidContextError("the resource serves another context than the queue")
        self.queue = check_queue(queue, queue.context)
        self.context = queue.context
        self.policy = _no_system.get(self.context)  # (of the default resource: fixed)
        self.resource = resource
        self.epochs = queue_epochs(self.queue)
        ensure_release_thread()  # blocks dropped in a garbage collection are handed over

    def __call__(self, nbytes: int) -> _Block:
        resource = self.resource
        if resource is None:
            resource = current_resource(self.context, self.policy)
        allocation = resource.allocate(nbytes)
        block = (_Block if nbytes < EPOCH_BYTES else _LargeBlock)(allocation.u8)
        block.allocation = allocation
        block.epochs = self.epochs
        return block

    def __repr__(self) -> str:
        return f"cl_allocator({self.queue.device.name!r}, {self.resource!r})"


def cl_allocator(queue: cl.CommandQueue, resource: MemoryResource | None = None) -> CLAllocator:
    """An ``allocator=`` for ``pyopencl.array`` that draws from ``resource`` (default: at each
    allocation, the current resource for the queue's context and
    ``Policy.best(ctx, system=False)``); releases order after a marker on ``queue``."""
    return CLAllocator(queue, resource)
