"""``svmkit demo workqueue``: a running kernel fed by host threads through a fine-grain queue.

The workload is irregular: Collatz stopping times (one number takes 0 steps, its neighbour
several hundred).  A persistent kernel (:func:`~svmkit.persistent_grid`) runs for the whole
demo: in each work-group one work-item claims a run of indices from the ``work`` queue into
local memory, the group computes them, and the same work-item pushes the results to a
second queue, which the host pops (host -> device -> host).  Two measures, each against the
same work sent as one kernel launch per batch (or per item), in rounds that alternate the
two sides so both see the same machine load (medians):

* throughput: a stream of small batches from host producer threads (a launch's fixed cost
  is then a large part of a batch's time);
* latency: single light items pushed one at a time into an idle queue, push to result on
  the host.

Every result of both sides is checked against a NumPy reference (exit status 1 on any
mismatch).  On a device without fine-grain SVM atomics (NVIDIA's OpenCL: coarse-grain
only) the demo says so and runs the batched coarse-grain mode instead: copy a batch in,
launch, copy out, several batches in flight (``mode: batched`` in ``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import pyopencl as cl

from svmkit.arrays.creation import empty
from svmkit.capabilities import capabilities, create_context, device_label
from svmkit.cli.demo_runner import run_demo
from svmkit.driver import calls
from svmkit.ops import copy, launch
from svmkit.policy import Policy
from svmkit.programs import build_program, kernels_dir
from svmkit.workqueue import WorkQueue, persistent_grid
from svmkit.workqueue.batched import BatchedLaunches

__all__ = ["collatz_reference", "main"]

PROG = "svmkit demo workqueue"
GROUP_BATCH = 64  # the most items one work-group claims at once (DEMO_BATCH)
LIGHT_BITS = 8  # latency items: numbers below 2**8, at most 127 steps
PIPELINE_DEPTH = 8  # batched mode: batches in flight (over two queues)
MAX_ITEMS = 2**31 - 1  # results carry the index in their upper 32 bits


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


def reference_with_progress(starts: np.ndarray[Any, Any], bar: Progress) -> np.ndarray[Any, Any]:
    """:func:`collatz_reference` in chunks, updating ``bar`` after each."""
    out = np.empty(len(starts), np.int32)
    chunk = 1 << 17
    bar.update(0)
    for lo in range(0, len(starts), chunk):
        out[lo : lo + chunk] = collatz_reference(starts[lo : lo + chunk])
        bar.update(min(len(starts), lo + chunk))
    return out


def program_source() -> str:
    """The demo's kernels (``kernels/workqueue_demo.cl``)."""
    return (kernels_dir() / "workqueue_demo.cl").read_text()


# --- options -------------------------------------------------------------------------------


def _int_option(low: int, high: int | None = None, power_of_two: bool = False) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f">= {low}" if high is None else f"within {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        if power_of_two and value & (value - 1):
            raise argparse.ArgumentTypeError(f"must be a power of two, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="A persistent kernel fed through sk.WorkQueue (Collatz stopping times) "
        "against one kernel launch per batch: throughput and latency, checked against NumPy.",
    )
    ap.add_argument("--items", type=_int_option(1, MAX_ITEMS), default=400_000, help="stream items")
    ap.add_argument(
        "--bits", type=_int_option(1, 40), default=20, help="stream numbers are below 2**bits"
    )
    ap.add_argument(
        "--batch",
        type=_int_option(1, 1 << 20),
        default=16,
        help="items per pushed batch and per launch (default 16: small batches, where a "
        "launch's fixed cost matters)",
    )
    ap.add_argument("--producers", type=_int_option(1, 64), default=2, help="host threads")
    ap.add_argument(
        "--capacity",
        type=_int_option(2, 1 << 24, power_of_two=True),
        default=4096,
        help="queue slots (a power of two)",
    )
    ap.add_argument(
        "--host-cores",
        type=_int_option(0, 1024),
        default=1,
        help="cores a CPU device leaves to the host (see sk.persistent_grid)",
    )
    ap.add_argument(
        "--local-size",
        type=_int_option(1, GROUP_BATCH),
        default=16,
        help="work-items per consumer work-group",
    )
    ap.add_argument(
        "--latency-items",
        type=_int_option(1, 10**6),
        default=2000,
        help="single items timed one at a time",
    )
    ap.add_argument(
        "--rounds", type=_int_option(1, 100), default=5, help="alternating rounds (medians)"
    )
    ap.add_argument(
        "--mode",
        choices=["auto", "queue", "batched"],
        default="auto",
        help="auto: the queue where fine-grain SVM atomics exist, else batched",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument(
        "--json",
        action="store_true",
        help="write only one JSON summary object to stdout (the text goes to stderr)",
    )
    return ap


# --- measurements ----------------------------------------------------------------------------


@dataclass
class Measures:
    """What both modes report: rates per round, per-item latencies, results."""

    rates: dict[str, list[float]] = field(default_factory=lambda: {"queue": [], "launches": []})
    latency: dict[str, list[float]] = field(default_factory=lambda: {"queue": [], "launches": []})
    results: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    light: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)


