"""sk.fill, sk.copy, sk.migrate: results read back from the device, and every spec rule."""

from __future__ import annotations

import dataclasses
import gc
import threading

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk
import svmkit.ops.transfer as ops
from svmkit.resources.base import Allocation

COMPLETE = cl.command_execution_status.COMPLETE


def _raises(cls: type[sk.SVMError], cl_error: str | None, fn) -> sk.SVMError:
    with pytest.raises(cls) as err:
        fn()
    assert type(err.value) is cls
    assert err.value.cl_error == cl_error
    return err.value


# -- fill ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64, np.complex128])
def test_fill_scalar(queue, any_policy, dtype):
    a = sk.zeros(queue.context, 37, dtype, policy=any_policy)
    event = sk.fill(queue, a, 3)
    assert isinstance(event, cl.Event)
    event.wait()
    np.testing.assert_array_equal(a.get(queue), np.full(37, 3, dtype))


@pytest.mark.parametrize("value", [np.float32(1.5), np.array(1.5), 1.5])
def test_fill_scalar_kinds_cast_to_dtype(queue, value):
    a = sk.zeros(queue.context, 8, np.float64)
    sk.fill(queue, a, value)
    np.testing.assert_array_equal(a.get(), np.full(8, 1.5))


def test_fill_view_fills_exactly_the_view(queue, any_policy):
    # guard bytes on both sides: PyOpenCL's enqueue_svm_memfill(byte_count=) would fill all
    a = sk.full(queue.context, 64, 0xAB, np.uint8, policy=any_policy)
    sk.fill(queue, a.view(np.int32)[3:9], -1)
    expect = np.full(64, 0xAB, np.uint8)
    expect[12:36] = 0xFF
    np.testing.assert_array_equal(a.get(queue), expect)


def test_fill_pattern_array_raw_bytes(queue, policy):
    a = sk.zeros(queue.context, 8, np.int32, policy=policy)
    sk.fill(queue, a, np.array([1, 2, 3, 4], np.uint8))
    np.testing.assert_array_equal(a.get().view(np.uint8), np.tile([1, 2, 3, 4], 8))
    sk.fill(queue, a, np.arange(16, dtype=np.int16))  # 32-byte pattern
    np.testing.assert_array_equal(a.get().view(np.int16), np.arange(16))


@pytest.mark.parametrize("nbytes", [0, 3, 12, 256])
def test_fill_pattern_size_rule(queue, nbytes):
    a = sk.zeros(queue.context, 512, np.uint8)
    _raises(
        sk.InvalidValueError,
        "CL_INVALID_VALUE",
        lambda: sk.fill(queue, a, np.zeros(nbytes, np.uint8)),
    )


def test_fill_pattern_above_device_maximum(queue, monkeypatch, caps):
    # fakes the capability query: a device whose largest vector type is 64 bytes
    small = dataclasses.replace(caps, max_alignment=64)
    monkeypatch.setattr(ops, "capabilities", lambda _c: small)
    a = sk.zeros(queue.context, 256, np.uint8)
    _raises(
        sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.fill(queue, a, np.zeros(128, np.uint8))
    )


def test_fill_alignment_rule(queue):
    a = sk.zeros(queue.context, 32, np.uint8)
    _raises(
        sk.InvalidValueError,
        "CL_INVALID_VALUE",
        lambda: sk.fill(queue, a[1:9], np.zeros(1, np.int64)),
    )


def test_fill_multiple_of_rule(queue):
    a = sk.zeros(queue.context, 32, np.uint8)
    _raises(
        sk.InvalidValueError,
        "CL_INVALID_VALUE",
        lambda: sk.fill(queue, a[0:12], np.zeros(1, np.int64)),
    )


def test_fill_contiguity_rule(queue, policy):
    a = sk.zeros(queue.context, 16, np.int32, policy=policy)
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.fill(queue, a[::2], 1))


@pytest.mark.parametrize("value", [300, -1, "x", [1, 2], np.zeros((2, 2), np.uint8), None])
def test_fill_bad_values(queue, value):
    a = sk.zeros(queue.context, 16, np.uint8)
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.fill(queue, a, value))


def test_fill_zero_size_is_an_ordered_no_op(queue):
    a = sk.zeros(queue.context, 0, np.int32)
    event = sk.fill(queue, a, 1)
    event.wait()
    assert event.command_execution_status == COMPLETE


