"""Regression tests for defects the model-based fuzzer (tests/test_fuzz.py) found."""

from __future__ import annotations

import numpy as np
import pytest

import svmkit as sk


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
        pass

    h = Holder()
    h.a = pool.full(100, 5, np.uint8)
    if cycle:
        h.self = h
    del h
    gc.collect()
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


@pytest.mark.needs("coarse")
def test_zero_byte_array_is_never_named_in_svm_ptrs(ctx, queue, monkeypatch):
    # Found by the deep fuzz run on Intel's CPU runtime: a kernel whose SVM pointer list
    # had been set once was launched with a zero-element array (which allocates nothing,
    # ptr 0); the refreshed list named the NULL pointer and the driver answered
    # CL_INVALID_VALUE (PoCL accepts it).  NULL never reaches the list.  Run on NVIDIA's
    # OpenCL, the same launch showed a second defect: a NULL SVM pointer argument fails
    # with CL_INVALID_KERNEL_ARGS; a zero-byte array passes as a NULL buffer argument.
    import pyopencl as cl

    import svmkit._icd as icd

    listed: list[tuple[int, ...]] = []
    real = icd.set_kernel_exec_info_svm_ptrs
    monkeypatch.setattr(
        icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: (listed.append(p), real(k, p))[1]
    )
    kernel = cl.Kernel(
        sk.build_program(
            ctx,
            "__kernel void touch(__global uchar *p, uint n) {"
            " if (get_global_id(0) < n) p[get_global_id(0)] ^= 1; }",
        ),
        "touch",
    )
    coarse = sk.Policy.coarse()
    real_array = sk.zeros(ctx, 4, np.uint8, policy=coarse)
    empty = sk.empty(ctx, 0, np.uint8, policy=coarse)
    assert empty.ptr == 0
    sk.launch(queue, kernel, (4,), None, real_array, np.uint32(4), uses=[real_array]).wait()
    sk.launch(queue, kernel, (1,), None, empty, np.uint32(0)).wait()  # refresh: nothing
    sk.launch(queue, kernel, (1,), None, empty, np.uint32(0), uses=[empty]).wait()
    assert listed == [(real_array.ptr,)]
    np.testing.assert_array_equal(real_array.get(), np.ones(4, np.uint8))
