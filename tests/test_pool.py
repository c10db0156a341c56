"""PoolResource and sk.Pool specifics: size classes, event-ordered reuse across queues,
out-of-memory handling, trim, checked upstream results, adaptors' figures, stress."""

from __future__ import annotations

import gc
import random
import threading
import time
import warnings
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from _helpers import collects_holding, run_threads

import svmkit as sk
from svmkit.events import drain, is_complete
from svmkit.resources._cpool import GRANULE, class_size, size_class

SPIN = """
__kernel void spin_write(__global int *out, int iters, int value) {
    int i = get_global_id(0);
    float x = (float)i;
    for (int k = 0; k < iters; ++k) x = x * 0.9999f + 1.0f;
    out[i] = value + (x < 0.0f);  /* x is never negative: the loop cannot be dropped */
}
"""
N = 1024


@pytest.fixture(scope="module")
def spin(ctx: cl.Context) -> cl.Kernel:
    return sk.build_program(ctx, SPIN).spin_write


# -- size classes ------------------------------------------------------------------------
def test_size_classes_round_up_with_bounded_waste() -> None:
    sizes = sorted({*range(1, 5000), *(2**k + d for k in range(10, 40) for d in (-1, 0, 1))})
    previous = 0
    for n in sizes:
        cls = size_class(n)
        size = class_size(cls)
        assert size >= n and size % GRANULE == 0
        assert size_class(size) == cls  # a class's own size maps back to it
        assert (size < n + GRANULE) if n <= 1024 else (16 * size <= 17 * n)
        assert cls >= previous  # monotone in n
        previous = cls
    assert [class_size(c) for c in (1, 16, 17, 32, 33)] == [64, 1024, 1088, 2048, 2176]
    assert class_size(size_class(64 << 20)) == 64 << 20


