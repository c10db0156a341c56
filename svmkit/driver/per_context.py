"""A value computed once per OpenCL context and dropped with the context."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import pyopencl as cl

__all__ = ["PerContext"]

T = TypeVar("T")


class PerContext(Generic[T]):
    """``factory(ctx)`` made once per context (thread-safe), held weakly by the context.

    ``get`` is one dictionary lookup once the value exists.
    """

    __slots__ = ("_factory", "_lock", "_values")

    def __init__(self, factory: Callable[[cl.Context], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[cl.Context, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, context: cl.Context) -> T:
        """The value for ``context``, made on first use."""
        try:
            return self._values[context]
        except KeyError:
            pass
        with self._lock:
            value = self._values.get(context)
            if value is None:
                value = self._values[context] = self._factory(context)
        return value
