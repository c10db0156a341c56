"""sk.mapped: modes, nesting with one driver map, map-state rules, ordering, freeing."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from _helpers import run_threads

import svmkit as sk
import svmkit.driver.calls as driver_calls
import svmkit.driver.entrypoints as icd

COMPLETE = cl.command_execution_status.COMPLETE


class DriverSpy:
    """Forwards map/unmap to PyOpenCL, counting calls and open driver maps per address."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.maps = 0
        self.unmaps = 0
        self.open: dict[int, int] = {}
        self.max_open = 0
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:  # every other entry point: the real one
        return getattr(self.real, name)

    def _enqueue_svm_map(self, queue, blocking, flags, svm, wait_for, size):
        event = self.real._enqueue_svm_map(queue, blocking, flags, svm, wait_for, size)
        with self.lock:
            self.maps += 1
            ptr = _address(svm)
            self.open[ptr] = self.open.get(ptr, 0) + 1
            self.max_open = max(self.max_open, sum(self.open.values()))
        return event

    def _enqueue_svm_unmap(self, queue, svm, wait_for):
        with self.lock:
            ptr = _address(svm)
            assert self.open.get(ptr, 0) > 0, "unmap of a pointer that is not mapped"
            self.open[ptr] -= 1
            self.unmaps += 1
        return self.real._enqueue_svm_unmap(queue, svm, wait_for)


def _address(svm: Any) -> int:
    """The SVM pointer object's address as the driver sees it (an SVMArray's own ``svm_ptr``
    refuses once freed, and svmkit unmaps a region freed inside its block)."""
    return int(cl.SVMPointer.svm_ptr.__get__(svm))


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> DriverSpy:
    s = DriverSpy(driver_calls._cl)
    monkeypatch.setattr(driver_calls, "_cl", s)
    return s


@pytest.mark.parametrize("mode", ["w", "rw", "w_invalidate"])
def test_write_modes_reach_the_device(queue, any_policy, mode):
    a = sk.zeros(queue.context, 32, np.int32, policy=any_policy)
    with sk.mapped(queue, a, mode) as h:
        h[:] = np.arange(32)
    np.testing.assert_array_equal(a.get(queue), np.arange(32))


def test_read_mode_sees_device_data_and_is_read_only(queue, any_policy):
    a = sk.zeros(queue.context, 16, np.float32, policy=any_policy)
    sk.fill(queue, a, 2.5)
    with sk.mapped(queue, a, "r") as h:
        np.testing.assert_array_equal(h, np.full(16, 2.5, np.float32))
        assert not h.flags.writeable
        with pytest.raises(ValueError):
            h[0] = 1


def test_view_maps_only_its_bytes_and_host_is_allowed_inside(queue):
    a = sk.zeros(queue.context, 16, np.int32, policy=sk.Policy.coarse())
    with sk.mapped(queue, a[4:8]) as h:
        h[:] = 9
        np.testing.assert_array_equal(a[4:8].host, np.full(4, 9))
        with pytest.raises(sk.MapStateError) as err:
            _ = a[0:8].host
        assert err.value.cl_error is None
    with pytest.raises(sk.MapStateError):
        _ = a.host
    np.testing.assert_array_equal(a.get(), [0] * 4 + [9] * 4 + [0] * 8)


def test_strided_view_maps(queue, policy):
    a = sk.zeros(queue.context, (4, 6), np.int16, policy=policy)
    with sk.mapped(queue, a[:, 1]) as h:
        h[:] = [1, 2, 3, 4]
    expect = np.zeros((4, 6), np.int16)
    expect[:, 1] = [1, 2, 3, 4]
    np.testing.assert_array_equal(a.get(), expect)


def test_exit_unmaps_when_block_raises(queue, spy):
    a = sk.zeros(queue.context, 8, np.int32, policy=sk.Policy.coarse())
    with pytest.raises(KeyError), sk.mapped(queue, a) as h:
        h[:] = 5
        raise KeyError("boom")
    assert spy.maps == spy.unmaps == 1
    sk.fill(queue, a, 1)  # allowed again: nothing mapped
    with pytest.raises(sk.MapStateError):
        _ = a.host
    np.testing.assert_array_equal(a.get(), np.ones(8))


