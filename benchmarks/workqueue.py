"""sk.WorkQueue throughput and latency, against launching a kernel per batch.

Rows (medians of ``--repeat`` runs, all measured in this one run):

* host -> device items/s through a WorkQueue, one host producer pushing batches of 1, 64
  and 4096 items (``push``/``push_many``) while a persistent consumer kernel drains it;
  three consumers: per-item ``wq_pop``, per-item ``wq_pop_ahead`` (claims runs of up to 64
  published items, one atomic per run) and batch ``wq_pop_many``; the per-item consumers'
  rates against one work-item draining a full ring with ``wq_pop`` alone (uncontended),
  and ``wq_pop`` also counting completions in a fine-grain atomic the host polls;
* round trip: the host pushes one item and waits for the device's answer on a second
  queue (p50/p99 over many items);
* the demo's two comparisons (``svmkit demo workqueue``): a stream of small batches and
  single light items, queue against one launch per batch / per item;
* a sweep of work per item (about 1 µs to 1 ms of spinning, regular and irregular): the
  work-group queue consumer against one launch per batch of 16, showing where each wins;
* the producer: ``push_many`` into a 1,024-slot ring a kernel drains against the same items
  into an idle ring (the wait spins while the device moves, so the first runs at the
  device's pace);
* the task queue of ``svmkit demo tasks`` (task records, claims of 64, a 1,024-slot ring,
  3,200 and 32,000 tasks, a quarter heavy or all light) against one launch per batch with a
  copy in and out per batch and without copies;
* the launch-per-batch baseline: copy the batch into coarse-grain SVM, launch over it, copy
  the results out (``svmkit.workqueue.batched``), sync and pipelined 4 and 8 deep, and raw
  PyOpenCL's copy + launch + copy on ``cl.Buffer`` for the same batch.

On a device without fine-grain SVM atomics (NVIDIA's OpenCL: coarse-grain only) the queue
rows are skipped, saying so, and the batched coarse-grain rows are what svmkit's demo
falls back to (their targets apply there).  ``--quick`` runs fewer items.  The table goes
to stdout, and to this script's section of ``benchmarks/RESULTS.md`` with ``--write``;
progress to stderr.

    python benchmarks/workqueue.py [--quick] [--repeat N] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

import _common  # benchmarks/_common.py
import numpy as np
import pyopencl as cl

import svmkit as sk
from svmkit.workqueue.batched import BatchedLaunches

KERNELS = r"""
#include "svmkit_workqueue.h"

__kernel void consume_each(__global svmkit_wq *q, __global long *sums)
{
    WQ_ITEM x;
    long s = 0;
    while (wq_pop(q, &x))
        s += x * 2 + 1;
    sums[get_global_id(0)] = s;
}

/* Per item, claiming runs of up to 64 published items at once (wq_pop_ahead). */
__kernel void consume_ahead(__global svmkit_wq *q, __global long *sums)
{
    svmkit_wq_cursor cursor = WQ_CURSOR_INIT;
    WQ_ITEM x;
    long s = 0;
    while (wq_pop_ahead(q, &cursor, 64, &x))
        s += x * 2 + 1;
    sums[get_global_id(0)] = s;
}

__kernel void consume_runs(__global svmkit_wq *q, __global long *sums)
{
    WQ_ITEM items[64];
    long s = 0;
    int k;
    while ((k = wq_pop_many(q, items, 64)))
        for (int i = 0; i < k; i++)
            s += items[i] * 2 + 1;
    sums[get_global_id(0)] = s;
}

/* wq_pop, each completion counted in a fine-grain atomic the host polls (counts[0]):
 * per item (lazy == 0), or published every 256 items and before each wait on an empty
 * ring (lazy == 1: the host sees every completion as soon as the consumer would idle). */
__kernel void consume_counted(__global svmkit_wq *q, __global atomic_long *counts, int lazy)
{
    WQ_ITEM x;
    long s = 0, done = 0;
    for (;;) {
        if (!wq_try_pop(q, &x)) {
            if (lazy)
                atomic_store_explicit(&counts[0], done, memory_order_release, SVMKIT_SCOPE);
            if (!wq_pop(q, &x))
                break;
        }
        s += x * 2 + 1;
        done++;
        if (!lazy)
            atomic_fetch_add_explicit(&counts[0], 1, memory_order_release, SVMKIT_SCOPE);
        else if ((done & 255) == 0)
            atomic_store_explicit(&counts[0], done, memory_order_release, SVMKIT_SCOPE);
    }
    atomic_store_explicit(&counts[1], s, memory_order_release, SVMKIT_SCOPE);
}