def test_fill_records_its_event_and_orders_after_wait_for(queue, policy):
    a = sk.zeros(queue.context, 16, np.int32, policy=policy)
    gate = cl.UserEvent(queue.context)
    event = sk.fill(queue, a, 5, wait_for=[gate])
    assert event in a.pending_events()
    assert event.command_execution_status != COMPLETE
    gate.set_status(COMPLETE)
    np.testing.assert_array_equal(a.get(), np.full(16, 5))  # get() waits for recorded work


def test_fill_contexts(queue, other_ctx, foreign_event):
    a = sk.zeros(queue.context, 4, np.int32)
    _raises(
        sk.InvalidContextError,
        "CL_INVALID_CONTEXT",
        lambda: sk.fill(cl.CommandQueue(other_ctx), a, 1),
    )
    _raises(
        sk.InvalidContextError,
        "CL_INVALID_CONTEXT",
        lambda: sk.fill(queue, a, 1, wait_for=[foreign_event]),
    )
    _raises(
        sk.InvalidValueError,
        "CL_INVALID_EVENT_WAIT_LIST",
        lambda: sk.fill(queue, a, 1, wait_for=[a]),
    )
    _raises(sk.InvalidValueError, "CL_INVALID_COMMAND_QUEUE", lambda: sk.fill(42, a, 1))


def test_fill_default_queue(queue):
    a = sk.zeros(queue.context, 4, np.int32)
    sk.fill(None, a, 7).wait()
    np.testing.assert_array_equal(a.get(), [7] * 4)


# -- copy ----------------------------------------------------------------------------------


def test_copy_svm_to_svm(queue, any_policy):
    ctx = queue.context
    src = sk.asarray(ctx, np.arange(100, dtype=np.float64), policy=any_policy)
    dst = sk.zeros(ctx, 100, np.float64, policy=any_policy)
    event = sk.copy(queue, dst, src)
    assert isinstance(event, cl.Event) and event.command_execution_status == COMPLETE
    np.testing.assert_array_equal(dst.get(), np.arange(100))


def test_copy_views_and_host_arrays(queue, any_policy):
    ctx = queue.context
    a = sk.zeros(ctx, (4, 8), np.int32, policy=any_policy)
    sk.copy(queue, a[1], np.arange(8, dtype=np.int32))  # host -> SVM view
    out = np.zeros(8, np.int32)
    sk.copy(queue, out, a[1])  # SVM view -> host
    np.testing.assert_array_equal(out, np.arange(8))
    sk.copy(queue, a[2], a[1])
    expect = np.zeros((4, 8), np.int32)
    expect[1] = expect[2] = np.arange(8)
    np.testing.assert_array_equal(a.get(), expect)


def test_copy_nonblocking_keeps_host_source_alive(queue, policy):
    ctx = queue.context
    dst = sk.zeros(ctx, 1 << 16, np.int64, policy=policy)
    gate = cl.UserEvent(ctx)
    src = np.arange(1 << 16, dtype=np.int64)
    event = sk.copy(queue, dst, src, blocking=False, wait_for=[gate])
    del src
    gc.collect()
    _ = [np.full(1 << 16, -1, np.int64) for _ in range(8)]  # reuse freed host memory
    assert event.command_execution_status != COMPLETE
    gate.set_status(COMPLETE)
    event.wait()
    np.testing.assert_array_equal(dst.get(), np.arange(1 << 16))


def test_blocking_copy_lets_other_threads_complete_its_wait_list(queue):
    ctx = queue.context
    a = sk.zeros(ctx, 4, np.int32)
    gate = cl.UserEvent(ctx)
    timer = threading.Timer(0.2, gate.set_status, (COMPLETE,))
    timer.start()  # deadlocks if the copy held the GIL while blocking
    sk.copy(queue, a, np.arange(4, dtype=np.int32), wait_for=[gate])
    timer.join()
    np.testing.assert_array_equal(a.get(), np.arange(4))


def test_copy_equal_nbytes_rule(queue):
    a = sk.zeros(queue.context, 8, np.int32)
    b = sk.zeros(queue.context, 9, np.int32)
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.copy(queue, a, b))
    _raises(
        sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.copy(queue, a, np.zeros(4, np.int32))
    )