def test_a_class_is_reused_best_fit(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    big = pool.allocate(4352)  # class 49
    ptr = big.ptr
    big.free()
    small = pool.allocate(64)  # far smaller: never served from the 4352-byte block
    assert small.ptr != ptr
    near = pool.allocate(4096)  # class 48: the cached class-49 block fits best
    assert near.ptr == ptr and pool.info()["upstream_blocks"] == 2
    small.free()
    near.free()


def test_many_distinct_sizes(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    for n in range(1, 6000):  # more sizes than the pool memoises classes for
        a = pool.allocate(n)
        assert a.nbytes == n and a.u8.size == n
        a.free()
    assert pool.info()["upstream_blocks"] == size_class(5999)


def test_pool_arrays_of_every_length_and_spelling_on_one_block(ctx: cl.Context) -> None:
    """Pool.empty's one-dimensional path (no per-length memo) and the block's typed views:
    each hand-out of one block has its own length, dtype and bytes, whatever came before."""
    pool = sk.Pool(ctx)
    seen_ptrs = set()
    rng = random.Random(3)
    spellings: list[Any] = [np.float32, "f4", np.dtype(np.float32), np.int16, "u1"]
    for step in range(300):
        dtype = spellings[step % len(spellings)]
        n = rng.randrange(0, 1000) if step % 7 else (4, 5)  # a 2-D shape now and then
        a = pool.empty(n, dtype)
        want = np.dtype(dtype)
        shape = (n,) if isinstance(n, int) else n
        assert (
            a.shape == shape and a.dtype == want and a.nbytes == int(np.prod(shape)) * want.itemsize
        )
        if a.size:
            seen_ptrs.add(a.ptr)
            a.set(np.arange(a.size).reshape(shape).astype(want))
            np.testing.assert_array_equal(a.get(), np.arange(a.size).reshape(shape).astype(want))
        a.free()
    assert len(seen_ptrs) < 100  # blocks reused across lengths and dtypes (300 hand-outs)
    with pytest.raises(sk.InvalidValueError):
        pool.empty(-1, np.float32)
    with pytest.raises(TypeError):
        pool.empty(3, "not a dtype")


def test_size_class_functions_refuse_what_has_no_class() -> None:
    for bad in (0, -1, 2**62 + 1):
        with pytest.raises(ValueError, match="size_class takes"):
            size_class(bad)
    for bad in (0, -3, 10**6):
        with pytest.raises(ValueError, match="no size class"):
            class_size(bad)


# -- the C fast path (svmkit.resources._cpool) -------------------------------------------
def test_fast_path_reuses_a_ready_block_and_counts_exactly(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    first = pool.allocate(100)
    ptr = first.ptr
    first.free()
    for _ in range(1000):  # served from the ready list, freed back to it
        a = pool.allocate(100)
        assert a.ptr == ptr and a.nbytes == 100 and a.u8.size == 100
        assert a is not first and not a.freed
        a.free()
        assert a.freed
    assert first.freed  # a record of an earlier hand-out stays freed
    assert pool.statistics() == {
        "current_bytes": 0,
        "peak_bytes": 100,
        "total_bytes": 100 * 1001,
        "current_allocations": 0,
        "peak_allocations": 1,
        "total_allocations": 1001,
    }
    info = pool.info()
    assert info["upstream_allocations"] == 1 and info["cached_blocks"] == 1
    assert info["cached_bytes"] == class_size(size_class(100))


def test_fast_free_respects_max_cached_bytes(ctx: cl.Context) -> None:
    upstream = sk.StatisticsAdaptor(sk.SVMResource(ctx))
    pool = sk.PoolResource(upstream, max_cached_bytes=64)
    a, b = pool.allocate(64), pool.allocate(64)
    a.free()  # fits under the limit: cached
    b.free()  # beyond it: released upstream at once
    assert pool.cached_bytes == 64 and pool.max_cached_bytes == 64
    assert upstream.stats()["current_bytes"] == 64
    info = pool.info()
    assert info["upstream_blocks"] == 1 and info["live_allocations"] == 0


def test_fast_path_takes_the_smallest_fitting_class_and_stops_at_pending(
    ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    wanted = size_class(4096)
    larger = pool.allocate(class_size(wanted + 2))  # two classes up: fits
    far = pool.allocate(class_size(wanted + 5))  # five classes up: never taken
    pending = pool.allocate(class_size(wanted + 1))
    larger_ptr, far_ptr, pending_ptr = larger.ptr, far.ptr, pending.ptr
    far.free()
    larger.free()
    got = pool.allocate(4096)
    assert got.ptr == larger_ptr and pool.info()["upstream_blocks"] == 3
    # A pending block of a class between: polled first, taken once its event completed.
    gate = cl.UserEvent(ctx)
    pending.events.record(gate)
    pending.free()
    assert pool.info()["pending_bytes"] == class_size(wanted + 1)
    other = pool.allocate(4096)  # not before its event; the far block does not fit
    assert other.ptr not in (pending_ptr, larger_ptr, far_ptr)
    gate.set_status(cl.command_execution_status.COMPLETE)
    again = pool.allocate(4096)
    assert again.ptr == pending_ptr and pool.info()["pending_bytes"] == 0
    for a in (got, other, again):
        a.free()
    assert pool.info()["upstream_blocks"] == 4 and pool.info()["live_allocations"] == 0


@pytest.mark.parametrize(
    ("nbytes", "alignment", "error"),
    [
        (True, 0, sk.InvalidValueError),
        (64.0, 0, sk.InvalidValueError),
        (-1, 0, sk.InvalidValueError),
        (2**70, 0, sk.InvalidValueError),
        (64, 3, sk.InvalidValueError),
        (64, 1 << 20, sk.InvalidValueError),
    ],
)
def test_fast_path_leaves_bad_requests_to_the_checked_path(
    ctx: cl.Context, nbytes: Any, alignment: int, error: type[Exception]
) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    pool.allocate(64).free()  # a ready block of the class a bad request might take
    with pytest.raises(error):
        pool.allocate(nbytes, alignment)
    assert pool.statistics()["current_allocations"] == 0
    assert pool.info()["cached_blocks"] == 1  # nothing taken, nothing lost


def test_fast_path_after_the_pool_is_gone_is_a_reference_error(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    allocate = pool.allocate
    del pool
    gc.collect()
    with pytest.raises(ReferenceError, match="pool of this cache is gone"):
        allocate(64)


def test_record_of_an_adaptor_frees_through_the_adaptor(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    counted = sk.StatisticsAdaptor(pool)
    a = counted.allocate(256)
    a.free()  # not the pool's own record any more: the adaptor must see it back
    assert counted.stats()["current_allocations"] == 0
    assert pool.statistics()["current_allocations"] == 0


def test_a_collection_inside_the_pool_lock_frees_a_cycle_without_deadlock(
    ctx: cl.Context,
) -> None:
    # The collector may run while the pool's lock is held (any allocation can start it)
    # and finalise an unfreed allocation of that pool: its free must not wait for the lock.
    pool = sk.PoolResource(sk.SVMResource(ctx))
    leaked = pool.allocate(100)
    cycle: list[object] = [leaked]
    cycle.append(cycle)
    del leaked, cycle
    assert collects_holding(pool._cache), "a finaliser waited for the lock its thread holds"
    assert drain(10.0)
    assert pool.statistics()["current_allocations"] == 0 and pool.info()["cached_blocks"] == 1


def test_block_cache_refuses_misuse_with_clear_errors(ctx: cl.Context) -> None:
    from svmkit.resources._cpool import Block, BlockCache

    pool = sk.PoolResource(sk.SVMResource(ctx))
    with pytest.raises(TypeError, match="subtype of Record"):
        BlockCache(pool, int, 1 << 20, is_complete)
    with pytest.raises(TypeError, match="is_complete must be a callable"):
        BlockCache(pool, sk.Allocation, 1 << 20, 42)  # type: ignore[arg-type]
    bare = BlockCache.__new__(BlockCache)
    for use in (
        lambda: bare.take(64),
        lambda: bare.counts,
        lambda: bare.take_all(),
        lambda: bare.take_cached(64),
        lambda: bare.check(),
    ):
        with pytest.raises(RuntimeError, match="not initialised"):
            use()
    cache = pool._cache
    raw = sk.SVMResource(ctx)
    small = raw.allocate(64)
    with pytest.raises(ValueError, match="cannot hold a 128-byte block"):
        cache.adopt(small, 100)  # (100 bytes take a class-2 block)
    mine = pool.allocate(64)
    with pytest.raises(ValueError, match="held by this pool already"):
        cache.adopt(mine.block.upstream, 64)
    with pytest.raises(ValueError, match="not held by this pool"):
        cache.give(Block(1, small), 64, None)
    with pytest.raises(TypeError, match="events: list"):
        cache.give(mine.block, 64, (object(),))  # type: ignore[arg-type]
    cache.check()  # nothing refused changed a figure
    assert pool.statistics()["total_allocations"] == 1
    assert pool.info()["upstream_blocks"] == 1
    mine.free()
    small.free()


def test_the_cache_decides_which_sizes_are_pooled(ctx: cl.Context) -> None:
    from svmkit.resources._cpool import BlockCache

    pool = sk.PoolResource(sk.SVMResource(ctx))
    upstream = sk.StatisticsAdaptor(sk.SVMResource(ctx))
    cache = BlockCache(pool, sk.Allocation, 1000, is_complete)  # a 1000-byte device limit
    assert cache.max_alloc == 1000 and cache.nclasses == 16  # classes 1 .. 15 (960 B)
    sizes = (0, -1, 1, 960, 961, 1000, 1001, 2**70)
    assert [cache.block_size(n) for n in sizes] == [None, None, 64, 960, 961, 1000, None, None]
    whole = cache.adopt(upstream.allocate(961), 961)  # class 16 would be 1024 B: unpooled
    assert whole.block.cls == 0 and whole.nbytes == 961 and cache.upstream_blocks == 1
    assert cache.take_cached(961) is None  # never cached, so never looked for
    whole.free()  # released upstream at once
    assert cache.upstream_blocks == 0 and cache.cached_bytes == 0
    assert upstream.stats()["current_allocations"] == 0
    pooled = cache.adopt(upstream.allocate(960), 960)
    pooled.free()  # class 15: cached
    assert cache.ready_blocks == 1 and upstream.stats()["current_allocations"] == 1
    assert cache.statistics()["total_allocations"] == 2
    cache.check()
    for block, _ in cache.take_all():
        block.upstream.free()
    assert upstream.stats()["current_allocations"] == 0


def test_every_hand_out_is_counted_once(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    grown = pool.allocate(256)  # growth
    waiting = pool.allocate(300)  # growth, class 5
    gate = cl.UserEvent(ctx)
    waiting.events.record(gate)
    waiting.free()  # pending
    grown.free()  # ready
    fast = pool.allocate(256)  # the C fast path
    gate.set_status(cl.command_execution_status.COMPLETE)
    polled = pool.allocate(300)  # the pending block, polled
    empty = pool.allocate(0)  # no block: not a hand-out of the pool's
    assert (fast.ptr, polled.ptr) == (grown.ptr, waiting.ptr)
    stats = pool.statistics()
    assert (stats["total_allocations"], stats["current_allocations"]) == (4, 2)
    assert (stats["total_bytes"], stats["current_bytes"]) == (256 + 300 + 256 + 300, 556)
    assert pool.info()["live_allocations"] == 2 and pool.info()["upstream_allocations"] == 2
    pool._cache.check()
    for a in (fast, polled, empty):
        a.free()
    assert pool.statistics()["current_allocations"] == 0


def test_pending_blocks_live_in_the_cache_with_their_events(ctx: cl.Context) -> None:
    from svmkit.events.exit_wait import _recorded_events

    pool = sk.PoolResource(sk.SVMResource(ctx))
    cache = pool._cache
    gate = cl.UserEvent(ctx)
    a = pool.allocate(256)
    ptr = a.ptr
    a.events.record(gate)
    a.free()
    assert (cache.pending_blocks, cache.pending_bytes, cache.ready_blocks) == (1, 256, 0)
    assert cache.pending_events() == [gate]
    assert gate in _recorded_events()  # the exit wait finds it through the pool
    cache.check()
    gate.set_status(cl.command_execution_status.COMPLETE)
    b = pool.allocate(256)
    assert b.ptr == ptr and cache.pending_blocks == 0 and cache.pending_events() == []
    cache.check()
    b.free()


def test_a_miss_polls_at_most_8_pending_blocks_of_a_class(ctx: cl.Context) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    cache = pool._cache
    allocs = [pool.allocate(256) for _ in range(9)]
    ptrs = [a.ptr for a in allocs]
    gate, late = cl.UserEvent(ctx), cl.UserEvent(ctx)
    for a in allocs[:8]:  # the 8 oldest wait for the gate
        a.events.record(gate)
        a.free()
    allocs[8].events.record(late)
    allocs[8].free()
    late.set_status(cl.command_execution_status.COMPLETE)  # the newest is free to reuse...
    grown = pool.allocate(256)  # ...but lies beyond the 8 a miss polls: a new block
    assert grown.ptr not in ptrs and cache.pending_blocks == 9
    gate.set_status(cl.command_execution_status.COMPLETE)
    again = pool.allocate(256)  # the 8 polled completed: all 8 became ready, one went out
    assert again.ptr in ptrs[:8]
    assert (cache.ready_blocks, cache.pending_blocks) == (7, 1)
    nxt = pool.allocate(256)  # the C fast path takes the next ready one
    assert nxt.ptr in ptrs[:8] and cache.ready_blocks == 6
    cache.check()
    for a in (grown, again, nxt):
        a.free()


def test_a_failing_status_query_leaves_the_pending_block_listed(ctx: cl.Context) -> None:
    from svmkit.resources._cpool import BlockCache

    def broken(event: object) -> bool:
        raise sk.SVMError("status query failed")

    pool = sk.PoolResource(sk.SVMResource(ctx))
    pool._cache = cache = BlockCache(pool, sk.Allocation, 1 << 30, broken)
    a = cache.adopt(sk.SVMResource(ctx).allocate(256), 256)
    gate = cl.UserEvent(ctx)
    a.events.record(gate)
    a.free()
    with pytest.raises(sk.SVMError, match="status query failed"):
        cache.take_cached(256)
    assert cache.pending_blocks == 1 and cache.statistics()["current_allocations"] == 0
    cache.check()
    gate.set_status(cl.command_execution_status.COMPLETE)
    ((block, events),) = cache.take_all()
    assert events == [gate] and cache.upstream_blocks == 0
    block.upstream.free()


# -- event-ordered reuse -----------------------------------------------------------------
def test_block_in_use_by_a_waiting_kernel_is_not_reused(
    ctx: cl.Context, spin: cl.Kernel, policy: sk.Policy
) -> None:
    pool = sk.Pool(ctx, policy)
    qa, qb = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    gate = cl.UserEvent(ctx)
    a = pool.empty(N, np.int32)
    old = a.ptr
    evt = spin(qa, (N,), None, a, np.int32(1000), np.int32(7), wait_for=[gate])
    a.record(evt)
    a.free()
    b = pool.zeros(N, np.int32)  # the kernel has not even started: a's block must wait
    assert b.ptr != old and not is_complete(evt)
    gate.set_status(cl.command_execution_status.COMPLETE)
    evt.wait()
    np.testing.assert_array_equal(b.get(qb), np.zeros(N))  # the kernel wrote elsewhere
    c = pool.empty(N, np.int32)  # now the block is free to reuse
    assert c.ptr == old
    np.testing.assert_array_equal(c.get(qb), np.full(N, 7))  # what the kernel left there
    b.free()
    c.free()


def test_long_kernel_block_is_not_handed_out_before_it_ends(
    ctx: cl.Context, spin: cl.Kernel
) -> None:
    pool = sk.Pool(ctx)
    qa, qb = cl.CommandQueue(ctx), cl.CommandQueue(ctx)
    a = pool.empty(N, np.int32)
    old = a.ptr
    # The kernel waits for a gate this test opens: it cannot end before the allocations
    # below, however fast the device (an H200 finished the spin before the first one).
    gate = cl.UserEvent(ctx)
    evt = spin(qa, (N,), None, a, np.int32(200_000), np.int32(5), wait_for=[gate])
    a.enqueue_free(qa)  # clEnqueueSVMFree semantics on queue A
    handed: list[tuple[int, bool]] = []
    live = []
    try:
        for _ in range(100):  # allocate on queue B's behalf while the kernel is pending
            x = pool.zeros(N, np.int32)
            handed.append((x.ptr, is_complete(evt)))
            live.append(x)
            if len(live) > 64:
                live.pop(0).free()
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    assert not any(done for _, done in handed)
    assert all(ptr != old for ptr, _ in handed)
    evt.wait()
    for x in live:
        np.testing.assert_array_equal(x.get(qb), np.zeros(N))
        x.free()
    drain(5)
    later = [pool.empty(N, np.int32) for _ in range(70)]
    assert old in {x.ptr for x in later}  # reused once the kernel completed
    for x in later:
        x.free()


def test_queues_of_one_context_are_ordered_by_events(ctx: cl.Context, spin: cl.Kernel) -> None:
    pool = sk.PoolResource(sk.SVMResource(ctx))
    queues = [cl.CommandQueue(ctx) for _ in range(3)]
    gate = cl.UserEvent(ctx)
    freed = []
    for i, q in enumerate(queues):
        a = sk.empty(ctx, N, np.int32, resource=pool)
        a.record(spin(q, (N,), None, a, np.int32(10), np.int32(i + 1), wait_for=[gate]))
        freed.append(a.ptr)
        a.free()
    fresh = [sk.empty(ctx, N, np.int32, resource=pool) for _ in range(3)]
    assert not {a.ptr for a in fresh} & set(freed)
    for a in fresh:  # written (on svmkit's default queue) while every kernel still waits
        a.set(np.full(N, -1, np.int32))
    gate.set_status(cl.command_execution_status.COMPLETE)
    for q in queues:
        q.finish()
    for a, q in zip(fresh, queues):
        np.testing.assert_array_equal(a.get(q), np.full(N, -1))
        a.free()
    assert pool.info()["pending_bytes"] == 3 * 4096
    again = [sk.empty(ctx, N, np.int32, resource=pool) for _ in range(6)]
    assert set(freed) <= {a.ptr for a in again}
    assert pool.info()["pending_bytes"] == 0


# -- out of memory -----------------------------------------------------------------------
def test_out_of_memory_releases_the_cache_and_retries_once(ctx: cl.Context) -> None:
    limit = sk.LimitingAdaptor(sk.SVMResource(ctx), 4 << 20)
    pool = sk.PoolResource(limit)
    blocks = [pool.allocate(1 << 20) for _ in range(4)]
    for b in blocks:
        b.free()
    assert pool.cached_bytes == 4 << 20 and limit.used_bytes == 4 << 20
    big = pool.allocate(2 << 20)  # upstream refuses at first; the cache goes, then it fits
    assert pool.cached_bytes == 0 and limit.used_bytes == 2 << 20
    big.free()


def test_out_of_memory_message_has_the_figures(ctx: cl.Context) -> None:
    limit = sk.LimitingAdaptor(sk.SVMResource(ctx), 4 << 20)
    pool = sk.PoolResource(limit)
    live = pool.allocate(3 << 20)
    odd = pool.allocate(1000)  # a 1024-byte block: 24 bytes fragmented
    with pytest.raises(sk.OutOfMemoryError) as info:
        pool.allocate(2 << 20)
    err = info.value
    assert err.nbytes == 2 << 20 and err.cl_error is None  # the limit is svmkit's
    assert err.in_use_bytes == (3 << 20) + 1000
    assert err.cached_bytes == 0 and err.fragmented_bytes == 24
    text = str(err)
    assert f"{(3 << 20) + 1000} bytes in use" in text
    assert "0 bytes cached" in text and "24 bytes fragmented" in text
    live.free()
    odd.free()


def test_out_of_memory_waits_for_pending_blocks(ctx: cl.Context) -> None:
    limit = sk.LimitingAdaptor(sk.SVMResource(ctx), 2 << 20)
    pool = sk.PoolResource(limit)
    a = pool.allocate(2 << 20)
    gate = cl.UserEvent(ctx)
    a.events.record(gate)
    a.free()
    threading.Timer(0.2, gate.set_status, (cl.command_execution_status.COMPLETE,)).start()
    b = pool.allocate(1 << 20)  # must wait for the gate, return the 2 MiB block, retry
    assert is_complete(gate) and limit.used_bytes == 1 << 20
    b.free()


class _NullUpstream(sk.MemoryResource):
    """An upstream that hands out NULL without an error, as PyOpenCL's SVMPool can (a
    driver cannot be made to do this on demand)."""

    def __init__(self, real: sk.MemoryResource) -> None:
        self.context, self.policy = real.context, real.policy
        self.capabilities = real.capabilities
        self.freed = 0

    def allocate(self, nbytes: int, alignment: int = 0) -> sk.Allocation:
        return sk.Allocation(self, 0, nbytes, u8=np.empty(nbytes, np.uint8))

    def deallocate(self, allocation: sk.Allocation) -> None:
        self.freed += 1


def test_upstream_results_are_checked(ctx: cl.Context) -> None:
    upstream = _NullUpstream(sk.SVMResource(ctx))
    pool = sk.PoolResource(upstream)
    with pytest.raises(sk.OutOfMemoryError) as info:
        pool.allocate(100)
    assert info.value.cl_error == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
    assert upstream.freed == 1 and pool.info()["upstream_blocks"] == 0


# -- trim and max_cached_bytes ------------------------------------------------------------
def test_trim_returns_every_cached_block_upstream(ctx: cl.Context) -> None:
    upstream = sk.StatisticsAdaptor(sk.SVMResource(ctx))
    pool = sk.PoolResource(upstream)
    allocs = [pool.allocate(n) for n in (100, 5000, 1 << 20)]
    gate = cl.UserEvent(ctx)
    allocs[0].events.record(gate)  # one pending block
    for a in allocs:
        a.free()
    expected = class_size(size_class(100)) + class_size(size_class(5000)) + (1 << 20)
    assert pool.cached_bytes == expected
    assert pool.trim() == expected
    assert pool.cached_bytes == 0 and upstream.stats()["current_bytes"] == 0
    assert pool.trim() == 0
    gate.set_status(cl.command_execution_status.COMPLETE)
    assert drain(5)


def test_max_cached_bytes_sends_the_excess_upstream(ctx: cl.Context) -> None:
    upstream = sk.StatisticsAdaptor(sk.SVMResource(ctx))
    pool = sk.PoolResource(upstream, max_cached_bytes=8192)
    allocs = [pool.allocate(4096) for _ in range(4)]
    for a in allocs:
        a.free()
    assert pool.cached_bytes == 8192 and upstream.stats()["current_bytes"] == 8192
    with pytest.raises(sk.InvalidValueError):
        sk.PoolResource(upstream, max_cached_bytes=-1)
    with pytest.raises(sk.InvalidValueError):
        sk.PoolResource("not a resource")  # type: ignore[arg-type]


# -- sk.Pool and the adaptors' figures ----------------------------------------------------
def test_pool_convenience_constructors_and_stats(ctx: cl.Context, policy: sk.Policy) -> None:
    pool = sk.Pool(ctx, policy)
    assert isinstance(pool, sk.MemoryResource) and not isinstance(pool, sk.PoolResource)
    assert isinstance(pool.pool, sk.PoolResource)  # composed: statistics are its counters
    assert isinstance(pool.pool.upstream, sk.SVMResource)
    a = pool.empty((4, 4), np.float32)
    z = pool.zeros(10, np.int64)
    o = pool.ones(3)
    f = pool.full(5, 7, np.int16)
    s = pool.asarray(np.arange(6.0))
    assert all(x.allocation.resource is pool.resource for x in (a, z, o, f, s))
    np.testing.assert_array_equal(z.get(), np.zeros(10))
    np.testing.assert_array_equal(o.get(), np.ones(3))
    np.testing.assert_array_equal(f.get(), np.full(5, 7))
    np.testing.assert_array_equal(s.get(), np.arange(6.0))
    assert pool.asarray(s) is s
    stats = pool.stats()
    assert stats["current_allocations"] == 5 and stats["total_allocations"] == 5
    assert stats["current_bytes"] == 64 + 80 + 24 + 10 + 48 == stats["peak_bytes"]
    assert stats["in_use_bytes"] == stats["current_bytes"]
    for x in (a, z, o, f, s):
        x.free()
    stats = pool.stats()
    assert stats["current_bytes"] == 0 and stats["current_allocations"] == 0
    assert stats["peak_bytes"] == 226 and stats["total_allocations"] == 5
    assert stats["cached_bytes"] > 0
    assert pool.trim() == stats["cached_bytes"] and pool.stats()["cached_bytes"] == 0


def test_pool_arrays_get_fresh_views(ctx: cl.Context) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine()) if sk.capabilities(ctx).fine_grain_buffer else None
    if pool is None:
        pytest.skip("host views of pooled memory need fine-grain SVM")
    a = pool.empty(8, np.int32)
    a.host[:] = 3
    view = a.host
    a.free()
    b = pool.empty(8, np.int32)  # the block stays a's while its host view lives
    assert b.ptr != view.ctypes.data
    b.host[:] = 5
    view[:] = -1
    assert list(b.host) == [5] * 8
    address = view.ctypes.data
    del view
    assert drain(10.0)
    c = pool.empty(8, np.int32)  # the view gone, the block is reused...
    assert c.ptr == address
    c_view = c.host
    with warnings.catch_warnings():  # NumPy 2.5 deprecates setting .shape in place
        warnings.simplefilter("ignore", DeprecationWarning)
        c_view.shape = (2, 4)  # changing one view never reaches the array
    assert c.shape == (8,) and c.host.shape == (8,)
    b.free()
    c.free()


def test_tracking_lists_outstanding_allocations_with_stacks(ctx: cl.Context) -> None:
    tracker = sk.TrackingAdaptor(sk.PoolResource(sk.SVMResource(ctx)))
    a = sk.empty(ctx, 100, np.uint8, resource=tracker)
    b = tracker.allocate(10)
    out = tracker.outstanding()
    assert [o.allocation for o in out] == [a.allocation, b]
    assert "test_tracking_lists_outstanding_allocations_with_stacks" in out[0].stack
    assert tracker.outstanding_bytes() == 110
    a.free()
    del b, out  # dropping the last reference frees it: tracking holds it only weakly
    assert tracker.outstanding() == []


def test_statistics_count_exactly(ctx: cl.Context) -> None:
    stats = sk.StatisticsAdaptor(sk.SVMResource(ctx))
    allocs = [stats.allocate(n) for n in (10, 20, 30)]
    allocs[1].free()
    allocs[1].free()  # idempotent: counted once
    assert stats.stats() == {
        "current_bytes": 40,
        "peak_bytes": 60,
        "total_bytes": 60,
        "current_allocations": 2,
        "peak_allocations": 3,
        "total_allocations": 3,
    }
    stats.allocate(0).free()  # holds no memory: not counted
    assert stats.stats()["total_allocations"] == 3


def test_limit_is_exact(ctx: cl.Context) -> None:
    limit = sk.LimitingAdaptor(sk.SVMResource(ctx), 1000)
    a = limit.allocate(600)
    b = limit.allocate(400)
    with pytest.raises(sk.OutOfMemoryError) as info:
        limit.allocate(1)
    assert info.value.limit_bytes == 1000 and info.value.in_use_bytes == 1000
    a.free()
    c = limit.allocate(600)
    assert limit.used_bytes == 1000
    with pytest.raises(sk.InvalidValueError):
        sk.LimitingAdaptor(sk.SVMResource(ctx), -5)
    b.free()
    c.free()


# -- statistics are exact when read ----------------------------------------------------------
# No drain() before reading: a figure runs the releases finalizers handed over first.
THREADS, ROUNDS, ITERATIONS = 8, 20, 200


def _read(figure: str, pool: sk.Pool, adaptor: Any) -> tuple[int, int]:
    """(allocations, bytes) as the figure under test reports them (read first)."""
    if figure == "tracking":
        out = adaptor.outstanding()
        return len(out), sum(o.allocation.nbytes for o in out)
    stats = {
        "stats": pool.stats,
        "statistics": pool.statistics,
        "adaptor": lambda: adaptor.stats(),
    }.get(figure, pool.info)()
    if figure == "info":
        return stats["live_allocations"], stats["in_use_bytes"]
    return stats["current_allocations"], stats["current_bytes"]


def check_figures_after_threads_free_exported_arrays(
    ctx: cl.Context, figure: str, threads: int, rounds: int, iterations: int
) -> None:
    """``threads`` threads each run ``a = empty(); a.host[:] = s; a.free()`` ``iterations``
    times (``a.host`` is an export that dies at the end of its statement); right after
    the join the figure says nothing is held, ``rounds`` times."""
    pool = sk.Pool(ctx, sk.Policy.fine())
    adaptor: Any = None
    if figure == "adaptor":
        adaptor = sk.StatisticsAdaptor(pool.pool)
    elif figure == "tracking":
        adaptor = sk.TrackingAdaptor(pool.pool, capture_stacks=False)
    resource = adaptor or pool
    stamp = np.arange(16, dtype=np.float32)

    def body(i: int) -> None:
        for _ in range(iterations):
            a = sk.empty(ctx, 16, np.float32, resource=resource)
            a.host[:] = stamp
            a.free()

    for done in range(rounds):
        run_threads(body, threads, start_together=True)
        assert _read(figure, pool, adaptor) == (0, 0), f"after round {done}"
    stats = pool.stats()
    assert stats["total_allocations"] == threads * rounds * iterations
    assert stats["cached_bytes"] == stats["upstream_bytes"]  # every block is back


@pytest.mark.needs("fine")
@pytest.mark.parametrize("figure", ["stats", "statistics", "info", "adaptor", "tracking"])
def test_figures_are_exact_right_after_threads_free_exported_arrays(
    ctx: cl.Context, figure: str
) -> None:
    check_figures_after_threads_free_exported_arrays(ctx, figure, THREADS, ROUNDS, ITERATIONS)


@pytest.mark.stress
@pytest.mark.needs("fine")
@pytest.mark.parametrize("figure", ["stats", "tracking"])
def test_figures_are_exact_right_after_threads_free_exported_arrays_long(
    ctx: cl.Context, figure: str
) -> None:
    check_figures_after_threads_free_exported_arrays(
        ctx, figure, THREADS, rounds=200, iterations=400
    )


@pytest.mark.needs("fine")
def test_reading_while_threads_keep_freeing_exported_arrays_is_never_held_up(
    ctx: cl.Context,
) -> None:
    # A reader waits only for the releases other threads run at the moment it reads,
    # never for the ones a steady stream of finalizers keeps handing over after it.
    pool = sk.PoolResource(sk.SVMResource(ctx, sk.Policy.fine()))  # (never a debug pool)
    stop = threading.Event()

    def body(i: int) -> None:
        if i == 0:  # the reader
            slowest, reads, end = 0.0, 0, time.perf_counter() + 0.5
            while time.perf_counter() < end:
                start = time.perf_counter()
                assert pool.statistics()["current_bytes"] % 64 == 0
                slowest = max(slowest, time.perf_counter() - start)
                reads += 1
            stop.set()
            assert reads > 10
            assert slowest < 1.0, f"a read took {slowest:.3f} s"
            return
        while not stop.is_set():
            a = sk.empty(ctx, 16, np.float32, resource=pool)
            a.host[:] = i
            a.free()

    run_threads(body, 4, start_together=True)
    assert pool.statistics()["current_bytes"] == 0


@pytest.mark.needs("fine")
@pytest.mark.parametrize("tracking_first", [False, True])
def test_an_export_dropped_just_before_reading_is_not_counted(
    ctx: cl.Context, tracking_first: bool
) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    tracker = sk.TrackingAdaptor(pool, capture_stacks=False)
    for _ in range(50):
        a = sk.empty(ctx, 100, np.uint8, resource=tracker)
        view = a.host[10:20]  # a NumPy view of an export
        a.free()
        held = tracker.outstanding()  # until the export goes, it counts
        assert [o.held_by_exports for o in held] == [True]
        assert pool.stats()["current_bytes"] == 100
        del view, held
        if tracking_first:
            assert tracker.outstanding() == []
        stats = pool.stats()
        assert (stats["current_bytes"], stats["current_allocations"]) == (0, 0), stats
        assert (stats["in_use_bytes"], stats["live_allocations"]) == (0, 0), stats
        assert tracker.outstanding() == []


@pytest.mark.needs("fine")
def test_an_export_collected_inside_the_pool_lock_is_not_counted_once_read(
    ctx: cl.Context,
) -> None:
    # The collection on another thread holds the pool's lock: the finaliser hands the
    # release over (it takes no lock); reading the figures afterwards runs it.
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.empty(32, np.float64)
    cycle: list[object] = [a.host]
    cycle.append(cycle)  # an export only a garbage collection frees
    a.free()
    del cycle
    assert collects_holding(pool.pool._cache), "a finaliser waited for the pool's lock"
    stats = pool.stats()
    assert (stats["current_bytes"], stats["current_allocations"]) == (0, 0), stats


def test_an_array_collected_in_a_cycle_is_not_counted_once_read(ctx: cl.Context) -> None:
    pool = sk.Pool(ctx)
    tracker = sk.TrackingAdaptor(pool)
    leaked = sk.empty(ctx, 100, np.uint8, resource=tracker)
    cycle: list[object] = [leaked]
    cycle.append(cycle)
    del leaked, cycle
    gc.collect()  # finalised inside a collection: its free is handed over
    assert tracker.outstanding() == []
    assert pool.statistics()["current_allocations"] == 0


@pytest.mark.needs("fine")
def test_reading_figures_inside_a_release_callback_does_not_deadlock(
    ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    seen: list[tuple[int, int]] = []
    keep = pool.empty(8, np.int32)
    a = pool.empty(16, np.int32)

    def callback(q: cl.CommandQueue, arrays: list[sk.SVMArray]) -> None:
        keep.host[:] = 1  # an export that dies here: a release handed over
        stats = pool.stats()  # on the release thread, inside a release: runs it
        seen.append((stats["current_allocations"], stats["current_bytes"]))

    a.enqueue_free(queue, callback=callback).wait()
    assert drain(10.0), "the release thread is stuck"
    assert seen == [(1, 32)]
    assert keep.host.tolist() == [1] * 8
    keep.free()


# -- stress --------------------------------------------------------------------------------
def _stress(ctx: cl.Context, threads: int, steps: int) -> int:
    """Threads allocate, stamp, verify and free; the pooled allocations made."""
    caps = sk.capabilities(ctx)
    policy = sk.Policy.fine() if caps.fine_grain_buffer else sk.Policy.coarse()
    upstream = sk.StatisticsAdaptor(sk.SVMResource(ctx, policy))
    pool = sk.StatisticsAdaptor(sk.PoolResource(upstream))
    host = not policy.needs_map

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        live: list[tuple[Any, int]] = []
        gates: list[cl.UserEvent] = []  # a quarter of the frees wait for one: pending blocks
        for _ in range(steps):
            if len(live) >= 32 or (live and rng.random() < 0.5):
                a, tag = live.pop(rng.randrange(len(live)))
                if host:  # nobody else wrote into our array meanwhile
                    assert a[0] == tag and a[-1] == tag  # (no export: no .host)
                if rng.random() < 0.25:
                    gates.append(cl.UserEvent(ctx))
                    a.record(gates[-1])
                a.free()
                if len(gates) > 4:
                    gates.pop(0).set_status(cl.command_execution_status.COMPLETE)
            else:
                n = rng.randint(1, 4 << 20)
                a = sk.empty(ctx, n, np.uint8, resource=pool)
                tag = rng.randrange(256)
                if host:
                    a[0] = a[-1] = tag
                live.append((a, tag))
        for a, _ in live:
            a.free()
        for gate in gates:
            gate.set_status(cl.command_execution_status.COMPLETE)

    run_threads(worker, threads)
    stats = pool.stats()  # exact when read: no drain() first
    assert stats["current_bytes"] == 0 and stats["current_allocations"] == 0
    assert stats["total_allocations"] > threads * steps // 3
    info = pool.upstream.info()  # type: ignore[attr-defined]
    assert info["live_allocations"] == 0 and info["in_use_bytes"] == 0
    assert info["upstream_bytes"] == upstream.stats()["current_bytes"] == info["cached_bytes"]
    pool.upstream._cache.check()  # type: ignore[attr-defined]
    pool.trim()
    assert upstream.stats()["current_bytes"] == 0  # nothing leaked
    return int(stats["total_allocations"])


def test_stress_threads_alloc_free(ctx: cl.Context) -> None:
    assert _stress(ctx, threads=8, steps=1000) > 8 * 1000 // 3


@pytest.mark.stress
def test_stress_threads_alloc_free_long(ctx: cl.Context) -> None:
    assert _stress(ctx, threads=8, steps=100_000) > 8 * 100_000 // 3
