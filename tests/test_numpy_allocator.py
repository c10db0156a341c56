"""NumPy allocates in SVM (NEP 49): ``sk.numpy_allocator`` and NumPy arrays as svmkit memory.

Every check reads NumPy's own behaviour under the handler: which memory an array got
(``_cpool.numpy_allocation``, the handler's address table), values NumPy computed, the
pool's exact statistics, and the bytes of other arrays while kernels run.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from _helpers import assert_quiet_exit, run_python

import svmkit as sk
from svmkit.driver import calls
from svmkit.resources import _cpool
from svmkit.resources.numpy_allocator import host_policy

SLOW_FILL = """
__kernel void slow_fill(__global float *x, float value, int spins) {
    size_t i = get_global_id(0);
    float acc = 0.0f;
    for (int k = 0; k < spins; k++) acc += sin((float)k);   /* keep the device busy */
    x[i] = value + 0.0f * acc;
}
__kernel void add_one(__global float *x) { x[get_global_id(0)] += 1.0f; }
__kernel void sum_via_pointer(__global const ulong *table, __global float *out) {
    __global const float *data = (__global const float *)table[0];
    out[0] = data[0] + data[1];
}
"""


def _host_policy(ctx: cl.Context) -> sk.Policy:
    """The policy NumPy's arrays get on ``ctx``; a coarse-grain-only device (NVIDIA's) has
    none, and the allocator's tests do not apply there (its refusal is tested below)."""
    try:
        return host_policy(ctx)
    except sk.UnsupportedError as exc:
        pytest.skip(f"NumPy cannot use this device's SVM: {exc}")


def in_svm(a: np.ndarray[Any, Any]) -> bool:
    """Whether ``a``'s data is an svmkit allocation (through its bases)."""
    return _cpool.numpy_allocation(a) is not None


@pytest.fixture
def host_pool(ctx: cl.Context) -> Iterator[sk.StatisticsAdaptor]:
    """A counting pool of the suite's context in its best host-accessible policy."""
    stats = sk.StatisticsAdaptor(sk.PoolResource(sk.SVMResource(ctx, _host_policy(ctx))))
    yield stats


@pytest.fixture(scope="module")
def prg(ctx: cl.Context) -> sk.Program:
    return sk.build_program(ctx, SLOW_FILL)


# -- the handler: where NumPy's arrays come from ---------------------------------------------


def test_arrays_made_inside_the_block_are_svm_and_outside_are_not(
    host_pool: sk.StatisticsAdaptor,
) -> None:
    with sk.numpy_allocator(host_pool):
        x = np.arange(1000.0)
        made = [x, x * 2, np.concatenate([x, x]), np.where(x > 3, x, 0), x[x > 10], np.sort(x)]
    after = np.arange(1000.0)
    assert all(in_svm(a) for a in made)
    assert not in_svm(after)
    assert host_pool.stats()["current_allocations"] == len(made)
    np.testing.assert_array_equal(made[2], np.concatenate([after, after]))


def test_each_array_is_freed_by_its_pool_after_the_block(host_pool: sk.StatisticsAdaptor) -> None:
    with sk.numpy_allocator(host_pool):
        kept = np.ones(4096, np.float32)
    assert host_pool.stats()["current_bytes"] == kept.nbytes
    del kept  # outside the block: still freed by the handler that made it
    stats = host_pool.stats()
    assert (stats["current_bytes"], stats["current_allocations"]) == (0, 0)
    assert stats["total_allocations"] >= 1  # (np.ones makes temporaries of its own)


def test_the_handler_is_restored_nested_and_reentered(host_pool: sk.StatisticsAdaptor) -> None:
    outer_handler = _cpool.get_numpy_handler()
    allocator = sk.numpy_allocator(host_pool)
    with allocator:
        inner = _cpool.get_numpy_handler()
        with allocator:  # the same object, nested
            assert in_svm(np.empty(3))
        assert _cpool.get_numpy_handler() is inner
        with sk.numpy_allocator(host_pool):  # another object over the same resource
            assert in_svm(np.empty(3))
    assert _cpool.get_numpy_handler() is outer_handler
    with allocator:  # entered again after it was left
        assert in_svm(np.empty(3))
    assert not in_svm(np.empty(3))


def test_exit_without_enter_is_an_error(host_pool: sk.StatisticsAdaptor) -> None:
    with pytest.raises(sk.InvalidValueError):
        sk.numpy_allocator(host_pool).__exit__(None, None, None)