/* The sweep's work: item = iterations of a dependent integer loop (no memory traffic). */
inline long spin(long iterations)
{
    ulong h = (ulong)iterations;
    for (long i = 0; i < iterations; i++)
        h = h * 6364136223846793005UL + 1442695040888963407UL;
    return (long)(h & 0x7fffffff);
}

__kernel void spin_group(__global svmkit_wq *work, __global svmkit_wq *results)
{
    __local WQ_ITEM in[16], out[16];
    __local int scratch;
    int k;
    while ((k = wq_group_pop(work, in, 16, &scratch)) > 0) {
        for (int i = get_local_id(0); i < k; i += get_local_size(0))
            out[i] = spin(in[i]);
        if (wq_group_push(results, out, k, &scratch) < k)
            break;
    }
}

/* The ceiling of any per-item claim: every work-item fetch-adds one shared counter (what a
 * claim of one position costs, without the queue's slots). */
__kernel void shared_counter(__global atomic_ulong *counter, ulong n, __global ulong *sums)
{
    ulong s = 0, pos;
    while ((pos = atomic_fetch_add_explicit(counter, (ulong)1, memory_order_relaxed,
                                            SVMKIT_SCOPE)) < n)
        s += pos;
    sums[get_global_id(0)] = s;
}

__kernel void echo(__global svmkit_wq *in, __global svmkit_wq *out)
{
    WQ_ITEM x;
    while (wq_pop(in, &x))
        if (!wq_push(out, x * 2 + 1))
            break;
}
"""

BATCH_KERNEL = r"""
__kernel void process(__global const long *in, __global long *out)
{
    size_t i = get_global_id(0);
    out[i] = in[i] * 2 + 1;
}

inline long spin(long iterations)
{
    ulong h = (ulong)iterations;
    for (long i = 0; i < iterations; i++)
        h = h * 6364136223846793005UL + 1442695040888963407UL;
    return (long)(h & 0x7fffffff);
}

__kernel void spin_launch(__global const long *in, __global long *out)
{
    size_t i = get_global_id(0);
    out[i] = spin(in[i]);
}
"""

BATCHES = (1, 64, 4096)
# Targets on the 2-core PoCL machine (fine-grain atomics) and on a coarse-only GPU.
TARGET_QUEUE = {1: 1e6, 64: 10e6, 4096: 60e6}
TARGET_RT_P50, TARGET_RT_P99 = 2.0, 20.0  # µs
TARGET_SPEEDUP = 10.0  # queue vs launch-per-batch at batches 1 and 64
TARGET_COARSE_4096 = 100e6  # items/s, pipelined, coarse-grain-only device
TARGET_COARSE_P50 = 1.10  # sync p50 per batch within 10% of raw PyOpenCL's
TARGET_COUNTED = 60e6  # per-item wq_pop with completion counting (PoCL)
TARGET_STREAM, TARGET_LAT_POCL, TARGET_LAT = 1.5, 10.0, 5.0  # the demo's comparisons


def progress(msg: str) -> None:
    _common.progress("workqueue", msg)


def wait_done(event: cl.Event) -> None:
    event.wait()


# The consumer kernels of the throughput rows, and their labels.
AHEAD = "wq_pop_ahead (claims of 64)"
CONSUMERS = (
    ("consume_each", "wq_pop"),
    ("consume_ahead", AHEAD),
    ("consume_runs", "wq_pop_many"),
)


def queue_throughput(
    ctx: cl.Context, queue: cl.CommandQueue, prg: cl.Program, kernel: str, batch: int, n: int
) -> float:
    """Items/s from one host producer to a persistent consumer kernel (end to end)."""
    wq = sk.WorkQueue(ctx, 1 << 16)
    gs, ls = sk.persistent_grid(queue, host_threads=1)
    sums = sk.zeros(ctx, gs[0], np.int64, policy=sk.Policy.fine())
    event = sk.launch(queue, cl.Kernel(prg, kernel), gs, ls, wq, sums)
    queue.flush()
    wq.push(0)  # wait until the consumer runs
    while len(wq):
        time.sleep(0)
    data = np.arange(n, dtype=np.int64)
    start = time.perf_counter()
    if batch == 1:
        push = wq.push
        for x in data.tolist():
            push(x)
    else:
        push_many = wq.push_many
        for i in range(0, n, batch):
            push_many(data[i : i + batch])
    wq.close()
    event.wait()
    elapsed = time.perf_counter() - start
    expected = int((data * 2 + 1).sum()) + 1
    got = int(sums.host.sum())
    if got != expected:
        raise SystemExit(f"consumer checksum {got} != {expected}: items lost or duplicated")
    return n / elapsed


def profile_sides(
    ctx: cl.Context, queue: cl.CommandQueue, prg: cl.Program, kernel: str, batch: int, n: int
) -> tuple[float, float]:
    """Each side alone: host push_many into an idle ring, then a kernel draining it."""
    wq = sk.WorkQueue(ctx, 1 << int(np.ceil(np.log2(n))))
    data = np.arange(n, dtype=np.int64)
    start = time.perf_counter()
    for i in range(0, n, batch):
        wq.push_many(data[i : i + batch])
    host_rate = n / (time.perf_counter() - start)
    wq.close()
    sums = sk.zeros(ctx, 1, np.int64, policy=sk.Policy.fine())
    event = sk.launch(queue, cl.Kernel(prg, kernel), (1,), (1,), wq, sums)
    event.wait()
    device_s = (event.profile.end - event.profile.start) * 1e-9
    if int(sums.host[0]) != int((data * 2 + 1).sum()):
        raise SystemExit("drain checksum mismatch")
    return host_rate, n / device_s


def shared_counter_rate(
    ctx: cl.Context, queue: cl.CommandQueue, prg: cl.Program, n: int
) -> tuple[float, int]:
    """Claims/s when the persistent grid's work-items fetch-add one shared counter (the
    per-item consumers' claim alone), and how many work-items did."""
    gs, _ = sk.persistent_grid(queue, host_threads=1)
    counter = sk.zeros(ctx, 1, np.uint64, policy=sk.Policy.fine(atomics=True))
    sums = sk.zeros(ctx, gs[0], np.uint64, policy=sk.Policy.fine())
    event = sk.launch(
        queue, cl.Kernel(prg, "shared_counter"), gs, (1,), counter, np.uint64(n), sums
    )
    event.wait()
    if int(sums.host.sum()) != n * (n - 1) // 2:
        raise SystemExit("shared counter: positions lost or duplicated")
    return n / ((event.profile.end - event.profile.start) * 1e-9), gs[0]


