"""A value computed once per OpenCL context and dropped with the context."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import pyopencl as cl

__all__ = ["PerContext", "canonical_context"]

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


_canonical: weakref.WeakValueDictionary[int, cl.Context] = weakref.WeakValueDictionary()


def canonical_context(ctx: cl.Context) -> cl.Context:
    """The first live ``Context`` object svmkit met for ``ctx``'s OpenCL context.

    PyOpenCL makes a new Python object at every ``.context`` read (of a queue, a kernel),
    so objects of one context compare equal without being identical.  svmkit's resources
    and its cached queue and kernel contexts use this one object, so the operations' hot
    path compares contexts by identity and reaches ``==`` (a driver handle comparison)
    only for a context that really differs.
    """
    found = _canonical.get(ctx.int_ptr)
    if found is None:
        found = _canonical.setdefault(ctx.int_ptr, ctx)
    return found
