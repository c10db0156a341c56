"""svmkit on Dask: what ``map_kernel`` costs per chunk, in the task and end to end.

Rows, measured on one ``distributed.LocalCluster`` of worker processes and the same data:

* per-chunk overhead: wall time per chunk of ``map_kernel(x, axpb)`` and of
  ``x.map_blocks(numpy a * x + b)`` over many small chunks (scheduling dominates both);
* in-task time per 1 MiB chunk, measured inside a task on a worker: the whole chunk
  (copy in, kernel, copy out) and its two allocations + frees, with the worker's pool as
  the current resource and with a raw ``SVMResource`` (``sk.set_current_resource``);
* end to end: ``--mb`` of float32 through the kernel and a ``.sum()``, MB/s, for
  ``map_kernel`` and for NumPy ``map_blocks``, on 1 and on 2 worker processes.

Usage: ``python benchmarks/dask.py [--quick] [--mb MB] [--write]``.  Prints a table;
``--write`` replaces its section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# This file is named like the package it measures: take its folder off the import path
# (for this process and the worker processes it spawns) before importing dask.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
_spec = importlib.util.spec_from_file_location("_common", HERE / "_common.py")
assert _spec is not None and _spec.loader is not None
_common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_common)

import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import svmkit as sk  # noqa: E402
from svmkit.dask import SVMWorkerPlugin, map_kernel  # noqa: E402

SOURCE = """
__kernel void axpb(__global float *out, __global const float *in, float a, float b)
{ size_t i = get_global_id(0); out[i] = a * in[i] + b; }
"""
A, B = 2.0, 1.0
MiB = 1 << 20


def progress(msg: str) -> None:
    _common.progress("dask", msg)


def median_s(fn: Any, repeats: int) -> float:
    """Median wall seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cluster(workers: int) -> tuple[LocalCluster, Client]:
    c = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(c)
    client.register_plugin(SVMWorkerPlugin())
    return c, client


