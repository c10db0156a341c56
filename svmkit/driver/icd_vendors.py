"""OpenCL drivers installed as Python wheels, made visible to PyOpenCL's ICD loader.

An ICD loader finds drivers through ``*.icd`` files in a vendors directory
(``/etc/OpenCL/vendors``, or the directory named by ``OCL_ICD_VENDORS``).  A driver that
pip installs into an environment, such as Intel's CPU runtime (the ``intel-opencl-rt``
wheel, ``<prefix>/lib/libintelocl.so``), registers no such file, so PyOpenCL never sees
it.  :func:`register_wheel_drivers` builds a vendors directory holding the system's ICD
files plus one for each wheel driver present, and points ``OCL_ICD_VENDORS`` at it.  The
loader PyOpenCL's wheel carries also reads its own directory (where the bundled PoCL is
registered), so every driver stays visible.

The loader reads the variable once, at the first OpenCL call of the process; svmkit calls
this when it is imported, before it makes any.  Nothing is changed when
``OCL_ICD_VENDORS`` is already set (the user's choice wins), when
``SVMKIT_WHEEL_DRIVERS=0``, or when no wheel driver is installed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["WHEEL_DRIVERS", "register_wheel_drivers", "wheel_driver_paths"]

log = logging.getLogger("svmkit")

#: ICD libraries that wheels install under ``<prefix>/lib``, with the wheel that does.
WHEEL_DRIVERS = {"libintelocl.so": "intel-opencl-rt"}

SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")


def wheel_driver_paths(prefix: str | os.PathLike[str] | None = None) -> list[Path]:
    """The wheel-installed ICD libraries present in the environment at ``prefix``."""
    lib = Path(sys.prefix if prefix is None else prefix) / "lib"
    return [lib / name for name in WHEEL_DRIVERS if (lib / name).is_file()]


def register_wheel_drivers(
    *,
    prefix: str | os.PathLike[str] | None = None,
    system_vendors: Path = SYSTEM_VENDORS,
    scratch: str | os.PathLike[str] | None = None,
) -> Path | None:
    """Point ``OCL_ICD_VENDORS`` at a vendors directory that includes the wheel drivers.

    Returns the directory, or ``None`` when nothing was changed.  The directory's name is
    a digest of its contents, under ``scratch`` (default: the temporary directory), so
    processes of one environment share it and a change of drivers makes a new one.
    """
    if os.environ.get("OCL_ICD_VENDORS") or os.environ.get("SVMKIT_WHEEL_DRIVERS") == "0":
        return None
    drivers = wheel_driver_paths(prefix)
    if not drivers:
        return None
    entries: dict[str, str] = {}
    try:
        for icd in sorted(system_vendors.glob("*.icd")):
            entries[icd.name] = icd.read_text()
    except OSError as exc:  # an unreadable system directory: register the wheels alone
        log.debug("cannot read %s: %s", system_vendors, exc)
    for path in drivers:
        entries[f"svmkit-wheel-{path.stem}.icd"] = f"{path}\n"
    digest = hashlib.sha256(repr(sorted(entries.items())).encode()).hexdigest()[:16]
    base = Path(scratch if scratch is not None else tempfile.gettempdir())
    target = base / f"svmkit-icd-{os.getuid() if hasattr(os, 'getuid') else 0}-{digest}"
    if not target.is_dir():
        try:
            _write_atomically(base, target, entries)
        except OSError as exc:
            log.warning("cannot register wheel OpenCL drivers %s: %s", drivers, exc)
            return None
    os.environ["OCL_ICD_VENDORS"] = str(target)
    log.debug("OCL_ICD_VENDORS=%s (wheel drivers: %s)", target, [str(p) for p in drivers])
    return target


def _write_atomically(base: Path, target: Path, entries: dict[str, str]) -> None:
    """Write ``entries`` into a fresh directory, then rename it to ``target``."""
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".svmkit-icd-", dir=base))
    try:
        for name, text in entries.items():
            (staging / name).write_text(text)
        os.replace(staging, target)
    except OSError:
        if not target.is_dir():  # lost no race: a real failure
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
