"""Array constructors: ``empty``, ``zeros``, ``ones``, ``full``, ``asarray`` and ``*_like``.

Each draws its allocation from a memory resource (the current one by default, see
:func:`svmkit.use_resource`), so pools slot in without touching :class:`SVMArray`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray, array_spec, nbytes_of
from svmkit.arrays.importing import host_data, is_cl_array, svm_of_cl_array
from svmkit.arrays.numpy_owned import adopt
from svmkit.driver import calls
from svmkit.driver.per_context import PerContext
from svmkit.driver.queues import default_queue
from svmkit.errors import InvalidContextError, InvalidValueError
from svmkit.policy import Policy
from svmkit.resources.base import MemoryResource
from svmkit.resources.current import current_resource
from svmkit.rules import PATTERN_SIZES

__all__ = ["asarray", "empty", "empty_like", "full", "ones", "zeros", "zeros_like"]

_best: PerContext[Policy] = PerContext(Policy.best)
_MEMO_VIEWS = 8  # typed views cached per pooled block
_wrap = SVMArray.from_allocation


def best_policy(ctx: cl.Context) -> Policy:
    """``Policy.best(ctx)``, computed once per context."""
    return _best.get(ctx)


def resolve_resource(
    ctx: cl.Context, policy: Policy | None, resource: MemoryResource | None
) -> MemoryResource:
    """The resource an array constructor allocates from (API.md's ``empty`` rules)."""
    if resource is None:
        if policy is None:
            policy = best_policy(ctx)
        elif not isinstance(policy, Policy):
            raise InvalidValueError(f"policy must be a svmkit.Policy, got {policy!r}")
        return current_resource(ctx, policy)
    if not isinstance(resource, MemoryResource):
        raise InvalidValueError(f"resource must be a memory resource, got {resource!r}")
    if resource.context is not ctx and resource.context != ctx:
        raise InvalidContextError("the resource serves another context than the one given")
    if policy is not None and policy != resource.policy:
        raise InvalidValueError(
            f"policy {policy} differs from the resource's policy {resource.policy}"
        )
    return resource


def _new(
    resource: MemoryResource,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    alignment: int,
    nbytes: int = -1,
) -> SVMArray:
    """A new array of ``shape`` and ``dtype`` (``nbytes`` of them, if known) from
    ``resource``: the one place every constructor allocates."""
    if nbytes < 0:
        nbytes = nbytes_of(shape, dtype)
    alloc = resource.allocate(nbytes, alignment)
    memo = alloc.memo
    if memo is None:
        return _wrap(alloc, _typed_view(alloc.u8, shape, dtype, nbytes))
    # A pooled block: its typed views outlive each hand-out.  An array's ``_view`` never
    # leaves svmkit (host access hands out exports, made afresh for each allocation), so
    # the hand-outs of one block may share them.  A new one is cut from the whole block's
    # bytes (the allocation's own byte view is made only when something asks for it).
    key = (shape, dtype)
    view = memo.get(key)
    if view is None:
        if len(memo) >= _MEMO_VIEWS:
            memo.clear()
        if len(shape) == 1:  # a slice of the block's whole typed view: cheaper than a new one
            whole = memo.get(dtype)
            if whole is None:
                block_u8 = alloc.block.u8
                whole = memo[dtype] = np.frombuffer(
                    block_u8, dtype, len(block_u8) // dtype.itemsize
                )
            view = memo[key] = whole[: shape[0]]
        else:
            view = memo[key] = _typed_view(alloc.block.u8, shape, dtype, nbytes)
    return _wrap(alloc, view)


def _typed_view(
    u8: np.ndarray[Any, Any], shape: tuple[int, ...], dtype: np.dtype[Any], nbytes: int
) -> np.ndarray[Any, Any]:
    """``shape`` and ``dtype`` over the first ``nbytes`` of ``u8`` (no copy, no access;
    ``u8`` may be longer)."""
    view: np.ndarray[Any, Any] = np.frombuffer(u8, dtype, nbytes // dtype.itemsize if nbytes else 0)
    return view if len(shape) == 1 else view.reshape(shape)


def empty(
    ctx: cl.Context,
    shape: Any,
    dtype: Any = np.float64,
    *,
    policy: Policy | None = None,
    alignment: int = 0,
    resource: MemoryResource | None = None,
) -> SVMArray:
    """A new uninitialised array in SVM.

    Parameters
    ----------
    ctx:
        The context whose devices share the memory.
    shape, dtype:
        As in :func:`numpy.empty`.  A zero-element array is valid and allocates nothing.
    policy:
        Granularity and access; ``None`` means ``Policy.best(ctx)``, or the resource's
        policy when ``resource`` is given (a different one: ``InvalidValueError``).
    alignment:
        0 for the default (the largest data type, ``max_alignment``), else a power of two
        no larger than that (``clSVMAlloc``'s rule; else ``InvalidValueError``).
    resource:
        Memory resource to allocate from; default: :func:`svmkit.current_resource`.
    """
    shape_t, dt, nbytes = array_spec(shape, dtype)
    if resource is None and policy is None:
        resource = current_resource(ctx, best_policy(ctx))
    else:
        resource = resolve_resource(ctx, policy, resource)
    return _new(resource, shape_t, dt, alignment, nbytes)


def fill_with(a: SVMArray, value: Any) -> None:
    """Set every element of a fresh array to ``value`` and wait until that is done."""
    if a.size == 0:
        return
    item = np.asarray(value, dtype=a.dtype)
    if not a.policy.needs_map:
        a.unchecked_view.fill(item)
        return
    if item.nbytes in PATTERN_SIZES:
        queue = default_queue(a.context)
        calls.wait(calls.enqueue_fill(queue, a, item.reshape(1), None), "clEnqueueSVMMemFill")
    else:
        a.set(np.full(a.shape, item, a.dtype))


def full(
    ctx: cl.Context,
    shape: Any,
    fill_value: Any,
    dtype: Any = None,
    *,
    policy: Policy | None = None,
    alignment: int = 0,
    resource: MemoryResource | None = None,
) -> SVMArray:
    """A new array of ``shape`` filled with ``fill_value`` (dtype from it, as in NumPy)."""
    dt = np.asarray(fill_value).dtype if dtype is None else np.dtype(dtype)
    a = empty(ctx, shape, dt, policy=policy, alignment=alignment, resource=resource)
    fill_with(a, fill_value)
    return a


def zeros(
    ctx: cl.Context,
    shape: Any,
    dtype: Any = np.float64,
    *,
    policy: Policy | None = None,
    alignment: int = 0,
    resource: MemoryResource | None = None,
) -> SVMArray:
    """A new array of zeros."""
    return full(ctx, shape, 0, dtype, policy=policy, alignment=alignment, resource=resource)


def ones(
    ctx: cl.Context,
    shape: Any,
    dtype: Any = np.float64,
    *,
    policy: Policy | None = None,
    alignment: int = 0,
    resource: MemoryResource | None = None,
) -> SVMArray:
    """A new array of ones."""
    return full(ctx, shape, 1, dtype, policy=policy, alignment=alignment, resource=resource)


def empty_like(a: SVMArray, dtype: Any = None, shape: Any = None) -> SVMArray:
    """A new array like ``a``: same context, policy and resource; shape and dtype unless
    given."""
    return empty(
        a.context,
        a.shape if shape is None else shape,
        a.dtype if dtype is None else dtype,
        resource=a.allocation.resource,
    )


def zeros_like(a: SVMArray, dtype: Any = None, shape: Any = None) -> SVMArray:
    """A new zero-filled array like ``a``."""
    out = empty_like(a, dtype, shape)
    fill_with(out, 0)
    return out


def asarray(
    ctx: cl.Context,
    obj: Any,
    *,
    dtype: Any = None,
    policy: Policy | None = None,
    resource: MemoryResource | None = None,
) -> SVMArray:
    """``obj`` as an SVM array: returned as is when it already is one that matches,
    else copied into a new array.

    ``obj`` may be anything NumPy reads (buffer protocol, ``__array__``, sequences), a
    DLPack producer (a CPU ``torch.Tensor``; one on another device is copied through the
    host if it offers a CPU copy, else ``BufferError``) or a ``pyopencl.array.Array``
    (zero-copy when ``SVMArray.to_cl_array`` made it).  A NumPy array that
    ``sk.numpy_allocator`` made in ``ctx`` (or a view of one) is wrapped without a copy: the
    SVMArray holds the ndarray, and its ``free()`` ends svmkit's use only.
    """
    if isinstance(obj, np.ndarray) and (dtype is None or np.dtype(dtype) == obj.dtype):
        same = adopt(obj)  # NumPy's array in svmkit memory (sk.numpy_allocator): no copy
        if same is not None and same.context == ctx:
            obj = same
    if not isinstance(obj, (SVMArray, np.ndarray)) and is_cl_array(obj):
        same = svm_of_cl_array(ctx, obj)
        if same is not None:
            obj = same
    if isinstance(obj, SVMArray):
        matches = (
            obj.context == ctx
            and (dtype is None or np.dtype(dtype) == obj.dtype)
            and (policy is None or policy == obj.policy)
            and (resource is None or resource.owns(obj.allocation))
        )
        if matches:
            obj.live()
            return obj
        obj = obj.get()
    host = obj if type(obj) is np.ndarray and dtype is None else host_data(obj, dtype)
    out = empty(ctx, host.shape, host.dtype, policy=policy, resource=resource)
    out.set(host)
    return out
