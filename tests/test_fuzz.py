"""Model-based fuzzing of svmkit's public API against a pure-NumPy model of the bytes.

A hypothesis state machine allocates arrays (raw resources and pools, every granularity
the device supports), takes views, fills, copies, migrates, maps (every mode, nested and
overlapping, closed in any order), launches a small kernel, writes through maps, and frees
(``free``, ``enqueue_free``, ``with``).  After every step the bytes of every live
allocation are read back and compared with the model.

It also takes *exports* (host views, ``np.asarray``, ``np.from_dlpack``, raw DLPack
capsules, PyTorch tensors, ``pyopencl.array`` bridges) and writes through them before and
after their array is freed and its pool block could be handed out again: an export's
bytes must stay its own (compared with the model after every step) and no other array's
bytes may change.

Every step also predicts the errors the API documents for it (use after free, pattern
size and alignment, contiguity, sizes, overlapping copies, map-state rules...).  A step
that must fail has to raise one of the predicted classes with the predicted ``cl_error``
and leave the model *and* the memory unchanged (the next comparison proves the latter);
a step with no predicted error must succeed.

Profiles (``SVMKIT_FUZZ_PROFILE``): ``quick`` (default, deterministic, a few seconds) and
``deep`` (10,000 sequences per run; see RELIABILITY.md for the command).
"""

from __future__ import annotations

import gc
import io
import os
import threading
import weakref
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import svmkit as sk
from svmkit import events

try:
    import torch
except ImportError:  # PyTorch is optional: its exports are then not drawn
    torch = None

settings.register_profile(
    "quick",
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "deep",
    max_examples=int(os.environ.get("SVMKIT_FUZZ_EXAMPLES", "10000")),
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
PROFILE = os.environ.get("SVMKIT_FUZZ_PROFILE", "quick")

os.environ.setdefault("POCL_DEVICES", "pthread pthread")
CTX = sk.create_context()
CAPS = sk.capabilities(CTX)
QUEUE = cl.CommandQueue(CTX)
DTYPES = [np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64)]
PATTERN_SIZES = {1, 2, 4, 8, 16, 32, 64, 128}

KERNEL_SOURCE = """
__kernel void xor_bytes(__global uchar *p, uint count, long stride, uint itemsize, uchar k)
{
    size_t i = get_global_id(0);
    if (i < count) {
        long e = (long)(i / itemsize);
        long b = (long)(i % itemsize);
        p[e * stride + b] ^= k;
    }
}
"""
XOR_PROGRAM = sk.build_program(CTX, KERNEL_SOURCE)
XOR = XOR_PROGRAM.xor_bytes  # a tracked sk.Kernel
RAW_XOR = cl.Kernel(XOR_PROGRAM, "xor_bytes")  # a plain one: its work is named by sk.record


def _policies() -> list[tuple[str, sk.Policy]]:
    out = []
    if CAPS.coarse_grain_buffer:
        out.append(("coarse", sk.Policy.coarse()))
    if CAPS.fine_grain_buffer:
        out.append(("fine", sk.Policy.fine()))
        if CAPS.atomics:
            out.append(("fine+atomics", sk.Policy.fine(atomics=True)))
    if CAPS.fine_grain_system:
        out.append(("system", sk.Policy.system()))
    return out


POLICIES = _policies()
HAS_POOL = hasattr(sk, "Pool")

IVE = (sk.InvalidValueError, "CL_INVALID_VALUE")
UAF = (sk.UseAfterFreeError, None)
MSE = (sk.MapStateError, None)
OVERLAP = (sk.CopyOverlapError, "CL_MEM_COPY_OVERLAP")


# -- the model ----------------------------------------------------------------------------


@dataclass(eq=False)
class AllocModel:
    """The bytes of one allocation as svmkit should hold them."""

    ident: int
    policy: sk.Policy
    pooled: bool
    data: np.ndarray  # uint8, the expected bytes
    known: np.ndarray  # bool: bytes whose value is defined (empty/w_invalidate: not)
    base: sk.SVMArray  # the array that came from the constructor
    freed: bool = False
    driver: tuple[int, int, bool] | None = None  # coarse driver map: lo, hi, writes
    maps: list[OpenModel] = field(default_factory=list)

    @property
    def coarse(self) -> bool:
        return self.policy.granularity is sk.Granularity.COARSE


@dataclass(eq=False)
class Handle:
    """One SVMArray (array or view) and the model view that mirrors it."""

    array: sk.SVMArray
    alloc: AllocModel
    model: np.ndarray  # a view into alloc.data with the same layout as the array

    def byte_offsets(self) -> np.ndarray:
        """Offsets into the allocation of every byte of every element (element order)."""
        mv = self.model
        if mv.size == 0:
            return np.empty(0, np.int64)
        start = mv.__array_interface__["data"][0] - self.alloc.data.__array_interface__["data"][0]
        elems = start + np.arange(mv.size, dtype=np.int64) * mv.strides[0]
        offsets: np.ndarray = (elems[:, None] + np.arange(mv.itemsize)[None, :]).ravel()
        return offsets

    def span(self) -> tuple[int, int]:
        offs = self.byte_offsets()
        if not offs.size:
            start = self.model.__array_interface__["data"][0]
            o = start - self.alloc.data.__array_interface__["data"][0]
            return o, o
        return int(offs.min()), int(offs.max()) + 1

    @property
    def contiguous(self) -> bool:
        return bool(self.model.flags.c_contiguous)

    @property
    def nbytes(self) -> int:
        return int(self.model.nbytes)


@dataclass(eq=False)
class ExportModel:
    """An export held by the test: its object and the model bytes it must show."""

    obj: Any
    kind: str
    alloc: AllocModel
    model: np.ndarray  # the exported handle's model view (element order)

    def handle(self, lo: int = 0, hi: int | None = None) -> Handle:
        return Handle(None, self.alloc, self.model[lo:hi])  # type: ignore[arg-type]


