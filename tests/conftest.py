"""Device fixtures: every test gets a real context; needs are a marker resolved here.

The context is the one ``sk.create_context()`` gives (so ``PYOPENCL_CTX`` selects another
implementation).  ``@pytest.mark.needs("fine", "atomics")`` skips, naming the missing
capability, when the context lacks it (so the suite runs on coarse-only drivers too).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# PoCL: two CPU devices, so multi-device contexts are testable (other drivers ignore this).
os.environ.setdefault("POCL_DEVICES", "pthread pthread")

from collections.abc import Iterator

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk

# Kernel caches of this session only, so a second run on the same machine builds (and
# logs) exactly what the first did: PoCL's and NVIDIA's caches outlive the process and
# would hand back the first run's binaries (without their build logs).  Child
# interpreters of the tests inherit them.
_KERNEL_CACHE = tempfile.mkdtemp(prefix="svmkit-tests-kernel-cache-")
os.environ["POCL_CACHE_DIR"] = os.path.join(_KERNEL_CACHE, "pocl")
os.environ["CUDA_CACHE_PATH"] = os.path.join(_KERNEL_CACHE, "cuda")
atexit.register(shutil.rmtree, _KERNEL_CACHE, ignore_errors=True)

_NEEDS = {
    "coarse": lambda c: c.coarse_grain_buffer,
    "fine": lambda c: c.fine_grain_buffer,
    "system": lambda c: c.fine_grain_system,
    "atomics": lambda c: c.atomics and c.fine_grain_buffer,
    "migrate": lambda c: c.migrate,
}


@pytest.fixture(scope="session")
def ctx() -> cl.Context:
    """The context the suite runs on (one SVM device)."""
    return sk.create_context()


@pytest.fixture(scope="session")
def caps(ctx: cl.Context) -> sk.Capabilities:
    return sk.capabilities(ctx)


@pytest.fixture
def queue(ctx: cl.Context) -> Iterator[cl.CommandQueue]:
    q = cl.CommandQueue(ctx)
    yield q
    q.finish()


@pytest.fixture(autouse=True)
def _resolve_needs(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("needs")
    if marker is None:
        return
    caps = sk.capabilities(request.getfixturevalue("ctx"))
    missing = [need for need in marker.args if not _NEEDS[need](caps)]
    if missing:
        pytest.skip(f"the test device lacks {', '.join(missing)} SVM ({caps.name})")


@pytest.fixture(params=["coarse", "fine"])
def policy(request: pytest.FixtureRequest, caps: sk.Capabilities) -> sk.Policy:
    """Each buffer granularity the device supports (skips the others, naming them)."""
    if not _NEEDS[request.param](caps):
        pytest.skip(f"the test device lacks {request.param} SVM ({caps.name})")
    return sk.Policy.coarse() if request.param == "coarse" else sk.Policy.fine()


#: Every policy the suite runs the granularity-generic tests with, by id.
POLICIES = {
    "coarse": sk.Policy.coarse(),
    "fine": sk.Policy.fine(),
    "fine+atomics": sk.Policy.fine(atomics=True),
    "system": sk.Policy.system(),
    "system+atomics": sk.Policy.system(atomics=True),
}


def _supports(caps: sk.Capabilities, policy: sk.Policy) -> bool:
    return not policy.missing(caps)


@pytest.fixture(params=list(POLICIES))
def any_policy(request: pytest.FixtureRequest, caps: sk.Capabilities) -> sk.Policy:
    """Every policy, SYSTEM and atomics included (skips those the device lacks, naming them)."""
    policy = POLICIES[request.param]
    if not _supports(caps, policy):
        pytest.skip(f"the test device lacks {request.param} SVM ({caps.name})")
    return policy


@pytest.fixture(scope="session")
def policies(caps: sk.Capabilities) -> dict[str, sk.Policy]:
    """The policies of :data:`POLICIES` that the test device supports, by id."""
    return {name: p for name, p in POLICIES.items() if _supports(caps, p)}


@pytest.fixture(scope="session")
def two_device_ctx(ctx: cl.Context) -> cl.Context:
    """A context of two devices that share SVM, on the suite's own platform.

    Two devices of that platform (PoCL with POCL_DEVICES="pthread pthread"), else two
    sub-devices of the suite's device (``clCreateSubDevices``, as Intel's CPU runtime
    offers), else the test skips.
    """
    device = ctx.devices[0]
    devices = [d for d in device.platform.get_devices() if sk.capabilities(d).coarse_grain_buffer]
    if len(devices) >= 2:
        return cl.Context(devices[:2])
    if device.max_compute_units >= 2 and (
        cl.device_partition_property.EQUALLY in (device.partition_properties or ())
    ):
        halves = device.create_sub_devices(
            [cl.device_partition_property.EQUALLY, device.max_compute_units // 2]
        )
        return cl.Context(halves[:2])
    pytest.skip(
        f"{device.platform.name} offers neither two SVM devices nor sub-devices; "
        "run with POCL_DEVICES='pthread pthread'"
    )


def host_copy(a: sk.SVMArray) -> np.ndarray:
    """The array's contents read back through the device (a.get())."""
    return a.get()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``stress`` tests run only when asked for (``-m stress``); they are deselected otherwise."""
    if "stress" in (config.getoption("markexpr") or ""):
        return
    keep = [item for item in items if item.get_closest_marker("stress") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.fixture(scope="session")
def other_ctx(ctx: cl.Context) -> cl.Context:
    """A second context on the same device (for CL_INVALID_CONTEXT checks)."""
    return cl.Context([ctx.devices[0]])


@pytest.fixture
def foreign_event(other_ctx: cl.Context) -> cl.UserEvent:
    """A completed event of another context.

    Completed, because some drivers (NVIDIA's) block in clReleaseContext while a user
    event of the context is still incomplete.
    """
    event = cl.UserEvent(other_ctx)
    event.set_status(cl.command_execution_status.COMPLETE)
    return event


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The OpenCL device and driver the suite runs on (what ``sk.create_context()`` picks)."""
    try:
        device = sk.create_context().devices[0]
    except Exception as exc:  # the session fixture reports it again, per test
        return [f"OpenCL: no device ({type(exc).__name__}: {exc})"]
    platform = device.platform
    return [
        f"OpenCL: {device.name.strip()} on {platform.name.strip()} "
        f"({platform.version.strip()}; driver {device.driver_version.strip()}); "
        f"PYOPENCL_CTX={os.environ.get('PYOPENCL_CTX', '')!r}",
        f"svmkit {sk.__version__}, PyOpenCL {cl.VERSION_TEXT}, NumPy {np.__version__}",
    ]
