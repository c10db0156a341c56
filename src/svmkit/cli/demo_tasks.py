"""``svmkit demo tasks``: a task queue in fine-grain SVM against one launch per batch.

The workload is the task queue heterogeneous benchmark suites publish: tasks of one
work-group of 64 work-items each, a quarter of them heavy (50 read-modify-write passes over
the group's 64 ints; the rest one pass), published by one host thread in batches of 320
into a ring of 1,024 slots; a persistent kernel claims them (``wq_group_pop``, claims of 64:
the pattern ``svmkit_workqueue.h`` recommends) and runs each with its whole work-group.  A
task is a record ``{int id; int op}`` (``sk.WorkQueue(ctx, 1024, TASK)``, the struct declared
by ``sk.WorkQueue.source_for(TASK)``), and one queue serves every round (``reopen()``).

The comparisons, same run, rounds that alternate the three (medians):

* launches with copies: each batch copied into coarse-grain SVM (its tasks and its tasks'
  data), one launch of one work-group per task, the data copied back: what the same program
  does on memory that is not shared;
* launches without copies: the same launches on the fine-grain memory the queue uses (the
  host writes each batch's tasks in place).

Every element of every run is checked against NumPy (exit status 1 on any mismatch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
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

__all__ = ["TASK", "TaskBench", "main", "make_tasks", "reference"]

PROG = "svmkit demo tasks"
TASK = np.dtype([("id", np.int32), ("op", np.int32)], align=True)
GROUP = 64  # work-items per task
HEAVY_PASSES = 50
VARIANTS = ("queue", "launches+copies", "launches")


def make_tasks(n: int, heavy: float, seed: int) -> np.ndarray[Any, Any]:
    """Tasks 0..n-1 in order; a ``heavy`` fraction of them (chosen at random) heavy."""
    tasks = np.zeros(n, TASK)
    tasks["id"] = np.arange(n)
    tasks["op"] = np.random.default_rng(seed).random(n) < heavy
    return tasks


def initial_data(n: int) -> np.ndarray[Any, Any]:
    """Each task's 64 ints before it runs."""
    data: np.ndarray[Any, Any] = np.arange(n * GROUP, dtype=np.uint32) * np.uint32(2654435761)
    return data


