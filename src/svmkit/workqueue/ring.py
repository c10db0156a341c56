"""Host-side atomics on SVM words, and the host operations of the work-queue ring.

Two implementations of one interface, ``Ring(address, capacity, itemsize, kind)``:

* ``svmkit.workqueue._cring.Ring`` (C, built by ``setup.py`` when a compiler is present): every
  operation is one C call with GCC ``__atomic`` builtins; blocking waits spin without the
  GIL.  This is the fast path (about 0.1 µs per single-item push).
* :class:`PyRing` (this module, no compiler needed): the same protocol with one atomic
  compare-exchange per call (per batch for ``*_many``) through ctypes, and NumPy loads and
  stores for the slot sequence numbers and payloads.

Memory orders the pure-Python ring relies on.  The protocol (kernels/svmkit_workqueue.h)
needs ACQUIRE loads and RELEASE stores of each slot's ``seq`` and atomic read-modify-writes
of ``head``/``tail``.  On x86-64 (total store order) an aligned 8-byte load is an acquire
load and an aligned 8-byte store a release store, and NumPy performs separate assignment
statements in program order with aligned element accesses, so the payload stores of one
statement are visible before the ``seq`` stores of the next.  The read-modify-writes are
``lock cmpxchg`` (a full barrier).  On any other architecture (no TSO) :class:`PyRing`
performs each ``seq`` load and store through libatomic's ``__atomic_load_8`` (ACQUIRE) and
``__atomic_store_8`` (RELEASE), one item at a time: slower, but correct.

The compare-exchange comes from libatomic (``__atomic_compare_exchange_8``); svmkit writes no
machine code at run time (no executable memory).  ``SVMKIT_HOSTATOMICS=python`` forces the
pure-Python ring (``native`` requires C).  Both rings take the layout from
:mod:`svmkit.workqueue.layout`; the C ring is used only when the constants it was built with
(``_cring.LAYOUT``) equal that module's, so a stale build cannot misread a ring.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from svmkit.resources.base import host_bytes
from svmkit.workqueue import layout
from svmkit.workqueue.layout import (
    CLOSED_BIT,
    CLOSED_OFFSET,
    HEAD_OFFSET,
    HEADER_BYTES,
    ITEM_OFFSET,
    ITEM_SIZE_OFFSET,
    MAGIC,
    MAGIC_OFFSET,
    MAX_ITEM_BYTES,
    PARAMS_OFFSET,
    SLOT_BYTES_OFFSET,
    TAIL_OFFSET,
)

__all__ = [
    "CasProvider",
    "PyRing",
    "RingOps",
    "available_backends",
    "cas_provider",
    "ring_class",
]

log = logging.getLogger(__name__)

HOST_IS_TSO = platform.machine().lower() in ("x86_64", "amd64", "x86", "i386", "i686")

_ACQUIRE, _RELEASE, _SEQ_CST = 2, 3, 5
_WAIT_CAP_NS = 5_000_000  # the longest one wait() polls (as the C ring's)


class RingOps(Protocol):
    """What :class:`svmkit.WorkQueue` needs from a ring implementation."""

    def try_push(self, item: Any, /) -> int: ...
    def try_pop(self) -> Any: ...
    def try_push_many(self, buffer: Any, start: int, /) -> int: ...
    def try_pop_many(self, buffer: Any, start: int, /) -> int: ...
    def close(self) -> bool: ...
    def reopen(self) -> int: ...
    def closed(self) -> bool: ...
    def drained(self) -> bool: ...
    def length(self) -> int: ...
    def wait(self, for_pop: bool, idle_ns: int, want: int = 1, flags: int = 0, /) -> bool: ...


class CasProvider:
    """A 64-bit compare-exchange on an address: ``cas(addr, expected, desired) -> old``."""

    def __init__(
        self,
        name: str,
        cas: Callable[[int, int, int], int],
        load: Callable[[int], int] | None = None,
        store: Callable[[int, int], None] | None = None,
    ) -> None:
        self.name = name
        self.cas = cas
        self.load = load
        self.store = store


def _libatomic() -> CasProvider | None:
    path = ctypes.util.find_library("atomic")
    candidates = [path] if path else []
    candidates += ["libatomic.so.1", "libatomic.dylib"]
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
            return _libatomic_provider(lib, candidate)
        except (OSError, AttributeError):
            continue
    return None


def _libatomic_provider(lib: ctypes.CDLL, name: str) -> CasProvider:
    cmpxchg = lib.__atomic_compare_exchange_8
    cmpxchg.restype = ctypes.c_bool
    cmpxchg.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_uint64,
        ctypes.c_int,
        ctypes.c_int,
    ]
    load8 = lib.__atomic_load_8
    load8.restype = ctypes.c_uint64
    load8.argtypes = [ctypes.c_void_p, ctypes.c_int]
    store8 = lib.__atomic_store_8
    store8.restype = None
    store8.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int]

    def cas(addr: int, expected: int, desired: int) -> int:
        box = ctypes.c_uint64(expected)
        cmpxchg(addr, ctypes.byref(box), desired, _SEQ_CST, _SEQ_CST)
        return box.value

    def load(addr: int) -> int:
        return int(load8(addr, _ACQUIRE))

    def store(addr: int, value: int) -> None:
        store8(addr, value, _RELEASE)

    return CasProvider(f"libatomic ({name})", cas, load, store)


@functools.cache
def cas_provider() -> CasProvider:
    """The compare-exchange (and atomic loads and stores) the pure-Python ring uses:
    libatomic's, the only one (svmkit creates no executable memory)."""
    provider = _libatomic()
    if provider is not None:
        return provider
    from svmkit.errors import UnsupportedError

    raise UnsupportedError(
        f"no host atomics for the work queue on {platform.machine()}: build svmkit with a C "
        "compiler (svmkit.workqueue._cring) or install libatomic"
    )


