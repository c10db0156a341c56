"""Release epochs: memory that a queue's invisible commands may use goes back after one
marker per burst of releases.

Commands svmkit does not see (``pyopencl.array``'s) may still use memory when it is
released.  A marker enqueued on their queue after the release completes after every one of
them: spec, ``clEnqueueMarkerWithWaitList``: with no wait list the marker "waits until all
previous enqueued commands to command_queue have completed" (in-order queue or not).  One
marker covers every release before it, so :class:`QueueEpochs` collects the releases of
one queue in an *open epoch* and closes it with one marker:

* after :data:`EPOCH_BLOCKS` releases, on the releasing thread;
* by the epoch thread, which runs only while some epoch holds memory, so memory never
  waits for the next release (a thread woken per release would cost its wake-up on every
  burst): every :data:`TICK_SECONDS`, it closes each epoch that did not close itself since
  the last tick; while epochs do close themselves (a busy queue) it only frees and ticks
  less often, doubling the interval up to :data:`TICK_MAX_SECONDS`;
* at :func:`svmkit.events.drain` (a hook), which a pool runs before it reports running
  out of memory, and which tests use.

A closed epoch's items are freed once its marker completed: polled at the next close, by
the epoch thread's next tick, or after a drain by the release thread
(:func:`~svmkit.events.release.release_after`).  A release of :data:`EPOCH_BYTES` or more
gets a marker of its own and goes back to its resource at once, as pending on that
marker (a pool polls it when it needs the block), so large blocks never wait for company.
Nothing is freed before a marker enqueued after its release completed, so memory never
goes back under a running command of the queue.
"""

from __future__ import annotations

import collections
import logging
import queue as _queue
import threading
import time
import weakref
from typing import Protocol

import pyopencl as cl

from svmkit.driver import calls, fork
from svmkit.errors import SVMError
from svmkit.events.record import EventRecord, is_complete
from svmkit.events.release import (
    EXIT_WAIT_SECONDS,
    before_drain,
    collecting,
    release_after,
    shutting_down,
)
from svmkit.events.shutdown import at_shutdown

__all__ = [
    "EPOCH_BLOCKS",
    "EPOCH_BYTES",
    "TICK_MAX_SECONDS",
    "TICK_SECONDS",
    "QueueEpochs",
    "queue_epochs",
    "reap_completed",
]

log = logging.getLogger("svmkit.events")

EPOCH_BLOCKS = 32
"""Releases an open epoch collects before it closes on the releasing thread."""

EPOCH_BYTES = 1 << 20
"""A release at least this large gets a marker of its own (cheap beside the work such a
block serves)."""

TICK_SECONDS = 0.005
"""How often the epoch thread closes open epochs and frees completed ones, while any
epoch holds memory."""

TICK_MAX_SECONDS = 0.08
"""The longest interval between ticks while every epoch closes itself."""


class Releasable(Protocol):
    """What an epoch holds (an :class:`~svmkit.resources.base.Allocation`)."""

    @property
    def nbytes(self) -> int: ...

    @property
    def events(self) -> EventRecord: ...

    def free(self) -> None: ...


