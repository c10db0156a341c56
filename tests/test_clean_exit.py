"""Interpreter exit in every awkward state svmkit can be left in: exit code 0, no noise.

Each scenario runs in a fresh interpreter and leaves something live at exit: arrays of
every granularity, pooled arrays, an open (never exited) map, an exit from inside a
``mapped`` block, a kernel still running, pending ``enqueue_free`` callbacks, a work
queue whose consumer kernel is still blocked in ``wq_pop`` (svmkit closes it at exit), a
host thread blocked in ``pop``.  The child prints ``reached-exit`` as its last act; the
test requires that line, exit status 0 and no traceback or "Exception ignored" on stderr.

The default run does each scenario once; ``-m stress`` repeats every one 20 times.
"""

from __future__ import annotations

import subprocess
import textwrap
from typing import Any

import pytest
from _helpers import assert_quiet_exit, run_python

RUNS_STRESS = 20
TIMEOUT_S = 60

PRELUDE = """
import os, sys, threading
import numpy as np, pyopencl as cl, svmkit as sk
ctx = sk.create_context()
caps = sk.capabilities(ctx)
q = cl.CommandQueue(ctx)
POLICIES = [sk.Policy.coarse()] if caps.coarse_grain_buffer else []
if caps.fine_grain_buffer:
    POLICIES.append(sk.Policy.fine())
if caps.atomics and caps.fine_grain_buffer:
    POLICIES.append(sk.Policy.fine(atomics=True))
if caps.fine_grain_system:
    POLICIES.append(sk.Policy.system())
SLOW = sk.build_program(ctx, '''
__kernel void slow(__global float *p, int n) {
    int i = get_global_id(0); float x = i;
    for (int j = 0; j < n; ++j) x = x * 0.999f + 1.0f;
    p[i] = x;
}''').slow
"""

