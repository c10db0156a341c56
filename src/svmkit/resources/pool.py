"""PoolResource: size-class bins of upstream blocks, reused once their commands finished.

Modelled on RMM's ``pool_memory_resource`` (upstream first, the pool owns what it got
from upstream) with PyOpenCL's bin layout (:func:`svmkit.resources._cpool.size_class`) and
RMM's stream ordering expressed with OpenCL events: a block freed while recorded commands
may still use it waits in the pool's pending list until every one of those events
completed, whichever queue they were enqueued on (spec: "the application must ensure that
... no command uses the memory after it is freed"; reuse is a free followed by an
allocation).

The pool's state has one owner, its C cache (:class:`svmkit.resources._cpool.BlockCache`):
ready and pending blocks, their figures, the blocks held from upstream, the counters and
which sizes are pooled.  This module validates requests, talks to upstream and asks the
cache; it keeps no figure of its own.
"""

from __future__ import annotations

import logging
from typing import Any

import pyopencl as cl

from svmkit.driver import fork
from svmkit.errors import InvalidValueError, OutOfMemoryError
from svmkit.events import is_complete, shutting_down, wait_pending
from svmkit.events.epochs import reap_completed
from svmkit.events.release import ensure_release_thread, settle
from svmkit.policy import check_alignment, check_size
from svmkit.resources._cpool import Block, BlockCache, next_generation
from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.exports import exported_bytes, reclaim

__all__ = ["PoolResource"]

log = logging.getLogger(__name__)