def test_nested_overlapping_maps_share_one_driver_map(queue, spy):
    a = sk.zeros(queue.context, 64, np.uint8, policy=sk.Policy.coarse())
    with sk.mapped(queue, a[0:16], "r"):
        with sk.mapped(queue, a[8:32], "w") as h:  # extends and upgrades: one remap
            h[:] = 7
            with sk.mapped(queue, a[10:20], "rw") as h2:  # inside: nothing enqueued
                h2[:] = 3
                assert a[0:32].host.shape == (32,)
        with pytest.raises(sk.MapStateError):
            _ = a[16:32].host  # its open map closed
        assert spy.open == {a.ptr: 1} or sum(spy.open.values()) == 1
    assert spy.max_open == 1
    assert spy.maps == 2 and spy.unmaps == 2
    expect = np.zeros(64, np.uint8)
    expect[8:32] = 7
    expect[10:20] = 3
    np.testing.assert_array_equal(a.get(), expect)


def test_disjoint_maps_cover_together(queue, spy):
    a = sk.zeros(queue.context, 8, np.int32, policy=sk.Policy.coarse())
    with sk.mapped(queue, a[0:4]) as lo, sk.mapped(queue, a[4:8]) as hi:
        lo[:] = 1
        hi[:] = 2
        np.testing.assert_array_equal(a.host, [1] * 4 + [2] * 4)
    assert spy.max_open == 1
    np.testing.assert_array_equal(a.get(), [1] * 4 + [2] * 4)


def test_write_map_forbids_every_command_on_its_bytes(queue):
    ctx = queue.context
    a = sk.zeros(ctx, 16, np.int32, policy=sk.Policy.coarse())
    b = sk.zeros(ctx, 4, np.int32, policy=sk.Policy.coarse())
    with sk.mapped(queue, a[0:8], "w"):
        for call in (
            lambda: sk.fill(queue, a[4:8], 1),
            lambda: sk.copy(queue, b, a[4:8]),
            lambda: sk.copy(queue, a[0:4], b),
            lambda: sk.migrate(queue, [a[0:4]]),
            lambda: a[4:8].get(queue),
        ):
            with pytest.raises(sk.MapStateError) as err:
                call()
            assert err.value.cl_error is None
        sk.fill(queue, a[8:16], 3).wait()  # bytes outside the map are free to use
    np.testing.assert_array_equal(a.get()[8:], np.full(8, 3))


def test_read_map_forbids_only_writes(queue):
    ctx = queue.context
    a = sk.full(ctx, 8, 4, np.int32, policy=sk.Policy.coarse())
    b = sk.zeros(ctx, 8, np.int32, policy=sk.Policy.coarse())
    with sk.mapped(queue, a, "r"):
        sk.copy(queue, b, a)  # reading a is allowed
        sk.migrate(queue, [a]).wait()
        with pytest.raises(sk.MapStateError):
            sk.fill(queue, a, 0)
        with pytest.raises(sk.MapStateError):
            sk.copy(queue, a, b)
    np.testing.assert_array_equal(b.get(), np.full(8, 4))


@pytest.mark.needs("fine")
def test_fine_enqueues_no_map(queue, spy):
    a = sk.zeros(queue.context, 8, np.int32, policy=sk.Policy.fine())
    with sk.mapped(queue, a) as h:
        h[:] = 3
        sk.fill(queue, a[4:8], 1).wait()  # no map state for fine memory
    assert spy.maps == spy.unmaps == 0
    np.testing.assert_array_equal(a.host, [3] * 4 + [1] * 4)


def _enter_in_thread(m: Any, entered: threading.Event, out: list[Any]) -> threading.Thread:
    def run() -> None:
        with m as h:
            out.append(np.array(h))
            entered.set()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_waits_for_wait_for(queue, policy):
    a = sk.zeros(queue.context, 4, np.int32, policy=policy)
    gate = cl.UserEvent(queue.context)
    entered = threading.Event()
    out: list[Any] = []
    t = _enter_in_thread(sk.mapped(queue, a, "r", wait_for=[gate]), entered, out)
    assert not entered.wait(0.3)
    gate.set_status(COMPLETE)
    t.join(10)
    assert entered.is_set() and out[0].tolist() == [0, 0, 0, 0]


def test_waits_for_pending_svmkit_work(queue, policy):
    ctx = queue.context
    a = sk.zeros(ctx, 4, np.int32, policy=policy)
    src = sk.full(ctx, 4, 6, np.int32, policy=policy)
    gate = cl.UserEvent(ctx)
    other_queue = cl.CommandQueue(ctx)
    sk.copy(other_queue, a, src, blocking=False, wait_for=[gate])
    entered = threading.Event()
    out: list[Any] = []
    t = _enter_in_thread(sk.mapped(queue, a, "r"), entered, out)
    assert not entered.wait(0.3)
    gate.set_status(COMPLETE)
    t.join(10)
    assert out[0].tolist() == [6, 6, 6, 6]


