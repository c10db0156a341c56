"""``sk.WorkQueue``: a bounded MPMC ring in fine-grain SVM that host and devices share.

The OpenCL spec's own example of fine-grain SVM with atomics: "The host and a set of
devices can simultaneously access and update a shared work-queue data structure holding
work-items to be done.  The host can use atomic operations to insert new work-items into
the queue at the same time as the devices using similar atomic operations to remove
work-items for processing."  (spec section 5.6.2, fine-grain buffer SVM with atomics.)

Layout: :mod:`svmkit.workqueue.layout` (``kernels/svmkit_workqueue.h`` declares the same
``svmkit_wq``): head, tail (bit 63 = closed) and a closed mirror on their own cache lines, the
ring's parameters, then ``capacity`` slots of a ``seq`` word and an item.

Protocol: D. Vyukov's bounded MPMC queue.  Slot ``i`` starts with ``seq == i``.  A
producer claims position ``p`` (compare-exchange of tail) once ``seq == p``, writes the
item, then stores ``seq = p + 1`` with RELEASE; a consumer claims ``p`` (compare-exchange
of head) once an ACQUIRE load gives ``seq == p + 1``, reads the item, then stores
``seq = p + capacity`` with RELEASE.  Batches (``push_many``/``pop_many``) claim a run of
positions with one compare-exchange, so the host pays one atomic per batch.  Closing is a
fetch-or of bit 63 into tail: a claim in flight either precedes it (its item is drained)
or fails, so no item is lost or popped twice; the queue is drained once closed and
``head`` reached tail's position.

Host atomics and orders: see :mod:`svmkit.workqueue.ring` (a C helper when it was built,
else ctypes compare-exchanges plus NumPy loads and stores that are acquire/release on
x86-64's total store order, and libatomic acquire/release calls on other hosts).

Blocking host calls (a push on a full ring, a pop on an empty one): see
:mod:`svmkit.workqueue.waiting` (spin while the other side moves, at its pace; sleep once it
stopped).

Forward progress: a blocking device call (``wq_pop``, ``wq_push``) spins, and OpenCL gives
work-items of one work-group no independent forward progress, so launch consumers with
:func:`persistent_grid`: one work-item per work-group and no more work-groups than run at
once.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.arrays.creation import empty
from svmkit.capabilities import device_label
from svmkit.driver import fork
from svmkit.errors import InvalidValueError, QueueClosed, WorkQueueTimeout
from svmkit.events import at_shutdown
from svmkit.policy import Granularity, Policy
from svmkit.workqueue import ring as host_ring
from svmkit.workqueue import waiting
from svmkit.workqueue.items import check_dtype, is_record, opencl_type, source_for
from svmkit.workqueue.layout import (
    HEADER_BYTES,
    ITEM_OFFSET,
    ITEM_SIZE_OFFSET,
    MAGIC,
    MAGIC_OFFSET,
    PARAMS_OFFSET,
    SLOT_BYTES_OFFSET,
    slot_bytes,
)

__all__ = ["WorkQueue", "WorkQueueTimeout", "close_all", "opencl_type", "persistent_grid"]

log = logging.getLogger(__name__)


def _check_capacity(capacity: Any) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise InvalidValueError(f"capacity must be an int, got {capacity!r}")
    cap = int(capacity)
    if cap < 2 or cap & (cap - 1):
        raise InvalidValueError(f"capacity must be a power of two >= 2, got {cap}")
    return cap


def _check_policy(policy: Policy | None) -> Policy:
    if policy is None:
        return Policy.fine(atomics=True)
    if not isinstance(policy, Policy):
        raise InvalidValueError(f"policy must be a svmkit.Policy, got {policy!r}")
    if policy.granularity is Granularity.COARSE or not policy.atomics:
        raise InvalidValueError(
            f"a work queue needs fine-grain SVM with atomics (Policy.fine(atomics=True)), "
            f"got {policy}"
        )
    return policy


def _device_of(target: Any) -> cl.Device:
    if isinstance(target, cl.Device):
        return target
    if isinstance(target, cl.CommandQueue):
        return target.device
    if isinstance(target, cl.Context):
        if len(target.devices) != 1:
            raise InvalidValueError(
                "persistent_grid needs one device: pass the device or the queue the kernel "
                f"runs on (the context has {len(target.devices)} devices)"
            )
        return target.devices[0]
    raise InvalidValueError(f"expected a device, queue or context, got {target!r}")


def persistent_grid(
    target: cl.Device | cl.CommandQueue | cl.Context, *, host_threads: int = 0, local_size: int = 1
) -> tuple[tuple[int], tuple[int]]:
    """``(global_size, local_size)`` for a persistent kernel that blocks on a work queue.

    OpenCL guarantees no forward progress between work-items of one work-group, and none
    for work-groups that are not running (a work-group that waits for one that has not
    started yet can wait forever).  So: one blocking work-item per work-group (keep
    ``local_size=1`` unless only one work-item of each group blocks), and no more
    work-groups than run at once: one per compute unit.  On a CPU device the compute units
    are the host's cores, so ``host_threads`` of them (host producers or consumers that
    spin too) are left to the host; at least one work-group is always used.
    """
    device = _device_of(target)
    if host_threads < 0 or local_size < 1:
        raise InvalidValueError(
            f"host_threads must be >= 0 and local_size >= 1, got {host_threads}, {local_size}"
        )
    if local_size > device.max_work_group_size:
        raise InvalidValueError(
            f"local_size {local_size} exceeds {device_label(device)}'s max work-group size "
            f"{device.max_work_group_size}"
        )
    groups = int(device.max_compute_units)
    if device.type & cl.device_type.CPU:
        groups -= host_threads
    groups = max(1, groups)
    return (groups * local_size,), (local_size,)


_live: weakref.WeakSet[WorkQueue] = weakref.WeakSet()
_live_lock = threading.Lock()


def close_all() -> None:
    """Close every live queue, so blocked host threads and consumer kernels end (at
    interpreter exit, and after Ctrl-C in the command line)."""
    with _live_lock:
        queues = list(_live)
    for wq in queues:
        try:
            wq.close()
        except Exception:
            log.exception("closing a work queue at exit failed")


at_shutdown(close_all)


def _forget_parent_queues() -> None:
    """In a forked child: the live queues are the parent's."""
    fork.keep(list(_live))
    _live.clear()