def round_trip(
    ctx: cl.Context, queue: cl.CommandQueue, prg: cl.Program, n: int
) -> np.ndarray[Any, Any]:
    """Microseconds from push to the device's answer popped on the host, per item."""
    into, back = sk.WorkQueue(ctx, 1024), sk.WorkQueue(ctx, 1024)
    event = sk.launch(queue, cl.Kernel(prg, "echo"), (1,), (1,), into, back)
    queue.flush()
    into.push(0)
    back.pop()
    times = np.empty(n)
    clock = time.perf_counter_ns
    push, pop = into.push, back.pop
    for i in range(n):
        t0 = clock()
        push(i)
        answer = pop()
        times[i] = clock() - t0
        if answer != 2 * i + 1:
            raise SystemExit(f"round trip {i}: got {answer}")
    into.close()
    event.wait()
    back.close()
    return times / 1e3


def counted_throughput(
    ctx: cl.Context, queue: cl.CommandQueue, prg: cl.Program, lazy: bool, n: int
) -> float:
    """Items/s, one work-item popping with wq_pop and counting completions in a fine-grain
    atomic that the host polls to know when all ``n`` are done (batches of 4096 pushed)."""
    wq = sk.WorkQueue(ctx, 1 << 16)
    counts = sk.zeros(ctx, 2, np.int64, policy=sk.Policy.fine(atomics=True))
    event = sk.launch(
        queue, cl.Kernel(prg, "consume_counted"), (1,), (1,), wq, counts, np.int32(lazy)
    )
    queue.flush()
    wq.push(0)
    while counts.host[0] < 1:
        time.sleep(0)
    data = np.arange(n, dtype=np.int64)
    start = time.perf_counter()
    for i in range(0, n, 4096):
        wq.push_many(data[i : i + 4096])
    while counts.host[0] < n + 1:
        time.sleep(0)
    elapsed = time.perf_counter() - start
    wq.close()
    event.wait()
    if int(counts.host[1]) != int((data * 2 + 1).sum()) + 1:
        raise SystemExit("counted consumer checksum mismatch")
    return n / elapsed


def demo_comparison(quick: bool) -> dict[str, Any]:
    """The demo's own run (``svmkit demo workqueue --json``), its summary object."""
    import io
    import json

    from svmkit.cli import demo_workqueue as demo

    argv = ["--json", "--no-progress"] + (["--items", "100000"] if quick else [])
    args = demo.build_parser().parse_args(argv)
    out = io.StringIO()
    if demo.run(args, out, sys.stderr) != 0:
        raise SystemExit("the demo's results did not match NumPy:\n" + out.getvalue())
    summary: dict[str, Any] = json.loads(out.getvalue().strip().splitlines()[-1])
    return summary


