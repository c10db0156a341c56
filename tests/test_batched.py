"""BatchedLaunches: one launch per batch, results element by element, the kernel's
arguments set once per slot with every later launch's event still recorded, results
copied straight into the caller's array, and batches in flight waited for on an error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk
from svmkit.arrays.numpy_owned import allocation_of
from svmkit.driver import calls
from svmkit.resources.base import record_events
from svmkit.workqueue.batched import BatchedLaunches

SOURCE = r"""
__kernel void affine(__global const long *in, __global const long *offset, __global long *out)
{
    size_t i = get_global_id(0);
    out[i] = in[i] * 3 + offset[0];
}
"""


@pytest.fixture(scope="module")
def program(ctx: cl.Context) -> sk.Program:
    return sk.build_program(ctx, SOURCE)


def _launcher(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program, policy: sk.Policy, **kw: Any
) -> tuple[BatchedLaunches, sk.SVMArray]:
    offset = sk.empty(ctx, 1, np.int64, policy=policy)
    sk.copy(queue, offset, np.array([7], np.int64)).wait()
    runner = BatchedLaunches(
        ctx,
        [queue],
        lambda: calls.new_kernel(program, "affine"),
        kw.pop("batch", 64),
        extra=(offset,),
        policy=policy,
        **kw,
    )
    return runner, offset


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("granularity", ["coarse", "fine"])
def test_every_element_matches_numpy(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program, depth: int, granularity: str
) -> None:
    if granularity == "fine" and not sk.capabilities(ctx).fine_grain_buffer:
        pytest.skip("the device has no fine-grain buffer SVM")
    policy = sk.Policy.coarse() if granularity == "coarse" else sk.Policy.fine()
    runner, _ = _launcher(ctx, queue, program, policy, depth=depth)
    items = np.arange(1000, dtype=np.int64) * 5 - 2000  # 15 full batches and one of 40
    out = np.full(1000, -1, np.int64)
    seconds, lat = runner.run(items, out)
    np.testing.assert_array_equal(out, items * 3 + 7)
    assert seconds > 0 and lat.shape == (16,) and (lat > 0).all()


def test_a_strided_output_goes_through_the_host_buffer(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program
) -> None:
    runner, _ = _launcher(ctx, queue, program, sk.Policy.coarse(), depth=2)
    items = np.arange(300, dtype=np.int64)
    backing = np.full(600, -1, np.int64)
    runner.run(items, backing[::2])
    np.testing.assert_array_equal(backing[::2], items * 3 + 7)
    assert (backing[1::2] == -1).all()  # the bytes between were not written


def test_arguments_are_set_once_per_slot_and_every_launch_is_recorded(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, offset = _launcher(ctx, queue, program, sk.Policy.coarse(), depth=2, batch=10)
    checked: list[int] = []
    recorded: list[set[int]] = []
    real_launch, real_record = sk.launch, record_events

    def counting_launch(*args: Any, **kw: Any) -> cl.Event:
        checked.append(1)
        return real_launch(*args, **kw)

    def counting_record(allocs: Any, event: cl.Event, q: cl.CommandQueue) -> None:
        allocs = list(allocs)
        recorded.append({id(a) for a in allocs})
        real_record(allocs, event, q)

    monkeypatch.setattr("svmkit.workqueue.batched.launch", counting_launch)
    monkeypatch.setattr("svmkit.workqueue.batched.record_events", counting_record)
    items = np.arange(95, dtype=np.int64)
    out = np.empty(95, np.int64)
    runner.run(items, out)
    np.testing.assert_array_equal(out, items * 3 + 7)
    assert len(checked) == 2  # one checked launch per slot
    assert len(recorded) == 8  # the other 8 of the 10 batches
    dev_in, dev_out = runner._slots[0][0], runner._slots[0][1]
    slot0 = {id(dev_in.allocation), id(offset.allocation), id(dev_out.allocation)}
    assert recorded[0] == slot0  # the extra argument's allocation too
    runner.run(items[:5], out[:5])  # a second run: the slots keep their arguments
    assert len(checked) == 2 and len(recorded) == 9


def test_an_error_waits_for_the_batches_in_flight(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner, _ = _launcher(ctx, queue, program, sk.Policy.coarse(), depth=4, batch=16)
    waited: list[cl.Event] = []
    real_wait, real_flush = calls.wait, calls.flush
    flushes = 0

    def failing_flush(q: cl.CommandQueue) -> None:
        nonlocal flushes
        flushes += 1
        real_flush(q)
        if flushes == 3:
            raise KeyboardInterrupt

    def counting_wait(event: cl.Event, what: str = "a command") -> None:
        waited.append(event)
        real_wait(event, what)

    monkeypatch.setattr(calls, "flush", failing_flush)
    monkeypatch.setattr(calls, "wait", counting_wait)
    out = np.empty(160, np.int64)
    with pytest.raises(KeyboardInterrupt):
        runner.run(np.arange(160, dtype=np.int64), out)
    assert len(waited) == 3  # the three batches submitted, none left running
    assert all(calls.event_complete(e) for e in waited)
    np.testing.assert_array_equal(out[:48], np.arange(48) * 3 + 7)


def test_one_kernel_object_for_two_slots_is_refused(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program
) -> None:
    shared = calls.new_kernel(program, "affine")
    with pytest.raises(sk.InvalidValueError, match="a kernel of its own"):
        BatchedLaunches(ctx, [queue], lambda: shared, 8, depth=2)
    with pytest.raises(sk.InvalidValueError, match="a kernel of its own"):
        BatchedLaunches(ctx, [queue], lambda: program.affine, 8, depth=2)  # one object
    runner = BatchedLaunches(ctx, [queue], lambda: shared, 8, depth=1)  # one slot: fine
    assert runner.depth == 1


def test_extra_arguments_are_checked_at_each_run(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program
) -> None:
    """Later launches enqueue over the arguments a slot's kernel holds; each run first
    checks ``extra`` as a launch would: a freed one is a UseAfterFreeError before any batch
    is enqueued, and the caller's array keeps its bytes."""
    runner, offset = _launcher(ctx, queue, program, sk.Policy.coarse(), depth=2, batch=8)
    items = np.arange(40, dtype=np.int64)
    out = np.empty(40, np.int64)
    runner.run(items, out)
    np.testing.assert_array_equal(out, items * 3 + 7)
    offset.free()
    out[:] = -5
    with pytest.raises(sk.UseAfterFreeError):
        runner.run(items, out)
    assert (out == -5).all()