fork.in_child(_forget_parent_queues)


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


class WorkQueue:
    """A bounded multi-producer multi-consumer queue in fine-grain SVM with atomics.

    Parameters
    ----------
    ctx:
        Every device of the context (and the host) may push and pop.
    capacity:
        Number of slots, a power of two >= 2.
    dtype:
        Item type: a real number of at most 8 bytes (kernels set ``WQ_ITEM`` to the
        matching OpenCL C type, ``wq.defines`` gives it for ``sk.build_program``), or a
        structured dtype of at most 64 bytes equal to its ``align=True`` form, a record
        (``pop`` returns ``np.void``; kernels declare the struct with
        :meth:`source_for`'s prelude before the header).
    policy:
        ``Policy.fine(atomics=True)`` (default) or a SYSTEM policy with atomics.

    Raises
    ------
    UnsupportedError
        A device of ``ctx`` lacks fine-grain buffer SVM or SVM atomics (names the device).
    InvalidValueError
        Bad capacity, dtype or policy.
    """

    def __init__(
        self,
        ctx: cl.Context,
        capacity: int,
        dtype: Any = np.int64,
        *,
        policy: Policy | None = None,
        backend: str | None = None,
    ) -> None:
        cap = _check_capacity(capacity)
        dt = check_dtype(dtype)
        pol = _check_policy(policy)
        pol.check(ctx)  # UnsupportedError naming each device that lacks FINE/atomics
        ring_type = host_ring.ring_class(backend)
        self._context = ctx
        self._capacity = cap
        self._dtype = dt
        stride = slot_bytes(dt.itemsize)
        self._array: SVMArray = empty(ctx, HEADER_BYTES + cap * stride, np.uint8, policy=pol)
        raw = self._array.host
        raw[:HEADER_BYTES] = 0
        raw[PARAMS_OFFSET : PARAMS_OFFSET + 16].view(np.uint64)[:] = (cap - 1, cap)
        for offset, value in (
            (ITEM_SIZE_OFFSET, dt.itemsize),
            (MAGIC_OFFSET, MAGIC),
            (SLOT_BYTES_OFFSET, stride),
        ):
            raw[offset : offset + 4].view(np.uint32)[0] = value
        slots = raw[HEADER_BYTES:].reshape(cap, stride)
        slots[:, :8].view(np.uint64)[:, 0] = np.arange(cap, dtype=np.uint64)  # seq at +0
        slots[:, ITEM_OFFSET:] = 0
        self._record = is_record(dt)
        direct = dt.kind in "iu" or dt.name in ("float32", "float64")
        if self._record:  # bytes in and out of the ring; buffers pass as uint8
            kind = "b"
            self._raw_dtype: np.dtype[Any] = np.dtype(np.uint8)
            self._encode: Callable[[Any], Any] | None = self._to_record_bytes
            self._scalar: Callable[[Any], Any] = self._from_record_bytes
        else:
            kind = dt.kind if direct else "r"
            self._raw_dtype = dt if direct else np.dtype(f"u{dt.itemsize}")
            self._encode = None if direct else self._to_bits
            self._scalar = dt.type if direct else self._from_bits
        self._ring: host_ring.RingOps = ring_type(self._array.ptr, cap, dt.itemsize, kind)
        self.backend = "python" if ring_type is host_ring.PyRing else "native"
        self._shares_cores = any(d.type & cl.device_type.CPU for d in ctx.devices)
        # How long the other side may sit still before a blocked call deems it idle.
        self._consumers_pace = waiting.Pace(self._shares_cores)
        self._producers_pace = waiting.Pace(self._shares_cores)
        self._reopen_lock = threading.Lock()
        with _live_lock:
            _live.add(self)

    # --- conversions for items the ring stores as raw bits (bool, float16, complex64) ---
    def _to_bits(self, item: Any) -> int:
        return int(np.asarray(item, self._dtype).reshape(()).view(self._raw_dtype))

    def _from_bits(self, bits: Any) -> Any:
        return np.asarray(bits, self._raw_dtype).view(self._dtype)[()]

    def _to_record_bytes(self, item: Any) -> bytes:
        if type(item) is np.void and item.dtype == self._dtype:
            return item.tobytes()
        return np.asarray(item, self._dtype).reshape(()).tobytes()  # a tuple, a 0-d array

    def _from_record_bytes(self, bits: bytes) -> Any:
        return np.frombuffer(bits, self._dtype)[0]

    def _coerce(self, item: Any) -> Any:
        """NumPy's conversion of ``item`` to ``dtype``, as a Python number."""
        return self._dtype.type(item).item()

    # --- public properties ------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Number of slots."""
        return self._capacity

    @property
    def dtype(self) -> np.dtype[Any]:
        """Item type."""
        return self._dtype

    @property
    def context(self) -> cl.Context:
        return self._context

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (by the host or through the shared memory)."""
        return bool(self._ring.closed())

    def __len__(self) -> int:
        """Items pushed (or being pushed) and not yet popped, at the moment of the call."""
        return int(self._ring.length())

    @property
    def kernel_arg(self) -> SVMArray:
        """The argument PyOpenCL accepts for a ``__global svmkit_wq *`` kernel parameter."""
        return self._array

    @property
    def svm_pointers(self) -> tuple[int, ...]:
        """Addresses to register with ``CL_KERNEL_EXEC_INFO_SVM_PTRS`` (the ring)."""
        return (self._array.ptr,)

    @property
    def defines(self) -> dict[str, str]:
        """``{"WQ_ITEM": <OpenCL C type of dtype>}`` for :func:`svmkit.build_program` (for a
        record the struct must also be declared: put :attr:`source` before the header)."""
        return {"WQ_ITEM": opencl_type(self._dtype)}

    @property
    def source(self) -> str:
        """:meth:`source_for` of this queue's dtype."""
        return source_for(self._dtype)

    @staticmethod
    def source_for(dtype: Any) -> str:
        """The OpenCL C prelude for items of ``dtype``, to put before
        ``#include "svmkit_workqueue.h"``: ``#define WQ_ITEM <type>``, and for a structured
        dtype the ``typedef struct`` it names (a struct cannot travel through ``-D``
        defines).  Needs no queue: a program can be built before any queue exists.

        Raises :class:`~svmkit.InvalidValueError` for a dtype a queue cannot carry."""
        return source_for(dtype)

    def record(self, event: cl.Event) -> None:
        """Remember a command that uses the ring: its memory is freed only after it ends."""
        self._array.record(event)

    # --- host operations --------------------------------------------------------------
    def push(self, item: Any, timeout: float | None = None) -> None:
        """Push one item, blocking while the queue is full.

        Raises :class:`~svmkit.QueueClosed` after :meth:`close`, and a
        :class:`TimeoutError` (``.pushed == 0``) when ``timeout`` seconds passed.
        """
        if self._encode is not None:
            item = self._encode(item)
        ring = self._ring
        try:
            status = ring.try_push(item)
        except TypeError:
            item = self._coerce(item)
            status = ring.try_push(item)
        if status != 1:
            self._push_slow(item, status, timeout)

    def _push_slow(self, item: Any, status: int, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        ring = self._ring
        pace = self._consumers_pace
        started = pace.clock_if_learned()
        round_ = 0
        while status != 1:
            if status < 0:
                raise QueueClosed("push on a closed work queue")
            if _expired(deadline):
                raise WorkQueueTimeout(
                    f"push timed out after {timeout} s: the queue stayed full", pushed=0
                )
            if round_ == 1 and not started:
                started = pace.first_spin_started()
            waiting.backoff(ring, False, round_, 1, self._shares_cores, pace.idle_ns)
            round_ += 1
            status = ring.try_push(item)
        if started:
            pace.moved(time.monotonic_ns() - started, round_)

    def push_many(self, array: Any, timeout: float | None = None) -> None:
        """Push every item of ``array`` (flattened) in order, blocking while full.

        Each call claims as many free slots as it can with one atomic operation.  On
        timeout raises :class:`TimeoutError` whose ``.pushed`` counts the leading items
        that went in; after :meth:`close`, :class:`~svmkit.QueueClosed` (``.pushed``
        likewise).  Any other exception escaping the wait (``KeyboardInterrupt``) also
        carries ``.pushed``.
        """
        src = np.ascontiguousarray(array, dtype=self._dtype).reshape(-1)
        n = len(src)
        if self._encode is not None:  # raw bits (a record: its bytes)
            src = src.view(self._raw_dtype)
        ring = self._ring
        done = 0
        deadline: float | None = None
        pace = self._consumers_pace
        started = round_ = 0
        try:
            while done < n:
                k = ring.try_push_many(src, done)
                if k > 0:
                    done += k
                    if round_:  # progress: the next wait spins afresh
                        pace.moved(time.monotonic_ns() - started, round_)
                        round_ = 0
                    continue
                if k < 0:
                    err = QueueClosed(
                        f"push_many on a closed work queue ({done} of {n} items went in)"
                    )
                    err.pushed = done  # type: ignore[attr-defined]
                    raise err
                if timeout is not None:
                    if deadline is None:
                        deadline = time.monotonic() + timeout
                    elif _expired(deadline):
                        raise WorkQueueTimeout(
                            f"push_many timed out after {timeout} s with {done} of {n} "
                            "items pushed",
                            pushed=done,
                        )
                if not round_:
                    started = time.monotonic_ns()
                want = waiting.gather(n - done, self.capacity)
                waiting.backoff(ring, False, round_, want, self._shares_cores, pace.idle_ns)
                round_ += 1
        except BaseException as exc:  # an interrupt too: say how many items went in
            if not hasattr(exc, "pushed"):
                exc.pushed = done  # type: ignore[attr-defined]
            raise

    def pop(self, timeout: float | None = None) -> Any:
        """Pop one item (a NumPy scalar of ``dtype``; ``np.void`` for a record), blocking
        while the queue is empty.

        Raises :class:`~svmkit.QueueClosed` once the queue is closed and drained, and
        :class:`TimeoutError` when ``timeout`` seconds passed.
        """
        value = self._ring.try_pop()
        if value is None:
            value = self._pop_slow(timeout)
        return self._scalar(value)

    def _pop_slow(self, timeout: float | None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        ring = self._ring
        pace = self._producers_pace
        started = pace.clock_if_learned()
        round_ = 0
        while True:
            if ring.drained():
                raise QueueClosed("pop on a closed and drained work queue")
            if _expired(deadline):
                raise WorkQueueTimeout(f"pop timed out after {timeout} s: the queue stayed empty")
            if round_ == 1 and not started:
                started = pace.first_spin_started()
            waiting.backoff(ring, True, round_, 1, self._shares_cores, pace.idle_ns)
            round_ += 1
            value = ring.try_pop()
            if value is not None:
                if started:
                    pace.moved(time.monotonic_ns() - started, round_)
                return value

    def pop_many(self, n: int, timeout: float | None = None) -> np.ndarray[Any, Any]:
        """Pop up to ``n`` items into a new 1-D array of ``dtype``.

        Blocks until ``n`` items were popped or the queue is closed and drained (then
        fewer, possibly none).  On timeout returns what it has, or raises
        :class:`TimeoutError` if that is nothing.  An exception escaping the wait
        (``KeyboardInterrupt``) carries the items already taken as ``.popped``, so none is
        lost.
        """
        if n < 0:
            raise InvalidValueError(f"n must be >= 0, got {n}")
        out = np.empty(n, self._dtype)
        view = out.view(self._raw_dtype)
        ring = self._ring
        deadline = None if timeout is None else time.monotonic() + timeout
        got = 0
        pace = self._producers_pace
        started = round_ = 0
        try:
            while got < n:
                k = ring.try_pop_many(view, got)
                if k > 0:
                    got += k
                    if round_:  # progress: the next wait spins afresh
                        pace.moved(time.monotonic_ns() - started, round_)
                        round_ = 0
                    continue
                if ring.drained():
                    break
                if _expired(deadline):
                    if got == 0:
                        raise WorkQueueTimeout(
                            f"pop_many timed out after {timeout} s: the queue stayed empty"
                        )
                    break
                if not round_:
                    started = time.monotonic_ns()
                want = waiting.gather(n - got, self.capacity)
                waiting.backoff(ring, True, round_, want, self._shares_cores, pace.idle_ns)
                round_ += 1
        except BaseException as exc:  # an interrupt too: the items taken go with it
            exc.popped = out[:got]  # type: ignore[attr-defined]
            raise
        return out[:got]

    def close(self) -> None:
        """Close the queue: pushes fail from now on; pops drain what is left.

        Device ``wq_pop`` returns false once the queue is drained, so persistent consumer
        kernels end.  Idempotent.
        """
        if not self._array.freed:
            self._ring.close()

    def reopen(self) -> None:
        """Make a closed and drained queue usable again, in the same memory (no allocation).

        Pushes succeed again and pops block again; a kernel launched afterwards finds the
        ring as a reused queue's.  Items keep their order positions (the counters run on), so
        nothing a previous round left can be popped twice.

        Raises
        ------
        InvalidValueError
            The queue is still open, still holds items, or a kernel recorded on it (through
            :func:`svmkit.launch` or :meth:`record`) has not finished: it could still pop
            or push on the ring while it is being reset (API.md, "Fine-grain atomic work
            queue").
        """
        ring = self._ring
        with self._reopen_lock:
            if not ring.closed():
                raise InvalidValueError("reopen() needs a closed work queue; this one is open")
            if not ring.drained():
                raise InvalidValueError(
                    f"reopen() needs a drained work queue; {len(self)} items were not popped"
                )
            running = self._array.pending_events()
            if running:
                raise InvalidValueError(
                    f"reopen() while {len(running)} kernel(s) recorded on the work queue have "
                    "not finished (wait for them first)"
                )
            if ring.reopen() != 1:  # (a push or pop raced: nothing else may use it now)
                raise InvalidValueError("reopen() raced with another reopen() of the queue")

    def __enter__(self) -> WorkQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Kernels still blocked on the ring end once it is closed; the ring's memory is
        # freed after the commands recorded on it (see record()).
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<WorkQueue capacity={self._capacity} dtype={self._dtype} len={len(self)} "
            f"{state} at {self._array.ptr:#x}>"
        )
