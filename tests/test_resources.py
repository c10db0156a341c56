"""One generic suite for every memory resource and adaptor stack (as RMM's mr tests).

Each test runs against every named stack; stack-specific behaviour lives in
tests/test_pool.py.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk

Factory = Callable[[cl.Context, sk.Policy], sk.MemoryResource]

STACKS: dict[str, Factory] = {
    "svm": lambda c, p: sk.SVMResource(c, p),
    "pool(svm)": lambda c, p: sk.PoolResource(sk.SVMResource(c, p)),
    "stats(svm)": lambda c, p: sk.StatisticsAdaptor(sk.SVMResource(c, p)),
    "stats(pool(svm))": lambda c, p: sk.StatisticsAdaptor(sk.PoolResource(sk.SVMResource(c, p))),
    "pool(stats(svm))": lambda c, p: sk.PoolResource(sk.StatisticsAdaptor(sk.SVMResource(c, p))),
    "limit(svm)": lambda c, p: sk.LimitingAdaptor(sk.SVMResource(c, p), 1 << 30),
    "limit(pool(svm))": lambda c, p: sk.LimitingAdaptor(
        sk.PoolResource(sk.SVMResource(c, p)), 1 << 30
    ),
    "tracking(svm)": lambda c, p: sk.TrackingAdaptor(sk.SVMResource(c, p)),
    "tracking(pool(svm))": lambda c, p: sk.TrackingAdaptor(sk.PoolResource(sk.SVMResource(c, p))),
    "pool(max_cached=64KiB)": lambda c, p: sk.PoolResource(
        sk.SVMResource(c, p), max_cached_bytes=64 << 10
    ),
    "Pool": lambda c, p: sk.Pool(c, p),
}

SIZES = [1, 7, 64, 100, 1000, 4096, 65537, 1 << 20]


@pytest.fixture(params=list(STACKS))
def mr(request: pytest.FixtureRequest, ctx: cl.Context, policy: sk.Policy) -> sk.MemoryResource:
    return STACKS[request.param](ctx, policy)


def _read(ctx: cl.Context, alloc: sk.Allocation) -> np.ndarray:
    out = np.empty(alloc.nbytes, np.uint8)
    q = cl.CommandQueue(ctx)
    cl.enqueue_copy(q, out, cl.SVM(alloc.u8), is_blocking=True)
    return out


def _write(ctx: cl.Context, alloc: sk.Allocation, data: np.ndarray) -> None:
    q = cl.CommandQueue(ctx)
    cl.enqueue_copy(q, cl.SVM(alloc.u8), data, is_blocking=True)


def test_allocation_record(mr: sk.MemoryResource, ctx: cl.Context, policy: sk.Policy) -> None:
    a = mr.allocate(1000)
    assert a.ptr != 0 and a.nbytes == 1000 and a.u8.size == 1000
    assert mr.owns(a) and a.context == ctx and a.policy == policy
    assert mr.serves(ctx, policy) and not a.freed
    a.free()
    assert a.freed


@pytest.mark.parametrize("nbytes", SIZES)
def test_memory_holds_what_the_device_writes(
    mr: sk.MemoryResource, ctx: cl.Context, nbytes: int
) -> None:
    a = mr.allocate(nbytes)
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    _write(ctx, a, data)
    np.testing.assert_array_equal(_read(ctx, a), data)
    a.free()


def test_live_allocations_do_not_overlap(mr: sk.MemoryResource) -> None:
    rng = random.Random(1)
    allocs = [mr.allocate(rng.randint(1, 20000)) for _ in range(60)]
    spans = sorted((a.ptr, a.ptr + a.nbytes) for a in allocs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    for a in allocs:
        a.free()


@pytest.mark.parametrize("alignment", [0, 1, 4, 16, 64, 128])
def test_alignment_is_met(mr: sk.MemoryResource, caps: sk.Capabilities, alignment: int) -> None:
    if alignment > caps.max_alignment:
        pytest.skip(f"{caps.name} supports alignments up to {caps.max_alignment}")
    allocs = [mr.allocate(n, alignment) for n in (1, 3, 100, 5000)]
    for a in allocs:
        assert a.ptr % (alignment or caps.max_alignment) == 0
        a.free()


@pytest.mark.parametrize("alignment", [3, -8, 1 << 20])
def test_bad_alignment_is_invalid_value(mr: sk.MemoryResource, alignment: int) -> None:
    with pytest.raises(sk.InvalidValueError) as info:
        mr.allocate(64, alignment)
    assert info.value.cl_error == "CL_INVALID_VALUE"


def test_size_beyond_device_limit_is_invalid_value(
    mr: sk.MemoryResource, caps: sk.Capabilities
) -> None:
    with pytest.raises(sk.InvalidValueError) as info:
        mr.allocate(caps.max_alloc_bytes + 1)
    assert info.value.cl_error == "CL_INVALID_VALUE"
    with pytest.raises(sk.InvalidValueError):
        mr.allocate(-1)


def test_zero_bytes_allocates_nothing(mr: sk.MemoryResource) -> None:
    a = mr.allocate(0)
    assert a.nbytes == 0 and a.u8.size == 0
    a.free()
    a.free()
    assert a.freed


def test_free_is_idempotent_and_memory_is_reusable(mr: sk.MemoryResource) -> None:
    for _ in range(3):
        allocs = [mr.allocate(n) for n in SIZES]
        for a in allocs:
            a.free()
            a.free()
    assert all(a.freed for a in allocs)


def test_arrays_draw_from_the_resource(mr: sk.MemoryResource, ctx: cl.Context) -> None:
    a = sk.zeros(ctx, (3, 5), np.int32, resource=mr)
    assert mr.owns(a.allocation)
    a.set(np.arange(15, dtype=np.int32).reshape(3, 5))
    np.testing.assert_array_equal(a.get(), np.arange(15).reshape(3, 5))
    with sk.use_resource(mr):
        b = sk.full(ctx, 7, 2.5, policy=mr.policy)
    assert mr.owns(b.allocation)
    np.testing.assert_array_equal(b.get(), np.full(7, 2.5))
    a.free()
    b.free()
    with pytest.raises(sk.UseAfterFreeError):
        a.get()


def test_reused_memory_never_reaches_a_stale_array(mr: sk.MemoryResource, ctx: cl.Context) -> None:
    a = sk.empty(ctx, 16, np.float32, resource=mr)
    a.free()
    b = sk.zeros(ctx, 16, np.float32, resource=mr)
    with pytest.raises(sk.UseAfterFreeError):
        a.get()
    with pytest.raises(sk.UseAfterFreeError):
        a.set(np.ones(16))
    np.testing.assert_array_equal(b.get(), np.zeros(16))
    b.free()


def test_memory_in_use_by_a_pending_command_is_not_handed_out(
    mr: sk.MemoryResource, ctx: cl.Context
) -> None:
    gate = cl.UserEvent(ctx)
    a = mr.allocate(4096)
    a.events.record(gate)
    span = (a.ptr, a.ptr + a.nbytes)
    a.free()
    others = [mr.allocate(4096) for _ in range(4)]
    for b in others:
        assert b.ptr + b.nbytes <= span[0] or b.ptr >= span[1]
    gate.set_status(cl.command_execution_status.COMPLETE)
    for b in others:
        b.free()


def test_upstream_is_kept_alive(ctx: cl.Context, policy: sk.Policy) -> None:
    mr = sk.StatisticsAdaptor(
        sk.PoolResource(sk.LimitingAdaptor(sk.SVMResource(ctx, policy), 1 << 20))
    )
    a = mr.allocate(100)
    assert isinstance(mr.upstream, sk.PoolResource)
    assert isinstance(mr.upstream.upstream, sk.LimitingAdaptor)
    assert mr.upstream.upstream.used_bytes == 128  # the pool's 128-byte class block
    a.free()


def test_concurrent_allocate_free(mr: sk.MemoryResource) -> None:
    errors: list[BaseException] = []
    tags = np.zeros(4, np.int64)

    def worker(t: int) -> None:
        try:
            rng = random.Random(t)
            live: list[sk.Allocation] = []
            for i in range(150):
                if live and rng.random() < 0.5:
                    a = live.pop(rng.randrange(len(live)))
                    if host:  # nobody else wrote our first byte
                        assert a.u8[0] == a.nbytes % 251
                    a.free()
                else:
                    a = mr.allocate(rng.randint(1, 8192))
                    if host:
                        a.u8[0] = a.nbytes % 251
                    live.append(a)
                tags[t] = i
            for a in live:
                a.free()
        except BaseException as exc:
            errors.append(exc)

    host = not mr.policy.needs_map  # coarse memory is not touched outside a map
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert list(tags) == [149] * 4


def test_repr_names_the_stack(mr: sk.MemoryResource) -> None:
    text = repr(mr)
    assert type(mr).__name__ in text
