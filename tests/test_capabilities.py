"""Capabilities: real device queries, the context-wide AND/min, and layout refusals."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pyopencl as cl
import pytest

import svmkit as sk

# svmkit.capabilities is also the name of the function svmkit re-exports.
capmod = sys.modules["svmkit.capabilities"]


def test_device_capabilities_match_the_driver(ctx):
    device = ctx.devices[0]
    caps = sk.capabilities(device)
    bits = device.svm_capabilities
    assert caps.coarse_grain_buffer == bool(bits & cl.device_svm_capabilities.COARSE_GRAIN_BUFFER)
    assert caps.fine_grain_buffer == bool(bits & cl.device_svm_capabilities.FINE_GRAIN_BUFFER)
    assert caps.fine_grain_system == bool(bits & cl.device_svm_capabilities.FINE_GRAIN_SYSTEM)
    assert caps.atomics == bool(bits & cl.device_svm_capabilities.ATOMICS)
    assert caps.max_alloc_bytes == device.max_mem_alloc_size
    assert caps.address_bits == device.address_bits
    assert caps.little_endian == bool(device.endian_little)
    assert caps.devices == (caps,)


def test_atomic_scope_follows_the_opencl_c_feature(ctx):
    device = ctx.devices[0]
    names = {f.name for f in device.opencl_c_features}
    assert sk.capabilities(device).atomic_scope_all_devices == (
        "__opencl_c_atomic_scope_all_devices" in names
    )


def test_max_alignment_is_long16_with_64_bit_integers(ctx):
    # Full profile devices always have 64-bit integers: the largest type is long16.
    if ctx.devices[0].profile.strip() == "FULL_PROFILE":
        assert sk.capabilities(ctx).max_alignment == 128
    else:
        assert sk.capabilities(ctx).max_alignment in (64, 128)


def test_context_capabilities_of_one_device_are_the_device_s(ctx):
    assert sk.capabilities(ctx) == sk.capabilities(ctx.devices[0])


def test_two_device_context_ands_and_mins(two_device_ctx):
    caps = sk.capabilities(two_device_ctx)
    assert len(caps.devices) == 2
    assert caps.fine_grain_buffer == all(d.fine_grain_buffer for d in caps.devices)
    assert caps.max_alloc_bytes == min(d.max_alloc_bytes for d in caps.devices)


def _fake(base: sk.Capabilities, **changes: Any) -> sk.Capabilities:
    fake = dataclasses.replace(base, **changes)
    object.__setattr__(fake, "devices", (fake,))
    return fake


def test_combine_takes_and_of_booleans_and_min_of_limits(caps):
    # PoCL's devices are identical, so devices that differ are faked (capabilities only).
    strong = _fake(
        caps,
        fine_grain_buffer=True,
        atomics=True,
        max_alloc_bytes=1 << 30,
        max_alignment=128,
        name="strong",
    )
    weak = _fake(
        caps,
        fine_grain_buffer=False,
        fine_grain_system=False,
        atomics=False,
        max_alloc_bytes=1 << 20,
        max_alignment=64,
        name="weak",
    )
    combined = capmod.combine((strong, weak))
    assert combined.fine_grain_buffer is False and combined.atomics is False
    assert combined.coarse_grain_buffer is caps.coarse_grain_buffer
    assert combined.max_alloc_bytes == 1 << 20
    assert combined.max_alignment == 64
    assert combined.devices == (strong, weak)
    assert sk.Policy.best(combined) == sk.Policy.coarse()
    with pytest.raises(sk.UnsupportedError, match="weak") as info:
        sk.Policy.best(combined, atomics=True)
    assert info.value.cl_error is None


def test_policy_check_names_the_device_that_lacks_a_capability(caps, monkeypatch, ctx):
    weak = _fake(caps, fine_grain_buffer=False, atomics=False, name="'weak dev'")
    both = capmod.combine((caps, weak))
    monkeypatch.setattr(sys.modules["svmkit.policy"], "capabilities", lambda _ctx: both)
    with pytest.raises(sk.UnsupportedError, match="'weak dev' lacks fine-grain buffer SVM"):
        sk.Policy.fine().check(ctx)
    sk.Policy.coarse().check(ctx)  # coarse is still fine everywhere


def test_context_with_a_different_address_space_is_refused(caps, monkeypatch, ctx):
    odd = _fake(caps, address_bits=32 if sys.maxsize > 2**32 else 64)
    monkeypatch.setattr(capmod, "capabilities", lambda _ctx: odd)
    with pytest.raises(sk.UnsupportedError, match="address space"):
        capmod.check_context_layout(ctx)
    with pytest.raises(sk.UnsupportedError, match="address space"):
        sk.SVMResource(ctx)


def test_context_with_other_endianness_is_refused(caps, monkeypatch, ctx):
    odd = _fake(caps, little_endian=not caps.little_endian)
    monkeypatch.setattr(capmod, "capabilities", lambda _ctx: odd)
    with pytest.raises(sk.UnsupportedError, match="endian"):
        capmod.check_context_layout(ctx)


def test_create_context_picks_an_svm_device():
    ctx = sk.create_context()
    assert len(ctx.devices) == 1
    assert sk.capabilities(ctx).coarse_grain_buffer


def test_create_context_honours_pyopencl_ctx(monkeypatch):
    platforms = cl.get_platforms()
    index = len(platforms) - 1
    last = len(platforms[index].get_devices()) - 1
    monkeypatch.setenv("PYOPENCL_CTX", f"{index}:{last}")
    ctx = sk.create_context()
    assert ctx.devices == [platforms[index].get_devices()[last]]


def test_create_context_without_svm_devices_lists_what_was_found(monkeypatch):
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    real = capmod.capabilities

    def no_svm(device):
        return _fake(real(device), coarse_grain_buffer=False, fine_grain_buffer=False)

    monkeypatch.setattr(capmod, "capabilities", no_svm)
    with pytest.raises(sk.UnsupportedError, match="no OpenCL device with SVM") as info:
        sk.create_context()
    assert "no SVM" in str(info.value)


def test_the_suite_device_compiles(ctx):
    assert capmod.compiler_failure(ctx.devices[0]) is None
    assert capmod.compiler_failure(ctx.devices[0]) is None  # remembered


def test_create_context_passes_over_a_device_whose_compiler_fails(monkeypatch):
    # Faked: which device's compiler fails (PoCL 3.0 on CPUs newer than its LLVM is real,
    # but not on every machine).  The memory and contexts are real.
    monkeypatch.delenv("PYOPENCL_CTX", raising=False)
    devices, _ = capmod._svm_devices()
    broken = devices[0]
    monkeypatch.setattr(
        capmod,
        "compiler_failure",
        lambda d: "error: unknown target CPU 'generic'" if d == broken else None,
    )
    if len(devices) > 1:
        assert sk.create_context().devices == [devices[1]]
    monkeypatch.setattr(capmod, "compiler_failure", lambda d: "error: no compiler")
    with pytest.raises(sk.UnsupportedError, match="can build a kernel") as info:
        sk.create_context()
    assert "compiler fails (error: no compiler)" in str(info.value)
    assert capmod.device_label(broken) in str(info.value)


def test_compiler_failure_reports_the_first_line_of_the_build_log(ctx, monkeypatch):
    class Broken:  # a program whose build fails with a log, as PoCL 3.0's on AMD Zen 5
        def __init__(self, _ctx, _source):
            pass

        def build(self, _options, _devices):
            raise cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE")

        def get_build_info(self, _device, _what):
            return "\n  error: unknown target CPU 'generic'\nmore\n"

    device = ctx.devices[0]
    monkeypatch.setattr(sys.modules["svmkit.driver.calls"]._cl, "_Program", Broken)
    monkeypatch.setattr(capmod, "_compiler_failures", {})
    assert capmod.compiler_failure(device) == "error: unknown target CPU 'generic'"


def _every_device_named(message: str) -> None:
    for p_index, platform in enumerate(cl.get_platforms()):
        assert f"platform {p_index}: {platform.name.strip()} [" in message
        for d_index, device in enumerate(platform.get_devices()):
            assert f"{d_index}: {device.name.strip()}" in message


@pytest.mark.parametrize("spec", ["7", "no-such-platform-anywhere", "0:9"])
def test_create_context_with_a_pyopencl_ctx_that_matches_nothing_lists_what_exists(
    monkeypatch, spec
):
    monkeypatch.setenv("PYOPENCL_CTX", spec)
    with pytest.raises(sk.UnsupportedError, match=f"PYOPENCL_CTX='{spec}' selects no device"):
        sk.create_context()
    try:
        sk.create_context()
    except sk.UnsupportedError as exc:
        assert exc.__cause__ is None and exc.__suppress_context__  # one error, not PyOpenCL's
        _every_device_named(str(exc))


def _failing_device() -> tuple[str, cl.Device] | None:
    """A ``PYOPENCL_CTX`` value naming a real device whose compiler fails (PoCL 3.0 on CPUs
    newer than its LLVM), if this machine has one."""
    for p_index, platform in enumerate(cl.get_platforms()):
        for d_index, device in enumerate(platform.get_devices()):
            if capmod.compiler_failure(device) is not None:
                return f"{p_index}:{d_index}", device
    return None


def test_create_context_refuses_a_pyopencl_ctx_device_whose_compiler_fails(monkeypatch):
    real = _failing_device()
    if real is not None:  # the driver's own failure, where this machine has one
        spec, device = real
        monkeypatch.setenv("PYOPENCL_CTX", spec)
        with pytest.raises(sk.UnsupportedError) as info:
            sk.create_context()
        message = str(info.value)
        assert f"PYOPENCL_CTX='{spec}' selects {capmod.device_label(device)}" in message
        assert f"compiler fails ({capmod.compiler_failure(device)})" in message
        assert "clBuildProgram" not in message
        _every_device_named(message)
    # Faked on the suite's own device, so that every machine runs it: the context is real.
    platforms = cl.get_platforms()
    device = platforms[0].get_devices()[0]
    monkeypatch.setenv("PYOPENCL_CTX", "0:0")
    monkeypatch.setattr(
        capmod, "compiler_failure", lambda d: "error: no compiler" if d == device else None
    )
    with pytest.raises(sk.UnsupportedError, match=r"compiler fails \(error: no compiler\)"):
        sk.create_context()
    monkeypatch.setattr(capmod, "compiler_failure", lambda d: None)
    assert sk.create_context().devices == [device]
