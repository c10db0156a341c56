"""SVM arrays: :class:`SVMArray`, its constructors, and :class:`Pool` (a pooled stack that
builds arrays)."""

from svmkit.arrays.array import SVMArray
from svmkit.arrays.creation import asarray, empty, empty_like, full, ones, zeros, zeros_like
from svmkit.arrays.pooled import Pool

__all__ = [
    "Pool",
    "SVMArray",
    "asarray",
    "empty",
    "empty_like",
    "full",
    "ones",
    "zeros",
    "zeros_like",
]
