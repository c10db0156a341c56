"""Interpreter exit: close what must close, wait a bounded time, then stop releasing.

Hooks registered with :func:`at_shutdown` (the work queues close themselves) run first;
then svmkit waits a bounded time for the commands it recorded
(:mod:`svmkit.events.exit_wait`), then the release thread gets
:data:`~svmkit.events.release.EXIT_WAIT_SECONDS` to finish pending releases, after
which svmkit stops releasing memory rather than risk a driver call while the interpreter
and the drivers tear down.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable

from svmkit.events.exit_wait import wait_for_recorded_work
from svmkit.events.release import EXIT_WAIT_SECONDS, drain, stop_releasing

__all__ = ["at_shutdown"]

log = logging.getLogger("svmkit.events")

_exit_hooks: list[Callable[[], None]] = []


def at_shutdown(hook: Callable[[], None]) -> None:
    """Register ``hook`` to run at interpreter exit, before svmkit stops releasing memory."""
    _exit_hooks.append(hook)


@atexit.register
def _shutdown() -> None:
    for hook in reversed(_exit_hooks):
        try:
            hook()
        except Exception:
            log.exception("svmkit exit hook failed")
    wait_for_recorded_work(EXIT_WAIT_SECONDS)  # kernels still running: let them end
    drain(EXIT_WAIT_SECONDS)
    stop_releasing()
