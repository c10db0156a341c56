"""The memory-resource interface and the allocation record every resource returns.

A *resource* owns memory; an *adaptor* wraps an ``upstream`` resource (its first
constructor argument, kept alive) and adds one concern.  Every resource serves one
context and one :class:`~svmkit.policy.Policy`.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from svmkit.driver import fork
from svmkit.events import EventRecord, wait_pending
from svmkit.events.mapstate import MapState
from svmkit.events.release import collecting, release_soon, release_thread_running
from svmkit.resources._cpool import Record

if TYPE_CHECKING:
    import pyopencl as cl

    from svmkit.capabilities import Capabilities
    from svmkit.policy import Policy
    from svmkit.resources.exports import ExportRecord

__all__ = ["Allocation", "MemoryResource", "host_bytes", "record_event", "record_events"]

_events_lock = threading.Lock()


def host_bytes(ptr: int, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """A writable uint8 NumPy view of ``nbytes`` at address ``ptr`` (no copy, no access)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    view: np.ndarray[Any, np.dtype[np.uint8]] = np.frombuffer(
        memoryview((ctypes.c_uint8 * nbytes).from_address(ptr)).cast("B"), np.uint8
    )
    return view


class Allocation(Record):
    """One block of SVM handed to a user: address, size, owner, pending events, map state.

    ``resource`` is the outermost resource that handed it out and takes it back;
    ``block`` is that resource's own bookkeeping (a pool block, a host buffer...).
    An allocation is freed once, by :meth:`free` or when the last reference goes.

    The fields live in C (:class:`svmkit.resources._cpool.Record`), so a pool hands out a
    new record without running Python, and so does ``free()`` in its common case (a pooled
    block with no export, no open map and no recorded command); every other case runs
    :meth:`_free` here.
    """

    __slots__ = ()

    resource: MemoryResource
    context: cl.Context
    policy: Policy
    ptr: int
    nbytes: int
    block: Any
    u8: np.ndarray[Any, np.dtype[np.uint8]]
    _events: EventRecord | None
    map_state: MapState | None
    freed: bool

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

    def wait_recorded(self) -> None:
        """Wait until the commands recorded on this allocation completed (NumPy's realloc
        of an allocator-made array copies its bytes only then)."""
        record = self._events
        if record:
            wait_pending(record.pending())

    def _free(self) -> None:
        """``free()`` in every case its C common case does not cover (see :meth:`free`)."""
        if self.freed:
            return
        if fork.forked:  # the parent's memory: never released in a forked child
            fork.check_owned(self.context, "this allocation")
        self.freed = True  # written before `exports` is read: see ExportRecord
        if self.nbytes:
            exports = self.exports
            if exports is not None and not exports.claim_release(self):
                return  # the last export to go releases the memory
            self.release_memory()

    def release_memory(self) -> None:
        """Hand the memory back to the resource (after an open driver map closes)."""
        state = self.map_state  # freed inside `mapped`: deallocate after the unmap
        if state is not None and state.defer_free(self._deallocate):
            return
        self.resource.deallocate(self)

    def _deallocate(self) -> None:
        self.resource.deallocate(self)

    def _finalize(self) -> None:
        """The last reference went without ``free()`` (called by the record's finaliser)."""
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


def record_event(alloc: Allocation, event: cl.Event, queue: cl.CommandQueue | None) -> None:
    """Record that ``event`` (enqueued on ``queue``) uses ``alloc``'s memory: what
    ``alloc.events.record(event, queue)`` does, without building the property call on the
    operations' hot path."""
    record = alloc._events
    if record is None:
        record = alloc.events
    record.record(event, queue)


def record_events(allocs: Iterable[Allocation], event: cl.Event, queue: cl.CommandQueue) -> None:
    """:func:`record_event` on each of ``allocs`` (a command's arrays), in one call."""
    for alloc in allocs:
        record = alloc._events
        if record is None:
            record = alloc.events
        record.record(event, queue)


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

    lender: MemoryResource | None = None
    """For a resource that only borrows memory (an adopted NumPy array's), the resource the
    memory goes back to when its owner frees it."""

    def owns(self, allocation: Allocation) -> bool:
        """Whether ``allocation``'s memory goes back to this resource when freed (for an
        adopted NumPy array's, when NumPy frees it)."""
        resource = allocation.resource
        return resource is self or resource.lender is self

    def serves(self, context: cl.Context, policy: Policy) -> bool:
        """Whether this resource allocates for ``context`` under ``policy``."""
        return bool(self.policy == policy and self.context == context)

    def __repr__(self) -> str:
        inner = f"{self.upstream!r}" if self.upstream is not None else str(self.policy)
        return f"{type(self).__name__}({inner})"
