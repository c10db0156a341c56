"""Size classes of the pool: how a request is rounded up to a block size.

Sixteen classes per power of two above 1 KiB (as PyOpenCL's ``mempool.hpp`` with four
leading bits), multiples of 64 bytes up to 1 KiB.  The waste this bounds:

* a request of ``n`` bytes gets a block of ``class_size(size_class(n))`` bytes, which is
  less than ``n + 64`` for ``n <= 1 KiB`` and at most ``n * 17/16`` (6.25 % over) above;
* every class size is a multiple of 64 bytes, so blocks keep the 64-byte granule that
  SVM drivers hand out anyway.

Both functions are pure and O(1); ``size_class`` is monotone and
``size_class(class_size(c)) == c`` for every class ``c``.
"""

from __future__ import annotations

__all__ = ["GRANULE", "class_size", "size_class"]

GRANULE = 64
"""Bytes of the smallest class and the step of every class up to 1 KiB."""

_SMALL_CLASSES = 16  # classes 1..16: 64 B .. 1 KiB in steps of 64 B
_MANTISSA_BITS = 4  # 16 classes per power of two above 1 KiB
_FIRST_EXP = 11  # classes 17..32 cover (1 KiB, 2 KiB]


def size_class(nbytes: int) -> int:
    """The class (an int >= 1) whose blocks hold ``nbytes`` (>= 1) with bounded waste."""
    if nbytes <= _SMALL_CLASSES * GRANULE:
        return max(1, (nbytes + GRANULE - 1) // GRANULE)
    exp = (nbytes - 1).bit_length()  # 2**(exp-1) < nbytes <= 2**exp
    shift = exp - 1 - _MANTISSA_BITS
    mantissa = (nbytes + (1 << shift) - 1) >> shift  # in (16, 32]
    return 16 * (exp - _FIRST_EXP) + mantissa


def class_size(cls: int) -> int:
    """Bytes in every block of class ``cls``."""
    if cls <= _SMALL_CLASSES:
        return cls * GRANULE
    exp = _FIRST_EXP + (cls - 17) // 16
    mantissa = cls - 16 * (exp - _FIRST_EXP)
    return mantissa << (exp - 1 - _MANTISSA_BITS)