_NO_EVENTS: list[cl.Event] = []


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
      Ready blocks of a class go out last-in first-out (the warmest memory first).  A size
      whose class would round up beyond the devices' ``CL_DEVICE_MAX_MEM_ALLOC_SIZE`` gets
      a block of exactly its size, never cached.
    * Every block is aligned to the device's largest data type (``clSVMAlloc``'s default),
      so every alignment the spec allows is met.
    * A freed block is reused only after the events recorded on its allocation completed
      (the pool polls their status, at most 8 blocks of a class per allocation that needs
      it, and never enqueues anything), so ``free()`` never blocks, and ``enqueue_free`` on
      one queue and reuse on another are ordered as the spec requires.
    * On upstream :class:`~svmkit.OutOfMemoryError` the pool waits for its pending blocks,
      returns its whole cache upstream and retries once.
    * Each hand-out is a new :class:`Allocation`, so arrays left from an earlier user of a
      block raise :class:`~svmkit.UseAfterFreeError`.
    """

    upstream: MemoryResource
    svmkit_exit_events = "_pending_events"  # waited for at exit (svmkit.events.exit_wait)

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
        # The pool's whole state lives in C, under the cache's lock: ready and pending
        # blocks (each pending one with its events, polled through `is_complete`), the
        # blocks held from upstream (so the collector never frees one behind a pooled array
        # dying in a reference cycle), every figure and the counters (StatisticsAdaptor's,
        # so a pooled allocation takes one lock, not three).  So is the common case of an
        # allocation: this instance's `allocate` is the cache's `take`, which calls
        # `_allocate_slow` below whenever it does not apply.
        # A collection may finalise an unfreed allocation of this pool while a thread holds
        # the lock (svmkit runs no Python code under it, but a caller may take it): the
        # release thread must be there to take that free over (Allocation._finalize).
        ensure_release_thread()
        max_alloc = min(d.max_alloc_bytes for d in self.capabilities.devices)
        self._cache = BlockCache(self, Allocation, max_alloc, is_complete, max_cached_bytes)
        self.allocate = self._cache.take  # type: ignore[method-assign]

    @property
    def max_cached_bytes(self) -> int | None:
        """Most bytes the pool keeps cached for reuse (``None``: no limit)."""
        return self._cache.max_cached_bytes

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        """A block of at least ``nbytes`` bytes, from the cache when one is free to reuse.

        (An instance's ``allocate`` is its C cache's ``take``: a ready block of the
        request's size class or up to 4 classes larger, else :meth:`_allocate_slow`.)
        """
        allocation: Allocation = self._cache.take(nbytes, alignment)
        return allocation

    def _allocate_slow(self, nbytes: int, alignment: int = 0) -> Allocation:
        """Every allocation the C fast path does not serve: a size to check, an alignment
        to check, a class with pending blocks to poll, growth."""
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        size = self._block_size(nbytes)
        if alignment:
            check_alignment(alignment, self.capabilities)  # blocks meet every valid one
        if not size:
            return Allocation(self, 0, 0)
        cached: Allocation | None = self._cache.take_cached(nbytes)
        if cached is None and reap_completed():  # blocks pyopencl.array dropped, first
            cached = self._cache.take_cached(nbytes)
        if cached is not None:
            return cached
        allocation: Allocation = self._cache.adopt(self._grow(nbytes, size), nbytes)
        return allocation

    def _block_size(self, nbytes: int) -> int:
        """Bytes of the block that serves a valid request, as the cache decides (0: zero
        bytes); an invalid size raises (``clSVMAlloc``'s size rule, :func:`check_size`)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise InvalidValueError(f"size must be an int, got {nbytes!r}")
        size = self._cache.block_size(nbytes)
        if size is None:  # zero, negative or beyond a device's limit
            check_size(nbytes, self.capabilities)
            return 0
        return size

    def _grow(self, nbytes: int, size: int) -> Allocation:
        """A new ``size``-byte upstream allocation; on OutOfMemoryError release the cache
        and retry once."""
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
        return upstream

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
        return self._cache.holds(allocation.block)

    # -- deallocation ----------------------------------------------------------------------
    def deallocate(self, allocation: Allocation) -> None:
        """Cache the block; it is reused once the allocation's recorded events completed."""
        block: Block = allocation.block
        record = allocation._events
        events = record.take() if record else _NO_EVENTS
        # (counted, and listed ready or pending with its events, in one step of the cache)
        if not self._cache.give(block, allocation.nbytes, events):
            _release_upstream(block, events)

    def _release_block(self, block: Block, events: list[cl.Event] = _NO_EVENTS) -> None:
        """Give back upstream, once ``events`` completed, a block that has left the pool (the
        C paths' release: unpooled, or beyond ``max_cached_bytes``)."""
        _release_upstream(block, events)

    # -- cache control ---------------------------------------------------------------------
    def trim(self) -> int:
        """Return every cached block upstream (pending ones once their events complete);
        the number of bytes given back."""
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        return self._release_cache(wait=False)

    def _release_cache(self, *, wait: bool) -> int:
        """Return every cached block upstream; ``wait``: first block until the pending
        ones' events completed (out of memory), so their memory is free on return."""
        if wait:
            wait_pending(self._cache.pending_events())
        cached = self._cache.take_all()
        for block, events in cached:
            _release_upstream(block, events)
        return sum(block.size for block, _ in cached)

    def _pending_events(self) -> list[cl.Event]:
        """The events the pool's pending blocks wait for (the exit wait polls them)."""
        return self._cache.pending_events()

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
        return self._cache.figures()

    def statistics(self) -> dict[str, int]:
        """The counters :class:`StatisticsAdaptor` keeps, for allocations of this pool:
        ``current_bytes``, ``peak_bytes``, ``total_bytes``, ``current_allocations``,
        ``peak_allocations``, ``total_allocations`` (bytes asked for; a consistent
        snapshot, exact when read: see :func:`~svmkit.events.release.settle`)."""
        if fork.forked:
            fork.check_owned(self.context, f"this {type(self).__name__}")
        settle()
        return self._cache.statistics()

    @property
    def cached_bytes(self) -> int:
        """Bytes the pool holds for reuse (ready and pending)."""
        settle()
        return self._cache.cached_bytes


fork.in_child(next_generation)  # the parent's caches defer to Python there, which refuses them


def _release_upstream(block: Block, events: list[cl.Event]) -> None:
    """Give ``block`` back to its upstream once ``events`` completed (never blocks)."""
    if shutting_down():
        return  # at exit svmkit stops releasing memory
    upstream: Any = block.upstream
    for event in events:
        upstream.events.record(event)
    upstream.free()
