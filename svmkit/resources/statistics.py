"""StatisticsAdaptor: counts bytes and allocations passing through (RMM's
``statistics_resource_adaptor``)."""

from __future__ import annotations

import threading

from svmkit.resources._adaptor import ResourceAdaptor
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["StatisticsAdaptor"]


class StatisticsAdaptor(ResourceAdaptor):
    """Counts what ``upstream`` hands out through this adaptor and what comes back.

    :meth:`stats` gives ``current_bytes``, ``peak_bytes``, ``total_bytes``,
    ``current_allocations``, ``peak_allocations`` and ``total_allocations``, in bytes
    asked for (zero-byte allocations are not counted: they hold no memory).
    """

    def __init__(self, upstream: MemoryResource) -> None:
        super().__init__(upstream)
        self._lock = threading.Lock()
        self._current_bytes = self._peak_bytes = self._total_bytes = 0
        self._current_allocations = self._peak_allocations = self._total_allocations = 0

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        allocation = self.upstream.allocate(nbytes, alignment)
        allocation.resource = self
        if nbytes:
            lock = self._lock
            lock.acquire()
            current = self._current_bytes = self._current_bytes + nbytes
            if current > self._peak_bytes:
                self._peak_bytes = current
            count = self._current_allocations = self._current_allocations + 1
            if count > self._peak_allocations:
                self._peak_allocations = count
            self._total_bytes += nbytes
            self._total_allocations += 1
            lock.release()
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        lock = self._lock
        lock.acquire()
        self._current_bytes -= allocation.nbytes
        self._current_allocations -= 1
        lock.release()
        self.upstream.deallocate(allocation)

    def stats(self) -> dict[str, int]:
        """Counters since creation (a consistent snapshot)."""
        with self._lock:
            return {
                "current_bytes": self._current_bytes,
                "peak_bytes": self._peak_bytes,
                "total_bytes": self._total_bytes,
                "current_allocations": self._current_allocations,
                "peak_allocations": self._peak_allocations,
                "total_allocations": self._total_allocations,
            }
