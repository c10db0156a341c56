"""The current resource: which resource ``sk.empty`` and friends draw from.

``use_resource`` selects a resource for the context and policy it serves, in the current
thread or task only (a :mod:`contextvars` variable), for the extent of a ``with`` block.
Without one, each (context, policy) gets a shared :class:`PoolResource` over an
:class:`SVMResource`, as CuPy's default memory pool (a raw ``clSVMAlloc`` costs about a
millisecond on NVIDIA's driver).
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import pyopencl as cl

from svmkit.errors import InvalidValueError
from svmkit.policy import Policy
from svmkit.resources.base import MemoryResource
from svmkit.resources.pool import PoolResource
from svmkit.resources.svm import SVMResource

__all__ = ["current_resource", "use_resource"]

_selected: contextvars.ContextVar[tuple[MemoryResource, ...]] = contextvars.ContextVar(
    "svmkit_resources", default=()
)
_defaults: weakref.WeakKeyDictionary[cl.Context, dict[Policy, MemoryResource]] = (
    weakref.WeakKeyDictionary()
)
_defaults_lock = threading.Lock()


def current_resource(ctx: cl.Context, policy: Policy) -> MemoryResource:
    """The resource that serves ``ctx`` and ``policy`` here: the innermost selected by
    :func:`use_resource`, else the shared default (a :class:`PoolResource` per context and
    policy)."""
    for selected in reversed(_selected.get()):
        if selected.serves(ctx, policy):
            return selected
    per_context = _defaults.get(ctx)
    cached = per_context.get(policy) if per_context is not None else None
    if cached is not None:
        return cached
    with _defaults_lock:
        per_context = _defaults.setdefault(ctx, {})
        resource = per_context.get(policy)
        if resource is None:
            resource = per_context[policy] = PoolResource(SVMResource(ctx, policy))
    return resource


@contextmanager
def use_resource(resource: MemoryResource) -> Iterator[MemoryResource]:
    """Select ``resource`` for its context and policy in this thread or task.

    Other contexts and policies keep their current resource; the selection ends with the
    ``with`` block.
    """
    if not isinstance(resource, MemoryResource):
        raise InvalidValueError(f"use_resource needs a memory resource, got {resource!r}")
    token = _selected.set((*_selected.get(), resource))
    try:
        yield resource
    finally:
        _selected.reset(token)
