"""``worker_stats``: each worker's pool statistics, gathered with ``Client.run``."""

from __future__ import annotations

from typing import Any

from svmkit.dask import worker

__all__ = ["worker_stats"]


def worker_stats(client: Any) -> dict[str, dict[str, int]]:
    """``{worker address: pool stats}`` for every worker of ``client``'s cluster.

    The stats are :meth:`svmkit.Pool.stats` (``total_allocations``,
    ``upstream_allocations``, ``cached_bytes``, ...; ``limit_bytes`` for a limited pool);
    a worker that has not set svmkit up yet reports an empty dict.
    """
    result: dict[str, dict[str, int]] = client.run(local_stats)
    return result


def local_stats() -> dict[str, int]:
    """This process's pool statistics (empty before setup)."""
    state = worker.existing()
    return state.stats() if state is not None else {}
