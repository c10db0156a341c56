"""Regression tests for defects the model-based fuzzer (tests/test_fuzz.py) found."""

from __future__ import annotations

import numpy as np
import pytest

import svmkit as sk
from svmkit import events


@pytest.mark.needs("coarse")
def test_zero_byte_coarse_array_host_access_needs_no_map(ctx):
    # Found by the fuzzer: `.host` of a zero-element COARSE array raised MapStateError
    # until the allocation had once been mapped, and passed afterwards; it touches no bytes.
    a = sk.empty(ctx, 0, np.uint8, policy=sk.Policy.coarse())
    assert a.host.shape == (0,)
    assert np.asarray(a).size == 0
    b = sk.zeros(ctx, 8, np.uint8, policy=sk.Policy.coarse())
    empty_view = b[3:3]
    assert empty_view.host.size == 0
    with pytest.raises(sk.MapStateError) as info:
        _ = b[3:4].host  # one byte outside a map is still refused
    assert info.value.cl_error is None


@pytest.mark.parametrize("cycle", [False, True])
def test_pooled_array_dying_in_a_reference_cycle_keeps_its_block_valid(ctx, cycle):
    # Found by the fuzzer (heap corruption in PoCL's allocator): a pooled array that died
    # in a reference cycle took its Block and the block's upstream allocation into the
    # garbage; the collector ran clSVMFree on the upstream memory while the array's own
    # finaliser put the block back in the cache, and the pool then handed out freed memory.
    import gc

    pool = sk.Pool(ctx)

    class Holder:
        a: sk.SVMArray
        self: object

    h = Holder()
    h.a = pool.full(100, 5, np.uint8)
    if cycle:
        h.self = h
    del h
    gc.collect()
    assert events.drain(10.0)  # a collected array is freed on the release thread
    b = pool.full(100, 7, np.uint8)  # the cached block again
    assert b.allocation.block.upstream.freed is False
    others = [sk.full(ctx, 100, 9, np.uint8) for _ in range(8)]
    lo, hi = b.ptr, b.ptr + 100
    assert all(o.ptr + 100 <= lo or o.ptr >= hi for o in others)
    np.testing.assert_array_equal(b.get(), np.full(100, 7, np.uint8))
    b.free()
    pool.trim()
    assert pool.stats()["upstream_bytes"] == 0


@pytest.mark.needs("coarse")
def test_zero_byte_command_inside_a_write_map_is_allowed(ctx, queue):
    # Found by the deep fuzz run: copy() into a zero-element view of a COARSE array mapped
    # for writing raised MapStateError (fill, get and set already allowed it): an empty
    # range touches no mapped byte.
    a = sk.zeros(ctx, 64, np.uint8, policy=sk.Policy.coarse())
    with sk.mapped(queue, a, "w"):
        empty = a[40:][5:5]  # a zero-element view at offset 40
        assert empty.offset == 40 and empty.size == 0
        sk.copy(queue, empty, np.empty(0, np.uint8))
        sk.fill(queue, empty, 1)
        with pytest.raises(sk.MapStateError):
            sk.copy(queue, a[10:11], np.zeros(1, np.uint8))


TOUCH = """
__kernel void touch(__global uchar *p, uint n) {
    if (get_global_id(0) < n) p[get_global_id(0)] ^= 1;
}
"""


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """Every CL_KERNEL_EXEC_INFO_SVM_PTRS list svmkit sets (the calls still go through)."""
    import svmkit.driver.entrypoints as icd

    calls: list[tuple[int, ...]] = []
    real = icd.set_kernel_exec_info_svm_ptrs
    monkeypatch.setattr(
        icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: (calls.append(p), real(k, p))[1]
    )
    return calls


