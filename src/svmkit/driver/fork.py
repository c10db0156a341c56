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
* svmkit's own state is reset: locks are reinitialised here, and each layer forgets its
  own parent state through :func:`in_child` (the release thread's queue starts empty: the
  parent's deferred frees are the parent's to run; the default resources and the
  work-queue registry start empty), so the child can create its own contexts and arrays.

``multiprocessing``'s ``spawn`` and ``forkserver`` start methods start a fresh
interpreter and need none of this.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pyopencl as cl

from svmkit.errors import InvalidContextError

log = logging.getLogger("svmkit")

__all__ = [
    "check_owned",
    "forked",
    "in_child",
    "keep",
    "keeps_threads_in_first_process",
    "left_in_parent",
    "parent_contexts",
    "parent_used_pocl_cpu",
]

forked = False
"""True in a process forked from one that used svmkit (hot paths test this first)."""

parent_contexts: set[cl.Context] = set()
"""Contexts used before a fork.  Held for good: releasing one in the child is a driver
call on the parent's state."""

parent_used_pocl_cpu = False
"""True in a child forked after its parent (or an ancestor) used a PoCL CPU device through
svmkit (see :func:`keeps_threads_in_first_process`); noted in the parent before the fork,
so the child asks its parent's contexts nothing."""

_noted_pocl_cpu = False
"""What the parent noted as its last fork began (read only in the child: the parent's own
create_context must not pass over the device)."""

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


def keeps_threads_in_first_process(device: cl.Device) -> bool:
    """A CPU device of PoCL (its ``pthread`` driver in PoCL 3, ``cpu`` in PoCL 5), whose
    worker threads live in the process that first used it: a child forked after that gets
    a context and memory, but no command ever completes there (seen with PoCL 3.0's
    pthread and PoCL 5.0's cpu device: the first wait hangs)."""
    return "Portable Computing Language" in device.platform.name and bool(
        device.type & cl.device_type.CPU
    )


def left_in_parent(device: cl.Device) -> bool:
    """Whether ``device`` is one a forked child cannot use: a PoCL CPU device
    (:func:`keeps_threads_in_first_process`) after the parent used one."""
    return parent_used_pocl_cpu and keeps_threads_in_first_process(device)


def _svmkit_modules() -> list[Any]:
    return [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "svmkit"]


def _svmkit_state() -> list[Any]:
    """Every module-level value of svmkit's modules (its caches and locks)."""
    return [value for module in _svmkit_modules() for value in list(vars(module).values())]


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


_child_hooks: list[Callable[[], None]] = []


def in_child(hook: Callable[[], None]) -> None:
    """Run ``hook`` in a forked child, after svmkit's locks were reinitialised: each layer
    forgets its own parent state there (the release thread its queue, the current resource
    its defaults, the work queue its registry), handing what it drops to :func:`keep`."""
    _child_hooks.append(hook)


def keep(obj: Any) -> None:
    """Hold ``obj`` (the parent's) for good: it must never be released in the child."""
    _kept.append(obj)


def _before_fork() -> None:
    """Run in the parent as ``fork()`` begins: note whether a context of svmkit's uses a
    PoCL CPU device (driver queries here, in the parent, whose driver is alive; the child
    inherits the flag)."""
    global _noted_pocl_cpu
    try:
        contexts = [ctx for value in _svmkit_state() for ctx in _contexts_in(value)]
        used = any(
            keeps_threads_in_first_process(device) for ctx in contexts for device in ctx.devices
        )
    except Exception:  # (a fork must go on: the child then knows less)
        log.debug("noting svmkit's contexts before fork() failed", exc_info=True)
        return
    _noted_pocl_cpu = used


def _after_in_child() -> None:
    """Run in the child right after ``fork()`` (``os.register_at_fork``)."""
    global forked, parent_used_pocl_cpu
    parent_used_pocl_cpu = parent_used_pocl_cpu or _noted_pocl_cpu
    for value in _svmkit_state():
        _reinit_lock(value)
        parent_contexts.update(_contexts_in(value))
    forked = bool(parent_contexts)
    for hook in _child_hooks:
        hook()


os.register_at_fork(before=_before_fork, after_in_child=_after_in_child)