def test_copy_different_dtypes_same_bytes(queue):
    a = sk.zeros(queue.context, 4, np.int32)
    sk.copy(queue, a, np.arange(16, dtype=np.uint8))
    np.testing.assert_array_equal(a.get().view(np.uint8), np.arange(16))


def test_copy_contiguity_rule(queue, policy):
    a = sk.zeros(queue.context, 16, np.int32, policy=policy)
    b = sk.zeros(queue.context, 8, np.int32, policy=policy)
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.copy(queue, b, a[::2]))
    _raises(
        sk.InvalidValueError,
        "CL_INVALID_VALUE",
        lambda: sk.copy(queue, np.zeros(16, np.int32)[::2], b),
    )


def test_copy_overlap(queue, any_policy):
    a = sk.asarray(queue.context, np.arange(16, dtype=np.int32), policy=any_policy)
    _raises(sk.CopyOverlapError, "CL_MEM_COPY_OVERLAP", lambda: sk.copy(queue, a[0:8], a[4:12]))
    _raises(sk.CopyOverlapError, "CL_MEM_COPY_OVERLAP", lambda: sk.copy(queue, a[4:12], a[0:8]))
    _raises(sk.CopyOverlapError, "CL_MEM_COPY_OVERLAP", lambda: sk.copy(queue, a, a))
    sk.copy(queue, a[0:8], a[8:16])  # adjacent is fine
    np.testing.assert_array_equal(a.get(), np.r_[8:16, 8:16])


@pytest.mark.needs("fine")
def test_copy_overlap_through_host_view_of_fine_memory(queue):
    a = sk.zeros(queue.context, 16, np.int32, policy=sk.Policy.fine())
    _raises(
        sk.CopyOverlapError, "CL_MEM_COPY_OVERLAP", lambda: sk.copy(queue, a.host[2:10], a[0:8])
    )


def test_copy_contexts(queue, other_ctx, foreign_event):
    a = sk.zeros(queue.context, 4, np.int32)
    b = sk.zeros(other_ctx, 4, np.int32)
    _raises(sk.InvalidContextError, "CL_INVALID_CONTEXT", lambda: sk.copy(queue, a, b))
    _raises(sk.InvalidContextError, "CL_INVALID_CONTEXT", lambda: sk.copy(queue, b, a))
    _raises(
        sk.InvalidContextError,
        "CL_INVALID_CONTEXT",
        lambda: sk.copy(queue, a, np.zeros(4, np.int32), wait_for=[foreign_event]),
    )
    _raises(
        sk.InvalidContextError,
        "CL_INVALID_CONTEXT",
        lambda: sk.copy(cl.CommandQueue(other_ctx), a, np.zeros(4, np.int32)),
    )


def test_copy_bad_arguments(queue):
    a = sk.zeros(queue.context, 4, np.int32)
    ro = np.zeros(4, np.int32)
    ro.flags.writeable = False
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.copy(queue, ro, a))
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.copy(queue, a, [1, 2, 3, 4]))  # type: ignore[arg-type]
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.copy(queue, b"1234", a))  # type: ignore[arg-type]


def test_copy_between_host_arrays(queue):
    out = np.zeros(4, np.int32)
    sk.copy(queue, out, np.arange(4, dtype=np.int32))
    np.testing.assert_array_equal(out, np.arange(4))


def test_copy_records_on_both_arrays(queue):
    a = sk.zeros(queue.context, 4, np.int32)
    b = sk.zeros(queue.context, 4, np.int32)
    gate = cl.UserEvent(queue.context)
    event = sk.copy(queue, a, b, blocking=False, wait_for=[gate])
    assert event in a.pending_events() and event in b.pending_events()
    gate.set_status(COMPLETE)
    event.wait()


def test_copy_zero_size(queue):
    a = sk.zeros(queue.context, 0, np.int32)
    assert sk.copy(queue, a, np.zeros(0, np.int32)).command_execution_status == COMPLETE


# -- migrate -------------------------------------------------------------------------------


def _buffer(queue: cl.CommandQueue) -> sk.Policy:
    """The finest clSVMAlloc granularity: migrate takes no SYSTEM memory."""
    return sk.Policy.best(queue.context, system=False)


