"""Debug mode: poison freed pooled memory and catch writes to it (``SVMKIT_DEBUG=1``).

Every :class:`~svmkit.Pool` (and the default pooled resource) built while
:func:`debug_enabled` holds puts a :class:`DebugAdaptor` on top of its pool; put one over
any other stack yourself.  A freed block is filled with :data:`POISON`
(``0xDEADBEEF`` as little-endian words: an ``int32`` view reads -559038737) once the
commands recorded on it completed, so a kernel or host that reads memory after freeing
it sees an unmistakable pattern.  When the pool hands the block out again the poison is
checked; if it changed, something wrote to freed memory (spec, clSVMFree: using memory
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from svmkit.driver import calls
from svmkit.driver.queues import default_queue
from svmkit.errors import UseAfterFreeError
from svmkit.events import release_after
from svmkit.resources._adaptor import ResourceAdaptor
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["POISON", "DebugAdaptor", "Poisoner", "debug_enabled", "set_debug"]

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


class Poisoner:
    """The debug logic of :class:`DebugAdaptor`.

    ``strict``: raise :class:`~svmkit.UseAfterFreeError` on detection (else only log).
    ``reports`` lists every detection (the message text), oldest first.
    """

    def __init__(self, *, strict: bool = True) -> None:
        self.strict = strict
        self.reports: list[str] = []
        self._lock = threading.Lock()
        self._created: dict[int, list[traceback.FrameSummary]] = {}  # id(allocation)
        self._poisoned: dict[int, _Freed] = {}  # address -> what was freed there

    def allocated(self, allocation: Allocation) -> None:
        """Record the creation stack; check the poison of a block handed out again."""
        if not allocation.nbytes:
            return
        with self._lock:
            freed = self._poisoned.pop(allocation.ptr, None)
            self._created[id(allocation)] = traceback.extract_stack()[:-2]
        if freed is not None and freed.block is allocation.block:
            self._check(allocation, freed)

    def deallocate(self, allocation: Allocation, then: Callable[[Allocation], None]) -> None:
        """Poison ``allocation`` once its recorded commands finished, then ``then(it)``."""
        with self._lock:
            created = self._created.pop(id(allocation), [])
        freed = _Freed(allocation.block, allocation.nbytes, created, traceback.extract_stack()[:-2])
        release_after(allocation.take_events(), _PoisonThen(self, allocation, freed, then))

    def _poison(self, allocation: Allocation, freed: _Freed) -> None:
        """Fill the freed bytes with POISON (the allocation's commands have finished)."""
        pattern = _poison_bytes(allocation.nbytes)
        if allocation.policy.needs_map:
            queue = default_queue(allocation.context)
            calls.copy_and_wait(queue, calls.svm_pointer(allocation.u8), pattern, None)
        else:
            allocation.u8[:] = pattern
        with self._lock:
            self._poisoned[allocation.ptr] = freed

    def _check(self, allocation: Allocation, freed: _Freed) -> None:
        """Report writes into the poisoned bytes of the block handed out again."""
        n = min(freed.nbytes, allocation.nbytes)
        if allocation.policy.needs_map:
            seen = np.empty(n, np.uint8)
            queue = default_queue(allocation.context)
            calls.copy_and_wait(queue, seen, calls.svm_pointer(allocation.u8[:n]), None)
        else:
            seen = allocation.u8[:n].copy()
        bad = np.flatnonzero(seen != _poison_bytes(n))
        if not bad.size:
            return
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
        if self.strict:
            allocation.free()
            raise UseAfterFreeError(message)


class _PoisonThen:
    """Release step: poison the bytes, then hand the allocation on."""

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
            self.poisoner._poison(self.allocation, self.freed)
        finally:
            self.then(self.allocation)


class DebugAdaptor(ResourceAdaptor):
    """An adaptor that poisons what is freed through it (over a pool, usually) and checks
    the poison when the same block comes back; see :class:`Poisoner`."""

    def __init__(self, upstream: MemoryResource, *, strict: bool = True) -> None:
        super().__init__(upstream)
        self.poisoner = Poisoner(strict=strict)

    @property
    def reports(self) -> list[str]:
        return self.poisoner.reports

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        allocation = self.upstream.allocate(nbytes, alignment)
        allocation.resource = self
        self.poisoner.allocated(allocation)
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        self.poisoner.deallocate(allocation, self.upstream.deallocate)
