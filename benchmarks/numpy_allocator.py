"""NumPy inside ``sk.numpy_allocator()`` against NumPy's default data-memory handler.

Every row is a pair of medians over batches measured in one run, the allocator's batches
interleaved with the reference's (each side first in every other pair), so a machine's load
changing during the run hits both alike.  The allocator side runs each batch inside
``with sk.numpy_allocator():`` (the default: the current resource of
``sk.default_context()`` for its best host policy, a pool), the reference outside it:

* ``np.empty(n, np.uint8)`` at 64 B, 4 KiB and 1 MiB, the array dropped at once (an
  allocation and a free; goal: within +0.3 µs of NumPy's default handler);
* ``np.empty`` of 64 MiB and its first write (``a.fill(1)``): glibc serves such sizes by a
  fresh ``mmap`` whose pages fault in at the first write; a pool keeps its pages (goal:
  at least 2x faster);
* ``y = 2 * x + 1`` and ``(x - x.mean()) / x.std()`` on 64 MiB of float32 (``x`` made on
  each side's own handler), repeated: the temporaries are 64 MiB allocations (goals: at
  least 1.5x faster; no more than 5 % slower), each side's result asserted equal bit for
  bit;
* a trivial kernel (one work-item, one pointer argument) launched through an ``sk.Kernel``
  call many times, then one ``finish``, its argument an ndarray made inside the allocator
  against an ``SVMArray`` of the same policy (goal: at most +0.2 µs per launch: finding
  the ndarray's allocation by address and recording on it); and the same calls with
  PyOpenCL's enqueue stubbed out (a finished event), svmkit's own work alone.

A context without fine-grain buffer or system SVM (coarse-only drivers) has no rows: NumPy
cannot use its memory without maps.

Usage: ``python benchmarks/numpy_allocator.py [--quick] [--write]``; prints the table and,
with ``--write``, replaces its section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

os.environ.setdefault("POCL_DEVICES", "pthread pthread")

import _common  # benchmarks/_common.py
import numpy as np
import pyopencl as cl

import svmkit as sk
from svmkit.resources.numpy_allocator import host_policy

SMALL_SIZES = {"64 B": 64, "4 KiB": 4096, "1 MiB": 1 << 20}
LARGE = 64 << 20
LAUNCHES = 256  # kernel launches per batch before the one finish

TOUCH = """
__kernel void touch(__global float *a)
{
    if (get_global_id(0) == 0)
        a[0] += 1.0f;
}
"""

Batch = Callable[[int], None]
"""Runs ``n`` iterations of a measured operation."""


def progress(msg: str) -> None:
    _common.progress("numpy_allocator", msg)


def paired_us(ours: Batch, ref: Batch, budget_s: float, batches: int = 21) -> tuple[float, float]:
    """Medians over ``batches`` of the µs one iteration of ``ours`` and of ``ref`` takes,
    their batches interleaved, each side first in every other pair; both sides run the
    same number of iterations per batch."""
    once = []
    for batch in (ours, ref):
        batch(1)  # (warm: first allocations, kernel builds)
        t0 = time.perf_counter()
        batch(1)
        once.append(max(time.perf_counter() - t0, 1e-7))
    n = max(1, min(100_000, int(budget_s / batches / 2 / max(once))))
    times: tuple[list[float], list[float]] = ([], [])
    pairs = ((ours, times[0]), (ref, times[1]))
    for i in range(batches):
        for batch, out in pairs if i % 2 == 0 else pairs[::-1]:
            gc.collect()
            t0 = time.perf_counter_ns()
            batch(n)
            out.append((time.perf_counter_ns() - t0) / n / 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def page_faults(batch: Batch, n: int = 4) -> float:
    """Minor page faults per iteration of ``batch`` (where the system reports them): a new
    ``mmap``'s pages fault in, and are zeroed, at their first write."""
    try:
        import resource
    except ImportError:  # (not POSIX)
        return float("nan")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batch(n)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n


def inside(allocator: sk.NumpyAllocator, batch: Batch) -> Batch:
    """``batch`` run inside the allocator (entering it is outside the timed loop's
    iterations, once per batch)."""

    def run(n: int) -> None:
        with allocator:
            batch(n)

    return run