def in_task(reps: int, nbytes: int) -> dict[str, float]:
    """Run on a worker: median µs per chunk and per allocation pair, pooled and raw."""
    from svmkit.dask import worker
    from svmkit.dask.map_kernel import run_chunk

    state = worker.state()
    host = np.random.default_rng(0).random(nbytes // 4, dtype=np.float32)
    n = host.size

    def chunk() -> None:
        run_chunk(host, SOURCE, "axpb", (A, B), "<f4")

    def allocations() -> None:
        a = sk.empty(state.context, n, np.float32, policy=state.policy)
        b = sk.empty(state.context, n, np.float32, policy=state.policy)
        a.free()
        b.free()

    def med_us(fn: Any) -> float:
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
        return statistics.median(times) / 1e3

    out = {"pooled chunk": med_us(chunk), "pooled alloc": med_us(allocations)}
    sk.set_current_resource(sk.SVMResource(state.context, state.policy))
    try:
        out["raw chunk"] = med_us(chunk)
        out["raw alloc"] = med_us(allocations)
    finally:
        sk.set_current_resource(state.pool)
    out["device"] = state.device_name  # type: ignore[assignment]
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    repeats = 3 if args.quick else 5
    small_chunks = 64 if args.quick else 256
    n = args.mb * MiB // 4
    results: dict[str, Any] = {"mb": args.mb, "small_chunks": small_chunks}
    for workers in (1, 2):
        progress(f"{workers} worker(s): starting a LocalCluster")
        c, client = cluster(workers)
        try:
            rng = da.random.default_rng(0)
            small = rng.random(small_chunks * 1024, chunks=1024, dtype=np.float32).persist()
            big = rng.random(n, chunks=-(-n // args.chunks), dtype=np.float32).persist()
            client.wait_for_workers(workers)
            if workers == 2:
                progress("per-chunk overhead")
                results["overhead kernel"] = (
                    median_s(lambda s=small: map_kernel(s, SOURCE, "axpb", A, B).compute(), repeats)
                    / small_chunks
                )
                results["overhead numpy"] = (
                    median_s(lambda s=small: s.map_blocks(lambda b: A * b + B).compute(), repeats)
                    / small_chunks
                )
                progress("in-task times per 1 MiB chunk")
                address = sorted(client.scheduler_info()["workers"])[0]
                results["in task"] = client.submit(
                    in_task, 30 if args.quick else 100, MiB, workers=[address], pure=False
                ).result()
            progress(f"end to end, {args.mb} MB")
            results[f"e2e kernel {workers}"] = median_s(
                lambda x=big: map_kernel(x, SOURCE, "axpb", A, B).sum(dtype=np.float64).compute(),
                repeats,
            )
            results[f"e2e numpy {workers}"] = median_s(
                lambda x=big: x.map_blocks(lambda b: A * b + B).sum(dtype=np.float64).compute(),
                repeats,
            )
        finally:
            client.close()
            c.close()
    return results


def render(r: dict[str, Any], cmd: str, notes: list[str]) -> str:
    t = r["in task"]
    mb = r["mb"]
    lines = [
        "| measurement | map_kernel (svmkit) | NumPy map_blocks | svmkit / NumPy |",
        "|---|---:|---:|---:|",
        f"| per-chunk wall time, {r['small_chunks']} chunks of 4 KiB, 2 workers (ms) | "
        f"{r['overhead kernel'] * 1e3:.2f} | {r['overhead numpy'] * 1e3:.2f} | "
        f"{r['overhead kernel'] / r['overhead numpy']:.2f}x |",
    ]
    for workers in (1, 2):
        k, nump = r[f"e2e kernel {workers}"], r[f"e2e numpy {workers}"]
        lines.append(
            f"| end to end, {mb} MB kernel + sum, {workers} worker(s) (MB/s) | "
            f"{mb / k:.0f} | {mb / nump:.0f} | {nump / k:.2f}x |"
        )
    lines += [
        "",
        "| in one task, per 1 MiB chunk (median µs) | pooled (worker default) | raw "
        "SVMResource | raw / pooled |",
        "|---|---:|---:|---:|",
        f"| whole chunk: copy in, kernel, copy out | {t['pooled chunk']:.0f} | "
        f"{t['raw chunk']:.0f} | {t['raw chunk'] / t['pooled chunk']:.2f}x |",
        f"| its two allocations + frees | {t['pooled alloc']:.1f} | {t['raw alloc']:.1f} | "
        f"{t['raw alloc'] / t['pooled alloc']:.0f}x |",
        "",
        f"- 2 workers / 1 worker, map_kernel end-to-end throughput: "
        f"{r['e2e kernel 1'] / r['e2e kernel 2']:.2f}x (the workers, scheduler and client "
        f"share {os.cpu_count()} cores).",
    ]
    lines += [f"- {n}" for n in notes]
    lines.append(f"- `{cmd}`, {time.strftime('%Y-%m-%d')}; medians of repeated runs.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--mb", type=int, default=64, help="end-to-end megabytes (default 64)")
    ap.add_argument("--chunks", type=int, default=32, help="end-to-end chunks (default 32)")
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    if args.mb < 1 or args.chunks < 1:
        ap.error("--mb and --chunks must be >= 1")
    ctx = sk.create_context()
    section, suffix = _common.section_name("dask", ctx)
    results = measure(args)
    import dask
    import distributed

    notes = _common.machine_notes(
        ctx, f", Dask {dask.__version__}, distributed {distributed.__version__}"
    )
    notes.append(f"worker device: {results['in task']['device']}; 1 thread per worker")
    cmd = "python benchmarks/dask.py" + (" --quick" if args.quick else "")
    table = render(results, cmd, notes)
    print(table)
    if args.write:
        path = _common.write_section(section, f"Dask{suffix} (`benchmarks/dask.py`)", table)
        progress(f"updated {path} ({section})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("POCL_DEVICES", "pthread pthread")
    raise SystemExit(main())
