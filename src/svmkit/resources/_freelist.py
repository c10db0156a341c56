"""The pool's cache: blocks by size class, each either ready or waiting for events.

A block freed while commands may still use it is *pending*: it holds the events recorded
on its allocation and becomes *ready* only once every one of them completed.  Readiness is
learnt by polling event status (a fraction of a microsecond per query); nothing here
enqueues commands or blocks, except :meth:`FreeList.wait_pending`, which the pool calls
only when it is out of memory.

Ready blocks live in C (:class:`svmkit.resources._cpool.BlockCache`, whose ``take`` and
``give`` are the pool's hot path); the pending ones live here.  Not thread-safe: the pool
holds the cache's lock around calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyopencl as cl

from svmkit.events import is_complete, wait_pending
from svmkit.resources._cpool import Block, BlockCache

__all__ = ["Block", "FreeList"]

_POLL_LIMIT = 8
"""Pending blocks of one class checked per miss (bounds the cost of a miss)."""


class FreeList:
    """Cached blocks keyed by size class: best fit among ready blocks, pending ones polled.

    ``pop(cls)`` returns a block of class ``cls`` or of one of the next 4 classes (at most
    ~25 % larger), the smallest class first, that is free to hand out now: ready (LIFO: the
    most recently used memory is the warmest) or pending with every event completed; else
    ``None``.  The scan is C's (:meth:`BlockCache.best_fit`, also the allocation fast path);
    it stops at each class with pending blocks for this list to poll them.
    """

    __slots__ = ("_pending", "cache")
    svmkit_exit_events = "pending_events"  # waited for at exit (svmkit.events.exit_wait)

    def __init__(self, cache: BlockCache) -> None:
        self.cache = cache
        self._pending: dict[int, list[tuple[list[cl.Event], Block]]] = {}

    @property
    def pending_bytes(self) -> int:
        """Bytes of blocks waiting for events."""
        return self.cache.pending_bytes

    @property
    def cached_bytes(self) -> int:
        """Bytes held: ready plus pending."""
        return self.cache.ready_bytes + self.cache.pending_bytes

    def __len__(self) -> int:
        return self.cache.ready_blocks + sum(map(len, self._pending.values()))

    def push_pending(self, block: Block, events: Sequence[cl.Event]) -> None:
        """List ``block``, which ``BlockCache.give`` just counted as pending (under the same
        hold of the lock); it is handed out again only after ``events`` completed."""
        self._pending.setdefault(block.cls, []).append((list(events), block))

    def pop(self, cls: int) -> Block | None:
        """A block that fits class ``cls`` and is free to hand out now, or ``None``."""
        cache = self.cache
        start = cls
        while True:
            found = cache.best_fit(cls, start)
            if found is None or isinstance(found, Block):
                return found
            done = self._take_completed(self._pending.get(found, []))
            if done is not None:
                return done
            start = found + 1

    def _take_completed(self, pending: list[tuple[list[cl.Event], Block]]) -> Block | None:
        for i, (events, block) in enumerate(pending[:_POLL_LIMIT]):
            if all(is_complete(e) for e in events):
                del pending[i]
                self.cache.unpend(block)
                return block
        return None

    def pending_events(self) -> list[cl.Event]:
        """The events the pending blocks wait for."""
        return [
            e for pending in list(self._pending.values()) for events, _ in pending for e in events
        ]

    def wait_pending(self) -> None:
        """Block until every pending block's events completed; all become ready."""
        cache = self.cache
        for pending in list(self._pending.values()):
            for events, block in pending:
                wait_pending(events)
                cache.unpend(block)
                cache.push_ready(block)
        self._pending.clear()

    def take_all(self) -> list[tuple[Block, list[cl.Event]]]:
        """Remove every cached block, each with the events it still waits for."""
        cache = self.cache
        out: list[tuple[Block, list[cl.Event]]] = [(block, []) for block in cache.take_ready()]
        for pending in self._pending.values():
            for events, block in pending:
                out.append((block, events))
                cache.unpend(block)
        self._pending.clear()
        return out