def calibrate_spin(ctx: cl.Context, queue: cl.CommandQueue, prg: cl.Program) -> float:
    """Iterations of the sweep's spin loop per µs on one work-item."""
    runner = BatchedLaunches(
        ctx, [queue], lambda: cl.Kernel(prg, "spin_launch"), 1, policy=sk.Policy.fine()
    )
    out = np.empty(1, np.int64)
    times = []
    for _ in range(5):
        seconds, _ = runner.run(np.array([2_000_000]), out)
        times.append(seconds)
    return 2_000_000 / (min(times) * 1e6)


def sweep_point(
    ctx: cl.Context,
    queue: cl.CommandQueue,
    prg: cl.Program,
    batch_prg: cl.Program,
    work: np.ndarray[Any, Any],
    batch: int,
) -> tuple[float, float]:
    """(queue items/s, launch-per-batch items/s) for items of ``work`` spin iterations:
    one host thread pushes batches to the work-group consumers and pops the answers."""
    n = len(work)
    wq, results = sk.WorkQueue(ctx, 4096), sk.WorkQueue(ctx, 4096)
    gs, ls = sk.persistent_grid(queue, host_threads=1, local_size=16)
    event = sk.launch(queue, cl.Kernel(prg, "spin_group"), gs, ls, wq, results)
    queue.flush()
    wq.push(1)
    results.pop()
    got: list[np.ndarray[Any, Any]] = []

    def produce() -> None:
        for i in range(0, n, batch):
            wq.push_many(work[i : i + batch])

    producer = threading.Thread(target=produce)
    start = time.perf_counter()
    producer.start()
    done = 0
    while done < n:
        part = results.pop_many(min(n - done, 4096))
        got.append(part)
        done += len(part)
    queue_s = time.perf_counter() - start
    producer.join()
    wq.close()
    event.wait()
    results.close()
    runner = BatchedLaunches(
        ctx, [queue], lambda: cl.Kernel(batch_prg, "spin_launch"), batch, policy=sk.Policy.fine()
    )
    out = np.empty(n, np.int64)
    launch_s, _ = runner.run(work, out)
    if not np.array_equal(np.sort(np.concatenate(got)), np.sort(out)):
        raise SystemExit("sweep: queue and launch results differ")
    return n / queue_s, n / launch_s


def raw_pyopencl(
    ctx: cl.Context, queue: cl.CommandQueue, batch: int, nb: int, *, svm: bool = False
) -> tuple[float, float]:
    """Raw PyOpenCL, no svmkit: copy in, launch, copy out, wait, per batch, through
    cl.Buffer objects or (``svm``) coarse-grain SVM.  Returns (items/s, p50 µs per batch)."""
    prg = cl.Program(ctx, BATCH_KERNEL).build()
    knl = cl.Kernel(prg, "process")
    mf = cl.mem_flags
    dev_in: Any
    dev_out: Any
    if svm:
        dev_in = cl.SVM(cl.csvm_empty(ctx, batch, np.int64))
        dev_out = cl.SVM(cl.csvm_empty(ctx, batch, np.int64))
    else:
        dev_in = cl.Buffer(ctx, mf.READ_ONLY, batch * 8)
        dev_out = cl.Buffer(ctx, mf.WRITE_ONLY, batch * 8)
    knl.set_args(dev_in, dev_out)
    data = np.arange(batch * nb, dtype=np.int64)
    host_out = np.empty(batch, np.int64)
    lat = np.empty(nb)
    start = time.perf_counter()
    for j in range(nb):
        t0 = time.perf_counter_ns()
        cl.enqueue_copy(queue, dev_in, data[j * batch : (j + 1) * batch], is_blocking=False)
        cl.enqueue_nd_range_kernel(queue, knl, (batch,), None)
        cl.enqueue_copy(queue, host_out, dev_out, is_blocking=True)
        lat[j] = (time.perf_counter_ns() - t0) / 1e3
        if host_out[-1] != 2 * data[(j + 1) * batch - 1] + 1:
            raise SystemExit("raw PyOpenCL results are wrong")
    return nb * batch / (time.perf_counter() - start), float(np.median(lat))


DRAIN_GROUP = r"""
#include "svmkit_workqueue.h"
__kernel void drain_group(__global svmkit_wq *q, __global long *sums)
{
    __local WQ_ITEM in[64];
    __local int scratch;
    long s = 0;
    int k;
    while ((k = wq_group_pop(q, in, 64, &scratch)) > 0)
        for (int i = get_local_id(0); i < k; i += get_local_size(0))
            s += in[i];
    sums[get_global_id(0)] = s;
}
"""


