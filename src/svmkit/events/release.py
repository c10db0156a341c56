"""The release thread: memory goes back only after the commands that used it finished.

:func:`release_after` runs a release once its events completed, on a background thread
when any is still pending, in the order the releases were asked for, never blocking the
caller and never calling OpenCL from a driver callback thread.  :func:`release_soon` hands
a release over from a finalizer (an export dying, perhaps inside a garbage collection
that interrupted a pool holding its lock): it takes no lock at all, only appends the
release to the hand-off list (a :class:`collections.deque`, whose ``append`` is atomic)
and wakes the thread through its inbox (:class:`queue.SimpleQueue`, whose ``put`` is
reentrant and safe in finalizers).  Interpreter exit (:mod:`svmkit.events.shutdown`)
drains it for a bounded time and then stops releasing.

:func:`settle` is what statistics read first, so that no figure lags behind the release
thread: the calling thread runs the hand-offs not yet claimed itself, waits for those
another thread is running, and waits while the release thread runs queued releases whose
events already completed.  Each hand-off runs once, on whichever thread pops it first.
"""

from __future__ import annotations

import collections
import gc
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyopencl as cl

from svmkit.driver import fork
from svmkit.errors import SVMError
from svmkit.events.record import is_complete

__all__ = [
    "EXIT_WAIT_SECONDS",
    "before_drain",
    "collecting",
    "drain",
    "ensure_release_thread",
    "handoff",
    "release_after",
    "release_soon",
    "settle",
    "shutting_down",
    "stop_releasing",
]

log = logging.getLogger("svmkit.events")

_releases: collections.deque[tuple[list[cl.Event], Callable[[], Any]]] = collections.deque()
_releases_cond = threading.Condition()
# What wakes the release thread: a _WAKE token after each release_after and each hand-off,
# or a drain marker.  SimpleQueue.put takes no Python-level lock.
_inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
_WAKE = object()
# Releases handed over by finalizers (release_soon, handoff), oldest first: appended
# without a lock, popped (atomically) by the release thread or by a settle()-ing reader.
_handoffs: collections.deque[Any] = collections.deque()
_tickets = itertools.count()  # (next() is atomic)
_claims: dict[int, int] = {}  # ticket -> thread id, while that thread claims or runs one
_settled = threading.Condition(threading.Lock())  # notified when a thread stops running them
_settling = 0  # threads waiting on _settled (under it)
_reaper: threading.Thread | None = None
_busy = False  # a release is running on the release thread right now
_running = threading.Lock()  # held by the release thread while a release runs
_shutting_down = False
EXIT_WAIT_SECONDS = 5.0
_drain_hooks: list[Callable[[], Any]] = []


