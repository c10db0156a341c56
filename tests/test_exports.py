"""Exports keep memory alive: NumPy views, DLPack capsules and PyOpenCL bridges outlive
free() without a crash and without writing into memory another array owns."""

from __future__ import annotations

import _thread
import gc
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pyopencl as cl
import pytest
from _helpers import CHILD_CWD, collects_holding

import svmkit as sk
from svmkit import events
from svmkit.resources import exports

pytestmark = pytest.mark.needs("fine")


def run_script(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        cwd=CHILD_CWD,
        timeout=120,
    )


@pytest.mark.parametrize(
    "how",
    ["free", "with", "enqueue_free", "del"],
)
def test_view_written_after_free_of_raw_svm_does_not_crash(how: str) -> None:
    # Without exports, clSVMFree unmaps the memory and the write segfaults (exit 139).
    proc = run_script(
        f"""
        import gc
        import numpy as np, pyopencl as cl, svmkit as sk
        from svmkit import events
        ctx = sk.create_context()
        raw = sk.SVMResource(ctx, sk.Policy.fine())
        x = sk.empty(ctx, 1 << 20, np.float64, resource=raw)
        h = np.asarray(x)
        how = {how!r}
        if how == "free":
            x.free()
        elif how == "with":
            with x:
                pass
        elif how == "enqueue_free":
            x.enqueue_free(cl.CommandQueue(ctx)).wait()
        else:
            del x
        assert events.drain(10)
        gc.collect()
        h[:] = 1
        print(int(h.sum()))
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(1 << 20)]


def test_write_through_a_stale_view_never_reaches_the_next_pooled_array() -> None:
    # Without exports, the pool hands a's block to b and the stale write lands in b.
    proc = run_script(
        """
        import numpy as np, svmkit as sk
        ctx = sk.create_context()
        pool = sk.Pool(ctx, sk.Policy.fine())
        a = pool.empty(1024, np.int64)
        stale = a.host
        a.free()
        b = pool.empty(1024, np.int64)
        b.host[:] = 7
        stale[:] = -1
        print(int((b.host == 7).sum()), int((stale == -1).sum()))
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1024", "1024"]


def test_pool_counts_a_block_an_export_holds_and_tracking_says_so(ctx: cl.Context) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    tracker = sk.TrackingAdaptor(pool)
    a = sk.empty(ctx, 100, np.uint8, resource=tracker)
    view = a.host
    a.free()
    assert a.freed
    with pytest.raises(sk.UseAfterFreeError):
        a.host  # noqa: B018
    assert pool.stats()["current_bytes"] == 100  # still in use: the view holds it
    [held] = tracker.outstanding()
    assert held.allocation is a.allocation and held.held_by_exports
    assert "held by a live export" in str(held)
    view[:] = 5  # a write through the export stays in memory nobody else owns
    del view
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0
    assert tracker.outstanding() == []


def test_every_hand_out_has_its_own_owner(ctx: cl.Context) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.empty(8, np.int32)
    stale = a.host
    a.free()
    c = pool.empty(8, np.int32)
    assert c.host.base is not stale.base
    assert c.ptr != stale.ctypes.data


@pytest.mark.parametrize("export", ["host", "asarray", "numpy_view", "dlpack", "capsule"])
def test_each_kind_of_export_holds_the_block(ctx: cl.Context, export: str) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.full(16, 3, np.int64)
    address = a.ptr
    if export == "host":
        held = a.host
    elif export == "asarray":
        held = np.asarray(a)
    elif export == "numpy_view":
        held = a.host[2:5].view(np.int32)  # a view of a view
    elif export == "dlpack":
        held = np.from_dlpack(a)
    else:
        held = a.__dlpack__(max_version=(1, 0))
    a.free()
    b = pool.empty(16, np.int64)
    assert b.ptr != address  # not reused while the export lives
    del held
    assert events.drain(10.0)
    c = pool.empty(16, np.int64)
    assert c.ptr == address  # back in the pool once it is gone


def test_torch_tensor_from_dlpack_outlives_free(ctx: cl.Context) -> None:
    torch = pytest.importorskip("torch")
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.asarray(np.arange(8.0))
    t = torch.from_dlpack(a)
    a.free()
    b = pool.full(8, 9.0)
    t += 1  # memory the tensor still owns
    assert t.tolist() == [float(i + 1) for i in range(8)]
    assert b.host.tolist() == [9.0] * 8
    assert pool.stats()["current_bytes"] == 128
    del t
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 64


def test_export_dying_never_takes_the_pool_lock(ctx: cl.Context) -> None:
    # A garbage collection inside allocate() may collect an export on the thread that
    # holds the pool's lock: its release must not wait for that lock.
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.empty(32, np.float64)
    cycle: list[object] = [a.host]
    cycle.append(cycle)  # an export only a garbage collection frees
    a.free()
    del cycle
    assert collects_holding(pool.pool._cache), (
        "releasing an export from a finalizer waited for the pool's lock"
    )
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0


def test_array_dropped_while_an_export_lives_is_freed_when_it_goes(ctx: cl.Context) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.full(4, 1.5)
    view = a.host
    del a  # the last reference to the array: freed, but the view keeps the memory
    gc.collect()
    assert pool.stats()["current_bytes"] == 32
    assert view.tolist() == [1.5] * 4
    del view
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0


def test_enqueue_free_callback_runs_once_and_memory_waits_for_the_export(
    ctx: cl.Context, queue: cl.CommandQueue
) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.empty(64, np.uint8)
    view = a.host
    calls: list[list[sk.SVMArray]] = []
    a.enqueue_free(queue, callback=lambda q, arrays: calls.append(arrays)).wait()
    assert events.drain(10.0)
    assert len(calls) == 1 and calls[0][0] is a
    assert pool.stats()["current_bytes"] == 64
    del view
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0 and len(calls) == 1


def test_threads_freeing_reusing_and_writing_through_old_exports(ctx: cl.Context) -> None:
    pool = sk.Pool(ctx, sk.Policy.fine())
    errors: list[str] = []

    def worker(tid: int) -> None:
        for i in range(300):
            a = pool.full(32, tid, np.int64)
            stale = a.host if i % 2 else np.from_dlpack(a)
            a.free()
            b = pool.full(32, 1000 + tid, np.int64)
            stale[:] = -1  # through an export of freed memory
            if not (b.host == 1000 + tid).all():
                errors.append(f"thread {tid}: another array's bytes changed")
            b.free()
            del stale

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0


def test_out_of_memory_collects_exports_and_reports_what_they_hold(ctx: cl.Context) -> None:
    limited = sk.LimitingAdaptor(sk.SVMResource(ctx, sk.Policy.fine()), 1 << 20)
    pool = sk.PoolResource(limited)
    a = sk.empty(ctx, 1 << 20, np.uint8, resource=pool)
    cycle: list[object] = [a.host]
    cycle.append(cycle)  # an export in a reference cycle: only a collection frees it
    a.free()
    pool.trim()
    del cycle
    gc.disable()
    try:
        b = sk.empty(ctx, (1 << 20) - 4096, np.uint8, resource=pool)  # needs the memory back
    finally:
        gc.enable()
    kept = b.host
    b.free()
    with pytest.raises(sk.OutOfMemoryError) as info:
        sk.empty(ctx, 1 << 20, np.uint8, resource=pool)
    assert f"{(1 << 20) - 4096} bytes of freed arrays still held by live exports" in str(info.value)
    assert exports.exported_bytes() >= (1 << 20) - 4096
    del kept


def test_export_of_a_freed_array_is_refused(ctx: cl.Context) -> None:
    a = sk.zeros(ctx, 4, policy=sk.Policy.fine())
    a.free()
    for export in (lambda: a.host, lambda: np.asarray(a), lambda: a.__dlpack__()):
        with pytest.raises(sk.UseAfterFreeError):
            export()


@pytest.mark.needs("coarse")
def test_coarse_host_views_are_no_exports(ctx: cl.Context, queue: cl.CommandQueue) -> None:
    pool = sk.Pool(ctx, sk.Policy.coarse())
    a = pool.zeros(16, np.int32)
    with sk.mapped(queue, a) as h:
        h[:] = 4
        assert a.host.tolist() == [4] * 16
    a.free()  # valid only inside the block: nothing keeps the memory
    assert pool.stats()["current_bytes"] == 0


def test_ctrl_c_landing_in_an_export_finaliser_is_not_lost(
    ctx: cl.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python drops a KeyboardInterrupt raised inside a finaliser: a Ctrl-C that landed in
    # an export's finaliser was lost (the demo ran on after Ctrl-C).  The finaliser hands
    # the interrupt back to the main thread, and the owner's count still drops exactly once.
    import svmkit.resources.exports as exports_module

    real_handoff = events.release.handoff
    handed: list[object] = []
    interrupts: list[bool] = []

    def signal_lands_here(item: object) -> None:
        handed.append(item)
        real_handoff(item)
        if len(handed) == 1:
            raise KeyboardInterrupt  # as a SIGINT handled right after the hand-off

    pool = sk.Pool(ctx, sk.Policy.fine())
    a = pool.zeros(8, np.int32)
    view = a.host
    a.free()
    monkeypatch.setattr(exports_module, "handoff", signal_lands_here)
    monkeypatch.setattr(_thread, "interrupt_main", lambda: interrupts.append(True))
    del view
    gc.collect()
    assert interrupts == [True]  # the interrupt is re-delivered to the main thread
    assert len(handed) == 2 and handed[0] is handed[1]  # handed over twice, the same one-shot
    assert events.drain(10.0)
    assert pool.stats()["current_bytes"] == 0  # released, once
    b = pool.zeros(8, np.int32)
    assert b.get().tolist() == [0] * 8
