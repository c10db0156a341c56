"""Launch per batch: the comparison for :class:`~svmkit.WorkQueue`, and the mode a device
without fine-grain SVM atomics (coarse-grain only, e.g. NVIDIA's OpenCL) uses instead.

Each batch is one kernel launch over its items: ``kernel(batch_in, *extra, batch_out)`` with
one work-item per item.  Coarse-grain buffers are the device's own memory until a command
moves them (OpenCL 3.0 section 5.6.1: the host may touch coarse-grain SVM only between map
and unmap, or through enqueued copies), so each batch is copied in, computed and copied out
with three commands; fine-grain buffers need no copies (the host writes the batch in place
and reads results once the launch completed).  ``depth`` batches are kept in flight, round
robin over ``queues`` in-order command queues (several queues let a GPU overlap one
batch's copies with another's kernel); ``depth=1`` waits for each batch (sync).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.arrays.creation import empty
from svmkit.arrays.numpy_owned import allocation_of
from svmkit.driver import calls
from svmkit.errors import InvalidValueError
from svmkit.ops import launch
from svmkit.policy import Granularity, Policy
from svmkit.resources.base import Allocation, record_events

__all__ = ["BatchedLaunches"]

log = logging.getLogger("svmkit.workqueue")


def _bytes(a: Any, nbytes: int) -> Any:
    """An SVM pointer object over the first ``nbytes`` of array ``a`` (its whole self when
    it has exactly that many)."""
    return a if a.nbytes == nbytes else calls.svm_pointer(a.allocation.u8[:nbytes])


class BatchedLaunches:
    """Run batches of items as one launch each, ``depth`` batches in flight.

    ``make_kernel()`` returns a new kernel object (each slot owns one, with its arguments
    set once: ``cl.Kernel(prg, name)``, not a program's attribute, which is one object);
    ``extra`` are the arguments between the batch's input and output buffers, checked at
    each :meth:`run` (live, of the context, not mapped) and left alone by the caller until
    it returns.  ``policy`` picks the batch buffers: coarse-grain (copies) or fine-grain
    (in place).

    Raises
    ------
    InvalidValueError
        ``batch`` or ``depth`` below 1, no queues, or ``make_kernel`` returning a kernel
        object another slot already owns.
    """

    def __init__(
        self,
        ctx: cl.Context,
        queues: Sequence[cl.CommandQueue],
        make_kernel: Callable[[], cl.Kernel],
        batch: int,
        *,
        depth: int = 1,
        extra: Sequence[Any] = (),
        in_dtype: Any = np.int64,
        out_dtype: Any = np.int64,
        policy: Policy | None = None,
    ) -> None:
        if batch < 1 or depth < 1 or not queues:
            raise InvalidValueError(
                f"batch and depth must be >= 1 and queues non-empty, got {batch}, {depth}"
            )
        self.queues = list(queues)
        self.batch, self.depth = batch, depth
        pol = policy or Policy.coarse()
        self.copies = pol.granularity is Granularity.COARSE
        self.in_dtype, self.out_dtype = np.dtype(in_dtype), np.dtype(out_dtype)
        self._slots: list[tuple[SVMArray, SVMArray, np.ndarray[Any, Any], cl.Kernel]] = []
        self._host_in: list[np.ndarray[Any, Any] | None] = []
        for _ in range(depth):
            dev_in = empty(ctx, batch, self.in_dtype, policy=pol)
            dev_out = empty(ctx, batch, self.out_dtype, policy=pol)
            kernel = make_kernel()
            if any(kernel is slot[3] for slot in self._slots):
                raise InvalidValueError(
                    "make_kernel() returned a kernel object another slot already owns: each "
                    "slot sets its kernel's arguments once, so it needs a kernel of its own "
                    "(cl.Kernel(program, name) makes a new one)"
                )
            # Fine-grain: the host side of each buffer is one long-lived host view (an
            # export per slot, not one per batch: an export dying is a finalizer, and a
            # Ctrl-C that lands in a finalizer is lost to Python).
            host_out = np.empty(batch, self.out_dtype) if self.copies else dev_out.host
            self._slots.append((dev_in, dev_out, host_out, kernel))
            self._host_in.append(None if self.copies else dev_in.host)
        self.context = ctx
        self._extra = tuple(extra)
        # Per slot: whether its kernel holds its arguments (its first launch set them).
        self._set: list[bool] = [False] * depth
        # What each later launch records its event on, per slot, as _check_extra found it
        # for this run: allocations (the slot's buffers, then extra's), and objects that
        # record their own (work queues).
        self._allocs: list[list[Allocation]] = [[] for _ in range(depth)]
        self._extra_recorders: list[Callable[[cl.Event], None]] = []

    def _check_extra(self) -> None:
        """Check ``extra`` for this run, as :func:`svmkit.launch` checks arguments: an
        SVMArray live, of the context and not mapped in conflict; and note what each
        launch records its event on (a NumPy array of ``sk.numpy_allocator``'s: its
        allocation; a work queue: its own ``record``)."""
        allocs: list[Allocation] = []
        recorders: list[Callable[[cl.Event], None]] = []
        for i, arg in enumerate(self._extra):
            if isinstance(arg, SVMArray):
                allocs.append(
                    arg.for_command(
                        self.context, None, f"extra argument {i}", "BatchedLaunches.run()"
                    )
                )
            elif isinstance(arg, np.ndarray) and arg.ndim:
                alloc = allocation_of(arg)
                if alloc is not None:  # (else the slot's first launch raises)
                    allocs.append(alloc)
            else:
                record = getattr(arg, "record", None)
                if callable(record):
                    recorders.append(record)
        self._allocs = [
            [dev_in.allocation, *allocs, dev_out.allocation]
            for dev_in, dev_out, _, _ in self._slots
        ]
        self._extra_recorders = recorders

    def _submit(
        self,
        slot: int,
        queue: cl.CommandQueue,
        items: np.ndarray[Any, Any],
        dest: np.ndarray[Any, Any] | None,
    ) -> Any:
        """Enqueue one batch on ``slot``: its event (the copy out, else the launch).

        A slot's first launch goes through :func:`svmkit.launch` (every rule checked, the
        arguments set and the event recorded); later ones enqueue the kernel over the
        arguments it already holds (the slot's buffers and ``extra`` never change) and
        record the event on the same allocations.  ``dest`` (host memory of the batch's
        length and ``out_dtype``) receives the coarse-grain copy out directly."""
        dev_in, dev_out, host_out, kernel = self._slots[slot]
        k = len(items)
        if self.copies:
            # The slot's buffers stay alive and untouched until the batch is retired, so
            # the copies go straight to the driver, over exactly the batch's bytes.
            calls.enqueue_copy(queue, _bytes(dev_in, items.nbytes), calls.svm_pointer(items), None)
        else:
            host_in = self._host_in[slot]
            assert host_in is not None
            host_in[:k] = items
        if not self._set[slot]:
            event = launch(queue, kernel, (k,), None, dev_in, *self._extra, dev_out)
            self._set[slot] = True
        else:
            event = calls.enqueue_kernel_as_set(queue, kernel, (k,), None, None)
            record_events(self._allocs[slot], event, queue)
            for record in self._extra_recorders:
                record(event)
        if self.copies:
            nbytes = k * host_out.itemsize
            target = host_out[:k] if dest is None else dest
            return calls.enqueue_copy(
                queue, calls.svm_pointer(target), _bytes(dev_out, nbytes), None
            )
        return event

    def _result(self, slot: int, k: int) -> np.ndarray[Any, Any]:
        host_out = self._slots[slot][2]
        return host_out[:k]

    def run(
        self, items: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
    ) -> tuple[float, np.ndarray[Any, Any]]:
        """Process ``items`` batch by batch into ``out``: (seconds, per-batch µs from its
        submission to its results on the host).

        With coarse-grain buffers and an ``out`` that is a C-contiguous NumPy array of
        ``out_dtype``, each batch's results are copied from the device straight into it
        (else through a host buffer per slot).  An exception (Ctrl-C) waits for the
        batches in flight before it propagates, so no copy lands in memory the caller
        reuses.  ``extra`` is checked first (see the class)."""
        self._check_extra()
        src = np.ascontiguousarray(items, dtype=self.in_dtype)
        n, b = len(src), self.batch
        nb = (n + b - 1) // b
        lat = np.empty(nb)
        direct = (
            self.copies
            and type(out) is np.ndarray
            and out.dtype == self.out_dtype
            and out.ndim == 1
            and out.flags.c_contiguous
            and len(out) >= n
        )
        inflight: deque[tuple[int, int, int, Any]] = deque()
        clock = time.perf_counter_ns

        def retire() -> None:
            j, slot, t0, event = inflight.popleft()
            calls.wait(event, "a batch")
            if not direct:
                lo = j * b
                k = min(b, n - lo)
                out[lo : lo + k] = self._result(slot, k)
            lat[j] = (clock() - t0) / 1e3

        start = time.perf_counter()
        try:
            for j in range(nb):
                if len(inflight) == self.depth:
                    retire()
                slot = j % self.depth
                queue = self.queues[j % len(self.queues)]
                lo = j * b
                t0 = clock()
                event = self._submit(
                    slot, queue, src[lo : lo + b], out[lo : lo + b] if direct else None
                )
                inflight.append((j, slot, t0, event))
                if self.depth > 1:
                    calls.flush(queue)
            while inflight:
                retire()
        except BaseException:
            while inflight:  # (the batches' copies still write into `out`)
                try:
                    calls.wait(inflight.popleft()[3], "a batch")
                except Exception:  # (a failed batch: the others are still waited for)
                    log.debug("a batch in flight failed as an error propagated", exc_info=True)
            raise
        return time.perf_counter() - start, lat
