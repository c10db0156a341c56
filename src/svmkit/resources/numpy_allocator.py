"""NumPy allocates in SVM: a NEP 49 data-memory handler backed by svmkit resources.

``with sk.numpy_allocator():`` makes every NumPy array created inside the block (by NumPy
itself, SciPy, pandas...) own an allocation of a svmkit resource, so the result of an
unchanged NumPy function passes straight to a kernel.  NumPy keeps the handler in a context
variable (NEP 49: "Memory management in NumPy"), so other threads and tasks are untouched,
and each array keeps the handler that made it: it is freed by the resource that made it,
whenever NumPy frees it, after the work svmkit recorded on it.

The handler itself is C (``svmkit.resources._cpool``, ``_numpy_handler.c``); this module
validates resources, makes one immortal handler per resource, and enters and leaves it.
"""

from __future__ import annotations

import contextvars
import threading
from types import TracebackType
from typing import Any

import pyopencl as cl

from svmkit.errors import InvalidValueError, UnsupportedError
from svmkit.events.shutdown import at_shutdown
from svmkit.policy import Granularity, Policy
from svmkit.resources import _cpool
from svmkit.resources.base import MemoryResource
from svmkit.resources.current import current_resource, selected_resources

__all__ = ["NumpyAllocator", "host_policy", "numpy_allocator"]

_handlers: dict[int, tuple[MemoryResource | None, Any]] = {}
"""Every handler made, by ``id`` of its resource (0: the default), with the resource kept
alive for the process (NEP 49 handlers are immortal)."""
_handlers_lock = threading.Lock()


def host_policy(ctx: cl.Context) -> Policy:
    """The best host-accessible policy of ``ctx``: SYSTEM, else FINE.

    Raises
    ------
    UnsupportedError
        A device of ``ctx`` has neither fine-grain buffer nor fine-grain system SVM (the
        host can then touch SVM only while it is mapped, which NumPy cannot do).
    """
    policy = Policy.best(ctx)
    if policy.granularity is Granularity.COARSE:
        names = ", ".join(d.name.strip() for d in ctx.devices)
        raise UnsupportedError(
            f"sk.numpy_allocator needs fine-grain (buffer or system) SVM, which NumPy can use "
            f"without maps; the default context's device ({names}) has only coarse-grain "
            "SVM: use sk.asarray / sk.mapped there"
        )
    return policy


def _default_allocate() -> Any:
    """The default handler's resolver: ``allocate`` of the current resource of the default
    context for its host policy (called again whenever the current resource may change)."""
    from svmkit.capabilities import default_context

    ctx = default_context()
    return current_resource(ctx, host_policy(ctx)).allocate


_cpool.configure_default(_default_allocate, selected_resources)


def _handler(resource: MemoryResource | None) -> Any:
    """The (immortal) handler capsule of ``resource`` (``None``: the default)."""
    key = 0 if resource is None else id(resource)
    with _handlers_lock:
        entry = _handlers.get(key)
        if entry is None:
            allocate = None if resource is None else resource.allocate
            entry = _handlers[key] = (resource, _cpool.numpy_handler(allocate))
        return entry[1]


class NumpyAllocator:
    """A NEP 49 handler over a svmkit resource, entered with ``with`` or :meth:`install`.

    Reusable and reentrant: each ``with`` restores the handler that was current when it
    was entered, in its own thread or task (the saved handlers live in a context
    variable, as NumPy's handler does).
    """

    def __init__(self, resource: MemoryResource | None = None) -> None:
        if resource is None:
            from svmkit.capabilities import default_context

            host_policy(default_context())  # UnsupportedError now, not at an allocation
        elif not isinstance(resource, MemoryResource):
            raise InvalidValueError(
                f"sk.numpy_allocator takes a svmkit memory resource or None, got {resource!r}"
            )
        elif resource.policy.granularity is Granularity.COARSE:
            raise InvalidValueError(
                f"sk.numpy_allocator needs a FINE or SYSTEM resource (NumPy reads and writes "
                f"its arrays without maps); {resource!r} allocates {resource.policy}"
            )
        self.resource = resource
        self._capsule = _handler(resource)
        self._saved: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar(
            "svmkit_numpy_allocator_saved", default=()
        )

    def __enter__(self) -> NumpyAllocator:
        previous = _cpool.set_numpy_handler(self._capsule)
        self._saved.set((*self._saved.get(), previous))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        saved = self._saved.get()
        if not saved:
            raise InvalidValueError("sk.numpy_allocator: __exit__ without a matching __enter__")
        self._saved.set(saved[:-1])
        _cpool.set_numpy_handler(saved[-1])

    def install(self) -> None:
        """Make this the handler for the rest of the current context (tasks and threads
        started from it copy it, as context variables do)."""
        _cpool.set_numpy_handler(self._capsule)

    def __repr__(self) -> str:
        what = "the default context's current resource" if self.resource is None else self.resource
        return f"<sk.numpy_allocator over {what}>"


def numpy_allocator(resource: MemoryResource | None = None) -> NumpyAllocator:
    """NumPy's arrays allocated from ``resource`` (default: the current resource of
    ``sk.default_context()`` for its best host-accessible policy, SYSTEM or FINE).

    Raises
    ------
    InvalidValueError
        ``resource`` is not a resource, or allocates COARSE memory.
    UnsupportedError
        ``resource`` is None and the default context has no FINE or SYSTEM SVM.
    """
    return NumpyAllocator(resource)


at_shutdown(_cpool.stop_numpy_handlers)
"""At exit new arrays get plain memory; blocks NumPy frees later are left to the process's
end (no driver call while the interpreter and the drivers tear down)."""