class _Marker:
    """A drain marker: set once the release thread reached it in its inbox."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


_collections = 0  # garbage collections in progress (gc.callbacks)


def _gc_phase(phase: str, info: dict[str, Any]) -> None:
    global _collections
    _collections = _collections + 1 if phase == "start" else max(0, _collections - 1)


gc.callbacks.append(_gc_phase)


def collecting() -> bool:
    """Whether a garbage collection is running: a finaliser then may have interrupted
    any code, a pool holding its lock included, and must not take locks."""
    return _collections > 0


def release_thread_running() -> bool:
    """Whether the release thread runs (:func:`release_soon` needs it)."""
    reaper = _reaper
    return reaper is not None and reaper.is_alive()


def shutting_down() -> bool:
    """True once the interpreter is exiting: memory is then no longer released."""
    return _shutting_down


def ensure_release_thread() -> None:
    """Start the release thread if it is not running (never call this from a finalizer)."""
    global _reaper
    reaper = _reaper
    if reaper is not None and reaper.is_alive():
        return  # the common case, without the lock
    with _releases_cond:
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reap, name="svmkit-release", daemon=True)
            _reaper.start()


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
    with _releases_cond:
        _releases.append((pending, release))
    ensure_release_thread()
    _inbox.put(_WAKE)


def release_soon(release: Callable[[], Any]) -> None:
    """Run ``release()`` on the release thread; safe in finalizers and weakref callbacks.

    Takes no lock (a finalizer may run inside a garbage collection that interrupted a
    thread holding any lock); the release thread must already run
    (:func:`ensure_release_thread`, called when the object to be finalized was made).
    A reader of statistics may run it first (:func:`settle`), on its own thread.
    """
    _handoffs.append(release)
    _inbox.put(_WAKE)


def handoff(item: Any) -> None:
    """Hand ``item`` over for ``item.run_release()``, on the release thread or on a
    thread that reads statistics first (:func:`settle`): for finalizers (no lock taken).
    A finalizer calling it catches ``KeyboardInterrupt`` and hands the interrupt back to
    the main thread (Python drops exceptions raised inside a finalizer, and a Ctrl-C would
    be lost), so ``run_release`` must be a one-shot, even when two threads run it."""
    _handoffs.append(item)
    _inbox.put(_WAKE)


def _reap() -> None:
    while True:
        item = _inbox.get()
        if _handoffs:
            _run_handoffs()
        if _releases or isinstance(item, _Marker):
            _run_queued()
        if isinstance(item, _Marker):
            item.done.set()


def _run_handoffs(limit: int | None = None) -> None:
    """Claim and run the hand-offs, oldest first, until none is left (or ``limit`` ran:
    a reader runs those handed over before it read, never a steady stream after them).

    A thread takes a ticket (listed in ``_claims`` until the hand-off ran) before it pops
    one (``popleft`` is atomic), so a thread that finds the list empty knows that every
    hand-off ran or belongs to a ticket listed now.
    """
    me = threading.get_ident()
    reaper = threading.current_thread() is _reaper
    for _ in itertools.repeat(None) if limit is None else range(limit):
        ticket = next(_tickets)
        _claims[ticket] = me
        try:
            try:
                item = _handoffs.popleft()
            except IndexError:
                return
            release = getattr(item, "run_release", item)
            if reaper and not _busy:  # (busy: settle() called inside a release)
                _run(release)  # stop_releasing() waits for it
            elif not _shutting_down:
                try:
                    release()
                except Exception:  # the reader's statistics still come back
                    log.exception("releasing SVM memory failed")
        finally:
            del _claims[ticket]
            if _settling:
                with _settled:
                    _settled.notify_all()


def _wait_for_other_handoffs(deadline: float | None) -> bool:
    """Wait until the hand-offs other threads are running now ran (not those they take
    later: a steady stream of them never holds a reader up); False if ``deadline``
    passed first."""
    global _settling
    me = threading.get_ident()
    running = [t for t, thread in _claims.copy().items() if thread != me]
    if not running:
        return True
    with _settled:
        _settling += 1
        try:
            while any(t in _claims for t in running):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                _settled.wait(0.05 if remaining is None else min(remaining, 0.05))
        finally:
            _settling -= 1
    return True


def settle() -> None:
    """Bring deferred releases up to date before statistics are read.

    Runs, on the calling thread, every release finalizers handed over that no thread
    took yet, waits for those another thread is running, then waits while the release
    thread runs queued releases whose events already completed (those still waiting for
    their events stay counted).  Costs three reads when nothing is pending.  Never call
    it from a finalizer, nor while holding a lock a release takes (a resource's).
    """
    if _handoffs:
        _run_handoffs(len(_handoffs))
    if _claims:
        _wait_for_other_handoffs(None)
    if _releases and release_thread_running() and threading.current_thread() is not _reaper:
        with _releases_cond:
            while _releases and not _shutting_down:
                if not _busy and not all(is_complete(e) for e in _releases[0][0]):
                    break  # its work still runs: it stays counted
                _releases_cond.wait(0.05)


def _run(release: Callable[[], Any]) -> None:
    global _busy
    with _running:  # stop_releasing() waits for a release in progress
        if _shutting_down:
            return
        _busy = True
        try:
            release()
        except Exception:  # a release must never kill the reaper
            log.exception("releasing SVM memory failed")
        finally:
            _busy = False


def _wait_unless_exiting(events: list[cl.Event]) -> None:
    """Wait for ``events`` by polling their status (backing off to 2 ms), never inside a
    blocking driver call: at interpreter exit the release thread must not sit in
    ``clWaitForEvents`` while the interpreter and the drivers tear down (a daemon thread
    coming back from the driver then finds the interpreter gone).  Stops at exit."""
    pause = 0.00005
    while events:
        events = [e for e in events if not is_complete(e)]
        if not events or _shutting_down:
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.002)


def _run_queued() -> None:
    """Run the releases of :func:`release_after`, each once its events completed."""
    while True:
        with _releases_cond:
            if not _releases:
                _releases_cond.notify_all()
                return
            events, release = _releases[0]
        try:
            _wait_unless_exiting(events)
        except SVMError:
            log.warning("an event svmkit waited on before releasing memory failed", exc_info=True)
        _run(release)
        with _releases_cond:
            _releases.popleft()  # only now: drain() must not return while it runs
            _releases_cond.notify_all()


def before_drain(hook: Callable[[], Any]) -> None:
    """Run ``hook()`` at the start of every :func:`drain`: it hands releases that a module
    batches (:mod:`svmkit.events.epochs`) over with :func:`release_after`."""
    _drain_hooks.append(hook)


def drain(timeout: float | None = None) -> bool:
    """Wait until every deferred release ran; False if ``timeout`` passed first.

    Covers releases asked for with :func:`release_after` and those handed over by
    finalizers with :func:`release_soon` before the call (the calling thread runs those
    no thread took yet, as :func:`settle` does), and what the :func:`before_drain` hooks
    hand over.
    """
    for hook in list(_drain_hooks):
        try:
            hook()
        except Exception:
            log.exception("a drain hook failed")
    deadline = None if timeout is None else time.monotonic() + timeout
    _run_handoffs(len(_handoffs))
    if not _wait_for_other_handoffs(deadline):
        return False
    reaper = _reaper
    if reaper is not None and reaper.is_alive() and threading.current_thread() is not reaper:
        marker = _Marker()
        _inbox.put(marker)
        if not marker.done.wait(
            None if deadline is None else max(0.0, deadline - time.monotonic())
        ):
            return False
    with _releases_cond:
        while _releases or _busy:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            _releases_cond.wait(0.05 if remaining is None else min(remaining, 0.05))
    return True


def stop_releasing() -> None:
    """From now on no memory is released (interpreter exit, after the bounded drain).

    Waits (boundedly) for a release the release thread is running, so that no driver
    call is in flight while the interpreter and the drivers tear down.
    """
    global _shutting_down
    acquired = _running.acquire(timeout=EXIT_WAIT_SECONDS)
    try:
        _shutting_down = True
    finally:
        if acquired:
            _running.release()


def _forget_parent_releases() -> None:
    """In a forked child: no release thread runs, and the parent's pending releases never
    run here; a fresh inbox (the parent's release thread may have been waiting on the old
    one, which the child then cannot use)."""
    global _inbox, _reaper, _busy, _settled, _settling
    fork.keep((list(_releases), list(_handoffs), _inbox, _settled))
    _releases.clear()
    _handoffs.clear()
    _claims.clear()
    _settled = threading.Condition(threading.Lock())  # (perhaps held by a parent's thread)
    _settling = 0
    _inbox = queue.SimpleQueue()
    _reaper = None
    _busy = False


fork.in_child(_forget_parent_releases)
