"""SVMResource: raw ``clSVMAlloc``/``clSVMFree``, every argument checked first."""

from __future__ import annotations

import logging
import threading

import pyopencl as cl

from svmkit.capabilities import capabilities, check_context_layout
from svmkit.driver import calls, fork
from svmkit.driver.per_context import PerContext, canonical_context, check_context
from svmkit.errors import OutOfMemoryError
from svmkit.events import release_after
from svmkit.policy import Granularity, Policy, check_alignment, check_size
from svmkit.resources._cpool import system_alloc, system_free
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["SVMResource"]

log = logging.getLogger(__name__)

# Some drivers (NVIDIA's OpenCL) return NULL from clSVMAlloc when another thread allocates
# or frees SVM at the same time: driver allocation and freeing are serialised per context.
_driver_locks: PerContext[threading.Lock] = PerContext(lambda _ctx: threading.Lock())


def driver_lock(context: cl.Context) -> threading.Lock:
    """The lock that serialises ``clSVMAlloc``/``clSVMFree`` on ``context``."""
    return _driver_locks.get(context)


class SVMResource(MemoryResource):
    """Memory straight from the driver: ``clSVMAlloc`` on allocate, ``clSVMFree`` on free.

    Parameters
    ----------
    ctx:
        The context every allocation belongs to.
    policy:
        Granularity, atomics and access; ``None`` means ``Policy.best(ctx)``.

    Notes
    -----
    Every ``clSVMAlloc`` rule the spec lists (flags, alignment, size) is checked before the
    driver is called; a NULL result becomes :class:`~svmkit.OutOfMemoryError` with
    ``cl_error="CL_MEM_OBJECT_ALLOCATION_FAILURE"``.  ``clSVMFree`` runs only after every
    event recorded on the allocation completed (spec: the application must ensure no
    command uses the memory after it is freed).  SYSTEM memory comes from the host
    allocator, as fine-grain system SVM allows.
    """

    def __init__(self, ctx: cl.Context, policy: Policy | None = None) -> None:
        check_context(ctx)
        if fork.forked:
            fork.check_owned(ctx, "this context")
        check_context_layout(ctx)
        if policy is None:
            policy = Policy.best(ctx)
        elif not isinstance(policy, Policy):
            from svmkit.errors import InvalidValueError

            raise InvalidValueError(f"policy must be a svmkit.Policy, got {policy!r}")
        policy.check(ctx)
        self.context = canonical_context(ctx)  # (identity checks on the hot paths)
        self.policy = policy
        self.capabilities = capabilities(ctx)
        self._flags = policy.flags
        self._lock = driver_lock(ctx)

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        """Allocate ``nbytes`` (0 allocates nothing) aligned to ``alignment`` bytes."""
        if fork.forked:
            fork.check_owned(self.context, "this SVMResource")
        alignment = check_alignment(alignment, self.capabilities)
        check_size(nbytes, self.capabilities)
        if nbytes == 0:
            return Allocation(self, 0, 0)
        if self.policy.granularity is Granularity.SYSTEM:
            return self._allocate_system(nbytes, alignment)
        with self._lock:
            ptr = calls.svm_alloc(self.context, self._flags, nbytes, alignment)
        if not ptr:
            raise OutOfMemoryError(
                f"clSVMAlloc returned NULL for {nbytes} bytes ({self.policy}, alignment "
                f"{alignment}) on {self.capabilities.name}",
                nbytes=nbytes,
                cl_error="CL_MEM_OBJECT_ALLOCATION_FAILURE",
            )
        return Allocation(self, ptr, nbytes)

    def _allocate_system(self, nbytes: int, alignment: int) -> Allocation:
        """Host memory for SYSTEM SVM, from C (``posix_memalign``, or ``mmap`` madvised for
        huge pages above 4 MiB), never from NumPy: inside ``sk.numpy_allocator`` NumPy's own
        allocations come from svmkit, which must not ask NumPy in turn."""
        try:
            ptr = system_alloc(nbytes, alignment)
        except MemoryError as exc:
            raise OutOfMemoryError(
                f"host allocation of {nbytes} bytes failed", nbytes=nbytes
            ) from exc
        return Allocation(self, ptr, nbytes, block=_SystemFree(ptr, nbytes, alignment))

    def deallocate(self, allocation: Allocation) -> None:
        """``clSVMFree`` once the allocation's recorded events completed (never blocks)."""
        if allocation.block is not None:  # SYSTEM: host memory, given back by its block
            release_after(allocation.take_events(), allocation.block)
            return
        release_after(allocation.take_events(), _SVMFree(self.context, self._lock, allocation.ptr))


class _SystemFree:
    """The release of a SYSTEM allocation's host memory (``system_free``), run once."""

    __slots__ = ("alignment", "nbytes", "ptr")

    def __init__(self, ptr: int, nbytes: int, alignment: int) -> None:
        self.ptr, self.nbytes, self.alignment = ptr, nbytes, alignment

    def __call__(self) -> None:
        ptr, self.ptr = self.ptr, 0
        if ptr:
            system_free(ptr, self.nbytes, self.alignment)


class _SVMFree:
    __slots__ = ("context", "lock", "ptr")

    def __init__(self, context: cl.Context, lock: threading.Lock, ptr: int) -> None:
        self.context, self.lock, self.ptr = context, lock, ptr

    def __call__(self) -> None:
        with self.lock:
            calls.svm_free(self.context, self.ptr)
