"""Tracked kernels (sk.Program, sk.Kernel), sk.record, builds and kernel arguments."""

from __future__ import annotations

import os
import tempfile
import threading
import warnings

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk

COMPLETE = cl.command_execution_status.COMPLETE

SOURCE = """
__kernel void square(__global float *a) { int i = get_global_id(0); a[i] *= a[i]; }
__kernel void slow_fill(__global float *a, int iters) {
    int i = get_global_id(0);
    float x = 0.0f;
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 7.0f;
    a[i] = x;
}
"""
N = 1 << 16


@pytest.fixture(scope="module")
def prg(ctx: cl.Context) -> sk.Program:
    return sk.build_program(ctx, SOURCE)


def test_build_program_returns_a_program_of_tracked_kernels(prg):
    assert isinstance(prg, sk.Program) and isinstance(prg, cl.Program)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RepeatedKernelRetrieval
        k = prg.square
        assert prg.square is k and sk.Kernel(prg, "square") is k
    assert type(k) is sk.Kernel and isinstance(k, cl.Kernel)
    assert k.function_name == "square"
    kernels = prg.all_kernels()
    assert [type(x) for x in kernels] == [sk.Kernel, sk.Kernel]
    assert {x.function_name for x in kernels} == {"square", "slow_fill"}
    assert prg.square in kernels
    with pytest.raises(AttributeError, match="square, slow_fill"):
        prg.no_such_kernel  # noqa: B018
    with pytest.raises(sk.InvalidValueError) as info:
        sk.Kernel(prg, "no_such_kernel")
    assert info.value.cl_error == "CL_INVALID_KERNEL_NAME"


def test_each_thread_gets_its_own_kernel(prg):
    mine = prg.square
    seen: list[sk.Kernel] = []

    def work() -> None:
        seen.extend([prg.square, prg.square, sk.Kernel(prg, "square")])

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(k) for k in seen[:3]}) == 1 and len({id(k) for k in seen[3:]}) == 1
    assert seen[0] is not seen[3] and mine not in (seen[0], seen[3])


def test_a_call_is_a_launch(queue, policy, prg):
    ctx = queue.context
    a = sk.asarray(ctx, np.arange(8, dtype=np.float32), policy=policy)
    event = prg.square(queue, (8,), None, a)
    assert isinstance(event, cl.Event)
    assert event in a.pending_events() or event.command_execution_status == COMPLETE
    np.testing.assert_array_equal(a.get(queue), np.arange(8, dtype=np.float32) ** 2)
    prg.square(queue, (4,), None, a, global_offset=(4,), wait_for=[event])  # passes on
    expect = np.arange(8, dtype=np.float32) ** 2
    expect[4:] **= 2
    np.testing.assert_array_equal(a.get(queue), expect)
    with sk.mapped(queue, a, "rw"):  # validated: map state
        if policy.needs_map:
            with pytest.raises(sk.MapStateError):
                prg.square(queue, (8,), None, a)
    a.free()
    with pytest.raises(sk.UseAfterFreeError):
        prg.square(queue, (8,), None, a)


def test_a_host_numpy_array_argument_names_the_way_to_svm(queue, prg):
    for launch in (
        lambda x: prg.square(queue, (4,), None, x),
        lambda x: sk.launch(queue, prg.square, (4,), None, x),
    ):
        with pytest.raises(sk.InvalidValueError) as info:
            launch(np.zeros(4, np.float32))
        assert "sk.asarray(ctx, array)" in str(info.value)
        assert info.value.cl_error == "CL_INVALID_VALUE"


def _race(queue: cl.CommandQueue, launch, record: bool) -> np.ndarray:
    """The race of a slow kernel on a pooled array freed without a wait."""
    ctx = queue.context
    a = sk.empty(ctx, N, np.float32)  # pooled by default
    event = launch(a)  # no .wait()
    if record:
        sk.record(event, a)
    a.free()
    b = sk.zeros(ctx, N, np.float32)  # the next pooled allocation of that size
    queue.finish()
    out = b.get(queue)
    b.free()
    return out


def test_a_tracked_kernel_is_waited_for_before_its_memory_is_reused(queue, prg):
    out = _race(queue, lambda a: prg.slow_fill(queue, (N,), None, a, np.int32(20000)), False)
    assert float(out.sum()) == 0.0 and not out.any()


def test_recording_a_raw_kernel_orders_the_free_after_it(queue, prg):
    raw = cl.Kernel(prg, "slow_fill")  # a plain PyOpenCL kernel: svmkit cannot see it
    out = _race(queue, lambda a: raw(queue, (N,), None, a, np.int32(20000)), True)
    assert float(out.sum()) == 0.0 and not out.any()


