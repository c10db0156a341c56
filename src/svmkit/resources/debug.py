"""Debug mode: poison freed pooled memory and catch writes to it (``SVMKIT_DEBUG=1``).

Every :class:`~svmkit.Pool` (and the default pooled resource) built while
:func:`debug_enabled` holds puts a :class:`DebugAdaptor` on top of its pool; put one over
any other stack yourself.  A freed block is filled with :data:`POISON`
(``0xDEADBEEF`` as little-endian words: an ``int32`` view reads -559038737) once the
commands recorded on it completed, so a kernel or host that reads memory after freeing
it sees an unmistakable pattern.  The poisoned block is then held back (quarantined) for
:data:`QUARANTINE` hand-outs, so a late write (a kernel svmkit was not told about, still
running) lands in poison rather than in the next array.  The poison is checked when the
block leaves the quarantine, at ``trim()``, at interpreter exit and when the pool hands
the block out again; if it changed, something wrote to freed memory (spec, clSVMFree: using memory
after it was freed is undefined) and svmkit reports, through the ``svmkit.debug`` logger
and a :class:`~svmkit.UseAfterFreeError` (``strict``), the stack that created the freed
allocation and the stack that freed it.

:func:`debug_enabled` is read once, when a pool is built: a pool built with it off has no
adaptor, so the normal path pays nothing (not even a flag test).
"""

from __future__ import annotations

import logging
import os
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from svmkit.driver import calls
from svmkit.driver.queues import default_queue
from svmkit.errors import OutOfMemoryError, UseAfterFreeError
from svmkit.events import at_shutdown, release_after
from svmkit.resources._adaptor import ResourceAdaptor
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["POISON", "QUARANTINE", "DebugAdaptor", "Poisoner", "debug_enabled", "set_debug"]

log = logging.getLogger("svmkit.debug")

POISON = np.frombuffer(np.uint32(0xDEADBEEF).tobytes(), np.uint8)  # little-endian bytes
"""The 4-byte pattern freed memory is filled with (``0xDEADBEEF`` as a little-endian word)."""

_switch: bool | None = None


def set_debug(enabled: bool | None) -> None:
    """Turn debug mode on or off for pools built from now on (``None``: follow
    ``SVMKIT_DEBUG``)."""
    global _switch
    _switch = enabled


