"""``svmkit demo workqueue``: host threads feed a running kernel through a fine-grain queue.

The workload is irregular: Collatz stopping times of random numbers below ``2**bits``
(one item may take 0 steps, its neighbour several hundred).  Host producer threads push
item indices into a :class:`~svmkit.WorkQueue` while a persistent consumer kernel
(:func:`~svmkit.persistent_grid`) pops and computes them; the kernel reports every index
it pops on a second queue, from which the host stamps push->pop latency.  Every result is
checked against a NumPy reference (exit status 1 on any mismatch), and the same workload
then runs as static per-batch kernel launches for comparison.

On a device without fine-grain SVM atomics (NVIDIA's OpenCL offers coarse-grain only) the
demo says so and runs the batched coarse-grain mode: copy a batch in, launch, copy the
results out, a few batches in flight.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np
import pyopencl as cl

from svmkit.arrays.creation import empty
from svmkit.capabilities import capabilities, create_context, device_label
from svmkit.errors import QueueClosed
from svmkit.ops import copy, launch
from svmkit.policy import Policy
from svmkit.programs import build_program, kernels_dir
from svmkit.workqueue import WorkQueue, persistent_grid

__all__ = ["collatz_reference", "main"]


def collatz_reference(starts: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Collatz stopping times with NumPy (vectorised over the numbers still running)."""
    n = starts.astype(np.int64).copy()
    steps = np.zeros(len(n), np.int32)
    idx = np.flatnonzero(n > 1)
    while idx.size:
        v = n[idx]
        v = np.where(v & 1, 3 * v + 1, v >> 1)
        n[idx] = v
        steps[idx] += 1
        idx = idx[v > 1]
    return steps


class Progress:
    """A progress bar on stderr (redrawn in place on a terminal, every 25% otherwise)."""

    def __init__(self, total: int, label: str, stream: TextIO, enabled: bool = True) -> None:
        self.total, self.label, self.stream, self.enabled = total, label, stream, enabled
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last = -1

    def update(self, done: int) -> None:
        if not self.enabled or self.total == 0:
            return
        frac = min(1.0, done / self.total)
        if self.tty:
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {frac:6.1%} {done}/{self.total}")
            if done >= self.total:
                self.stream.write("\n")
        else:
            quarter = int(frac * 4)
            if quarter == self._last:
                return
            self.stream.write(f"{self.label}: {frac:.0%} ({done}/{self.total})\n")
        self._last = int(frac * 4)
        self.stream.flush()


def _source() -> str:
    return (kernels_dir() / "workqueue_demo.cl").read_text()


def _static_batches(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    program: cl.Program,
    starts: np.ndarray[Any, Any],
    batch: int,
    depth: int,
) -> tuple[np.ndarray[Any, Any], float, np.ndarray[Any, Any]]:
    """Static launches: copy each batch into coarse-grain SVM, launch, copy results out.

    ``depth`` batches in flight (1: wait for each).  Returns (results, seconds, per-batch
    latency in µs).
    """
    pol = Policy.coarse()
    slots = [
        (
            empty(ctx, batch, np.int64, policy=pol),
            empty(ctx, batch, np.int32, policy=pol),
            np.empty(batch, np.int32),
            cl.Kernel(program, "collatz_batch"),
        )
        for _ in range(depth)
    ]
    n = len(starts)
    results = np.empty(n, np.int32)
    nb = (n + batch - 1) // batch
    lat = np.empty(nb)
    inflight: list[tuple[int, int, cl.Event]] = []

    def retire() -> None:
        j, t0, event = inflight.pop(0)
        event.wait()
        lat[j] = (time.perf_counter_ns() - t0) / 1e3
        lo, hi = j * batch, min(n, (j + 1) * batch)
        results[lo:hi] = slots[j % depth][2][: hi - lo]

    start = time.perf_counter()
    for j in range(nb):
        if len(inflight) == depth:
            retire()
        dev_in, dev_out, host_out, kernel = slots[j % depth]
        lo, hi = j * batch, min(n, (j + 1) * batch)
        t0 = time.perf_counter_ns()
        copy(queue, dev_in[: hi - lo], np.ascontiguousarray(starts[lo:hi]), blocking=False)
        launch(queue, kernel, (hi - lo,), None, dev_in, dev_out)
        done = copy(queue, host_out[: hi - lo], dev_out[: hi - lo], blocking=False)
        inflight.append((j, t0, done))
    while inflight:
        retire()
    return results, time.perf_counter() - start, lat


