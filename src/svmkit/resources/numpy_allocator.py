"""``numpy_allocator(resource)``: NumPy allocates array data from an svmkit resource
(NEP 49).

Placeholder: this version installs no handler (``numpy_allocator`` returns a context that
does nothing), so NumPy keeps its own allocator and results computed by the NumPy
surface are copied into SVM.  The NEP 49 handler replaces it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from svmkit.resources.base import MemoryResource

__all__ = ["numpy_allocator"]


def numpy_allocator(
    resource: MemoryResource | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """A context manager inside which NumPy allocates array data from ``resource``
    (placeholder: NumPy's own allocator stays)."""
    return contextlib.nullcontext()