def test_other_threads_are_untouched_and_tasks_copy_the_context(
    host_pool: sk.StatisticsAdaptor,
) -> None:
    seen: dict[str, bool] = {}
    started = threading.Event()
    release = threading.Event()

    def other_thread() -> None:
        started.wait()
        seen["thread"] = in_svm(np.empty(16))
        release.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with sk.numpy_allocator(host_pool):
        started.set()
        release.wait(30)

        async def task() -> bool:
            return in_svm(np.empty(16))

        seen["task"] = asyncio.run(task())
    worker.join()
    assert seen == {"thread": False, "task": True}


def test_install_sets_it_for_the_rest_of_the_context(host_pool: sk.StatisticsAdaptor) -> None:
    def body() -> tuple[bool, bool]:
        sk.numpy_allocator(host_pool).install()
        inside = in_svm(np.empty(8))
        copied = contextvars.copy_context().run(lambda: in_svm(np.empty(8)))
        return inside, copied

    assert contextvars.copy_context().run(body) == (True, True)
    assert not in_svm(np.empty(8))  # this context never installed it


def test_a_coarse_resource_or_a_non_resource_is_refused(ctx: cl.Context) -> None:
    coarse = sk.PoolResource(sk.SVMResource(ctx, sk.Policy(sk.Granularity.COARSE)))
    with pytest.raises(sk.InvalidValueError, match="COARSE"):
        sk.numpy_allocator(coarse)
    with pytest.raises(sk.InvalidValueError, match="memory resource"):
        sk.numpy_allocator("pool")  # type: ignore[arg-type]


def test_a_default_context_without_fine_grain_svm_is_unsupported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        sk.Policy, "best", classmethod(lambda cls, ctx, **kw: sk.Policy(sk.Granularity.COARSE))
    )
    with pytest.raises(sk.UnsupportedError) as info:
        sk.numpy_allocator()
    device = sk.default_context().devices[0].name.strip()
    assert device in str(info.value) and "fine-grain" in str(info.value)


def test_the_default_is_the_current_resource_looked_up_at_each_allocation() -> None:
    ctx = sk.default_context()
    policy = _host_policy(ctx)
    counting = sk.StatisticsAdaptor(sk.PoolResource(sk.SVMResource(ctx, policy)))
    with sk.numpy_allocator():
        before = counting.stats()["total_allocations"]
        with sk.use_resource(counting):
            selected = np.empty(100)
        default = np.empty(100)
    assert counting.stats()["total_allocations"] == before + 1
    assert _cpool.numpy_allocation(selected).resource is counting
    assert _cpool.numpy_allocation(default).resource is sk.current_resource(ctx, policy)
    previous = sk.set_current_resource(counting)
    try:
        with sk.numpy_allocator():
            process_wide = np.empty(100)
        assert _cpool.numpy_allocation(process_wide).resource is counting
    finally:
        if previous is not None:
            sk.set_current_resource(previous)


def test_zeros_are_zero_in_reused_blocks(host_pool: sk.StatisticsAdaptor) -> None:
    with sk.numpy_allocator(host_pool):
        dirty = np.full(2048, 7.0)
        address = dirty.ctypes.data
        del dirty
        clean = np.zeros(2048)
    assert clean.ctypes.data == address  # the very block, reused
    assert not clean.any()


def test_empty_and_tiny_arrays(host_pool: sk.StatisticsAdaptor) -> None:
    with sk.numpy_allocator(host_pool):
        empty = np.empty(0)
        scalar_array = np.array(3.5)
        tiny = np.ones(1, np.uint8)
    assert empty.size == 0 and float(scalar_array) == 3.5 and tiny[0] == 1
    del empty, scalar_array, tiny
    assert host_pool.stats()["current_allocations"] == 0


# -- realloc: NumPy grows arrays in place -----------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: _resized(), id="ndarray.resize"),
        pytest.param(lambda: np.fromiter(range(100_000), np.int64), id="fromiter"),
        pytest.param(lambda: np.fromiter((i for i in range(5000)), np.float64), id="fromiter-gen"),
        pytest.param(
            lambda: np.loadtxt(io.StringIO("\n".join(f"{i} {2 * i}" for i in range(3000)))),
            id="loadtxt",
        ),
        pytest.param(
            lambda: np.fromstring(" ".join(map(str, range(20000))), sep=" "),
            id="fromstring-text",
        ),
    ],
)
def test_reallocation_keeps_values_and_svm_memory(
    host_pool: sk.StatisticsAdaptor, build: Callable[[], np.ndarray[Any, Any]]
) -> None:
    with sk.numpy_allocator(host_pool):
        out = build()
    plain = build()
    np.testing.assert_array_equal(out, plain)
    assert in_svm(out)
    del out
    assert host_pool.stats()["current_allocations"] == 0