@pytest.mark.parametrize("mode", ["x", "R", "", None, 1])
def test_bad_mode(queue, mode):
    a = sk.zeros(queue.context, 4, policy=sk.Policy.coarse())
    with pytest.raises(sk.InvalidValueError) as err:
        sk.mapped(queue, a, mode)
    assert err.value.cl_error == "CL_INVALID_VALUE"


def test_other_context(queue, other_ctx, foreign_event):
    a = sk.zeros(queue.context, 4, policy=sk.Policy.coarse())
    with pytest.raises(sk.InvalidContextError) as err:
        sk.mapped(cl.CommandQueue(other_ctx), a)
    assert err.value.cl_error == "CL_INVALID_CONTEXT"
    with pytest.raises(sk.InvalidContextError) as err:
        sk.mapped(queue, a, wait_for=[foreign_event])
    assert err.value.cl_error == "CL_INVALID_CONTEXT"


def test_bad_wait_list_and_queue(queue):
    a = sk.zeros(queue.context, 4, policy=sk.Policy.coarse())
    with pytest.raises(sk.InvalidValueError) as err:
        sk.mapped(queue, a, wait_for=["not an event"])
    assert err.value.cl_error == "CL_INVALID_EVENT_WAIT_LIST"
    with pytest.raises(sk.InvalidValueError) as err:
        sk.mapped("queue", a)
    assert err.value.cl_error == "CL_INVALID_COMMAND_QUEUE"


def test_use_after_free(queue, policy):
    a = sk.zeros(queue.context, 4, policy=policy)
    m = sk.mapped(queue, a)
    a.free()
    with pytest.raises(sk.UseAfterFreeError):
        sk.mapped(queue, a)
    with pytest.raises(sk.UseAfterFreeError):
        m.__enter__()


def test_zero_size_maps_nothing(queue, spy):
    a = sk.zeros(queue.context, 0, policy=sk.Policy.coarse())
    with sk.mapped(queue, a) as h:
        assert h.shape == (0,)
    assert spy.maps == 0


def test_free_inside_block_waits_for_unmap(queue, spy, monkeypatch):
    ctx = queue.context
    freed: list[int] = []
    real_free = icd.svm_free
    monkeypatch.setattr(icd, "svm_free", lambda c, p: (freed.append(p), real_free(c, p)))
    a = sk.zeros(ctx, 16, np.int32, resource=sk.SVMResource(ctx, sk.Policy.coarse()))
    ptr = a.ptr
    with sk.mapped(queue, a) as h:
        h[:] = 1
        a.free()
        sk.events.drain(5)
        assert ptr not in freed  # still mapped: the memory must outlive the unmap
        with pytest.raises(sk.UseAfterFreeError):
            _ = a.host
    sk.events.drain(5)
    assert freed.count(ptr) == 1
    assert spy.unmaps == 1


def test_reentering_one_mapping_is_refused(queue):
    a = sk.zeros(queue.context, 4, policy=sk.Policy.coarse())
    m = sk.mapped(queue, a)
    with m, pytest.raises(sk.InvalidValueError):
        m.__enter__()
    with m as h:  # sequential reuse works
        h[:] = 2
    np.testing.assert_array_equal(a.get(), [2] * 4)


def test_threads_mapping_slices_of_one_allocation(queue, spy):
    ctx = queue.context
    n_threads, per = 4, 64
    a = sk.zeros(ctx, n_threads * per, np.int32, policy=sk.Policy.coarse())

    def work(i: int) -> None:
        q = cl.CommandQueue(ctx)
        for _ in range(25):
            with sk.mapped(q, a[i * per : (i + 1) * per], "rw") as h:
                h += 1
                time.sleep(0)
        q.finish()

    run_threads(work, n_threads, timeout=60, start_together=True)
    assert spy.max_open == 1 and spy.maps == spy.unmaps
    np.testing.assert_array_equal(a.get(), np.full(n_threads * per, 25))


def test_failed_wait_for_event(queue, policy):
    a = sk.zeros(queue.context, 4, policy=policy)
    failed = cl.UserEvent(queue.context)
    failed.set_status(-1)
    with pytest.raises(sk.SVMError) as err, sk.mapped(queue, a, wait_for=[failed]):
        pass
    assert type(err.value) is sk.SVMError
    assert err.value.cl_error == "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"
