"""Export lifetimes: what keeps an allocation's memory alive once svmkit has freed it.

An *export* is anything outside svmkit that reaches an allocation's memory: a NumPy view
(``a.host``, ``np.asarray(a)``, the views ``sk.mapped`` yields for FINE and SYSTEM memory,
and every NumPy view of those), a DLPack capsule and what a consumer builds from it, a
``pyopencl.array.Array`` bridge.  ``free()`` (and ``with`` exit, ``enqueue_free``, the
last reference going) still marks the allocation freed at once, but its memory goes back
to its resource only when the last export is gone, so no write through an old export can
land in memory another array owns (Python's own rule: ``mmap.close()`` and
``memoryview.release()`` refuse while exports exist; svmkit defers instead).

How it is counted
-----------------
Each export hangs off an *owner* of its own: a uint8 NumPy array over the allocation's
bytes (:class:`HostOwner`) whose buffer is a ctypes array, so NumPy never collapses a
view's ``base`` past it, and every NumPy view, DLPack capsule or PyOpenCL array made from
the export keeps it alive.  An owner belongs to one hand-out of memory (one
:class:`Allocation`), never to the block a pool reuses.  An :class:`ExportRecord` counts
the live owners.  An owner's finaliser only hands the record over
(:data:`~svmkit.events.release.handoff`, no lock taken: it may run inside a garbage
collection that interrupted a pool holding its lock); the count changes on svmkit's
release thread, or on the thread that reads statistics first
(:func:`~svmkit.events.release.settle`), under this module's lock, and the memory is
released there once the count reaches zero and the allocation is freed.

``free()`` writes ``freed`` before it reads ``Allocation.exports``; making an export
writes ``exports`` (and reserves a count) before it reads ``freed``.  So either the
exporter sees the allocation freed and backs out (never releasing), or ``free`` sees the
record and decides under the lock; a never-exported allocation's free costs one slot read.

``pyopencl.array`` bridges add their queue (:func:`order_after_queue`): the release waits
for a marker enqueued on it, since PyOpenCL's commands are invisible to svmkit.
"""

from __future__ import annotations

import _thread
import ctypes
import gc
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyopencl as cl

from svmkit.driver import calls
from svmkit.errors import SVMError, UseAfterFreeError
from svmkit.events.release import drain, ensure_release_thread, handoff, shutting_down

if TYPE_CHECKING:
    from svmkit.resources.base import Allocation

__all__ = [
    "ExportRecord",
    "HostOwner",
    "export_base",
    "exported_bytes",
    "host_export",
    "order_after_queue",
    "reclaim",
]

log = logging.getLogger(__name__)

_lock = threading.RLock()
_held: set[ExportRecord] = set()  # records of freed allocations that exports still hold
RECLAIM_WAIT_SECONDS = 5.0


class HostOwner(np.ndarray):
    """The uint8 array a host export of one allocation is a view of (see module doc).

    Its finaliser only hands the count to the release thread (no lock: it may run inside
    a garbage collection that interrupted a pool holding its lock).  A finaliser, not a
    weakref callback: a collection of a cycle that holds the owner, its record and the
    allocation together runs finalisers but drops weakref callbacks of the trash.
    """

    __slots__ = ("drop", "record")
    record: ExportRecord
    drop: _Drop

    def __del__(self) -> None:
        try:
            drop = getattr(self, "drop", None)  # slices of an owner have none
            if drop is not None:
                handoff(drop)
        except KeyboardInterrupt:  # Ctrl-C landed in this finaliser, where Python drops it
            drop = getattr(self, "drop", None)
            if drop is not None:
                handoff(drop)  # (one-shot: handed over twice, it runs once)
            _thread.interrupt_main()  # the interrupt still reaches the main thread
        except Exception:  # never raise from a finaliser (interpreter may be exiting)
            pass


class _Drop:
    """One owner fewer for ``record``, once, on the thread that claims the hand-off (see
    :func:`~svmkit.events.release.handoff`)."""

    __slots__ = ("done", "record")

    def __init__(self, record: ExportRecord) -> None:
        self.record = record
        self.done = False  # (read and set under the module's lock)

    def run_release(self) -> None:
        self.record.dropped(self)