def _rounds(n: int, rounds: int, batch: int) -> list[tuple[int, int]]:
    """``rounds`` slices of ``range(n)`` on batch boundaries (fewer when ``n`` is small)."""
    batches = (n + batch - 1) // batch
    count = max(1, min(rounds, batches))
    edges = [min(n, (batches * r // count) * batch) for r in range(count + 1)]
    return [(edges[r], edges[r + 1]) for r in range(count) if edges[r + 1] > edges[r]]


def _decode(packed: np.ndarray[Any, Any], out: np.ndarray[Any, Any], offset: int = 0) -> None:
    """Results are ``(index << 32) | steps``: scatter the steps to their indices."""
    out[(packed >> 32) - offset] = packed & 0xFFFFFFFF


class QueueSide:
    """The persistent kernel and its two queues, for the whole demo."""

    def __init__(
        self,
        ctx: cl.Context,
        queue: cl.CommandQueue,
        program: cl.Program,
        starts: np.ndarray[Any, Any],
        args: argparse.Namespace,
        *,
        single_items: bool = False,
    ) -> None:
        self.starts = empty(ctx, len(starts), np.int64, policy=Policy.fine())
        self.starts.host[:] = starts
        self.work = WorkQueue(ctx, args.capacity)
        self.results = WorkQueue(ctx, args.capacity)
        if single_items:  # latency: one work-item answering each item as it comes
            self.grid: tuple[Any, Any] = ((1,), (1,))
            kernel = calls.new_kernel(program, "collatz_item")
        else:
            self.grid = persistent_grid(
                queue, host_threads=args.host_cores, local_size=args.local_size
            )
            kernel = calls.new_kernel(program, "collatz_group")
        self.event = launch(queue, kernel, *self.grid, self.work, self.results, self.starts)
        calls.flush(queue)
        self.args = args

    def stream(self, lo: int, hi: int, out: np.ndarray[Any, Any], bar: Progress) -> float:
        """Producer threads push indices [lo, hi) in batches; this thread pops the results
        into ``out``.  Returns seconds from the first push to the last result."""
        args = self.args
        order = np.arange(lo, hi, dtype=np.int64)
        errors: list[BaseException] = []
        batches = list(range(0, len(order), args.batch))

        def produce(p: int) -> None:
            try:
                for b in batches[p :: args.producers]:
                    self.work.push_many(order[b : b + args.batch])
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [
            threading.Thread(target=produce, args=(p,), name=f"svmkit-demo-producer-{p}")
            for p in range(min(args.producers, len(batches)))
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        got = 0
        try:
            while got < len(order):
                packed = self.results.pop_many(min(len(order) - got, 8192), timeout=30)
                _decode(packed, out)
                got += len(packed)
                bar.update(lo + got)
        finally:  # (also on Ctrl-C: the interrupt, not a producer's QueueClosed, is reported)
            if errors or got < len(order):
                self.work.close()  # producers blocked on a full ring end
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        return time.perf_counter() - start

    def one(self, index: int) -> tuple[float, int]:
        """Push one index into the idle queue, pop its result: (µs, packed result)."""
        clock = time.perf_counter_ns
        t0 = clock()
        self.work.push(index)
        packed = int(self.results.pop(timeout=30))
        return (clock() - t0) / 1e3, packed

    def close(self) -> None:
        """End the persistent kernel: both queues close first, so a kernel blocked pushing
        into a full results queue (the host stopped popping: Ctrl-C) leaves too."""
        self.work.close()
        self.results.close()
        calls.wait(self.event, "the persistent kernel")


def _measure(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    starts: np.ndarray[Any, Any],
    light: np.ndarray[Any, Any],
    args: argparse.Namespace,
    mode: str,
    out: TextIO,
    err: TextIO,
) -> tuple[Measures, str]:
    """Both sides, in alternating rounds.  Returns the measures and a line on the setup."""
    m = Measures()
    n = len(starts)
    every = np.concatenate([starts, light])
    m.results = {"queue": np.full(n, -1, np.int64), "launches": np.full(n, -1, np.int64)}
    m.light = {"queue": np.full(len(light), -1, np.int64), "launches": np.full(len(light), -1)}
    fine_launches = mode == "queue"
    batch_only = {"SVMKIT_DEMO_BATCH_ONLY": None}
    launch_prog = build_program(ctx, program_source(), defines=batch_only)
    pol = Policy.fine() if fine_launches else Policy.coarse()
    dev_starts = empty(ctx, len(every), np.int64, policy=pol)
    if fine_launches:
        dev_starts.host[:] = every
    else:
        copy(queue, dev_starts, every)

    # The pipelined batches alternate between two in-order queues, so one batch's copies
    # overlap another's kernel (benchmarks/workqueue.py: 132 against 87 M items/s on NVIDIA's
    # OpenCL at batches of 4096 with one queue; faster on PoCL 5, the same on Intel's CPU
    # runtime).
    pipeline_queues = [queue, calls.new_queue(ctx, queue.device)]

    def launcher(batch: int, depth: int) -> BatchedLaunches:
        return BatchedLaunches(
            ctx,
            pipeline_queues if depth > 1 else [queue],
            lambda: calls.new_kernel(launch_prog, "collatz_launch"),
            batch,
            depth=depth,
            extra=(dev_starts,),
            policy=pol,
        )

    per_batch = launcher(args.batch, 1)
    per_item = launcher(1, 1)
    batched = launcher(args.batch, PIPELINE_DEPTH)
    program = None
    if mode == "queue":
        program = build_program(ctx, program_source(), defines={"DEMO_BATCH": GROUP_BATCH})

    def running_queue(single_items: bool = False) -> QueueSide:
        """A persistent kernel on fresh queues, already answering (so its launch is not
        timed); closed after its round, so the launch rounds get every core."""
        assert program is not None
        side = QueueSide(ctx, queue, program, every, args, single_items=single_items)
        side.one(n)  # (the first light item) waits until the kernel runs
        return side

    if mode == "queue":
        groups = persistent_grid(queue, host_threads=args.host_cores, local_size=args.local_size)
        setup = (
            f"fine-grain work queues (capacity {args.capacity}): {args.producers} host "
            f"producer thread(s) push batches of {args.batch}; "
            f"{groups[0][0] // groups[1][0]} persistent work-group(s) of {args.local_size} "
            f"work-items, each claiming up to {GROUP_BATCH} items into local memory; results "
            "come back through a second queue"
        )
    else:
        setup = (
            f"batched coarse-grain SVM: copy in, launch, copy out, {PIPELINE_DEPTH} batches "
            f"of {args.batch} in flight on two queues (no work queue on this device)"
        )
    bars = {
        name: Progress(n, f"  {name} stream", err, enabled=not args.no_progress)
        for name in ("queue", "launches")
    }
    index = np.arange(n, dtype=np.int64)
    for lo, hi in _rounds(n, args.rounds, args.batch):
        if mode == "queue":
            qs = running_queue()
            try:
                seconds = qs.stream(lo, hi, m.results["queue"], bars["queue"])
            finally:
                qs.close()
        else:
            packed = np.empty(hi - lo, np.int64)
            seconds, _ = batched.run(index[lo:hi], packed)
            _decode(packed, m.results["queue"])
            bars["queue"].update(hi)
        m.rates["queue"].append((hi - lo) / seconds)
        packed = np.empty(hi - lo, np.int64)
        seconds, _ = per_batch.run(index[lo:hi], packed)
        _decode(packed, m.results["launches"])
        bars["launches"].update(hi)
        m.rates["launches"].append((hi - lo) / seconds)
    # latency: single light items, alternating sides in chunks
    light_bar = Progress(len(light), "  latency", err, enabled=not args.no_progress)
    chunk = max(1, -(-len(light) // args.rounds))
    one = np.empty(1, np.int64)
    for lo in range(0, len(light), chunk):
        span = range(lo, min(len(light), lo + chunk))
        if mode == "queue":
            qs = running_queue(single_items=True)
            try:
                for j in span:
                    us, packed_one = qs.one(n + j)
                    m.light["queue"][j] = packed_one & 0xFFFFFFFF
                    m.latency["queue"].append(us)
            finally:
                qs.close()
        else:  # batched mode: a single item goes through the batched path
            for j in span:
                _, lat = batched.run(np.array([n + j]), one)
                m.light["queue"][j] = int(one[0]) & 0xFFFFFFFF
                m.latency["queue"].append(float(lat[0]))
        for j in span:
            _, lat = per_item.run(np.array([n + j]), one)
            m.light["launches"][j] = int(one[0]) & 0xFFFFFFFF
            m.latency["launches"].append(float(lat[0]))
        light_bar.update(span.stop)
    return m, setup


# --- report ----------------------------------------------------------------------------------


def _rate(x: float) -> str:
    return f"{x / 1e6:.3f} M items/s" if x >= 1e5 else f"{x:,.0f} items/s"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b > 0 and np.isfinite(a / b) else "n/a"


def _report(
    m: Measures,
    args: argparse.Namespace,
    mode: str,
    device: str,
    verified: bool,
    out: TextIO,
) -> dict[str, Any]:
    q_rate = statistics.median(m.rates["queue"])
    l_rate = statistics.median(m.rates["launches"])
    q_p50 = float(np.median(m.latency["queue"]))
    l_p50 = float(np.median(m.latency["launches"]))
    name = "queue" if mode == "queue" else "batched"
    rounds = len(m.rates["queue"])
    out.write(
        f"  throughput ({args.items} items in batches of {args.batch}, median of {rounds} "
        f"round(s)): {name} {_rate(q_rate)}, one launch per batch {_rate(l_rate)}: "
        f"{_ratio(q_rate, l_rate)}\n"
    )
    if mode == "queue":
        out.write(
            f"    why: each launch pays the runtime's fixed cost (about {l_p50:.1f} µs here, "
            f"the single-item launch below) on top of a batch's work, while the running "
            f"kernel takes the next batch from the queue with one atomic\n"
        )
    else:
        out.write(
            f"    why: {PIPELINE_DEPTH} batches in flight overlap one batch's copies and "
            "launch with another's; the comparison waits for each batch\n"
        )
    if args.items < 10 * args.batch:
        out.write("    (a stream this short times mostly start-up; use more --items for a rate)\n")
    out.write(
        f"  latency (single items below 2^{LIGHT_BITS}, push to result on the host, "
        f"{len(m.latency['queue'])} each): {name} p50 {q_p50:.2f} µs "
        f"(p99 {np.percentile(m.latency['queue'], 99):.2f}), one launch per item p50 "
        f"{l_p50:.2f} µs (p99 {np.percentile(m.latency['launches'], 99):.2f}): "
        + (
            f"{_ratio(l_p50, q_p50)} lower\n"
            if l_p50 >= q_p50
            else f"{_ratio(q_p50, l_p50)} higher\n"
        )
    )
    if mode == "queue":
        out.write(
            "    why: the kernel is already running and polling the queue, so an item costs "
            "two cache-line hand-offs (host -> device -> host); a launch pays the runtime's "
            "enqueue, scheduling and completion\n"
        )
    else:
        out.write(
            "    why: without fine-grain SVM atomics a single item still needs copy in, "
            "launch and copy out, so both sides pay a launch\n"
        )
    return {
        "device": device,
        "mode": mode,
        "verified": verified,
        "throughput": {"queue": q_rate, "launches": l_rate},
        "latency_us": {"queue_p50": q_p50, "launch_p50": l_p50},
    }


def _verify(
    m: Measures,
    reference: np.ndarray[Any, Any],
    light_ref: np.ndarray[Any, Any],
    starts: np.ndarray[Any, Any],
    out: TextIO,
) -> bool:
    ok = True
    for side in ("queue", "launches"):
        for got, want, what in (
            (m.results[side], reference, "stream"),
            (m.light[side], light_ref, "latency"),
        ):
            bad = np.flatnonzero(got != want)
            if bad.size:
                first = int(bad[0])
                out.write(
                    f"  MISMATCH: {bad.size} {side} {what} results differ from NumPy (first: "
                    f"item {first}, expected {int(want[first])}, got {int(got[first])})\n"
                )
                ok = False
    if ok:
        out.write(
            f"  verified: all {len(reference) + len(light_ref)} results of each side match "
            "the NumPy reference\n"
        )
    return ok


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run the demo: text to ``out``, progress to ``err``; with ``--json`` the text goes to
    ``err`` too and ``out`` gets only the summary object (``| python -m json.tool``)."""
    summary_out = out
    if args.json:
        out = err
    ctx = create_context()
    queue = calls.new_queue(ctx)
    caps = capabilities(ctx)
    device = device_label(ctx.devices[0])
    fine = caps.fine_grain_buffer and caps.atomics
    mode = args.mode if args.mode != "auto" else ("queue" if fine else "batched")
    if mode == "queue" and not fine:
        err.write(
            f"{PROG}: {device} lacks fine-grain buffer SVM with atomics; use --mode batched\n"
        )
        return 2

    rng = np.random.default_rng(args.seed)
    starts = rng.integers(1, 2**args.bits, size=args.items, dtype=np.int64)
    light = rng.integers(1, 2**LIGHT_BITS, size=args.latency_items, dtype=np.int64)
    out.write(
        f"{PROG}: Collatz stopping times of {args.items} numbers below 2^{args.bits} on {device}\n"
    )
    out.flush()
    bar = Progress(args.items, "  NumPy reference", err, enabled=not args.no_progress)
    reference = reference_with_progress(starts, bar)
    light_ref = collatz_reference(light)
    out.write(
        f"  workload: {int(reference.sum())} steps in all, {int(reference.min())} to "
        f"{int(reference.max())} per item (irregular)\n"
    )
    if mode == "batched" and not fine:
        out.write(
            f"  {device} has no fine-grain buffer SVM with atomics (coarse-grain only), so "
            "no work queue: batched mode\n"
        )
    out.flush()
    m, setup = _measure(ctx, queue, starts, light, args, mode, out, err)
    out.write(f"  mode: {setup}\n")
    verified = _verify(m, reference, light_ref, starts, out)
    summary = _report(m, args, mode, device, verified, out)
    if args.json:
        summary_out.write(json.dumps(summary) + "\n")
    return 0 if verified else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo: 0 when every result matches NumPy, 1 otherwise or on an OpenCL error,
    2 on a bad option, 130 on Ctrl-C.  No traceback reaches the user."""
    return run_demo(PROG, build_parser(), run, argv)