def test_record_checks_its_arguments(ctx, queue, other_ctx, foreign_event):
    a = sk.zeros(ctx, 4, np.float32)
    marker = cl.enqueue_marker(queue)
    sk.record(marker, a, a[1:])
    assert marker in a.pending_events() or marker.command_execution_status == COMPLETE
    with pytest.raises(sk.InvalidValueError):
        sk.record("not an event", a)
    with pytest.raises(sk.InvalidValueError):
        sk.record(marker, np.zeros(4))
    with pytest.raises(sk.InvalidContextError):
        sk.record(foreign_event, a)
    other = sk.zeros(other_ctx, 4, np.float32)
    with pytest.raises(sk.InvalidContextError):
        sk.record(marker, a, other)
    assert len(a.allocation.events) <= 2  # nothing recorded by the refused calls
    a.free()
    with pytest.raises(sk.UseAfterFreeError):
        sk.record(marker, a)


def test_a_user_event_recorded_holds_the_memory(ctx, queue):
    pool = sk.Pool(ctx)
    a = pool.empty(64, np.uint8)
    ptr = a.ptr
    gate = cl.UserEvent(ctx)
    sk.record(gate, a)
    a.free()
    b = pool.empty(64, np.uint8)
    assert b.ptr != ptr  # the block waits for the recorded event
    gate.set_status(COMPLETE)


def test_a_failed_build_raises_build_error_with_the_log_and_leaves_no_file(ctx):
    before = set(os.listdir(tempfile.gettempdir()))
    bad = "__kernel void f(__global int *a) { a[0] = undeclared_identifier_xyz; }"
    with pytest.raises(sk.BuildError) as info:
        sk.build_program(ctx, bad)
    error = info.value
    assert isinstance(error, sk.SVMError) and error.cl_error == "CL_BUILD_PROGRAM_FAILURE"
    assert "undeclared_identifier_xyz" in error.build_log
    for device in ctx.devices:
        assert f"{device.name.strip()}:" in error.build_log
    assert str(error).count("clBuildProgram failed") == 1
    with pytest.raises(sk.BuildError):
        sk.build_program(ctx, bad, cache=False)
    assert set(os.listdir(tempfile.gettempdir())) - before == set()


def test_refused_build_options_are_an_invalid_value(ctx):
    # The spec's answer is CL_INVALID_BUILD_OPTIONS (Intel, PoCL); NVIDIA's compiler answers
    # CL_BUILD_PROGRAM_FAILURE with the refusal in its log: a BuildError, the log attached.
    with pytest.raises((sk.InvalidValueError, sk.BuildError)) as info:
        sk.build_program(ctx, SOURCE, options=["-cl-no-such-option"])
    if isinstance(info.value, sk.BuildError):
        assert "NVIDIA" in ctx.devices[0].platform.name
        assert "-cl-no-such-option" in info.value.build_log
    else:
        assert info.value.cl_error == "CL_INVALID_BUILD_OPTIONS"
        assert "-cl-no-such-option" in str(info.value)


def test_dask_build_error_is_the_top_level_one():
    pytest.importorskip("distributed")
    import svmkit.dask

    assert svmkit.dask.BuildError is sk.BuildError


@pytest.mark.parametrize("what", ["ptr", "svm_ptr", "mem", "buf", "host"])
def test_no_attribute_hands_out_freed_memory(ctx, policies, what):
    for policy in policies.values():
        a = sk.zeros(ctx, 4, np.float32, policy=policy)
        if what != "host" or not policy.needs_map:
            getattr(a, what)  # fine while live
        a.free()
        with pytest.raises(sk.UseAfterFreeError):
            getattr(a, what)
        with pytest.raises(sk.UseAfterFreeError):
            getattr(a[1:], what)


def test_no_method_of_cl_svm_hands_out_freed_memory(ctx, queue):
    a = sk.zeros(ctx, 4, np.float32)
    a.map_rw(queue).release()
    for call in (
        lambda: a.map_rw(queue),
        lambda: a.map_ro(queue),
        lambda: a.map(queue, cl.map_flags.READ),
        lambda: a.as_buffer(ctx),
    ):
        a.free()
        with pytest.raises(sk.UseAfterFreeError):
            call()


@pytest.mark.needs("fine")
def test_mem_kept_past_free_keeps_its_memory(ctx):
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.zeros(64, np.int32)
    ptr = a.ptr
    m = a.mem  # an export, as a.host
    a.free()
    b = pool.zeros(64, np.int32)
    assert b.ptr != ptr  # the block is still held by m
    m[:] = 5
    assert not b.get().any()
