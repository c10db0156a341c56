"""Processes started after svmkit was used: fork children refuse the parent's objects.

A child forked from a process that used a context must get
:class:`~svmkit.InvalidContextError` naming the parent process for every use of the
parent's arrays, pools and contexts (never a hang or a crash), must never run the
parent's pending releases, and must be able to create and use a context of its own.
``spawn`` children start clean.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk

CHILD_TIMEOUT_S = 120
DOUBLE = "__kernel void twice(__global float *o, __global const float *i) {\n" + (
    "  size_t k = get_global_id(0); o[k] = 2.0f * i[k]; }"
)


def _in_child(method: str, target: Callable[..., None], *args: Any) -> dict[str, Any]:
    """Run ``target(results, *args)`` in a child started with ``method``; its results."""
    context: Any = mp.get_context(method)
    results = context.Queue()
    child = context.Process(target=target, args=(results, *args))
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the {method} child hung (killed after {CHILD_TIMEOUT_S} s)")
    out: dict[str, Any] = {}
    while True:
        try:
            key, value = results.get(timeout=1)
        except queue_mod.Empty:
            break
        out[key] = value
    assert child.exitcode == 0, (child.exitcode, out)
    return out


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    """``(exception class name, message)`` of ``fn()``, or ``("ok", repr(result))``."""
    try:
        return "ok", repr(fn())
    except Exception as exc:
        return type(exc).__name__, str(exc)


def _pocl_cpu(device: cl.Device) -> bool:
    return "Portable Computing Language" in device.platform.name and bool(
        device.type & cl.device_type.CPU
    )


def _survives_fork(ctx: cl.Context) -> bool:
    """Whether the suite's driver can start again in a forked child (CUDA-based NVIDIA
    OpenCL cannot, nor PoCL's CPU devices, whose worker threads stay in the parent: the
    child gets UnsupportedError instead of a context, or, PYOPENCL_CTX unset, another
    device)."""
    device = ctx.devices[0]
    return "NVIDIA" not in device.platform.name and not _pocl_cpu(device)


def _check_own_context(out: dict[str, Any], ctx: cl.Context) -> bool:
    """The child's create_context: on a driver that cannot start again after fork, the
    clear error (returns False, nothing more to check); after the parent used PoCL's CPU
    device, that error or a context on another device; else a context (True)."""
    if "own_context" not in out:
        assert _survives_fork(ctx) or _pocl_cpu(ctx.devices[0]), "NVIDIA started in a child"
        assert not (_pocl_cpu(ctx.devices[0]) and out["own_pocl_cpu"])  # passed over
        return True
    kind, message = out["own_context"]
    assert kind == "UnsupportedError" and "forked" in message and "spawn" in message, message
    assert not _survives_fork(ctx)
    return False


def _own_context_works(results: Any) -> None:
    """Create a context, build, launch, free through the release thread."""
    try:
        ctx = sk.create_context()
    except sk.UnsupportedError as exc:  # a driver that cannot start again after fork()
        results.put(("own_context", ("UnsupportedError", str(exc))))
        return
    results.put(("own_pocl_cpu", _pocl_cpu(ctx.devices[0])))
    q = cl.CommandQueue(ctx)
    knl = sk.build_program(ctx, DOUBLE).twice
    src = sk.asarray(ctx, np.arange(256, dtype=np.float32))
    dst = sk.empty(ctx, 256, np.float32)
    sk.launch(q, knl, (256,), None, dst, src)
    results.put(("doubled", dst.get(q).tolist()))
    called: list[int] = []
    done = dst.enqueue_free(q, callback=lambda _q, arrays: called.append(len(arrays)))
    done.wait()
    src.free()
    results.put(("own_drain", sk.events.drain(30)))
    results.put(("own_callback", called))
    pool = sk.Pool(ctx)
    for _ in range(3):
        pool.empty(1000, np.float32).free()
    results.put(("own_pool", pool.stats()["upstream_allocations"]))


def test_fork_child_refuses_the_parents_objects_and_makes_its_own(
    ctx: cl.Context, policy: sk.Policy
) -> None:
    q = cl.CommandQueue(ctx)
    pool = sk.Pool(ctx, policy)
    a = pool.empty(1000, np.float32)
    a.set(np.arange(1000, dtype=np.float32), q)
    b = sk.empty(ctx, 8, np.float32, policy=policy)

    def child(results: Any) -> None:
        uses: dict[str, Callable[[], Any]] = {
            "get": lambda: a.get(q),
            "set": lambda: a.set(np.zeros(1000, np.float32), q),
            "fill": lambda: sk.fill(q, a, 1.0),
            "copy": lambda: sk.copy(q, b, a[:8]),
            "free": a.free,
            "enqueue_free": lambda: b.enqueue_free(q),
            "pool.empty": lambda: pool.empty(10, np.float32),
            "pool.trim": pool.trim,
            "pool.stats": pool.stats,
            "sk.empty(parent ctx)": lambda: sk.empty(ctx, 10, policy=policy),
            "Pool(parent ctx)": lambda: sk.Pool(ctx, policy).empty(4),
        }
        for name, use in uses.items():
            results.put((name, _outcome(use)))
        _own_context_works(results)

    out = _in_child("fork", child)
    for name in (
        "get",
        "set",
        "fill",
        "copy",
        "free",
        "enqueue_free",
        "pool.empty",
        "pool.trim",
        "pool.stats",
        "sk.empty(parent ctx)",
        "Pool(parent ctx)",
    ):
        kind, message = out[name]
        assert kind == "InvalidContextError", (name, kind, message)
        assert "belongs to the parent process" in message, (name, message)
    if _check_own_context(out, ctx):
        assert out["doubled"] == (2 * np.arange(256, dtype=np.float32)).tolist()
        assert out["own_drain"] is True
        assert out["own_callback"] == [1]
        assert out["own_pool"] == 1
    # the parent's objects are untouched by the child's attempts
    np.testing.assert_array_equal(a.get(q), np.arange(1000, dtype=np.float32))
    assert not a.freed and not b.freed
    assert pool.stats()["total_allocations"] == 1
    a.free()
    b.free()


def test_fork_child_never_runs_the_parents_pending_release(ctx: cl.Context) -> None:
    q = cl.CommandQueue(ctx)
    gate = cl.UserEvent(ctx)
    a = sk.empty(ctx, 64, np.float32)
    parent_calls: list[int] = []
    a.enqueue_free(q, callback=lambda _q, arrays: parent_calls.append(len(arrays)), wait_for=[gate])

    def child(results: Any) -> None:
        # The parent's release waits on `gate`, which nothing completes here: running it
        # (or waiting for it) would hang; the child's own releases must still run.
        _own_context_works(results)

    try:
        out = _in_child("fork", child)
    finally:
        gate.set_status(cl.command_execution_status.COMPLETE)
    if _check_own_context(out, ctx):
        assert out["own_callback"] == [1], out
        assert out["own_drain"] is True
    assert sk.events.drain(30)
    assert parent_calls == [1]


def test_fork_child_counts_every_context_used_before_the_fork(ctx: cl.Context) -> None:
    """Contexts svmkit used in the parent are the parent's; the child's new one is not."""

    def child(results: Any) -> None:
        from svmkit.driver import fork as _fork

        results.put(("session ctx", ctx in _fork.parent_contexts))
        results.put(("forked", _fork.forked))
        try:
            own = sk.create_context()
        except sk.UnsupportedError as exc:  # a driver that cannot start again after fork()
            results.put(("own_context", ("UnsupportedError", str(exc))))
            return
        results.put(("own_pocl_cpu", _pocl_cpu(own.devices[0])))
        results.put(("own ctx", own in _fork.parent_contexts))
        with sk.empty(own, 4, np.float32) as a:
            a.set(np.arange(4, dtype=np.float32))
            results.put(("own array", a.get().tolist()))

    out = _in_child("fork", child)
    assert out["session ctx"] is True
    assert out["forked"] is True
    if _check_own_context(out, ctx):
        assert out["own ctx"] is False
        assert out["own array"] == [0.0, 1.0, 2.0, 3.0]


_SPAWN_CHILD = """
import numpy as np, pyopencl as cl, svmkit as sk
from svmkit.driver import fork as _fork
ctx = sk.create_context()
q = cl.CommandQueue(ctx)
knl = sk.build_program(ctx, DOUBLE).twice
pool = sk.Pool(ctx)
src = pool.asarray(np.arange(256, dtype=np.float32))
dst = pool.empty(256, np.float32)
sk.launch(q, knl, (256,), None, dst, src)
results.put(("doubled", dst.get(q).tolist()))
results.put(("forked", _fork.forked))
"""


def test_spawn_child_uses_svmkit_normally(ctx: cl.Context) -> None:
    with sk.empty(ctx, 16, np.float32) as kept:
        kept.set(np.ones(16, np.float32))
        context = mp.get_context("spawn")
        results = context.Queue()
        # exec is picklable by reference, so the child needs no importable test module
        child = context.Process(
            target=exec, args=(_SPAWN_CHILD, {"results": results, "DOUBLE": DOUBLE})
        )
        child.start()
        child.join(CHILD_TIMEOUT_S)
        if child.is_alive():
            child.kill()
            pytest.fail("the spawn child hung")
        assert child.exitcode == 0
        out = dict(results.get(timeout=5) for _ in range(2))
        np.testing.assert_array_equal(kept.get(), np.ones(16, np.float32))
    assert out["doubled"] == (2 * np.arange(256, dtype=np.float32)).tolist()
    assert out["forked"] is False


def test_a_driver_that_cannot_start_after_fork_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NVIDIA's CUDA-based OpenCL fails every call in a forked child (clGetPlatformInfo:
    # CL_INVALID_DEVICE, seen on an H200): create_context says why instead of a driver error.
    capabilities_module = sys.modules["svmkit.capabilities"]
    from svmkit.driver import fork as fork_module

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise cl.LogicError(cl._cl._ErrorRecord("clGetPlatformInfo", -33, "INVALID_DEVICE"))

    monkeypatch.setattr(fork_module, "forked", True)
    monkeypatch.setattr(capabilities_module, "_create_context", broken)
    with pytest.raises(sk.UnsupportedError, match="forked after its parent used OpenCL") as info:
        sk.create_context()
    assert "spawn" in str(info.value) and isinstance(info.value.__cause__, cl.Error)
    monkeypatch.setattr(fork_module, "forked", False)
    with pytest.raises(cl.LogicError):  # outside a forked child: the driver's own error
        sk.create_context()


def test_pocl_cpu_used_by_the_parent_is_refused_in_a_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PoCL's CPU devices keep their worker threads in the parent: a child's context on one
    would hang at its first wait, so create_context refuses it, and only it."""
    from types import SimpleNamespace

    capabilities_module = sys.modules["svmkit.capabilities"]
    from svmkit.driver import fork as fork_module

    def fake(platform: str, device: str, kind: int = cl.device_type.CPU) -> Any:
        dev = SimpleNamespace(name=device, type=kind, platform=SimpleNamespace(name=platform))
        return SimpleNamespace(devices=[dev])

    pocl = fake("Portable Computing Language", "pthread-AMD EPYC")
    intel = fake("Intel(R) OpenCL", "AMD EPYC")
    made: list[Any] = [pocl]
    monkeypatch.setattr(capabilities_module, "_create_context", lambda _t: made[0])
    monkeypatch.setattr(fork_module, "forked", True)
    monkeypatch.setattr(fork_module, "parent_used_pocl_cpu", True)
    with pytest.raises(sk.UnsupportedError, match="forked after its parent used PoCL") as info:
        sk.create_context()
    assert "spawn" in str(info.value)
    made[0] = intel  # another driver in the child: fine
    assert sk.create_context() is intel
    monkeypatch.setattr(fork_module, "parent_used_pocl_cpu", False)
    made[0] = pocl  # PoCL first used in the child: fine
    assert sk.create_context() is pocl
    gpu = fake("Portable Computing Language", "cuda-H200", cl.device_type.GPU)
    monkeypatch.setattr(fork_module, "parent_used_pocl_cpu", True)
    made[0] = gpu  # a PoCL GPU device: not a CPU driver's worker threads
    assert sk.create_context() is gpu
    monkeypatch.setattr(fork_module, "forked", False)