@pytest.mark.needs("coarse")
def test_zero_byte_array_is_never_named_or_passed_as_null(ctx, queue, listed):
    # Found by the deep fuzz run on Intel's CPU runtime: a kernel whose SVM pointer list
    # had been set once was launched with a zero-element array (which allocates nothing,
    # ptr 0); the refreshed list named the NULL pointer and the driver answered
    # CL_INVALID_VALUE (PoCL accepts it).  The deep fuzz on NVIDIA's OpenCL then showed
    # that a NULL argument, after an SVM pointer argument, fails there with
    # CL_INVALID_KERNEL_ARGS.  A zero-byte array passes the context's placeholder.
    import pyopencl as cl

    from svmkit.ops.placeholder import placeholder

    kernel = cl.Kernel(sk.build_program(ctx, TOUCH), "touch")
    coarse = sk.Policy.coarse()
    real_array = sk.zeros(ctx, 4, np.uint8, policy=coarse)
    empty = sk.empty(ctx, 0, np.uint8, policy=coarse)
    assert empty.ptr == 0
    sk.launch(queue, kernel, (4,), None, real_array, np.uint32(4), uses=[real_array]).wait()
    sk.launch(queue, kernel, (1,), None, empty, np.uint32(0)).wait()
    sk.launch(queue, kernel, (1,), None, empty, np.uint32(0), uses=[empty]).wait()
    assert listed == [(real_array.ptr,), (placeholder(ctx).ptr,)]
    assert placeholder(ctx).ptr != 0 and placeholder(ctx).nbytes > 0
    np.testing.assert_array_equal(real_array.get(), np.ones(4, np.uint8))


@pytest.mark.needs("coarse")
def test_a_list_naming_freed_memory_is_replaced_before_the_next_launch(ctx, queue, listed):
    # Found by the deep fuzz run on NVIDIA's OpenCL (a segmentation fault inside
    # clEnqueueNDRangeKernel): the kernel's SVM pointer list still named an allocation
    # that had been freed, because the next launch had no pointer to list (its only
    # array argument had zero elements).  NVIDIA's driver dereferences the list at
    # enqueue; the list now holds the context's placeholder instead.
    import pyopencl as cl

    from svmkit import events
    from svmkit.ops.placeholder import placeholder

    kernel = cl.Kernel(sk.build_program(ctx, TOUCH), "touch")
    coarse = sk.Policy.coarse()
    out = sk.zeros(ctx, 4, np.uint8, policy=coarse)
    doomed = sk.zeros(ctx, 1 << 20, np.uint8, policy=coarse)
    sk.launch(queue, kernel, (4,), None, out, np.uint32(4), uses=[doomed]).wait()
    doomed.free()
    assert events.drain(10.0)  # clSVMFree has run
    sk.launch(queue, kernel, (1,), None, sk.empty(ctx, 0, np.uint8, policy=coarse), np.uint32(0))
    sk.launch(queue, kernel, (4,), None, out, np.uint32(4)).wait()
    assert listed[1:] == [(placeholder(ctx).ptr,)]
    np.testing.assert_array_equal(out.get(), np.zeros(4, np.uint8))  # touched twice


@pytest.mark.parametrize("direction", ["to_host", "from_host"])
def test_dropping_an_array_under_a_pending_host_copy_frees_it_after_the_copy(
    ctx, queue, direction, monkeypatch
):
    # Found by the deep fuzz run on NVIDIA's OpenCL, where copies finish later than on a
    # CPU: a non-blocking copy between an SVMArray and NumPy kept the SVMArray itself
    # alive until the copy finished, so dropping the last reference did not free it.
    # Only the NumPy side needs holding; the SVM memory's clSVMFree already waits for
    # the copy's event.
    import gc
    import weakref

    import pyopencl as cl

    from svmkit import events
    from svmkit.driver import entrypoints

    driver_frees: list[int] = []
    real_free = entrypoints.svm_free
    monkeypatch.setattr(
        entrypoints, "svm_free", lambda c, ptr: (driver_frees.append(ptr), real_free(c, ptr))[1]
    )
    stats = sk.StatisticsAdaptor(sk.SVMResource(ctx, sk.Policy.best(ctx, system=False)))
    a = sk.full(ctx, 100, 7, np.uint8, resource=stats)
    ptr = a.ptr
    host = np.zeros(100, np.uint8)
    gate = cl.UserEvent(ctx)
    if direction == "to_host":
        event = sk.copy(queue, host, a, blocking=False, wait_for=[gate])
    else:
        event = sk.copy(queue, a, host, blocking=False, wait_for=[gate])
    record = weakref.ref(a.allocation)
    del a
    try:
        gc.collect()
        dropped = record()
        assert dropped is None or dropped.freed  # freed as by free() ...
        del dropped
        assert stats.stats()["current_bytes"] == 0
        assert ptr not in driver_frees  # ... the driver's memory kept for the copy
    finally:  # an incomplete user event would block the context's release
        gate.set_status(cl.command_execution_status.COMPLETE)
    event.wait()
    assert events.drain(10.0)
    assert driver_frees.count(ptr) == 1
    if direction == "to_host":
        np.testing.assert_array_equal(host, np.full(100, 7, np.uint8))
