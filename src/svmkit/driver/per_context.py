"""A value computed once per OpenCL context and dropped with the context."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import pyopencl as cl

from svmkit.errors import InvalidContextError

__all__ = ["PerContext", "canonical_context", "check_context"]

T = TypeVar("T")


class PerContext(Generic[T]):
    """``factory(ctx)`` made once per context (thread-safe), held weakly by the context.

    ``get`` is one attribute read once the value exists: the value is also kept on the
    ``Context`` object that asked (under a name of this instance's own), so the weak-key
    lookup (a ``weakref`` made per call) runs once per context object.
    """

    __slots__ = ("_attribute", "_factory", "_lock", "_values")

    def __init__(self, factory: Callable[[cl.Context], T]) -> None:
        self._factory = factory
        self._values: weakref.WeakKeyDictionary[cl.Context, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._attribute = f"_svmkit_per_context_{next(_instances)}"

    def get(self, context: cl.Context) -> T:
        """The value for ``context``, made on first use (not a ``Context``:
        :class:`~svmkit.InvalidContextError`, see :func:`check_context`)."""
        try:
            return getattr(context, self._attribute)  # type: ignore[no-any-return]
        except AttributeError:
            pass
        check_context(context)  # (off the hot path: a context seen before has the attribute)
        try:
            value = self._values[context]
        except KeyError:
            with self._lock:
                value = self._values.get(context)  # type: ignore[assignment]
                if value is None:
                    value = self._values[context] = self._factory(context)
        try:
            setattr(context, self._attribute, value)
        except AttributeError:  # (a context object that takes no attributes)
            pass
        return value

    def values(self) -> list[T]:
        """Every value made so far (of the contexts still alive)."""
        with self._lock:
            return list(self._values.values())


_instances = itertools.count()


def check_context(context: Any, name: str = "ctx") -> None:
    """:class:`~svmkit.InvalidContextError` unless ``context`` is a ``pyopencl.Context``
    (spec: ``CL_INVALID_CONTEXT`` if context is not a valid context)."""
    if not isinstance(context, cl.Context):
        kind = "" if context is None else f" ({type(context).__name__})"
        raise InvalidContextError(
            f"{name} must be a pyopencl.Context (such as svmkit.create_context()), got "
            f"{context!r}{kind}"
        )


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
