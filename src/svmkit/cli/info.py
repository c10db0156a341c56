"""``svmkit info``: what SVM every OpenCL platform and device offers.

A platform or device that errors while being queried is reported with its error, never
fatal, and nothing is listed that the driver did not report.  The device
``sk.create_context()`` picks is marked, and the report names the versions of svmkit,
PyOpenCL, NumPy and every driver.
"""

from __future__ import annotations

import logging
import platform as _platform
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

import numpy as np
import pyopencl as cl

from svmkit._version import __version__
from svmkit.capabilities import (
    capabilities,
    compiler_failure,
    create_context,
    inventory,
    opencl_c_versions,
)
from svmkit.driver import calls
from svmkit.policy import Policy

__all__ = ["backends", "collect", "inventory", "render_table", "versions"]

log = logging.getLogger(__name__)


def _device_entry(device: cl.Device) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    try:
        entry["name"] = device.name.strip()
        entry["type"] = _device_type(device)
        entry["version"] = device.version.strip()
        entry["driver_version"] = device.driver_version.strip()
        versions = opencl_c_versions(device)
        entry["opencl_c"] = "{}.{}".format(*max(versions)) if versions else None
        caps = capabilities(device)
        entry.update(
            coarse_grain_buffer=caps.coarse_grain_buffer,
            fine_grain_buffer=caps.fine_grain_buffer,
            fine_grain_system=caps.fine_grain_system,
            atomics=caps.atomics,
            atomic_scope_all_devices=caps.atomic_scope_all_devices,
            max_alloc_bytes=caps.max_alloc_bytes,
            max_alignment=caps.max_alignment,
            address_bits=caps.address_bits,
            little_endian=caps.little_endian,
            migrate=caps.migrate,
        )
        entry["policy"] = str(Policy.best(caps)) if caps.svm else None
        entry["policy_atomics"] = (
            str(Policy.best(caps, atomics=True)) if caps.svm and caps.atomics else None
        )
        entry["compiler_error"] = compiler_failure(device)  # None: builds a kernel
    except Exception as exc:  # a broken device is reported, not fatal
        log.debug("querying %r failed", device, exc_info=True)
        entry["error"] = f"{type(exc).__name__}: {exc}"
    return entry


def _device_type(device: cl.Device) -> str:
    kinds = [
        name
        for name, bit in (
            ("GPU", cl.device_type.GPU),
            ("CPU", cl.device_type.CPU),
            ("accelerator", cl.device_type.ACCELERATOR),
        )
        if device.type & bit
    ]
    return "/".join(kinds) or "other"


def versions() -> dict[str, str]:
    """The versions of svmkit, PyOpenCL, NumPy and Python."""
    return {
        "svmkit": __version__,
        "pyopencl": cl.VERSION_TEXT,
        "numpy": np.__version__,
        "python": _platform.python_version(),
    }


def backends() -> dict[str, str]:
    """Which implementation serves each hot path: the pools (their size classes, block
    cache and counters are C, :mod:`svmkit.resources._cpool`), the operations (Python over
    PyOpenCL's entry points) and the work queue's host ring (C when it was built, else
    Python: ``SVMKIT_HOSTATOMICS=python`` forces it)."""
    from svmkit.resources import _cpool
    from svmkit.workqueue.ring import ring_class

    native = any(str(_cpool.__file__).endswith(s) for s in EXTENSION_SUFFIXES)
    pools = f"C ({_cpool.__name__})" if native else "Python"
    try:
        ring = "C" if ring_class().__module__.endswith("_cring") else "Python"
    except Exception as exc:  # (a forced backend that is missing: say so, do not fail)
        ring = f"unavailable ({exc})"
    return {"pools": pools, "operations": "Python (PyOpenCL entry points)", "ring": ring}


def _selected() -> tuple[cl.Device | None, str | None]:
    """The device ``create_context()`` picks, or why it picks none."""
    try:
        return create_context().devices[0], None
    except Exception as exc:  # reported, not fatal: info lists what exists regardless
        log.debug("create_context() failed", exc_info=True)
        return None, f"{type(exc).__name__}: {exc}"


