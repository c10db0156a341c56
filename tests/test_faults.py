"""Fault injection: failing upstreams, exceptions and interrupts at the worst moments.

* An upstream resource that fails on chosen allocations: the pool releases its cache and
  retries once; nothing leaks; a final ``OutOfMemoryError`` carries the figures.
* Exceptions and ``KeyboardInterrupt`` inside ``with mapped(...)`` (also nested, also with
  the array freed inside): the map is released and later commands are allowed.
* ``KeyboardInterrupt`` delivered while ``push_many``/``pop_many`` block: the queue stays
  consistent and no item is lost or duplicated.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import pytest

import svmkit as sk
from svmkit import events
from svmkit.resources.base import Allocation
from svmkit.workqueue import waiting


class FailingUpstream(sk.MemoryResource):
    """Forwards to ``upstream`` but raises OutOfMemoryError on the chosen call numbers
    (1-based), or on every call from ``fail_from`` on; counts live allocations."""

    def __init__(
        self,
        upstream: sk.MemoryResource,
        fail_on: AbstractSet[int] = frozenset(),
        fail_from: int = 0,
    ) -> None:
        self.upstream = upstream
        self.inner = upstream  # typed: the base class's upstream may be None
        self.context = upstream.context
        self.policy = upstream.policy
        self.capabilities = upstream.capabilities
        self.fail_on = set(fail_on)
        self.fail_from = fail_from
        self.calls = 0
        self.faults = 0
        self.live: dict[int, int] = {}

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        self.calls += 1
        if self.calls in self.fail_on or (self.fail_from and self.calls >= self.fail_from):
            self.faults += 1
            raise sk.OutOfMemoryError(
                f"injected failure on allocation {self.calls}",
                nbytes=nbytes,
                cl_error="CL_MEM_OBJECT_ALLOCATION_FAILURE",
            )
        alloc = self.inner.allocate(nbytes, alignment)
        alloc.resource = self
        self.live[alloc.ptr] = nbytes
        return alloc

    def deallocate(self, allocation: Allocation) -> None:
        del self.live[allocation.ptr]
        self.inner.deallocate(allocation)


SIZES = [1000, 3000, 9000, 27000, 81000]  # distinct size classes: no block serves another


@pytest.mark.parametrize("n", range(1, len(SIZES) + 2))
def test_pool_retries_after_releasing_its_cache(ctx, queue, n):
    up = FailingUpstream(sk.SVMResource(ctx), fail_on={n})
    pool = sk.PoolResource(up)
    # Fill the cache: one block per size class, each freed at once (all cached).
    for size in SIZES[: n - 1]:
        sk.empty(ctx, size, np.uint8, resource=pool).free()
    assert pool.info()["cached_bytes"] == pool.info()["upstream_bytes"] == sum(up.live.values())
    # The n-th upstream call fails: the pool returns its cache and retries once.
    a = sk.full(ctx, 250_000, 3, np.uint8, resource=pool)
    assert up.faults == 1 and up.calls == n + 1
    np.testing.assert_array_equal(a.get(queue), np.full(250_000, 3, np.uint8))
    info = pool.info()
    assert info["cached_bytes"] == 0
    assert info["upstream_blocks"] == len(up.live) == 1
    a.free()
    pool.trim()
    queue.finish()
    assert events.drain(10.0)
    assert up.live == {}  # no leak: every upstream allocation went back


def test_out_of_memory_carries_the_figures_and_leaks_nothing(ctx, queue):
    up = FailingUpstream(sk.SVMResource(ctx), fail_from=4)
    pool = sk.PoolResource(up)
    live = [sk.zeros(ctx, n, np.uint8, resource=pool) for n in (1000, 5000)]
    sk.empty(ctx, 20000, np.uint8, resource=pool).free()  # cached
    with pytest.raises(sk.OutOfMemoryError) as info:
        sk.empty(ctx, 300_000, np.uint8, resource=pool)
    err = info.value
    assert err.nbytes == 300_000
    assert err.cl_error == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
    assert err.in_use_bytes == 6000
    assert err.cached_bytes == 0  # the cache went back before the retry
    assert err.fragmented_bytes == pool.info()["fragmented_bytes"] >= 0
    assert up.faults == 2  # the first attempt and the retry
    assert isinstance(err, MemoryError)
    # The pool is still consistent and usable from its cache and its live blocks.
    assert pool.info()["live_allocations"] == 2
    for a in live:
        np.testing.assert_array_equal(a.get(queue), np.zeros(a.size, np.uint8))
        a.free()
    pool.trim()
    assert up.live == {}


# -- mapped ---------------------------------------------------------------------------------


def _released(a: sk.SVMArray) -> bool:
    state = a.allocation.map_state
    return state is None or (not state.maps and state.driver is None)


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_exception_inside_mapped_releases_the_map(queue, policy, exc_type):
    a = sk.zeros(queue.context, 64, np.int32, policy=policy)
    with pytest.raises(exc_type), sk.mapped(queue, a, "rw") as h:
        h[:] = 5
        raise exc_type("injected")
    assert _released(a)
    np.testing.assert_array_equal(a.get(queue), np.full(64, 5, np.int32))
    sk.fill(queue, a, 6)  # a command is allowed again
    np.testing.assert_array_equal(a.get(queue), np.full(64, 6, np.int32))


@pytest.mark.parametrize("exc_type", [ValueError, KeyboardInterrupt])
def test_exception_in_a_nested_map_keeps_the_outer_one(queue, exc_type):
    a = sk.zeros(queue.context, 64, np.uint8, policy=sk.Policy.coarse())
    with sk.mapped(queue, a, "rw") as outer:
        with pytest.raises(exc_type), sk.mapped(queue, a[8:16], "w") as inner:
            inner[:] = 1
            raise exc_type("injected")
        assert np.shares_memory(a.host, outer)  # the outer map still covers the array
        with pytest.raises(sk.MapStateError):
            sk.fill(queue, a, 0)
        outer[:4] = 2
    assert _released(a)
    expected = np.zeros(64, np.uint8)
    expected[8:16] = 1
    expected[:4] = 2
    np.testing.assert_array_equal(a.get(queue), expected)


def test_interrupt_after_freeing_inside_mapped_still_releases_memory(ctx, queue):
    pool = sk.Pool(ctx, sk.Policy.coarse())
    a = pool.zeros(1000, np.uint8)
    with pytest.raises(KeyboardInterrupt), sk.mapped(queue, a, "w") as h:
        h[:] = 1
        a.free()
        raise KeyboardInterrupt
    assert _released(a)
    assert pool.stats()["current_allocations"] == 0
    b = pool.zeros(1000, np.uint8)  # the block is reusable
    np.testing.assert_array_equal(b.get(queue), np.zeros(1000, np.uint8))


# -- work queue -----------------------------------------------------------------------------


@pytest.fixture
def interrupt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """``interrupt(rounds)``: Ctrl-C (a real SIGINT) reaches the main thread while a blocking
    work-queue call waits, at its ``rounds``-th wait.

    Deterministic where a timer is not: the signal is raised from inside the wait itself
    (the queue's backoff), with Python's default handler installed for the test.
    """
    real_backoff = waiting.backoff
    waits = {"count": 0, "at": 0}

    def backoff(ring: Any, for_pop: bool, round_: int, *args: Any, **kwargs: Any) -> None:
        waits["count"] += 1
        if waits["count"] == waits["at"]:
            signal.raise_signal(signal.SIGINT)  # KeyboardInterrupt is raised right here
        real_backoff(ring, for_pop, round_, *args, **kwargs)

    def arm(rounds: int) -> None:
        waits.update(count=0, at=rounds)

    monkeypatch.setattr(waiting, "backoff", backoff)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield arm
    finally:
        signal.signal(signal.SIGINT, previous)
    assert waits["count"] >= waits["at"], "the call never waited as long as the test meant"


@pytest.mark.needs("atomics")
def test_interrupted_push_many_leaves_a_consistent_queue(ctx, interrupt):
    wq = sk.WorkQueue(ctx, 8, np.int64)
    items = np.arange(100, dtype=np.int64)
    interrupt(20)  # the 20th wait: past the spinning, into the sleeping backoff
    with pytest.raises(KeyboardInterrupt) as info:
        wq.push_many(items, timeout=30)  # blocks when full: no consumer
    pushed = getattr(info.value, "pushed", None)
    assert pushed == len(wq) == 8
    got = wq.pop_many(8, timeout=5)
    np.testing.assert_array_equal(got, items[:8])  # the leading items, in order, once
    wq.push_many(items[8:12], timeout=5)  # still usable
    np.testing.assert_array_equal(wq.pop_many(4, timeout=5), items[8:12])
    wq.close()
    with pytest.raises(sk.QueueClosed):
        wq.pop()


@pytest.mark.needs("atomics")
def test_interrupted_pop_many_loses_no_item(ctx, interrupt):
    wq = sk.WorkQueue(ctx, 16, np.int64)
    wq.push_many(np.arange(5, dtype=np.int64))
    interrupt(20)  # the 20th wait: past the spinning, into the sleeping backoff
    with pytest.raises(KeyboardInterrupt) as info:
        wq.pop_many(10, timeout=30)  # gets 5, then blocks on the empty queue
    popped = getattr(info.value, "popped", None)
    assert popped is not None, "the items an interrupted pop_many took are lost"
    rest = wq.pop_many(len(wq), timeout=5) if len(wq) else np.empty(0, np.int64)
    np.testing.assert_array_equal(np.sort(np.concatenate([popped, rest])), np.arange(5))
    wq.push(7)
    assert wq.pop(timeout=5) == 7
    wq.close()


@pytest.mark.needs("atomics")
def test_exception_in_a_consumer_thread_does_not_wedge_the_queue(ctx):
    wq = sk.WorkQueue(ctx, 4, np.int64)
    seen: list[int] = []

    def consumer() -> None:
        try:
            while True:
                item = int(wq.pop(timeout=10))
                if item == 3:
                    raise RuntimeError("consumer failed")
                seen.append(item)
        except (RuntimeError, sk.QueueClosed):
            pass

    t = threading.Thread(target=consumer)
    t.start()
    wq.push_many(np.arange(6, dtype=np.int64), timeout=10)  # 3 kills the consumer
    t.join(10)
    assert not t.is_alive()
    left = wq.pop_many(len(wq), timeout=5)
    assert sorted(seen + [3] + left.tolist()) == list(range(6))
    wq.close()
