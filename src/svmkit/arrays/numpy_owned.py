"""NumPy arrays in svmkit memory: what ``sk.numpy_allocator`` made, found by address.

Inside ``sk.numpy_allocator`` every array NumPy creates owns an svmkit
:class:`~svmkit.Allocation`, listed by the C handler under its address
(``_cpool.numpy_allocation``: the array's bases lead to the array that owns the data, whose
address is looked up in a hash table, O(1)).  Such an ndarray, or any view of one, is
accepted wherever an SVMArray is: work on it is recorded on that allocation, so NumPy's
free of it orders after the device (the pool keeps the block pending until then).

:func:`adopt` wraps one as an :class:`~svmkit.SVMArray` without a copy.  That SVMArray
holds the ndarray and records on the allocation's events, but its allocation is a
*borrow*: its ``free()`` (or death) ends svmkit's use only; the memory goes back when NumPy
frees the ndarray.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl

from svmkit.arrays.array import SVMArray
from svmkit.errors import InvalidContextError, InvalidValueError
from svmkit.resources._cpool import numpy_allocation
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["adopt", "allocation_of", "as_operand", "numpy_allocation", "svm_operand"]


def allocation_of(nd: np.ndarray[Any, Any]) -> Allocation | None:
    """The live svmkit allocation holding ``nd``'s data (``nd`` or an array it views was
    made inside ``sk.numpy_allocator``), or None."""
    found: Allocation | None = numpy_allocation(nd)
    return found


class _Borrowed(MemoryResource):
    """The resource of an adopted ndarray's allocation: taking the allocation back only
    lets go of the ndarray (NumPy frees the memory); new allocations (NumPy's results for
    the adopted array) come from the resource that made the ndarray."""

    def __init__(self, owner: Allocation) -> None:
        self.context = owner.context
        self.policy = owner.policy
        self.capabilities = getattr(owner.resource, "capabilities", None)  # type: ignore[assignment]
        self.owner = owner
        self.lender = owner.resource

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        allocation: Allocation = self.owner.resource.allocate(nbytes, alignment)
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        allocation.block = None  # the ndarray: NumPy frees it after the recorded work

    def __repr__(self) -> str:
        return f"NumPy's array over {self.owner!r}"


def adopt(nd: Any, ctx: cl.Context | None = None) -> SVMArray | None:
    """A zero-copy SVMArray over ``nd`` when its memory is an svmkit allocation (made inside
    ``sk.numpy_allocator``), else None.

    The SVMArray holds ``nd`` and shares its allocation's recorded events and map state;
    its ``free()`` ends svmkit's use only.

    Raises
    ------
    InvalidContextError
        ``ctx`` is given and the allocation belongs to another context.
    """
    if not isinstance(nd, np.ndarray):
        return None
    owner = allocation_of(nd)
    if owner is None:
        return None
    if ctx is not None and owner.context != ctx:
        raise InvalidContextError(
            f"this NumPy array's memory belongs to another context ({owner!r}); "
            "copy it with sk.asarray(its_context, array) first"
        )
    borrowed = Allocation(_Borrowed(owner), owner.ptr, owner.nbytes, u8=_bytes_of(owner), block=nd)
    borrowed._events = owner.events  # one record: NumPy's free waits for what svmkit records
    borrowed.map_state = owner.map_state
    return SVMArray(borrowed, nd)


def as_operand(obj: Any) -> Any:
    """An operation's array argument: an allocator-made ndarray (or a view of one) as a
    zero-copy SVMArray (:func:`adopt`), anything else unchanged (the operation's own checks
    then apply)."""
    if isinstance(obj, np.ndarray):
        adopted = adopt(obj)
        if adopted is not None:
            return adopted
    return obj


def svm_operand(obj: Any, what: str) -> SVMArray:
    """An operation's argument that must be SVM: an SVMArray, or an allocator-made ndarray
    adopted (:func:`as_operand`); anything else is an ``InvalidValueError`` naming ``what``
    (the operation and the argument)."""
    array = obj if isinstance(obj, SVMArray) else as_operand(obj)
    if not isinstance(array, SVMArray):
        raise InvalidValueError(
            f"{what} must be an SVMArray or a NumPy array made inside sk.numpy_allocator, "
            f"got {type(obj).__name__}"
        )
    return array


def _bytes_of(owner: Allocation) -> np.ndarray[Any, np.dtype[np.uint8]]:
    u8: np.ndarray[Any, np.dtype[np.uint8]] = owner.u8
    return u8
