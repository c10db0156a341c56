"""Interop costs: DLPack, NumPy arithmetic on SVM arrays, PyOpenCL allocator and arrays.

Every row is a median over batches measured in one run, beside its reference (the
PyOpenCL rows interleave svmkit's batches with the reference's, so a machine's load
changing during the run hits both alike):

* ``np.from_dlpack(a)`` and ``a.__dlpack__()`` per call (FINE/SYSTEM arrays) vs the same
  calls on a NumPy array;
* ``a + 1`` and ``a.sum()`` at 64 B and 64 MiB on SVM arrays from the default (pooled)
  resource vs the same NumPy calls on ``a.host`` (goals: 64 B within +3 µs of NumPy;
  64 MiB at least 95 % of NumPy's throughput);
* ``pool.empty(8)`` + ``free()`` of never-exported arrays (export bookkeeping must not
  slow it);
* ``sk.cl_allocator(queue)(4096)`` (and dropping the block) vs PyOpenCL's ``SVMPool``
  allocation (goal: within 2x), and ``pyopencl.array.empty(..., allocator=...)`` end to end;
* ``2*x+1`` and ``pyopencl.array.sum(x)`` at 64 B and 64 MiB on svmkit pool memory
  (``to_cl_array`` of a pooled array, temporaries from ``sk.cl_allocator``) vs PyOpenCL's
  ``SVMPool`` (goal: within 3 %), and CuPy and PyTorch where they import with a GPU.

Coarse-grain-only devices (NVIDIA) skip the host rows (NumPy and DLPack need fine-grain
or system SVM) and run the PyOpenCL, CuPy and PyTorch rows.

Usage: ``python benchmarks/interop.py [--quick] [--write]``; prints the table and, with
``--write``, replaces its section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("POCL_DEVICES", "pthread pthread")

import _common  # benchmarks/_common.py
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.tools as clt

import svmkit as sk

SMALL, LARGE = 64, 64 << 20


def progress(msg: str) -> None:
    _common.progress("interop", msg)


def per_call_us(fn: Callable[[], Any], budget_s: float, batches: int = 7) -> float:
    """Median over ``batches`` of the µs one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    n = max(1, min(200_000, int(budget_s / batches / once)))
    times = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        times.append((time.perf_counter_ns() - t0) / n / 1e3)
    return statistics.median(times)


