"""One default in-order command queue per context, for calls given no queue."""

from __future__ import annotations

import pyopencl as cl

from svmkit.driver.calls import new_queue
from svmkit.driver.per_context import PerContext

__all__ = ["default_queue"]

_queues: PerContext[cl.CommandQueue] = PerContext(new_queue)


def default_queue(context: cl.Context) -> cl.CommandQueue:
    """svmkit's in-order queue on the first device of ``context`` (created once)."""
    return _queues.get(context)
