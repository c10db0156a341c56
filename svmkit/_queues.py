"""One default in-order command queue per context, for calls given no queue."""

from __future__ import annotations

import threading
import weakref

import pyopencl as cl

__all__ = ["default_queue"]

_queues: weakref.WeakKeyDictionary[cl.Context, cl.CommandQueue] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def default_queue(context: cl.Context) -> cl.CommandQueue:
    """svmkit's in-order queue on the first device of ``context`` (created once)."""
    queue = _queues.get(context)
    if queue is None:
        with _lock:
            queue = _queues.get(context)
            if queue is None:
                queue = cl.CommandQueue(context, context.devices[0])
                _queues[context] = queue
    return queue
