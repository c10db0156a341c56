"""The pool's cache: blocks by size class, each either ready or waiting for events.

A block freed while commands may still use it is *pending*: it holds the events recorded
on its allocation and becomes *ready* only once every one of them completed.  Readiness is
learnt by polling event status (a fraction of a microsecond per query); nothing here
enqueues commands or blocks, except :meth:`FreeList.wait_pending`, which the pool calls
only when it is out of memory.  Not thread-safe: the pool holds its lock around calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyopencl as cl

from svmkit.events import is_complete, wait_pending
from svmkit.resources.base import Allocation

__all__ = ["Block", "FreeList"]

_POLL_LIMIT = 8
"""Pending blocks of one class checked per miss (bounds the cost of a miss)."""


class Block:
    """One upstream allocation a pool hands out again and again.

    ``memo`` is a per-block cache that outlives each hand-out (the array layer keeps typed
    NumPy views there); ``last_nbytes``/``last_u8`` cache the byte view of the last size
    handed out.
    """

    __slots__ = ("cls", "last_nbytes", "last_u8", "memo", "ptr", "size", "u8", "upstream")

    def __init__(self, cls: int, upstream: Allocation) -> None:
        self.cls = cls
        self.upstream = upstream
        self.ptr = upstream.ptr
        self.size = upstream.nbytes
        self.u8 = upstream.u8
        self.last_nbytes = upstream.nbytes
        self.last_u8 = upstream.u8
        self.memo: dict[Any, Any] = {}

    def bytes_for(self, nbytes: int) -> Any:
        """A uint8 view of the block's first ``nbytes`` bytes (cached for repeats)."""
        if self.last_nbytes != nbytes:
            self.last_u8 = self.u8[:nbytes]
            self.last_nbytes = nbytes
        return self.last_u8

    def __repr__(self) -> str:
        return f"<Block class {self.cls} {self.size} B at {self.ptr:#x}>"


class FreeList:
    """Cached blocks keyed by size class: best fit among ready blocks, pending ones polled.

    ``pop(cls)`` returns a ready block of class ``cls`` if there is one (LIFO: the most
    recently used memory is the warmest), else the smallest ready or newly completed block
    of the next ``lookahead`` classes, else ``None``.  ``ready`` (class -> LIFO list) and
    ``ready_bytes`` are public so the owner's hot path can pop and push inline.
    """

    __slots__ = ("_pending", "lookahead", "pending_bytes", "ready", "ready_bytes")
    svmkit_exit_events = "pending_events"  # waited for at exit (svmkit.events.exit_wait)

    def __init__(self, lookahead: int = 4) -> None:
        self.ready: dict[int, list[Block]] = {}
        self._pending: dict[int, list[tuple[list[cl.Event], Block]]] = {}
        self.lookahead = lookahead
        self.ready_bytes = 0
        self.pending_bytes = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes held: ready plus pending."""
        return self.ready_bytes + self.pending_bytes

    def __len__(self) -> int:
        return sum(map(len, self.ready.values())) + sum(map(len, self._pending.values()))

    def push(self, block: Block, events: Sequence[cl.Event]) -> None:
        """Cache ``block``; it is handed out again only after ``events`` completed."""
        if events:
            self._pending.setdefault(block.cls, []).append((list(events), block))
            self.pending_bytes += block.size
        else:
            self.ready.setdefault(block.cls, []).append(block)
            self.ready_bytes += block.size

    def pop(self, cls: int) -> Block | None:
        """A block of class ``cls`` (or up to ``lookahead`` classes larger) that is free to
        hand out now, or ``None``."""
        ready = self.ready.get(cls)
        if ready:
            block = ready.pop()
            self.ready_bytes -= block.size
            return block
        return self._pop_slow(cls)

    def _pop_slow(self, cls: int) -> Block | None:
        for c in range(cls, cls + self.lookahead + 1):
            ready = self.ready.get(c)
            if ready:
                block = ready.pop()
                self.ready_bytes -= block.size
                return block
            pending = self._pending.get(c)
            if pending:
                done = self._take_completed(pending)
                if done is not None:
                    return done
        return None

    def _take_completed(self, pending: list[tuple[list[cl.Event], Block]]) -> Block | None:
        for i, (events, block) in enumerate(pending[:_POLL_LIMIT]):
            if all(is_complete(e) for e in events):
                del pending[i]
                self.pending_bytes -= block.size
                return block
        return None

    def pending_events(self) -> list[cl.Event]:
        """The events the pending blocks wait for."""
        return [
            e for pending in list(self._pending.values()) for events, _ in pending for e in events
        ]

    def wait_pending(self) -> None:
        """Block until every pending block's events completed; all become ready."""
        for c, pending in list(self._pending.items()):
            for events, block in pending:
                wait_pending(events)
                self.ready.setdefault(c, []).append(block)
                self.ready_bytes += block.size
                self.pending_bytes -= block.size
        self._pending.clear()

    def take_all(self) -> list[tuple[Block, list[cl.Event]]]:
        """Remove every cached block, each with the events it still waits for."""
        out: list[tuple[Block, list[cl.Event]]] = [
            (block, []) for ready in self.ready.values() for block in ready
        ]
        out += [(block, events) for pending in self._pending.values() for events, block in pending]
        self.ready.clear()
        self._pending.clear()
        self.ready_bytes = self.pending_bytes = 0
        return out