def producer_rows(
    ctx: cl.Context, queue: cl.CommandQueue, repeat: int, scale: float
) -> list[tuple[str, str, str, str]]:
    """push_many of batches of 320 into a 1,024-slot ring a kernel drains (work-group
    claims of 64), against the same items into an idle ring that holds them all: what the
    producer's waits for the device cost (its wait spins while the device moves)."""
    prg = sk.build_program(ctx, DRAIN_GROUP)
    n = max(3200, int(320_000 * scale) // 320 * 320)
    items = np.arange(n, dtype=np.int64)
    gs, ls = sk.persistent_grid(queue, host_threads=1, local_size=64)
    drained, idle = [], []
    for r in range(max(3, repeat)):
        progress(f"producer: push_many into a drained and an idle ring, run {r + 1}")
        wq = sk.WorkQueue(ctx, 1024)
        sums = sk.zeros(ctx, gs[0], np.int64, policy=sk.Policy.fine())
        event = sk.launch(queue, cl.Kernel(prg, "drain_group"), gs, ls, wq, sums)
        queue.flush()
        start = time.perf_counter()
        for lo in range(0, n, 320):
            wq.push_many(items[lo : lo + 320])
        drained.append(time.perf_counter() - start)
        wq.close()
        wait_done(event)
        assert int(sums.host.sum()) == int(items.sum())
        big = sk.WorkQueue(ctx, 1 << max(10, (n - 1).bit_length()))
        start = time.perf_counter()
        for lo in range(0, n, 320):
            big.push_many(items[lo : lo + 320])
        idle.append(time.perf_counter() - start)
        assert len(big) == n
    d, i = statistics.median(drained), statistics.median(idle)
    return [
        (
            f"producer: push_many of {n:,} items (batches of 320) into a 1,024-slot ring a "
            "kernel drains / into an idle ring",
            f"{1e3 * d:.2f} / {1e3 * i:.2f} ms ({fmt_rate(n / d)} / {fmt_rate(n / i)})",
            "(the device's pace)",
            "",
        )
    ]


TASK_GOALS = {  # (tasks, workload): (queue vs launches+copies, queue vs launches no copies)
    (3200, "mixed"): (1.5, None),
    (3200, "light"): (1.5, None),
    (32000, "mixed"): (2.0, 1.3),
    (32000, "light"): (2.0, 1.3),
}


def task_rows(
    ctx: cl.Context, queue: cl.CommandQueue, rounds: int, quick: bool
) -> list[tuple[str, str, str, str]]:
    """``svmkit demo tasks``'s workload (svmkit.cli.demo_tasks): the queue against one
    launch per batch with and without copies, every element checked, interleaved rounds."""
    from svmkit.cli import demo_tasks

    counts = (3200, 32000)
    bench = demo_tasks.TaskBench(ctx, queue, max(counts))
    medians, ok = demo_tasks.measure(bench, counts, rounds, seed=0, err=sys.stderr)
    if not ok:
        raise SystemExit("task queue: a result differs from NumPy's")
    rows = []
    for (n, name), m in medians.items():
        label = f"{n:,} {'light' if name == 'light' else 'mixed (a quarter heavy)'} tasks"
        q = m["queue"]
        copies, plain = TASK_GOALS[(n, name)]
        rows.append(
            (
                f"tasks: {label}, queue (claims of 64, 1,024-slot ring)",
                f"{1e3 * q:.2f} ms",
                "",
                "",
            )
        )
        for variant, goal in (("launches+copies", copies), ("launches", plain)):
            what = "with a copy in and out" if variant == "launches+copies" else "no copies"
            ratio = m[variant] / q
            rows.append(
                (
                    f"tasks: {label}, launch per batch {what} / queue",
                    f"{1e3 * m[variant]:.2f} ms, {ratio:.2f}x",
                    f">= {goal}x" if goal else "",
                    ("met" if ratio >= goal else "MISSED") if goal else "",
                )
            )
    return rows


def machine_notes(ctx: cl.Context) -> list[str]:
    from svmkit.workqueue import ring

    return _common.machine_notes(ctx, f" (host atomics: {ring.available_backends()[0]})")


def fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M/s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer items (a smoke run)")
    ap.add_argument("--repeat", type=int, default=None, help="runs per row (median)")
    ap.add_argument(
        "--write", action="store_true", help="rewrite this script's section of RESULTS.md"
    )
    ap.add_argument(
        "--tasks-only",
        action="store_true",
        help="only the producer and task-queue rows (not with --write)",
    )
    args = ap.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 3)
    scale = 0.1 if args.quick else 1.0
    if args.tasks_only and args.write:
        ap.error("--write rewrites the whole table: run it without --tasks-only")

    ctx = sk.create_context()
    queue = cl.CommandQueue(ctx)
    if args.tasks_only:
        rows = producer_rows(ctx, queue, repeat, scale)
        rows += task_rows(ctx, queue, rounds=3 if args.quick else 7, quick=args.quick)
        sys.stdout.write(render(rows, machine_notes(ctx), args.quick))
        return 0
    caps = sk.capabilities(ctx)
    fine = caps.fine_grain_buffer and caps.atomics
    pocl = "Portable Computing Language" in ctx.devices[0].platform.name
    rows: list[tuple[str, str, str, str]] = []  # (what, measured, target, verdict)
    notes: list[str] = []

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    queue_rates: dict[tuple[str, int], float] = {}
    if fine:
        prg = sk.build_program(ctx, KERNELS)
        sizes = {
            1: int(1_000_000 * scale),
            64: int(8_000_000 * scale),
            4096: int(40_000_000 * scale),
        }
        for kernel, label in CONSUMERS:
            for b in BATCHES:
                n = max(b, sizes[b] // b * b)
                runs = []
                for r in range(repeat):
                    progress(f"queue {label} batch {b}: run {r + 1}/{repeat} ({n} items)")
                    runs.append(queue_throughput(ctx, queue, prg, kernel, b, n))
                rate = statistics.median(runs)
                queue_rates[(label, b)] = rate
                rows.append(
                    (
                        f"WorkQueue host->device, push batch {b}, consumer {label}",
                        fmt_rate(rate),
                        f">= {fmt_rate(TARGET_QUEUE[b])}",
                        verdict(rate >= TARGET_QUEUE[b]),
                    )
                )
        drain: dict[str, float] = {}
        prof_queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        for kernel, label in CONSUMERS:
            progress(f"profile: each side alone ({label})")
            host_rate, dev_rate = profile_sides(
                ctx, prof_queue, prg, kernel, 4096, int(4_000_000 * scale)
            )
            if label == "wq_pop":  # (the host side does not depend on the consumer)
                rows.append(
                    ("profile: host push_many(4096) into an idle ring", fmt_rate(host_rate), "", "")
                )
            rows.append(
                (
                    f"profile: one work-item draining a full ring with {label}",
                    fmt_rate(dev_rate),
                    "",
                    "",
                )
            )
            drain[label] = dev_rate
        progress("profile: the persistent grid fetch-adding one shared counter")
        claims, items = shared_counter_rate(ctx, prof_queue, prg, int(20_000_000 * scale))
        rows.append(
            (
                f"profile: {items} work-item(s) fetch-adding one shared counter (a per-item "
                "claim's ceiling)",
                fmt_rate(claims),
                "",
                "",
            )
        )
        concurrent = queue_rates[("wq_pop", 4096)]
        rows.append(
            (
                "per-item wq_pop at batch 4096 / its uncontended drain rate",
                f"{concurrent / drain['wq_pop']:.0%}",
                ">= 90%",
                verdict(concurrent >= 0.9 * drain["wq_pop"]),
            )
        )
        ahead = queue_rates[(AHEAD, 4096)]
        rows.append(
            (
                f"per-item {AHEAD} at batch 4096 / one work-item draining a full ring with wq_pop",
                f"{ahead / drain['wq_pop']:.0%}",
                ">= 90%",
                verdict(ahead >= 0.9 * drain["wq_pop"]),
            )
        )
        n_counted = int(4_000_000 * scale)
        for lazy, how in ((False, "per item"), (True, "when idle and every 256")):
            runs = []
            for r in range(repeat):
                progress(f"per-item wq_pop, completions counted {how}: run {r + 1}/{repeat}")
                runs.append(counted_throughput(ctx, queue, prg, lazy, n_counted))
            rate = statistics.median(runs)
            rows.append(
                (
                    f"per-item wq_pop at batch 4096, completions counted {how} (host polls)",
                    fmt_rate(rate),
                    f">= {fmt_rate(TARGET_COUNTED)} (PoCL)",
                    verdict(rate >= TARGET_COUNTED) if pocl else "",
                )
            )
        notes.append(
            "Profile of the per-item consumer at batch 4096: each side alone is fast (host "
            "push_many into an idle ring, one work-item draining a full ring), so the "
            "concurrent rate is bound by coherence traffic: the consumer trails the producer, "
            "and each item costs a compare-exchange on head plus acquire loads of slot lines "
            "the host is writing at that moment. Several consumers also share head: a claim "
            "that loses the compare-exchange takes the next position with one fetch-add (no "
            "retries), and the shared-counter row is the rate of fetch-adds alone on one "
            "line, the ceiling of any per-item claim with this many work-items. "
            "wq_pop_ahead and wq_pop_many claim a run with one compare-exchange and read it "
            "line by line: per item, wq_pop_ahead hands out the run it claimed, so its "
            "consumers meet on head once per run."
        )
        progress("round trip")
        rt = round_trip(ctx, queue, prg, int(50_000 * scale))
        p50, p99 = np.percentile(rt, [50, 99])
        rows.append(
            (
                "WorkQueue round trip (push, device answers, pop) p50",
                f"{p50:.2f} µs",
                f"<= {TARGET_RT_P50} µs",
                verdict(p50 <= TARGET_RT_P50),
            )
        )
        rows.append(
            (
                "WorkQueue round trip p99",
                f"{p99:.2f} µs",
                f"<= {TARGET_RT_P99} µs",
                verdict(p99 <= TARGET_RT_P99),
            )
        )
    else:
        notes.append(
            f"{caps.name}: no fine-grain buffer SVM with atomics, so the WorkQueue "
            "rows are skipped; the batched coarse-grain rows are svmkit's fallback."
        )

    if fine:
        progress("the demo's comparisons (svmkit demo workqueue)")
        summary = demo_comparison(args.quick)
        stream = summary["throughput"]["queue"] / summary["throughput"]["launches"]
        lat = summary["latency_us"]["launch_p50"] / summary["latency_us"]["queue_p50"]
        target_lat = TARGET_LAT_POCL if pocl else TARGET_LAT
        rows += [
            (
                "demo stream, batches of 16: queue / one launch per batch",
                f"{stream:.1f}x ({fmt_rate(summary['throughput']['queue'])} vs "
                f"{fmt_rate(summary['throughput']['launches'])})",
                f">= {TARGET_STREAM}x",
                verdict(stream >= TARGET_STREAM),
            ),
            (
                "demo latency, single light items: launch p50 / queue p50",
                f"{lat:.1f}x ({summary['latency_us']['launch_p50']:.2f} vs "
                f"{summary['latency_us']['queue_p50']:.2f} µs)",
                f">= {target_lat:.0f}x",
                verdict(lat >= target_lat),
            ),
        ]
        batch_prg = cl.Program(ctx, BATCH_KERNEL).build()
        per_us = calibrate_spin(ctx, queue, batch_prg)
        rng = np.random.default_rng(0)
        for mean_us in (1, 10, 100, 1000):
            for irregular in (False, True):
                n = max(64, int((0.03 if args.quick else 0.15) * 1e6 / mean_us) // 16 * 16)
                us = rng.exponential(mean_us, n) if irregular else np.full(n, float(mean_us))
                work = np.maximum(1, us * per_us).astype(np.int64)
                kind = "irregular (exponential)" if irregular else "regular"
                progress(f"sweep: {mean_us} µs per item, {kind}, {n} items")
                q_rate, l_rate = sweep_point(ctx, queue, prg, batch_prg, work, 16)
                rows.append(
                    (
                        f"sweep: {mean_us} µs per item, {kind}, batches of 16: queue vs launches",
                        f"{fmt_rate(q_rate)} vs {fmt_rate(l_rate)} ({q_rate / l_rate:.2f}x)",
                        "",
                        "queue wins" if q_rate > l_rate else "launches win",
                    )
                )
        notes.append(
            "Sweep: items spin a dependent integer loop for the given time (calibrated on one "
            "work-item; irregular: exponentially distributed, same mean). The queue side is "
            "one persistent work-group per compute unit left after one host thread "
            "(sk.persistent_grid(host_threads=1)), so on a CPU device launches, which use "
            "every core, win once an item's work dwarfs a launch's fixed cost."
        )

    base_rates: dict[tuple[int, int], float] = {}
    base_p50: dict[tuple[int, int], float] = {}
    counts = {1: int(20_000 * scale), 64: int(20_000 * scale), 4096: int(4_000 * scale)}
    batch_prg = cl.Program(ctx, BATCH_KERNEL).build()
    queues = [queue, cl.CommandQueue(ctx)]
    for depth, nq in ((1, 1), (4, 1), (8, 1), (8, 2)):
        for b in BATCHES:
            nb = max(8, counts[b])
            data = np.arange(nb * b, dtype=np.int64)
            runner = BatchedLaunches(
                ctx, queues[:nq], lambda: cl.Kernel(batch_prg, "process"), b, depth=depth
            )
            results = np.empty(nb * b, np.int64)
            runner.run(data[: b * 4], results)  # warm up (first launches)
            runs, lats = [], []
            for r in range(repeat):
                progress(f"launch-per-batch depth {depth} x{nq} queues batch {b}: run {r + 1}")
                seconds, lat = runner.run(data, results)
                if not np.array_equal(results, data * 2 + 1):
                    raise SystemExit("launch-per-batch results are wrong")
                runs.append(len(data) / seconds)
                lats.append(lat)
            key = (depth * 10 + nq, b)
            base_rates[key] = statistics.median(runs)
            base_p50[key] = float(np.median(np.concatenate(lats)))
            name = "sync" if depth == 1 else f"pipelined x{depth}"
            if nq > 1:
                name += f", {nq} queues"
            target, ok = "(baseline)", ""
            if not fine and b == 4096 and depth > 1:
                target = f">= {fmt_rate(TARGET_COARSE_4096)}"
                ok = verdict(base_rates[key] >= TARGET_COARSE_4096)
            rows.append(
                (f"launch-per-batch ({name}), batch {b}", fmt_rate(base_rates[key]), target, ok)
            )
            rows.append(
                (
                    f"launch-per-batch ({name}), batch {b}: p50 per batch",
                    f"{base_p50[key]:.1f} µs",
                    "",
                    "",
                )
            )
    raw_rate, raw_p50 = raw_pyopencl(ctx, queue, 4096, max(8, counts[4096]))
    svm_rate, svm_p50 = raw_pyopencl(ctx, queue, 4096, max(8, counts[4096]), svm=True)
    sync_p50 = base_p50[(11, 4096)]
    rows.append(
        ("raw PyOpenCL copy + launch + copy (cl.Buffer), batch 4096", fmt_rate(raw_rate), "", "")
    )
    rows.append(
        (
            "raw PyOpenCL copy + launch + copy (coarse SVM), batch 4096",
            f"{fmt_rate(svm_rate)}, p50 {svm_p50:.1f} µs",
            "",
            "",
        )
    )
    rows.append(
        (
            "batched sync p50 per batch 4096 / raw PyOpenCL's on the same SVM",
            f"{sync_p50 / svm_p50:.2f} ({sync_p50:.1f} vs {svm_p50:.1f} µs)",
            "(svmkit's own share)",
            "",
        )
    )
    rows.append(
        (
            "batched sync p50 per batch 4096 / raw PyOpenCL's",
            f"{sync_p50 / raw_p50:.2f} ({sync_p50:.1f} vs {raw_p50:.1f} µs)",
            f"<= {TARGET_COARSE_P50:.2f}",
            verdict(sync_p50 <= TARGET_COARSE_P50 * raw_p50) if not fine else "",
        )
    )
    if fine:
        for b in (1, 64):
            best = max(queue_rates[("wq_pop", b)], queue_rates[("wq_pop_many", b)])
            ratio = best / base_rates[(11, b)]
            rows.append(
                (
                    f"WorkQueue / launch-per-batch (sync), batch {b}",
                    f"{ratio:.0f}x",
                    f">= {TARGET_SPEEDUP:.0f}x",
                    verdict(ratio >= TARGET_SPEEDUP),
                )
            )

    if fine:
        rows += producer_rows(ctx, queue, repeat, scale)
        rows += task_rows(ctx, queue, rounds=3 if args.quick else 7, quick=args.quick)

    notes = machine_notes(ctx) + notes
    table = render(rows, notes, args.quick)
    sys.stdout.write(table)
    if args.write:
        write_results(table, ctx)
    return 0


def render(rows: list[tuple[str, str, str, str]], notes: list[str], quick: bool) -> str:
    width = max(len(r[0]) for r in rows)
    lines = [
        "",
        f"| {'measurement':<{width}} | measured | target | |",
        f"|{'-' * (width + 2)}|---:|---|---|",
    ]
    for what, measured, target, ok in rows:
        lines.append(f"| {what:<{width}} | {measured} | {target} | {ok} |")
    lines.append("")
    lines += [f"- {n}" for n in notes]
    lines.append(
        f"- `python benchmarks/workqueue.py{' --quick' if quick else ''}`, "
        f"{time.strftime('%Y-%m-%d')}; medians; every queue run verified by "
        "checksum, every baseline batch element by element."
    )
    return "\n".join(lines) + "\n"


def write_results(table: str, ctx: cl.Context) -> None:
    section, suffix = _common.section_name("workqueue", ctx)
    path = _common.write_section(section, f"Work queue{suffix} (`benchmarks/workqueue.py`)", table)
    progress(f"updated {path} ({section})")


if __name__ == "__main__":
    raise SystemExit(main())