def test_a_child_passes_over_the_pocl_cpu_device_its_parent_used() -> None:
    """After the parent used PoCL's CPU device (noted before the fork, so the child asks the
    parent's contexts nothing), a child's create_context takes another device, or says
    why none is left or why the next cannot start in a forked child; a PYOPENCL_CTX that
    selects PoCL's CPU device is refused."""
    from svmkit.capabilities import compiler_failure

    found = [
        (index, device)
        for index, platform in enumerate(cl.get_platforms())
        for device in platform.get_devices()
        if _pocl_cpu(device)
    ]
    usable = [(i, d) for i, d in found if compiler_failure(d) is None]
    if not usable:
        pytest.skip("no PoCL CPU device whose compiler works on this machine")
    index, device = usable[0]
    parent = cl.Context([device])
    with sk.zeros(parent, 4, np.float32) as a:  # svmkit used it here
        assert a.get().tolist() == [0, 0, 0, 0]

        def child(results: Any) -> None:
            from svmkit.driver import fork as _fork

            results.put(("noted", _fork.parent_used_pocl_cpu))
            os.environ.pop("PYOPENCL_CTX", None)
            results.put(("auto", _outcome(lambda: _pocl_cpu(sk.create_context().devices[0]))))
            os.environ["PYOPENCL_CTX"] = str(index)
            results.put(("selected", _outcome(sk.create_context)))

        out = _in_child("fork", child)
    from svmkit.driver import fork as fork_module

    assert fork_module.parent_used_pocl_cpu is False  # the parent itself keeps its device
    assert out["noted"] is True
    kind, value = out["auto"]
    # Another device, or an UnsupportedError: none is left, or the next one's driver cannot
    # start in a forked child (NVIDIA's on the H200 host, beside PoCL's CPU device).
    assert (kind, value) == ("ok", "False") or (
        kind == "UnsupportedError"
        and ("stayed in the parent" in value or "cannot start again" in value)
    ), out["auto"]
    kind, message = out["selected"]
    assert kind == "UnsupportedError" and "forked after its parent used PoCL" in message
