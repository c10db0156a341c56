"""The map-state registry of one allocation: which byte ranges are mapped, and how.

Spec (clEnqueueSVMMap): while a coarse-grain SVM region is mapped for writing, commands
that read or write it give undefined results; while it is mapped for reading, commands
may read it but not write it.  svmkit keeps one :class:`MapState` per allocation so that
every command can ask, in O(1), whether it may touch a byte range.

Two layers are kept apart:

* the *open maps*: one :class:`OpenMap` per ``svmkit.mapped`` block (they nest and
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
from dataclasses import dataclass
from typing import Any

from svmkit.errors import MapStateError

__all__ = ["DriverMap", "MapState", "OpenMap"]


@dataclass(eq=False)
class OpenMap:
    """One open host map of bytes ``[start, stop)`` of an allocation: whether its mode
    lets the host read (``"r"``, ``"rw"``) and write (``"w"``, ``"rw"``,
    ``"w_invalidate"``) them."""

    start: int
    stop: int
    writes: bool
    reads: bool = True


@dataclass(eq=False)
class DriverMap:
    """The region ``[start, stop)`` mapped in the driver, its pointer object and queue."""

    start: int
    stop: int
    writes: bool
    svm: Any
    queue: Any


class MapState:
    """Open maps of an allocation (offsets relative to its start).

    ``lock`` serialises opening and closing maps (with their driver calls) per allocation.
    ``start``/``stop``/``writes`` mirror the driver map for the O(1) command check
    (``stop == 0`` when nothing is mapped).
    """

    __slots__ = ("deferred_free", "driver", "lock", "maps", "start", "stop", "writes")

    def __init__(self) -> None:
        self.maps: list[OpenMap] = []
        self.lock = threading.RLock()
        self.driver: DriverMap | None = None
        self.start = 0
        self.stop = 0
        self.writes = False
        self.deferred_free: Callable[[], None] | None = None

    # -- open maps -----------------------------------------------------------------------
    def open(self, start: int, stop: int, writes: bool, reads: bool = True) -> OpenMap:
        """Register a map of ``[start, stop)``."""
        entry = OpenMap(start, stop, writes, reads)
        with self.lock:
            self.maps.append(entry)
        return entry

    def close(self, entry: OpenMap) -> None:
        """Forget a map registered by :meth:`open`."""
        with self.lock:
            self.maps.remove(entry)

    def covers(self, start: int, stop: int, reads: bool = False, writes: bool = False) -> bool:
        """Whether open maps together cover every byte of ``[start, stop)``; with ``reads``
        (``writes``) only maps whose mode lets the host read (write) count."""
        if start >= stop:
            return True
        with self.lock:
            spans = sorted(
                (m.start, m.stop)
                for m in self.maps
                if m.stop > start
                and m.start < stop
                and (m.reads or not reads)
                and (m.writes or not writes)
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
            return min(m.start for m in self.maps), max(m.stop for m in self.maps)

    # -- driver map ----------------------------------------------------------------------
    def set_driver(self, driver: DriverMap | None) -> None:
        """Record the region now mapped in the driver (``None``: nothing is)."""
        self.driver = driver
        if driver is None:
            self.start = self.stop = 0
            self.writes = False
        else:
            self.start, self.stop, self.writes = driver.start, driver.stop, driver.writes

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
