"""The memory-resource interface and the allocation record every resource returns.

A *resource* owns memory; an *adaptor* wraps an ``upstream`` resource (its first
constructor argument, kept alive) and adds one concern.  Every resource serves one
context and one :class:`~svmkit.policy.Policy`.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from svmkit.driver import fork
from svmkit.events import EventRecord
from svmkit.events.mapstate import MapState
from svmkit.events.release import collecting, release_soon, release_thread_running

if TYPE_CHECKING:
    import pyopencl as cl

    from svmkit.capabilities import Capabilities
    from svmkit.policy import Policy
    from svmkit.resources.exports import ExportRecord

__all__ = ["Allocation", "MemoryResource", "host_bytes"]

_events_lock = threading.Lock()


def host_bytes(ptr: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A writable uint8 NumPy view of ``nbytes`` at address ``ptr`` (no copy, no access)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    view: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(
        memoryview((ctypes.c_uint8 * nbytes).from_address(ptr)).cast("B"), np.uint8
    )
    return view


class Allocation:
    """One block of SVM handed to a user: address, size, owner, pending events, map state.

    ``resource`` is the outermost resource that handed it out and takes it back;
    ``block`` is that resource's own bookkeeping (a pool block, a host buffer...).
    An allocation is freed once, by :meth:`free` or when the last reference goes.
    """

    __slots__ = (
        "__weakref__",
        "_events",
        "block",
        "context",
        "exports",
        "freed",
        "map_state",
        "memo",
        "nbytes",
        "policy",
        "ptr",
        "resource",
        "u8",
    )

    memo: dict[Any, Any] | None
    """Per-block cache that outlives the allocation (a pool block's typed views), or None."""

    exports: ExportRecord | None
    """What exports of this allocation keep alive (:mod:`svmkit.resources.exports`), or None
    while nothing was exported."""

    def __init__(
        self,
        resource: MemoryResource,
        ptr: int,
        nbytes: int,
        u8: np.ndarray[Any, np.dtype[np.uint8]] | None = None,
        block: Any = None,
    ) -> None:
        self.resource = resource
        self.context = resource.context
        self.policy = resource.policy
        self.ptr = ptr
        self.nbytes = nbytes
        self.block = block
        self.u8 = host_bytes(ptr, nbytes) if u8 is None else u8
        self._events: EventRecord | None = None
        self.map_state: MapState | None = None
        self.freed = False
        self.memo = None
        self.exports = None

    @classmethod
    def _reuse(
        cls,
        resource: MemoryResource,
        ptr: int,
        nbytes: int,
        u8: np.ndarray[Any, np.dtype[np.uint8]],
        block: Any,
        memo: dict[Any, Any] | None,
    ) -> Allocation:
        """A fresh record for memory a resource hands out again (a pool's hot path).

        Each hand-out gets a NEW record, so arrays of an earlier user of the same memory
        see ``freed`` and raise :class:`~svmkit.UseAfterFreeError`.
        """
        self = cls.__new__(cls)
        self.resource = resource
        self.context = resource.context
        self.policy = resource.policy
        self.ptr = ptr
        self.nbytes = nbytes
        self.block = block
        self.u8 = u8
        self._events = None
        self.map_state = None
        self.freed = False
        self.memo = memo
        self.exports = None
        return self

    @property
    def events(self) -> EventRecord:
        """Commands recorded on this allocation (created on first use)."""
        record = self._events
        if record is None:
            with _events_lock:  # two threads recording first must share one record
                record = self._events
                if record is None:
                    record = self._events = EventRecord()
        return record

    def take_events(self) -> list[Any]:
        """The recorded events not yet complete, leaving none recorded (for deallocation)."""
        record = self._events
        return record.take() if record else []

    def free(self) -> None:
        """Give the memory back to its resource after recorded commands finish; idempotent.

        The allocation is freed at once (svmkit refuses every later use); its memory goes
        back only once the last export of it is gone (:mod:`svmkit.resources.exports`).
        """
        if self.freed:
            return
        if fork.forked:  # the parent's memory: never released in a forked child
            fork.check_owned(self.context, "this allocation")
        self.freed = True  # written before `exports` is read: see ExportRecord
        if self.nbytes:
            exports = self.exports
            if exports is not None and not exports.claim_release(self):
                return  # the last export to go releases the memory
            if self.map_state is None:  # (release_memory's common case, inlined)
                self.resource.deallocate(self)
            else:
                self.release_memory()

    def release_memory(self) -> None:
        """Hand the memory back to the resource (after an open driver map closes)."""
        state = self.map_state  # freed inside `mapped`: deallocate after the unmap
        if state is not None and state.defer_free(self._deallocate):
            return
        self.resource.deallocate(self)

    def _deallocate(self) -> None:
        self.resource.deallocate(self)

    def __del__(self) -> None:
        if self.freed:
            return
        try:
            if collecting() and release_thread_running():
                # A garbage collection may have interrupted a pool holding its lock on
                # this thread: the release thread frees it (no lock taken here).
                release_soon(self.free)
            else:
                self.free()
        except Exception:  # never raise from a finaliser (interpreter may be exiting)
            pass

    def __repr__(self) -> str:
        state = "freed" if self.freed else "live"
        return f"<Allocation {self.nbytes} B at {self.ptr:#x} {self.policy} {state}>"


class MemoryResource:
    """Base of every resource and adaptor: ``allocate`` and ``deallocate`` SVM."""

    context: cl.Context
    policy: Policy
    capabilities: Capabilities
    upstream: MemoryResource | None = None

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        """An allocation of at least ``nbytes`` bytes aligned to ``alignment`` (0: default).

        Raises
        ------
        InvalidValueError
            Size or alignment break ``clSVMAlloc``'s rules.
        OutOfMemoryError
            The memory could not be had.
        """
        raise NotImplementedError

    def deallocate(self, allocation: Allocation) -> None:
        """Take ``allocation`` back; memory is reused only after its recorded events finish."""
        raise NotImplementedError

    def owns(self, allocation: Allocation) -> bool:
        """Whether ``allocation`` goes back to this resource when freed."""
        return allocation.resource is self

    def serves(self, context: cl.Context, policy: Policy) -> bool:
        """Whether this resource allocates for ``context`` under ``policy``."""
        return bool(self.policy == policy and self.context == context)

    def __repr__(self) -> str:
        inner = f"{self.upstream!r}" if self.upstream is not None else str(self.policy)
        return f"{type(self).__name__}({inner})"
