"""``SVMWorkerPlugin``: svmkit's per-process setup on every Dask worker.

The plugin is pickled to the workers, so it holds parameters only; each worker process
builds its own context, pool and program cache in :meth:`setup` (OpenCL objects belong
to the process that made them) and returns the pool's cache in :meth:`teardown`.
"""

from __future__ import annotations

from typing import Any

from distributed import WorkerPlugin

from svmkit.dask import worker
from svmkit.errors import InvalidValueError
from svmkit.policy import Policy

__all__ = ["SVMWorkerPlugin"]


class SVMWorkerPlugin(WorkerPlugin):  # type: ignore[misc]
    """One context, pool and program cache per worker process.

    Parameters
    ----------
    policy:
        Granularity and access of the pool; ``None``: the finest buffer granularity the
        device supports (``Policy.best(ctx, system=False)``).
    device:
        Index into the worker's SVM devices (``sk.create_context()``'s order); ``None``:
        ``PYOPENCL_CTX`` where set, else workers spread round-robin by name.
    limit_bytes:
        Most bytes the pool holds from the driver per worker, cached blocks included;
        beyond it allocations raise :class:`~svmkit.OutOfMemoryError`.  A limit larger
        than the device's global memory fails at setup.
    """

    name = "svmkit"
    idempotent = False

    def __init__(
        self,
        policy: Policy | None = None,
        device: int | None = None,
        limit_bytes: int | None = None,
    ) -> None:
        if policy is not None and not isinstance(policy, Policy):
            raise InvalidValueError(f"policy must be a svmkit.Policy or None, got {policy!r}")
        for label, value in (("device", device), ("limit_bytes", limit_bytes)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise InvalidValueError(f"{label} must be None or an int >= 0, got {value!r}")
        self.policy = policy
        self.device = device
        self.limit_bytes = limit_bytes

    def setup(self, worker: Any) -> None:
        """Build the worker process's context, pool and program cache."""
        name = getattr(worker, "name", None)
        _set_up(self.policy, self.device, self.limit_bytes, name)

    def teardown(self, worker: Any) -> None:
        """Return the pool's cached memory to the driver and drop the state."""
        worker_teardown()

    def __repr__(self) -> str:
        return (
            f"SVMWorkerPlugin(policy={self.policy}, device={self.device}, "
            f"limit_bytes={self.limit_bytes})"
        )


def _set_up(policy: Policy | None, device: int | None, limit: int | None, name: Any) -> None:
    worker.setup(policy, device, limit, name)


def worker_teardown() -> int:
    """Take down this process's svmkit state; bytes returned to the driver."""
    return worker.teardown()
