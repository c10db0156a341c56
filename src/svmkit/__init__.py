"""svmkit: OpenCL Shared Virtual Memory made practical.

``import svmkit as sk`` gives the whole public API (see the README for a tour):
capabilities and policies, SVM arrays and their constructors, memory resources and pools,
mapping, checked operations, kernels and the fine-grain atomic work queue.

Importing svmkit makes OpenCL drivers installed as wheels (Intel's CPU runtime,
``intel-opencl-rt``) visible to PyOpenCL's ICD loader; see :mod:`svmkit.driver.icd_vendors`.
"""

from svmkit.driver.icd_vendors import register_wheel_drivers

register_wheel_drivers()  # before any OpenCL call: the ICD loader reads it once

import svmkit.interop.numpy_surface  # noqa: F401  (installs NumPy's ndarray surface)
from svmkit._version import __version__
from svmkit.arrays import (
    Pool,
    SVMArray,
    asarray,
    empty,
    empty_like,
    full,
    ones,
    zeros,
    zeros_like,
)
from svmkit.capabilities import Capabilities, capabilities, create_context, default_context
from svmkit.errors import (
    BuildError,
    CopyOverlapError,
    InvalidContextError,
    InvalidValueError,
    MapStateError,
    OutOfMemoryError,
    QueueClosed,
    SVMError,
    UnsupportedError,
    UseAfterFreeError,
)
from svmkit.interop.cl_array import cl_allocator
from svmkit.mapping import mapped
from svmkit.ops import Kernel, Program, copy, fill, launch, migrate, record
from svmkit.policy import Access, Granularity, Policy
from svmkit.programs import build_program, kernels_dir
from svmkit.resources import (
    Allocation,
    LimitingAdaptor,
    MemoryResource,
    NumpyAllocator,
    PoolResource,
    StatisticsAdaptor,
    SVMResource,
    TrackingAdaptor,
    current_resource,
    numpy_allocator,
    set_current_resource,
    use_resource,
)
from svmkit.resources.debug import DebugAdaptor, debug_enabled, set_debug
from svmkit.workqueue import WorkQueue, persistent_grid

__all__ = [
    "Access",
    "Allocation",
    "BuildError",
    "Capabilities",
    "CopyOverlapError",
    "DebugAdaptor",
    "Granularity",
    "InvalidContextError",
    "InvalidValueError",
    "Kernel",
    "LimitingAdaptor",
    "MapStateError",
    "MemoryResource",
    "NumpyAllocator",
    "OutOfMemoryError",
    "Policy",
    "Pool",
    "PoolResource",
    "Program",
    "QueueClosed",
    "SVMArray",
    "SVMError",
    "SVMResource",
    "StatisticsAdaptor",
    "TrackingAdaptor",
    "UnsupportedError",
    "UseAfterFreeError",
    "WorkQueue",
    "__version__",
    "asarray",
    "build_program",
    "capabilities",
    "cl_allocator",
    "copy",
    "create_context",
    "current_resource",
    "debug_enabled",
    "default_context",
    "empty",
    "empty_like",
    "fill",
    "full",
    "kernels_dir",
    "launch",
    "mapped",
    "migrate",
    "numpy_allocator",
    "ones",
    "persistent_grid",
    "record",
    "set_current_resource",
    "set_debug",
    "use_resource",
    "zeros",
    "zeros_like",
]
