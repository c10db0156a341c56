"""``mapped()``: host access to SVM as a ``with`` block, and the driver map it keeps.

Spec (clEnqueueSVMMap/clEnqueueSVMUnmap): the host may touch coarse-grain SVM only
between a map and its unmap; both are synchronisation points for the region.  Fine-grain
buffer and system SVM need no map, but the host must still order itself after commands
that use the memory.

One driver map per allocation: NVIDIA's OpenCL fails the second ``clEnqueueSVMUnmap`` when
two maps of one allocation are open at once, so nested and overlapping ``mapped`` blocks
share a single driver map of the union of their ranges.  A block that needs bytes (or
write access) outside the current driver map unmaps it and maps the new union; the last
block to leave unmaps.  Unmapping happens in ``__exit__``, never in ``__del__``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.arrays.numpy_owned import svm_operand
from svmkit.driver import calls
from svmkit.errors import InvalidValueError
from svmkit.events import check_wait_for, wait_pending
from svmkit.events.mapstate import MapState, OpenMap
from svmkit.resources.base import Allocation, record_event
from svmkit.rules import (
    MAP_FLAGS,
    check_map_mode,
    check_queue,
    check_wait_status,
)

__all__ = ["Mapping", "mapped"]

_READ = MAP_FLAGS["r"]
_READ_WRITE = MAP_FLAGS["rw"]
_state_lock = threading.Lock()


def map_state_of(alloc: Allocation) -> MapState:
    """The allocation's :class:`MapState`, created on first use."""
    state = alloc.map_state
    if state is None:
        with _state_lock:
            state = alloc.map_state
            if state is None:
                state = alloc.map_state = MapState()
    return state


def mapped(
    queue: cl.CommandQueue | None,
    a: SVMArray | np.ndarray[Any, Any],
    mode: str = "rw",
    *,
    wait_for: Sequence[cl.Event] | None = None,
) -> Mapping:
    """Map ``a`` for host access in a ``with`` block; yields a NumPy view of its memory.

    Parameters
    ----------
    queue:
        Queue for the map and unmap commands (``None``: svmkit's default queue).
    a:
        The array or view to map.
    mode:
        ``"r"`` (the view yielded is read-only), ``"w"``, ``"rw"`` or ``"w_invalidate"``
        (``CL_MAP_WRITE_INVALIDATE_REGION``: the contents on entry are undefined).
    wait_for:
        Events to complete before the host may touch the memory.

    Raises
    ------
    InvalidValueError
        Unknown ``mode`` (spec: ``CL_INVALID_VALUE`` for invalid ``map_flags``), ``a`` not
        an SVMArray.
    InvalidContextError
        ``queue`` or an event of ``wait_for`` from another context than ``a``.
    UseAfterFreeError
        ``a`` was freed.

    Notes
    -----
    COARSE: a blocking ``clEnqueueSVMMap`` on entry, after ``wait_for`` and every command
    svmkit recorded on the array; ``clEnqueueSVMUnmap`` on exit (also when the block
    raises), waited for, so the host's writes are visible to later commands.  While open,
    ``a.host`` works (read-only under ``"r"``), the NumPy protocol reads under ``"r"`` and
    ``"rw"`` and writes under ``"w"``, ``"rw"`` and ``"w_invalidate"``, and svmkit commands
    that would touch the mapped bytes raise :class:`~svmkit.MapStateError`.  FINE/SYSTEM:
    enqueues nothing, only waits.
    """
    if not isinstance(a, SVMArray):
        a = svm_operand(a, "mapped()'s array")
    flags = check_map_mode(mode)
    alloc = a.live()
    queue = check_queue(queue, alloc.context)
    return Mapping(
        queue, a, flags, check_wait_for(alloc.context, wait_for) if wait_for is not None else []
    )