def debug_enabled() -> bool:
    """Whether pools built now poison freed blocks (``set_debug``, else ``SVMKIT_DEBUG``)."""
    if _switch is not None:
        return _switch
    return os.environ.get("SVMKIT_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def _poison_bytes(nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
    return np.resize(POISON, nbytes)


@dataclass
class _Freed:
    block: Any  # the pool's block (the same address may later be a new upstream block)
    nbytes: int
    created: list[traceback.FrameSummary]
    freed: list[traceback.FrameSummary]


@dataclass
class _Held:
    """A poisoned block held back from its pool (the quarantine)."""

    allocation: Allocation
    freed: _Freed
    then: Callable[[Allocation], None]
    until: int  # the hand-out count at which it goes back


QUARANTINE = 16
"""Hand-outs a freed block is held back for (:class:`Poisoner`'s ``quarantine``)."""

_poisoners: weakref.WeakSet[Poisoner] = weakref.WeakSet()


class Poisoner:
    """The debug logic of :class:`DebugAdaptor`.

    ``strict``: raise :class:`~svmkit.UseAfterFreeError` on detection (else only log).
    ``quarantine``: how many hand-outs a poisoned block is held back before it goes back
    to the pool, so a write that comes late (an untracked kernel still running) lands in
    poison instead of the next array; its poison is checked when it goes back, at
    :meth:`check_quarantine` (``trim()``) and at interpreter exit.
    ``reports`` lists every detection (the message text), oldest first.
    """

    def __init__(self, *, strict: bool = True, quarantine: int = QUARANTINE) -> None:
        self.strict = strict
        self.quarantine = quarantine
        self.reports: list[str] = []
        self._lock = threading.Lock()
        self._created: dict[int, list[traceback.FrameSummary]] = {}  # id(allocation)
        self._poisoned: dict[int, _Freed] = {}  # address -> what was freed there
        self._held: deque[_Held] = deque()
        self._handouts = 0
        _poisoners.add(self)

    def allocated(self, allocation: Allocation) -> None:
        """Record the creation stack; check the poison of a block handed out again and of
        the quarantined blocks whose time is up."""
        if not allocation.nbytes:
            return
        with self._lock:
            self._handouts += 1
            freed = self._poisoned.pop(allocation.ptr, None)
            self._created[id(allocation)] = traceback.extract_stack()[:-2]
            due = self._due(self._handouts)
        problems = self._release(due)
        if freed is not None and freed.block is allocation.block:
            problem = self._check(allocation, freed)
            if problem is not None:
                problems.append(problem)
        if problems and self.strict:
            allocation.free()
            raise UseAfterFreeError(problems[0])

    def deallocate(self, allocation: Allocation, then: Callable[[Allocation], None]) -> None:
        """Poison ``allocation`` once its recorded commands finished, hold it back for
        ``quarantine`` hand-outs, then ``then(it)``."""
        with self._lock:
            created = self._created.pop(id(allocation), [])
        freed = _Freed(allocation.block, allocation.nbytes, created, traceback.extract_stack()[:-2])
        release_after(allocation.take_events(), _PoisonThen(self, allocation, freed, then))

    def check_quarantine(self) -> list[str]:
        """Check the poison of every quarantined block and let them all go back to the
        pool; the reports of this check (also in ``reports`` and on the logger)."""
        with self._lock:
            due = self._due(None)
        return self._release(due)

    def held(self) -> int:
        """How many freed blocks the quarantine holds back now."""
        return len(self._held)

    def _hold(
        self, allocation: Allocation, freed: _Freed, then: Callable[[Allocation], None]
    ) -> None:
        """Quarantine a poisoned allocation (or hand it on at once without quarantine)."""
        if not self.quarantine:
            with self._lock:
                self._poisoned[allocation.ptr] = freed
            then(allocation)
            return
        with self._lock:
            self._held.append(_Held(allocation, freed, then, self._handouts + self.quarantine))

    def _due(self, handouts: int | None) -> list[_Held]:
        """Take the quarantined blocks whose time is up (all for ``None``); lock held."""
        held = self._held
        due: list[_Held] = []
        while held and (handouts is None or held[0].until <= handouts):
            due.append(held.popleft())
        return due

    def _release(self, due: list[_Held]) -> list[str]:
        """Check each block's poison, then hand it on; the reports."""
        problems: list[str] = []
        for item in due:
            try:
                problem = self._check(item.allocation, item.freed)
                if problem is None:
                    with self._lock:
                        self._poisoned[item.allocation.ptr] = item.freed
                else:
                    problems.append(problem)
            finally:
                item.then(item.allocation)
        return problems

    def _poison(self, allocation: Allocation) -> None:
        """Fill the freed bytes with POISON (the allocation's recorded commands finished)."""
        pattern = _poison_bytes(allocation.nbytes)
        if allocation.policy.needs_map:
            queue = default_queue(allocation.context)
            calls.copy_and_wait(queue, calls.svm_pointer(allocation.u8), pattern, None)
        else:
            allocation.u8[:] = pattern

    def _check(self, allocation: Allocation, freed: _Freed) -> str | None:
        """Report writes into the poisoned bytes of a freed block (spec, clSVMFree: using
        memory after it was freed is undefined); the report, or ``None``."""
        n = min(freed.nbytes, allocation.nbytes)
        if allocation.policy.needs_map:
            seen = np.empty(n, np.uint8)
            queue = default_queue(allocation.context)
            calls.copy_and_wait(queue, seen, calls.svm_pointer(allocation.u8[:n]), None)
        else:
            seen = allocation.u8[:n].copy()
        bad = np.flatnonzero(seen != _poison_bytes(n))
        if not bad.size:
            return None
        message = (
            f"use after free detected: {bad.size} of the {freed.nbytes} bytes freed at "
            f"{allocation.ptr:#x} were written after they were freed (first at byte "
            f"{int(bad[0])}: {int(seen[bad[0]]):#04x}, poison {int(POISON[bad[0] % 4]):#04x})."
            "\nThe freed allocation was created at:\n"
            + "".join(traceback.format_list(freed.created))
            + "and freed at:\n"
            + "".join(traceback.format_list(freed.freed))
        )
        self.reports.append(message)
        log.error("%s", message)
        return message


class _PoisonThen:
    """Release step: poison the bytes, then quarantine the allocation (or hand it on)."""

    __slots__ = ("allocation", "freed", "poisoner", "then")

    def __init__(
        self,
        poisoner: Poisoner,
        allocation: Allocation,
        freed: _Freed,
        then: Callable[[Allocation], None],
    ) -> None:
        self.poisoner, self.allocation, self.freed, self.then = poisoner, allocation, freed, then

    def __call__(self) -> None:
        try:
            self.poisoner._poison(self.allocation)
        except BaseException:
            self.then(self.allocation)
            raise
        self.poisoner._hold(self.allocation, self.freed, self.then)


def _check_at_exit() -> None:
    """Interpreter exit: report writes into every quarantined block (log only)."""
    for poisoner in list(_poisoners):
        with poisoner._lock:
            due = poisoner._due(None)
        for item in due:
            poisoner._check(item.allocation, item.freed)


at_shutdown(_check_at_exit)


class DebugAdaptor(ResourceAdaptor):
    """An adaptor that poisons what is freed through it (over a pool, usually), holds it
    back for ``quarantine`` hand-outs and checks the poison when the block goes back and
    when it comes back; see :class:`Poisoner`."""

    def __init__(
        self, upstream: MemoryResource, *, strict: bool = True, quarantine: int = QUARANTINE
    ) -> None:
        super().__init__(upstream)
        self.poisoner = Poisoner(strict=strict, quarantine=quarantine)

    @property
    def reports(self) -> list[str]:
        return self.poisoner.reports

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        """An allocation from upstream.  Out of memory with blocks in quarantine: their
        poison is checked and they go back upstream, then the allocation is retried once
        (debug mode never runs out of memory where a plain pool would not)."""
        try:
            allocation = self.upstream.allocate(nbytes, alignment)
        except OutOfMemoryError:
            if not self.poisoner.held():
                raise
            problems = self.poisoner.check_quarantine()
            allocation = self.upstream.allocate(nbytes, alignment)
            if problems and self.poisoner.strict:
                allocation.free()
                raise UseAfterFreeError(problems[0]) from None
        allocation.resource = self
        self.poisoner.allocated(allocation)
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        self.poisoner.deallocate(allocation, self.upstream.deallocate)

    def trim(self) -> int:
        """Check the quarantined blocks' poison and return them, then trim upstream;
        ``strict``: :class:`~svmkit.UseAfterFreeError` for a write found."""
        problems = self.poisoner.check_quarantine()
        trimmed = super().trim()
        if problems and self.poisoner.strict:
            raise UseAfterFreeError(problems[0])
        return trimmed
