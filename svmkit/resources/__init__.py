"""Memory resources: raw SVM, pools and adaptors, composed upstream-first (as in RMM)."""

from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.current import current_resource, use_resource
from svmkit.resources.svm import SVMResource

__all__ = [
    "Allocation",
    "MemoryResource",
    "SVMResource",
    "current_resource",
    "use_resource",
]