EXPORT_KINDS = ["host", "asarray", "from_dlpack", "capsule", "cl_array"] + (
    ["torch"] if torch is not None else []
)


@dataclass(eq=False)
class OpenModel:
    """An open ``mapped`` block."""

    mapping: Any
    handle: Handle
    mode: str
    view: np.ndarray
    lo: int
    hi: int

    @property
    def writes(self) -> bool:
        return self.mode != "r"


def pick(data: st.DataObject, items: list[Any], label: str = "index") -> Any:
    """One of ``items``, drawn as an index (so hypothesis keeps no reference to it)."""
    return items[data.draw(st.integers(0, len(items) - 1), label=label)]


def conflict(h: Handle, writes: bool) -> bool:
    """Whether a command on ``h`` breaks the map-state rule (driver map of the union)."""
    alloc = h.alloc
    if not alloc.coarse or alloc.driver is None or h.nbytes == 0:
        return False
    lo, hi = h.span()
    dlo, dhi, dwrites = alloc.driver
    return dlo < hi and lo < dhi and (dwrites or writes)


def covered(h: Handle) -> bool:
    """Whether open maps of the allocation cover every byte of ``h`` (host access)."""
    lo, hi = h.span()
    if lo >= hi:
        return True
    reach = lo
    for m in sorted(h.alloc.maps, key=lambda m: m.lo):
        if m.lo > reach:
            return False
        reach = max(reach, m.hi)
    return reach >= hi


class Expect:
    """Run a step: it must raise one of ``errors`` (class and ``cl_error``), or succeed."""

    def __init__(self, errors: AbstractSet[tuple[type, str | None]]) -> None:
        self.errors = errors
        self.raised: BaseException | None = None

    def __enter__(self) -> Expect:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None:
            assert not self.errors, f"expected one of {self._names()}, the call succeeded"
            return False
        if not isinstance(exc, sk.SVMError):
            return False  # not svmkit's: let it propagate as a failure
        got = (type(exc), exc.cl_error)
        assert got in self.errors, (
            f"raised {type(exc).__name__}(cl_error={exc.cl_error!r}): {exc}; "
            f"expected {self._names() or 'success'}"
        )
        self.raised = exc
        return True

    def _names(self) -> list[str]:
        return [f"{c.__name__}({e!r})" for c, e in self.errors]

    @property
    def ok(self) -> bool:
        return self.raised is None


# -- the machine --------------------------------------------------------------------------


class SVMMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.allocs: list[AllocModel] = []
        self.handles: list[Handle] = []
        self.maps: list[OpenModel] = []
        self.resources: dict[tuple[str, bool], Any] = {}
        self.freed_callbacks: list[list[int]] = []
        self.exports: list[ExportModel] = []
        self.steps = 0

    # -- resources ------------------------------------------------------------------------
    def resource(self, policy_name: str, pooled: bool) -> Any:
        key = (policy_name, pooled)
        res = self.resources.get(key)
        if res is None:
            policy = dict(POLICIES)[policy_name]
            if pooled:
                res = sk.Pool(CTX, policy)
            else:
                res = sk.StatisticsAdaptor(sk.SVMResource(CTX, policy))
            self.resources[key] = res
        return res

    def live_handles(self) -> list[Handle]:
        return [h for h in self.handles if not h.alloc.freed]

    # -- allocate -----------------------------------------------------------------------
    @rule(
        data=st.data(),
        policy_name=st.sampled_from([name for name, _ in POLICIES]),
        pooled=st.booleans() if HAS_POOL else st.just(False),
        dtype=st.sampled_from(DTYPES),
        n=st.one_of(st.integers(0, 64), st.integers(65, 300), st.just(-1), st.just(None)),
        alignment=st.sampled_from([0, 0, 0, 1, 8, 64, 128, 3, 256]),
        how=st.sampled_from(["empty", "zeros", "full", "asarray", "use_resource"]),
    )
    def allocate(
        self,
        data: st.DataObject,
        policy_name: str,
        pooled: bool,
        dtype: np.dtype,
        n: int | None,
        alignment: int,
        how: str,
    ) -> None:
        if len(self.allocs) >= 12:
            return
        res = self.resource(policy_name, pooled)
        huge = n is None
        if huge:
            n = CAPS.max_alloc_bytes // dtype.itemsize + 1
        assert n is not None
        errors = set()
        if n < 0 or huge:
            errors.add(IVE)
        if how in ("asarray", "use_resource"):
            alignment = 0  # these constructors take no alignment
        elif alignment and (alignment & (alignment - 1) or alignment > CAPS.max_alignment):
            errors.add(IVE)
        fill = data.draw(st.integers(0, int(np.iinfo(dtype).max)))
        if how == "asarray" and (n < 0 or huge):
            return  # NumPy itself cannot build the source
        with Expect(errors) as ex:
            if how == "empty":
                a = sk.empty(CTX, n, dtype, alignment=alignment, resource=res)
            elif how == "zeros":
                a = sk.zeros(CTX, n, dtype, alignment=alignment, resource=res)
            elif how == "full":
                a = sk.full(CTX, n, fill, dtype, alignment=alignment, resource=res)
            elif how == "asarray":
                a = sk.asarray(CTX, np.full(n, fill, dtype), resource=res)
            else:
                with sk.use_resource(res):
                    a = sk.full(CTX, n, fill, dtype, policy=res.policy)
        if not ex.ok:
            return
        assert isinstance(a, sk.SVMArray)
        assert a.shape == (n,) and a.dtype == dtype and a.policy == res.policy
        assert a.allocation.resource is (res.resource if isinstance(res, sk.Pool) else res)
        if n and alignment:
            assert a.ptr % alignment == 0
        nbytes = n * dtype.itemsize
        buf = np.zeros(nbytes, np.uint8)
        known = np.ones(nbytes, bool)
        if how == "empty":
            known[:] = False
        elif how in ("full", "asarray", "use_resource"):
            buf[:] = np.full(n, fill, dtype).view(np.uint8)
        model = AllocModel(len(self.allocs), res.policy, pooled, buf, known, a)
        self.allocs.append(model)
        self.handles.append(Handle(a, model, buf.view(dtype)))

    # -- views ----------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(
        data=st.data(),
        start=st.integers(-70, 70) | st.none(),
        stop=st.integers(-70, 70) | st.none(),
        step=st.sampled_from([None, 1, 2, 3, -1, -2]),
    )
    def view(self, data: st.DataObject, start: int | None, stop: int | None, step: int) -> None:
        if len(self.handles) >= 40:
            return
        h = pick(data, self.handles)
        key = slice(start, stop, step)
        with Expect({UAF} if h.alloc.freed else set()) as ex:
            v = h.array[key]
        if ex.ok:
            mv = h.model[key]
            assert v.shape == mv.shape and v.base is not None
            self.handles.append(Handle(v, h.alloc, mv))

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), dtype=st.sampled_from(DTYPES))
    def view_dtype(self, data: st.DataObject, dtype: np.dtype) -> None:
        h = pick(data, self.handles)
        if not h.contiguous or h.nbytes % dtype.itemsize or len(self.handles) >= 40:
            return
        if h.model.size and h.model.__array_interface__["data"][0] % dtype.itemsize:
            return  # NumPy's own rule
        with Expect({UAF} if h.alloc.freed else set()) as ex:
            v = h.array.view(dtype)
        if ex.ok:
            self.handles.append(Handle(v, h.alloc, h.model.view(dtype)))

    # -- fill -----------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(
        data=st.data(),
        kind=st.sampled_from(["scalar", "pattern", "overflow"]),
        psize=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 3, 5, 12, 256]),
        seed=st.integers(0, 2**32 - 1),
    )
    def fill(self, data: st.DataObject, kind: str, psize: int, seed: int) -> None:
        h = pick(data, self.handles)
        rng = np.random.default_rng(seed)
        errors: set[tuple[type, str | None]] = set()
        if h.alloc.freed:
            errors.add(UAF)
        if kind == "scalar":
            value: Any = np.uint64(rng.integers(0, np.iinfo(h.model.dtype).max, dtype=np.uint64))
            value = int(value)
            pattern = np.array([value], h.model.dtype).view(np.uint8)
        elif kind == "overflow":
            value = int(np.iinfo(h.model.dtype).max) + 1 + int(rng.integers(0, 100))
            pattern = None
            errors.add(IVE)
        else:
            value = rng.integers(0, 256, psize, dtype=np.uint8)
            pattern = value
            if psize not in PATTERN_SIZES or psize > CAPS.max_alignment:
                errors.add(IVE)
        if not h.contiguous:
            errors.add(IVE)
        elif pattern is not None and h.nbytes and not errors:
            p = pattern.nbytes
            if (h.array.ptr % p) or (h.nbytes % p):
                errors.add(IVE)
        if not errors and conflict(h, True):
            errors.add(MSE)
        with Expect(errors) as ex:
            event = sk.fill(QUEUE, h.array, value)
        if ex.ok:
            assert isinstance(event, cl.Event)
            if h.nbytes:
                assert pattern is not None  # an overflowing value is an error, not a fill
                self.write(h, np.tile(pattern, h.nbytes // pattern.nbytes))

    def write(self, h: Handle, new_bytes: np.ndarray) -> None:
        """Model: the handle's element bytes (element order) become ``new_bytes``."""
        offs = h.byte_offsets()
        h.alloc.data[offs] = new_bytes
        h.alloc.known[offs] = True

    def read(self, h: Handle) -> tuple[np.ndarray, np.ndarray]:
        offs = h.byte_offsets()
        return h.alloc.data[offs].copy(), h.alloc.known[offs].copy()

    # -- copy -----------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(
        data=st.data(),
        dst_host=st.booleans(),
        src_host=st.booleans(),
        blocking=st.booleans(),
        readonly=st.booleans(),
        seed=st.integers(0, 2**32 - 1),
    )
    def copy(
        self,
        data: st.DataObject,
        dst_host: bool,
        src_host: bool,
        blocking: bool,
        readonly: bool,
        seed: int,
    ) -> None:
        if dst_host and src_host:
            dst_host = False
        rng = np.random.default_rng(seed)
        dh = None if dst_host else pick(data, self.handles, "dst")
        if src_host:
            sh = None
        elif dh is not None and data.draw(st.booleans(), label="same allocation"):
            same = [h for h in self.handles if h.alloc is dh.alloc]
            sh = pick(data, same, "src")
        else:
            sh = pick(data, self.handles, "src")
        other = sh if dh is None else dh
        assert other is not None  # not both sides on the host
        n = (
            other.nbytes
            if data.draw(st.booleans(), label="same size")
            else int(rng.integers(0, 80))
        )
        errors: set[tuple[type, str | None]] = set()
        if dh is None:
            dst: Any = np.zeros(n, np.uint8)
            if readonly:
                dst.flags.writeable = False
                errors.add(IVE)
        else:
            dst = dh.array
        src: Any = rng.integers(0, 256, n, dtype=np.uint8) if sh is None else sh.array
        for h, writes in ((dh, True), (sh, False)):
            if h is None:
                continue
            if h.alloc.freed:
                errors.add(UAF)
            elif not h.contiguous:
                errors.add(IVE)
            elif conflict(h, writes):
                errors.add(MSE)
        dn = n if dh is None else dh.nbytes
        sn = n if sh is None else sh.nbytes
        if dn != sn:
            errors.add(IVE)
        elif not errors and dn and dh is not None and sh is not None and dh.alloc is sh.alloc:
            dlo, dhi = dh.span()
            slo, shi = sh.span()
            if dlo < shi and slo < dhi:
                errors.add(OVERLAP)
        src_bytes, src_known = (src.copy(), np.ones(n, bool)) if sh is None else self.read(sh)
        with Expect(errors) as ex:
            event = sk.copy(QUEUE, dst, src, blocking=blocking)
        if not ex.ok:
            return
        if not blocking:
            event.wait()
        if dh is None:
            np.testing.assert_array_equal(dst[src_known], src_bytes[src_known])
        else:
            offs = dh.byte_offsets()
            dh.alloc.data[offs] = src_bytes
            dh.alloc.known[offs] = src_known

    # -- get / set ------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        h = pick(data, self.handles)
        errors = {UAF} if h.alloc.freed else ({MSE} if conflict(h, False) else set())
        with Expect(errors) as ex:
            got = h.array.get()
        if ex.ok:
            expected, known = self.read(h)
            got_bytes = np.ascontiguousarray(got).view(np.uint8).ravel()
            np.testing.assert_array_equal(got_bytes[known], expected[known])

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1), bad_shape=st.booleans())
    def set(self, data: st.DataObject, seed: int, bad_shape: bool) -> None:
        h = pick(data, self.handles)
        rng = np.random.default_rng(seed)
        n = h.model.size + 2 if bad_shape else h.model.size
        values = rng.integers(0, 256, n * h.model.itemsize, dtype=np.uint8).view(h.model.dtype)
        errors: set[tuple[type, str | None]] = set()
        if h.alloc.freed:
            errors.add(UAF)
        elif bad_shape:
            errors.add(IVE)
        elif h.model.size and conflict(h, True):
            errors.add(MSE)
        with Expect(errors) as ex:
            h.array.set(values)
        if ex.ok and h.model.size:
            self.write(h, values.view(np.uint8))

    # -- migrate --------------------------------------------------------------------------
    @rule(
        data=st.data(),
        count=st.integers(0, 3),
        to=st.sampled_from(["device", "host", "elsewhere"]),
        undefined=st.booleans(),
    )
    def migrate(self, data: st.DataObject, count: int, to: str, undefined: bool) -> None:
        if not self.handles:
            count = 0
        hs = [pick(data, self.handles) for _ in range(count)]
        errors: set[tuple[type, str | None]] = set()
        if not hs or to == "elsewhere":
            errors.add(IVE)
        elif not CAPS.migrate:
            errors.add((sk.UnsupportedError, "CL_INVALID_OPERATION"))
        else:
            for h in hs:
                if h.alloc.freed:
                    errors.add(UAF)
                elif h.alloc.policy.granularity is sk.Granularity.SYSTEM:
                    errors.add(IVE)
                elif conflict(h, False):
                    errors.add(MSE)
        with Expect(errors) as ex:
            event = sk.migrate(QUEUE, [h.array for h in hs], to=to, content_undefined=undefined)
        if ex.ok:
            event.wait()
            if undefined:
                for h in hs:
                    lo, hi = h.span()
                    h.alloc.known[lo:hi] = False

    # -- launch ---------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(
        data=st.data(),
        k=st.integers(1, 255),
        with_uses=st.booleans(),
        how=st.sampled_from(["launch", "tracked", "raw+record"]),
    )
    def launch(self, data: st.DataObject, k: int, with_uses: bool, how: str) -> None:
        h = pick(data, self.handles)
        used = pick(data, self.handles) if with_uses else None
        errors: set[tuple[type, str | None]] = set()
        for x in (h, used):
            if x is None:
                continue
            if x.alloc.freed:
                errors.add(UAF)
            elif conflict(x, True):
                errors.add(MSE)
        count = h.model.size * h.model.itemsize
        stride = h.model.strides[0] if h.model.ndim else 0
        uses = (used.array,) if used is not None else ()
        args = (h.array, np.uint32(count), np.int64(stride), np.uint32(h.model.itemsize))
        if how == "raw+record" and (errors or not h.alloc.data.size):
            how = "tracked"  # a raw call checks nothing: only where svmkit would allow it
        with Expect(errors) as ex:
            if how == "launch":
                event = sk.launch(QUEUE, XOR, (max(count, 1),), None, *args, np.uint8(k), uses=uses)
            elif how == "tracked":
                event = XOR(QUEUE, (max(count, 1),), None, *args, np.uint8(k), uses=uses)
            else:
                event = RAW_XOR(QUEUE, (max(count, 1),), None, *args, np.uint8(k))
                sk.record(event, h.array)  # what svmkit cannot see, named
        if ex.ok:
            assert event in h.array.pending_events() or event.command_execution_status <= 0
            old, known = self.read(h)
            self.write(h, old ^ np.uint8(k))
            h.alloc.known[h.byte_offsets()] = known  # undefined bytes stay undefined

    # -- maps -----------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(data=st.data(), mode=st.sampled_from(["r", "w", "rw", "w_invalidate", "x", "rw"]))
    def map_open(self, data: st.DataObject, mode: str) -> None:
        if len(self.maps) >= 6:
            return
        h = pick(data, self.handles)
        errors: set[tuple[type, str | None]] = set()
        if mode == "x":
            errors.add(IVE)
        if h.alloc.freed:
            errors.add(UAF)
        with Expect(errors) as ex:
            m = sk.mapped(QUEUE, h.array, mode)
            view = m.__enter__()
        if not ex.ok:
            return
        lo, hi = h.span()
        om = OpenModel(m, h, mode, view, lo, hi)
        assert view.shape == h.model.shape and view.dtype == h.model.dtype
        assert view.flags.writeable == (mode != "r")
        alloc = h.alloc
        if alloc.coarse and h.nbytes:
            alloc.maps.append(om)
            writes = om.writes
            d = alloc.driver
            if d is None:
                alloc.driver = (lo, hi, writes)
            elif not (d[0] <= lo and hi <= d[1] and (d[2] or not writes)):
                alloc.driver = (min(lo, d[0]), max(hi, d[1]), d[2] or writes)
        if mode == "w_invalidate" and alloc.coarse:
            alloc.known[lo:hi] = False  # the driver map's region is undefined on entry
        self.maps.append(om)
        # Entering the same block twice is refused.
        with Expect({IVE}):
            m.__enter__()

    def close_map(self, om: OpenModel) -> None:
        self.maps.remove(om)
        om.mapping.__exit__(None, None, None)
        alloc = om.handle.alloc
        if om in alloc.maps:
            alloc.maps.remove(om)
            if not alloc.maps:
                alloc.driver = None

    @precondition(lambda self: self.maps)
    @rule(data=st.data())
    def map_close(self, data: st.DataObject) -> None:
        self.close_map(pick(data, self.maps))

    @precondition(lambda self: self.maps)
    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def map_write(self, data: st.DataObject, seed: int) -> None:
        om = pick(data, self.maps)
        h = om.handle
        if h.alloc.freed or not h.model.size:
            return
        QUEUE.finish()  # the host writes: order after enqueued work (fine memory)
        rng = np.random.default_rng(seed)
        values = rng.integers(0, 256, h.nbytes, dtype=np.uint8).view(h.model.dtype)
        lo = int(rng.integers(0, h.model.size))
        hi = int(rng.integers(lo, h.model.size + 1))
        if om.mode == "r":
            with pytest.raises(ValueError, match="read-only"):
                om.view[lo:hi] = values[lo:hi]
            return
        om.view[lo:hi] = values[lo:hi]
        sub = Handle(h.array, h.alloc, h.model[lo:hi])
        self.write(sub, values[lo:hi].view(np.uint8))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def host_access(self, data: st.DataObject) -> None:
        h = pick(data, self.handles)
        errors: set[tuple[type, str | None]] = set()
        if h.alloc.freed:
            errors.add(UAF)
        elif h.alloc.coarse and not covered(h):
            errors.add(MSE)
        with Expect(errors) as ex:
            host = h.array.host
        if ex.ok:
            QUEUE.finish()  # host access of fine memory: order after enqueued work
            expected, known = self.read(h)
            got = np.ascontiguousarray(host).view(np.uint8).ravel()
            np.testing.assert_array_equal(got[known], expected[known])

    # -- free -----------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(data=st.data(), how=st.sampled_from(["free", "enqueue_free", "with", "callback"]))
    def free(self, data: st.DataObject, how: str) -> None:
        h = pick(data, self.handles)
        was_freed = h.alloc.freed
        calls: list[int] | None = [] if how == "callback" else None
        if how == "free":
            h.array.free()
        elif how == "with":
            with h.array as same:
                assert same is h.array
        else:
            cb = None
            if how == "callback":

                def cb(queue: cl.CommandQueue, arrays: list[sk.SVMArray]) -> None:
                    assert queue is QUEUE and arrays[0] is h.array
                    assert calls is not None
                    calls.append(1)

                assert calls is not None
                self.freed_callbacks.append(calls)
                if was_freed:
                    calls.append(0)  # expect no call: mark as satisfied
            refused = not was_freed and bool(h.alloc.maps)
            if refused and calls is not None:
                calls.append(0)  # refused: the callback must never run
            with Expect({MSE} if refused else set()) as ex:
                event = h.array.enqueue_free(QUEUE, cb)
            if not ex.ok:
                assert not h.array.freed
                return
            assert isinstance(event, cl.Event)
            if was_freed:
                assert event.command_execution_status == cl.command_execution_status.COMPLETE
        h.alloc.freed = True
        assert h.array.freed
        # Every handle on the allocation now refuses use.
        for other in self.handles:
            if other.alloc is h.alloc:
                with Expect({UAF}):
                    _ = other.array.ptr

    @precondition(lambda self: len(self.allocs) > 0)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        """Forget every reference to an allocation (freed by the garbage collector)."""
        alloc = pick(data, self.allocs)
        if any(om.handle.alloc is alloc for om in self.maps):
            return
        record = weakref.ref(alloc.base.allocation)
        self.handles = [h for h in self.handles if h.alloc is not alloc]
        self.allocs.remove(alloc)
        alloc.base = None
        alloc.freed = True
        if record() is not None:  # held in a cycle, or by an export's record whose
            gc.collect()  # dropped owner the release thread has yet to count: both end
            assert events.drain(10.0)  # once the collection and the handed-over releases ran
        freed = record()
        held = any(e.alloc is alloc for e in self.exports)  # an export keeps it (unfreed)
        assert freed is None or freed.freed or held, "an unreachable allocation was not freed"

    # -- exports ----------------------------------------------------------------------------
    @precondition(lambda self: self.handles)
    @rule(data=st.data(), kind=st.sampled_from(EXPORT_KINDS), versioned=st.booleans())
    def export(self, data: st.DataObject, kind: str, versioned: bool) -> None:
        if len(self.exports) >= 12:
            return
        h = pick(data, self.handles)
        host_kind = kind != "cl_array"
        if h.alloc.coarse and host_kind:
            return  # coarse host views are valid only inside `mapped`: no exports
        if kind == "cl_array" and (not h.contiguous or h.array.strides[0] < 0):
            return  # pyopencl.array reads and writes contiguous arrays only
        errors = {UAF} if h.alloc.freed else set()
        obj: Any = None
        try:
            with Expect(errors) as ex:
                if kind == "host":
                    obj = h.array.host
                elif kind == "asarray":
                    obj = np.asarray(h.array)
                elif kind == "from_dlpack":
                    obj = np.from_dlpack(h.array)
                elif kind == "capsule":
                    obj = h.array.__dlpack__(max_version=(1, 0) if versioned else None)
                elif kind == "torch":
                    obj = torch.from_dlpack(h.array)
                else:
                    obj = h.array.to_cl_array(QUEUE)
        except BufferError:
            assert h.array.strides[0] < 0, "unexpected BufferError"
            return  # svmkit exports no negative strides through DLPack
        except (TypeError, RuntimeError):
            assert kind == "torch"
            return  # PyTorch has no unsigned 16/32/64-bit tensors from DLPack
        if ex.ok:
            self.exports.append(ExportModel(obj, kind, h.alloc, h.model))

    def _readable(self, e: ExportModel) -> bool:
        if e.kind == "capsule" or not e.model.size:
            return False
        alloc = e.alloc
        return not (e.kind == "cl_array" and not alloc.freed and alloc.driver is not None)

    def _export_bytes(self, e: ExportModel) -> np.ndarray:
        if e.kind == "cl_array":
            got = e.obj.get(queue=QUEUE)
        elif e.kind == "torch":
            got = e.obj.numpy()
        else:
            got = e.obj
        return np.ascontiguousarray(got).view(np.uint8).ravel()

    @precondition(lambda self: self.exports)
    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1))
    def write_through_export(self, data: st.DataObject, seed: int) -> None:
        """Write through an export, maybe of freed memory a pool could have handed out."""
        e = pick(data, self.exports)
        if not self._readable(e) or (e.kind == "cl_array" and e.alloc.maps):
            return
        QUEUE.finish()  # order the host's write after enqueued work
        rng = np.random.default_rng(seed)
        n = e.model.size
        values = rng.integers(0, 256, e.model.nbytes, dtype=np.uint8).view(e.model.dtype)
        lo = int(rng.integers(0, n))
        hi = int(rng.integers(lo, n + 1))
        if e.kind == "cl_array":
            lo, hi = 0, n  # PyOpenCL writes SVM arrays whole (no offset)
            e.obj.set(values, queue=QUEUE)
        elif e.kind == "torch":
            e.obj.numpy()[lo:hi] = values[lo:hi]
        else:
            e.obj[lo:hi] = values[lo:hi]
        self.write(e.handle(lo, hi), values[lo:hi].view(np.uint8))

    @precondition(lambda self: self.exports)
    @rule(data=st.data(), seed=st.integers(0, 2**32 - 1), how=st.sampled_from(["free", "drop"]))
    def recycle_under_export(self, data: st.DataObject, seed: int, how: str) -> None:
        """Free (or drop) an exported array, allocate the same size from the same resource
        (a pool would hand the block out again), then write through the old export."""
        e = pick(data, self.exports)
        alloc = e.alloc
        if alloc.freed or alloc.maps or any(om.handle.alloc is alloc for om in self.maps):
            return
        base = alloc.base
        res = base.allocation.resource
        nbytes, policy, pooled = base.nbytes, alloc.policy, alloc.pooled
        if how == "free":
            base.free()
            for other in self.handles:
                if other.alloc is alloc:
                    assert other.array.freed
        else:
            self.handles = [h for h in self.handles if h.alloc is not alloc]
            alloc.base = None
            del base
            gc.collect()
        alloc.freed = True
        if alloc in self.allocs:
            self.allocs.remove(alloc)
        if len(self.allocs) < 12:
            fill = int(np.random.default_rng(seed).integers(0, 256))
            new = sk.full(CTX, nbytes, fill, np.uint8, resource=res)
            buf = np.full(nbytes, fill, np.uint8)
            model = AllocModel(len(self.allocs), policy, pooled, buf, np.ones(nbytes, bool), new)
            self.allocs.append(model)
            self.handles.append(Handle(new, model, buf))
        self.write_through_export(data, seed)

    @precondition(lambda self: self.exports)
    @rule(data=st.data(), collect=st.booleans())
    def drop_export(self, data: st.DataObject, collect: bool) -> None:
        e = pick(data, self.exports)
        self.exports.remove(e)
        del e
        if collect:
            gc.collect()

    @invariant()
    def exports_hold_their_bytes(self) -> None:
        if not self.exports:
            return
        QUEUE.finish()
        for e in self.exports:
            if self._readable(e):
                expected, known = self.read(e.handle())
                got = self._export_bytes(e)
                np.testing.assert_array_equal(got[known], expected[known])

    @invariant()
    def pool_figures_match_its_lists(self) -> None:
        # The C cache owns the pool's lists and figures: after every step its figures are
        # the sums of its lists (check() recounts them), and no figure is negative.
        for res in self.resources.values():
            if not hasattr(res, "pool"):
                continue
            pool = res.pool
            pool._cache.check()
            info = pool.info()
            assert info["live_allocations"] >= 0 and info["fragmented_bytes"] >= 0, info

    @invariant()
    def statistics_count_what_is_held(self) -> None:
        # Exact when read, with no drain: an allocation counts while it is unfreed, mapped
        # (given back at the unmap) or held by a live export.
        held = {id(a): a for a in self.allocs if not a.freed}
        also = [e.alloc for e in self.exports] + [m.handle.alloc for m in self.maps]
        held.update((id(a), a) for a in also)
        for res in self.resources.values():
            pooled = isinstance(res, sk.Pool)
            mine = [
                a
                for a in held.values()
                if a.data.size and (a.policy, a.pooled) == (res.policy, pooled)
            ]
            stats = res.stats()
            counted = (len(mine), sum(a.data.size for a in mine))
            assert (stats["current_allocations"], stats["current_bytes"]) == counted, stats
            if pooled:
                assert (stats["live_allocations"], stats["in_use_bytes"]) == counted, stats

    # -- the invariant --------------------------------------------------------------------
    @invariant()
    def memory_matches_model(self) -> None:
        for alloc in self.allocs:
            if alloc.freed:
                continue
            if alloc.coarse and alloc.driver is not None and alloc.driver[2]:
                QUEUE.finish()
                for om in alloc.maps:  # mapped for writing: read through the open maps
                    h = om.handle
                    expected, known = self.read(h)
                    got = np.ascontiguousarray(om.view).view(np.uint8).ravel()
                    np.testing.assert_array_equal(got[known], expected[known])
                continue
            got = alloc.base.get(QUEUE).view(np.uint8)
            np.testing.assert_array_equal(got[alloc.known], alloc.data[alloc.known])

    def teardown(self) -> None:
        while self.maps:  # (no loop variable left holding a map's view: an export)
            self.close_map(self.maps[-1])
        for alloc in self.allocs:
            alloc.base.free()
        self.handles.clear()
        self.allocs.clear()
        self.exports.clear()  # the last exports go: their memory comes back now
        gc.collect()
        QUEUE.finish()
        assert events.drain(10.0)
        for calls in self.freed_callbacks:
            assert sum(calls) == (0 if calls and calls[0] == 0 else 1), calls
        for res in self.resources.values():
            stats = res.stats()
            assert stats["current_bytes"] == 0 and stats["current_allocations"] == 0, stats
            if hasattr(res, "pool"):
                info = res.pool.info()
                assert info["in_use_bytes"] == 0 and info["live_allocations"] == 0, info
                res.trim()
                QUEUE.finish()
                assert events.drain(10.0)
                assert res.pool.info()["upstream_bytes"] == 0


