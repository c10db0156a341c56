"""The map-state registry of one allocation: which byte ranges are mapped, and how.

Spec (clEnqueueSVMMap): while a coarse-grain SVM region is mapped for writing, commands
that read or write it give undefined results; while it is mapped for reading, commands
may read it but not write it.  svmkit keeps one :class:`MapState` per allocation so that
every command can ask, in O(open maps), whether it may touch a byte range.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from svmkit.errors import MapStateError

__all__ = ["MapState", "OpenMap"]


@dataclass(eq=False)
class OpenMap:
    """One open host map of bytes ``[start, stop)`` of an allocation."""

    start: int
    stop: int
    writes: bool


class MapState:
    """Open maps of an allocation (offsets relative to its start)."""

    __slots__ = ("lock", "maps")

    def __init__(self) -> None:
        self.maps: list[OpenMap] = []
        self.lock = threading.RLock()

    def open(self, start: int, stop: int, writes: bool) -> OpenMap:
        """Register a map of ``[start, stop)``."""
        entry = OpenMap(start, stop, writes)
        with self.lock:
            self.maps.append(entry)
        return entry

    def close(self, entry: OpenMap) -> None:
        """Forget a map registered by :meth:`open`."""
        with self.lock:
            self.maps.remove(entry)

    def covers(self, start: int, stop: int) -> bool:
        """Whether open maps together cover every byte of ``[start, stop)``."""
        if start >= stop:
            return True
        with self.lock:
            spans = sorted((m.start, m.stop) for m in self.maps if m.stop > start and m.start < stop)
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

    def check_command(self, start: int, stop: int, writes: bool, what: str) -> None:
        """Raise :class:`MapStateError` if a command may not touch ``[start, stop)`` now.

        Mapped for writing: no command may read or write those bytes.  Mapped only for
        reading: no command may write them.
        """
        with self.lock:
            for m in self.maps:
                if m.stop > start and m.start < stop and (m.writes or writes):
                    mode = "writing" if m.writes else "reading"
                    raise MapStateError(
                        f"{what} touches bytes [{start}, {stop}) of a coarse-grain allocation "
                        f"while bytes [{m.start}, {m.stop}) are mapped on the host for {mode}; "
                        "the spec leaves such commands undefined: leave the `mapped` block first")
