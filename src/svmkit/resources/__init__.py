"""Memory resources: raw SVM, pools and adaptors, composed upstream-first (as in RMM)."""

from svmkit.resources.base import Allocation, MemoryResource
from svmkit.resources.current import current_resource, set_current_resource, use_resource
from svmkit.resources.limiting import LimitingAdaptor
from svmkit.resources.numpy_allocator import NumpyAllocator, numpy_allocator
from svmkit.resources.pool import PoolResource
from svmkit.resources.statistics import StatisticsAdaptor
from svmkit.resources.svm import SVMResource
from svmkit.resources.tracking import TrackingAdaptor

__all__ = [
    "Allocation",
    "LimitingAdaptor",
    "MemoryResource",
    "NumpyAllocator",
    "PoolResource",
    "SVMResource",
    "StatisticsAdaptor",
    "TrackingAdaptor",
    "current_resource",
    "numpy_allocator",
    "set_current_resource",
    "use_resource",
]
