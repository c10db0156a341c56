"""The release thread: memory goes back only after the commands that used it finished.

:func:`release_after` runs a release once its events completed, on a background thread
when any is still pending, in the order the releases were asked for, never blocking the
caller and never calling OpenCL from a driver callback thread.  Interpreter exit
(:mod:`svmkit.events.shutdown`) drains it for a bounded time and then stops releasing.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyopencl as cl

from svmkit.events.record import is_complete

__all__ = ["EXIT_WAIT_SECONDS", "drain", "release_after", "shutting_down", "stop_releasing"]

log = logging.getLogger("svmkit.events")

_releases: collections.deque[tuple[list[cl.Event], Callable[[], Any]]] = collections.deque()
_releases_cond = threading.Condition()
_reaper: threading.Thread | None = None
_shutting_down = False
EXIT_WAIT_SECONDS = 5.0


def shutting_down() -> bool:
    """True once the interpreter is exiting: memory is then no longer released."""
    return _shutting_down


def release_after(
    events: Sequence[cl.Event], release: Callable[[], Any], *, background: bool = False
) -> None:
    """Run ``release()`` once every event in ``events`` completed.

    With no pending event it runs now, on the caller's thread (unless ``background``);
    otherwise a background thread waits for the events and runs it, in the order the
    releases were asked for, so the caller never blocks.
    """
    if _shutting_down:
        return
    pending = [e for e in events if not is_complete(e)]
    if not pending and not background:
        release()
        return
    global _reaper
    with _releases_cond:
        _releases.append((pending, release))
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, name="svmkit-release", daemon=True)
            _reaper.start()
        _releases_cond.notify()


def _reap() -> None:
    while True:
        with _releases_cond:
            while not _releases:
                _releases_cond.wait()
            events, release = _releases[0]
        try:
            if events:
                cl.wait_for_events(events)
        except cl.Error:
            log.warning("an event svmkit waited on before releasing memory failed", exc_info=True)
        with _releases_cond:
            _releases.popleft()
            if _shutting_down:
                _releases_cond.notify_all()
                continue
        try:
            release()
        except Exception:  # a release must never kill the reaper
            log.exception("releasing SVM memory failed")
        with _releases_cond:
            _releases_cond.notify_all()


def drain(timeout: float | None = None) -> bool:
    """Wait until every deferred release ran; False if ``timeout`` passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _releases_cond:
        while _releases:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            _releases_cond.wait(remaining)
    return True


def stop_releasing() -> None:
    """From now on no memory is released (interpreter exit, after the bounded drain)."""
    global _shutting_down
    _shutting_down = True
