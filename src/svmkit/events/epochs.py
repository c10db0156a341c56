"""Release epochs: memory that a queue's invisible commands may use goes back after one
marker per burst of releases.

Commands svmkit does not see (``pyopencl.array``'s) may still use memory when it is
released.  A marker enqueued on their queue after the release completes after every one of
them: spec, ``clEnqueueMarkerWithWaitList``: with no wait list the marker "waits until all
previous enqueued commands to command_queue have completed" (in-order queue or not).  One
marker covers every release before it, so :class:`QueueEpochs` collects the releases of
one queue in an *open epoch* and closes it with one marker:

* after :data:`EPOCH_BLOCKS` releases, or at a release of :data:`EPOCH_BYTES` or more
  (the memory waiting in an open epoch stays bounded), on the releasing thread;
* soon after the first release of a burst, on svmkit's release thread, so memory never
  waits for the next release (and :func:`svmkit.events.drain`, which a pool runs before it
  reports running out of memory, covers it).

A closed epoch's items are freed once its marker completed: polled at the next close, or
by the release thread (:func:`~svmkit.events.release.release_after`).  Nothing is freed
before its epoch's marker completed, so memory never goes back under a running command of
the queue.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Protocol

import pyopencl as cl

from svmkit.driver import calls
from svmkit.errors import SVMError
from svmkit.events.record import is_complete
from svmkit.events.release import collecting, release_after, release_soon, shutting_down

__all__ = ["EPOCH_BLOCKS", "EPOCH_BYTES", "QueueEpochs", "queue_epochs"]

log = logging.getLogger("svmkit.events")

EPOCH_BLOCKS = 32
"""Releases an open epoch collects before it closes on the releasing thread."""

EPOCH_BYTES = 1 << 20
"""A release at least this large closes its epoch at once (its marker is cheap beside
the work such a block serves, and large blocks do not wait for company)."""


class Releasable(Protocol):
    """What an epoch holds: ``nbytes`` and a ``free()`` that gives the memory back."""

    @property
    def nbytes(self) -> int: ...

    def free(self) -> None: ...


class QueueEpochs:
    """The release epochs of one command queue (see the module documentation).

    :meth:`release` takes no lock and enqueues nothing in the common case (a list append),
    so it is safe in finalizers, inside a garbage collection included.
    """

    __slots__ = ("_closed", "_flush", "_lock", "_open", "_scheduled", "queue")

    def __init__(self, queue: cl.CommandQueue) -> None:
        self.queue = queue
        self._open: list[Releasable] = []  # released since the last marker, oldest first
        self._closed: collections.deque[tuple[cl.Event | None, list[Releasable]]] = (
            collections.deque()
        )  # (marker, what it covers), oldest first; None: nothing left to wait for
        self._lock = threading.Lock()  # closing and reaping (never held while freeing)
        self._scheduled = False  # a flush is in the release thread's inbox
        self._flush = self.flush  # (bound once: release hands it over without allocating)

    def release(self, item: Releasable) -> None:
        """Free ``item`` once every command enqueued on the queue before this call
        completed."""
        open_ = self._open
        open_.append(item)
        if not self._scheduled:  # (read after the append: see flush)
            self._scheduled = True
            release_soon(self._flush)
        if (len(open_) >= EPOCH_BLOCKS or item.nbytes >= EPOCH_BYTES) and not collecting():
            self.close()  # (inside a collection the flush handed over above does it)

    def close(self) -> None:
        """Close the open epoch with one marker, then free the closed epochs whose marker
        completed."""
        if shutting_down():
            return  # at exit svmkit calls no driver any more
        with self._lock:
            open_ = self._open
            n = len(open_)
            if n:
                # Only a closer removes items, under this lock, so the first n are the
                # ones counted; each was released before the marker below is enqueued.
                batch = open_[:n]
                del open_[:n]
                self._closed.append((self._marker(), batch))
        self.reap()

    def _marker(self) -> cl.Event | None:
        """A marker after every command enqueued so far; ``None`` once they are known to
        have completed (the queue failed and was waited for instead)."""
        try:
            return calls.enqueue_marker(self.queue)
        except SVMError:
            self.queue.finish()  # raises if the queue is lost: then nothing goes back
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

    def flush(self) -> None:
        """Close the open epoch and free everything once its marker completed, in the
        background (run by the release thread; :meth:`release` hands it over)."""
        # Cleared before closing: a release whose append the close may miss finds the
        # flag clear and hands over another flush.
        self._scheduled = False
        try:
            self.close()
        except Exception:
            log.exception("closing a queue's release epoch failed")
        with self._lock:
            last = self._closed[-1][0] if self._closed else None
        if last is not None:
            release_after([last], self.reap, background=True)

    def pending(self) -> int:
        """How many released items wait for a marker (open and closed epochs)."""
        with self._lock:
            return len(self._open) + sum(len(batch) for _, batch in self._closed)


def queue_epochs(queue: cl.CommandQueue) -> QueueEpochs:
    """The release epochs of ``queue`` (one per queue, kept on the queue object)."""
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
