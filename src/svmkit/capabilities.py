"""What devices and contexts support for SVM: queried once, cached per device.

A context's capabilities are the AND (booleans) and the minimum (limits) over its devices:
the spec lets a granularity be used in a context only when every device supports it
("CL_MEM_SVM_FINE_GRAIN_BUFFER or CL_MEM_SVM_ATOMICS is specified in flags and these are
not supported by at least one device in context" makes ``clSVMAlloc`` fail).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

import pyopencl as cl

from svmkit.driver import calls, fork
from svmkit.driver.per_context import PerContext
from svmkit.errors import BuildError, SVMError, UnsupportedError

__all__ = [
    "Capabilities",
    "capabilities",
    "check_context_layout",
    "compiler_failure",
    "create_context",
    "device_label",
    "inventory",
    "opencl_c_versions",
]

_SVM_COARSE = 1 << 0
_SVM_FINE_BUFFER = 1 << 1
_SVM_FINE_SYSTEM = 1 << 2
_SVM_ATOMICS = 1 << 3

HOST_ADDRESS_BITS = 64 if sys.maxsize > 2**32 else 32
HOST_LITTLE_ENDIAN = sys.byteorder == "little"

log = logging.getLogger("svmkit")


@dataclass(frozen=True)
class Capabilities:
    """SVM capabilities of one device, or of a context (AND/min over its devices).

    ``max_alignment`` follows ``clSVMAlloc``'s alignment rule: the size of the largest
    data type the device supports, ``long16`` (128 bytes) when it has 64-bit integers
    (always in the full profile), else ``int16`` (64 bytes).
    """

    coarse_grain_buffer: bool
    fine_grain_buffer: bool
    fine_grain_system: bool
    atomics: bool
    atomic_scope_all_devices: bool
    max_alloc_bytes: int
    max_alignment: int
    address_bits: int
    little_endian: bool
    migrate: bool
    name: str = ""
    devices: tuple[Capabilities, ...] = field(default=(), compare=False, repr=False)

    @property
    def svm(self) -> bool:
        """Whether any SVM at all is usable (coarse-grain buffers are the minimum)."""
        return self.coarse_grain_buffer


_cache: dict[int, Capabilities] = {}
_cache_lock = threading.Lock()


def device_label(device: cl.Device) -> str:
    """A short human name for a device: ``'name' on 'platform'``."""
    try:
        return f"{device.name.strip()!r} on {device.platform.name.strip()!r}"
    except cl.Error:
        return repr(device)


def opencl_c_versions(device: cl.Device) -> list[tuple[int, int]]:
    """Every OpenCL C version the device accepts for ``-cl-std``, ascending."""
    versions: set[tuple[int, int]] = set()
    try:
        for nv in device.opencl_c_all_versions:
            v = int(nv.version)
            versions.add((v >> 22, (v >> 12) & 0x3FF))
    except (cl.Error, AttributeError):
        pass
    try:
        # "OpenCL C <major>.<minor> <vendor>"
        text = device.opencl_c_version.split()[2]
        major, minor = text.split(".")[:2]
        versions.add((int(major), int(minor)))
    except (cl.Error, IndexError, ValueError):
        pass
    return sorted(versions)


def _device_version(device: cl.Device) -> tuple[int, int]:
    try:
        major, minor = device.version.split()[1].split(".")[:2]
        return int(major), int(minor)
    except (IndexError, ValueError):
        return (1, 0)


def _c_feature_names(device: cl.Device) -> set[str] | None:
    try:
        return {f.name for f in device.opencl_c_features}
    except (cl.Error, AttributeError):
        return None


def _query_device(device: cl.Device) -> Capabilities:
    try:
        svm = int(device.svm_capabilities)
    except (cl.Error, AttributeError):
        svm = 0
    version = _device_version(device)
    features = _c_feature_names(device)
    c_versions = opencl_c_versions(device)
    if features is not None and version >= (3, 0):
        scope_all = "__opencl_c_atomic_scope_all_devices" in features
    else:
        # OpenCL C 2.x makes every memory scope mandatory.
        scope_all = any(v >= (2, 0) for v in c_versions)
    extensions = device.extensions.split()
    full_profile = device.profile.strip() == "FULL_PROFILE"
    int64 = (
        full_profile
        or "cl_khr_int64" in extensions
        or bool(features and "__opencl_c_int64" in features)
    )
    return Capabilities(
        coarse_grain_buffer=bool(svm & _SVM_COARSE),
        fine_grain_buffer=bool(svm & _SVM_FINE_BUFFER),
        fine_grain_system=bool(svm & _SVM_FINE_SYSTEM),
        atomics=bool(svm & _SVM_ATOMICS),
        atomic_scope_all_devices=scope_all,
        max_alloc_bytes=int(device.max_mem_alloc_size),
        max_alignment=128 if int64 else 64,
        address_bits=int(device.address_bits),
        little_endian=bool(device.endian_little),
        migrate=version >= (2, 1),
        name=device_label(device),
    )


def _device_capabilities(device: cl.Device) -> Capabilities:
    key = device.int_ptr
    caps = _cache.get(key)
    if caps is None:
        caps = _query_device(device)
        caps = _with_devices(caps, (caps,))
        with _cache_lock:
            _cache[key] = caps
    return caps


def _with_devices(caps: Capabilities, devices: tuple[Capabilities, ...]) -> Capabilities:
    object.__setattr__(caps, "devices", devices)
    return caps


def combine(per_device: tuple[Capabilities, ...]) -> Capabilities:
    """Context-wide capabilities: AND of every boolean, minimum of every limit."""
    if len(per_device) == 1:
        return per_device[0]
    combined = Capabilities(
        coarse_grain_buffer=all(c.coarse_grain_buffer for c in per_device),
        fine_grain_buffer=all(c.fine_grain_buffer for c in per_device),
        fine_grain_system=all(c.fine_grain_system for c in per_device),
        atomics=all(c.atomics for c in per_device),
        atomic_scope_all_devices=all(c.atomic_scope_all_devices for c in per_device),
        max_alloc_bytes=min(c.max_alloc_bytes for c in per_device),
        max_alignment=min(c.max_alignment for c in per_device),
        address_bits=min(c.address_bits for c in per_device),
        little_endian=all(c.little_endian for c in per_device),
        migrate=all(c.migrate for c in per_device),
        name=", ".join(c.name for c in per_device),
    )
    return _with_devices(combined, per_device)


_context_cache: dict[tuple[int, ...], Capabilities] = {}


def _context_capabilities(ctx: cl.Context) -> Capabilities:
    devices = ctx.devices
    key = tuple(d.int_ptr for d in devices)
    caps = _context_cache.get(key)
    if caps is None:
        caps = combine(tuple(_device_capabilities(d) for d in devices))
        with _cache_lock:
            _context_cache[key] = caps
    return caps


_by_context: PerContext[Capabilities] = PerContext(_context_capabilities)


def capabilities(ctx_or_device: cl.Context | cl.Device) -> Capabilities:
    """The SVM :class:`Capabilities` of a device or of a context (AND/min over its devices).

    Queried once per device and cached; a context's answer is cached per context object,
    so the call is a dictionary lookup on hot paths.
    """
    if isinstance(ctx_or_device, cl.Device):
        return _device_capabilities(ctx_or_device)
    return _by_context.get(ctx_or_device)


def check_context_layout(ctx: cl.Context) -> None:
    """Refuse a context that SVM cannot serve from this host.

    Spec: "the address space size must be the same for the host and all OpenCL devices in
    the context", and devices sharing pointers should have the host's endianness.
    """
    for device, caps in zip(ctx.devices, capabilities(ctx).devices):
        if caps.address_bits != HOST_ADDRESS_BITS:
            raise UnsupportedError(
                f"device {device_label(device)} has a {caps.address_bits}-bit address space "
                f"but the host has {HOST_ADDRESS_BITS} bits; SVM requires the same address "
                "space size on the host and every device in the context"
            )
        if caps.little_endian != HOST_LITTLE_ENDIAN:
            raise UnsupportedError(
                f"device {device_label(device)} is "
                f"{'little' if caps.little_endian else 'big'}-endian but the host is "
                f"{sys.byteorder}-endian; SVM pointers cannot be shared across endianness"
            )


_PROBE_SOURCE = "__kernel void svmkit_probe(__global int *p) { p[get_global_id(0)] = 1; }"
_compiler_failures: dict[int, str | None] = {}


def compiler_failure(device: cl.Device) -> str | None:
    """``None`` when the device's OpenCL C compiler builds a trivial kernel, else why not.

    A driver can list a device it cannot compile for: PoCL 3.0's LLVM 14 names CPUs newer
    than itself (AMD Zen 5, for one) ``generic``, a CPU its own front end then rejects,
    so every ``clBuildProgram`` fails.  Built once per device (uncached by PyOpenCL) and
    remembered; the answer is the first line of the build log.
    """
    key = device.int_ptr
    if key in _compiler_failures:
        return _compiler_failures[key]
    failure: str | None = None
    try:
        with warnings.catch_warnings():  # the build log of a working compiler
            warnings.simplefilter("ignore", cl.CompilerWarning)
            calls.build_program(
                calls.new_context([device]), _PROBE_SOURCE, (), [device], cached=False
            )
    except BuildError as exc:
        build_log = next(iter(exc.device_logs.values()), "")
        lines = [line.strip() for line in build_log.splitlines() if line.strip()]
        failure = lines[0] if lines else str(exc)
    except (cl.Error, SVMError) as exc:  # no context or program at all
        failure = str(exc)
    with _cache_lock:
        _compiler_failures[key] = failure
    return failure


def _svm_devices(device_type: Any = None) -> tuple[list[cl.Device], list[str]]:
    found: list[str] = []
    gpus: list[cl.Device] = []
    others: list[cl.Device] = []
    for platform in calls.platforms():
        try:
            devices = calls.platform_devices(platform, device_type)
        except SVMError as exc:
            found.append(f"platform {platform.name.strip()!r}: error {exc}")
            continue
        for device in devices:
            caps = capabilities(device)
            found.append(f"{device_label(device)}: {'SVM' if caps.svm else 'no SVM'}")
            if caps.svm:
                (gpus if device.type & cl.device_type.GPU else others).append(device)
    return gpus + others, found


def inventory() -> str:
    """One line naming every platform and its devices with their indices (as
    ``PYOPENCL_CTX`` takes them), each device whose compiler fails marked so, or saying
    there is none."""
    try:
        platforms = calls.platforms()
    except SVMError:
        return "no OpenCL platform"
    parts = []
    for p_index, platform in enumerate(platforms):
        try:
            names = []
            for i, device in enumerate(calls.platform_devices(platform)):
                failure = compiler_failure(device)
                note = "" if failure is None else f" (its compiler fails: {failure})"
                names.append(f"{i}: {device.name.strip()}{note}")
            devices = ", ".join(names) or "no devices"
        except SVMError as exc:
            devices = f"error {exc}"
        parts.append(f"platform {p_index}: {platform.name.strip()} [{devices}]")
    return "; ".join(parts) or "no OpenCL platform"


def create_context(*, device_type: Any = None) -> cl.Context:
    """A context on one SVM-capable device, or as ``PYOPENCL_CTX`` says.

    Honours ``PYOPENCL_CTX`` as PyOpenCL does (``platform[:device]``, by index or by
    part of the name).  Otherwise: the first device that supports SVM, GPUs before other
    devices, platforms in the ICD loader's order, passing over a device whose OpenCL C
    compiler cannot build a trivial kernel (:func:`compiler_failure`; logged as a warning).

    Raises
    ------
    UnsupportedError
        No usable device with SVM was found; a ``PYOPENCL_CTX`` that selects nothing, or
        a device whose compiler fails.  The message lists what was found.
    """
    try:
        context = _create_context(device_type)
    except (cl.Error, SVMError) as exc:
        driver_error = exc if isinstance(exc, cl.Error) else exc.__cause__
        if not fork.forked or not isinstance(driver_error, cl.Error):
            raise
        raise UnsupportedError(
            "this process was forked after its parent used OpenCL, and the OpenCL driver "
            f"cannot start again here ({exc}); CUDA-based drivers (NVIDIA's) do not survive "
            "fork(): start processes with the 'spawn' method (multiprocessing, Dask)"
        ) from exc
    if fork.forked:
        _refuse_a_driver_left_in_the_parent(context)
    return context


def _refuse_a_driver_left_in_the_parent(context: cl.Context) -> None:
    """In a forked child: a context on a driver whose state stayed in the parent is an
    ``UnsupportedError`` (:func:`svmkit.driver.fork.left_in_parent`)."""
    if any(fork.left_in_parent(d) for d in context.devices):
        raise UnsupportedError(
            "this process was forked after its parent used PoCL's CPU device, whose worker "
            "threads stay in the parent (a command here would never complete): start "
            "processes with the 'spawn' method (multiprocessing, Dask)"
        )


_default_context: cl.Context | None = None
_default_context_lock = threading.Lock()


def default_context() -> cl.Context:
    """The process's default context: made once by :func:`create_context` on first use
    (after a fork, anew in the child).  Unpickled SVMArrays and ``sk.numpy_allocator()``
    use it."""
    global _default_context
    context = _default_context
    if context is not None:
        return context
    with _default_context_lock:
        if _default_context is None:
            _default_context = create_context()
        return _default_context


def _forget_default_context() -> None:
    """In a forked child: the parent's context is not this process's."""
    global _default_context, _default_context_lock
    if _default_context is not None:
        fork.keep(_default_context)
    _default_context = None
    _default_context_lock = threading.Lock()  # (a thread of the parent may have held it)


fork.in_child(_forget_default_context)


def _selected_context(spec: str) -> cl.Context:
    """The context ``PYOPENCL_CTX=spec`` selects (PyOpenCL's own rules), on devices whose
    compiler works; else :class:`~svmkit.UnsupportedError` listing what exists."""
    try:
        devices = calls.chosen_devices()
    except SVMError as exc:
        if fork.forked:
            raise
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise UnsupportedError(
            f"PYOPENCL_CTX={spec!r} selects no device ({cause}); found: {inventory()}"
        ) from None
    for device in devices:
        failure = compiler_failure(device)
        if failure is not None:
            raise UnsupportedError(
                f"PYOPENCL_CTX={spec!r} selects {device_label(device)}, whose OpenCL C "
                f"compiler fails ({failure}): every kernel build would fail; select "
                f"another device or unset PYOPENCL_CTX; found: {inventory()}"
            )
    return calls.new_context(devices)


def _create_context(device_type: Any) -> cl.Context:
    spec = os.environ.get("PYOPENCL_CTX")
    if spec:
        ctx = _selected_context(spec)
        check_context_layout(ctx)
        return ctx
    devices, found = _svm_devices(device_type)
    if not devices:
        listing = "; ".join(found) or "no OpenCL platforms"
        raise UnsupportedError(f"no OpenCL device with SVM support was found ({listing})")
    for device in devices:
        if fork.left_in_parent(device):
            log.warning(
                "passing over %s: this process was forked after its parent used it, and its "
                "worker threads stayed in the parent",
                device_label(device),
            )
            found.append(f"{device_label(device)}: its worker threads stayed in the parent")
            continue
        failure = compiler_failure(device)
        if failure is None:
            ctx = calls.new_context([device])
            check_context_layout(ctx)
            return ctx
        log.warning("passing over %s: its compiler fails (%s)", device_label(device), failure)
        found.append(f"{device_label(device)}: compiler fails ({failure})")
    raise UnsupportedError(
        f"no OpenCL device with SVM support can build a kernel ({'; '.join(found)})"
    )