class Mapping:
    """The context manager :func:`mapped` returns (one ``with`` at a time)."""

    __slots__ = ("_array", "_entry", "_flags", "_open", "_queue", "_wait")

    def __init__(
        self, queue: cl.CommandQueue, a: SVMArray, flags: int, wait: list[cl.Event]
    ) -> None:
        self._queue = queue
        self._array = a
        self._flags = flags
        self._wait = wait
        self._entry: OpenMap | None = None
        self._open = False

    def __enter__(self) -> np.ndarray[Any, Any]:
        if self._open:
            raise InvalidValueError(
                "this mapped() block is already open; call mapped() again to nest another map"
            )
        a = self._array
        alloc = a.live()
        if self._wait:
            check_wait_status(self._wait, "mapped()")
        flags = self._flags
        # COARSE: valid in the block only; FINE/SYSTEM: an export (it keeps the memory alive)
        view = a.unchecked_view if alloc.policy.needs_map else a.host
        if flags == _READ:
            view = view.view()
            view.flags.writeable = False
        if not alloc.policy.needs_map or not view.size:
            record = alloc._events
            wait_pending((record.pending() if record is not None else []) + self._wait)
            self._open = True
            return view
        lo, hi = a.byte_range()
        writes = flags != _READ
        state = alloc.map_state
        if state is None:
            state = map_state_of(alloc)
        with state.lock:
            record = alloc._events
            wait = self._wait if record is None else record.pending_for(self._queue) + self._wait
            if state.driver is None:  # (nothing mapped yet: the common case, inline)
                # The array itself is an SVM pointer object over exactly [lo, hi) when it
                # is contiguous: no new pointer object on the common path.
                self._driver_map(state, alloc, lo, hi, writes, flags, wait, a)
            else:
                self._map(state, alloc, lo, hi, writes, wait)
            self._entry = state.open(lo, hi, writes, bool(flags & _READ))
        self._open = True
        return view

    def _map(
        self, state: MapState, alloc: Allocation, lo: int, hi: int, writes: bool, wait: list[Any]
    ) -> None:
        """Make the open driver map cover ``[lo, hi)`` (with write access if ``writes``),
        after ``wait``."""
        if state.start <= lo and hi <= state.stop and (state.writes or not writes):
            wait_pending(wait)  # already mapped: only order after pending work
        else:  # remap the union (a single driver map per allocation)
            queue, start, stop, union_writes = state.queue, state.start, state.stop, state.writes
            unmapped = calls.enqueue_unmap(queue, state.driver)
            alloc.events.record(unmapped, queue)
            state.clear_driver()
            union_writes = union_writes or writes
            self._driver_map(
                state,
                alloc,
                min(lo, start),
                max(hi, stop),
                union_writes,
                _READ_WRITE if union_writes else _READ,
                [unmapped, *wait],
            )

    def _driver_map(
        self,
        state: MapState,
        alloc: Allocation,
        lo: int,
        hi: int,
        writes: bool,
        flags: int,
        wait: list[cl.Event],
        array: SVMArray | None = None,
    ) -> None:
        """Map ``[lo, hi)`` in the driver (through ``array`` itself when it is contiguous)."""
        svm: Any = array
        if array is None or not array.contiguous:
            svm = calls.svm_pointer(alloc.u8[lo:hi])
        calls.map_and_wait(self._queue, flags, svm, wait)
        state.set_driver(lo, hi, writes, svm, self._queue)

    def __exit__(self, *exc: object) -> None:
        self._open = False
        entry, self._entry = self._entry, None
        if entry is None:
            return
        alloc = self._array.allocation
        state = alloc.map_state
        if state is None:  # cannot happen: the entry was opened on it
            return
        release = None
        with state.lock:
            state.close(entry)
            svm, queue = state.driver, state.queue
            if state.maps or svm is None:
                return
            state.clear_driver()
            release, state.deferred_free = state.deferred_free, None
            try:
                event = calls.enqueue_unmap(queue, svm)
                record_event(alloc, event, queue)
                calls.wait_enqueued(event, "clEnqueueSVMUnmap")  # (an unmap waits for nothing)
            finally:
                if release is not None:  # the array was freed inside the block
                    release()
