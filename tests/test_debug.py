"""Debug mode: freed pooled blocks are poisoned; writes after free are reported with the
creation stack of the freed allocation."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import sys

import numpy as np
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
    with (
        caplog.at_level(logging.ERROR, logger="svmkit.debug"),
        pytest.raises(sk.UseAfterFreeError) as info,
    ):
        pool.empty(64, np.int32)  # the same block comes back: the poison is checked
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
    prg.poke(queue, (1,), None, a).wait()
    with pytest.raises(sk.UseAfterFreeError, match="make_victim"):
        pool.empty(64, np.int32)


def test_intact_poison_passes_and_a_kernel_reads_the_pattern(ctx, queue, debug_on):
    pool = sk.Pool(ctx)
    prg = sk.build_program(
        ctx, "__kernel void peek(__global int *p, __global int *out) { out[0] = p[7]; }"
    )
    a = make_victim(pool)
    a.free()
    assert events.drain(10.0)
    out = sk.zeros(ctx, 1, np.int32)
    prg.peek(queue, (1,), None, a, out).wait()  # a stale read sees the poison
    assert out.get(queue)[0] == DEADBEEF
    b = pool.full(64, 3, np.int32)  # same block, poison intact: no report
    assert pool.debug is not None and pool.debug.reports == []
    np.testing.assert_array_equal(b.get(queue), np.full(64, 3, np.int32))


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
