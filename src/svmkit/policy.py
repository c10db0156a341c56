"""Granularity, kernel access and the SVM policy: the spec's flag rules in one place.

A :class:`Policy` is a frozen value whose ``clSVMAlloc`` flags derive in one property, so
an invalid combination cannot be built (as ``cl::SVMTraitAtomic`` implies fine grain in the
OpenCL C++ bindings).  Every rule of the spec's *SVM Memory Flags* table lives here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svmkit.capabilities import Capabilities, capabilities
from svmkit.errors import InvalidValueError, UnsupportedError

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["Access", "Granularity", "Policy", "check_alignment", "check_size"]

# cl_svm_mem_flags bits (cl.h)
MEM_READ_WRITE = 1 << 0
MEM_WRITE_ONLY = 1 << 1
MEM_READ_ONLY = 1 << 2
MEM_SVM_FINE_GRAIN_BUFFER = 1 << 10
MEM_SVM_ATOMICS = 1 << 11
_KNOWN_FLAGS = (
    MEM_READ_WRITE | MEM_WRITE_ONLY | MEM_READ_ONLY | MEM_SVM_FINE_GRAIN_BUFFER | MEM_SVM_ATOMICS
)


class Granularity(enum.Enum):
    """How finely the host and devices may share an allocation."""

    COARSE = "coarse"
    """Coarse-grain buffer: the host touches memory only between map and unmap."""
    FINE = "fine"
    """Fine-grain buffer: host and devices share bytes at synchronisation points, no map."""
    SYSTEM = "system"
    """Fine-grain system: any host memory (``malloc``) is shared with devices."""


class Access(enum.Enum):
    """How kernels access an allocation (``CL_MEM_READ_WRITE`` and friends)."""

    READ_WRITE = MEM_READ_WRITE
    READ_ONLY = MEM_READ_ONLY
    WRITE_ONLY = MEM_WRITE_ONLY


_GRANULARITY_ORDER = (Granularity.SYSTEM, Granularity.FINE, Granularity.COARSE)


@dataclass(frozen=True)
class Policy:
    """Which kind of SVM to allocate, with what kernel access.

    Raises
    ------
    InvalidValueError
        ``atomics=True`` with ``COARSE`` (spec: ``CL_MEM_SVM_ATOMICS`` "is valid only if
        ``CL_MEM_SVM_FINE_GRAIN_BUFFER`` is specified").
    """

    granularity: Granularity = Granularity.COARSE
    atomics: bool = False
    access: Access = Access.READ_WRITE
    if TYPE_CHECKING:  # (an attribute set by __post_init__, not a field: hot paths read it)

        @property
        def needs_map(self) -> bool:
            """True only for COARSE: the host must map before touching the memory."""

    def __hash__(self) -> int:  # (a policy keys the default resources: hashed once)
        cached: int = self.__dict__["_hash"]
        return cached

    def __reduce__(self) -> tuple[type[Policy], tuple[Granularity, bool, Access]]:
        # (the cached hash is not pickled: string hashes differ between processes)
        return (Policy, (self.granularity, self.atomics, self.access))

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.granularity, self.atomics, self.access)))
        object.__setattr__(self, "needs_map", self.granularity is Granularity.COARSE)
        if not isinstance(self.granularity, Granularity):
            raise InvalidValueError(f"granularity must be a Granularity, got {self.granularity!r}")
        if not isinstance(self.access, Access):
            raise InvalidValueError(f"access must be an Access, got {self.access!r}")
        if self.atomics and self.granularity is Granularity.COARSE:
            raise InvalidValueError(
                "atomics=True needs fine grain: the spec allows CL_MEM_SVM_ATOMICS only "
                "together with CL_MEM_SVM_FINE_GRAIN_BUFFER"
            )

    @classmethod
    def coarse(cls, access: Access = Access.READ_WRITE) -> Policy:
        """Coarse-grain buffer SVM."""
        return cls(Granularity.COARSE, False, access)

    @classmethod
    def fine(cls, atomics: bool = False, access: Access = Access.READ_WRITE) -> Policy:
        """Fine-grain buffer SVM, with SVM atomics if asked."""
        return cls(Granularity.FINE, atomics, access)

    @classmethod
    def system(cls, atomics: bool = False, access: Access = Access.READ_WRITE) -> Policy:
        """Fine-grain system SVM (host memory shared with devices)."""
        return cls(Granularity.SYSTEM, atomics, access)

    @classmethod
    def best(
        cls,
        ctx: cl.Context | cl.Device | Capabilities,
        *,
        atomics: bool = False,
        system: bool = True,
    ) -> Policy:
        """The finest granularity every device of ``ctx`` supports: SYSTEM, FINE, COARSE.

        ``ctx`` may also be one device, or capabilities already queried.  ``system=False``
        leaves SYSTEM out: the finest granularity ``clSVMAlloc`` serves, for memory that
        ``clEnqueueSVMMigrateMem`` accepts (the spec requires its ranges to lie inside
        ``clSVMAlloc`` allocations).

        Raises
        ------
        UnsupportedError
            No granularity (with atomics, if asked) is supported by every device.
        """
        caps = ctx if isinstance(ctx, Capabilities) else capabilities(ctx)
        for granularity in _GRANULARITY_ORDER:
            if (atomics and granularity is Granularity.COARSE) or (
                not system and granularity is Granularity.SYSTEM
            ):
                continue
            candidate = cls(granularity, atomics)
            if not candidate.missing(caps):
                return candidate
        weakest = cls(Granularity.FINE if atomics else Granularity.COARSE, atomics)
        lacking = "; ".join(
            f"device {d.name} lacks {', '.join(weakest.missing(d))}"
            for d in caps.devices
            if weakest.missing(d)
        )
        what = "SVM with atomics" if atomics else "SVM"
        raise UnsupportedError(f"not every device supports {what}: {lacking}")

    @classmethod
    def from_flags(cls, flags: int) -> Policy:
        """Parse ``cl.svm_mem_flags`` bits under the spec's *SVM Memory Flags* rules.

        Raises
        ------
        InvalidValueError
            Unknown bits; more than one of READ_WRITE, WRITE_ONLY, READ_ONLY; ATOMICS
            without FINE_GRAIN_BUFFER.
        """
        flags = int(flags)
        unknown = flags & ~_KNOWN_FLAGS
        if flags < 0 or unknown:
            raise InvalidValueError(
                f"flags={flags:#x} has bits {unknown:#x} that are not SVM memory flags "
                "(the spec's SVM Memory Flags table lists READ_WRITE, WRITE_ONLY, READ_ONLY, "
                "SVM_FINE_GRAIN_BUFFER and SVM_ATOMICS)"
            )
        access_bits = [a for a in Access if flags & a.value]
        if len(access_bits) > 1:
            raise InvalidValueError(
                f"flags={flags:#x} combines {' and '.join(a.name for a in access_bits)}; the "
                "spec makes READ_WRITE, WRITE_ONLY and READ_ONLY mutually exclusive"
            )
        access = access_bits[0] if access_bits else Access.READ_WRITE
        fine = bool(flags & MEM_SVM_FINE_GRAIN_BUFFER)
        atomics = bool(flags & MEM_SVM_ATOMICS)
        if atomics and not fine:
            raise InvalidValueError(
                f"flags={flags:#x} has SVM_ATOMICS without SVM_FINE_GRAIN_BUFFER; the spec "
                "allows CL_MEM_SVM_ATOMICS only with CL_MEM_SVM_FINE_GRAIN_BUFFER"
            )
        return cls(Granularity.FINE if fine else Granularity.COARSE, atomics, access)

    @property
    def flags(self) -> int:
        """The ``cl_svm_mem_flags`` for ``clSVMAlloc``.

        SYSTEM memory does not come from ``clSVMAlloc``; its flags are those of a
        fine-grain buffer, what such memory behaves like.
        """
        flags = self.access.value
        if self.granularity is not Granularity.COARSE:
            flags |= MEM_SVM_FINE_GRAIN_BUFFER
        if self.atomics:
            flags |= MEM_SVM_ATOMICS
        return flags

    def missing(self, caps: Capabilities) -> list[str]:
        """The capabilities this policy needs that ``caps`` lacks (empty if none)."""
        lacking = []
        if not caps.coarse_grain_buffer:
            lacking.append("SVM (CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)")
        if self.granularity is Granularity.FINE and not caps.fine_grain_buffer:
            lacking.append("fine-grain buffer SVM (CL_DEVICE_SVM_FINE_GRAIN_BUFFER)")
        if self.granularity is Granularity.SYSTEM and not caps.fine_grain_system:
            lacking.append("fine-grain system SVM (CL_DEVICE_SVM_FINE_GRAIN_SYSTEM)")
        if self.atomics and not caps.atomics:
            lacking.append("SVM atomics (CL_DEVICE_SVM_ATOMICS)")
        return lacking

    def check(self, ctx: cl.Context) -> None:
        """Raise :class:`UnsupportedError` naming each device that lacks what this needs.

        Spec: ``clSVMAlloc`` fails when "CL_MEM_SVM_FINE_GRAIN_BUFFER or CL_MEM_SVM_ATOMICS
        is specified in flags and these are not supported by at least one device in context".
        """
        problems = [
            f"device {d.name} lacks {', '.join(self.missing(d))}"
            for d in capabilities(ctx).devices
            if self.missing(d)
        ]
        if problems:
            raise UnsupportedError(f"{self} cannot be used in this context: " + "; ".join(problems))

    def __str__(self) -> str:
        parts = [self.granularity.name]
        if self.atomics:
            parts.append("atomics")
        if self.access is not Access.READ_WRITE:
            parts.append(self.access.name)
        return f"Policy({', '.join(parts)})"


def check_alignment(alignment: int, caps: Capabilities) -> int:
    """Validate a ``clSVMAlloc`` alignment; 0 means the default (``max_alignment``).

    Spec: alignment "must be a power of two up to the largest data type supported by the
    OpenCL device" (``long16``, or ``int16`` without 64-bit integers).
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int):
        raise InvalidValueError(f"alignment must be an int, got {alignment!r}")
    if alignment == 0:
        return caps.max_alignment
    if alignment < 0 or alignment & (alignment - 1):
        raise InvalidValueError(
            f"alignment={alignment} is not a power of two (clSVMAlloc requires one)"
        )
    if alignment > caps.max_alignment:
        raise InvalidValueError(
            f"alignment={alignment} exceeds the largest data type of {caps.name} "
            f"({caps.max_alignment} bytes); clSVMAlloc supports alignments up to that size"
        )
    return alignment


def check_size(nbytes: int, caps: Capabilities) -> None:
    """Validate a ``clSVMAlloc`` size against ``CL_DEVICE_MAX_MEM_ALLOC_SIZE``.

    Spec: ``clSVMAlloc`` fails if "size is 0 or > CL_DEVICE_MAX_MEM_ALLOC_SIZE value for
    any device in context" (svmkit never asks the driver for 0 bytes).
    """
    if nbytes < 0:
        raise InvalidValueError(f"size {nbytes} bytes is negative")
    for dev in caps.devices:
        if nbytes > dev.max_alloc_bytes:
            raise InvalidValueError(
                f"size {nbytes} bytes exceeds CL_DEVICE_MAX_MEM_ALLOC_SIZE of device "
                f"{dev.name} ({dev.max_alloc_bytes} bytes)"
            )
