"""A small ctypes binding to the OpenCL ICD loader that PyOpenCL itself loaded.

PyOpenCL lacks ``clSetKernelExecInfo`` and gives no control over when ``clSVMFree`` runs.
These few entry points are bound here (and called only from :mod:`svmkit.driver.calls`),
against the very library PyOpenCL's extension module linked (found in the process's
memory map), so handles from PyOpenCL objects (``obj.int_ptr``) are valid for them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

import pyopencl as cl

__all__ = [
    "library_path",
    "set_kernel_exec_info_fine_grain_system",
    "set_kernel_exec_info_svm_ptrs",
    "svm_alloc",
    "svm_free",
]

CL_KERNEL_EXEC_INFO_SVM_PTRS = 0x11B6
CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM = 0x11B7

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def library_path() -> str:
    """Path of the ICD loader in use by PyOpenCL (from ``/proc/self/maps`` when available)."""
    import pyopencl._cl  # noqa: F401  (make sure the loader is mapped)

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "libOpenCL" in os.path.basename(path):
                    return path
    except OSError:
        pass
    found = ctypes.util.find_library("OpenCL")
    if found is None:
        raise OSError("cannot locate the OpenCL ICD loader that PyOpenCL uses")
    return found


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                lib = ctypes.CDLL(library_path())
                lib.clSVMAlloc.restype = ctypes.c_void_p
                lib.clSVMAlloc.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_uint64,
                    ctypes.c_size_t,
                    ctypes.c_uint,
                ]
                lib.clSVMFree.restype = None
                lib.clSVMFree.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                lib.clSetKernelExecInfo.restype = ctypes.c_int32
                lib.clSetKernelExecInfo.argtypes = [
                    ctypes.c_void_p,
                    ctypes.c_uint,
                    ctypes.c_size_t,
                    ctypes.c_void_p,
                ]
                _lib = lib
    return _lib


def svm_alloc(context: cl.Context, flags: int, size: int, alignment: int) -> int:
    """``clSVMAlloc``; returns the address, 0 when the driver returned NULL."""
    ptr = _library().clSVMAlloc(context.int_ptr, flags, size, alignment)
    return int(ptr or 0)


def svm_free(context: cl.Context, ptr: int) -> None:
    """``clSVMFree`` (returns immediately; the caller orders it after all use)."""
    _library().clSVMFree(context.int_ptr, ptr)


def set_kernel_exec_info_svm_ptrs(kernel: cl.Kernel, ptrs: tuple[int, ...]) -> int:
    """``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_PTRS)``; returns the CL error code."""
    arr = (ctypes.c_void_p * max(len(ptrs), 1))(*ptrs)
    return int(
        _library().clSetKernelExecInfo(
            kernel.int_ptr,
            CL_KERNEL_EXEC_INFO_SVM_PTRS,
            ctypes.sizeof(ctypes.c_void_p) * len(ptrs),
            arr if ptrs else None,
        )
    )


def set_kernel_exec_info_fine_grain_system(kernel: cl.Kernel, enabled: bool) -> int:
    """``clSetKernelExecInfo(CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM)``; the CL error code."""
    value = ctypes.c_uint32(1 if enabled else 0)  # cl_bool
    return int(
        _library().clSetKernelExecInfo(
            kernel.int_ptr,
            CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM,
            ctypes.sizeof(value),
            ctypes.byref(value),
        )
    )
