"""Interpreter exit with live pooled arrays, pools and queues exits cleanly (code 0).

Each scenario runs in a fresh interpreter: PyOpenCL 2026.1.4's own SVMPool segfaults here.
"""

from __future__ import annotations

import textwrap

import pytest
from _helpers import assert_quiet_exit, run_python

PRELUDE = """
import numpy as np, pyopencl as cl, svmkit as sk
ctx = sk.create_context()
q = cl.CommandQueue(ctx)
"""

SCENARIOS = {
    "live pooled arrays": """
        pool = sk.Pool(ctx)
        arrays = [pool.zeros(n) for n in (1, 1000, 1 << 20)]
        freed = pool.empty(64); freed.free()
    """,
    "pool selected with use_resource": """
        pool = sk.Pool(ctx)
        cm = sk.use_resource(pool); cm.__enter__()
        a = sk.ones(ctx, 100)
    """,
    "arrays in a reference cycle": """
        pool = sk.Pool(ctx)
        class Holder: pass
        h = Holder(); h.self = h; h.a = pool.ones(10)
        h.pool = pool
        del pool
    """,
    "pending kernel on a pooled array": """
        pool = sk.Pool(ctx)
        prg = sk.build_program(ctx, '''__kernel void k(__global int *p, int n) {
            int i = get_global_id(0); float x = i;
            for (int j = 0; j < n; ++j) x = x * 0.999f + 1.0f;
            p[i] = (int)x; }''')
        a = pool.empty(4096, np.int32)
        a.record(prg.k(q, (4096,), None, a, np.int32(20000)))
        b = pool.empty(4096, np.int32); b.enqueue_free(q)
    """,
    "adaptor stack and a cached pool": """
        mr = sk.TrackingAdaptor(sk.LimitingAdaptor(sk.StatisticsAdaptor(
            sk.PoolResource(sk.SVMResource(ctx), max_cached_bytes=1 << 20)), 1 << 30))
        keep = [sk.empty(ctx, n, resource=mr) for n in (10, 100_000)]
        gone = [sk.empty(ctx, n, resource=mr) for n in (10, 100_000)]
        for g in gone: g.free()
    """,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_exit_is_clean(name: str) -> None:
    code = PRELUDE + textwrap.dedent(SCENARIOS[name]) + "\nprint('reached the end')\n"
    assert_quiet_exit(run_python(code), last_line="reached the end")
