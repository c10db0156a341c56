"""record: tell svmkit about work it did not enqueue.

Work enqueued by other means than svmkit (a raw ``pyopencl.Kernel`` call,
``pyopencl.array``, another library) is invisible to svmkit; ``sk.record(event, *arrays)``
names it, so ``free()``, pools, ``get``, ``set`` and ``mapped`` order themselves after it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.arrays.numpy_owned import svm_operand
from svmkit.errors import InvalidContextError, InvalidValueError
from svmkit.resources.base import Allocation, record_event

__all__ = ["record"]


def record(event: cl.Event, *arrays: SVMArray | np.ndarray[Any, Any]) -> None:
    """Record ``event`` on the allocation of each of ``arrays`` (and so of their views).

    Every check runs before anything is recorded.

    Raises
    ------
    InvalidValueError
        ``event`` is not a ``pyopencl.Event``, or an entry of ``arrays`` is not an
        SVMArray.
    InvalidContextError
        An array of another context than the event (spec: the commands of a context use
        the SVM allocated in it).
    UseAfterFreeError
        An array was freed (its memory may already serve another array).
    """
    if not isinstance(event, cl.Event):
        raise InvalidValueError(
            f"record() takes a pyopencl.Event first, got {type(event).__name__}",
            cl_error="CL_INVALID_EVENT",
        )
    allocs: list[Allocation] = []
    context: Any = None
    for index, array in enumerate(arrays):
        if not isinstance(array, SVMArray):
            array = svm_operand(array, f"record()'s array {index}")
        alloc = array.live()
        if context is None:
            context = event.context
        if alloc.context is not context and alloc.context != context:
            raise InvalidContextError(
                f"record(): array {index} ({array.describe()}) belongs to another context "
                "than the event (a command uses only SVM of its own context)"
            )
        allocs.append(alloc)
    for alloc in allocs:
        record_event(alloc, event, None)
