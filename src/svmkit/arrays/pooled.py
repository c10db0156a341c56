"""``Pool``: the usual pooled stack, with array constructors.

``Pool(ctx)`` composes the usual stack, a :class:`~svmkit.PoolResource` over
``SVMResource(ctx, policy)`` (RMM's "pool over the device resource"), with a
:class:`~svmkit.DebugAdaptor` on top in debug mode (``SVMKIT_DEBUG=1``), and adds
``empty``/``zeros``/``ones``/``full``/``asarray`` that draw from it.  It is itself a memory
resource (it forwards to the top of its stack) and sits above the array layer because it
builds arrays.

The statistics are the pool resource's own counters (:meth:`PoolResource.statistics`, the
figures :class:`~svmkit.StatisticsAdaptor` keeps) rather than a separate adaptor: they are
updated under the lock the pool takes anyway, so a pooled allocation and free take one
lock each instead of three; ``StatisticsAdaptor`` remains for any other stack.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import ArraySpec, SVMArray, array_spec
from svmkit.arrays.creation import _new, asarray, fill_with
from svmkit.policy import Policy
from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.debug import DebugAdaptor, Poisoner, debug_enabled
from svmkit.resources.limiting import LimitingAdaptor
from svmkit.resources.pool import PoolResource
from svmkit.resources.svm import SVMResource

__all__ = ["Pool"]

_SPECS_LIMIT = 1024


class Pool(MemoryResource):
    """A pool of SVM for ``ctx`` under ``policy`` (``None``: ``Policy.best(ctx)``).

    ``limit_bytes`` puts a :class:`~svmkit.LimitingAdaptor` below the pool, so the limit
    counts every block the pool holds from the driver, cached ones included (beyond it:
    :class:`~svmkit.OutOfMemoryError`, after the pool returned its cache).  Other keyword
    arguments go to :class:`~svmkit.PoolResource` (``max_cached_bytes``).  A ``Pool`` is a
    memory resource: pass it as ``resource=`` or select it with
    :func:`svmkit.use_resource`.  :meth:`stats` merges the statistics counters with the
    pool's figures (``cached_bytes``, ``fragmented_bytes``, ...).  ``debug=True`` puts a
    :class:`~svmkit.DebugAdaptor` on top (poison, quarantine and checks of freed blocks),
    ``False`` never; ``None`` follows :func:`~svmkit.debug_enabled` (``SVMKIT_DEBUG``).

    Attributes
    ----------
    pool:
        The :class:`~svmkit.PoolResource` at the heart of the stack.
    resource:
        The top of the stack (the pool, or a :class:`~svmkit.DebugAdaptor` over it).
    debug:
        The debug mode's :class:`~svmkit.resources.debug.Poisoner` (its ``reports``), or
        ``None`` when the pool was built with debug mode off.
    """

    def __init__(
        self,
        ctx: cl.Context,
        policy: Policy | None = None,
        *,
        limit_bytes: int | None = None,
        debug: bool | None = None,
        **kw: Any,
    ) -> None:
        upstream: MemoryResource = SVMResource(ctx, policy)
        if limit_bytes is not None:
            upstream = LimitingAdaptor(upstream, limit_bytes)
        self.pool = PoolResource(upstream, **kw)
        self.resource: MemoryResource = self.pool
        self.debug: Poisoner | None = None
        if debug_enabled() if debug is None else debug:  # poison freed blocks (resources.debug)
            adaptor = DebugAdaptor(self.pool)
            self.resource, self.debug = adaptor, adaptor.poisoner
        self.context = self.pool.context
        self.policy = self.pool.policy
        self.capabilities = self.pool.capabilities
        self._specs: dict[tuple[Any, Any], ArraySpec] = {}
        # dtype spellings (np.float32, "f4", np.dtype) -> the validated dtype, for 1-D shapes
        self._dtypes: dict[Any, np.dtype[Any]] = {}
        # The stack's own entry point (the pool's C fast path, when no adaptor sits on
        # top): `sk.empty(..., resource=pool)` then costs what `pool.empty` does.
        self.allocate = self.resource.allocate  # type: ignore[method-assign]

    # -- the memory resource -----------------------------------------------------------------
    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        """An allocation from the top of the stack (it frees back there, not here)."""
        return self.resource.allocate(nbytes, alignment)

    def deallocate(self, allocation: Allocation) -> None:
        self.resource.deallocate(allocation)

    def owns(self, allocation: Allocation) -> bool:
        return self.resource.owns(allocation)

    def trim(self) -> int:
        """Return every cached block upstream; the number of bytes given back.

        Debug mode first checks the poison of the quarantined blocks and returns them too
        (:class:`~svmkit.UseAfterFreeError` for a write found after free)."""
        if self.debug is not None:
            return self.resource.trim()  # type: ignore[attr-defined, no-any-return]
        return self.pool.trim()

    def info(self) -> dict[str, int]:
        """The pool's figures (see :meth:`PoolResource.info`)."""
        return self.pool.info()

    def statistics(self) -> dict[str, int]:
        """The statistics counters (see :meth:`PoolResource.statistics`)."""
        return self.pool.statistics()

    @property
    def cached_bytes(self) -> int:
        """Bytes the pool holds for reuse (ready and pending)."""
        return self.pool.cached_bytes

    @property
    def max_cached_bytes(self) -> int | None:
        return self.pool.max_cached_bytes

    # -- array constructors ----------------------------------------------------------------
    def empty(self, shape: Any, dtype: Any = np.float64, *, alignment: int = 0) -> SVMArray:
        """A new uninitialised array from the pool (``svmkit.empty`` semantics)."""
        dt = None
        try:
            if type(shape) is int and shape >= 0:  # one dimension: no per-size memo
                dt = self._dtypes.get(dtype)
            spec = None if dt is not None else self._specs.get((shape, dtype))
        except TypeError:  # an unhashable spelling (a list shape): not memoised
            spec = None
        if dt is not None:
            return _new(self.resource, (shape,), dt, alignment, shape * dt.itemsize)
        if spec is None:
            spec = self._remember(shape, dtype)
        return _new(self.resource, spec[0], spec[1], alignment, spec[2])

    def _remember(self, shape: Any, dtype: Any) -> ArraySpec:
        spec = array_spec(shape, dtype)
        dtypes = self._dtypes
        if len(dtypes) >= _SPECS_LIMIT:
            dtypes.clear()
        try:  # (a dtype spelling seen once is known for every length)
            dtypes[dtype] = spec[1]
        except TypeError:
            pass
        specs = self._specs
        if len(specs) >= _SPECS_LIMIT:
            specs.clear()
        try:
            specs[shape, dtype] = spec
        except TypeError:
            pass
        return spec

    def full(
        self, shape: Any, fill_value: Any, dtype: Any = None, *, alignment: int = 0
    ) -> SVMArray:
        """A new array filled with ``fill_value`` (dtype from it unless given)."""
        dt = np.asarray(fill_value).dtype if dtype is None else dtype
        a = self.empty(shape, dt, alignment=alignment)
        fill_with(a, fill_value)
        return a

    def zeros(self, shape: Any, dtype: Any = np.float64, *, alignment: int = 0) -> SVMArray:
        """A new array of zeros."""
        return self.full(shape, 0, dtype, alignment=alignment)

    def ones(self, shape: Any, dtype: Any = np.float64, *, alignment: int = 0) -> SVMArray:
        """A new array of ones."""
        return self.full(shape, 1, dtype, alignment=alignment)

    def asarray(self, obj: Any, *, dtype: Any = None) -> SVMArray:
        """``obj`` as an array from this pool (returned as is if it already is one)."""
        return asarray(self.context, obj, dtype=dtype, resource=self)

    # -- figures and cache -----------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Statistics counters plus the pool's figures (see ``PoolResource.info``)."""
        out = self.statistics()
        for key, value in self.info().items():
            out.setdefault(key, value)
        return out

    def __repr__(self) -> str:
        return f"Pool({self.context.devices[0].name!r}, {self.policy})"
