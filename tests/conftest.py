"""Device fixtures: every test gets a real context; needs are a marker resolved here.

The context is the one ``sk.create_context()`` gives (so ``PYOPENCL_CTX`` selects another
implementation).  ``@pytest.mark.needs("fine", "atomics")`` skips, naming the missing
capability, when the context lacks it (so the suite runs on coarse-only drivers too).
"""

from __future__ import annotations

import os

# PoCL: two CPU devices, so multi-device contexts are testable (other drivers ignore this).
os.environ.setdefault("POCL_DEVICES", "pthread pthread")

from collections.abc import Iterator

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk

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
