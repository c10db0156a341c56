"""SVMArray: a typed, shaped window on an SVM allocation.

The array is thin (as dpctl's ``usm_ndarray``): shape and dtype come from a NumPy view of
the allocation's bytes that is created without touching memory; host access, ordering and
freeing rules are enforced here, operations live in :mod:`svmkit.ops`, and NumPy's
``ndarray`` surface (methods, operators, ``__array_function__``, indexing beyond views,
``repr``) is installed on the class by :mod:`svmkit.interop.numpy_surface`.

Internal interface
------------------
svmkit's other modules reach an array only through these (never its slots):

* :attr:`SVMArray.allocation`, :attr:`~SVMArray.offset`, :attr:`~SVMArray.contiguous`,
  :meth:`~SVMArray.byte_range`: where the bytes are;
* :attr:`SVMArray.unchecked_view`: the NumPy layout over the memory, for svmkit's own
  computing (no host-access check, not an export: never handed to users);
* :meth:`SVMArray.live`, :meth:`~SVMArray.check_host_access`,
  :meth:`~SVMArray.for_command`, :meth:`~SVMArray.for_transfer`,
  :meth:`~SVMArray.check_command`: the rules;
* :meth:`SVMArray.from_allocation`, :meth:`~SVMArray.view_of`: new arrays over memory;
* :meth:`SVMArray.describe`: how errors name the array.

An ``SVMArray`` *is* a ``pyopencl.SVM`` pointer, so PyOpenCL accepts it wherever it takes
SVM (``knl(queue, gsize, lsize, a)``, ``cl.enqueue_copy``), at the address of element 0.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyopencl as cl

from svmkit.driver import calls, fork
from svmkit.errors import InvalidValueError, MapStateError
from svmkit.events.record import check_wait_for, wait_pending
from svmkit.events.release import release_after
from svmkit.policy import Access, Policy
from svmkit.resources.base import Allocation
from svmkit.resources.exports import host_export
from svmkit.rules import (
    check_command,
    check_contiguous,
    check_queue,
    check_same_context,
    is_contiguous,
    use_after_free,
)

if TYPE_CHECKING:  # NumPy's surface, installed by svmkit.interop.numpy_surface at import
    from svmkit.arrays.surface_typing import NDArraySurface

    class _Base(cl.SVM, NDArraySurface):  # type: ignore[misc]
        pass
else:
    _Base = cl.SVM  # (a nanobind type: no second base class at run time)

__all__ = ["SVMArray", "byte_extent"]

FreeCallback = Callable[[cl.CommandQueue, list["SVMArray"]], Any]


def byte_extent(view: np.ndarray[Any, Any]) -> tuple[int, int]:
    """``(first, stop)`` byte addresses that a (possibly strided) view touches."""
    start = view.__array_interface__["data"][0]
    if view.size == 0:
        return start, start
    lo = hi = 0
    for n, stride in zip(view.shape, view.strides):
        span = (n - 1) * stride
        if span < 0:
            lo += span
        else:
            hi += span
    return start + lo, start + hi + view.itemsize


class SVMArray(_Base):
    """An N-dimensional array in shared virtual memory.

    Build one with :func:`svmkit.empty` and friends, or a pool's constructors.

    Notes
    -----
    * ``ptr`` is the virtual address of element 0, valid on the host and every device of
      the context (the point of SVM).
    * ``host`` is a NumPy view of the memory: always for FINE and SYSTEM granularity; for
      COARSE only while ``svmkit.mapped`` covers every byte (spec: the host may touch a
      coarse-grain buffer only between ``clEnqueueSVMMap`` and ``clEnqueueSVMUnmap``).
    * ``free()`` gives memory back only after every command svmkit recorded on it finished
      and every export of it (host views, DLPack capsules, PyOpenCL arrays) is gone.
    * NumPy's ``ndarray`` surface (installed by :mod:`svmkit.interop.numpy_surface`),
      DLPack, pickling and PyOpenCL arrays: :mod:`svmkit.interop`.  Comparisons are
      elementwise, so an SVMArray is unhashable (as a NumPy array).
    """

    __slots__ = ("_alloc", "_contiguous", "_offset", "_view", "base")

    _alloc: Allocation
    _view: np.ndarray[Any, Any]
    _offset: int
    _contiguous: bool  # whether the view's bytes form one run (views never change layout)
    base: SVMArray | None

    def __init__(
        self, alloc: Allocation, view: np.ndarray[Any, Any], base: SVMArray | None = None
    ) -> None:
        offset = view.__array_interface__["data"][0] - alloc.ptr if alloc.nbytes else 0
        contiguous = is_contiguous(view)
        if contiguous:
            super().__init__(view)
        else:  # PyOpenCL's SVM pointer wants contiguous memory: point at element 0's bytes
            super().__init__(alloc.u8[offset : byte_extent(view)[1] - alloc.ptr])
        self._alloc = alloc
        self._view = view
        self._offset = offset
        self._contiguous = contiguous
        self.base = base

    @classmethod
    def from_allocation(cls, alloc: Allocation, view: np.ndarray[Any, Any]) -> SVMArray:
        """A new array over the start of ``alloc``; ``view`` must be contiguous and begin at
        ``alloc.ptr`` (the constructors' fast path: no offset or layout computation)."""
        self = cls.__new__(cls)
        cl.SVM.__init__(self, view)
        self._alloc = alloc
        self._view = view
        self._offset = 0
        self._contiguous = True
        self.base = None
        return self

    # -- metadata ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._view.shape  # type: ignore[no-any-return]

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = self._view.dtype
        return dtype

    @property
    def size(self) -> int:
        return int(self._view.size)

    @property
    def nbytes(self) -> int:
        return int(self._view.nbytes)

    @property
    def ndim(self) -> int:
        return int(self._view.ndim)

    @property
    def itemsize(self) -> int:
        return int(self._view.itemsize)

    @property
    def strides(self) -> tuple[int, ...]:
        return self._view.strides

    @property
    def policy(self) -> Policy:
        return self._alloc.policy

    @property
    def context(self) -> cl.Context:
        return self._alloc.context

    @property
    def allocation(self) -> Allocation:
        """The allocation this array (or view) is a window on."""
        return self._alloc

    @property
    def offset(self) -> int:
        """Byte offset of element 0 from the start of the allocation."""
        return self._offset

    @property
    def freed(self) -> bool:
        return self._alloc.freed

    @property
    def contiguous(self) -> bool:
        """Whether the array's bytes form one gap-free run."""
        return self._contiguous

    @property
    def unchecked_view(self) -> np.ndarray[Any, Any]:
        """The NumPy array giving this array's shape, dtype and strides over its memory,
        for svmkit's own use: no liveness or host-access check, not an export (it does
        not keep memory alive), so it is never handed out; callers run the rules first."""
        return self._view

    def view_of(self, view: np.ndarray[Any, Any]) -> SVMArray:
        """An SVMArray view (``base`` the root array) over ``view``, a NumPy view of
        :attr:`unchecked_view` (basic indexing, transposes, reshapes...)."""
        return SVMArray(self._alloc, view, self.base if self.base is not None else self)

    def __len__(self) -> int:
        if not self._view.ndim:
            raise TypeError("len() of a 0-d SVMArray")
        return int(self._view.shape[0])

    @property
    def ptr(self) -> int:
        """Virtual address of element 0, valid on the host and on every device."""
        self.live()
        return self._alloc.ptr + self._offset

    # -- what cl.SVM hands out: refused once freed ----------------------------------------
    @property
    def svm_ptr(self) -> int:
        """``pyopencl.SVM.svm_ptr``: the address (:class:`~svmkit.UseAfterFreeError` once
        freed)."""
        self.live()
        return int(_SVM_PTR.__get__(self))

    @property
    def mem(self) -> np.ndarray[Any, Any]:
        """``pyopencl.SVM.mem``: a NumPy view of the memory; :class:`~svmkit.UseAfterFreeError`
        once freed.  FINE and SYSTEM: an export, as :attr:`host`, so one kept past ``free()``
        never reaches memory that another array owns.  COARSE: the host may touch it only
        while it is mapped (PyOpenCL's ``map`` reads this view; prefer
        :func:`svmkit.mapped`)."""
        alloc = self.live()
        if alloc.policy.needs_map:
            view: np.ndarray[Any, Any] = self._view.view()
            return view
        return host_export(alloc, self._view, self._offset)

    @property
    def buf(self) -> Any:
        """``pyopencl.SVMPointer.buf`` (:class:`~svmkit.UseAfterFreeError` once freed)."""
        self.live()
        return _SVM_BUF.__get__(self)

    def as_buffer(self, *args: Any, **kwargs: Any) -> Any:
        """``pyopencl.SVMPointer.as_buffer``: a ``cl.Buffer`` on the memory, untracked (the
        caller keeps it from outliving ``free()``); :class:`~svmkit.UseAfterFreeError` once
        freed."""
        self.live()
        return _SVM_AS_BUFFER(self, *args, **kwargs)

    def map(self, *args: Any, **kwargs: Any) -> Any:
        """``pyopencl.SVM.map``, untracked (prefer :func:`svmkit.mapped`);
        :class:`~svmkit.UseAfterFreeError` once freed."""
        self.live()
        return _SVM_MAP(self, *args, **kwargs)

    def map_ro(self, *args: Any, **kwargs: Any) -> Any:
        """``pyopencl.SVM.map_ro``, untracked (prefer :func:`svmkit.mapped`);
        :class:`~svmkit.UseAfterFreeError` once freed."""
        self.live()
        return _SVM_MAP_RO(self, *args, **kwargs)

    def map_rw(self, *args: Any, **kwargs: Any) -> Any:
        """``pyopencl.SVM.map_rw``, untracked (prefer :func:`svmkit.mapped`);
        :class:`~svmkit.UseAfterFreeError` once freed."""
        self.live()
        return _SVM_MAP_RW(self, *args, **kwargs)

    def byte_range(self) -> tuple[int, int]:
        """``(start, stop)`` offsets into the allocation of every byte this array touches
        (O(1) for contiguous arrays)."""
        if self._contiguous:
            return self._offset, self._offset + self._view.nbytes
        lo, hi = byte_extent(self._view)
        base = self._alloc.ptr
        return lo - base, hi - base

    def live(self) -> Allocation:
        """The allocation, or :class:`~svmkit.UseAfterFreeError` once it was freed."""
        alloc = self._alloc
        if alloc.freed:
            raise use_after_free(self.describe())
        if fork.forked:
            fork.check_owned(alloc.context, f"this {self.describe()}")
        return alloc

    def for_command(
        self, context: cl.Context, writes: bool | None, name: str, what: str
    ) -> Allocation:
        """The allocation, checked for a command of ``context`` on this array's bytes.

        The operations' hot path runs the rules in one call, in this order (the order of
        the errors): live (:meth:`live`), of the command's context
        (:func:`~svmkit.rules.check_same_context`, naming the array ``name``), clear of
        conflicting maps (:func:`~svmkit.rules.check_command`, naming the command
        ``what``; ``writes=None``: a write unless the policy is read-only).  Each rule
        keeps its own function; the cheap tests here only decide whether it must run.
        """
        alloc = self._alloc
        if alloc.freed or fork.forked:
            alloc = self.live()
        if alloc.context is not context:
            check_same_context(alloc, context, name)
        state = alloc.map_state
        if state is not None and state.stop:
            if writes is None:
                writes = alloc.policy.access is not Access.READ_ONLY
            self.check_command(alloc, writes, what)
        return alloc

    def for_transfer(
        self, context: cl.Context, writes: bool, name: str, what: str
    ) -> tuple[Allocation, int, int]:
        """``(allocation, address of element 0, byte count)``, checked for a command of
        ``context`` that takes one pointer and a size (a copy side).

        The rules of :meth:`for_command`, with one run of bytes
        (:func:`~svmkit.rules.check_contiguous`) checked after the context; one call
        where a copy would otherwise read three attributes besides.
        """
        alloc = self._alloc
        if alloc.freed or fork.forked:
            alloc = self.live()
        if alloc.context is not context:
            check_same_context(alloc, context, name)
        if not self._contiguous:
            check_contiguous(self._view, name)
        state = alloc.map_state
        if state is not None and state.stop:
            self.check_command(alloc, writes, what)
        return alloc, alloc.ptr + self._offset, self._view.nbytes

    def check_command(self, alloc: Allocation, writes: bool, what: str) -> None:
        """The map-state rule for a command on this array's bytes (see
        :func:`svmkit.rules.check_command`)."""
        state = alloc.map_state
        if state is not None and state.stop:
            lo, hi = self.byte_range()
            check_command(alloc, lo, hi, writes, what)

    def describe(self) -> str:
        """``SVMArray shape=... dtype=...`` (``SVMArray view ...`` for a view), for errors."""
        kind = "SVMArray view" if self.base is not None else "SVMArray"
        return f"{kind} shape={self.shape} dtype={self.dtype}"

    def record(self, event: cl.Event) -> None:
        """Record that ``event`` uses this array's memory (``free`` and pools wait for it)."""
        self._alloc.events.record(event)

    def pending_events(self) -> list[cl.Event]:
        """Commands recorded on this array's allocation that have not finished."""
        return self._alloc.events.pending()

    # -- host access ---------------------------------------------------------------------
    def check_host_access(self, reads: bool = False, writes: bool = False) -> bool:
        """The host-access rule, for every way the host touches the memory (``.host``,
        ``np.asarray``, the NumPy protocol, item access); returns whether the host may
        write through a view of it.

        FINE and SYSTEM memory is host memory: always (spec: the host may access
        fine-grain buffer and system SVM at any time).  COARSE memory only between
        ``clEnqueueSVMMap`` and its unmap, and only for the access the map flags allow:
        ``reads`` needs maps in mode ``"r"`` or ``"rw"`` over every byte, ``writes`` maps
        in mode ``"w"``, ``"rw"`` or ``"w_invalidate"``, a view (neither) any map; the
        view is writable while write maps cover every byte.  Else
        :class:`~svmkit.MapStateError`, naming ``svmkit.mapped`` and the mode.
        """
        alloc = self.live()
        if not alloc.policy.needs_map:
            return True
        lo, hi = self.byte_range()
        if lo >= hi:  # a zero-byte array touches no memory (`mapped` registers no map)
            return True
        state = alloc.map_state
        if state is None:
            raise _host_access_error(self.describe(), reads, writes)
        if state.covers(lo, hi, reads, True):  # (write maps cover it: allowed and writable)
            return True
        if writes or not state.covers(lo, hi, reads, False):
            raise _host_access_error(self.describe(), reads, writes)
        # (covered, not by maps that allow both; without `reads` that is all there is)
        return reads and state.covers(lo, hi, False, True)

    @property
    def host(self) -> np.ndarray[Any, Any]:
        """A NumPy view of the memory (COARSE: only while mapped, else MapStateError).

        FINE and SYSTEM: an *export* (:mod:`svmkit.resources.exports`): the view, and every
        view of it, keeps the memory alive after ``free()``.  COARSE: valid only inside
        the ``mapped`` block (the spec gives the host no access to unmapped coarse-grain
        memory), read-only unless maps for writing cover it (``"w"``, ``"rw"``,
        ``"w_invalidate"``); svmkit cannot stop a write through one kept past the block.
        """
        writable = self.check_host_access()
        if self._alloc.policy.needs_map:
            view: np.ndarray[Any, Any] = self._view.view()
            if not writable:
                view.flags.writeable = False
            return view
        return host_export(self._alloc, self._view, self._offset)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        from svmkit.interop.numpy_protocol import array_of

        return array_of(self, dtype, copy)

    # -- transfers ------------------------------------------------------------------------
    def get(self, queue: cl.CommandQueue | None = None) -> np.ndarray[Any, Any]:
        """A new NumPy array holding the contents, after all recorded work on the array.

        Blocks until the copy finished.  COARSE arrays are copied with
        ``clEnqueueSVMMemcpy`` (no map), so this works outside ``mapped``.
        """
        alloc = self.live()
        queue = check_queue(queue, alloc.context)  # CL_INVALID_COMMAND_QUEUE / _CONTEXT
        out = np.empty(self.shape, self.dtype)
        if out.size == 0:
            return out
        pending = alloc.events.pending()
        if not alloc.policy.needs_map:
            wait_pending(pending)
            out[...] = self._view
            return out
        self.check_command(alloc, False, "get()")
        if self.contiguous:
            target = out if self._view.flags.c_contiguous else np.asfortranarray(out)
            calls.copy_and_wait(queue, target, self, pending)
            if target is not out:
                out[...] = target
            return out
        span = self._read_span(queue, pending)
        out[...] = self._strided(span)
        return out

    def set(self, ary: Any, queue: cl.CommandQueue | None = None) -> None:
        """Write ``ary`` (broadcast and cast to this array's shape and dtype) into the array.

        Orders itself after all recorded work on the array and returns when the data is in
        SVM (the source may be reused at once).
        """
        alloc = self.live()
        queue = check_queue(queue, alloc.context)  # CL_INVALID_COMMAND_QUEUE / _CONTEXT
        src = np.asarray(ary, dtype=self.dtype)
        try:
            src = np.broadcast_to(src, self.shape)
        except ValueError as exc:
            raise InvalidValueError(
                f"cannot set an array of shape {self.shape} from shape {np.shape(ary)}"
            ) from exc
        if self.size == 0:
            return
        pending = alloc.events.pending()
        if not alloc.policy.needs_map:
            wait_pending(pending)
            self._view[...] = src
            return
        self.check_command(alloc, True, "set()")
        if self._view.flags.c_contiguous:
            # PyOpenCL wraps the source as an SVM pointer, which needs a writable buffer.
            flags = src.flags
            data = src if flags.c_contiguous and flags.writeable else np.array(src, order="C")
            calls.copy_and_wait(queue, self, data, pending)
            return
        # Strided COARSE view: read the bytes it spans, patch them, write them back.
        span = self._read_span(queue, pending)
        self._strided(span)[...] = src
        lo, hi = byte_extent(self._view)
        dst = calls.svm_pointer(alloc.u8[lo - alloc.ptr : hi - alloc.ptr])
        calls.copy_and_wait(queue, dst, span, [])

    def _read_span(self, queue: cl.CommandQueue, pending: list[cl.Event]) -> np.ndarray[Any, Any]:
        alloc = self._alloc
        lo, hi = byte_extent(self._view)
        span = np.empty(hi - lo, np.uint8)
        src = calls.svm_pointer(alloc.u8[lo - alloc.ptr : hi - alloc.ptr])
        calls.copy_and_wait(queue, span, src, pending)
        return span

    def _strided(self, span: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The elements of this view inside a host copy of its byte span."""
        lo, _ = byte_extent(self._view)
        first = self._view.__array_interface__["data"][0] - lo
        strided: np.ndarray[Any, Any] = np.ndarray(
            self.shape, self.dtype, buffer=span, offset=first, strides=self.strides
        )
        return strided

    # -- freeing ---------------------------------------------------------------------------
    def free(self) -> None:
        """Free the allocation (and so every view of it); idempotent.

        The memory goes back to its resource only after every command recorded on it
        finished; this call itself does not block.  Recorded are the commands svmkit
        enqueues (operations, :func:`svmkit.launch`, the kernels of an
        :class:`svmkit.Program`) and the events named by :func:`svmkit.record`.  svmkit
        cannot see work enqueued by other means (a raw ``pyopencl.Kernel`` call,
        ``pyopencl.array``, another library): record its event with
        ``sk.record(event, a)`` before freeing, or wait for it.  After ``free()`` every use
        of the array, a view or an attribute that hands out memory (``ptr``, ``mem``,
        ``host``...) raises :class:`~svmkit.UseAfterFreeError`; a freed array given to raw
        PyOpenCL is the caller's responsibility.
        """
        self._alloc.free()

    def enqueue_free(
        self,
        queue: cl.CommandQueue,
        callback: FreeCallback | None = None,
        wait_for: Sequence[cl.Event] | None = None,
    ) -> cl.Event:
        """``clEnqueueSVMFree`` semantics: free after earlier commands of ``queue``.

        The array is unusable at once; the memory goes back to its resource after the
        returned marker event (which waits for ``queue``'s earlier commands and
        ``wait_for``) and every recorded command completed.  ``callback(queue, [array])``
        then runs exactly once, on svmkit's release thread.  On an array already freed it
        returns a completed event and does nothing else.

        Notes
        -----
        PoCL 3.0's ``clEnqueueSVMFree`` keeps the caller's pointer array and double-frees;
        svmkit therefore never calls it: a marker event plus ``clSVMFree`` gives the same
        ordering on every implementation.
        """
        alloc = self._alloc
        if fork.forked:
            fork.check_owned(alloc.context, f"this {self.describe()}")
        queue = check_queue(queue, alloc.context)  # CL_INVALID_COMMAND_QUEUE / _CONTEXT
        events = check_wait_for(alloc.context, wait_for)
        if alloc.freed:
            done = calls.new_user_event(alloc.context)
            calls.set_event_status(done)  # CL_COMPLETE
            return done
        state = alloc.map_state
        if state is not None and state.maps:
            raise MapStateError(
                f"enqueue_free() of a {self.describe()} while it is mapped on the host: "
                "leave the `mapped` block first (the spec forbids freeing mapped memory "
                "before it is unmapped)"
            )
        marker = calls.enqueue_marker(queue, events)
        alloc.events.record(marker)
        alloc.free()
        if callback is not None:
            once = _Once(callback, queue, [self])
            release_after([marker], once, background=True)
        return marker

    def __enter__(self) -> SVMArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    # -- protocols whose meaning is svmkit's (each delegates to svmkit.interop) ----------
    def __reduce__(self) -> tuple[Any, ...]:
        from svmkit.interop.pickling import reduce

        return reduce(self)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        from svmkit.interop.dlpack import dlpack

        return dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        from svmkit.interop.dlpack import dlpack_device

        return dlpack_device(self)

    def to_cl_array(self, queue: cl.CommandQueue | None = None) -> Any:
        """A ``pyopencl.array.Array`` over the same memory (an export; every granularity)."""
        from svmkit.interop.cl_array import to_cl_array

        return to_cl_array(self, queue)


_SVM_PTR = cl.SVMPointer.svm_ptr
_SVM_BUF = cl.SVMPointer.buf
_SVM_AS_BUFFER = cl.SVMPointer.as_buffer
_SVM_MAP = cl.SVM.map
_SVM_MAP_RO = cl.SVM.map_ro
_SVM_MAP_RW = cl.SVM.map_rw
"""What ``cl.SVM`` offers that hands out memory; SVMArray checks liveness first."""


def _host_access_error(what: str, reads: bool, writes: bool) -> MapStateError:
    """The error of :meth:`SVMArray.check_host_access` for ``what`` (an array or view)."""
    if reads and writes:
        access, modes = "read and write", '"rw"'
    elif reads:
        access, modes = "read", '"r" or "rw"'
    elif writes:
        access, modes = "write", '"w", "rw" or "w_invalidate"'
    else:
        access, modes = "access", "any mode"
    return MapStateError(
        f"host {access} of a coarse-grain {what} outside a map that allows it: the spec "
        "lets the host touch coarse-grain SVM only while it is mapped, and only as the map "
        f"flags allow; use `with svmkit.mapped(queue, a, mode) as h:` (mode {modes}) "
        "or a.get()/a.set()"
    )


class _Once:
    """Call ``callback(*args)`` at most once."""

    __slots__ = ("args", "callback", "lock")

    def __init__(self, callback: Callable[..., Any], *args: Any) -> None:
        self.callback: Callable[..., Any] | None = callback
        self.args = args
        self.lock = threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            callback, self.callback = self.callback, None
        if callback is not None:
            callback(*self.args)


def _shape_tuple(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        dims = tuple(int(n) for n in shape)
    except TypeError as exc:
        raise InvalidValueError(
            f"shape must be an int or a sequence of ints, got {shape!r}"
        ) from exc
    if any(n < 0 for n in dims):
        raise InvalidValueError(f"negative dimensions are not allowed: shape {dims}")
    return dims


def nbytes_of(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes an array of ``shape`` and ``dtype`` needs."""
    return math.prod(shape) * dtype.itemsize


ArraySpec = tuple[tuple[int, ...], np.dtype[Any], int]
_DTYPE_CLASSES: set[type] = set()
"""The exact classes of the dtypes :func:`array_spec` has seen (``np.dtypes.Float64DType``...)."""


def array_spec(shape: Any, dtype: Any) -> ArraySpec:
    """``(shape tuple, dtype, nbytes)`` for a constructor's ``shape`` and ``dtype``,
    validated (a non-negative int and a NumPy dtype, numeric code's usual call, convert
    nothing)."""
    if type(shape) is int and shape >= 0:
        if type(dtype) in _DTYPE_CLASSES:  # (a set lookup: isinstance on np.dtype is slower)
            return (shape,), dtype, shape * dtype.itemsize
        if isinstance(dtype, np.dtype):
            _DTYPE_CLASSES.add(type(dtype))
            return (shape,), dtype, shape * dtype.itemsize
    shape_t = _shape_tuple(shape)
    dt = np.dtype(dtype)
    return shape_t, dt, nbytes_of(shape_t, dt)