def paired_us(
    ours: Callable[[], Any], ref: Callable[[], Any], budget_s: float, batches: int = 21
) -> tuple[float, float]:
    """Medians over ``batches`` of the µs one call of ``ours`` and of ``ref`` take, their
    batches interleaved (so a machine's load changing during the run hits both alike),
    each side first in every other pair."""
    calls = []
    for fn in (ours, ref):
        t0 = time.perf_counter()
        fn()
        calls.append(max(time.perf_counter() - t0, 1e-7))
    n = max(1, min(200_000, int(budget_s / batches / max(calls))))
    times: tuple[list[float], list[float]] = ([], [])
    pairs = ((ours, times[0]), (ref, times[1]))
    for i in range(batches):  # (each side first in every other pair)
        for fn, out in pairs if i % 2 == 0 else pairs[::-1]:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            out.append((time.perf_counter_ns() - t0) / n / 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def gbs(nbytes: int, us: float) -> float:
    return nbytes / (us * 1e-6) / 1e9


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []

    def add(self, what: str, svmkit: str, reference: str, ratio: str, goal: str = "") -> None:
        self.rows.append((what, svmkit, reference, ratio, goal))
        progress(f"{what}: {svmkit} vs {reference} ({ratio}) {goal}")

    def render(self, notes: list[str], cmd: str) -> str:
        out = [
            "| what | svmkit | reference | ratio | goal |",
            "|---|---|---|---|---|",
            *(f"| {' | '.join(r)} |" for r in self.rows),
            "",
            *(f"{n}  " for n in notes),
            f"Command: `{cmd}`; medians of batches measured in this one run.",
            "",
        ]
        return "\n".join(out)


def host_rows(ctx: cl.Context, table: Table, budget: float) -> None:
    """DLPack and NumPy arithmetic on FINE/SYSTEM arrays from the default pooled resource."""
    policy = sk.Policy.best(ctx)
    n_dl = np.zeros(8)
    a_dl = sk.zeros(ctx, 8, policy=policy)
    ours = per_call_us(lambda: np.from_dlpack(a_dl), budget)
    ref = per_call_us(lambda: np.from_dlpack(n_dl), budget)
    table.add(
        "`np.from_dlpack(a)` per call",
        f"{ours:.2f} µs",
        f"{ref:.2f} µs (NumPy array)",
        f"+{ours - ref:.2f} µs",
    )
    ours = per_call_us(lambda: a_dl.__dlpack__(), budget)
    ref = per_call_us(lambda: n_dl.__dlpack__(), budget)
    table.add(
        "`a.__dlpack__()` per call",
        f"{ours:.2f} µs",
        f"{ref:.2f} µs (NumPy array)",
        f"+{ours - ref:.2f} µs",
    )
    for nbytes in (SMALL, LARGE):
        a = sk.zeros(ctx, nbytes // 8, policy=policy)
        h = a.host
        label = "64 B" if nbytes == SMALL else "64 MiB"
        b = budget if nbytes == SMALL else budget * 2
        for name, ours_fn, ref_fn in (
            ("`a + 1`", lambda a=a: a + 1, lambda h=h: h + 1),
            ("`a.sum()`", lambda a=a: a.sum(), lambda h=h: h.sum()),
        ):
            gc.collect()
            ours = per_call_us(ours_fn, b)
            ref = per_call_us(ref_fn, b)
            if nbytes == SMALL:
                ok = "met" if ours - ref <= 3.0 else "missed"
                table.add(
                    f"{name}, {label}",
                    f"{ours:.2f} µs",
                    f"{ref:.2f} µs (NumPy on a.host)",
                    f"+{ours - ref:.2f} µs",
                    f"<= +3 µs: {ok}",
                )
            else:
                share = ref / ours
                ok = "met" if share >= 0.95 else "missed"
                table.add(
                    f"{name}, {label}",
                    f"{gbs(nbytes, ours):.2f} GB/s",
                    f"{gbs(nbytes, ref):.2f} GB/s (NumPy on a.host)",
                    f"{share:.0%}",
                    f">= 95 %: {ok}",
                )
        del h
        a.free()
    pool = sk.Pool(ctx, policy)

    def empty_free() -> None:
        pool.empty(8).free()

    ours = per_call_us(empty_free, budget)
    table.add(
        "`pool.empty(8)` + `free()`, never exported",
        f"{ours:.2f} µs",
        "compare `benchmarks/pools.py` before exports",
        "",
        "export bookkeeping <= +0.2 µs",
    )


def comparable_policy(ctx: cl.Context, queue: cl.CommandQueue) -> sk.Policy:
    """``Policy.best(ctx, system=False)``, or COARSE where PyOpenCL's ``SVMPool`` returns
    NULL blocks for it (fine-grain on Intel's CPU runtime: its arrays then crash), so both
    sides allocate the same kind of memory."""
    policy = sk.Policy.best(ctx, system=False)
    probe = clt.SVMPool(clt.SVMAllocator(ctx, policy.flags, queue=queue))
    if probe(64).svm_ptr == 0:
        progress(f"PyOpenCL's SVMPool returns NULL for {policy}: comparing COARSE memory")
        return sk.Policy.coarse()
    return policy


def allocator_rows(ctx: cl.Context, queue: cl.CommandQueue, table: Table, budget: float) -> None:
    policy = comparable_policy(ctx, queue)
    pool = sk.Pool(ctx, policy)
    ours_alloc = sk.cl_allocator(queue, pool)
    svm_pool = clt.SVMPool(clt.SVMAllocator(ctx, policy.flags, queue=queue))
    unpooled = clt.SVMAllocator(ctx, policy.flags, queue=queue)

    def ours_call() -> None:
        ours_alloc(4096)

    def ref_call() -> None:
        svm_pool(4096)

    ours, ref = paired_us(ours_call, ref_call, budget)
    ok = "met" if ref / ours >= 0.5 else "missed"
    table.add(
        f"allocator call, 4 KiB (and drop), {policy}",
        f"{ours:.2f} µs",
        f"{ref:.2f} µs (PyOpenCL `SVMPool`)",
        f"{ref / ours:.2f}x",
        f"within 2x (>= 0.5x): {ok}",
    )
    bare = per_call_us(lambda: pool.allocate(4096).free(), budget)
    added = ours - bare
    table.add(
        f"allocator call over the bare pooled allocation, 4 KiB, {policy}",
        f"+{added:.2f} µs",
        f"{bare:.2f} µs (`pool.allocate` + `free`)",
        "",
        f"<= +1 µs (NVIDIA): {'met' if added <= 1.0 else 'missed'}",
    )
    raw = per_call_us(lambda: unpooled(4096), budget)
    table.add(
        f"allocator call vs PyOpenCL's unpooled `SVMAllocator`, 4 KiB, {policy}",
        f"{ours:.2f} µs",
        f"{raw:.2f} µs (`SVMAllocator`)",
        f"{raw / ours:.1f}x",
        f">= 100x (NVIDIA): {'met' if raw / ours >= 100 else 'missed'}",
    )
    ours, ref = paired_us(
        lambda: cla.empty(queue, 1024, np.float32, allocator=ours_alloc),
        lambda: cla.empty(queue, 1024, np.float32, allocator=svm_pool),
        budget,
    )
    table.add(
        f"`cla.empty(queue, 1024, float32, allocator=...)`, {policy}",
        f"{ours:.2f} µs",
        f"{ref:.2f} µs (PyOpenCL `SVMPool`)",
        f"{ref / ours:.2f}x",
        "(report)",
    )
    queue.finish()


def device_rows(ctx: cl.Context, queue: cl.CommandQueue, table: Table, budget: float) -> None:
    """2*x+1 and pyopencl.array.sum on pool memory vs SVMPool, CuPy, PyTorch."""
    policy = comparable_policy(ctx, queue)
    pool = sk.Pool(ctx, policy)
    ours_alloc = sk.cl_allocator(queue, pool)
    svm_pool = clt.SVMPool(clt.SVMAllocator(ctx, policy.flags, queue=queue))
    others = _gpu_libraries()
    for nbytes in (SMALL, LARGE):
        n = nbytes // 4
        label = "64 B" if nbytes == SMALL else "64 MiB"
        b = budget if nbytes == SMALL else budget * 2
        x_ours = pool.zeros(n, np.float32)
        xc = x_ours.to_cl_array(queue).with_queue(queue)
        xc.allocator = ours_alloc
        x_ref = cla.empty(queue, n, np.float32, allocator=svm_pool)
        x_ref.fill(0)
        for name, ours_fn, ref_fn in (
            ("`2*x+1`", lambda xc=xc: 2 * xc + 1, lambda x=x_ref: 2 * x + 1),
            ("`cla.sum(x)`", lambda xc=xc: cla.sum(xc), lambda x=x_ref: cla.sum(x)),
        ):

            def timed(fn: Callable[[], Any]) -> Callable[[], None]:
                def run() -> None:
                    fn()
                    queue.finish()

                return run

            ours, ref = paired_us(timed(ours_fn), timed(ref_fn), b)
            table.add(
                f"{name} via pyopencl.array, {label}, {policy}",
                f"{ours:.1f} µs",
                f"{ref:.1f} µs (PyOpenCL `SVMPool`)",
                f"{ref / ours:.2f}x",
                f">= 0.97x: {'met' if ref / ours >= 0.97 else 'missed'}",
            )
            for lib, (make, sync) in others.items():
                y = make(n)
                fn = (lambda y=y: 2 * y + 1) if "2*x" in name else (lambda y=y: y.sum())

                def run(fn: Callable[[], Any] = fn, sync: Callable[[], None] = sync) -> None:
                    fn()
                    sync()

                t = per_call_us(run, b)
                table.add(
                    f"{name}, {label}: {lib}",
                    f"{ours:.1f} µs (svmkit)",
                    f"{t:.1f} µs",
                    f"{t / ours:.2f}x",
                )
        del xc
        x_ours.free()
        queue.finish()


def _gpu_libraries() -> dict[str, tuple[Callable[[int], Any], Callable[[], None]]]:
    out: dict[str, tuple[Callable[[int], Any], Callable[[], None]]] = {}
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            out["CuPy"] = (
                lambda n: cupy.zeros(n, cupy.float32),
                lambda: cupy.cuda.Stream.null.synchronize(),
            )
    except Exception:  # not installed, or no GPU: the row is left out
        pass
    try:
        import torch

        if torch.cuda.is_available():
            out["PyTorch"] = (
                lambda n: torch.zeros(n, dtype=torch.float32, device="cuda"),
                torch.cuda.synchronize,
            )
    except Exception:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short measurements (a smoke run)")
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    budget = 0.05 if args.quick else 0.6
    ctx = sk.create_context()
    queue = cl.CommandQueue(ctx)
    caps = sk.capabilities(ctx)
    table = Table()
    if caps.fine_grain_buffer or caps.fine_grain_system:
        host_rows(ctx, table, budget)
    else:
        progress("coarse-grain only: no NumPy or DLPack rows (they need host memory)")
    allocator_rows(ctx, queue, table, budget)
    device_rows(ctx, queue, table, budget)
    section, suffix = _common.section_name("interop", ctx)
    cmd = "python benchmarks/interop.py" + (" --quick" if args.quick else "")
    text = table.render(_common.machine_notes(ctx), cmd)
    print(text)
    if args.write:
        path = _common.write_section(section, f"Interop{suffix} (`benchmarks/interop.py`)", text)
        progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
