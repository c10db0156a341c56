"""Ordering by OpenCL events: what used an allocation, when it may go back, map state.

* :mod:`~svmkit.events.record`: per-allocation pending events, wait-list checks;
* :mod:`~svmkit.events.release`: the release thread that returns memory after its events;
* :mod:`~svmkit.events.shutdown`: interpreter exit hooks;
* :mod:`~svmkit.events.mapstate`: which byte ranges of a coarse-grain allocation are mapped.
"""

from svmkit.events.record import EventRecord, check_wait_for, in_order, is_complete, wait_pending
from svmkit.events.release import drain, release_after, shutting_down
from svmkit.events.shutdown import at_shutdown

__all__ = [
    "EventRecord",
    "at_shutdown",
    "check_wait_for",
    "drain",
    "in_order",
    "is_complete",
    "release_after",
    "shutting_down",
    "wait_pending",
]
