"""Pickling: an SVMArray travels as shape, dtype, policy and data (read after recorded
work) and is rebuilt in the receiving process's default context, so Dask's
``client.scatter(a)`` and ``submit(f, a)`` send the data."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from svmkit.errors import UnsupportedError
from svmkit.policy import Policy

if TYPE_CHECKING:
    from svmkit.arrays.array import SVMArray

__all__ = ["rebuild", "reduce"]

log = logging.getLogger(__name__)


def reduce(a: SVMArray) -> tuple[Any, ...]:
    """``a.__reduce__()``: the data (a NumPy copy) and the policy."""
    return rebuild, (a.get(), a.policy)


def rebuild(data: np.ndarray[Any, Any], policy: Policy) -> SVMArray:
    """Unpickle: an SVMArray in the default context, under ``policy`` where every device
    supports it (else the best policy there, logged)."""
    from svmkit.arrays.creation import asarray
    from svmkit.capabilities import default_context

    ctx = default_context()
    try:
        policy.check(ctx)
    except UnsupportedError:
        best = Policy.best(ctx)
        log.warning("unpickled SVMArray: %s is not supported here, using %s", policy, best)
        policy = best
    return asarray(ctx, data, policy=policy)
