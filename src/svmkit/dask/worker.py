"""Per-process state of a Dask worker: one context, one pool, built programs.

:func:`setup` makes the state (the plugin calls it; :func:`state` calls it on first use
in a worker without the plugin) and installs the pool as the process's default resource
with :func:`svmkit.set_current_resource`: Dask runs tasks on threads of its own, which do
not inherit a context variable set while setting up.  :func:`teardown` takes it down.
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from typing import Any

import pyopencl as cl

from svmkit.arrays.pooled import Pool
from svmkit.capabilities import _svm_devices, check_context_layout, compiler_failure
from svmkit.dask.programs import ProgramCache
from svmkit.driver import calls
from svmkit.errors import InvalidValueError, UnsupportedError
from svmkit.events.release import drain
from svmkit.policy import Policy
from svmkit.resources.current import set_current_resource
from svmkit.resources.svm import SVMResource

__all__ = ["WorkerState", "existing", "setup", "state", "teardown"]

log = logging.getLogger(__name__)

TEARDOWN_WAIT_SECONDS = 10.0


class WorkerState:
    """What one worker process holds: context, policy, pool (limited if asked), programs
    and one in-order queue per thread."""

    def __init__(self, context: cl.Context, policy: Policy | None, limit_bytes: int | None):
        self.context = context
        self.policy = Policy.best(context, system=False) if policy is None else policy
        if limit_bytes is not None:
            check_limit(context, limit_bytes)
        # The limit sits below the pool: it counts every block the pool holds, cached or not.
        self.pool = Pool(context, self.policy, limit_bytes=limit_bytes)
        self.limit_bytes = limit_bytes
        self.programs = ProgramCache(context)
        self._local = threading.local()
        set_current_resource(self.pool)

    @property
    def device_name(self) -> str:
        return str(self.context.devices[0].name).strip()

    def queue(self) -> cl.CommandQueue:
        """This thread's in-order queue on the context's device."""
        queue: cl.CommandQueue | None = getattr(self._local, "queue", None)
        if queue is None:
            queue = self._local.queue = calls.new_queue(self.context)
        return queue

    def stats(self) -> dict[str, int]:
        """The pool's statistics, with ``limit_bytes`` when the pool is limited."""
        out = self.pool.stats()
        if self.limit_bytes is not None:
            out["limit_bytes"] = self.limit_bytes
        return out

    def close(self) -> int:
        """Stop being the default resource and return the pool's cache; bytes returned."""
        set_current_resource(SVMResource(self.context, self.policy))
        drain(TEARDOWN_WAIT_SECONDS)
        released = self.pool.trim()
        drain(TEARDOWN_WAIT_SECONDS)
        return released


def check_limit(context: cl.Context, limit_bytes: int) -> None:
    """A limit no device of the context can hold is an error, not a promise."""
    for device in context.devices:
        if limit_bytes > device.global_mem_size:
            raise InvalidValueError(
                f"limit_bytes={limit_bytes} exceeds the {device.global_mem_size} bytes of "
                f"global memory of {device.name.strip()}"
            )


def usable_devices() -> list[cl.Device]:
    """SVM devices whose compiler works, in ``sk.create_context()``'s order."""
    devices, found = _svm_devices()
    usable = [d for d in devices if compiler_failure(d) is None]
    if not usable:
        raise UnsupportedError(
            f"no usable OpenCL device with SVM on this worker ({'; '.join(found)})"
        )
    return usable


def position(name: Any) -> int:
    """A worker's position for round-robin placement: its name if it is a number (as
    ``LocalCluster`` names workers 0, 1, ...), else a stable hash of the name."""
    text = str(name)
    return int(text) if text.isdigit() else zlib.crc32(text.encode())


def make_context(device: int | None, name: Any) -> cl.Context:
    """The worker's context: device ``device`` of :func:`usable_devices`, else
    ``PYOPENCL_CTX`` where set, else the devices round-robin by worker position."""
    if device is None and os.environ.get("PYOPENCL_CTX"):
        from svmkit.capabilities import create_context

        return create_context()
    devices = usable_devices()
    if device is None:
        chosen = devices[position(name) % len(devices)]
    elif 0 <= device < len(devices):
        chosen = devices[device]
    else:
        names = ", ".join(f"{i}: {d.name.strip()}" for i, d in enumerate(devices))
        raise InvalidValueError(
            f"device={device} is not one of this worker's SVM devices ({names})"
        )
    context = calls.new_context([chosen])
    check_context_layout(context)
    return context


_state: WorkerState | None = None
_state_lock = threading.Lock()


def setup(
    policy: Policy | None = None,
    device: int | None = None,
    limit_bytes: int | None = None,
    name: Any = None,
) -> WorkerState:
    """Make this process's state (replacing an earlier one)."""
    with _state_lock:
        return _setup_locked(policy, device, limit_bytes, name)


def _setup_locked(
    policy: Policy | None, device: int | None, limit_bytes: int | None, name: Any
) -> WorkerState:
    global _state
    if _state is not None:
        _state.close()
        _state = None
    _state = WorkerState(make_context(device, name), policy, limit_bytes)
    log.info("svmkit worker %s on %s, %s", name, _state.device_name, _state.policy)
    return _state


def state() -> WorkerState:
    """This process's state, set up with defaults on first use."""
    current = _state
    if current is not None:
        return current
    with _state_lock:
        if _state is not None:
            return _state
        return _setup_locked(None, None, None, _worker_name())


def existing() -> WorkerState | None:
    """This process's state if it was set up."""
    return _state


def teardown() -> int:
    """Take the state down: the pool's cache goes back to the driver; bytes returned."""
    global _state
    with _state_lock:
        current, _state = _state, None
    return current.close() if current is not None else 0


def _worker_name() -> Any:
    try:
        from distributed import get_worker

        return get_worker().name
    except (ImportError, ValueError):
        return 0