class QueueEpochs:
    """The release epochs of one command queue (see the module documentation).

    :meth:`release` takes no lock and, but every :data:`EPOCH_BLOCKS`-th time, enqueues
    nothing (a list append), so it is safe in finalizers, inside a garbage collection
    included.
    """

    __slots__ = (
        "__weakref__",
        "_closed",
        "_closes",
        "_lock",
        "_ticked",
        "orphaned",
        "queue",
        "released",
    )
    svmkit_exit_events = "pending_events"  # waited for at exit (svmkit.events.exit_wait)
    ticking = False
    """Whether the epoch thread runs its ticks (a release need not wake it): one flag for
    every queue, read by a finaliser's inline release (see :meth:`release`)."""

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.queue = queue
        self.released: list[Releasable] = []
        """The open epoch: released since the last marker, oldest first.  Only a closer
        removes items; a finaliser may append one and call :meth:`after_append` (what
        :meth:`release` does for a small item, inline)."""
        # (marker, what it covers), oldest first; None: nothing left to wait for
        self._closed: collections.deque[tuple[cl.Event | None, list[Releasable]]] = (
            collections.deque()
        )
        self._lock = threading.Lock()  # closing and reaping (never held while freeing)
        self._closes = 0  # epochs closed so far
        self._ticked = 0  # _closes as the epoch thread's last tick left it
        self.orphaned = False  # the parent's, in a forked child: never released there
        _live.add(self)
        _ensure_epoch_thread()

    def release(self, item: Releasable) -> None:
        """Free ``item`` once every command enqueued on the queue before this call
        completed.

        For an item smaller than :data:`EPOCH_BYTES` this is ``released.append(item)``,
        then :meth:`after_append` when the open epoch is full or
        :attr:`ticking` is clear: a finaliser may run those steps inline.
        """
        if item.nbytes >= EPOCH_BYTES and not collecting():
            self._release_alone(item)
            return
        released = self.released
        released.append(item)
        if len(released) >= EPOCH_BLOCKS or not QueueEpochs.ticking:
            self.after_append()

    def after_append(self) -> None:
        """After an append to :attr:`released`: close a full epoch, wake the epoch thread
        (the flag is read after the append: see ``_tick``)."""
        if len(self.released) >= EPOCH_BLOCKS and not collecting():
            self.close()  # (inside a collection the epoch thread does it)
        if not QueueEpochs.ticking:
            _start_ticking()

    def _release_alone(self, item: Releasable) -> None:
        """A large block: its own marker, recorded on it; its resource keeps it pending."""
        if shutting_down() or self.orphaned:
            return  # at exit svmkit calls no driver any more
        marker = self._marker()
        if marker is not None:
            item.events.record(marker)
        item.free()

    def close(self) -> None:
        """Close the open epoch with one marker, then free the closed epochs whose marker
        completed."""
        if shutting_down() or self.orphaned:
            return  # at exit svmkit calls no driver any more
        with self._lock:
            open_ = self.released
            n = len(open_)
            if n:
                # Only a closer removes items, under this lock, so the first n are the
                # ones counted; each was released before the marker below is enqueued.
                batch = open_[:n]
                del open_[:n]
                self._closed.append((self._marker(), batch))
                self._closes += 1
        self.reap()

    def _marker(self) -> cl.Event | None:
        """A marker after every command enqueued so far; ``None`` once they are known to
        have completed (the queue failed and was waited for instead)."""
        try:
            return calls.enqueue_marker(self.queue)
        except SVMError:
            calls.finish(self.queue)  # raises if the queue is lost: then nothing goes back
            return None

    def reap(self) -> None:
        """Free the items of every closed epoch whose marker completed (oldest first: a
        marker completes after every earlier command, earlier markers included)."""
        done: list[Releasable] = []
        with self._lock:
            closed = self._closed
            while closed:
                marker = closed[0][0]
                if marker is not None and not is_complete(marker):
                    break
                done += closed.popleft()[1]
        for item in done:
            try:
                item.free()
            except Exception:  # one failed free must not keep the others
                log.exception("returning memory after its queue's marker failed")

    def tick(self) -> bool:
        """The epoch thread's turn: close the open epoch unless this queue closed one
        itself since the last tick (then only free); whether it had."""
        busy = self._closes != self._ticked
        if busy:
            self.reap()
        else:
            self.close()
        self._ticked = self._closes
        return busy

    def flush(self) -> None:
        """Close the open epoch and hand freeing everything, once its marker completed, to
        the release thread (what :func:`svmkit.events.drain` then waits for)."""
        self.close()
        with self._lock:
            last = self._closed[-1][0] if self._closed else None
        if last is not None:
            release_after([last], self.reap, background=True)

    def holds(self) -> bool:
        """Whether released items wait here (open or closed epochs)."""
        return bool(self.released) or bool(self._closed)

    def pending(self) -> int:
        """How many released items wait here (open and closed epochs)."""
        with self._lock:
            return len(self.released) + sum(len(batch) for _, batch in self._closed)

    def pending_events(self) -> list[cl.Event]:
        """The markers closed epochs wait for."""
        return [m for m, _ in list(self._closed) if m is not None]


