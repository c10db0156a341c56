"""TrackingAdaptor: remembers each live allocation and the stack that made it (RMM's
``tracking_resource_adaptor``), for leak reports."""

from __future__ import annotations

import threading
import traceback
import weakref
from dataclasses import dataclass

from svmkit.events.release import settle
from svmkit.resources._adaptor import ResourceAdaptor
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["Outstanding", "TrackingAdaptor"]

_Stack = list[traceback.FrameSummary]


@dataclass(frozen=True)
class Outstanding:
    """A live allocation and where it was made."""

    allocation: Allocation
    stack: str
    held_by_exports: bool = False
    """Freed already, but an export (a NumPy view, DLPack capsule, PyOpenCL array) still
    holds the memory (:mod:`svmkit.resources.exports`)."""

    def __str__(self) -> str:
        a = self.allocation
        held = " (freed; held by a live export)" if self.held_by_exports else ""
        return f"{a.nbytes} bytes at {a.ptr:#x}{held}, allocated at:\n{self.stack}"


class TrackingAdaptor(ResourceAdaptor):
    """Tracks every allocation made through it until it is freed.

    Holds allocations weakly (tracking never keeps memory alive).  Capturing the stack
    costs tens of microseconds per allocation (``capture_stacks=False`` skips it), so use
    it to hunt leaks, not on hot paths.
    """

    def __init__(self, upstream: MemoryResource, *, capture_stacks: bool = True) -> None:
        super().__init__(upstream)
        self.capture_stacks = capture_stacks
        self._lock = threading.Lock()
        self._live: dict[int, tuple[weakref.ref[Allocation], _Stack | None]] = {}

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        allocation = self.upstream.allocate(nbytes, alignment)
        allocation.resource = self
        if nbytes:
            stack = traceback.extract_stack()[:-1] if self.capture_stacks else None
            with self._lock:
                self._live[id(allocation)] = (weakref.ref(allocation), stack)
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        with self._lock:
            self._live.pop(id(allocation), None)
        self.upstream.deallocate(allocation)

    def outstanding(self) -> list[Outstanding]:
        """Allocations made through this adaptor whose memory has not come back, oldest
        first, with their stacks: live ones, and freed ones an export still holds
        (``held_by_exports``).  Exact when read: releases that finalizers handed over run
        first (:func:`~svmkit.events.release.settle`)."""
        settle()
        with self._lock:
            entries = list(self._live.values())
        out = []
        for ref, stack in entries:
            allocation = ref()
            if allocation is not None:
                text = "".join(traceback.format_list(stack)) if stack else "(not captured)\n"
                out.append(Outstanding(allocation, text, allocation.freed))
        return out

    def outstanding_bytes(self) -> int:
        """Bytes of the live allocations."""
        return sum(o.allocation.nbytes for o in self.outstanding())
