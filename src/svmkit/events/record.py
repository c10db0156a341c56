"""Event ordering: per-allocation pending events and wait-list checks.

svmkit orders freeing after use the way RMM orders it after streams, with OpenCL events:
every command svmkit enqueues on an allocation records its event there
(:class:`EventRecord`); a free hands those events to
:func:`svmkit.events.release.release_after`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import pyopencl as cl

from svmkit.driver import calls
from svmkit.errors import InvalidContextError, InvalidValueError

__all__ = [
    "EventRecord",
    "WaitFor",
    "check_wait_for",
    "check_wait_status",
    "in_order",
    "is_complete",
    "wait_list",
    "wait_pending",
]

WaitFor = Sequence[cl.Event] | None

_PRUNE_AT = 8

is_complete = calls.event_complete
"""Whether an event finished (an error status counts as finished): the driver's status
query itself (:func:`svmkit.driver.calls.event_complete`), with no call in between."""


class EventRecord:
    """The events of commands that used an allocation and may not have finished.

    Recording is O(1) amortised: completed events are pruned when the list reaches a
    limit, and the limit then becomes twice what is left, so a burst of commands that
    have not finished (enqueue-only loops) does not rescan the list on every record.

    With ``queue`` given and in order, only the queue's latest event is kept: it
    completes after every earlier command of that queue, so recording makes no OpenCL
    call at all (status queries contend with the driver's worker threads).  The first
    in-order queue seen has a slot of its own (``_queue``/``_event``: an identity test
    and one store, no hashing), the others a dictionary.
    """

    __slots__ = ("_event", "_events", "_latest", "_limit", "_lock", "_queue")
    svmkit_exit_events = "pending"  # waited for at exit (svmkit.events.exit_wait)

    def __init__(self) -> None:
        self._events: list[cl.Event] = []
        self._queue: cl.CommandQueue | None = None  # the first in-order queue seen...
        self._event: cl.Event | None = None  # ...and its latest event
        self._latest: dict[cl.CommandQueue, cl.Event] = {}  # the other in-order queues'
        self._limit = _PRUNE_AT
        self._lock = threading.Lock()

    def record(self, event: cl.Event, queue: cl.CommandQueue | None = None) -> None:
        """Remember that ``event`` (enqueued on ``queue``, if known) uses the allocation."""
        if queue is self._queue and queue is not None:
            self._event = event  # one store: the newest event of the in-order queue
            return
        if queue is not None:
            try:
                ordered = queue._svmkit_in_order  # (in_order's cache, read inline)
            except AttributeError:
                ordered = in_order(queue)
            if ordered:
                with self._lock:  # (claiming the slot must not race another queue's claim)
                    if self._queue is None:
                        self._event = event
                        self._queue = queue
                        return
                    if self._queue is queue:
                        self._event = event
                        return
                self._latest[queue] = event  # one atomic store
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
        return self._pending_events(None)

    def pending_for(self, queue: cl.CommandQueue) -> list[cl.Event]:
        """What a command enqueued on ``queue`` must wait for: :meth:`pending`, less the
        latest event of ``queue`` itself when it executes in order (the queue already
        runs the command after it, so its status is not even queried)."""
        if not self._events and not self._latest and self._queue is queue:
            return []  # (only this in-order queue's own latest event: the common case)
        return self._pending_events(queue if in_order(queue) else None)

    def _pending_events(self, skip: cl.CommandQueue | None) -> list[cl.Event]:
        """The incomplete recorded events, but for the latest of queue ``skip``; prunes the
        completed ones of the unordered list."""
        latest = [e for q, e in list(self._latest.items()) if q is not skip and not is_complete(e)]
        first, queue = self._event, self._queue
        if first is not None and queue is not skip and not is_complete(first):
            latest.append(first)
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
            first, self._event, self._queue = self._event, None, None
        events.extend(latest.values())
        if first is not None:
            events.append(first)
        return [e for e in events if not is_complete(e)]

    def __bool__(self) -> bool:
        return bool(self._events) or self._queue is not None or bool(self._latest)

    def __len__(self) -> int:
        return len(self._events) + (self._queue is not None) + len(self._latest)


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


def check_wait_for(
    context: cl.Context, wait_for: Iterable[cl.Event] | None, what: str | None = None
) -> list[cl.Event]:
    """Validate a ``wait_for`` list: events of ``context`` only; with ``what`` (the command
    that waits), none failed either, in the same walk.

    Spec (every ``clEnqueueSVM*``): ``CL_INVALID_CONTEXT`` "if context associated with
    command_queue and events in event_wait_list are not the same"; ``CL_INVALID_EVENT_WAIT_LIST``
    for entries that are not events.  The failed-event rule is
    :func:`check_wait_status`'s; the walk runs it for an event whose status
    query (one driver call, as that rule makes) answers an error.
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
        if what is not None and calls.event_status(event) < 0:
            check_wait_status([event], what)
    return events


def check_wait_status(events: list[cl.Event] | None, what: str) -> None:
    """Spec (blocking clEnqueueSVMMemcpy/clEnqueueSVMMap):
    ``CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST`` if an event of the wait list has a
    negative (error) status.  Checked before enqueueing every command, of every size and
    blocking or not: PoCL never runs, nor fails, a command behind a failed event, so
    waiting for it would hang, and so would the release of the memory it uses."""
    if events:
        calls.raise_for_failed(events, f"{what} waits for an event that failed")


def wait_list(
    context: cl.Context, wait_for: WaitFor, what: str | None = None
) -> list[cl.Event] | None:
    """``wait_for`` checked by :func:`check_wait_for` (with ``what``: no event failed), as
    PyOpenCL takes it (``None`` when empty)."""
    return check_wait_for(context, wait_for, what) or None if wait_for is not None else None


def wait_pending(events: Sequence[cl.Event]) -> None:
    """Block until every event in ``events`` completed (no-op for an empty list)."""
    if events:
        calls.wait_for_events(list(events))