@pytest.mark.parametrize("to", ["device", "host"])
@pytest.mark.needs("migrate")
def test_migrate_keeps_contents(queue, policy, to):
    ctx = queue.context
    a = sk.asarray(ctx, np.arange(64, dtype=np.float32), policy=policy)
    b = sk.asarray(ctx, np.arange(32, dtype=np.int32), policy=policy)
    event = sk.migrate(queue, [a[8:40], b, b[::2]], to=to)
    assert isinstance(event, cl.Event)
    event.wait()
    sk.migrate(queue, a, to=to, content_undefined=False).wait()  # a single array works too
    np.testing.assert_array_equal(a.get(), np.arange(64))
    np.testing.assert_array_equal(b.get(), np.arange(32))


@pytest.mark.needs("migrate")
def test_migrate_content_undefined_and_records(queue):
    a = sk.zeros(queue.context, 16, np.int32, policy=_buffer(queue))
    gate = cl.UserEvent(queue.context)
    event = sk.migrate(queue, [a], content_undefined=True, wait_for=[gate])
    assert event in a.pending_events()
    gate.set_status(COMPLETE)
    event.wait()


def test_migrate_empty_list(queue):
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.migrate(queue, []))


@pytest.mark.parametrize("to", ["gpu", None, "HOST", 1])
def test_migrate_bad_to(queue, to):
    a = sk.zeros(queue.context, 4)
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.migrate(queue, [a], to=to))


def test_migrate_unsupported_device(queue, monkeypatch, caps):
    # fakes the capability query: an OpenCL 2.0 device without clEnqueueSVMMigrateMem
    old = dataclasses.replace(caps, migrate=False)
    monkeypatch.setattr(ops, "capabilities", lambda _d: old)
    a = sk.zeros(queue.context, 4)
    _raises(sk.UnsupportedError, "CL_INVALID_OPERATION", lambda: sk.migrate(queue, [a]))


def test_migrate_system_memory_is_refused(queue):
    class HostResource:  # SYSTEM memory as a fine-grain system device would share it
        context = queue.context
        policy = sk.Policy.system()

        def deallocate(self, alloc: Allocation) -> None:
            pass

    buf = np.zeros(64, np.uint8)
    alloc = Allocation(HostResource(), buf.ctypes.data, 64, u8=buf)  # type: ignore[arg-type]
    a = sk.SVMArray(alloc, buf.view(np.int32))
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.migrate(queue, [a]))


def test_migrate_zero_size_views_migrate_nothing(queue):
    a = sk.zeros(queue.context, 8, policy=_buffer(queue))
    event = sk.migrate(queue, [a[3:3]])
    event.wait()
    assert event.command_type == cl.command_type.MARKER


def test_migrate_contexts_and_types(queue, other_ctx, foreign_event):
    a = sk.zeros(queue.context, 4, policy=_buffer(queue))
    b = sk.zeros(other_ctx, 4, policy=_buffer(queue))
    _raises(sk.InvalidContextError, "CL_INVALID_CONTEXT", lambda: sk.migrate(queue, [a, b]))
    _raises(
        sk.InvalidContextError,
        "CL_INVALID_CONTEXT",
        lambda: sk.migrate(queue, [a], wait_for=[foreign_event]),
    )
    _raises(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: sk.migrate(queue, [np.zeros(4)]))


# -- use after free ------------------------------------------------------------------------


def test_every_operation_refuses_freed_arrays(queue, policy):
    ctx = queue.context
    a = sk.zeros(ctx, 8, np.int32, policy=policy)
    live = sk.zeros(ctx, 8, np.int32, policy=policy)
    view = a[2:6]
    a.free()
    for call in (
        lambda: sk.fill(queue, a, 1),
        lambda: sk.fill(queue, view, 1),
        lambda: sk.copy(queue, live, a),
        lambda: sk.copy(queue, a, live),
        lambda: sk.copy(queue, view, live[0:4]),
        lambda: sk.migrate(queue, [view]),
        lambda: sk.mapped(queue, view),
    ):
        _raises(sk.UseAfterFreeError, None, call)