def uses_allocator(a: np.ndarray[Any, Any], expected: bool) -> None:
    """Assert that ``a``'s memory is (or is not) an svmkit allocation: the two sides
    measure what they say."""
    from svmkit.arrays.numpy_owned import allocation_of

    if (allocation_of(a) is not None) != expected:
        raise AssertionError(f"array made {'in' if expected else 'outside'} the allocator")


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.missed = 0

    def add(self, what: str, ours: str, ref: str, ratio: str, goal: str, met: bool) -> None:
        verdict = f"{goal}: {'met' if met else 'MISSED'}"
        self.missed += not met
        self.rows.append((what, ours, ref, ratio, verdict))
        progress(f"{what}: {ours} vs {ref} ({ratio}) {verdict}")

    def render(self, notes: list[str], cmd: str) -> str:
        return "\n".join(
            [
                "| what | sk.numpy_allocator | NumPy's default handler | difference | goal |",
                "|---|---|---|---|---|",
                *(f"| {' | '.join(r)} |" for r in self.rows),
                "",
                *(f"- {n}" for n in notes),
                f"- `{cmd}`; medians of interleaved batches measured in this one run.",
                "",
            ]
        )


def empty_rows(allocator: sk.NumpyAllocator, table: Table, budget: float) -> None:
    """``np.empty`` + free at small sizes."""
    empty, u8 = np.empty, np.uint8
    for label, nbytes in SMALL_SIZES.items():
        with allocator:
            uses_allocator(empty(nbytes, u8), True)
        uses_allocator(empty(nbytes, u8), False)

        def batch(n: int, nbytes: int = nbytes) -> None:
            for _ in range(n):
                empty(nbytes, u8)

        ours, ref = paired_us(inside(allocator, batch), batch, budget)
        table.add(
            f"`np.empty({label})` + free",
            f"{ours:.3f} µs",
            f"{ref:.3f} µs",
            f"{ours - ref:+.3f} µs",
            "<= +0.3 µs",
            ours - ref <= 0.3,
        )


def large_rows(allocator: sk.NumpyAllocator, table: Table, budget: float) -> None:
    """64 MiB: a new array and its first write; arithmetic whose temporaries are 64 MiB."""
    count = LARGE // 4

    def empty_fill(n: int) -> None:
        for _ in range(n):
            np.empty(count, np.float32).fill(1.0)

    ours, ref = paired_us(inside(allocator, empty_fill), empty_fill, budget * 2)
    table.add(
        "`np.empty(64 MiB)` + first write (`.fill(1)`)",
        f"{ours / 1e3:.2f} ms, {page_faults(inside(allocator, empty_fill)):.0f} page faults",
        f"{ref / 1e3:.2f} ms, {page_faults(empty_fill):.0f} page faults",
        f"{ref / ours:.2f}x faster",
        ">= 2x faster",
        ref >= 2 * ours,
    )

    rng = np.random.default_rng(7)
    data = rng.standard_normal(count, dtype=np.float32)
    with allocator:
        x_ours = data.copy()
    x_ref = data.copy()
    uses_allocator(x_ours, True)
    uses_allocator(x_ref, False)
    del data
    cases: list[tuple[str, Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]], float]] = [
        ("`y = 2 * x + 1`", lambda x: 2 * x + 1, 1.5),
        ("`(x - x.mean()) / x.std()`", lambda x: (x - x.mean()) / x.std(), 1 / 1.05),
    ]
    for what, fn, goal in cases:
        with allocator:
            y_ours = fn(x_ours)
        y_ref = fn(x_ref)
        uses_allocator(y_ours, True)
        if y_ours.tobytes() != y_ref.tobytes():
            raise AssertionError(f"{what}: results differ between the two handlers")
        del y_ours, y_ref

        def ours_batch(n: int, fn: Any = fn) -> None:
            for _ in range(n):
                fn(x_ours)

        def ref_batch(n: int, fn: Any = fn) -> None:
            for _ in range(n):
                fn(x_ref)

        ours, ref = paired_us(inside(allocator, ours_batch), ref_batch, budget * 2)
        speedup = ref / ours
        goal_text = f">= {goal:.1f}x faster" if goal > 1 else "no more than 5 % slower"
        table.add(
            f"{what}, 64 MiB float32 (bit-identical results)",
            f"{ours / 1e3:.2f} ms, {page_faults(inside(allocator, ours_batch)):.0f} page faults",
            f"{ref / 1e3:.2f} ms, {page_faults(ref_batch):.0f} page faults",
            f"{speedup:.2f}x faster" if speedup >= 1 else f"{1 / speedup - 1:.1%} slower",
            goal_text,
            speedup >= goal,
        )