SCENARIOS: dict[str, tuple[str, str | None]] = {
    "live arrays and views of every granularity": (
        """
        keep = []
        for pol in POLICIES:
            a = sk.full(ctx, 1000, 3.0, np.float32, policy=pol)
            keep += [a, a[10:20], a[::3], sk.zeros(ctx, (7, 5), np.int8, policy=pol)]
        """,
        None,
    ),
    "pooled arrays of every granularity, some freed": (
        """
        pools = [sk.Pool(ctx, pol) for pol in POLICIES]
        keep = [p.zeros(n) for p in pools for n in (1, 300, 1 << 16)]
        for p in pools:
            p.empty(64).free()
        """,
        None,
    ),
    "an open map that is never exited": (
        """
        a = sk.zeros(ctx, 4096, np.uint8, policy=POLICIES[0])
        m = sk.mapped(q, a, "rw"); h = m.__enter__(); h[:] = 7
        m2 = sk.mapped(q, a[100:200], "r"); m2.__enter__()
        """,
        None,
    ),
    "sys.exit inside a mapped block, array freed inside it": (
        """
        a = sk.zeros(ctx, 4096, np.uint8, policy=POLICIES[0])
        with sk.mapped(q, a, "w") as h:
            h[:] = 1
            a.free()
            print("reached-exit", flush=True)
            sys.exit(0)
        """,
        None,
    ),
    "a kernel still running, its array freed, callbacks pending": (
        """
        a = sk.empty(ctx, 4096, np.float32)
        sk.launch(q, SLOW, (4096,), None, a, np.int32(200000))
        a.free()
        b = sk.empty(ctx, 4096, np.float32)
        sk.launch(q, SLOW, (4096,), None, b, np.int32(200000))
        b.enqueue_free(q, lambda queue, arrays: None)
        """,
        None,
    ),
    "a pooled array under a running kernel": (
        """
        pool = sk.Pool(ctx)
        a = pool.empty(4096, np.float32)
        sk.launch(q, SLOW, (4096,), None, a, np.int32(200000))
        a.enqueue_free(q)
        c = pool.empty(4096, np.float32)
        sk.launch(q, SLOW, (4096,), None, c, np.int32(200000))
        """,
        None,
    ),
    "a work queue whose consumer kernel is still blocked in wq_pop": (
        """
        wq = sk.WorkQueue(ctx, 64, np.int64)
        prg = sk.build_program(ctx, '''
        #include "svmkit_workqueue.h"
        __kernel void consume(__global svmkit_wq *q, __global long *sums) {
            WQ_ITEM item;
            long s = 0;
            while (wq_pop(q, &item)) s += (long)item;
            sums[get_global_id(0)] = s;
        }''')
        gs, ls = sk.persistent_grid(q, host_threads=1)
        sums = sk.zeros(ctx, gs[0], np.int64, policy=sk.Policy.fine())
        sk.launch(q, prg.consume, gs, ls, wq, sums)
        wq.push_many(np.arange(100, dtype=np.int64))
        """,
        "atomics",
    ),
    "exports of freed arrays alive at exit (views, DLPack, PyOpenCL arrays)": (
        """
        import pyopencl.array as cla
        pool = sk.Pool(ctx)
        keep = []
        for pol in POLICIES:
            a = sk.full(ctx, 1000, 2.0, np.float32, policy=pol)
            keep.append(a.to_cl_array(q) + 1)
            keep.append(a.to_cl_array(q))
            if not pol.needs_map:
                keep += [a.host, np.asarray(a)[::2], np.from_dlpack(a), a.__dlpack__()]
            a.free()
        b = pool.full(4096, 1.0, np.float32)
        keep.append(b.to_cl_array(q))
        sk.launch(q, SLOW, (4096,), None, b, np.int32(200000))
        b.free()
        alloc = sk.cl_allocator(q)
        x = cla.zeros(q, 4096, np.float32, allocator=alloc)
        keep.append(2 * x + 1)
        cycle = [keep]
        cycle.append(cycle)
        """,
        None,
    ),
    "cl_allocator blocks dropped behind a running kernel, in open and closed epochs": (
        """
        import pyopencl.array as cla
        pool = sk.Pool(ctx)
        b = pool.full(4096, 1.0, np.float32)
        sk.launch(q, SLOW, (4096,), None, b, np.int32(200000))
        alloc = sk.cl_allocator(q)
        x = cla.zeros(q, 4096, np.float32, allocator=alloc)
        for _ in range(45):
            x = 2 * x + 1
        """,
        None,
    ),
    "a host thread blocked in pop, another in push": (
        """
        wq = sk.WorkQueue(ctx, 2, np.int64)
        def popper():
            try:
                wq.pop()
            except sk.QueueClosed:
                pass
        def pusher():
            try:
                wq.push_many(np.arange(10, dtype=np.int64))
            except sk.QueueClosed:
                pass
        t = threading.Thread(target=popper, daemon=True); t.start()
        u = threading.Thread(target=pusher, daemon=True); u.start()
        """,
        "atomics",
    ),
}


def run_scenario(body: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(body) + '\nprint("reached-exit", flush=True)\n'
    return run_python(script, timeout=TIMEOUT_S)


def test_export_scenario_uses_exports_of_every_kind() -> None:
    body = SCENARIOS["exports of freed arrays alive at exit (views, DLPack, PyOpenCL arrays)"][0]
    for made in ("a.host", "np.from_dlpack(a)", "a.__dlpack__()", "to_cl_array", "cl_allocator"):
        assert made in body


def check_clean(proc: subprocess.CompletedProcess[str]) -> None:
    assert_quiet_exit(proc, last_line="reached-exit")


def _params() -> list[Any]:
    """One parameter per scenario, marked with the capabilities it needs."""
    return [
        pytest.param(name, marks=[pytest.mark.needs(need)] if need else [], id=name)
        for name, (_, need) in SCENARIOS.items()
    ]


@pytest.mark.parametrize("name", _params())
def test_exit_is_clean(name: str) -> None:
    check_clean(run_scenario(SCENARIOS[name][0]))


@pytest.mark.stress
@pytest.mark.parametrize("name", _params())
def test_exit_is_clean_every_time(name: str) -> None:
    body = SCENARIOS[name][0]
    for run in range(RUNS_STRESS):
        proc = run_scenario(body)
        try:
            check_clean(proc)
        except AssertionError as exc:
            raise AssertionError(f"run {run + 1} of {RUNS_STRESS}: {exc}") from None