def test_fill_negative_zero_keeps_its_sign(queue):
    a = sk.zeros(queue.context, 4, np.float64)
    sk.fill(queue, a, 0.0)
    sk.fill(queue, a, -0.0)  # equal to 0.0 but different bytes: never served from a cache
    assert np.signbit(a.get()).all()
    sk.fill(queue, a, 2.0)
    sk.fill(queue, a, 2)  # int and float of equal value are different cache keys
    np.testing.assert_array_equal(a.get(), [2.0] * 4)


def test_event_record_keeps_latest_per_in_order_queue(queue):
    from svmkit.events import EventRecord

    record = EventRecord()
    gate = cl.UserEvent(queue.context)
    first = cl.enqueue_marker(queue, wait_for=[gate])
    second = cl.enqueue_marker(queue)
    record.record(first, queue)
    record.record(second, queue)
    assert record.pending() == [second]  # completes only after `first`
    gate.set_status(COMPLETE)
    queue.finish()
    assert record.pending() == [] and record.take() == []


def _failed_event(ctx: cl.Context) -> cl.UserEvent:
    failed = cl.UserEvent(ctx)
    failed.set_status(-1)
    return failed


@pytest.mark.parametrize("n", [4, 0])
def test_blocking_copy_after_failed_event(queue, n):
    # Every size: a zero-byte copy (a marker plus a wait) checks its wait list first, too.
    a = sk.zeros(queue.context, 4, np.int32, policy=sk.Policy.coarse())
    b = sk.zeros(queue.context, 4, np.int32, policy=sk.Policy.coarse())
    sides = {
        "host->svm": (a[:n], np.zeros(n, np.int32)),
        "svm->host": (np.zeros(n, np.int32), a[:n]),
        "svm->svm": (b[:n], a[:n]),
    }
    for name, (dst, src) in sides.items():
        failed = _failed_event(queue.context)
        err = _raises(
            sk.SVMError,
            "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
            lambda: sk.copy(queue, dst, src, wait_for=[failed]),  # noqa: B023 (called at once)
        )
        assert "a blocking copy waits for an event that failed" in str(err), name
        assert err.__cause__ is None, name  # svmkit's rule: the driver never saw the copy


@pytest.mark.parametrize("n", [4, 0])
@pytest.mark.parametrize("command", ["fill", "migrate", "copy", "launch"])
def test_every_command_after_a_failed_event_raises_typed(queue, command, n):
    # Every command and size (a zero-byte one is a marker): checked before enqueueing, since
    # PoCL would never run it and the release of its memory would wait forever.
    ctx = queue.context
    if command == "migrate" and not sk.capabilities(ctx).migrate:
        pytest.skip(f"{sk.capabilities(ctx).name} has no clEnqueueSVMMigrateMem")
    a = sk.full(ctx, 4, 5, np.int32, policy=sk.Policy.coarse())
    kernel = cl.Kernel(
        sk.build_program(ctx, "__kernel void k(__global int *a) { a[get_global_id(0)] = 9; }"),
        "k",
    )
    failed = _failed_event(ctx)
    enqueue = {
        "fill": lambda: sk.fill(queue, a[:n], 7, wait_for=[failed]),
        "migrate": lambda: sk.migrate(queue, [a[:n]], wait_for=[failed]),
        "copy": lambda: sk.copy(
            queue, a[:n], np.ones(n, np.int32), blocking=False, wait_for=[failed]
        ),
        "launch": lambda: sk.launch(queue, kernel, (max(n, 1),), None, a[:n], wait_for=[failed]),
    }
    err = _raises(sk.SVMError, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST", enqueue[command])
    assert f"{command}() waits for an event that failed (status -1)" in str(err)
    assert err.__cause__ is None  # svmkit's rule: nothing was enqueued
    queue.finish()
    np.testing.assert_array_equal(a.get(queue), [5, 5, 5, 5])


@pytest.mark.parametrize("name", ["copy", "migrate", "launch"])
def test_non_queue_is_refused(queue, name):
    a = sk.zeros(queue.context, 4, np.int32)
    kernel = cl.Kernel(sk.build_program(queue.context, "__kernel void k(__global int *a) {}"), "k")
    calls = {
        "copy": lambda: sk.copy("q", a, np.zeros(4, np.int32)),
        "migrate": lambda: sk.migrate("q", [a]),
        "launch": lambda: sk.launch("q", kernel, (1,), None, a),
    }
    _raises(sk.InvalidValueError, "CL_INVALID_COMMAND_QUEUE", calls[name])