def _resized() -> np.ndarray[Any, Any]:
    a = np.arange(10.0)
    a.resize(50_000, refcheck=False)
    return a


def test_np_resize_allocates_anew(host_pool: sk.StatisticsAdaptor) -> None:
    with sk.numpy_allocator(host_pool):
        a = np.arange(6)
        b = np.resize(a, (4, 4))
    assert in_svm(b) and b.ctypes.data != a.ctypes.data
    np.testing.assert_array_equal(b.ravel()[:6], np.arange(6))


def test_text_reallocation_without_the_gil_from_threads(host_pool: sk.StatisticsAdaptor) -> None:
    text = " ".join(map(str, range(30000)))
    results: list[np.ndarray[Any, Any]] = []
    errors: list[BaseException] = []

    def parse() -> None:
        try:
            with sk.numpy_allocator(host_pool):
                for _ in range(5):
                    results.append(np.fromstring(text, sep=" "))
        except BaseException as exc:  # pragma: no cover (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=parse) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 20 and all(in_svm(r) for r in results)
    expected = np.arange(30000, dtype=np.float64)
    assert all(np.array_equal(r, expected) for r in results)
    addresses = {r.ctypes.data for r in results}
    assert len(addresses) == 20  # no block handed out twice


# -- NumPy arrays in svmkit memory are first-class --------------------------------------------


