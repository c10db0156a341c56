"""Debug mode: freed pooled blocks are poisoned; writes after free are reported with the
creation stack of the freed allocation."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys

import numpy as np
import pyopencl as cl
import pytest
from _helpers import CHILD_CWD

import svmkit as sk
from svmkit import events
from svmkit.resources import debug

DEADBEEF = np.int32(np.uint32(0xDEADBEEF).view(np.int32))


@pytest.fixture
def debug_on():
    debug.set_debug(True)
    yield
    debug.set_debug(None)


def make_victim(pool: sk.Pool) -> sk.SVMArray:
    return pool.full(64, 1, np.int32)  # the creation site the report must name


def test_off_by_default_pays_nothing(ctx, monkeypatch):
    monkeypatch.delenv("SVMKIT_DEBUG", raising=False)
    pool = sk.Pool(ctx)
    assert pool.resource is pool.pool and pool.debug is None  # no adaptor in the way
    assert type(pool.pool).allocate is sk.PoolResource.allocate  # nothing patched
    monkeypatch.setenv("SVMKIT_DEBUG", "1")
    debugged = sk.Pool(ctx)
    assert isinstance(debugged.resource, sk.DebugAdaptor)
    assert debugged.resource.upstream is debugged.pool and debugged.debug is not None


def raw_int32(ptr: int, n: int) -> np.ndarray:
    """A NumPy view of ``n`` int32 at ``ptr`` that is no export (it keeps nothing alive)."""
    return np.ctypeslib.as_array((ctypes.c_int32 * n).from_address(ptr))


@pytest.mark.needs("fine")
def test_host_sees_poison_after_free_and_a_write_is_reported(ctx, queue, debug_on, caplog):
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = make_victim(pool)
    stale = raw_int32(a.ptr, 64)  # a raw address kept past free: the bug debug mode is for
    a.free()
    assert events.drain(10.0)
    np.testing.assert_array_equal(stale, np.full(64, DEADBEEF))  # recognisable pattern
    stale[5] = 42  # write after free
    assert pool.debug is not None and pool.debug.held() == 1  # quarantined, not reused
    with (
        caplog.at_level(logging.ERROR, logger="svmkit.debug"),
        pytest.raises(sk.UseAfterFreeError) as info,
    ):
        pool.trim()  # the quarantined block's poison is checked
    message = str(info.value)
    assert "use after free detected: 4 of the 256 bytes" in message
    assert "make_victim" in message and "test_debug.py" in message
    assert pool.debug is not None and pool.debug.reports == [message]
    assert "use after free detected" in caplog.text


@pytest.mark.needs("fine")
def test_poison_waits_for_the_last_export(ctx, debug_on):
    pool = sk.Pool(ctx, sk.Policy.fine())
    a = make_victim(pool)
    ptr = a.ptr
    export = a.host  # an export: the memory is really returned only when it goes
    a.free()
    assert events.drain(10.0)
    np.testing.assert_array_equal(raw_int32(ptr, 64), np.ones(64, np.int32))  # not poisoned
    export[5] = 42  # a write through a live export is a write to memory it still holds
    b = pool.empty(64, np.int32)
    assert pool.debug is not None
    assert b.ptr != ptr and pool.debug.reports == []
    del export
    assert events.drain(10.0)
    np.testing.assert_array_equal(raw_int32(ptr, 64), np.full(64, DEADBEEF))  # returned now
    assert pool.debug.held() == 1 and pool.debug.check_quarantine() == []
    c = pool.empty(64, np.int32)  # the block comes back with its poison intact
    assert c.ptr == ptr and pool.debug.reports == []


@pytest.mark.needs("coarse")
def test_kernel_writing_after_free_is_reported(ctx, queue, debug_on):
    pool = sk.Pool(ctx, sk.Policy.coarse())
    prg = sk.build_program(ctx, "__kernel void poke(__global int *p) { p[3] = 7; }")
    a = make_victim(pool)
    a.free()
    assert events.drain(10.0)
    # A raw PyOpenCL launch with the stale pointer (svmkit cannot stop this one).
    cl.Kernel(prg, "poke")(queue, (1,), None, a).wait()
    with pytest.raises(sk.UseAfterFreeError, match="make_victim"):
        pool.trim()


def test_intact_poison_passes_and_a_kernel_reads_the_pattern(ctx, queue, debug_on):
    pool = sk.Pool(ctx)
    prg = sk.build_program(
        ctx, "__kernel void peek(__global int *p, __global int *out) { out[0] = p[7]; }"
    )
    a = make_victim(pool)
    a.free()
    assert events.drain(10.0)
    out = sk.zeros(ctx, 1, np.int32)
    cl.Kernel(prg, "peek")(queue, (1,), None, a, out).wait()  # a stale read sees the poison
    assert out.get(queue)[0] == DEADBEEF
    assert pool.debug is not None and pool.debug.check_quarantine() == []  # poison intact
    b = pool.full(64, 3, np.int32)  # same block, poison intact: no report
    assert pool.debug.reports == []
    np.testing.assert_array_equal(b.get(queue), np.full(64, 3, np.int32))


def test_debug_argument_overrides_the_switch(ctx, monkeypatch):
    monkeypatch.delenv("SVMKIT_DEBUG", raising=False)
    on = sk.Pool(ctx, debug=True)
    assert isinstance(on.resource, sk.DebugAdaptor) and on.debug is not None
    monkeypatch.setenv("SVMKIT_DEBUG", "1")
    off = sk.Pool(ctx, debug=False)
    assert off.resource is off.pool and off.debug is None


def test_quarantine_holds_a_freed_block_back_for_its_hand_outs(ctx):
    pool = sk.Pool(ctx, debug=True)
    a = make_victim(pool)
    ptr = a.ptr
    a.free()
    assert events.drain(10.0)
    assert pool.debug is not None and pool.debug.held() == 1
    kept = [pool.empty(64, np.int32) for _ in range(debug.QUARANTINE)]  # the last releases it
    assert ptr not in [k.ptr for k in kept] and pool.debug.held() == 0
    again = pool.empty(64, np.int32)
    assert again.ptr == ptr and pool.debug.reports == []
    np.testing.assert_array_equal(again.get(), np.full(64, DEADBEEF))  # poison intact


SLOW = """
__kernel void slow_fill(__global float *a, int iters) {
    int i = get_global_id(0);
    float x = 0.0f;
    for (int k = 0; k < iters; ++k) x = x * 0.999f + 7.0f;
    a[i] = x;
}
"""


# The host poisons fine-grain memory at once; coarse-grain memory is poisoned by a copy on
# svmkit's own queue, which a device may run after an untracked kernel's late writes (seen on
# NVIDIA's OpenCL), so a late write is caught every time only in memory the host poisons.
@pytest.mark.needs("fine")
def test_an_untracked_kernel_writing_into_a_freed_block_is_reported_every_time(ctx, queue):
    pool = sk.Pool(ctx, policy=sk.Policy.fine(), debug=True)
    knl = cl.Kernel(sk.build_program(ctx, SLOW), "slow_fill")  # raw: svmkit cannot see it
    n = 1 << 14
    for _ in range(3):
        a = pool.empty(n, np.float32)
        knl(queue, (n,), None, a, np.int32(20000))  # no wait, no sk.record
        a.free()
        b = pool.zeros(n, np.float32)  # not a's block: it is quarantined
        queue.finish()
        assert float(b.get().sum()) == 0.0
        with pytest.raises(sk.UseAfterFreeError) as info:
            pool.trim()
        message = str(info.value)
        assert f"of the {4 * n} bytes freed" in message
        assert "and freed at:" in message and "a.free()" in message  # the freeing stack
        b.free()
    assert pool.debug is not None and len(pool.debug.reports) == 3


@pytest.mark.needs("fine")
def test_a_late_write_is_reported_at_exit():
    code = (
        "import numpy as np, pyopencl as cl, svmkit as sk\n"
        "ctx = sk.create_context(); queue = cl.CommandQueue(ctx)\n"
        "pool = sk.Pool(ctx, policy=sk.Policy.fine(), debug=True)\n"
        f"knl = cl.Kernel(sk.build_program(ctx, {SLOW!r}), 'slow_fill')\n"
        "a = pool.empty(4096, np.float32)\n"
        "knl(queue, (4096,), None, a, np.int32(200000))\n"
        "a.free()\n"
        "queue.finish()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=CHILD_CWD
    )
    assert proc.returncode == 0, proc.stderr
    report = proc.stderr[proc.stderr.index("use after free detected: ") :]
    assert "of the 16384 bytes freed" in report
    freed_at = report[report.index("and freed at:") :]
    assert 'File "<string>", line 7, in <module>' in freed_at  # the line of a.free()


def test_environment_switch_in_a_fresh_interpreter():
    code = (
        "import numpy as np, svmkit as sk\n"
        "pool = sk.Pool(sk.create_context())\n"
        "a = pool.full(16, 1, np.int32); a.free()\n"
        "from svmkit import events; events.drain(10)\n"
        "print(hasattr(pool, 'debug'), pool.full(16, 2, np.int32).get().tolist())\n"
    )
    env = {"SVMKIT_DEBUG": "1", "POCL_DEVICES": "pthread pthread"}
    import os

    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=CHILD_CWD,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "True",
        "[2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2,",
        "2]",
    ]


def test_debug_switch_is_exported_at_top_level() -> None:
    import svmkit as sk
    import svmkit.resources.debug as debug_module

    assert sk.set_debug is debug_module.set_debug
    assert sk.debug_enabled is debug_module.debug_enabled
    assert sk.DebugAdaptor is debug_module.DebugAdaptor


def test_out_of_memory_releases_the_quarantine_first(ctx):
    # The quarantine holds freed blocks above the pool; under a limit the pool cannot reach
    # them, so the adaptor checks and returns them before it says out of memory.
    limited = sk.LimitingAdaptor(sk.SVMResource(ctx), limit_bytes=(2 << 20) + (1 << 19))
    debug = sk.DebugAdaptor(sk.PoolResource(limited))
    for _ in range(2):
        debug.allocate(1 << 20).free()  # each block quarantined, none back in the pool
    assert debug.poisoner.held() == 2
    third = debug.allocate(1 << 20)  # over the limit unless the quarantine goes back
    assert debug.poisoner.held() == 0 and debug.reports == []
    assert limited.used_bytes <= limited.limit_bytes
    third.free()
    with pytest.raises(sk.OutOfMemoryError):  # nothing held back: a real limit stays one
        debug.allocate(4 << 20)