def _run_queue(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    program: cl.Program,
    starts: np.ndarray[Any, Any],
    args: argparse.Namespace,
    bar: Progress,
) -> tuple[np.ndarray[Any, Any], float, np.ndarray[Any, Any], int]:
    """Producers -> persistent consumer kernel.  Returns (results, seconds, latency µs,
    work-groups)."""
    n = len(starts)
    fine = Policy.fine()
    dev_starts = empty(ctx, n, np.int64, policy=fine)
    dev_starts.host[:] = starts
    steps = empty(ctx, n, np.int32, policy=fine)
    steps.host[:] = -1
    work = WorkQueue(ctx, args.capacity)
    popped = WorkQueue(ctx, args.capacity)
    gs, ls = persistent_grid(queue, host_threads=args.host_cores)
    event = launch(
        queue, cl.Kernel(program, "collatz_consumer"), gs, ls, work, popped, dev_starts, steps
    )
    queue.flush()

    pushed_at = np.zeros(n, np.int64)
    popped_at = np.zeros(n, np.int64)
    errors: list[BaseException] = []
    order = np.arange(n, dtype=np.int64)
    share = (n + args.producers - 1) // args.producers

    def produce(p: int) -> None:
        try:
            clock = time.perf_counter_ns
            for lo in range(p * share, min(n, (p + 1) * share), args.batch):
                hi = min(n, lo + args.batch, (p + 1) * share)
                pushed_at[lo:hi] = clock()
                work.push_many(order[lo:hi])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def observe() -> None:
        got = 0
        clock = time.perf_counter_ns
        while True:
            try:
                first = popped.pop()  # blocks; stamps are taken as items arrive
            except QueueClosed:
                break
            try:
                rest = popped.pop_many(4095, timeout=0)
            except TimeoutError:
                rest = popped.pop_many(0)
            now = clock()
            popped_at[first] = now
            popped_at[rest] = now
            got += 1 + len(rest)
            if got % 4096 < 1 + len(rest):
                bar.update(got)
        bar.update(got)

    watcher = threading.Thread(target=observe, name="svmkit-demo-observer")
    producers = [
        threading.Thread(target=produce, args=(p,), name=f"svmkit-demo-producer-{p}")
        for p in range(args.producers)
    ]
    start = time.perf_counter()
    watcher.start()
    for t in producers:
        t.start()
    for t in producers:
        t.join()
    work.close()
    event.wait()
    elapsed = time.perf_counter() - start
    popped.close()
    watcher.join()
    if errors:
        raise errors[0]
    latency = (popped_at - pushed_at) / 1e3
    return steps.host.copy(), elapsed, latency, gs[0]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="svmkit demo workqueue",
        description="Host threads feed a running kernel through sk.WorkQueue (Collatz "
        "stopping times), checked against NumPy.",
    )
    ap.add_argument("--items", type=int, default=300_000, help="numbers to process")
    ap.add_argument("--bits", type=int, default=20, help="numbers are below 2**bits")
    ap.add_argument("--producers", type=int, default=2, help="host producer threads")
    ap.add_argument("--batch", type=int, default=256, help="items per push_many / launch")
    ap.add_argument("--capacity", type=int, default=4096, help="queue slots (power of two)")
    ap.add_argument(
        "--host-cores",
        type=int,
        default=1,
        help="cores a CPU device leaves to the host (see sk.persistent_grid)",
    )
    ap.add_argument(
        "--mode",
        choices=["auto", "queue", "batched"],
        default="auto",
        help="auto: the queue where fine-grain SVM atomics exist, else batched",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; 0 when every result matches NumPy, 1 otherwise, 2 on bad options."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    out, err = sys.stdout, sys.stderr
    if args.items < 1 or args.batch < 1 or args.producers < 1 or not 1 <= args.bits <= 40:
        err.write(
            "svmkit demo workqueue: --items, --batch, --producers must be >= 1 and "
            "--bits within 1..40\n"
        )
        return 2
    ctx = create_context()
    queue = cl.CommandQueue(ctx)
    caps = capabilities(ctx)
    device = device_label(ctx.devices[0])
    fine = caps.fine_grain_buffer and caps.atomics
    mode = args.mode if args.mode != "auto" else ("queue" if fine else "batched")
    if mode == "queue" and not fine:
        err.write(
            f"svmkit demo workqueue: {device} lacks fine-grain buffer SVM with atomics; "
            "use --mode batched\n"
        )
        return 2

    rng = np.random.default_rng(args.seed)
    starts = rng.integers(1, 2**args.bits, size=args.items, dtype=np.int64)
    out.write(
        f"svmkit demo workqueue: Collatz stopping times of {args.items} numbers below "
        f"2^{args.bits} on {device}\n"
    )
    reference = collatz_reference(starts)
    out.write(
        f"  workload: {int(reference.sum())} steps in all, from {int(reference.min())} "
        f"to {int(reference.max())} per item (irregular)\n"
    )
    bar = Progress(args.items, "  progress", err, enabled=not args.no_progress)

    if mode == "queue":
        program = build_program(ctx, _source())
        results, elapsed, latency, groups = _run_queue(ctx, queue, program, starts, args, bar)
        out.write(
            f"  mode: fine-grain work queue (capacity {args.capacity}, {args.producers} "
            f"host producer threads, push_many batches of {args.batch}, {groups} "
            "persistent consumer work-group(s) of 1 work-item)\n"
        )
    else:
        if not fine:
            out.write(
                f"  {device} has no fine-grain buffer SVM with atomics "
                f"(coarse-grain only), so no work queue: running the batched "
                "coarse-grain mode (copy in, launch, copy out; 4 batches in flight)\n"
            )
        program = build_program(ctx, _source(), defines={"SVMKIT_DEMO_BATCH_ONLY": None})
        results, elapsed, latency = _static_batches(ctx, queue, program, starts, args.batch, 4)
        bar.update(args.items)
        out.write(f"  mode: batched coarse-grain SVM (batches of {args.batch})\n")

    bad = np.flatnonzero(results != reference)
    rate = args.items / elapsed
    p50, p90, p99, pmax = np.percentile(latency, [50, 90, 99, 100])
    what = "push->pop latency" if mode == "queue" else "per-batch latency (copy in to out)"
    out.write(f"  throughput: {rate / 1e6:.3f} M items/s ({elapsed:.3f} s)\n")
    out.write(
        f"  {what}: p50 {p50:.1f} µs, p90 {p90:.1f} µs, p99 {p99:.1f} µs, max {pmax:.1f} µs\n"
    )
    if mode == "queue":
        out.write(
            f"    (producers outpace the kernel, so items wait in a full queue: about "
            f"capacity / throughput = {args.capacity / rate * 1e6:.0f} µs; a smaller "
            "--capacity trades that for more producer blocking)\n"
        )

    static_prog = build_program(ctx, _source(), defines={"SVMKIT_DEMO_BATCH_ONLY": None})
    static, static_s, static_lat = _static_batches(ctx, queue, static_prog, starts, args.batch, 1)
    bad_static = np.flatnonzero(static != reference)
    out.write(
        f"  static per-batch launches (batch {args.batch}, each waited for): "
        f"{args.items / static_s / 1e6:.3f} M items/s ({static_s:.3f} s, p50 "
        f"{np.median(static_lat):.1f} µs per launch); {mode} mode is "
        f"{static_s / elapsed:.1f}x that\n"
    )
    if bad.size or bad_static.size:
        first = int(bad[0]) if bad.size else int(bad_static[0])
        out.write(
            f"  MISMATCH: {bad.size} {mode} and {bad_static.size} static results differ "
            f"from NumPy (first: item {first}, start {int(starts[first])}, expected "
            f"{int(reference[first])}, got {int(results[first])})\n"
        )
        return 1
    out.write(
        f"  verified: all {args.items} results match the NumPy reference "
        "(and so do the static launches')\n"
    )
    return 0
