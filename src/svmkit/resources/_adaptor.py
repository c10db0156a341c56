"""Base of the adaptors: a resource that wraps ``upstream`` and adds one concern."""

from __future__ import annotations

from svmkit.errors import InvalidValueError
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["ResourceAdaptor"]


class ResourceAdaptor(MemoryResource):
    """Forwards to ``upstream`` (kept alive); what it hands out comes back through it.

    An adaptor marks each allocation it hands out as its own (``Allocation.resource``),
    so freeing the allocation reaches the adaptor first, which then passes it upstream.
    """

    upstream: MemoryResource

    def __init__(self, upstream: MemoryResource) -> None:
        if not isinstance(upstream, MemoryResource):
            raise InvalidValueError(f"upstream must be a memory resource, got {upstream!r}")
        self.upstream = upstream
        self.context = upstream.context
        self.policy = upstream.policy
        self.capabilities = upstream.capabilities

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        allocation = self.upstream.allocate(nbytes, alignment)
        allocation.resource = self
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        self.upstream.deallocate(allocation)

    def trim(self) -> int:
        """Ask the resources below to return cached memory; bytes given back."""
        trim = getattr(self.upstream, "trim", None)
        return int(trim()) if trim is not None else 0
