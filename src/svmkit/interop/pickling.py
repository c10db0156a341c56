"""Pickling: an SVMArray travels as shape, dtype, policy and data (read after recorded
work) and is rebuilt in the receiving process's default context, so Dask's
``client.scatter(a)`` and ``submit(f, a)`` send the data."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from svmkit.errors import UnsupportedError
from svmkit.policy import Policy

if TYPE_CHECKING:
    from svmkit.arrays.array import SVMArray

__all__ = ["default_context", "rebuild", "reduce"]

log = logging.getLogger(__name__)

_context: cl.Context | None = None
_context_lock = threading.Lock()


def default_context() -> cl.Context:
    """The process's default context (``sk.create_context()``, made once)."""
    global _context
    with _context_lock:
        if _context is None:
            from svmkit.capabilities import create_context

            _context = create_context()
        return _context


def reduce(a: SVMArray) -> tuple[Any, ...]:
    """``a.__reduce__()``: the data (a NumPy copy) and the policy."""
    return rebuild, (a.get(), a.policy)


def rebuild(data: np.ndarray[Any, Any], policy: Policy) -> SVMArray:
    """Unpickle: an SVMArray in the default context, under ``policy`` where every device
    supports it (else the best policy there, logged)."""
    from svmkit.arrays.creation import asarray

    ctx = default_context()
    try:
        policy.check(ctx)
    except UnsupportedError:
        best = Policy.best(ctx)
        log.warning("unpickled SVMArray: %s is not supported here, using %s", policy, best)
        policy = best
    return asarray(ctx, data, policy=policy)
