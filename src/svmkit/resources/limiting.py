"""LimitingAdaptor: refuses allocations beyond a byte limit (RMM's
``limiting_resource_adaptor``)."""

from __future__ import annotations

import threading

from svmkit.errors import InvalidValueError, OutOfMemoryError
from svmkit.policy import check_size
from svmkit.resources._adaptor import ResourceAdaptor
from svmkit.resources.base import Allocation, MemoryResource

__all__ = ["LimitingAdaptor"]


class LimitingAdaptor(ResourceAdaptor):
    """At most ``limit_bytes`` (bytes asked for) live through this adaptor at once.

    Beyond it: :class:`~svmkit.OutOfMemoryError` with ``cl_error`` ``None`` (the limit is
    svmkit's, not the driver's) and ``limit_bytes``/``in_use_bytes`` set.  Upstream is not
    called for a refused request.
    """

    def __init__(self, upstream: MemoryResource, limit_bytes: int) -> None:
        super().__init__(upstream)
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise InvalidValueError(f"limit_bytes must be an int >= 0, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._used = 0

    @property
    def used_bytes(self) -> int:
        """Bytes of live allocations made through this adaptor."""
        return self._used

    def allocate(self, nbytes: int, alignment: int = 0) -> Allocation:
        with self._lock:
            if self._used + nbytes > self.limit_bytes:
                check_size(nbytes, self.capabilities)  # a size no device allows: invalid
                raise OutOfMemoryError(
                    f"allocating {nbytes} bytes would exceed the limit of {self.limit_bytes} "
                    f"bytes ({self._used} bytes in use)",
                    nbytes=nbytes,
                    limit_bytes=self.limit_bytes,
                    in_use_bytes=self._used,
                )
            self._used += nbytes
        try:
            allocation = self.upstream.allocate(nbytes, alignment)
        except BaseException:
            with self._lock:
                self._used -= nbytes
            raise
        allocation.resource = self
        return allocation

    def deallocate(self, allocation: Allocation) -> None:
        with self._lock:
            self._used -= allocation.nbytes
        self.upstream.deallocate(allocation)
