"""``svmkit info``: what SVM every OpenCL platform and device offers.

A platform or device that errors while being queried is reported with its error, never
fatal, and nothing is listed that the driver did not report.
"""

from __future__ import annotations

import logging
from typing import Any

import pyopencl as cl

from svmkit.capabilities import capabilities, compiler_failure, opencl_c_versions
from svmkit.policy import Policy

__all__ = ["collect", "render_table"]

log = logging.getLogger(__name__)


def _device_entry(device: cl.Device) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    try:
        entry["name"] = device.name.strip()
        entry["type"] = _device_type(device)
        entry["version"] = device.version.strip()
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


def collect() -> dict[str, Any]:
    """Every platform and device with its SVM capabilities, as plain data (JSON-ready)."""
    report: dict[str, Any] = {"platforms": []}
    try:
        platforms = cl.get_platforms()
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report
    for platform in platforms:
        pentry: dict[str, Any] = {"devices": []}
        try:
            pentry["name"] = platform.name.strip()
            pentry["version"] = platform.version.strip()
            devices = platform.get_devices()
        except Exception as exc:
            pentry["error"] = f"{type(exc).__name__}: {exc}"
            devices = []
        pentry["devices"] = [_device_entry(d) for d in devices]
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
        title = f"Platform {p_index}: {platform.get('name', '?')} ({platform.get('version', '?')})"
        lines.append(title)
        if "error" in platform:
            lines.append(f"  error: {platform['error']}")
        rows: list[tuple[str, ...]] = [header]
        for d_index, dev in enumerate(platform["devices"]):
            name = f"{d_index}: {dev.get('name', '?')}"
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
                    "sk.create_context() passes over this device"
                )
        lines.append("")
    return "\n".join(lines) + "\n"
