"""PoolResource: size-class bins of upstream blocks, reused once their commands finished.

Modelled on RMM's ``pool_memory_resource`` (upstream first, the pool owns what it got
from upstream) with PyOpenCL's bin layout (:mod:`svmkit.resources._bins`) and RMM's
stream ordering expressed with OpenCL events: a block freed while recorded commands may
still use it waits in the cache until every one of those events completed, whichever
queue they were enqueued on (spec: "the application must ensure that ... no command
uses the memory after it is freed"; reuse is a free followed by an allocation).
"""

from __future__ import annotations

import logging
from typing import Any

import pyopencl as cl

from svmkit.driver import fork
from svmkit.errors import InvalidValueError, OutOfMemoryError
from svmkit.events import shutting_down
from svmkit.events.release import ensure_release_thread, settle
from svmkit.policy import check_alignment, check_size
from svmkit.resources._cpool import Block, BlockCache, class_size, next_generation, size_class
from svmkit.resources._freelist import FreeList
from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.exports import exported_bytes, reclaim

__all__ = ["PoolResource"]

log = logging.getLogger(__name__)

_NO_EVENTS: list[cl.Event] = []
_UNPOOLED = 0  # class of blocks too large to round up: never cached, released when freed


class PoolResource(MemoryResource):
    """A pool of SVM blocks in size classes over ``upstream``.

    Parameters
    ----------
    upstream:
        The resource blocks come from (kept alive; usually an :class:`SVMResource`).
    max_cached_bytes:
        Most bytes the pool keeps cached for reuse; a block freed beyond it goes back
        upstream.  ``None``: no limit (release with :meth:`trim`).

    Notes
    -----
    * Size classes: 64-byte steps up to 1 KiB, then 16 per power of two, so a block holds
      less than ``n + 64`` bytes for ``n <= 1 KiB`` and at most ``17/16 * n`` above.  A
      request is served best-fit: a cached block of its own class, else the smallest
      cached block of the next 4 classes (at most ~25 % larger), else a new upstream block.
    * Every block is aligned to the device's largest data type (``clSVMAlloc``'s default),
      so every alignment the spec allows is met.
    * A freed block is reused only after the events recorded on its allocation completed
      (its status is polled; the pool never enqueues anything).  ``enqueue_free`` on one
      queue and reuse on another are therefore ordered as the spec requires.
    * On upstream :class:`~svmkit.OutOfMemoryError` the pool waits for its pending blocks,
      returns its whole cache upstream and retries once.
    * Each hand-out is a new :class:`Allocation`, so arrays left from an earlier user of a
      block raise :class:`~svmkit.UseAfterFreeError`.
    """

    upstream: MemoryResource

    def __init__(
        self,
        upstream: MemoryResource,
        *,
        max_cached_bytes: int | None = None,
    ) -> None:
        if not isinstance(upstream, MemoryResource):
            raise InvalidValueError(f"upstream must be a memory resource, got {upstream!r}")
        if max_cached_bytes is not None and (
            isinstance(max_cached_bytes, bool)
            or not isinstance(max_cached_bytes, int)
            or max_cached_bytes < 0
        ):
            raise InvalidValueError(
                f"max_cached_bytes must be None or an int >= 0, got {max_cached_bytes!r}"
            )
        self.upstream = upstream
        self.context = upstream.context
        self.policy = upstream.policy
        self.capabilities = upstream.capabilities
        self._max_alloc = min(d.max_alloc_bytes for d in self.capabilities.devices)
        # The lock, the ready blocks and the counters (StatisticsAdaptor's, kept under the
        # pool's own lock so a pooled allocation takes one lock, not three) live in C; so
        # does the common case of an allocation: this instance's `allocate` is the cache's
        # `take`, which calls `_allocate_slow` below whenever it does not apply.
        # A collection may run inside the pool's lock and finalise an unfreed allocation
        # of this pool in a reference cycle: the release thread must be there to take that
        # free over (Allocation._finalize), since the lock cannot be taken twice.
        ensure_release_thread()
        self._cache = BlockCache(self, Allocation, self._max_alloc, max_cached_bytes)
        self._free = FreeList(self._cache)
        self._counts = self._cache.counts
        self.allocate = self._cache.take  # type: ignore[method-assign]
        # Every upstream allocation behind a block, held by the pool itself: a pooled
        # array that dies in a reference cycle takes its Block along into the garbage, and
        # the collector would run the upstream allocation's finaliser (clSVMFree) while the
        # dying array's own finaliser puts the block back in the cache for reuse.
        self._held: dict[int, Allocation] = {}
        self._upstream_bytes = 0  # bytes of every block the pool holds from upstream
        self._upstream_blocks = 0  # blocks the pool holds from upstream
        self._upstream_allocations = 0  # upstream.allocate calls that succeeded

    @property
    def max_cached_bytes(self) -> int | None:
        """Most bytes the pool keeps cached for reuse (``None``: no limit)."""
        return self._cache.max_cached_bytes

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        """A block of at least ``nbytes`` bytes, from the cache when one is free to reuse.

        (An instance's ``allocate`` is its C cache's ``take``: a ready block of the
        request's own size class, else this method's body, :meth:`_allocate_slow`.)
        """
        allocation: Allocation = self._cache.take(nbytes, alignment)
        return allocation

    def _allocate_slow(self, nbytes: int, alignment: int = 0) -> Allocation:
        """Every allocation the C fast path does not serve: a first-seen or invalid size,
        an alignment to check, a best fit across classes, a pending block, growth."""
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        cls = self._classify(nbytes)
        if alignment:
            check_alignment(alignment, self.capabilities)  # blocks meet every valid one
        if not nbytes:
            return Allocation(self, 0, 0)
        block = None
        if cls:  # (an unpooled size is never cached: it goes to upstream and back)
            with self._cache:
                block = self._free.pop(cls)
                if block is not None:
                    self._counts.taken(nbytes)
        if block is None:
            block = self._grow(cls, nbytes)
        allocation: Allocation = self._cache.hand_out(block, nbytes)
        return allocation

    def _classify(self, nbytes: int) -> int:
        """The size class of a valid request (0: zero bytes, or too large to pool)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise InvalidValueError(f"size must be an int, got {nbytes!r}")
        if not 0 < nbytes <= self._max_alloc:
            check_size(nbytes, self.capabilities)
        if nbytes == 0:
            return 0
        cls = size_class(nbytes)
        return _UNPOOLED if class_size(cls) > self._max_alloc else cls

    def _grow(self, cls: int, nbytes: int) -> Block:
        """A new block from upstream; on OutOfMemoryError release the cache, retry once."""
        size = class_size(cls) if cls else nbytes
        try:
            upstream = self.upstream.allocate(size)
        except OutOfMemoryError:
            reclaim()  # exports in reference cycles, releases in flight
            released = self._release_cache(wait=True)
            log.info(
                "pool out of memory for %d bytes: released %d cached bytes, retrying",
                size,
                released,
            )
            try:
                upstream = self.upstream.allocate(size)
            except OutOfMemoryError as exc:
                raise self._out_of_memory(nbytes, size, exc) from exc
        if not upstream.ptr or upstream.nbytes < size or upstream.context != self.context:
            upstream.free()
            raise OutOfMemoryError(
                f"upstream {self.upstream!r} returned an unusable block for {size} bytes "
                f"(address {upstream.ptr:#x}, {upstream.nbytes} bytes)",
                nbytes=nbytes,
                cl_error="CL_MEM_OBJECT_ALLOCATION_FAILURE",
            )
        block = Block(cls, upstream)
        with self._cache:
            self._held[block.ptr] = upstream
            self._upstream_bytes += block.size
            self._upstream_blocks += 1
            self._upstream_allocations += 1
            self._counts.taken(nbytes)
        return block

    def _out_of_memory(self, nbytes: int, size: int, cause: OutOfMemoryError) -> OutOfMemoryError:
        figures = self.info()
        in_use, cached = figures["in_use_bytes"], figures["cached_bytes"]
        fragmented = figures["fragmented_bytes"]
        held = exported_bytes(self._holds)
        return OutOfMemoryError(
            f"pool cannot get {nbytes} bytes (a {size}-byte block) from {self.upstream!r} "
            f"even after returning its cache: {in_use} bytes in use by "
            f"{figures['live_allocations']} allocations, {cached} bytes cached, {fragmented} bytes "
            f"fragmented (block bytes beyond what allocations asked for), {held} bytes of "
            f"freed arrays still held by live exports (NumPy views, DLPack, PyOpenCL "
            f"arrays); upstream said: {cause}",
            nbytes=nbytes,
            cl_error=cause.cl_error,
            in_use_bytes=in_use,
            cached_bytes=cached,
            fragmented_bytes=fragmented,
            limit_bytes=getattr(cause, "limit_bytes", None),
        )

    def _holds(self, allocation: Allocation) -> bool:
        """Whether ``allocation`` is a hand-out of one of this pool's blocks."""
        block = allocation.block
        return isinstance(block, Block) and self._held.get(block.ptr) is block.upstream

    # -- deallocation ----------------------------------------------------------------------
    def deallocate(self, allocation: Allocation) -> None:
        """Cache the block; it is reused once the allocation's recorded events completed."""
        block: Block = allocation.block
        record = allocation._events
        events = record.take() if record else _NO_EVENTS
        with self._cache:  # (counted and listed in one step: figures never see it half-kept)
            kept = self._cache.give(block, allocation.nbytes, bool(events))
            if kept and events:
                self._free.push_pending(block, events)
        if not kept:
            self._release_block(block, events)

    def _release_block(self, block: Block, events: list[cl.Event] = _NO_EVENTS) -> None:
        """Give a block the cache does not keep (unpooled, or beyond ``max_cached_bytes``)
        back upstream once ``events`` completed."""
        with self._cache:
            self._upstream_bytes -= block.size
            self._upstream_blocks -= 1
            self._held.pop(block.ptr, None)
        _release_upstream(block, events)

    # -- cache control ---------------------------------------------------------------------
    def trim(self) -> int:
        """Return every cached block upstream (pending ones once their events complete);
        the number of bytes given back."""
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        return self._release_cache(wait=False)

    def _release_cache(self, *, wait: bool) -> int:
        with self._cache:
            if wait:
                self._free.wait_pending()
            cached = self._free.take_all()
            released = sum(block.size for block, _ in cached)
            self._upstream_bytes -= released
            self._upstream_blocks -= len(cached)
            for block, _ in cached:
                self._held.pop(block.ptr, None)
        for block, events in cached:
            _release_upstream(block, events)
        return released

    def info(self) -> dict[str, int]:
        """The pool's figures in bytes and blocks.

        ``in_use_bytes`` (asked for by live allocations), ``in_use_block_bytes`` (the
        blocks behind them), ``fragmented_bytes`` (their difference), ``cached_bytes``
        (ready + pending), ``pending_bytes`` (cached, waiting for events),
        ``upstream_bytes`` (everything held from upstream), ``live_allocations``,
        ``cached_blocks``, ``upstream_allocations`` (blocks ever taken from upstream).
        """
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        settle()  # exact when read: releases handed over by finalizers counted first
        with self._cache:
            free = self._free
            block_bytes = self._upstream_bytes - free.cached_bytes
            in_use = self._counts.current_bytes
            return {
                "in_use_bytes": in_use,
                "in_use_block_bytes": block_bytes,
                "fragmented_bytes": block_bytes - in_use,
                "cached_bytes": free.cached_bytes,
                "pending_bytes": free.pending_bytes,
                "upstream_bytes": self._upstream_bytes,
                "upstream_blocks": self._upstream_blocks,
                "live_allocations": self._upstream_blocks - len(free),
                "cached_blocks": len(free),
                "upstream_allocations": self._upstream_allocations,
            }

    def statistics(self) -> dict[str, int]:
        """The counters :class:`StatisticsAdaptor` keeps, for allocations of this pool:
        ``current_bytes``, ``peak_bytes``, ``total_bytes``, ``current_allocations``,
        ``peak_allocations``, ``total_allocations`` (bytes asked for; a consistent
        snapshot, exact when read: see :func:`~svmkit.events.release.settle`)."""
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        settle()
        with self._cache:
            return self._counts.snapshot()

    @property
    def cached_bytes(self) -> int:
        """Bytes the pool holds for reuse (ready and pending)."""
        settle()
        return self._free.cached_bytes


fork.in_child(next_generation)  # the parent's caches defer to Python there, which refuses them


def _release_upstream(block: Block, events: list[cl.Event]) -> None:
    """Give ``block`` back to its upstream once ``events`` completed (never blocks)."""
    if shutting_down():
        return  # at exit svmkit stops releasing memory
    upstream: Any = block.upstream
    for event in events:
        upstream.events.record(event)
    upstream.free()
