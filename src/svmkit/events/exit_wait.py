"""At interpreter exit, wait a bounded time for the commands svmkit recorded.

A process that exits while its kernels still run tears the driver down under them
(Intel's CPU runtime then crashes after Python has finalised: exit status -11 with no
traceback).  svmkit records the event of every command it enqueues on the memory the
command uses (:class:`~svmkit.events.record.EventRecord`), and pools keep the events of
freed blocks; at exit those records are found among the live objects and their events
polled until they complete or :data:`~svmkit.events.release.EXIT_WAIT_SECONDS` pass.
Classes that hold such events say so with a class attribute ``svmkit_exit_events``
naming a method that returns them (so this layer needs no import from above).
"""

from __future__ import annotations

import gc
import logging
import time

import pyopencl as cl

from svmkit.errors import SVMError
from svmkit.events.record import is_complete

__all__ = ["wait_for_recorded_work"]

log = logging.getLogger("svmkit.events")


def _recorded_events() -> list[cl.Event]:
    events: list[cl.Event] = []
    for obj in gc.get_objects():
        method = getattr(type(obj), "svmkit_exit_events", None)
        if isinstance(method, str):
            try:
                events.extend(getattr(obj, method)())
            except Exception:  # a half-built object: nothing to wait for
                continue
    return events


def wait_for_recorded_work(timeout: float) -> bool:
    """Poll every recorded, incomplete event until all completed or ``timeout`` passed
    (False then); never blocks inside the driver."""
    deadline = time.monotonic() + timeout
    try:
        events = [e for e in _recorded_events() if not is_complete(e)]
    except SVMError:
        return False
    pause = 0.0005
    while events:
        if time.monotonic() >= deadline:
            log.warning("exiting with %d svmkit commands still running", len(events))
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
        events = [e for e in events if not is_complete(e)]
    return True