class ExportRecord:
    """The exports of one allocation: live owners, bridged queues, whether released.

    ``alloc`` is held only while an owner lives (the owner keeps the record, the record
    the allocation), so a dropped array whose views live on stays reachable, and the
    cycle is broken when the last owner goes.
    """

    __slots__ = ("alloc", "count", "queues", "released")

    def __init__(self) -> None:
        self.alloc: Allocation | None = None
        self.count = 0
        self.queues: list[cl.CommandQueue] = []
        self.released = False

    def claim_release(self, alloc: Allocation) -> bool:
        """``free()`` of an exported allocation: True if the caller releases now (no
        export lives), False if the last export to go will."""
        with _lock:
            if self.released:
                return False
            if self.count:
                _held.add(self)
                return False
            self.released = True
            queues = list(self.queues)
        _order_after(alloc, queues)
        return True

    def dropped(self, drop: _Drop) -> None:
        """An owner died (``drop`` handed over by its finaliser, counted once): release
        once none lives and the allocation is freed."""
        with _lock:
            if drop.done:  # handed over twice (an interrupted finaliser)
                return
            drop.done = True
            self.count -= 1
            if self.count:
                return
            alloc, self.alloc = self.alloc, None
            release = alloc is not None and alloc.freed and not self.released
            if release:
                self.released = True
            _held.discard(self)
            queues = list(self.queues)
        if release and alloc is not None:
            _order_after(alloc, queues)
            alloc.release_memory()
        # `alloc` goes out of scope here, outside the lock: if no array references it any
        # more, its finaliser frees it (and, with no export left, releases it at once).


def _order_after(alloc: Allocation, queues: list[cl.CommandQueue]) -> None:
    """Record a marker of each bridged queue on ``alloc`` (its release waits for them)."""
    if shutting_down():
        return  # at exit svmkit calls no driver any more (and releases nothing)
    for queue in queues:
        try:
            alloc.events.record(calls.enqueue_marker(queue))
        except SVMError:
            log.warning("could not order a release after a PyOpenCL queue", exc_info=True)
            calls.finish(queue)


def export_base(alloc: Allocation) -> HostOwner:
    """A new :class:`HostOwner` of the allocation (each export has its own, so a dying
    owner can never be handed out again).  Raises :class:`~svmkit.UseAfterFreeError`
    once the allocation is freed."""
    ensure_release_thread()  # owners die in finalizers, which cannot start a thread
    with _lock:
        record = alloc.exports
        if record is None:
            record = alloc.exports = ExportRecord()
        record.count += 1  # reserved before `freed` is read (see the module doc)
        if alloc.freed:
            record.count -= 1  # backs out; whoever frees releases (never the exporter)
            raise UseAfterFreeError(
                "cannot export memory of a freed SVMArray (free(), enqueue_free() or the end "
                "of a `with` block); it may already belong to another array"
            )
        record.alloc = alloc
    buffer: Any = (ctypes.c_uint8 * alloc.nbytes).from_address(alloc.ptr)
    owner = cast(HostOwner, np.ndarray.__new__(HostOwner, (alloc.nbytes,), np.uint8, buffer))
    owner.record = record
    owner.drop = _Drop(record)  # from here on its finaliser gives the count back
    return owner


def host_export(
    alloc: Allocation, template: np.ndarray[Any, Any], offset: int
) -> np.ndarray[Any, Any]:
    """A NumPy view like ``template`` (shape, dtype, strides), ``offset`` bytes into
    ``alloc``, that keeps the allocation's memory alive (an export)."""
    view: np.ndarray[Any, Any]
    if not alloc.nbytes:
        view = template.view()  # a zero-byte allocation has no memory to keep
        return view
    owner = export_base(alloc)
    view = np.ndarray(
        template.shape, template.dtype, buffer=owner, offset=offset, strides=template.strides
    )
    return view


def order_after_queue(alloc: Allocation, queue: cl.CommandQueue) -> None:
    """Make the allocation's release wait for the commands enqueued on ``queue`` when it
    happens (a ``pyopencl.array`` bridge's queue)."""
    owner = export_base(alloc)  # makes sure the record exists
    record = alloc.exports
    del owner
    assert record is not None
    with _lock:
        if not any(q is queue for q in record.queues):
            record.queues.append(queue)


def exported_bytes(keep: Callable[[Allocation], bool] | None = None) -> int:
    """Bytes of freed allocations that live exports still hold (those ``keep`` selects)."""
    with _lock:
        allocs = [r.alloc for r in _held if r.alloc is not None]
    return sum(a.nbytes for a in allocs if keep is None or keep(a))


def reclaim() -> None:
    """Collect garbage (exports in reference cycles) and wait for the releases that
    follows (bounded): what a pool does before it reports running out of memory."""
    gc.collect()
    drain(RECLAIM_WAIT_SECONDS)
