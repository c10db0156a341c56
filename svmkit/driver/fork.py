"""Fork safety: a forked child refuses its parent's OpenCL objects and starts afresh.

``fork()`` copies a process's memory but not its threads.  OpenCL drivers keep threads
and locks of their own (NVIDIA's CUDA-based driver does not survive a fork at all), and
svmkit's release thread and locks may be caught mid-operation.  The OpenCL specification
says nothing about ``fork``; svmkit therefore treats every context it used before the
fork as the parent's, as CUDA and PyTorch treat a forked child's inherited CUDA state:

* In the child, any svmkit use of the parent's arrays, pools, resources or contexts raises
  :class:`~svmkit.InvalidContextError` saying the object belongs to the parent process
  (the check runs before any lock or driver call, so it never hangs).
* The parent's objects are never released in the child (no ``clSVMFree``, no
  ``clRelease*``): the memory is the parent's, and a driver call may hang there.
* svmkit's own state is reset: locks are reinitialised, the release thread's queue is
  emptied (the parent's deferred frees are the parent's to run), per-context caches keep
  only the parent's entries, and the default resources start empty, so the child can
  create its own contexts and arrays.

``multiprocessing``'s ``spawn`` and ``forkserver`` start methods start a fresh
interpreter and need none of this.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from typing import Any

import pyopencl as cl

from svmkit.errors import InvalidContextError

__all__ = ["check_owned", "forked", "parent_contexts"]

forked = False
"""True in a process forked from one that used svmkit (hot paths test this first)."""

parent_contexts: set[cl.Context] = set()
"""Contexts used before a fork.  Held for good: releasing one in the child is a driver
call on the parent's state."""

_kept: list[Any] = []
"""The parent's objects svmkit dropped from its own state, kept so they are never
released in the child."""

_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()), threading.Condition)


def check_owned(context: cl.Context, what: str) -> None:
    """Raise :class:`~svmkit.InvalidContextError` if ``context`` is the parent process's.

    Call only when :data:`forked` is true (the check then costs one set lookup).
    """
    if context in parent_contexts:
        raise InvalidContextError(
            f"{what} belongs to the parent process: this process was forked after the parent "
            "used its OpenCL context, and OpenCL objects do not survive fork(); create a new "
            "context here (sk.create_context()) or start processes with the 'spawn' method"
        )


def _svmkit_modules() -> list[Any]:
    return [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "svmkit"]


def _contexts_in(value: Any) -> list[cl.Context]:
    """The contexts a per-context cache holds as keys."""
    from svmkit.driver.per_context import PerContext

    if isinstance(value, PerContext):
        value = value._values
    if isinstance(value, (weakref.WeakKeyDictionary, dict)):
        return [key for key in list(value.keys()) if isinstance(key, cl.Context)]
    return []


def _reinit_lock(value: Any) -> None:
    from svmkit.driver.per_context import PerContext

    if isinstance(value, PerContext):
        value = value._lock
    if isinstance(value, _LOCK_TYPES):
        lock: Any = value
        lock._at_fork_reinit()  # what threading and logging do for their own locks


def _after_in_child() -> None:
    """Run in the child right after ``fork()`` (``os.register_at_fork``)."""
    global forked
    modules = _svmkit_modules()
    for module in modules:
        for value in list(vars(module).values()):
            _reinit_lock(value)
            parent_contexts.update(_contexts_in(value))
    forked = bool(parent_contexts)
    _reset_release_thread()
    _reset_registries(modules)


def _reset_release_thread() -> None:
    """No release thread runs in the child; the parent's pending releases never run."""
    events = sys.modules.get("svmkit.events.release")
    if events is None:
        return
    pending = getattr(events, "_releases", None)
    if pending:
        _kept.append(list(pending))
        pending.clear()
    inbox = getattr(events, "_inbox", None)  # releases handed over by finalizers
    if inbox is not None:  # a queue the parent's release thread may have been waiting on
        _kept.append(inbox)
        vars(events)["_inbox"] = type(inbox)()
    for name, fresh in (("_reaper", None), ("_busy", False)):
        if hasattr(events, name):
            vars(events)[name] = fresh


def _reset_registries(modules: list[Any]) -> None:
    """Empty the default resources and the registries of live objects (work queues)."""
    current = sys.modules.get("svmkit.resources.current")
    defaults = getattr(current, "_defaults", None)
    if defaults is not None:
        _kept.append(dict(defaults.items()))
        defaults.clear()
    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, weakref.WeakSet):
                _kept.append(list(value))
                value.clear()


os.register_at_fork(after_in_child=_after_in_child)
