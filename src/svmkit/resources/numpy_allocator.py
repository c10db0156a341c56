"""NumPy allocates in SVM: a NEP 49 data-memory handler backed by svmkit resources.

``with sk.numpy_allocator():`` makes every NumPy array created inside the block (by NumPy
itself, SciPy, pandas...) own an allocation of a svmkit resource, so the result of an
unchanged NumPy function passes straight to a kernel.  NumPy keeps the handler in a context
variable (NEP 49: "Memory management in NumPy"), so other threads and tasks are untouched,
and each array keeps the handler that made it: it is freed by the resource that made it,
whenever NumPy frees it, after the work svmkit recorded on it.  One handler serves every
resource: which resource a request draws from is a context variable set together with
NumPy's handler.  A resource given to ``sk.numpy_allocator`` stays alive for the process
(NEP 49 handlers are immortal); svmkit's own uses (:func:`allocating_from`, NumPy's
surface on SVMArrays) keep theirs only as long as their arrays and their ``with`` blocks.

The handler itself is C (``svmkit.resources._cpool``, ``_numpy_handler.c``); this module
validates resources and enters and leaves the handler with its resource.
"""

from __future__ import annotations

import contextvars
import gc
import os
import threading
from types import TracebackType
from typing import Any

import pyopencl as cl

from svmkit.errors import InvalidValueError, UnsupportedError
from svmkit.events.release import release_soon, release_thread_running
from svmkit.events.shutdown import at_shutdown
from svmkit.policy import Granularity, Policy
from svmkit.resources import _cpool
from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.current import current_resource, selected_resources

__all__ = ["NumpyAllocator", "allocating_from", "host_policy", "numpy_allocator"]

_numpy_resource: contextvars.ContextVar[MemoryResource | None] = contextvars.ContextVar(
    "svmkit_numpy_resource", default=None
)
"""The resource NumPy's arrays come from while the handler is set (None: the default
context's current resource); set and reset together with NumPy's handler."""
_given: list[MemoryResource] = []
"""Every resource given to ``sk.numpy_allocator``: alive for the process, as the contract
says (NEP 49 handlers are immortal, and so is what a user handed to one)."""
_handler_lock = threading.Lock()
_capsule: tuple[int, Any] | None = None
"""The NEP 49 handler capsule and the process it was made in (one handler serves every
resource: which one is a context variable, so no resource lives longer than its use)."""


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


_cpool.configure(_default_allocate, selected_resources, _numpy_resource)


def _free_in_collection(allocation: Allocation) -> None:
    """A block NumPy frees during a garbage collection (an array in a reference cycle):
    the collection may have interrupted this thread inside a pool holding its lock, so the
    release thread frees it, as :meth:`Allocation._finalize` does."""
    if release_thread_running():
        release_soon(allocation.free)
    else:
        allocation.free()


_cpool.configure_free_in_gc(_free_in_collection)
gc.callbacks.append(_cpool.numpy_gc_phase)


def _handler() -> Any:
    """svmkit's (immortal) NEP 49 handler capsule of this process (a forked child makes its
    own: the parent's serves plain memory there)."""
    global _capsule
    with _handler_lock:
        if _capsule is None or _capsule[0] != os.getpid():
            _capsule = (os.getpid(), _cpool.numpy_handler())
        return _capsule[1]


class NumpyAllocator:
    """A NEP 49 handler over a svmkit resource, entered with ``with`` or :meth:`install`.

    Reusable and reentrant: each ``with`` restores the handler that was current when it
    was entered, in its own thread or task (the saved handlers live in a context
    variable, as NumPy's handler does).
    """

    def __init__(self, resource: MemoryResource | None = None, *, immortal: bool = True) -> None:
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
        if immortal and resource is not None:
            with _handler_lock:
                if not any(r is resource for r in _given):
                    _given.append(resource)
        self._saved: contextvars.ContextVar[tuple[tuple[Any, Any], ...]] = contextvars.ContextVar(
            "svmkit_numpy_allocator_saved", default=()
        )

    def __enter__(self) -> NumpyAllocator:
        token = _numpy_resource.set(self.resource)
        previous = _cpool.set_numpy_handler(_handler())
        self._saved.set((*self._saved.get(), (previous, token)))
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
        previous, token = saved[-1]
        _cpool.set_numpy_handler(previous)
        _numpy_resource.reset(token)

    def install(self) -> None:
        """Make this the handler for the rest of the current context.

        Tasks (``asyncio``) and ``contextvars`` copies made from the context inherit it,
        as context variables do; a thread does not: before Python 3.14 (and on 3.14
        without ``sys.flags.thread_inherit_context``) a new thread starts in an empty
        context, with NumPy's default handler, and installs its own."""
        _numpy_resource.set(self.resource)
        _cpool.set_numpy_handler(_handler())

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


def allocating_from(resource: MemoryResource) -> NumpyAllocator:
    """``sk.numpy_allocator(resource)`` for svmkit's own use (NumPy's surface on SVMArrays):
    the same handler, without keeping ``resource`` alive for the process."""
    return NumpyAllocator(resource, immortal=False)


at_shutdown(_cpool.stop_numpy_handlers)
"""At exit new arrays get plain memory; blocks NumPy frees later are left to the process's
end (no driver call while the interpreter and the drivers tear down)."""
