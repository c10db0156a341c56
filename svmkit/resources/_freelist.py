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

    ``pop(cls)`` returns a ready block of class ``cls`` if there is one (LIFO: the most
    recently used memory is the warmest), else the smallest ready or newly completed block
    of the next ``lookahead`` classes, else ``None``.
    """

    __slots__ = ("_pending", "cache", "lookahead")
    svmkit_exit_events = "pending_events"  # waited for at exit (svmkit.events.exit_wait)

    def __init__(self, cache: BlockCache, lookahead: int = 4) -> None:
        self.cache = cache
        self._pending: dict[int, list[tuple[list[cl.Event], Block]]] = {}
        self.lookahead = lookahead

    @property
    def ready_bytes(self) -> int:
        """Bytes of ready blocks."""
        return self.cache.ready_bytes

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
        """List ``block``, whose bytes ``BlockCache.give`` counted as pending; it is handed
        out again only after ``events`` completed."""
        self._pending.setdefault(block.cls, []).append((list(events), block))

    def pop(self, cls: int) -> Block | None:
        """A block of class ``cls`` (or up to ``lookahead`` classes larger) that is free to
        hand out now, or ``None``."""
        cache = self.cache
        for c in range(cls, cls + self.lookahead + 1):
            block = cache.pop_ready(c)
            if block is not None:
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
                self.cache.pending_bytes -= block.size
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
                cache.push_ready(block)
                cache.pending_bytes -= block.size
        self._pending.clear()

    def take_all(self) -> list[tuple[Block, list[cl.Event]]]:
        """Remove every cached block, each with the events it still waits for."""
        cache = self.cache
        out: list[tuple[Block, list[cl.Event]]] = [(block, []) for block in cache.take_ready()]
        for pending in self._pending.values():
            for events, block in pending:
                out.append((block, events))
                cache.pending_bytes -= block.size
        self._pending.clear()
        return out
