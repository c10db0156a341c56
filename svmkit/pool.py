"""``Pool``: the usual pooled stack with array constructors.

``Pool(ctx)`` is ``StatisticsAdaptor(PoolResource(SVMResource(ctx, policy)))`` (RMM's
"statistics over a pool over the device resource"), itself a memory resource, with
``empty``/``zeros``/``ones``/``full``/``asarray`` that draw from it.  It sits above the
array layer because it builds arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.array import SVMArray, _shape_tuple, nbytes_of
from svmkit.creation import _new, asarray, fill_with
from svmkit.policy import Policy
from svmkit.resources.pool import PoolResource
from svmkit.resources.statistics import StatisticsAdaptor
from svmkit.resources.svm import SVMResource

__all__ = ["Pool"]

_Spec = tuple[tuple[int, ...], np.dtype[Any], int]
_SPECS_LIMIT = 1024


def _spec(shape: Any, dtype: Any) -> _Spec:
    """``(shape tuple, dtype, nbytes)`` for a constructor's arguments (validated)."""
    shape_t = (shape,) if type(shape) is int and shape >= 0 else _shape_tuple(shape)
    dt = np.dtype(dtype)
    return shape_t, dt, nbytes_of(shape_t, dt)


class Pool(StatisticsAdaptor):
    """A pool of SVM for ``ctx`` under ``policy`` (``None``: ``Policy.best(ctx)``).

    Keyword arguments go to :class:`~svmkit.PoolResource` (``max_cached_bytes``).
    A ``Pool`` is a memory resource: pass it as ``resource=`` or select it with
    :func:`svmkit.use_resource`.  :meth:`stats` merges the statistics adaptor's counters
    with the pool's figures (``cached_bytes``, ``fragmented_bytes``, ...).
    """

    pool: PoolResource

    def __init__(self, ctx: cl.Context, policy: Policy | None = None, **kw: Any) -> None:
        self.pool = PoolResource(SVMResource(ctx, policy), **kw)
        super().__init__(self.pool)
        self._specs: dict[tuple[Any, Any], _Spec] = {}

    # -- array constructors ----------------------------------------------------------------
    def empty(self, shape: Any, dtype: Any = np.float64, *, alignment: int = 0) -> SVMArray:
        """A new uninitialised array from the pool (``svmkit.empty`` semantics)."""
        try:
            spec = self._specs[shape, dtype]
        except (KeyError, TypeError):
            spec = self._remember(shape, dtype)
        return _new(self, spec[0], spec[1], alignment, spec[2])

    def _remember(self, shape: Any, dtype: Any) -> _Spec:
        spec = _spec(shape, dtype)
        specs = self._specs
        if len(specs) >= _SPECS_LIMIT:
            specs.clear()
        try:
            specs[shape, dtype] = spec
        except TypeError:
            pass  # an unhashable spelling (a list shape): not memoised
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
        out = super().stats()
        for key, value in self.pool.info().items():
            out.setdefault(key, value)
        return out

    def trim(self) -> int:
        """Return every cached block to the driver; the number of bytes given back."""
        return self.pool.trim()

    def __repr__(self) -> str:
        return f"Pool({self.context.devices[0].name!r}, {self.policy})"