SVMMachine.TestCase.settings = settings.get_profile(PROFILE)
TestSVMMachine = SVMMachine.TestCase


# -- NumPy's own arrays in svmkit memory (sk.numpy_allocator) ------------------------------

NUMPY_KERNELS = sk.build_program(
    CTX,
    """
__kernel void add_k(__global int *x, int k) { x[get_global_id(0)] += k; }
""",
)
HOST_POLICY = next(
    (p for name, p in POLICIES if name == "system"),
    next((p for name, p in POLICIES if name == "fine"), None),
)


def _numpy_made(kind: str, n: int, seed: int) -> np.ndarray:
    """An int32 array of ``n`` elements that NumPy builds by way of ``kind`` (each way takes
    another path through the data-memory handler: malloc, calloc, realloc)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-1000, 1000, n, dtype=np.int32)
    if kind == "arange":
        scaled: np.ndarray = np.arange(n, dtype=np.int32) * np.int32(seed % 7 + 1)
        return scaled
    if kind == "zeros":
        return np.zeros(n, np.int32)
    if kind == "concatenate":
        half = n // 2
        return np.concatenate([values[:half], values[half:]])
    if kind == "where":
        return np.where(values > 0, values, -values)
    if kind == "fancy":
        return values[rng.permutation(n)]
    if kind == "fromiter":
        return np.fromiter((int(v) for v in values), np.int32, count=-1)
    if kind == "fromstring":
        return np.fromstring(" ".join(map(str, values)), dtype=np.int32, sep=" ")
    if kind == "loadtxt":
        out = np.loadtxt(io.StringIO("\n".join(map(str, values))), dtype=np.int32, ndmin=1)
        return out
    if kind == "resize":
        grown: np.ndarray = values[: max(1, n // 3)].copy()
        grown.resize(n, refcheck=False)  # realloc in place (a copy owns its data)
        return grown
    if kind == "np.resize":
        resized: np.ndarray = np.resize(values, n)
        return resized
    raise AssertionError(kind)


NUMPY_KINDS = [
    "arange", "zeros", "concatenate", "where", "fancy", "fromiter", "fromstring", "loadtxt",
    "resize", "np.resize",
]  # fmt: skip


@dataclass(eq=False)
class NumpyArray:
    """An ndarray the machine holds, its expected values, and whether svmkit owns it."""

    array: np.ndarray
    model: np.ndarray
    svm: bool


class NumpyAllocatorMachine(RuleBasedStateMachine):
    """Allocator-made ndarrays created inside and outside the block, passed to kernels,
    freed by NumPy while kernels wait to run, reallocated, made by other threads: every
    live array holds exactly its model's values, no other array's bytes change, and the
    pool counts exactly the live arrays NumPy made in it."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = sk.StatisticsAdaptor(sk.PoolResource(sk.SVMResource(CTX, HOST_POLICY)))
        self.allocator = sk.numpy_allocator(self.pool)
        self.arrays: list[NumpyArray] = []
        self.gates: list[cl.UserEvent] = []

    def _make(self, kind: str, n: int, seed: int, inside: bool) -> NumpyArray:
        model = _numpy_made(kind, n, seed)
        if inside:
            with self.allocator:
                array = _numpy_made(kind, n, seed)
        else:
            array = _numpy_made(kind, n, seed)
        assert (_owner(array) is not None) == inside
        return NumpyArray(array, model, inside)

    @rule(
        kind=st.sampled_from(NUMPY_KINDS),
        n=st.integers(1, 5000),
        seed=st.integers(0, 2**16),
        inside=st.booleans(),
    )
    def make(self, kind: str, n: int, seed: int, inside: bool) -> None:
        if len(self.arrays) < 16:
            self.arrays.append(self._make(kind, n, seed, inside))

    @rule(kind=st.sampled_from(NUMPY_KINDS), n=st.integers(1, 3000), seed=st.integers(0, 99))
    def make_in_a_thread(self, kind: str, n: int, seed: int) -> None:
        made: list[NumpyArray] = []
        worker = threading.Thread(target=lambda: made.append(self._make(kind, n, seed, True)))
        worker.start()
        worker.join()
        self.arrays.extend(made[: max(0, 16 - len(self.arrays))])

    @precondition(lambda self: self.arrays)
    @rule(data=st.data(), k=st.integers(-50, 50), gated=st.booleans(), view=st.booleans())
    def launch(self, data: st.DataObject, k: int, gated: bool, view: bool) -> None:
        held = pick(data, self.arrays)
        lo = data.draw(st.integers(0, held.array.size - 1)) if view else 0
        target, model = held.array[lo:], held.model[lo:]
        gate = cl.UserEvent(CTX) if gated else None
        if gate is not None:
            self.gates.append(gate)
        if not held.svm:
            with pytest.raises(sk.InvalidValueError, match="numpy_allocator"):
                NUMPY_KERNELS.add_k(QUEUE, target.shape, None, target, np.int32(k))
            return
        NUMPY_KERNELS.add_k(
            QUEUE, target.shape, None, target, np.int32(k), wait_for=[gate] if gate else None
        )
        model += k

    @precondition(lambda self: self.arrays)
    @rule(data=st.data(), n_new=st.integers(1, 4))
    def free_while_a_kernel_waits(self, data: st.DataObject, n_new: int) -> None:
        held = pick(data, self.arrays)
        if not held.svm:
            return
        gate = cl.UserEvent(CTX)
        NUMPY_KERNELS.add_k(QUEUE, held.array.shape, None, held.array, np.int32(1), wait_for=[gate])
        address, size = held.array.ctypes.data, held.array.size
        self.arrays.remove(held)
        del held  # NumPy frees the array: its block must wait for the kernel
        with self.allocator:
            newcomers = [np.full(size, 7, np.int32) for _ in range(n_new)]
        assert address not in {a.ctypes.data for a in newcomers}
        gate.set_status(cl.command_execution_status.COMPLETE)
        QUEUE.finish()
        for a in newcomers:
            assert (a == 7).all()

    @precondition(lambda self: self.arrays)
    @rule(data=st.data(), grow=st.integers(1, 4000))
    def resize_in_place(self, data: st.DataObject, grow: int) -> None:
        held = pick(data, self.arrays)
        if not held.array.flags.owndata:
            return  # (NumPy resizes only an array that owns its data)
        self._open_gates()
        new_size = held.array.size + grow
        if held.svm:
            with self.allocator:
                held.array.resize(new_size, refcheck=False)
        else:
            held.array.resize(new_size, refcheck=False)
        held.model = np.concatenate([held.model, np.zeros(grow, np.int32)])
        assert (_owner(held.array) is not None) == held.svm

    @precondition(lambda self: self.arrays)
    @rule(data=st.data())
    def operations(self, data: st.DataObject) -> None:
        held = pick(data, self.arrays)
        if not held.svm:
            return
        value = data.draw(st.integers(-100, 100))
        sk.fill(QUEUE, held.array, np.int32(value), wait_for=self.gates or None)
        held.model[:] = value
        other = pick(data, self.arrays)
        if other is not held and other.svm and other.array.size == held.array.size:
            sk.copy(QUEUE, other.array, held.array)
            other.model[:] = held.model

    @precondition(lambda self: self.arrays)
    @rule(data=st.data(), free_wrapper=st.booleans())
    def adopt_then_let_numpy_go(self, data: st.DataObject, free_wrapper: bool) -> None:
        """``sk.asarray`` wraps an allocator-made array without a copy; the SVMArray holds
        the ndarray, so NumPy's memory stays while it lives, and its ``free()`` ends only
        svmkit's use."""
        held = pick(data, self.arrays)
        if not held.svm:
            return
        wrapped = sk.asarray(CTX, held.array)
        assert wrapped.ptr == held.array.ctypes.data
        if free_wrapper:
            wrapped.free()  # the ndarray keeps its memory and values
            return
        self.arrays.remove(held)
        model, array = held.model, held.array
        del held
        del array  # only the SVMArray holds the memory now
        with self.allocator:
            newcomers = [np.full(model.size, 3, np.int32) for _ in range(2)]
        assert wrapped.ptr not in {a.ctypes.data for a in newcomers}
        np.testing.assert_array_equal(wrapped.get(QUEUE), model)
        del wrapped  # the last holder: NumPy's memory goes back (the pool invariant checks)

    @precondition(lambda self: self.arrays)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        self.arrays.remove(pick(data, self.arrays))

    def _open_gates(self) -> None:
        for gate in self.gates:
            gate.set_status(cl.command_execution_status.COMPLETE)
        self.gates.clear()
        QUEUE.finish()

    @invariant()
    def every_array_holds_its_values(self) -> None:
        self._open_gates()
        for held in self.arrays:
            np.testing.assert_array_equal(held.array, held.model)

    @invariant()
    def the_pool_counts_the_live_arrays(self) -> None:
        live = [h for h in self.arrays if h.svm]
        stats = self.pool.stats()
        assert stats["current_allocations"] == len(live), stats
        assert stats["current_bytes"] == sum(h.array.nbytes for h in live), stats

    def teardown(self) -> None:
        self._open_gates()
        self.arrays.clear()
        stats = self.pool.stats()
        assert stats["current_allocations"] == 0 and stats["current_bytes"] == 0, stats


def _owner(array: np.ndarray) -> Any:
    from svmkit.resources import _cpool

    return _cpool.numpy_allocation(array)


NumpyAllocatorMachine.TestCase.settings = settings.get_profile(PROFILE)
TestNumpyAllocatorMachine = pytest.mark.skipif(
    HOST_POLICY is None, reason="the device has no fine-grain SVM that NumPy could use"
)(NumpyAllocatorMachine.TestCase)
