"""``svmkit demo dask``: a kernel and a reduction over a chunked array on a local cluster.

A ``distributed.LocalCluster`` of worker processes gets :class:`SVMWorkerPlugin`;
``--mb`` megabytes of float32 in ``--chunks`` chunks go through an OpenCL kernel
(``y = a * x + b``) with :func:`map_kernel` and a ``.sum()``; progress is reported per
chunk completed, then each worker's pool statistics (blocks reused from the cache), and
the result is checked against NumPy on the same data.  The exit code is non-zero on any
mismatch.

Ctrl-C: a terminal sends SIGINT to every process of the foreground group, worker processes
included, and each would print its own traceback.  The workers are therefore started with
SIGINT ignored (an ignored signal stays ignored across ``exec``, so the spawned interpreters
inherit it), and only the demo's process reacts: it quiets Dask's logging and shuts the
cluster down, and ``svmkit demo`` reports one line (exit status 130).  The demo's process
ignores SIGINT too while the workers start (a second or two): a Ctrl-C then is lost.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from svmkit.errors import InvalidValueError

__all__ = ["SOURCE", "add_arguments", "main", "run_demo"]

SOURCE = """
__kernel void axpb(__global float *out, __global const float *in, float a, float b)
{
    size_t i = get_global_id(0);
    out[i] = a * in[i] + b;
}
"""
A, B = 2.5, -1.0
TOLERANCE = 1e-6
"""Relative and absolute: the device may contract ``a * x + b`` into one fused
multiply-add, whose result differs from NumPy's in the last bit of ``a * x``."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options: ``--workers``, ``--threads``, ``--mb``, ``--chunks``, ``--seed``."""
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    parser.add_argument("--mb", type=int, default=256, help="megabytes of float32 (default 256)")
    parser.add_argument("--chunks", type=int, default=32, help="number of chunks (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _check(name: str, value: int, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidValueError(f"--{name} must be an integer >= {minimum}, got {value!r}")


@contextlib.contextmanager
def _interrupts_ignored() -> Iterator[None]:
    """SIGINT ignored while the block runs (in the main thread; elsewhere a no-op), so the
    worker processes started in it never see a Ctrl-C meant for the demo."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _quiet_dask() -> None:
    """After Ctrl-C, in the demo's process and each worker: no warnings from Dask while the
    cluster shuts down (tasks cancelled, workers stopped), the expected end of an
    interrupted run."""
    for name in ("distributed", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def run_demo(
    *,
    workers: int = 2,
    threads: int = 1,
    mb: int = 256,
    chunks: int = 32,
    seed: int = 0,
    write: Callable[[str], Any] = print,
) -> int:
    """Run the demo, reporting through ``write``; 0 when the results equal NumPy's.

    Raises :class:`~svmkit.InvalidValueError` naming the option for a bad value.
    """
    for name, value, minimum in (
        ("workers", workers, 1),
        ("threads", threads, 1),
        ("mb", mb, 1),
        ("chunks", chunks, 1),
        ("seed", seed, 0),
    ):
        _check(name, value, minimum)
    import dask.array as da
    from distributed import Client, LocalCluster, as_completed, futures_of

    from svmkit.dask import SVMWorkerPlugin, map_kernel, worker_stats

    n = mb * (1 << 20) // 4
    if n < chunks:
        raise InvalidValueError(f"--chunks {chunks} is more than the {n} elements of --mb {mb}")
    chunk = -(-n // chunks)
    write(
        f"svmkit on Dask: {mb} MB of float32 ({n} elements) in {-(-n // chunk)} chunks, "
        f"{workers} worker process(es) x {threads} thread(s)"
    )
    start = time.perf_counter()
    with _interrupts_ignored():  # the worker processes start here
        cluster = LocalCluster(
            n_workers=workers,
            threads_per_worker=threads,
            processes=True,
            dashboard_address=":0",
        )
    with cluster, Client(cluster) as client:
        try:
            client.register_plugin(SVMWorkerPlugin())
            write(f"cluster up in {time.perf_counter() - start:.1f} s: {cluster.scheduler_address}")
            x = da.random.default_rng(seed).random(n, chunks=chunk, dtype=np.float32).persist()
            t0 = time.perf_counter()
            y = map_kernel(x, SOURCE, "axpb", A, B).persist()
            parts = futures_of(y)
            step = max(1, len(parts) // 8)
            for done, _ in enumerate(as_completed(parts), 1):
                if done % step == 0 or done == len(parts):
                    write(f"  kernel: {done}/{len(parts)} chunks done")
            total = float(y.sum(dtype=np.float64).compute())
            seconds = time.perf_counter() - t0
            write(f"kernel + sum: {seconds:.2f} s ({mb / seconds:.0f} MB/s)")
            for address, stats in sorted(worker_stats(client).items()):
                write(
                    f"  {address}: {stats.get('total_allocations', 0)} allocations, "
                    f"{stats.get('upstream_allocations', 0)} from the driver, "
                    f"{stats.get('cached_bytes', 0) / 2**20:.1f} MiB cached"
                )
            host_x = x.compute()
            got = y.compute()
        except KeyboardInterrupt:
            _quiet_dask()
            with contextlib.suppress(Exception):  # the workers too, where they still answer
                client.run(_quiet_dask)
            raise
    expected = A * host_x + np.float32(B)
    same = bool(np.allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE))
    expected_total = float(expected.sum(dtype=np.float64))
    sums_agree = bool(np.isclose(total, expected_total, rtol=1e-9, atol=1e-6 * n))
    write(
        f"check against NumPy: elements {'equal' if same else 'DIFFER'}, sum {total:.6g} vs "
        f"{expected_total:.6g} ({'equal' if sums_agree else 'DIFFER'})"
    )
    return 0 if same and sums_agree else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m svmkit.dask.demo [--workers N] [--mb MB] [--chunks N]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_demo(
            workers=args.workers,
            threads=args.threads,
            mb=args.mb,
            chunks=args.chunks,
            seed=args.seed,
        )
    except InvalidValueError as exc:
        parser.error(str(exc))
    return 2  # parser.error exits


if __name__ == "__main__":
    raise SystemExit(main())