def test_an_unchanged_numpy_result_goes_straight_to_a_kernel(
    ctx: cl.Context, queue: cl.CommandQueue, prg: sk.Program, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        x = np.linspace(0, 1, 4096, dtype=np.float32)
        y = np.concatenate([x, x])[::2].copy()  # NumPy made every one of these
    expected = np.concatenate([x, x])[::2] + 1
    prg.add_one(queue, y.shape, None, y).wait()
    np.testing.assert_array_equal(y, expected)


def test_views_and_strided_views_pass_at_their_first_element(
    ctx: cl.Context, queue: cl.CommandQueue, prg: sk.Program, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        base = np.zeros(64, np.float32)
    prg.add_one(queue, (8,), None, base[16:]).wait()
    expected = np.zeros(64, np.float32)
    expected[16:24] = 1
    np.testing.assert_array_equal(base, expected)
    prg.add_one(queue, (4,), None, base[40::2]).wait()  # a strided view: from element 0 on
    expected[40:44] = 1
    np.testing.assert_array_equal(base, expected)


def test_a_plain_ndarray_argument_names_asarray_and_the_allocator(
    queue: cl.CommandQueue, prg: sk.Program
) -> None:
    with pytest.raises(sk.InvalidValueError) as info:
        prg.add_one(queue, (4,), None, np.zeros(4, np.float32))
    assert "sk.asarray" in str(info.value) and "sk.numpy_allocator" in str(info.value)
    with pytest.raises(sk.InvalidValueError, match=r"sk\.numpy_allocator"):
        sk.launch(
            queue,
            prg.add_one.kernel if hasattr(prg.add_one, "kernel") else prg.add_one,
            (4,),
            None,
            np.zeros(4, np.float32),
        )


def test_an_array_of_another_context_is_refused(
    other_ctx: cl.Context, queue: cl.CommandQueue, prg: sk.Program
) -> None:
    foreign = sk.StatisticsAdaptor(
        sk.PoolResource(sk.SVMResource(other_ctx, _host_policy(other_ctx)))
    )
    with sk.numpy_allocator(foreign):
        x = np.zeros(4, np.float32)
    with pytest.raises(sk.InvalidContextError):
        prg.add_one(queue, (4,), None, x)
    with pytest.raises(sk.InvalidContextError):
        sk.fill(queue, x, 1.0)


def test_uses_entries_are_registered(
    ctx: cl.Context, queue: cl.CommandQueue, prg: sk.Program, host_pool: sk.StatisticsAdaptor
) -> None:
    if (
        host_policy(ctx).granularity is not sk.Granularity.FINE
        and not sk.capabilities(ctx).fine_grain_system
    ):
        pytest.skip("needs fine-grain SVM")
    with sk.numpy_allocator(host_pool):
        data = np.array([1.5, 2.25], np.float32)
        table = np.array([data.ctypes.data], np.uint64)
        out = np.zeros(1, np.float32)
    prg.sum_via_pointer(queue, (1,), None, table, out, uses=[data]).wait()
    assert out[0] == 3.75


def test_free_by_numpy_waits_for_the_kernel(
    ctx: cl.Context, queue: cl.CommandQueue, prg: sk.Program, host_pool: sk.StatisticsAdaptor
) -> None:
    gate = calls.new_user_event(ctx)
    with sk.numpy_allocator(host_pool):
        doomed = np.zeros(1 << 16, np.float32)
        address = doomed.ctypes.data
        prg.slow_fill(
            queue, doomed.shape, None, doomed, np.float32(9), np.int32(0), wait_for=[gate]
        )
        del doomed  # NumPy frees it while the kernel waits to run
        newcomers = [np.ones(1 << 16, np.float32) for _ in range(4)]
    assert address not in {n.ctypes.data for n in newcomers}  # the block waits for its kernel
    assert host_pool.stats()["current_allocations"] == 4
    calls.set_event_status(gate)
    queue.finish()
    assert all((n == 1).all() for n in newcomers)  # no other array's bytes changed
    with sk.numpy_allocator(host_pool):
        again = np.empty(1 << 16, np.float32)
    assert again.ctypes.data == address  # reused once the kernel finished


def test_asarray_wraps_without_a_copy_and_free_ends_svmkits_use_only(
    ctx: cl.Context, queue: cl.CommandQueue, prg: sk.Program, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        nd = np.arange(256, dtype=np.float32)
    a = sk.asarray(ctx, nd)
    assert isinstance(a, sk.SVMArray) and a.ptr == nd.ctypes.data
    assert a.policy == host_policy(ctx) and a.shape == nd.shape
    view = sk.asarray(ctx, nd[10:20])
    assert view.ptr == nd[10:].ctypes.data
    prg.add_one(queue, a.shape, None, a).wait()
    a.free()
    np.testing.assert_array_equal(nd, np.arange(256, dtype=np.float32) + 1)
    assert host_pool.stats()["current_allocations"] == 1  # NumPy still owns it
    held = sk.asarray(ctx, nd)
    del nd  # the SVMArray holds the ndarray: the memory stays
    assert host_pool.stats()["current_allocations"] == 1
    np.testing.assert_array_equal(held.host, np.arange(256, dtype=np.float32) + 1)
    del held, view, a
    assert host_pool.stats()["current_allocations"] == 0


def test_asarray_of_another_context_or_dtype_copies(
    ctx: cl.Context, other_ctx: cl.Context, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        nd = np.arange(8, dtype=np.float32)
    other = sk.asarray(other_ctx, nd)
    assert other.ptr != nd.ctypes.data and other.context == other_ctx
    cast = sk.asarray(ctx, nd, dtype=np.float64)
    assert cast.ptr != nd.ctypes.data
    np.testing.assert_array_equal(cast.get(), nd)


def test_operations_take_allocator_arrays(
    ctx: cl.Context, queue: cl.CommandQueue, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        dst = np.zeros(1024, np.float32)
        src = np.arange(1024, dtype=np.float32)
    sk.fill(queue, dst, 3.0).wait()
    assert (dst == 3).all()
    sk.copy(queue, dst, src)
    np.testing.assert_array_equal(dst, src)
    with sk.mapped(queue, dst, "rw") as host:
        host[:4] = -1
    assert dst[:4].tolist() == [-1, -1, -1, -1]
    marker = calls.enqueue_marker(queue, None)
    sk.record(marker, dst)
    assert (
        marker in _cpool.numpy_allocation(dst).events.pending()
        or marker.command_execution_status == 0
    )
    if host_policy(ctx).granularity is sk.Granularity.FINE:
        sk.migrate(queue, [dst, src]).wait()


def test_plain_ndarrays_keep_their_errors(queue: cl.CommandQueue) -> None:
    with pytest.raises(sk.InvalidValueError, match=r"sk\.numpy_allocator"):
        sk.fill(queue, np.zeros(4, np.float32), 1.0)
    with pytest.raises(sk.InvalidValueError, match=r"sk\.numpy_allocator"):
        sk.mapped(queue, np.zeros(4, np.float32))
    with pytest.raises(sk.InvalidValueError, match=r"sk\.numpy_allocator"):
        sk.record(calls.enqueue_marker(queue, None), np.zeros(4))


def test_svmkit_calls_inside_the_block_do_not_deadlock(
    ctx: cl.Context, queue: cl.CommandQueue, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        pool = sk.Pool(ctx, policy=host_policy(ctx))
        a = pool.empty(1000, np.float32)
        a.set(np.arange(1000, dtype=np.float32))
        live = np.ones(3)
        stats = host_pool.stats()
        b = sk.asarray(ctx, np.arange(10))
        upstream = host_pool.upstream
        assert isinstance(upstream, sk.PoolResource)
        upstream.trim()
    assert a.get()[-1] == 999 and stats["current_allocations"] == 1 and b.get()[3] == 3
    assert in_svm(live)


def test_a_collection_while_the_pool_holds_its_lock_frees_and_allocates_without_deadlock() -> None:
    """A garbage collection may run at any allocation, the pool's own bookkeeping under its
    lock included.  NumPy frees a collected array's data there (the handler hands that free
    to the release thread instead of taking the lock again), and a finaliser may make an
    array there (it gets plain memory).  In a fresh interpreter: the deadlock would hang it.
    """
    _host_policy(sk.default_context())
    code = """
import faulthandler, gc
import numpy as np, svmkit as sk
from svmkit.resources import _cpool
from svmkit.resources.numpy_allocator import host_policy
faulthandler.dump_traceback_later(30, exit=True)
ctx = sk.default_context()
pool = sk.PoolResource(sk.SVMResource(ctx, host_policy(ctx)))
made = []
class Node:
    def __del__(self):
        made.append(np.arange(10.0))
with sk.numpy_allocator(pool):
    node = Node()
    node.me, node.data = node, np.arange(100.0)
    np.arange(10.0)  # (the pool's block of that class: the finaliser's request would reuse it)
    blocks = _cpool.numpy_blocks()
    del node
    with pool._cache:  # what a collection at an allocation under the pool's lock meets
        gc.collect()
info = pool.info()  # (runs what was handed to the release thread, if it has not yet)
print(blocks - _cpool.numpy_blocks(), info["live_allocations"], made[0].sum(),
      _cpool.numpy_allocation(made[0]))
"""
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "0", "45.0", "None"], proc.stdout + proc.stderr


# -- processes ---------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="fork is POSIX")
def test_a_forked_child_gets_plain_memory_and_leaves_the_parents_pool(
    host_pool: sk.StatisticsAdaptor,
) -> None:
    with sk.numpy_allocator(host_pool):
        inherited = np.arange(1000.0)
        pid = os.fork()
        if pid == 0:  # the child: never touches the parent's pool, never crashes
            status = 0
            try:
                fresh = np.arange(1000.0)
                status |= 1 if in_svm(fresh) else 0
                status |= 2 if inherited.sum() != 499500.0 else 0
                del inherited, fresh
            except BaseException:
                status = 4
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert inherited.sum() == 499500.0 and in_svm(inherited)


def test_interpreter_exit_with_live_allocator_arrays_is_quiet() -> None:
    _host_policy(sk.default_context())
    code = """
import numpy as np, svmkit as sk
from svmkit.driver.queues import default_queue
ctx = sk.default_context()
prg = sk.build_program(ctx, "__kernel void inc(__global int *x) { x[get_global_id(0)] += 1; }")
sk.numpy_allocator().install()
keep = [np.arange(1000, dtype=np.int32) for _ in range(50)]
for k in keep[:10]:
    prg.inc(default_queue(ctx), k.shape, None, k)
cycle = [np.zeros(10)]; cycle.append(cycle)
print("done")
"""
    proc = run_python(code)
    assert_quiet_exit(proc, last_line="done")


def test_the_kept_kernel_pointer_follows_each_hand_out(
    queue: cl.CommandQueue, prg: sk.Program, host_pool: sk.StatisticsAdaptor
) -> None:
    with sk.numpy_allocator(host_pool):
        first = np.zeros(256, np.float32)
    address = first.ctypes.data
    for _ in range(3):  # the second and third launches use the pointer kept for it
        prg.add_one(queue, first.shape, None, first)
    queue.finish()
    assert (first == 3).all()
    del first
    with sk.numpy_allocator(host_pool):
        second = np.full(256, 10, np.float32)  # the same block, a new allocation
        shorter = np.full(200, 5, np.float32)
    assert second.ctypes.data == address
    prg.add_one(queue, second.shape, None, second)
    prg.add_one(queue, (200,), None, shorter)
    queue.finish()
    assert (second == 11).all() and (shorter == 6).all()
