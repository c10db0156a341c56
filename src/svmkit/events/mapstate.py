"""The map-state registry of one allocation: which byte ranges are mapped, and how.

Spec (clEnqueueSVMMap): while a coarse-grain SVM region is mapped for writing, commands
that read or write it give undefined results; while it is mapped for reading, commands
may read it but not write it.  svmkit keeps one :class:`MapState` per allocation so that
every command can ask, in O(1), whether it may touch a byte range.

Two layers are kept apart:

* the *open maps*: one :data:`OpenMap` per ``svmkit.mapped`` block (they nest and
  overlap), each with the host access its mode allows; the host may touch an array's
  bytes while maps allowing that access cover every one of them (:meth:`MapState.covers`);
* the *driver map*: the one ``clEnqueueSVMMap`` region open in the driver, the union of
  the open maps (NVIDIA's OpenCL fails the second of two unmaps in one allocation, so
  svmkit never holds two).  Commands are checked against it, since that is what the
  driver has mapped.

This module is bookkeeping only; :mod:`svmkit.mapping` issues the driver calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from svmkit.errors import MapStateError

__all__ = ["MapState", "OpenMap"]


OpenMap = tuple[int, int, bool, bool]
"""One open host map of bytes ``[start, stop)`` of an allocation, ``(start, stop, writes,
reads)``: whether its mode lets the host write (``"w"``, ``"rw"``, ``"w_invalidate"``)
and read (``"r"``, ``"rw"``) them.  A plain tuple: equal maps are interchangeable, so
closing one removes any of them."""


class MapState:
    """Open maps of an allocation (offsets relative to its start), and its driver map.

    ``lock`` serialises opening and closing maps (with their driver calls) per allocation:
    :meth:`open`, :meth:`close`, :meth:`set_driver` and :meth:`clear_driver` run under it.
    ``start``/``stop``/``writes`` are the driver map's region, for the O(1) command check
    (``stop == 0`` when nothing is mapped); ``driver`` is its SVM pointer object and
    ``queue`` the queue that mapped it (``driver is None`` when nothing is mapped).
    """

    __slots__ = ("deferred_free", "driver", "lock", "maps", "queue", "start", "stop", "writes")

    def __init__(self) -> None:
        self.maps: list[OpenMap] = []
        self.lock = threading.RLock()
        self.driver: Any = None
        self.queue: Any = None
        self.start = 0
        self.stop = 0
        self.writes = False
        self.deferred_free: Callable[[], None] | None = None

    # -- open maps -----------------------------------------------------------------------
    def open(self, start: int, stop: int, writes: bool, reads: bool = True) -> OpenMap:
        """Register a map of ``[start, stop)`` (under :attr:`lock`)."""
        entry = (start, stop, writes, reads)
        self.maps.append(entry)
        return entry

    def close(self, entry: OpenMap) -> None:
        """Forget a map registered by :meth:`open` (under :attr:`lock`)."""
        self.maps.remove(entry)

    def covers(self, start: int, stop: int, reads: bool = False, writes: bool = False) -> bool:
        """Whether open maps together cover every byte of ``[start, stop)``; with ``reads``
        (``writes``) only maps whose mode lets the host read (write) count."""
        if start >= stop:
            return True
        maps = tuple(self.maps)  # (a consistent snapshot: copying a list is atomic)
        if len(maps) == 1:  # (one open map: the common case, no sorting)
            lo, hi, map_writes, map_reads = maps[0]
            return (
                lo <= start
                and stop <= hi
                and (map_reads or not reads)
                and (map_writes or not writes)
            )
        spans = sorted(
            (lo, hi)
            for lo, hi, map_writes, map_reads in maps
            if hi > start and lo < stop and (map_reads or not reads) and (map_writes or not writes)
        )
        reach = start
        for lo, hi in spans:
            if lo > reach:
                return False
            reach = max(reach, hi)
            if reach >= stop:
                return True
        return reach >= stop

    def union(self) -> tuple[int, int] | None:
        """The smallest range covering every open map, or None when nothing is mapped."""
        with self.lock:
            if not self.maps:
                return None
            return min(m[0] for m in self.maps), max(m[1] for m in self.maps)

    # -- driver map ----------------------------------------------------------------------
    def set_driver(self, start: int, stop: int, writes: bool, svm: Any, queue: Any) -> None:
        """Record the region now mapped in the driver: bytes ``[start, stop)`` (for writing
        if ``writes``) through the SVM pointer object ``svm``, by ``queue``."""
        self.start, self.stop, self.writes = start, stop, writes
        self.driver, self.queue = svm, queue

    def clear_driver(self) -> None:
        """Record that nothing is mapped in the driver any more."""
        self.driver = self.queue = None
        self.start = self.stop = 0
        self.writes = False

    def defer_free(self, release: Callable[[], None]) -> bool:
        """Hold ``release`` until the driver map closes; False when nothing is mapped.

        Freeing memory the driver still has mapped would make the final
        ``clEnqueueSVMUnmap`` touch freed memory.
        """
        with self.lock:
            if self.driver is None:
                return False
            self.deferred_free = release
            return True

    def check_command(self, start: int, stop: int, writes: bool, what: str) -> None:
        """Raise :class:`MapStateError` if a command may not touch ``[start, stop)`` now.

        Mapped for writing: no command may read or write those bytes.  Mapped only for
        reading: no command may write them (spec, clEnqueueSVMMap).
        """
        # An empty range touches no byte (a zero-element view), so it never conflicts.
        if start < stop and self.stop > start and self.start < stop and (self.writes or writes):
            mode = "writing" if self.writes else "reading"
            raise MapStateError(
                f"{what} touches bytes [{start}, {stop}) of a coarse-grain allocation while "
                f"bytes [{self.start}, {self.stop}) are mapped on the host for {mode}; the "
                "spec leaves such commands undefined: leave the `mapped` block first"
            )
