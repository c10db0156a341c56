"""pyopencl.array bridges: to_cl_array (zero-copy, an export, ordered after its queue),
sk.asarray of a bridge (zero-copy), sk.cl_allocator (temporaries from a svmkit pool, each
block back only after a marker on the queue), reductions with mako."""

from __future__ import annotations

import gc

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import svmkit as sk
from svmkit import events

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
    prg = cl.Program(ctx, SLOW).build()
    t = cla.empty(queue, 1024, np.int32, allocator=alloc)
    address = t.base_data.svm_ptr if hasattr(t.base_data, "svm_ptr") else None
    gate = cl.UserEvent(ctx)  # the kernel is pending until the checks below are done
    event = prg.slow_fill(
        queue, (1024,), None, t.data, np.int32(2_000_000), np.int32(1), wait_for=[gate]
    )
    try:
        del t  # PyOpenCL drops the temporary while its kernel is pending
        u = cla.empty(queue, 1024, np.int32, allocator=alloc)
        assert event.command_execution_status != cl.command_execution_status.COMPLETE
        assert u.base_data.svm_ptr != address
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    event.wait()
    queue.finish()
    assert events.drain(10.0)
    v = pool.empty(1024, np.int32)
    assert v.ptr == address or u.base_data.svm_ptr == address


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


def test_to_device_of_an_svm_array_is_a_type_error_naming_to_cl_array(ctx, queue, policy):
    a = sk.asarray(ctx, np.arange(4, dtype=np.float32), policy=policy)
    with pytest.raises(TypeError, match=r"a\.to_cl_array\(queue\)") as err:
        cla.to_device(queue, a)
    assert "a.get()" in str(err.value)
    assert not hasattr(a, "flags")  # duck typing still sees no NumPy array
    assert a.to_cl_array(queue).get().tolist() == [0, 1, 2, 3]  # the ways it names work
    assert cla.to_device(queue, a.get()).get().tolist() == [0, 1, 2, 3]
