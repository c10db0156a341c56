"""What several test modules share: host threads running one body, fresh interpreters.

Importable as ``_helpers`` (``pythonpath = ["tests"]`` in the pytest configuration).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "CHILD_CWD",
    "NOISE",
    "assert_quiet_exit",
    "collects_holding",
    "run_python",
    "run_threads",
]

#: Where child interpreters start: a fixed directory of the test suite, so that what a child
#: finds on ``sys.path`` does not depend on where pytest was started.
CHILD_CWD = os.path.dirname(os.path.abspath(__file__))

#: What must never appear on a child interpreter's stderr.
NOISE = ("Traceback", "Exception ignored", "Fatal Python error", "Segmentation")


def run_threads(
    target: Callable[[int], object],
    count: int,
    *,
    timeout: float = 120.0,
    start_together: bool = False,
) -> None:
    """Run ``target(i)`` for ``i in range(count)``, each in its own host thread.

    ``start_together``: every thread waits at a barrier before calling ``target``, so
    they collide.  Fails when a thread is still running after ``timeout`` seconds, and
    re-raises the first exception a thread raised (any exception: ``AssertionError`` too).
    """
    errors: list[BaseException] = []
    barrier = threading.Barrier(count) if start_together else None

    def body(i: int) -> None:
        try:
            if barrier is not None:
                barrier.wait(timeout)
            target(i)
        except BaseException as exc:  # re-raised in the calling thread
            errors.append(exc)

    threads = [
        threading.Thread(target=body, args=(i,), name=f"test-worker-{i}") for i in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"host threads still running after {timeout} s: {hung}"
    if errors:
        raise errors[0]


def collects_holding(lock: Any, timeout: float = 20.0) -> bool:
    """Whether a garbage collection run on another thread while it holds ``lock`` (as a
    pool holds its lock inside ``allocate``) finishes within ``timeout`` seconds: a
    finaliser that waits for that lock never lets it."""
    done = threading.Event()

    def collect() -> None:
        with lock:
            gc.collect()
            done.set()

    worker = threading.Thread(target=collect, daemon=True)
    worker.start()
    worker.join(timeout)
    return done.is_set()


def run_python(
    code: str | None = None,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str | None] | None = None,
    timeout: float = 120.0,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` (or ``python *args``) in a fresh interpreter (in ``cwd``,
    default :data:`CHILD_CWD`); never raises on its exit status.

    The child inherits this environment, with ``env`` applied on top (``None`` removes a
    variable), ``POCL_DEVICES`` as the suite sets it and the fault handler on.
    """
    child = dict(os.environ, PYTHONFAULTHANDLER="1")
    child.setdefault("POCL_DEVICES", "pthread pthread")
    for name, value in (env or {}).items():
        if value is None:
            child.pop(name, None)
        else:
            child[name] = value
    argv = [sys.executable, *(["-c", code] if code is not None else []), *args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child,
        cwd=cwd or CHILD_CWD,
        check=False,
    )


def assert_quiet_exit(
    proc: subprocess.CompletedProcess[str], status: int = 0, *, last_line: str | None = None
) -> None:
    """``proc`` exited with ``status``, its stdout ends with ``last_line`` (when given) and
    nothing in :data:`NOISE` reached its stderr."""
    assert proc.returncode == status, f"exit status {proc.returncode}\n{proc.stderr[-3000:]}"
    if last_line is not None:
        assert proc.stdout.strip().endswith(last_line), proc.stdout[-500:]
    for noise in NOISE:
        assert noise not in proc.stderr, proc.stderr[-3000:]
