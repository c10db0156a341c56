"""Event ordering: per-allocation pending events, wait-list checks, deferred release.

svmkit orders freeing after use the way RMM orders it after streams, with OpenCL events:
every command svmkit enqueues on an allocation records its event there
(:class:`EventRecord`); a free hands those events to :func:`release_after`, which runs the
release on a background thread once they completed, never blocking the caller and never
calling OpenCL from a driver callback thread.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyopencl as cl

from svmkit.errors import InvalidContextError, InvalidValueError

__all__ = [
    "EventRecord",
    "check_wait_for",
    "is_complete",
    "release_after",
    "shutting_down",
    "wait_pending",
]

log = logging.getLogger(__name__)

_COMPLETE = cl.command_execution_status.COMPLETE
_PRUNE_AT = 8


def is_complete(event: cl.Event) -> bool:
    """Whether ``event`` finished (an error status counts as finished)."""
    return bool(event.command_execution_status <= _COMPLETE)


class EventRecord:
    """The events of commands that used an allocation and may not have finished.

    Recording is O(1) amortised: completed events are pruned when the list reaches a
    limit, and the limit then becomes twice what is left, so a burst of commands that
    have not finished (enqueue-only loops) does not rescan the list on every record.

    With ``queue`` given and in order, only the queue's latest event is kept: it
    completes after every earlier command of that queue, so recording makes no OpenCL
    call at all (status queries contend with the driver's worker threads).
    """

    __slots__ = ("_events", "_latest", "_limit", "_lock")

    def __init__(self) -> None:
        self._events: list[cl.Event] = []
        self._latest: dict[cl.CommandQueue, cl.Event] = {}
        self._limit = _PRUNE_AT
        self._lock = threading.Lock()

    def record(self, event: cl.Event, queue: cl.CommandQueue | None = None) -> None:
        """Remember that ``event`` (enqueued on ``queue``, if known) uses the allocation."""
        if queue is not None and in_order(queue):
            self._latest[queue] = event  # one atomic store: the newest event of the queue
            return
        with self._lock:  # an append racing a prune must not be lost
            events = self._events
            events.append(event)
            if len(events) >= self._limit:
                live = [e for e in events if not is_complete(e)]
                self._events = live
                self._limit = max(_PRUNE_AT, 2 * len(live))

    def pending(self) -> list[cl.Event]:
        """The recorded events that have not completed yet (pruning the rest)."""
        latest = [e for e in list(self._latest.values()) if not is_complete(e)]
        if not self._events:
            return latest
        with self._lock:
            live = [e for e in self._events if not is_complete(e)]
            self._events = live
        return live + latest

    def take(self) -> list[cl.Event]:
        """Every pending event, leaving the record empty (used when freeing)."""
        with self._lock:
            events, self._events = self._events, []
            latest, self._latest = self._latest, {}
        events.extend(latest.values())
        return [e for e in events if not is_complete(e)]

    def __bool__(self) -> bool:
        return bool(self._events) or bool(self._latest)

    def __len__(self) -> int:
        return len(self._events) + len(self._latest)


def in_order(queue: cl.CommandQueue) -> bool:
    """Whether ``queue`` executes in order (cached on the queue object)."""
    try:
        return queue._svmkit_in_order  # type: ignore[no-any-return]
    except AttributeError:
        value = not queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
        try:
            queue._svmkit_in_order = value
        except AttributeError:
            pass
        return bool(value)


def check_wait_for(context: cl.Context, wait_for: Iterable[cl.Event] | None) -> list[cl.Event]:
    """Validate a ``wait_for`` list: events of ``context`` only.

    Spec (every ``clEnqueueSVM*``): ``CL_INVALID_CONTEXT`` "if context associated with
    command_queue and events in event_wait_list are not the same"; ``CL_INVALID_EVENT_WAIT_LIST``
    for entries that are not events.
    """
    if wait_for is None:
        return []
    events = list(wait_for)
    for event in events:
        if not isinstance(event, cl.Event):
            raise InvalidValueError(
                f"wait_for must hold pyopencl.Event objects, got {type(event).__name__}",
                cl_error="CL_INVALID_EVENT_WAIT_LIST",
            )
        if event.context != context:
            raise InvalidContextError(
                "an event in wait_for belongs to another context than the queue"
            )
    return events


def wait_pending(events: Sequence[cl.Event]) -> None:
    """Block until every event in ``events`` completed (no-op for an empty list)."""
    if events:
        cl.wait_for_events(list(events))


# --- deferred release -------------------------------------------------------------------

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


_exit_hooks: list[Callable[[], None]] = []


def at_shutdown(hook: Callable[[], None]) -> None:
    """Register ``hook`` to run at interpreter exit, before svmkit stops releasing memory."""
    _exit_hooks.append(hook)


@atexit.register
def _shutdown() -> None:
    global _shutting_down
    for hook in reversed(_exit_hooks):
        try:
            hook()
        except Exception:
            log.exception("svmkit exit hook failed")
    drain(EXIT_WAIT_SECONDS)
    _shutting_down = True