def kernel_rows(ctx: cl.Context, allocator: sk.NumpyAllocator, table: Table, budget: float) -> None:
    """A tracked kernel call over an allocator-made ndarray vs over an SVMArray."""
    queue = cl.CommandQueue(ctx)
    touch = sk.build_program(ctx, TOUCH).touch
    with allocator:
        nd = np.zeros(1024, np.float32)
    uses_allocator(nd, True)
    svm = sk.zeros(ctx, 1024, np.float32, policy=host_policy(ctx))

    def launches(arg: Any) -> Batch:
        def batch(n: int) -> None:
            for _ in range(n):
                for _ in range(LAUNCHES):
                    touch(queue, (1,), None, arg)
                queue.finish()

        return batch

    ours, ref = paired_us(launches(nd), launches(svm), budget * 2)
    ours, ref = ours / LAUNCHES, ref / LAUNCHES
    table.add(
        f"`sk.Kernel` call, 1 work-item, per launch ({LAUNCHES} launches, one finish)",
        f"{ours:.2f} µs (ndarray argument)",
        f"{ref:.2f} µs (SVMArray argument)",
        f"{ours - ref:+.2f} µs",
        "<= +0.2 µs",
        ours - ref <= 0.2,
    )
    ours, ref = stubbed_launch_us(queue, touch, nd, svm, budget)
    table.add(
        "the same, svmkit's own Python work per launch (driver stubbed)",
        f"{ours:.2f} µs (ndarray argument)",
        f"{ref:.2f} µs (SVMArray argument)",
        f"{ours - ref:+.2f} µs",
        "<= +0.2 µs",
        ours - ref <= 0.2,
    )
    total = float(nd[0]), float(svm.host[0])
    if total[0] != total[1] or total[0] < 1:
        raise AssertionError(f"the kernel's writes read back {total}, not equal counts")
    svm.free()


def stubbed_launch_us(
    queue: cl.CommandQueue, kernel: Any, nd: np.ndarray[Any, Any], svm: Any, budget: float
) -> tuple[float, float]:
    """µs per tracked kernel call of svmkit's own work (validation, the argument's
    allocation, recording), PyOpenCL's enqueue replaced by a stub returning a finished
    event, for an ndarray and an SVMArray argument."""
    import svmkit.driver.calls as driver_calls

    done = cl.enqueue_marker(queue)
    done.wait()
    saved = driver_calls._cl
    driver_calls._cl = types.SimpleNamespace(  # type: ignore[assignment]
        Kernel=types.SimpleNamespace(__call__=lambda *args, **kwargs: done),
        enqueue_nd_range_kernel=lambda *args, **kwargs: done,  # (arguments set by svmkit)
    )

    def calls(arg: Any) -> Batch:
        def batch(n: int) -> None:
            for _ in range(n):
                kernel(queue, (1,), None, arg)

        return batch

    try:
        return paired_us(calls(nd), calls(svm), budget)
    finally:
        driver_calls._cl = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short measurements (a smoke run)")
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    budget = 0.05 if args.quick else 0.8
    ctx = sk.default_context()
    table = Table()
    try:
        allocator = sk.numpy_allocator()
    except sk.UnsupportedError as e:
        progress(f"no rows: {e}")
        allocator = None
    if allocator is not None:
        policy = host_policy(ctx)
        progress(f"allocator: {allocator!r}, {policy}")
        empty_rows(allocator, table, budget)
        large_rows(allocator, table, budget)
        kernel_rows(ctx, allocator, table, budget)
    section, suffix = _common.section_name("numpy_allocator", ctx)
    cmd = "python benchmarks/numpy_allocator.py" + (" --quick" if args.quick else "")
    notes = _common.machine_notes(ctx)
    if allocator is not None:
        notes.append(
            f"The allocator's resource: the default context's current resource for {policy}."
        )
        notes.append(
            "64 MiB rows: NumPy's default handler gets each new block from a fresh `mmap` "
            "(glibc, above its mmap threshold), whose pages the kernel zeroes at their first "
            "write; the pool hands back the same block with its pages in place. Kernel rows: "
            "an ndarray argument costs svmkit a lookup of its allocation by address, a "
            "PyOpenCL SVM pointer made per launch and a copy of the argument tuple, which an "
            "SVMArray (itself a PyOpenCL SVM pointer) needs none of."
        )
    text = table.render(notes, cmd)
    print(text)
    if args.write:
        heading = f"NumPy allocator{suffix} (`benchmarks/numpy_allocator.py`)"
        path = _common.write_section(section, heading, text)
        progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