class _RecordingBox:
    """Passes ``kernel_arg`` to the kernel and records the events of the launches it is an
    argument of, as a work queue does."""

    def __init__(self, array: sk.SVMArray) -> None:
        self.kernel_arg = array
        self.svm_pointers: tuple[int, ...] = ()
        self.recorded: list[cl.Event] = []

    def record(self, event: cl.Event) -> None:
        self.recorded.append(event)


def test_later_launches_record_on_numpy_allocator_arrays_and_work_queues(
    ctx: cl.Context, queue: cl.CommandQueue, program: sk.Program, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a slot's later launches record their event on is what a launch records on: an
    ``extra`` NumPy array of ``sk.numpy_allocator``'s (its allocation), and an object that
    records its own events (a work queue's ``record``), once per batch."""
    if not sk.capabilities(ctx).fine_grain_buffer:
        pytest.skip("the device has no fine-grain buffer SVM (sk.numpy_allocator needs it)")
    with sk.numpy_allocator(sk.Pool(ctx, sk.Policy.fine())):
        offset = np.full(1, 11, np.int64)
    owned = allocation_of(offset)
    assert owned is not None
    box = _RecordingBox(sk.asarray(ctx, np.array([100], np.int64)))
    recorded: list[set[int]] = []

    def counting_record(allocs: Any, event: cl.Event, q: cl.CommandQueue) -> None:
        allocs = list(allocs)
        recorded.append({id(a) for a in allocs})
        record_events(allocs, event, q)

    monkeypatch.setattr("svmkit.workqueue.batched.record_events", counting_record)
    items = np.arange(30, dtype=np.int64)
    for extra, want in (((offset,), items * 3 + 11), ((box,), items * 3 + 100)):
        runner = BatchedLaunches(
            ctx, [queue], lambda: calls.new_kernel(program, "affine"), 10, extra=extra
        )
        out = np.empty(30, np.int64)
        recorded.clear()
        runner.run(items, out)
        np.testing.assert_array_equal(out, want)
        assert len(recorded) == 2  # batches 2 and 3 (the first went through sk.launch)
        assert all((id(owned) in r) == (extra[0] is offset) for r in recorded)
    assert len(box.recorded) == 3  # every batch's event, the first's by sk.launch
    assert all(calls.event_complete(e) for e in box.recorded)
