"""pyopencl.array bridges: to_cl_array (zero-copy, an export, ordered after its queue),
sk.asarray of a bridge (zero-copy), sk.cl_allocator (temporaries from a svmkit pool, each
block back only after a marker on the queue), reductions with mako."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest
from _helpers import run_threads

import svmkit as sk
from svmkit import events
from svmkit.driver import calls
from svmkit.events.epochs import EPOCH_BLOCKS, EPOCH_BYTES, TICK_SECONDS, queue_epochs

SLOW = """
__kernel void slow_fill(__global int *p, int n, int value) {
    uint v = get_global_id(0);
    for (int k = 0; k < n; k++) v = v * 1664525u + 1013904223u;  /* not foldable */
    p[get_global_id(0)] = (v == 0xFFFFFFFFu && n == 7) ? 0 : value;
}
"""


def test_to_cl_array_is_zero_copy_for_every_granularity(ctx, queue, policy):
    a = sk.asarray(ctx, np.arange(8, dtype=np.float32), policy=policy)
    c = a.to_cl_array(queue)
    assert isinstance(c, cla.Array) and c.shape == (8,) and c.dtype == np.float32
    assert c.get().tolist() == list(range(8))
    c += 1
    queue.finish()
    assert a.get().tolist() == [float(i + 1) for i in range(8)]
    assert cla.sum(c).get() == 36.0  # pyopencl.array reductions (mako) work
    view = a[2:6].to_cl_array(queue)
    assert view.get().tolist() == [3.0, 4.0, 5.0, 6.0]


def test_asarray_of_a_bridge_is_the_same_memory(ctx, queue, policy):
    a = sk.asarray(ctx, np.arange(6, dtype=np.int32), policy=policy)
    back = sk.asarray(ctx, a.to_cl_array(queue))
    assert isinstance(back, sk.SVMArray) and back.ptr == a.ptr and back.shape == (6,)
    sub = sk.asarray(ctx, a.to_cl_array(queue)[2:5])
    assert sub.ptr == a.ptr + 8 and sub.get().tolist() == [2, 3, 4]
    other = cla.to_device(queue, np.arange(3, dtype=np.int32))
    copied = sk.asarray(ctx, other)
    assert copied.get().tolist() == [0, 1, 2]


def test_free_of_a_bridged_array_waits_for_the_queue_and_the_bridge(ctx, queue, policy):
    pool = sk.Pool(ctx, policy)
    prg = cl.Program(ctx, SLOW).build()
    a = pool.zeros(1024, np.int32)
    address = a.ptr
    c = a.to_cl_array(queue)
    gate = cl.UserEvent(ctx)  # the kernel is pending until the checks below are done
    event = prg.slow_fill(
        queue, (1024,), None, c.data, np.int32(2_000_000), np.int32(5), wait_for=[gate]
    )
    try:
        a.free()
        del c
        b = pool.empty(1024, np.int32)  # may not get the block under the pending kernel
        assert event.command_execution_status != cl.command_execution_status.COMPLETE
        assert b.ptr != address
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    assert events.drain(30.0)
    queue.finish()
    d = pool.empty(1024, np.int32)
    assert d.ptr == address  # back once the kernel finished and the bridge is gone
    assert d.get().tolist() == [5] * 1024


def test_cl_allocator_draws_temporaries_from_the_pool(ctx, queue):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    x = cla.to_device(queue, np.arange(1000, dtype=np.float32), allocator=alloc)
    before = pool.stats()["total_allocations"]
    y = x * 2 + 1
    assert y.get().tolist() == [2.0 * i + 1 for i in range(1000)]
    assert pool.stats()["total_allocations"] - before == 2  # x * 2, then + 1
    assert cla.sum(y).get() == pytest.approx(sum(2.0 * i + 1 for i in range(1000)))
    del x, y
    gc.collect()
    queue.finish()
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0


def test_cl_allocator_never_reuses_a_block_under_a_running_kernel(ctx, queue):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    other = cl.CommandQueue(ctx)  # its writes are not ordered after `queue`'s kernel
    prg = cl.Program(ctx, SLOW).build()
    t = cla.empty(queue, 1024, np.int32, allocator=alloc)
    address = t.base_data.svm_ptr
    gate = cl.UserEvent(ctx)  # the kernel is pending until the checks below are done
    event = prg.slow_fill(
        queue, (1024,), None, t.data, np.int32(200_000), np.int32(1), wait_for=[gate]
    )
    held = []
    try:
        del t  # PyOpenCL drops the block while its kernel is pending
        # Enough drops of the same size to close epochs on this thread and on the
        # release thread, each followed by allocations that would take the block back.
        for i in range(3 * EPOCH_BLOCKS):
            cla.empty(queue, 1024, np.int32, allocator=alloc)
            if i % EPOCH_BLOCKS == 0:
                assert events.drain(0.2) is False  # the flush waits for the kernel
            u = cla.empty(other, 1024, np.int32, allocator=alloc)
            u.fill(i + 2)
            held.append(u)
        other.finish()
        assert event.command_execution_status != cl.command_execution_status.COMPLETE
        assert address not in {u.base_data.svm_ptr for u in held}
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    event.wait()
    queue.finish()
    for i, u in enumerate(held):  # bytes of every later allocation are their own
        assert (u.get() == i + 2).all()
    del held, u
    assert events.drain(30.0)
    assert queue_epochs(queue).pending() == 0
    assert pool.stats()["current_bytes"] == 0
    v = pool.empty(1024, np.int32)
    assert v.ptr == address or address in _cached_addresses(pool)


def _cached_addresses(pool: sk.Pool) -> set[int]:
    """Addresses of the blocks a pool can hand out now (allocated until none is left)."""
    got = []
    while pool.info()["cached_blocks"]:
        got.append(pool.empty(1024, np.int32))
    return {a.ptr for a in got}


def test_cl_allocator_enqueues_one_marker_per_epoch(ctx, queue, monkeypatch):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    markers = []
    enqueue_marker = calls.enqueue_marker

    def counted(q, wait=None):
        event = enqueue_marker(q, wait)
        markers.append(event)
        return event

    monkeypatch.setattr(calls, "enqueue_marker", counted)
    n = 50 * EPOCH_BLOCKS
    for _ in range(n):
        alloc(4096)
    # Every EPOCH_BLOCKS drops close an epoch here; the release thread closes at most
    # one more per close it saw (a flush), and the blocks come back to the pool for reuse.
    assert len(markers) <= 2 * (n // EPOCH_BLOCKS) + 2
    assert pool.info()["upstream_blocks"] < n // 2  # blocks were reused during the loop
    assert events.drain(10.0)
    assert queue_epochs(queue).pending() == 0
    assert pool.stats()["current_bytes"] == 0
    assert all(events.is_complete(m) for m in markers)


def test_a_pool_miss_takes_blocks_of_a_completed_epoch_before_it_grows(ctx, queue, monkeypatch):
    """Blocks pyopencl.array dropped wait in a closed epoch until its marker completes; a
    pool that would otherwise grow (a clSVMAlloc) frees those whose marker completed first."""
    from svmkit.events.epochs import QueueEpochs

    monkeypatch.setattr(QueueEpochs, "tick", lambda self: False)  # the epoch thread idles
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    blocks = [alloc(4096) for _ in range(EPOCH_BLOCKS)]
    ptrs = {b.allocation.ptr for b in blocks}
    gate = cl.UserEvent(ctx)  # the epoch's marker cannot complete while the gate is closed
    calls.enqueue_marker(queue, [gate])
    try:
        del blocks  # 32 drops: the epoch closes with one marker
        epochs = queue_epochs(queue)
        assert epochs.pending() == EPOCH_BLOCKS and len(epochs.pending_events()) == 1
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    calls.finish(queue)  # the marker completed
    grown = pool.info()["upstream_blocks"]
    again = [alloc(4096) for _ in range(EPOCH_BLOCKS)]
    assert pool.info()["upstream_blocks"] == grown  # no new block from the driver
    assert {b.allocation.ptr for b in again} == ptrs
    del again
    monkeypatch.undo()
    assert events.drain(10.0) and pool.stats()["current_bytes"] == 0


def test_cl_allocator_large_block_gets_a_marker_of_its_own(ctx, queue, monkeypatch):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    markers = []
    enqueue_marker = calls.enqueue_marker
    monkeypatch.setattr(
        calls, "enqueue_marker", lambda q, wait=None: markers.append(1) or enqueue_marker(q, wait)
    )
    gate = cl.UserEvent(ctx)  # nothing completes while the gate is closed
    blocker = calls.enqueue_marker(queue, [gate])
    try:
        block = alloc(EPOCH_BYTES)
        address = block.svm_ptr
        before = len(markers)
        del block
        assert len(markers) == before + 1  # on the releasing thread, at once
        assert queue_epochs(queue).pending() == 0  # back in the pool, pending there
        assert pool.info()["pending_bytes"] >= EPOCH_BYTES
        again = alloc(EPOCH_BYTES)
        assert again.svm_ptr != address
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    blocker.wait()
    queue.finish()
    assert alloc(EPOCH_BYTES).svm_ptr == address  # reused once its marker completed
    del again
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0


def test_cl_allocator_memory_goes_back_without_a_drain(ctx, queue):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    x = cla.zeros(queue, 16, np.float32, allocator=alloc)
    assert (x + 1).get().tolist() == [1.0] * 16
    del x  # fewer releases than an epoch holds: the epoch thread closes it
    deadline = time.monotonic() + 10.0
    while pool.stats()["current_bytes"] and time.monotonic() < deadline:
        time.sleep(TICK_SECONDS)
    assert pool.stats()["current_bytes"] == 0
    assert queue_epochs(queue).pending() == 0


def test_cl_allocator_from_several_threads(ctx, queue):
    """Four threads, each with its own queue and allocator over one pool: blocks move
    between queues through the pool, and every result is the thread's own.  (One queue
    shared by the threads is not used: PoCL 3.0's pthread device then returns stale bytes
    with PyOpenCL's own SVMPool too, in about one run of eight.)  Allocations, frees and
    reads run concurrently; the two kernel launches are serialised: PyOpenCL's cached
    elementwise kernels are one object per context whose arguments are set, then
    enqueued, so threads launching them at once swap each other's SVM arguments (a
    thread then read its own earlier result in about one run of ten, on Intel's CPU
    runtime and PoCL alike; with the launches under a lock, none in 30 runs)."""
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    queues = [cl.CommandQueue(ctx) for _ in range(4)]
    launches = threading.Lock()

    def work(i: int) -> None:
        queue = queues[i]
        alloc = sk.cl_allocator(queue, pool)
        for k in range(3 * EPOCH_BLOCKS):
            x = cla.empty(queue, 64, np.int32, allocator=alloc)
            with launches:
                x.fill(1000 * i + k)
                y = x + 1  # a temporary of its own, dropped at once by the next line
            assert (y.get() == 1000 * i + k + 1).all()

    run_threads(work, 4, start_together=True)
    assert events.drain(10.0)
    assert all(queue_epochs(q).pending() == 0 for q in queues)
    assert pool.stats()["current_bytes"] == 0


def test_cl_allocator_blocks_dropped_in_a_collection_go_back(ctx, queue):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue, pool)
    gc.disable()
    try:
        for _ in range(2 * EPOCH_BLOCKS):
            x = cla.zeros(queue, 16, np.float32, allocator=alloc)
            x.cycle = x  # only a collection frees it
        del x
        assert pool.stats()["current_allocations"] == 2 * EPOCH_BLOCKS
        gc.collect()
    finally:
        gc.enable()
    assert events.drain(10.0)
    assert queue_epochs(queue).pending() == 0
    assert pool.stats()["current_bytes"] == 0


def test_default_cl_allocator_uses_the_current_resource(ctx, queue):
    pool = sk.Pool(ctx, sk.Policy.best(ctx, system=False))
    alloc = sk.cl_allocator(queue)
    with sk.use_resource(pool):
        x = cla.zeros(queue, 10, np.int64, allocator=alloc)
        assert pool.stats()["current_bytes"] == 80
    assert x.get().tolist() == [0] * 10


def test_cl_allocator_rejects_bad_arguments(ctx, other_ctx):
    with pytest.raises(sk.InvalidValueError):
        sk.cl_allocator("not a queue")
    with pytest.raises(sk.InvalidContextError):
        sk.cl_allocator(cl.CommandQueue(ctx), sk.Pool(other_ctx))


def test_to_device_of_an_svm_array_is_a_type_error(ctx, queue, policy):
    # An SVMArray has NumPy's flags (its whole ndarray surface) but no buffer protocol
    # (PyOpenCL's SVM type offers none), which PyOpenCL's host-to-device copy needs.
    a = sk.asarray(ctx, np.arange(4, dtype=np.float32), policy=policy)
    assert a.flags.c_contiguous and a.flags.forc
    with pytest.raises(TypeError, match="bytes-like"):
        cla.to_device(queue, a)
    assert a.to_cl_array(queue).get().tolist() == [0, 1, 2, 3]  # the ways it names work
    assert cla.to_device(queue, a.get()).get().tolist() == [0, 1, 2, 3]
