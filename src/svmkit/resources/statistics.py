"""StatisticsAdaptor: counts bytes and allocations passing through (RMM's
``statistics_resource_adaptor``)."""

from __future__ import annotations

import threading

from svmkit.events.release import settle
from svmkit.resources._adaptor import ResourceAdaptor
from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.counters import AllocationCounters

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
        self._counts = AllocationCounters()

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        allocation = self.upstream.allocate(nbytes, alignment)
        allocation.resource = self
        if nbytes:
            with self._lock:
                self._counts.taken(nbytes)
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        if allocation.nbytes:
            with self._lock:
                self._counts.returned(allocation.nbytes)
        self.upstream.deallocate(allocation)

    def stats(self) -> dict[str, int]:
        """Counters since creation (a consistent snapshot, exact when read: releases that
        finalizers handed over run first, :func:`~svmkit.events.release.settle`)."""
        settle()
        with self._lock:
            return self._counts.snapshot()