def reference(tasks: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The data after every task ran, with NumPy (uint32 arithmetic wraps as OpenCL's)."""
    data = initial_data(len(tasks)).reshape(len(tasks), GROUP)
    passes = np.where(tasks["op"] != 0, HEAVY_PASSES, 1)
    for p in range(HEAVY_PASSES):
        rows = passes > p
        data[rows] = data[rows] * np.uint32(1664525) + np.uint32(1013904223) + np.uint32(p)
    return data.reshape(-1)


def program_source(claim: int) -> str:
    """The task kernels' source for claims of ``claim`` tasks (the record's C prelude first)."""
    return (
        WorkQueue.source_for(TASK)
        + f"#define CLAIM {claim}\n"
        + '#include "svmkit_workqueue.h"\n'
        + (kernels_dir() / "tasks_demo.cl").read_text()
    )


class TaskBench:
    """The three ways to run a task list, on memory allocated once for ``n_max`` tasks."""

    def __init__(
        self,
        ctx: cl.Context,
        queue: cl.CommandQueue,
        n_max: int,
        *,
        ring: int = 1024,
        batch: int = 320,
        claim: int = 64,
        host_cores: int = 1,
    ) -> None:
        self.queue, self.batch = queue, batch
        program = build_program(ctx, program_source(claim))
        self.consumer = program.run_tasks
        self.batch_kernel = program.run_batch
        self.wq = WorkQueue(ctx, ring, TASK)
        self.grid = persistent_grid(queue, host_threads=host_cores, local_size=GROUP)
        fine = Policy.fine()
        self.data = empty(ctx, n_max * GROUP, np.uint32, policy=fine)
        self.fine_tasks = empty(ctx, n_max, TASK, policy=fine)
        coarse = Policy.coarse()
        self.dev_data = empty(ctx, n_max * GROUP, np.uint32, policy=coarse)
        self.dev_tasks = empty(ctx, n_max, TASK, policy=coarse)
        self.host_out = np.empty(n_max * GROUP, np.uint32)

    def _batches(self, n: int) -> range:
        return range(0, n, self.batch)

    def run_queue(self, tasks: np.ndarray[Any, Any]) -> tuple[float, np.ndarray[Any, Any]]:
        """The persistent kernel fed through the queue: seconds, and the data."""
        n = len(tasks)
        self.data.host[: n * GROUP] = initial_data(n)
        wq = self.wq
        if wq.closed:
            wq.reopen()
        start = time.perf_counter()
        event = launch(self.queue, self.consumer, *self.grid, wq, self.data)
        calls.flush(self.queue)
        for lo in self._batches(n):
            wq.push_many(tasks[lo : lo + self.batch])
        wq.close()
        calls.wait(event)
        return time.perf_counter() - start, self.data.host[: n * GROUP]

    def run_launches(
        self, tasks: np.ndarray[Any, Any], copies: bool
    ) -> tuple[float, np.ndarray[Any, Any]]:
        """One launch per batch (one work-group per task), with a copy in and out per batch
        through coarse-grain SVM, or in place on fine-grain SVM: seconds, and the data."""
        n, q, b = len(tasks), self.queue, self.batch
        host_data = initial_data(n)
        if not copies:
            self.data.host[: n * GROUP] = host_data
        kernel = self.batch_kernel
        start = time.perf_counter()
        event = None
        for lo in self._batches(n):
            hi = min(n, lo + b)
            rows = slice(lo * GROUP, hi * GROUP)
            if copies:
                copy(q, self.dev_tasks[lo:hi], tasks[lo:hi], blocking=False)
                copy(q, self.dev_data[rows], host_data[rows], blocking=False)
                launch(
                    q,
                    kernel,
                    ((hi - lo) * GROUP,),
                    (GROUP,),
                    self.dev_tasks,
                    np.int32(lo),
                    self.dev_data,
                )
                event = copy(q, self.host_out[rows], self.dev_data[rows], blocking=False)
            else:
                self.fine_tasks.host[lo:hi] = tasks[lo:hi]
                event = launch(
                    q,
                    kernel,
                    ((hi - lo) * GROUP,),
                    (GROUP,),
                    self.fine_tasks,
                    np.int32(lo),
                    self.data,
                )
            calls.flush(q)
        if event is not None:
            calls.wait(event)
        elapsed = time.perf_counter() - start
        return elapsed, (self.host_out if copies else self.data.host)[: n * GROUP]

    def run(self, variant: str, tasks: np.ndarray[Any, Any]) -> tuple[float, np.ndarray[Any, Any]]:
        if variant == "queue":
            return self.run_queue(tasks)
        return self.run_launches(tasks, copies=variant == "launches+copies")


WORKLOADS = (("mixed", 0.25), ("light", 0.0))


def measure(
    bench: TaskBench, counts: Sequence[int], rounds: int, seed: int, err: TextIO | None = None
) -> tuple[dict[tuple[int, str], dict[str, float]], bool]:
    """Median seconds per (count, workload) and variant over ``rounds`` interleaved rounds
    (each round runs the variants in a rotated order), and whether every run matched."""
    cases = [(n, name, make_tasks(n, heavy, seed + n)) for n in counts for name, heavy in WORKLOADS]
    refs = {(n, name): reference(tasks) for n, name, tasks in cases}
    times: dict[tuple[int, str], dict[str, list[float]]] = {
        (n, name): {v: [] for v in VARIANTS} for n, name, _ in cases
    }
    ok = True
    for r in range(rounds + 1):  # round 0 warms up (builds, first launches): not counted
        for n, name, tasks in cases:
            order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
            for variant in order:
                seconds, data = bench.run(variant, tasks)
                if not np.array_equal(data, refs[(n, name)]):
                    ok = False
                    if err is not None:
                        bad = int(np.count_nonzero(data != refs[(n, name)]))
                        err.write(f"{PROG}: {variant}, {n} {name} tasks: {bad} wrong elements\n")
                if r:
                    times[(n, name)][variant].append(seconds)
        if err is not None:
            err.write(f"{PROG}: round {r}/{rounds} done\n")
    medians = {
        key: {v: statistics.median(ts) for v, ts in per.items()} for key, per in times.items()
    }
    return medians, ok


def table(medians: dict[tuple[int, str], dict[str, float]], tasks_heavy: dict[int, int]) -> str:
    lines = [
        "| tasks | queue | launches + copies | launches, no copies | queue vs copies | "
        "queue vs no copies |",
        "|---|---|---|---|---|---|",
    ]
    for (n, name), m in medians.items():
        label = f"{n:,} light" if name == "light" else f"{n:,} ({tasks_heavy[n]:,} heavy)"
        q, c, nc = (1e3 * m[v] for v in VARIANTS)
        lines.append(
            f"| {label} | {q:.2f} ms | {c:.2f} ms | {nc:.2f} ms | {c / q:.2f}x | {nc / q:.2f}x |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="A task queue (records in a fine-grain work queue, claims of 64 per "
        "work-group) against one launch per batch with and without copies; checked against "
        "NumPy.",
    )
    ap.add_argument("--counts", default="3200,32000", help="task counts (comma-separated)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians)")
    ap.add_argument("--batch", type=int, default=320, help="tasks per pushed batch and launch")
    ap.add_argument("--ring", type=int, default=1024, help="queue slots (a power of two)")
    ap.add_argument("--claim", type=int, default=64, help="tasks a work-group claims at once")
    ap.add_argument("--host-cores", type=int, default=1, help="cores a CPU device leaves")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="end with one JSON summary object")
    return ap


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    counts = [int(c) for c in args.counts.split(",") if c]
    if not counts or min(counts) < 1 or args.rounds < 1 or args.batch < 1 or args.claim < 1:
        err.write(f"{PROG}: counts, rounds, batch and claim must be >= 1\n")
        return 2
    ctx = create_context()
    caps = capabilities(ctx)
    device = device_label(ctx.devices[0])
    if not (caps.fine_grain_buffer and caps.atomics):
        err.write(f"{PROG}: {device} has no fine-grain buffer SVM with atomics: no work queue\n")
        return 1
    queue = calls.new_queue(ctx, ctx.devices[0])
    bench = TaskBench(
        ctx,
        queue,
        max(counts),
        ring=args.ring,
        batch=args.batch,
        claim=args.claim,
        host_cores=args.host_cores,
    )
    text = err if args.json else out  # with --json, stdout carries only the summary
    text.write(
        f"{PROG} on {device}: tasks of {GROUP} work-items, a quarter heavy ({HEAVY_PASSES} "
        f"passes) or all light, batches of {args.batch}, a {args.ring}-slot ring, claims of "
        f"{args.claim}, {bench.grid[0][0] // GROUP} consumer work-group(s)\n"
    )
    text.flush()
    medians, ok = measure(bench, counts, args.rounds, args.seed, err)
    heavy = {n: int(make_tasks(n, 0.25, args.seed + n)["op"].sum()) for n in counts}
    text.write(table(medians, heavy) + "\n")
    text.write(
        f"  verified: {'every element of every run matches NumPy' if ok else 'MISMATCH'}; "
        f"medians of {args.rounds} interleaved rounds\n"
    )
    if args.json:
        summary = {
            "device": device,
            "verified": ok,
            "ms": {
                f"{n} {name}": {v: 1e3 * t for v, t in m.items()}
                for (n, name), m in medians.items()
            },
        }
        out.write(json.dumps(summary) + "\n")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo: 0 when every result matches NumPy, 1 otherwise or on an OpenCL error,
    2 on a bad option, 130 on Ctrl-C."""
    return run_demo(PROG, build_parser(), run, argv)
