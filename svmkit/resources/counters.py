"""The allocation counters that statistics report: one small object, counted once.

:class:`~svmkit.StatisticsAdaptor` and :class:`~svmkit.PoolResource` keep the same six
figures (RMM's ``statistics_resource_adaptor``: current, peak and total, in bytes asked
for and in allocations).  Both update an :class:`AllocationCounters` under a lock they
already hold, so counting adds no lock of its own to an allocation.
"""

from __future__ import annotations

__all__ = ["AllocationCounters"]


class AllocationCounters:
    """Current, peak and total bytes and allocations (the caller serialises updates)."""

    __slots__ = (
        "current_allocations",
        "current_bytes",
        "peak_allocations",
        "peak_bytes",
        "total_allocations",
        "total_bytes",
    )

    def __init__(self) -> None:
        self.current_bytes = self.peak_bytes = self.total_bytes = 0
        self.current_allocations = self.peak_allocations = self.total_allocations = 0

    def taken(self, nbytes: int) -> None:
        """Count an allocation of ``nbytes`` handed out."""
        current = self.current_bytes = self.current_bytes + nbytes
        if current > self.peak_bytes:
            self.peak_bytes = current
        count = self.current_allocations = self.current_allocations + 1
        if count > self.peak_allocations:
            self.peak_allocations = count
        self.total_bytes += nbytes
        self.total_allocations += 1

    def returned(self, nbytes: int) -> None:
        """Count an allocation of ``nbytes`` given back."""
        self.current_bytes -= nbytes
        self.current_allocations -= 1

    def snapshot(self) -> dict[str, int]:
        """The six figures as a dict (take it under the lock that guards updates)."""
        return {
            "current_bytes": self.current_bytes,
            "peak_bytes": self.peak_bytes,
            "total_bytes": self.total_bytes,
            "current_allocations": self.current_allocations,
            "peak_allocations": self.peak_allocations,
            "total_allocations": self.total_allocations,
        }
