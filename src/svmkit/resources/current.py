"""The current resource: which resource ``sk.empty`` and friends draw from.

``use_resource`` selects a resource for the context and policy it serves, in the current
thread or task only (a :mod:`contextvars` variable), for the extent of a ``with`` block.
Without one, each (context, policy) gets the process-wide default: the resource given to
``set_current_resource`` (RMM's ``set_current_device_resource``), else a shared
:class:`PoolResource` over an :class:`SVMResource`, as CuPy's default memory pool (a raw
``clSVMAlloc`` costs about a millisecond on NVIDIA's driver).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pyopencl as cl

from svmkit.driver import fork
from svmkit.driver.per_context import PerContext
from svmkit.errors import InvalidValueError
from svmkit.policy import Policy
from svmkit.resources._cpool import resources_changed
from svmkit.resources.base import MemoryResource
from svmkit.resources.debug import DebugAdaptor, debug_enabled
from svmkit.resources.pool import PoolResource
from svmkit.resources.svm import SVMResource

__all__ = ["current_resource", "set_current_resource", "use_resource"]

_selected: contextvars.ContextVar[tuple[MemoryResource, ...]] = contextvars.ContextVar(
    "svmkit_resources", default=()
)
selected_resources = _selected
"""The resources :func:`use_resource` selected here, innermost last (read by the NumPy
allocator's C handler, which looks the current resource up again when it changes)."""
_defaults: PerContext[dict[Policy, MemoryResource]] = PerContext(lambda _ctx: {})
"""Each context's defaults by policy (the dicts change in place under ``_defaults_lock``)."""
_defaults_lock = threading.Lock()


def current_resource(ctx: cl.Context, policy: Policy) -> MemoryResource:
    """The resource that serves ``ctx`` and ``policy`` here: the innermost selected by
    :func:`use_resource`, else the process-wide default (:func:`set_current_resource`,
    else a shared :class:`PoolResource` per context and policy)."""
    selected = _selected.get()
    if selected:
        for resource in reversed(selected):
            if resource.serves(ctx, policy):
                return resource
    per_context = _defaults.get(ctx)
    cached = per_context.get(policy)
    if cached is not None:
        return cached
    with _defaults_lock:
        cached = per_context.get(policy)
        if cached is None:
            cached = per_context[policy] = _default_pool(ctx, policy)
    return cached


def _default_pool(ctx: cl.Context, policy: Policy) -> MemoryResource:
    """The built-in default: a pool over raw SVM (a :class:`DebugAdaptor` over it in debug
    mode, as every :class:`~svmkit.Pool` gets)."""
    pool = PoolResource(SVMResource(ctx, policy))
    return DebugAdaptor(pool) if debug_enabled() else pool


def set_current_resource(resource: MemoryResource) -> MemoryResource | None:
    """Make ``resource`` the process-wide default for its context and policy.

    Every thread and task of the process then draws from it (RMM's
    ``set_current_device_resource``), except inside :func:`use_resource` blocks, which
    override it.  Other contexts and policies keep their default.  Returns the default
    that was set before, or ``None`` where there was none yet.
    """
    if not isinstance(resource, MemoryResource):
        raise InvalidValueError(f"set_current_resource needs a memory resource, got {resource!r}")
    with _defaults_lock:
        per_context = _defaults.get(resource.context)
        previous = per_context.get(resource.policy)
        per_context[resource.policy] = resource
        resources_changed()  # the NumPy allocator's default handler looks it up again
    return previous


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


def _forget_parent_defaults() -> None:
    """In a forked child: the defaults serve the parent's contexts; start with none."""
    for per_context in _defaults.values():
        fork.keep(dict(per_context))
        per_context.clear()
    resources_changed()


fork.in_child(_forget_parent_defaults)
