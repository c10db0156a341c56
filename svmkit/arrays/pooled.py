"""``Pool``: the usual pooled stack with array constructors.

``Pool(ctx)`` is the usual stack, statistics over a pool over ``SVMResource(ctx, policy)``
(RMM's "statistics over a pool over the device resource"), itself a memory resource, with
``empty``/``zeros``/``ones``/``full``/``asarray`` that draw from it.  It sits above the
array layer because it builds arrays.

The statistics are the pool's own counters (:meth:`PoolResource.statistics`, the same
figures :class:`~svmkit.StatisticsAdaptor` keeps) rather than a separate adaptor: they are
updated under the lock the pool takes anyway, so a pooled allocation and free take one
lock each instead of three.  That is most of what keeps ``pool.empty(n)`` + ``free()``
near 2 µs; ``StatisticsAdaptor`` remains for any other stack.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray, _shape_tuple, nbytes_of
from svmkit.arrays.creation import _new, asarray, fill_with
from svmkit.policy import Policy
from svmkit.resources.pool import PoolResource
from svmkit.resources.svm import SVMResource

__all__ = ["Pool"]

_Spec = tuple[tuple[int, ...], np.dtype[Any], int]
_SPECS_LIMIT = 1024


def _spec(shape: Any, dtype: Any) -> _Spec:
    """``(shape tuple, dtype, nbytes)`` for a constructor's arguments (validated)."""
    shape_t = (shape,) if type(shape) is int and shape >= 0 else _shape_tuple(shape)
    dt = np.dtype(dtype)
    return shape_t, dt, nbytes_of(shape_t, dt)


class Pool(PoolResource):
    """A pool of SVM for ``ctx`` under ``policy`` (``None``: ``Policy.best(ctx)``).

    Keyword arguments go to :class:`~svmkit.PoolResource` (``max_cached_bytes``).
    A ``Pool`` is a memory resource: pass it as ``resource=`` or select it with
    :func:`svmkit.use_resource`.  :meth:`stats` merges the statistics adaptor's counters
    with the pool's figures (``cached_bytes``, ``fragmented_bytes``, ...).
    """

    def __init__(self, ctx: cl.Context, policy: Policy | None = None, **kw: Any) -> None:
        super().__init__(SVMResource(ctx, policy), **kw)
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
        out = self.statistics()
        for key, value in self.info().items():
            out.setdefault(key, value)
        return out

    @property
    def pool(self) -> PoolResource:
        """The pool resource at the heart of the stack (the ``Pool`` itself)."""
        return self

    def __repr__(self) -> str:
        return f"Pool({self.context.devices[0].name!r}, {self.policy})"
