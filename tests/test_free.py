"""Ordered freeing: free() and enqueue_free() return memory only after recorded work."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import numpy as np
import pyopencl as cl
import pytest
from _helpers import run_threads

import svmkit as sk
import svmkit.driver.entrypoints as icd
from svmkit.events import drain

COMPLETE = cl.command_execution_status.COMPLETE


class FreeSpy:
    """Records every clSVMFree (pointer, thread) and forwards it to the driver."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.real = icd.svm_free

    def __call__(self, context: cl.Context, ptr: int) -> None:
        self.calls.append((ptr, threading.get_ident()))
        self.real(context, ptr)

    def count(self, ptr: int) -> int:
        return sum(1 for p, _ in self.calls if p == ptr)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> FreeSpy:
    # Earlier tests' garbage and deferred frees go first: freeing an address that this
    # test's allocation then reuses would count twice (seen on PoCL 3.0 under xdist).
    gc.collect()
    assert drain(10)
    s = FreeSpy()
    monkeypatch.setattr(icd, "svm_free", s)
    return s


@pytest.fixture
def raw(ctx: cl.Context, policy: sk.Policy) -> sk.SVMResource:
    """A raw resource, so each free is one clSVMFree the spy sees."""
    return sk.SVMResource(ctx, policy)


def test_free_waits_for_recorded_commands(queue, raw, spy):
    a = sk.zeros(queue.context, 1024, np.int32, resource=raw)
    src = np.arange(1024, dtype=np.int32)
    gate = cl.UserEvent(queue.context)
    sk.copy(queue, a, src, blocking=False, wait_for=[gate])
    ptr = a.ptr
    a.free()  # must not block
    assert a.freed
    drain(0.2)
    assert spy.count(ptr) == 0  # the copy has not run yet: the memory stays
    gate.set_status(COMPLETE)
    assert drain(10)
    assert spy.count(ptr) == 1


def test_free_is_idempotent_and_exactly_once(queue, raw, spy):
    a = sk.zeros(queue.context, 16, resource=raw)
    view = a[2:5]
    ptr = a.ptr
    a.free()
    a.free()
    view.free()
    del a, view
    assert drain(10)
    assert spy.count(ptr) == 1


def test_last_reference_frees(queue, raw, spy):
    a = sk.zeros(queue.context, 16, resource=raw)
    ptr = a.ptr
    view = a[4:8]
    del a
    assert drain(10) and spy.count(ptr) == 0  # the view keeps the allocation
    del view
    assert drain(10) and spy.count(ptr) == 1


def test_enqueue_free_callback_once_off_thread_after_memory_returned(queue, raw, spy):
    a = sk.zeros(queue.context, 64, np.float32, resource=raw)
    ptr = a.ptr
    gate = cl.UserEvent(queue.context)
    seen: list[tuple[cl.CommandQueue, list[sk.SVMArray], int, int]] = []
    done = threading.Event()

    def callback(q: cl.CommandQueue, arrays: list[sk.SVMArray]) -> None:
        seen.append((q, arrays, threading.get_ident(), spy.count(ptr)))
        done.set()

    event = a.enqueue_free(queue, callback, wait_for=[gate])
    assert isinstance(event, cl.Event)
    with pytest.raises(sk.UseAfterFreeError):
        sk.fill(queue, a, 1)  # unusable at once
    assert not done.wait(0.2) and spy.count(ptr) == 0  # wait_for not complete yet
    gate.set_status(COMPLETE)
    assert done.wait(10)
    assert drain(10)
    assert len(seen) == 1
    q, arrays, thread, frees_before = seen[0]
    assert q is queue and len(arrays) == 1 and arrays[0] is a
    assert thread != threading.get_ident()
    assert frees_before == 1  # the memory went back before the callback
    assert spy.count(ptr) == 1