class PyRing:
    """The ring's host operations in Python (same interface as ``_cring.Ring``).

    ``kind`` is ``"i"``/``"u"``/``"f"`` for integer, unsigned and float items, ``"r"``
    for raw bits that the caller converts (stored as unsigned integers of ``itemsize``), or
    ``"b"`` for records of ``itemsize`` bytes (``bytes`` in and out).  The slot stride is
    read from the ring's header (``slot_bytes``, written by the host that created it).
    """

    def __init__(
        self,
        address: int,
        capacity: int,
        itemsize: int,
        kind: str,
        *,
        provider: CasProvider | None = None,
        tso: bool | None = None,
    ) -> None:
        limit = MAX_ITEM_BYTES if kind == "b" else 8
        if capacity < 2 or capacity & (capacity - 1) or not 1 <= itemsize <= limit:
            raise ValueError("bad ring parameters")
        self._cas = (provider or cas_provider()).cas
        self._provider = provider or cas_provider()
        self._tso = HOST_IS_TSO if tso is None else tso
        if not self._tso and self._provider.load is None:
            raise ValueError("a non-TSO host needs atomic loads and stores (libatomic)")
        self._address = address
        self._mask = capacity - 1
        self._capacity = capacity
        head = host_bytes(address, HEADER_BYTES)
        stride = int(head[SLOT_BYTES_OFFSET : SLOT_BYTES_OFFSET + 4].view(np.uint32)[0])
        params = (
            int(head[PARAMS_OFFSET + 8 : PARAMS_OFFSET + 16].view(np.uint64)[0]),
            int(head[ITEM_SIZE_OFFSET : ITEM_SIZE_OFFSET + 4].view(np.uint32)[0]),
            int(head[MAGIC_OFFSET : MAGIC_OFFSET + 4].view(np.uint32)[0]),
        )
        if params != (capacity, itemsize, MAGIC) or stride % 8 or stride < ITEM_OFFSET + itemsize:
            raise ValueError(
                f"the ring header does not describe this ring (capacity, item size, magic "
                f"{params}, slot bytes {stride})"
            )
        self._stride = stride
        raw = host_bytes(address, HEADER_BYTES + capacity * stride)
        self._words = raw.view(np.uint64)
        self._closed_word = raw[CLOSED_OFFSET : CLOSED_OFFSET + 4].view(np.uint32)
        self._seq = self._words[HEADER_BYTES // 8 :: stride // 8]
        letter = "u" if kind == "r" else kind
        self._dtype = np.dtype(f"V{itemsize}" if kind == "b" else f"{letter}{itemsize}")
        self._items: np.ndarray[Any, Any] = np.ndarray(
            (capacity,),
            self._dtype,
            buffer=raw,
            offset=HEADER_BYTES + ITEM_OFFSET,
            strides=(stride,),
        )
        self._tail_addr = address + TAIL_OFFSET
        self._head_addr = address + HEAD_OFFSET
        self._seq_addr0 = address + HEADER_BYTES

    # seq accesses: NumPy on TSO hosts, libatomic acquire/release elsewhere
    def _load_seq(self, slot: int) -> int:
        if self._tso:
            return int(self._seq[slot])
        assert self._provider.load is not None
        return self._provider.load(self._seq_addr0 + slot * self._stride)

    def _store_seq(self, slot: int, value: int) -> None:
        if self._tso:
            self._seq[slot] = value
        else:
            assert self._provider.store is not None
            self._provider.store(self._seq_addr0 + slot * self._stride, value)

    def _load_word(self, index: int) -> int:
        if self._tso:
            return int(self._words[index])
        assert self._provider.load is not None
        return self._provider.load(self._address + 8 * index)

    def try_push(self, item: Any) -> int:
        """1 pushed, 0 full, -1 closed."""
        value = self._dtype.type(item)  # convert (and raise) before claiming a slot
        if value.dtype != self._dtype:  # a record given as bytes of another length
            raise ValueError(f"a record item must be {self._dtype.itemsize} bytes")
        pos = self._load_word(TAIL_OFFSET // 8)
        while True:
            if pos & CLOSED_BIT:
                return -1
            slot = pos & self._mask
            dif = self._load_seq(slot) - pos
            if dif == 0:
                old = self._cas(self._tail_addr, pos, pos + 1)
                if old == pos:
                    self._items[slot] = value
                    self._store_seq(slot, pos + 1)
                    return 1
                pos = old
            elif dif < 0:
                return 0
            else:
                pos = self._load_word(TAIL_OFFSET // 8)

    def try_pop(self) -> Any:
        """The item (a Python number), or None when nothing is published at head."""
        pos = self._load_word(HEAD_OFFSET // 8)
        while True:
            slot = pos & self._mask
            dif = self._load_seq(slot) - (pos + 1)
            if dif == 0:
                old = self._cas(self._head_addr, pos, pos + 1)
                if old == pos:
                    value = self._items[slot].item()
                    self._store_seq(slot, pos + self._capacity)
                    return value
                pos = old
            elif dif < 0:
                return None
            else:
                pos = self._load_word(HEAD_OFFSET // 8)

    def try_push_many(self, buffer: Any, start: int) -> int:
        """Push ``buffer[start:]`` with one reservation: count pushed, 0 full, -1 closed."""
        src = np.asarray(buffer).view(self._dtype)
        n = len(src) - start
        if n <= 0:
            return 0
        if not self._tso:  # one acquire/release pair per item: go item by item
            count = 0
            for value in src[start:].tolist():
                status = self.try_push(value)
                if status != 1:
                    return count if count else status
                count += 1
            return count
        cap = self._capacity
        pos = int(self._words[TAIL_OFFSET // 8])
        while True:
            if pos & CLOSED_BIT:
                return -1
            used = max(0, pos - int(self._words[HEAD_OFFSET // 8]))  # < 0: claimed ahead
            if used >= cap:
                return 0
            k = min(n, cap - used)
            old = self._cas(self._tail_addr, pos, pos + k)
            if old == pos:
                break
            pos = old
        done = 0
        while done < k:
            p = pos + done
            slot = p & self._mask
            m = min(k - done, cap - slot)
            expected = np.arange(p, p + m, dtype=np.uint64)
            seg = slice(slot, slot + m)
            # last lap's consumers claimed these slots already; wait until they let go
            while not np.array_equal(self._seq[seg], expected):
                time.sleep(0)
            self._items[seg] = src[start + done : start + done + m]
            self._seq[seg] = expected + np.uint64(1)
            done += m
        return k

    def try_pop_many(self, buffer: Any, start: int) -> int:
        """Pop the published run at head into ``buffer[start:]`` with one reservation."""
        out = np.asarray(buffer).view(self._dtype)
        n = len(out) - start
        if n <= 0:
            return 0
        if not self._tso:
            count = 0
            while count < n:
                value = self.try_pop()
                if value is None:
                    break
                out[start + count] = value
                count += 1
            return count
        cap = self._capacity
        pos = int(self._words[HEAD_OFFSET // 8])
        while True:
            slot = pos & self._mask
            m = min(n, cap - slot)
            expected = np.arange(pos + 1, pos + 1 + m, dtype=np.uint64)
            ready = self._seq[slot : slot + m] == expected
            k = m if ready.all() else int(np.argmin(ready))
            if k == 0:
                if int(self._seq[slot]) - (pos + 1) > 0:  # head moved on
                    pos = int(self._words[HEAD_OFFSET // 8])
                    continue
                return 0
            old = self._cas(self._head_addr, pos, pos + k)
            if old == pos:
                break
            pos = old
        out[start : start + k] = self._items[slot : slot + k]
        self._seq[slot : slot + k] = expected[:k] + np.uint64(cap - 1)
        return k

    def close(self) -> bool:
        """Set tail's closed bit (compare-exchange loop); True if the queue was open."""
        while True:
            old = self._load_word(TAIL_OFFSET // 8)
            if old & CLOSED_BIT:
                opened = False
                break
            if self._cas(self._tail_addr, old, old | CLOSED_BIT) == old:
                opened = True
                break
        self._closed_word[0] = 1  # mirror; the bit in tail is what decides
        return opened

    def reopen(self) -> int:
        """Clear tail's closed bit of a closed, drained ring: 1 reopened, 0 it was open,
        -1 not drained.  Positions that consumers claimed ahead of tail (a device ``wq_pop``
        waiting when the queue closed) are marked consumed and tail moves up to head, so the
        next lap's producers find every slot free.  Nothing may use the ring meanwhile."""
        old = self._load_word(TAIL_OFFSET // 8)
        if not old & CLOSED_BIT:
            return 0
        pos = old & ~CLOSED_BIT
        head = self._load_word(HEAD_OFFSET // 8)
        if head < pos:
            return -1
        for p in range(pos, head):  # claimed ahead, never published: free for lap + 1
            self._store_seq(p & self._mask, p + self._capacity)
        if self._cas(self._tail_addr, old, head) != old:
            return 0  # (another reopen won)
        self._closed_word[0] = 0
        return 1

    def closed(self) -> bool:
        return bool(self._load_word(TAIL_OFFSET // 8) & CLOSED_BIT)

    def drained(self) -> bool:
        tail = self._load_word(TAIL_OFFSET // 8)
        if not tail & CLOSED_BIT:
            return False
        return self._load_word(HEAD_OFFSET // 8) >= tail & ~CLOSED_BIT

    def length(self) -> int:
        head = self._load_word(HEAD_OFFSET // 8)
        tail = self._load_word(TAIL_OFFSET // 8) & ~CLOSED_BIT
        return max(0, min(tail - head, self._capacity))

    def wait(self, for_pop: bool, idle_ns: int, want: int = 1, flags: int = 0) -> bool:
        """Poll until the slot at head (``for_pop``) or tail is ready or the queue closes
        (True), giving the GIL and the core away between looks (``time.sleep(0)``); False
        once the other side (tail for a pop, head for a push) did not move for ``idle_ns``.
        ``want`` and ``flags`` are the C ring's (the first slot decides here; every look
        yields here, and any number of threads may poll)."""
        counter, other = (HEAD_OFFSET // 8, TAIL_OFFSET // 8)[:: 1 if for_pop else -1]
        seen = self._load_word(other)
        moved_at = start = time.monotonic_ns()
        while True:
            if self._closed_word[0]:
                return True
            pos = self._load_word(counter) & ~CLOSED_BIT
            if self._load_seq(pos & self._mask) - (pos + (1 if for_pop else 0)) >= 0:
                return True
            time.sleep(0)
            now = time.monotonic_ns()
            moved = self._load_word(other)
            if moved != seen:
                seen, moved_at = moved, now
            elif now - moved_at >= idle_ns or now - start >= _WAIT_CAP_NS:
                return now - moved_at < idle_ns


@functools.cache
def _native() -> type | None:
    """The C ring, if it was built with this package's layout (else None, logged)."""
    try:
        from svmkit.workqueue import _cring
    except ImportError:
        return None
    built = getattr(_cring, "LAYOUT", None)
    if built != layout.as_dict():
        log.warning(
            "svmkit.workqueue._cring was built with another ring layout (%r, expected %r): "
            "using the pure-Python ring; reinstall svmkit to rebuild it",
            built,
            layout.as_dict(),
        )
        return None
    return _cring.Ring


def available_backends() -> tuple[str, ...]:
    """``("native", "python")`` when the C helper is built, else ``("python",)``."""
    return ("native", "python") if _native() is not None else ("python",)


def ring_class(backend: str | None = None) -> Callable[..., RingOps]:
    """The ring implementation: ``backend`` or ``SVMKIT_HOSTATOMICS`` ("native"/"python"),
    else the native one when it was built."""
    choice = backend or os.environ.get("SVMKIT_HOSTATOMICS") or None
    native = _native()
    if choice == "python" or (choice is None and native is None):
        return PyRing
    if native is None:
        from svmkit.errors import UnsupportedError

        raise UnsupportedError(
            "svmkit.workqueue._cring is not available (not built: no C compiler at install; "
            "or built with another ring layout)"
        )
    if choice not in (None, "native"):
        from svmkit.errors import InvalidValueError

        raise InvalidValueError(
            f"host atomics backend must be 'native' or 'python', got {choice!r}"
        )
    return native