def reap_completed() -> bool:
    """Free, on this thread, the items of every queue's closed epochs whose marker has
    completed; whether any epoch held closed items.  A pool runs this before it grows: a
    marker's status costs a query, a new block a ``clSVMAlloc`` (about 0.8 ms on NVIDIA's
    OpenCL), and blocks an epoch covers otherwise wait for the next close or tick."""
    if shutting_down():
        return False  # at exit svmkit calls no driver any more
    held = False
    for epochs in _every_queue():
        if epochs._closed and not epochs.orphaned:
            held = True
            epochs.reap()
    return held


def queue_epochs(queue: cl.CommandQueue) -> QueueEpochs:
    """The release epochs of ``queue`` (one per queue, kept on the queue object; never call
    this from a finalizer: it may start the epoch thread)."""
    try:
        epochs: QueueEpochs = queue._svmkit_epochs
        return epochs
    except AttributeError:
        epochs = QueueEpochs(queue)
        try:
            queue._svmkit_epochs = epochs
        except AttributeError:  # a queue type without attributes: epochs of its own
            pass
        return epochs


# -- the epoch thread ----------------------------------------------------------------------
_live: weakref.WeakSet[QueueEpochs] = weakref.WeakSet()


def _every_queue() -> list[QueueEpochs]:
    """The live :class:`QueueEpochs`, a snapshot (another thread may add one while a
    WeakSet is copied: then the copy raises, and is taken again)."""
    while True:
        try:
            return list(_live)
        except RuntimeError:  # "set changed size during iteration"
            continue


_wake: _queue.SimpleQueue[None] = _queue.SimpleQueue()  # put is safe in finalizers
_interval = TICK_SECONDS  # the epoch thread's next pause
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()
_tick_lock = threading.Lock()  # held while a tick works (interpreter exit waits for it)
_stopped = False  # interpreter exit: the epoch thread calls no driver any more


def _start_ticking() -> None:
    QueueEpochs.ticking = True
    _wake.put(None)


def _ensure_epoch_thread() -> None:
    global _thread
    thread = _thread
    if thread is not None and thread.is_alive():
        return
    with _thread_lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="svmkit-epochs", daemon=True)
            _thread.start()


def _run() -> None:
    while True:
        _wake.get()  # idle: no epoch holds anything
        while _tick():
            pass


def _tick() -> bool:
    """One tick: close idle open epochs, free the completed ones; whether to tick again."""
    time.sleep(_interval)
    with _tick_lock:
        if _stopped or shutting_down():
            return False
        return _tick_epochs()


def _tick_epochs() -> bool:
    global _interval
    # Cleared before the epochs are looked at: a release whose item this tick may miss
    # finds the flag clear and wakes the thread again.
    QueueEpochs.ticking = False
    every = _every_queue()
    busy = False
    for epochs in every:
        try:
            if epochs.holds():
                busy = epochs.tick() or busy
        except Exception:
            log.exception("closing a queue's release epoch failed")
    _interval = min(2 * _interval, TICK_MAX_SECONDS) if busy else TICK_SECONDS
    if any(epochs.holds() for epochs in every):
        QueueEpochs.ticking = True
        return True
    _interval = TICK_SECONDS
    return False


def _stop() -> None:
    """At interpreter exit, before svmkit's last drain: the epoch thread stops (after the
    tick it may be working on; the drain hook below then closes the epochs)."""
    global _stopped
    acquired = _tick_lock.acquire(timeout=EXIT_WAIT_SECONDS)
    try:
        _stopped = True
    finally:
        if acquired:
            _tick_lock.release()


at_shutdown(_stop)


def _flush_all() -> None:
    for epochs in _every_queue():
        epochs.flush()


before_drain(_flush_all)


def _forget_parent_epochs() -> None:
    """In a forked child: the parent's epochs never release there, and no thread runs."""
    global _live, _wake, _thread, _interval
    for epochs in list(_live):
        epochs.orphaned = True
    fork.keep(list(_live))
    _live = weakref.WeakSet()
    _wake = _queue.SimpleQueue()
    QueueEpochs.ticking = False
    _interval = TICK_SECONDS
    _thread = None


fork.in_child(_forget_parent_epochs)