def test_enqueue_free_orders_after_recorded_work_of_other_queues(queue, raw, spy):
    ctx = queue.context
    a = sk.zeros(ctx, 64, np.int32, resource=raw)
    ptr = a.ptr
    gate = cl.UserEvent(ctx)
    sk.fill(cl.CommandQueue(ctx), a, 1, wait_for=[gate])
    a.enqueue_free(queue)
    assert not drain(0.2)  # the release waits for the fill on the other queue
    assert spy.count(ptr) == 0
    gate.set_status(COMPLETE)
    assert drain(10) and spy.count(ptr) == 1


def test_enqueue_free_of_freed_array(queue, raw, spy):
    a = sk.zeros(queue.context, 8, resource=raw)
    ptr = a.ptr
    a.free()
    calls: list[object] = []
    event = a.enqueue_free(queue, lambda q, arrays: calls.append(arrays))
    assert event.command_execution_status == COMPLETE
    assert drain(10)
    assert calls == [] and spy.count(ptr) == 1


def test_enqueue_free_contexts(queue, other_ctx, foreign_event):
    a = sk.zeros(queue.context, 8)
    with pytest.raises(sk.InvalidContextError) as err:
        a.enqueue_free(cl.CommandQueue(other_ctx))
    assert err.value.cl_error == "CL_INVALID_CONTEXT"
    with pytest.raises(sk.InvalidContextError) as err:
        a.enqueue_free(queue, wait_for=[foreign_event])
    assert err.value.cl_error == "CL_INVALID_CONTEXT"
    assert not a.freed


def test_enqueue_free_bad_wait_list(queue):
    a = sk.zeros(queue.context, 8)
    with pytest.raises(sk.InvalidValueError) as err:
        a.enqueue_free(queue, wait_for=[object()])
    assert err.value.cl_error == "CL_INVALID_EVENT_WAIT_LIST"


def test_use_after_free_everywhere(queue, policy):
    ctx = queue.context
    a = sk.zeros(ctx, (4, 4), np.int32, policy=policy)
    view = a[1]
    a.enqueue_free(queue).wait()
    kernel = cl.Kernel(sk.build_program(ctx, "__kernel void k(__global int *a) {}"), "k")
    for call in (
        lambda: view.host,
        lambda: a.ptr,
        lambda: a.get(),
        lambda: view.set(1),
        lambda: sk.launch(queue, kernel, (1,), None, view),
        lambda: sk.mapped(queue, a),
        lambda: a[0],
    ):
        with pytest.raises(sk.UseAfterFreeError) as err:
            call()
        assert err.value.cl_error is None


def test_concurrent_enqueue_free_callbacks_run_exactly_once(ctx, spy):
    raw = sk.SVMResource(ctx, sk.Policy.coarse())
    gc.collect()  # earlier tests' garbage must not free memory while we count
    assert drain(10)
    spy.calls.clear()
    counts: dict[int, int] = {}
    lock = threading.Lock()
    ptrs: list[int] = []

    def callback(q: cl.CommandQueue, arrays: list[sk.SVMArray]) -> None:
        with lock:
            counts[id(arrays[0])] = counts.get(id(arrays[0]), 0) + 1

    arrays_all: list[sk.SVMArray] = []

    def worker() -> None:
        q = cl.CommandQueue(ctx)
        for _ in range(50):
            a = sk.empty(ctx, 256, np.uint8, resource=raw)
            sk.fill(q, a, 3)
            with lock:
                arrays_all.append(a)
                ptrs.append(a.ptr)
            a.enqueue_free(q, callback)
            a.enqueue_free(q, callback)  # second call: already freed, no callback
        q.finish()

    run_threads(lambda _: worker(), 4, timeout=60)
    assert drain(30)
    assert len(counts) == 200 and set(counts.values()) == {1}
    assert all(a.freed for a in arrays_all)
    assert Counter(p for p, _ in spy.calls) == Counter(ptrs)  # each allocation freed once


def test_enqueue_free_needs_a_queue(queue):
    a = sk.zeros(queue.context, 8)
    with pytest.raises(sk.InvalidValueError) as err:
        a.enqueue_free("queue")
    assert err.value.cl_error == "CL_INVALID_COMMAND_QUEUE"
    assert not a.freed
