"""The ``svmkit`` command: ``info``, ``demo NAME``, ``bench NAME``, ``--version``.

No Python traceback reaches a user (``--traceback`` shows it): a missing OpenCL platform
or a ``PYOPENCL_CTX`` that selects nothing is one line listing what exists (exit 1), an
interrupt (Ctrl-C) is one line and exit 130, any other error one line and exit 1.  Bad
options are usage errors (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from svmkit._version import __version__

__all__ = ["DEMOS", "EXIT_INTERRUPTED", "CommandError", "build_parser", "main"]

#: Demos of ``svmkit demo NAME``: each module has ``main(argv) -> int``, imported on use.
DEMOS: dict[str, str] = {
    "workqueue": "svmkit.cli.demo_workqueue",
    "tasks": "svmkit.cli.demo_tasks",
    "dask": "svmkit.dask.demo",
}

#: What each demo shows (``svmkit demo`` alone lists them).
DEMO_SUMMARIES: dict[str, str] = {
    "workqueue": "host threads feed a running kernel through a work queue",
    "tasks": "a task queue of records against one launch per batch",
    "dask": "a kernel and a reduction over a chunked array on a local Dask cluster",
}

#: Benchmark scripts of ``svmkit bench NAME`` (``benchmarks/NAME.py`` of a source checkout).
BENCHMARKS = ("ops", "pools", "workqueue")

#: What each benchmark measures (``svmkit bench`` alone lists them).
BENCHMARK_SUMMARIES: dict[str, str] = {
    "ops": "operations against raw PyOpenCL and NumPy: per-call cost and bandwidth",
    "pools": "pooled SVM allocation: median time per allocation and free",
    "workqueue": "work-queue throughput and latency against one launch per batch",
}

#: The exit status of an interrupted command (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130

DESCRIPTION = """\
OpenCL Shared Virtual Memory made practical.

  svmkit info               what SVM every OpenCL platform and device offers
  svmkit demo workqueue     host threads feed a running kernel through a work queue
  svmkit demo dask          a kernel and a reduction on a local Dask cluster
  svmkit demo tasks         a task queue of records against one launch per batch
  svmkit demo / bench       list the demos / the benchmarks
  svmkit bench NAME         run benchmarks/NAME.py of a source checkout

PYOPENCL_CTX selects the device, as in PyOpenCL.
"""


class CommandError(Exception):
    """A condition the command reports in one line, with its exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _opencl_problem() -> str | None:
    """Why no device can be opened (no platform, a ``PYOPENCL_CTX`` that selects nothing)."""
    from svmkit.driver import calls
    from svmkit.errors import SVMError

    try:
        platforms = calls.platforms()  # empty where the ICD loader lists none
    except SVMError:
        platforms = []
    if not platforms:
        return (
            "no OpenCL platform found: the ICD loader lists none "
            f"(OCL_ICD_VENDORS={os.environ.get('OCL_ICD_VENDORS', '/etc/OpenCL/vendors')}); "
            "install a driver, such as svmkit's [cpu] extra"
        )
    if os.environ.get("PYOPENCL_CTX"):
        from svmkit.capabilities import create_context
        from svmkit.errors import UnsupportedError

        try:  # a selection that matches nothing, or a device whose compiler fails
            create_context()
        except UnsupportedError as exc:
            return str(exc)
    return None


def _require_device() -> None:
    problem = _opencl_problem()
    if problem is not None:
        raise CommandError(problem)


def _asks_for_help(argv: Sequence[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in argv)


def _info(args: argparse.Namespace) -> int:
    from svmkit.cli.info import collect, render_table

    report = collect()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif report["platforms"]:
        sys.stdout.write(render_table(report))
    problem = _opencl_problem()
    if problem is not None:
        raise CommandError(problem)
    return 0


def _choices(command: str, summaries: dict[str, str]) -> int:
    """``svmkit demo`` or ``svmkit bench`` without a name: list what it runs."""
    width = max(len(name) for name in summaries)
    sys.stdout.write(f"usage: svmkit {command} NAME [options]   (svmkit {command} NAME --help)\n")
    sys.stdout.write(f"{'demos' if command == 'demo' else 'benchmarks'}:\n")
    for name, summary in summaries.items():
        sys.stdout.write(f"  {name.ljust(width)}  {summary}\n")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.demo is None:
        return _choices("demo", DEMO_SUMMARIES)
    module_name = DEMOS[args.demo]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] in ("dask", "distributed"):
            raise CommandError(
                f"demo {args.demo!r} needs Dask: pip install 'svmkit[dask]'", status=1
            ) from exc
        if exc.name is None or not module_name.startswith(exc.name):
            raise  # the demo exists but needs something missing: reported as an error
        raise CommandError(
            f"demo {args.demo!r} is not part of this installation ({module_name} is missing)",
            status=2,
        ) from exc
    if not _asks_for_help(args.demo_args):
        _require_device()
    return int(module.main(args.demo_args))


def _bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    if args.which is None:
        return _choices("bench", BENCHMARK_SUMMARIES)
    script = Path.cwd() / "benchmarks" / f"{args.which}.py"
    if not script.is_file():
        raise CommandError(f"{script} not found (run from a source checkout)", status=2)
    if not _asks_for_help(args.bench_args):
        _require_device()
    sys.argv = [str(script), *args.bench_args]
    sys.path.insert(0, str(script.parent))  # as `python benchmarks/NAME.py` would
    runpy.run_path(str(script), run_name="__main__")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``svmkit`` command."""
    parser = argparse.ArgumentParser(
        prog="svmkit",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"svmkit {__version__}")
    parser.add_argument(
        "--traceback", action="store_true", help="show the Python traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="platforms, devices and their SVM capabilities")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=_info)
    demo = sub.add_parser("demo", help="bundled demos")
    demo.add_argument("demo", nargs="?", choices=sorted(DEMOS), help="which demo")
    demo.add_argument("demo_args", nargs=argparse.REMAINDER, help="the demo's own options")
    demo.set_defaults(run=_demo)
    bench = sub.add_parser(
        "bench",
        help="run a benchmark script from benchmarks/ (RESULTS.md is rewritten only with --write)",
    )
    bench.add_argument("which", nargs="?", choices=BENCHMARKS, help="which benchmark")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="the script's own options")
    bench.set_defaults(run=_bench)
    return parser


def _stop_after_interrupt() -> None:
    """After Ctrl-C: unblock what waits on a work queue, so the process can exit.

    Host threads a command started may be blocked on a work queue (and a kernel on its
    consumer side); closing every queue lets them finish, as at interpreter exit.  A second
    Ctrl-C ends the process at once.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if "svmkit.workqueue.queue" in sys.modules:  # (no work queue made: nothing to close)
        from svmkit.workqueue.queue import close_all

        close_all()


def _one_line(exc: BaseException) -> str:
    from svmkit.errors import SVMError

    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (CommandError, SVMError)):
        return text
    return f"{type(exc).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``svmkit`` console script; returns the exit status."""
    parser = build_parser()
    args: Any = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        _stop_after_interrupt()
        sys.stderr.write(f"svmkit {args.command}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``svmkit info | head``): nothing to say
        try:  # no second error when Python flushes stdout at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is no file (captured)
            pass
        return 1
    except CommandError as exc:
        if args.traceback:
            raise
        sys.stderr.write(f"svmkit {args.command}: {_one_line(exc)}\n")
        return exc.status
    except Exception as exc:
        if args.traceback:
            raise
        sys.stderr.write(f"svmkit {args.command}: {_one_line(exc)}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