def collect() -> dict[str, Any]:
    """Every platform and device with its SVM capabilities, as plain data (JSON-ready).

    ``versions`` names the software, every platform its ``driver_version`` (its devices'
    driver versions), and ``selected`` the platform and device indices that
    ``sk.create_context()`` picks (``None``, with ``selection_error``, when it fails).
    """
    report: dict[str, Any] = {
        "versions": versions(),
        "backends": backends(),
        "platforms": [],
        "selected": None,
    }
    try:
        platforms = calls.platforms()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    chosen, why = _selected()
    if why is not None:
        report["selection_error"] = why
    for p_index, platform in enumerate(platforms):
        pentry: dict[str, Any] = {"devices": []}
        try:
            pentry["name"] = platform.name.strip()
            pentry["version"] = platform.version.strip()
            devices = calls.platform_devices(platform)
        except Exception as exc:
            pentry["error"] = f"{type(exc).__name__}: {exc}"
            devices = []
        pentry["devices"] = [_device_entry(d) for d in devices]
        drivers = sorted({d["driver_version"] for d in pentry["devices"] if "driver_version" in d})
        pentry["driver_version"] = ", ".join(drivers) or None
        for d_index, (device, dentry) in enumerate(zip(devices, pentry["devices"])):
            dentry["selected"] = chosen is not None and device.int_ptr == chosen.int_ptr
            if dentry["selected"]:
                report["selected"] = {"platform": p_index, "device": d_index}
        report["platforms"].append(pentry)
    return report


def _yes(value: Any) -> str:
    return "yes" if value else "no"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MiB"


def render_table(report: dict[str, Any]) -> str:
    """A human-readable table of :func:`collect`'s report."""
    lines: list[str] = []
    if "error" in report:
        lines.append(f"OpenCL platforms could not be listed: {report['error']}")
    if not report.get("platforms"):
        lines.append(
            "No OpenCL platform found (is an ICD such as pocl-binary-distribution installed?)"
        )
    header = (
        "device",
        "type",
        "OpenCL C",
        "coarse",
        "fine",
        "system",
        "atomics",
        "scope",
        "max alloc",
        "align",
        "compiler",
        "policy",
    )
    for p_index, platform in enumerate(report.get("platforms", [])):
        title = f"Platform {p_index}: {platform.get('name', '?')} ({platform.get('version', '?')}"
        if platform.get("driver_version"):
            title += f", driver {platform['driver_version']}"
        lines.append(title + ")")
        if "error" in platform:
            lines.append(f"  error: {platform['error']}")
        rows: list[tuple[str, ...]] = [header]
        for d_index, dev in enumerate(platform["devices"]):
            mark = "*" if dev.get("selected") else " "
            name = f"{mark}{d_index}: {dev.get('name', '?')}"
            if "error" in dev:
                rows.append((name, f"error: {dev['error']}") + ("",) * (len(header) - 2))
                continue
            scope = "all_svm_devices" if dev["atomic_scope_all_devices"] else "device"
            policy = dev["policy"] or "none (no SVM)"
            if dev.get("policy_atomics"):
                policy += f" / atomics: {dev['policy_atomics']}"
            rows.append(
                (
                    name,
                    dev["type"],
                    dev["opencl_c"] or "?",
                    _yes(dev["coarse_grain_buffer"]),
                    _yes(dev["fine_grain_buffer"]),
                    _yes(dev["fine_grain_system"]),
                    _yes(dev["atomics"]),
                    scope,
                    _mib(dev["max_alloc_bytes"]),
                    f"{dev['max_alignment']} B",
                    "fails" if dev["compiler_error"] else "ok",
                    policy,
                )
            )
        widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
        for row in rows:
            lines.append("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
        for d_index, dev in enumerate(platform["devices"]):
            if dev.get("compiler_error"):
                lines.append(
                    f"  {d_index}: the compiler fails ({dev['compiler_error']}); "
                    "sk.create_context() passes over this device (and refuses it when "
                    "PYOPENCL_CTX selects it)"
                )
        lines.append("")
    if report.get("platforms"):
        if report.get("selected"):
            lines.append("* the device sk.create_context() picks (PYOPENCL_CTX selects another)")
        else:
            lines.append(f"sk.create_context() picks no device: {report.get('selection_error')}")
    versions = report.get("versions", {})
    if versions:
        lines.append(", ".join(f"{name} {version}" for name, version in versions.items()))
    serving = report.get("backends", {})
    if serving:
        lines.append("backends: " + ", ".join(f"{k} {v}" for k, v in serving.items()))
    return "\n".join(lines) + "\n"
