"""Long stress runs with exact accounting (``pytest -m stress tests/test_stress.py``).

* Pool: 8 threads x 100,000 operations (allocate, stamp, verify, free) on one pool; every
  array's contents are checked before it is freed, and at the end the pool's figures must
  balance exactly (nothing live, every block cached, all returned by ``trim``).
* Work queue: 10,000,000 items pushed by 4 host threads, popped by a persistent device
  kernel that counts every item it sees; each item must be seen exactly once.

Figures can be scaled down with ``SVMKIT_STRESS_SCALE`` (e.g. 0.01 for a smoke run).
"""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest
from _helpers import run_threads

import svmkit as sk

SCALE = float(os.environ.get("SVMKIT_STRESS_SCALE", "1"))
POOL_THREADS = 8
POOL_OPS = int(100_000 * SCALE)
WQ_ITEMS = int(10_000_000 * SCALE)
WQ_PRODUCERS = 4
SIZES = [8, 24, 64, 100, 256, 1000, 4096, 10_000]


@pytest.mark.stress
def test_pool_threads_exact_accounting(ctx, caps):
    policy = sk.Policy.fine() if caps.fine_grain_buffer else sk.Policy.coarse()
    pool = sk.Pool(ctx, policy)
    errors: list[str] = []
    counts = [0] * POOL_THREADS

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        held: list[tuple[sk.SVMArray, int]] = []
        for op in range(POOL_OPS):
            if len(held) < 16 and (not held or rng.random() < 0.55):
                n = rng.choice(SIZES)
                stamp = (tid << 24) | (op & 0xFFFFFF)
                a = pool.empty(n // 4 or 1, np.int32)
                if policy.needs_map:
                    a.set(stamp)
                else:
                    a.host[:] = stamp
                held.append((a, stamp))
                counts[tid] += 1
            else:
                a, stamp = held.pop(rng.randrange(len(held)))
                got = a.get() if policy.needs_map else a.host
                if not (got == stamp).all():
                    errors.append(f"thread {tid} op {op}: block overwritten")
                a.free()
        for a, stamp in held:
            got = a.get() if policy.needs_map else a.host
            if not (got == stamp).all():
                errors.append(f"thread {tid}: block overwritten at the end")
            a.free()

    start = time.perf_counter()
    run_threads(worker, POOL_THREADS, timeout=3600)
    elapsed = time.perf_counter() - start
    assert errors == []
    stats = pool.stats()  # exact when read: no drain() first
    assert stats["total_allocations"] == sum(counts)
    assert stats["current_allocations"] == 0 and stats["current_bytes"] == 0
    assert stats["live_allocations"] == 0 and stats["in_use_bytes"] == 0
    assert stats["cached_bytes"] == stats["upstream_bytes"]
    assert pool.trim() == stats["upstream_bytes"]
    assert pool.stats()["upstream_bytes"] == 0
    print(
        f"\npool stress: {POOL_THREADS} threads x {POOL_OPS} ops, {sum(counts)} allocations, "
        f"{stats['upstream_allocations']} upstream blocks, {elapsed:.1f} s"
    )


CONSUMER = """
#include "svmkit_workqueue.h"
__kernel void consume(__global svmkit_wq *q, __global int *seen, __global long *count)
{
    WQ_ITEM item;
    long n = 0;
    while (wq_pop(q, &item)) {
        atomic_inc(&seen[item]);
        n++;
    }
    count[get_global_id(0)] = n;
}
"""


@pytest.mark.stress
@pytest.mark.needs("atomics")
def test_work_queue_items_exactly_once(ctx, queue):
    wq = sk.WorkQueue(ctx, 1 << 16, np.int64)
    prg = sk.build_program(ctx, CONSUMER)
    gs, ls = sk.persistent_grid(queue, host_threads=WQ_PRODUCERS)
    seen = sk.zeros(ctx, WQ_ITEMS, np.int32, policy=sk.Policy.fine(atomics=True))
    count = sk.zeros(ctx, gs[0], np.int64, policy=sk.Policy.fine(atomics=True))
    start = time.perf_counter()
    done = sk.launch(queue, prg.consume, gs, ls, wq, seen, count)
    share = WQ_ITEMS // WQ_PRODUCERS

    def producer(p: int) -> None:
        lo = p * share
        hi = WQ_ITEMS if p == WQ_PRODUCERS - 1 else lo + share
        for chunk in range(lo, hi, 100_000):
            wq.push_many(np.arange(chunk, min(chunk + 100_000, hi), dtype=np.int64))

    try:
        run_threads(producer, WQ_PRODUCERS, timeout=3600)
    finally:  # the consumer kernel ends once the queue is closed and drained
        wq.close()
        done.wait()
    elapsed = time.perf_counter() - start
    assert int(count.host.sum()) == WQ_ITEMS
    hist = np.bincount(seen.host, minlength=2)
    assert hist[1] == WQ_ITEMS and hist.sum() == WQ_ITEMS  # every item exactly once
    assert len(wq) == 0
    print(
        f"\nwork queue stress: {WQ_ITEMS} items, {WQ_PRODUCERS} host producers, "
        f"{gs[0]} device consumers, {elapsed:.1f} s ({WQ_ITEMS / elapsed / 1e6:.2f} M items/s)"
    )
