"""What every svmkit benchmark script shares: progress, machine notes, RESULTS.md sections.

Each script owns one section of ``benchmarks/RESULTS.md`` per machine kind, between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``: ``NAME`` is the script's name on a CPU
device and ``NAME-<vendor>`` on another device (``ops-nvidia``), so runs on different
machines never overwrite each other.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path

import numpy as np
import pyopencl as cl

import svmkit as sk

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def progress(script: str, msg: str) -> None:
    """One progress line on stderr (tables go to stdout)."""
    sys.stderr.write(f"[{script}] {msg}\n")
    sys.stderr.flush()


def cpu_model() -> str:
    """The host CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_notes(ctx: cl.Context, extra: str = "") -> list[str]:
    """Two lines naming the host, the software versions and the OpenCL device."""
    dev = ctx.devices[0]
    return [
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"NumPy {np.__version__}, PyOpenCL {cl.VERSION_TEXT}, svmkit {sk.__version__}{extra}",
        f"OpenCL: {dev.platform.name.strip()} {dev.platform.version.strip()}; device "
        f"{dev.name.strip()} ({dev.max_compute_units} compute units, {dev.version.strip()}, "
        f"driver {dev.driver_version})",
    ]


def section_name(script: str, ctx: cl.Context) -> tuple[str, str]:
    """``(section, title suffix)`` for a run on ``ctx``'s first device."""
    dev = ctx.devices[0]
    vendor = re.sub(r"[^a-z0-9]+", "-", dev.platform.vendor.lower()).strip("-").split("-")[0]
    if dev.type & cl.device_type.CPU:
        if "Portable Computing Language" in dev.platform.name:
            return script, ""  # PoCL: the CPU tables
        return f"{script}-{vendor}-cpu", f" ({dev.platform.name.strip()}, CPU)"
    return f"{script}-{vendor}", f" ({dev.name.strip()})"


def write_section(section: str, heading: str, table: str) -> Path:
    """Replace (or append) ``section`` of RESULTS.md with ``heading`` and ``table``."""
    begin, end = f"<!-- {section}:begin -->", f"<!-- {section}:end -->"
    body = f"{begin}\n## {heading}\n{table}{end}"
    text = RESULTS.read_text() if RESULTS.exists() else "# svmkit benchmark results\n"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    RESULTS.write_text(text)
    return RESULTS
