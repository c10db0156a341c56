"""SVMArray: kernels write through arrays and views, host rules, get/set, freeing."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk
from svmkit.driver import entrypoints

WRITE_INDEX = """
__kernel void write_index(__global int *out, int base) {
    size_t i = get_global_id(0);
    out[i] = base + (int)i;
}
__kernel void spin_then_write(__global volatile int *out, int iterations) {
    int acc = 0;
    for (int k = 0; k < iterations; ++k) { acc = acc * 1664525 + 1013904223; }
    out[0] = acc | 1;
}
"""


@pytest.fixture(scope="module")
def program(ctx):
    return sk.build_program(ctx, WRITE_INDEX)


@pytest.fixture
def write_index(program):
    return cl.Kernel(program, "write_index")


def test_kernel_writes_through_array_and_host_reads(ctx, queue, any_policy, write_index):
    a = sk.zeros(ctx, 64, np.int32, policy=any_policy)
    write_index(queue, (64,), None, a, np.int32(100)).wait()
    assert np.array_equal(a.get(queue), np.arange(100, 164, dtype=np.int32))
    if not any_policy.needs_map:
        assert np.array_equal(a.host, np.arange(100, 164))
        assert np.array_equal(np.asarray(a), np.arange(100, 164))
    a.free()


def test_kernel_writes_through_a_view_at_its_offset(ctx, queue, any_policy, write_index):
    a = sk.zeros(ctx, (4, 8), np.int32, policy=any_policy)
    row = a[2]
    assert row.ptr == a.ptr + 2 * 8 * 4
    assert row.allocation is a.allocation and row.base is a
    write_index(queue, (8,), None, row, np.int32(1)).wait()
    expected = np.zeros((4, 8), np.int32)
    expected[2] = np.arange(1, 9)
    assert np.array_equal(a.get(queue), expected)


def test_two_device_context_kernel_on_second_device(two_device_ctx):
    prg = sk.build_program(two_device_ctx, WRITE_INDEX)
    knl = cl.Kernel(prg, "write_index")
    q1 = cl.CommandQueue(two_device_ctx, two_device_ctx.devices[1])
    for policy in (sk.Policy.coarse(), sk.Policy.fine()):
        with sk.zeros(two_device_ctx, 16, np.int32, policy=policy) as a:
            knl(q1, (16,), None, a, np.int32(7)).wait()
            assert np.array_equal(a.get(), np.arange(7, 23))


def test_metadata_like_numpy(ctx):
    a = sk.empty(ctx, (3, 5), np.float32)
    assert (a.shape, a.dtype, a.size, a.nbytes, a.ndim, a.itemsize) == (
        (3, 5),
        np.dtype(np.float32),
        15,
        60,
        2,
        4,
    )
    assert len(a) == 3
    assert a.context == ctx
    assert a.base is None and a.freed is False
    v = a[1:, ::2]
    assert v.shape == (2, 3) and v.base is a and v.contiguous is False
    assert v.ptr == a.ptr + 5 * 4


def test_views_of_views_point_at_the_root(ctx):
    a = sk.zeros(ctx, 100, np.int16)
    v = a[10:90][5:20]
    assert v.base is a and v.ptr == a.ptr + 15 * 2
    assert v.reshape(3, 5).shape == (3, 5) and v.view(np.uint8).shape == (30,)
    assert v.reshape((5, 3)).ptr == v.ptr
    grid = sk.zeros(ctx, (4, 6), np.int16)
    with pytest.raises(sk.InvalidValueError, match="without copying") as info:
        grid[:, :3].reshape(12)
    assert info.value.cl_error == "CL_INVALID_VALUE"


@pytest.mark.needs("fine")
def test_fine_host_is_the_memory_itself(ctx):
    a = sk.zeros(ctx, 8, np.int64, policy=sk.Policy.fine())
    a.host[3] = 42
    a[4] = 7
    assert a[3] == 42 and a.get()[4] == 7
    assert a.host.ctypes.data == a.ptr


@pytest.mark.needs("coarse")
def test_coarse_host_outside_a_map_is_a_map_state_error(ctx):
    a = sk.zeros(ctx, 8, np.int64, policy=sk.Policy.coarse())
    for touch in (lambda: a.host, lambda: np.asarray(a), lambda: a[3], lambda: a[1:3].host):
        with pytest.raises(sk.MapStateError, match="mapped") as info:
            touch()
        assert info.value.cl_error is None
    with pytest.raises(sk.MapStateError):
        a[2] = 5
    assert np.array_equal(a.get(), np.zeros(8))


def test_get_and_set_strided_views(ctx, any_policy):
    a = sk.zeros(ctx, (4, 6), np.float64, policy=any_policy)
    a[:, 1].set([1, 2, 3, 4])
    a[::2, 3:5].set(9)
    expected = np.zeros((4, 6))
    expected[:, 1] = [1, 2, 3, 4]
    expected[::2, 3:5] = 9
    assert np.array_equal(a.get(), expected)
    assert np.array_equal(a[:, 1].get(), [1, 2, 3, 4])
    assert np.array_equal(a[::-1, ::2].get(), expected[::-1, ::2])
    assert np.array_equal(a.T.get(), expected.T)


def test_set_casts_and_broadcasts_and_rejects_bad_shapes(ctx, any_policy):
    a = sk.zeros(ctx, (2, 3), np.int32, policy=any_policy)
    a.set([1.9, 2.2, 3.0])
    assert np.array_equal(a.get(), [[1, 2, 3], [1, 2, 3]])
    with pytest.raises(sk.InvalidValueError, match="shape") as info:
        a.set(np.ones(4))
    assert info.value.cl_error == "CL_INVALID_VALUE"
    assert np.array_equal(a.get(), [[1, 2, 3], [1, 2, 3]])


def test_constructors(ctx, any_policy):
    assert np.array_equal(sk.ones(ctx, 5, np.int8, policy=any_policy).get(), np.ones(5))
    f = sk.full(ctx, (2, 2), 2.5, policy=any_policy)
    assert f.dtype == np.float64 and np.array_equal(f.get(), np.full((2, 2), 2.5))
    z = sk.zeros_like(f)
    assert (
        z.shape == (2, 2) and z.policy == any_policy and np.array_equal(z.get(), np.zeros((2, 2)))
    )
    e = sk.empty_like(f, dtype=np.int16)
    assert e.dtype == np.int16 and e.shape == (2, 2)
    src = np.arange(12, dtype=np.uint16).reshape(3, 4)
    b = sk.asarray(ctx, src, policy=any_policy)
    assert np.array_equal(b.get(), src) and b.dtype == np.uint16
    assert sk.asarray(ctx, b) is b
    c = sk.asarray(ctx, b, dtype=np.float32)
    assert c is not b and np.array_equal(c.get(), src.astype(np.float32))
    odd = sk.full(ctx, 3, np.array((1, 2, 3), dtype="u1,u1,u1"), policy=any_policy)
    assert odd.get().tolist() == [(1, 2, 3)] * 3


def test_free_is_idempotent_and_any_later_use_raises(ctx, any_policy):
    a = sk.zeros(ctx, 16, np.int32, policy=any_policy)
    v = a[4:8]
    a.free()
    a.free()
    assert a.freed and v.freed
    for use in (
        lambda: a.ptr,
        lambda: v.ptr,
        a.get,
        v.get,
        lambda: a.set(1),
        lambda: a.host,
        lambda: v.host,
        lambda: a[2:4],
        lambda: a.reshape(4, 4),
    ):
        with pytest.raises(sk.UseAfterFreeError) as info:
            use()
        assert info.value.cl_error is None


def test_freeing_a_view_frees_the_allocation(ctx):
    a = sk.zeros(ctx, 16, np.int32)
    a[2:4].free()
    assert a.freed
    with pytest.raises(sk.UseAfterFreeError):
        a.get()


class CountingResource(sk.SVMResource):
    def __init__(self, ctx, policy=None):
        super().__init__(ctx, policy)
        self.deallocations = 0

    def deallocate(self, allocation):
        self.deallocations += 1
        super().deallocate(allocation)


def test_context_manager_frees_once(ctx):
    resource = CountingResource(ctx)
    with sk.empty(ctx, 10, resource=resource) as a:
        assert not a.freed
    assert a.freed and resource.deallocations == 1
    a.free()
    assert resource.deallocations == 1


def test_last_reference_frees_exactly_once(ctx):
    resource = CountingResource(ctx)
    a = sk.zeros(ctx, 10, resource=resource)
    v = a[2:5]
    del a
    gc.collect()
    assert resource.deallocations == 0  # the view keeps the allocation alive
    del v
    gc.collect()
    assert resource.deallocations == 1


def test_free_waits_for_a_running_kernel_without_blocking(ctx, program, monkeypatch):
    freed_while = []
    real_free = entrypoints.svm_free
    done = threading.Event()

    queue = cl.CommandQueue(ctx)
    knl = cl.Kernel(program, "spin_then_write")
    a = sk.zeros(ctx, 4, np.int32, resource=sk.SVMResource(ctx, sk.Policy.coarse()))
    event = knl(queue, (1,), None, a, np.int32(30_000_000))
    a.record(event)

    def watching_free(context, ptr):
        freed_while.append(event.command_execution_status)
        real_free(context, ptr)
        done.set()

    monkeypatch.setattr(entrypoints, "svm_free", watching_free)
    a.free()
    status_after_free = event.command_execution_status
    assert done.wait(60)
    assert status_after_free != cl.command_execution_status.COMPLETE, "kernel too short"
    assert freed_while == [cl.command_execution_status.COMPLETE]


def test_passing_an_array_to_enqueue_copy_works(ctx, queue, policy):
    a = sk.asarray(ctx, np.arange(10.0), policy=policy)
    out = np.empty(10)
    cl.enqueue_copy(queue, out, a, is_blocking=True)
    assert np.array_equal(out, np.arange(10.0))


def test_advanced_indexing_copies_like_numpy(ctx):
    a = sk.asarray(ctx, np.arange(10) * 2, policy=sk.Policy.best(ctx))
    if a.policy.needs_map:
        pytest.skip("the host may not read coarse memory outside a map")
    picked = a[[1, 3, 5]]
    assert isinstance(picked, sk.SVMArray) and picked.host.tolist() == [2, 6, 10]
    assert picked.ptr != a.ptr and picked.policy == a.policy
    assert a[a.get() > 15].host.tolist() == [16, 18]


def test_repr_does_not_touch_memory(ctx):
    a = sk.empty(ctx, (2, 2), np.float32, policy=sk.Policy.coarse())
    text = repr(a)
    assert "shape=(2, 2)" in text and "COARSE" in text
    a.free()
    assert "freed" in repr(a)


@pytest.mark.needs("coarse")
def test_get_and_set_wait_for_work_another_thread_completes(ctx, queue):
    # A blocking copy in PyOpenCL holds the GIL; get/set must still let the thread that
    # completes the recorded event run.
    a = sk.zeros(ctx, 4, np.int32, resource=sk.SVMResource(ctx, sk.Policy.coarse()))
    for action in (lambda: a.set([5, 6, 7, 8], queue), lambda: a.get(queue)):
        gate = cl.UserEvent(ctx)
        a.record(gate)
        timer = threading.Timer(0.2, gate.set_status, (cl.command_execution_status.COMPLETE,))
        timer.start()
        action()
        timer.join()
        assert gate.command_execution_status == cl.command_execution_status.COMPLETE
    assert a.get(queue).tolist() == [5, 6, 7, 8]


@pytest.mark.needs("coarse")
def test_enqueue_free_of_a_mapped_array_is_refused_and_loses_nothing(ctx, queue):
    a = sk.asarray(ctx, np.arange(4, dtype=np.int32), policy=sk.Policy.coarse())
    with sk.mapped(queue, a, "rw") as host:
        with pytest.raises(sk.MapStateError, match="mapped") as info:
            a.enqueue_free(queue)
        assert info.value.cl_error is None
        assert not a.freed
        host[0] = 9
    assert a.get(queue).tolist() == [9, 1, 2, 3]
    a.enqueue_free(queue).wait()
    assert a.freed


def test_errors_name_an_array_or_a_view_once(ctx, queue):
    a = sk.zeros(ctx, 8, np.float32, policy=sk.Policy.coarse())
    with pytest.raises(sk.MapStateError) as mapped_err:
        _ = a.host
    view = a[2:]
    a.free()
    with pytest.raises(sk.UseAfterFreeError) as array_err:
        _ = a.ptr
    with pytest.raises(sk.UseAfterFreeError) as view_err:
        _ = view.ptr
    for err in (mapped_err, array_err):
        assert "SVMArray shape=(8,) dtype=float32" in str(err.value)
    assert "SVMArray view shape=(6,) dtype=float32" in str(view_err.value)
    for err in (mapped_err, array_err, view_err):
        assert "SVMArray array" not in str(err.value)


@pytest.mark.parametrize(
    "make",
    [
        lambda c: sk.empty(c, 4),
        lambda c: sk.zeros(c, 4, np.float32),
        lambda c: sk.ones(c, 4),
        lambda c: sk.full(c, 4, 1.5),
        lambda c: sk.asarray(c, [1, 2]),
        lambda c: sk.empty(c, 4, policy=sk.Policy.coarse()),
        lambda c: sk.Pool(c),
        lambda c: sk.SVMResource(c),
        lambda c: sk.current_resource(c, sk.Policy.coarse()),
        lambda c: sk.capabilities(c),
    ],
    ids=[
        "empty",
        "zeros",
        "ones",
        "full",
        "asarray",
        "empty-policy",
        "Pool",
        "SVMResource",
        "current_resource",
        "capabilities",
    ],
)
@pytest.mark.parametrize("bad", [None, "ctx"])
def test_a_context_that_is_not_one_is_invalid_context_error(make, bad):
    with pytest.raises(sk.InvalidContextError, match=r"ctx must be a pyopencl\.Context") as err:
        make(bad)
    assert err.value.cl_error == "CL_INVALID_CONTEXT"
    assert repr(bad) in str(err.value)
