"""DLPack producer: ``SVMArray.__dlpack__`` and ``__dlpack_device__``.

FINE and SYSTEM memory is host memory (spec: the host may access it at any time, ordered
after the commands that use it), so those arrays export as ``kDLCPU``, zero-copy, after
the commands svmkit recorded on them.  The capsule is NumPy's own producer's (versioned
``dltensor_versioned`` when the consumer passes ``max_version >= (1, 0)``, else legacy),
made from a host export (:mod:`svmkit.resources.exports`): NumPy's deleter, which a
consumer may call from any thread, only drops a reference to that view, and the memory
goes back once the last export is gone.

COARSE memory is not host memory outside a map, and a capsule may not carry an SVM
pointer as ``kDLOpenCL`` (that code means a ``cl_mem`` handle): ``__dlpack_device__``
says ``(kDLOpenCL, n)`` and ``__dlpack__`` refuses with :class:`BufferError`, except a host
copy when the consumer asks for ``dl_device=(kDLCPU, 0)`` (flag ``IS_COPIED``).

Views with negative strides are refused with :class:`BufferError` (a copy with
``copy=True``): DLPack consumers do not all take them, and PyTorch aborts the whole
process on one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from svmkit.driver import calls
from svmkit.events import wait_pending

if TYPE_CHECKING:
    from svmkit.arrays.array import SVMArray

__all__ = ["KDL_CPU", "KDL_OPENCL", "dlpack", "dlpack_device"]

KDL_CPU = 1
KDL_OPENCL = 4
_CPU = (KDL_CPU, 0)


def dlpack_device(a: SVMArray) -> tuple[int, int]:
    """``(kDLCPU, 0)`` for FINE and SYSTEM arrays; ``(kDLOpenCL, n)`` for COARSE ones, ``n``
    the index of the array's first device on its platform."""
    alloc = a.live()
    if not alloc.policy.needs_map:
        return _CPU
    device = alloc.context.devices[0]
    return (KDL_OPENCL, calls.platform_devices(device.platform).index(device))


def dlpack(
    a: SVMArray,
    stream: Any,
    max_version: tuple[int, int] | None,
    dl_device: tuple[int, int] | None,
    copy: bool | None,
) -> Any:
    """``a.__dlpack__(stream=, max_version=, dl_device=, copy=)`` (see the module doc)."""
    alloc = a.live()
    if stream is not None:
        raise BufferError(
            f"stream={stream!r}: an SVMArray exports as kDLCPU (or a kDLCPU copy), which "
            "has no streams; pass stream=None"
        )
    wants_cpu = dl_device is None or tuple(dl_device) == _CPU
    if alloc.policy.needs_map:
        if dl_device is not None and wants_cpu and copy is not False:
            host = a.get()  # after recorded work, through the device
            return host.__dlpack__(max_version=max_version, copy=True)
        raise BufferError(
            f"a coarse-grain {a.describe()} lives on the device and the host may touch it "
            "only while mapped: export the view `with svmkit.mapped(queue, a) as h:` "
            'yields, or ask for a host copy with np.from_dlpack(a, device="cpu")'
        )
    if not wants_cpu:
        raise BufferError(
            f"dl_device={tuple(dl_device)!r}: a fine-grain or system SVMArray exports as "  # type: ignore[arg-type]
            f"kDLCPU {_CPU} only"
        )
    record = alloc._events
    if record:
        wait_pending(record.pending())
    if any(stride < 0 for stride in a.strides):
        if copy:  # a copy has positive strides
            return a.host.copy().__dlpack__(max_version=max_version, copy=True)
        raise BufferError(
            f"a {a.describe()} with negative strides {a.strides}: consumers such as "
            "PyTorch cannot take them through DLPack (PyTorch aborts the process); "
            "export a.copy(), or pass copy=True"
        )
    return a.host.__dlpack__(max_version=max_version, copy=copy)
