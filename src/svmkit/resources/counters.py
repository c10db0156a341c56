"""The allocation counters that statistics report: one small object, counted once.

:class:`~svmkit.StatisticsAdaptor` and :class:`~svmkit.PoolResource` keep the same six
figures (RMM's ``statistics_resource_adaptor``: current, peak and total, in bytes asked
for and in allocations).  Both update an :class:`AllocationCounters` under a lock they
already hold, so counting adds no lock of its own to an allocation.  The counters are
C (:mod:`svmkit.resources._cpool`): the pool's C hot path counts there directly.

``taken(nbytes)`` counts an allocation handed out, ``returned(nbytes)`` one given back,
``snapshot()`` gives the six figures as a dict (take it under the lock that guards
updates); ``current_bytes``, ``peak_bytes``, ``total_bytes``, ``current_allocations``,
``peak_allocations`` and ``total_allocations`` read them one by one.
"""

from __future__ import annotations

from svmkit.resources._cpool import AllocationCounters

__all__ = ["AllocationCounters"]
