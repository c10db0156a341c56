"""OpenCL drivers installed as Python wheels, made visible to PyOpenCL's ICD loader.

An ICD loader finds drivers through ``*.icd`` files in a vendors directory
(``/etc/OpenCL/vendors``, or the directory named by ``OCL_ICD_VENDORS``).  A driver that
pip installs into an environment, such as Intel's CPU runtime (the ``intel-opencl-rt``
wheel, ``<prefix>/lib/libintelocl.so``), registers no such file, so PyOpenCL never sees
it.  :func:`register_wheel_drivers` builds a vendors directory holding the system's ICD
files plus one for each wheel driver present, and points ``OCL_ICD_VENDORS`` at it.  The
loader PyOpenCL's wheel carries also reads its own directory (where the bundled PoCL is
registered), so every driver stays visible.

The loader loads whatever library an ``.icd`` file names, so the vendors directory is
code that every process importing svmkit runs.  It is kept where only the user can
write: ``<prefix>/var/cache/svmkit`` when the environment belongs to the user, else the
user's cache directory (``$XDG_CACHE_HOME/svmkit`` or ``~/.cache/svmkit``).  A directory
is trusted only when it, and every directory above it, passes :func:`unsafe_reason`;
svmkit creates its directories with mode 0700 and (re)builds a vendors directory's
content in a private staging directory that it renames into place.  Where no safe place
exists, svmkit logs a warning and registers nothing.

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
import stat
import sys
import tempfile
from pathlib import Path

__all__ = [
    "WHEEL_DRIVERS",
    "register_wheel_drivers",
    "unsafe_reason",
    "vendors_bases",
    "wheel_driver_paths",
]

log = logging.getLogger("svmkit")

#: ICD libraries that wheels install under ``<prefix>/lib``, with the wheel that does.
WHEEL_DRIVERS = {"libintelocl.so": "intel-opencl-rt"}

SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")

_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def wheel_driver_paths(prefix: str | os.PathLike[str] | None = None) -> list[Path]:
    """The wheel-installed ICD libraries present in the environment at ``prefix``."""
    lib = Path(sys.prefix if prefix is None else prefix) / "lib"
    return [lib / name for name in WHEEL_DRIVERS if (lib / name).is_file()]


def vendors_bases(prefix: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where svmkit may keep vendors directories, in order of preference.

    ``<prefix>/var/cache/svmkit`` (used only when the environment belongs to the user),
    then the user's cache directory: ``$XDG_CACHE_HOME/svmkit`` (an absolute path), else
    ``~/.cache/svmkit``.
    """
    bases = [Path(sys.prefix if prefix is None else prefix) / "var" / "cache" / "svmkit"]
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        bases.append(Path(xdg) / "svmkit")
    else:
        try:
            bases.append(Path.home() / ".cache" / "svmkit")
        except RuntimeError:  # no home directory
            pass
    return bases


def unsafe_reason(path: Path) -> str | None:
    """Why another local user could change what ``path`` holds, or ``None`` if none can.

    ``path`` must be a real directory (not a symbolic link), owned by the user and
    writable by no one else.  Every directory above it, along the path as written and
    along the path with links resolved, must be owned by the user or root and writable by
    no one else unless it is sticky (as ``/tmp`` is: others cannot rename or remove what
    the user put there).
    """
    uid = os.getuid()
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & _WRITABLE_BY_OTHERS:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return _unsafe_above(path, uid)


def _unsafe_above(path: Path, uid: int) -> str | None:
    """The first directory above ``path`` that others could change, as written or resolved."""
    absolute = Path(os.path.abspath(path))
    for chain in (absolute.parents, Path(os.path.realpath(absolute)).parents):
        for parent in chain:
            reason = _unsafe_parent(parent, uid)
            if reason is not None:
                return reason
    return None


def _unsafe_parent(parent: Path, uid: int) -> str | None:
    """Why another user could rename or replace what ``parent`` holds, or ``None``."""
    try:
        st = os.lstat(parent)
        if stat.S_ISLNK(st.st_mode):  # where it leads is checked along the resolved path
            return None
    except OSError as exc:
        return f"{parent}: {exc.strerror or exc}"
    if st.st_uid not in (uid, 0):
        return f"{parent} is owned by uid {st.st_uid}, neither this user nor root"
    if st.st_mode & _WRITABLE_BY_OTHERS and not st.st_mode & stat.S_ISVTX:
        return f"{parent} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _make_private(base: Path) -> str | None:
    """Create ``base`` (0700; missing parents 0755) if absent; why it is unsafe, or None."""
    missing: list[Path] = []
    for path in (base, *base.parents):
        if os.path.lexists(path):
            break
        missing.append(path)
    if missing:  # nothing is created below a directory that others could change
        existing = missing[-1].parent
        reason = _unsafe_parent(existing, os.getuid()) or _unsafe_above(existing, os.getuid())
        if reason is not None:
            return reason
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700 if path == base else 0o755)
        except FileExistsError:  # made meanwhile: checked below like any other
            pass
        except OSError as exc:
            return f"cannot create {path}: {exc.strerror or exc}"
    return unsafe_reason(base)


def _holds_exactly(target: Path, entries: dict[str, str]) -> bool:
    """``target`` is a safe directory of exactly ``entries``' files, as plain files."""
    if unsafe_reason(target) is not None:
        return False
    try:
        names = sorted(os.listdir(target))
        if names != sorted(entries):
            return False
        for name in names:
            st = os.lstat(target / name)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return False
            if (target / name).read_text() != entries[name]:
                return False
    except (OSError, UnicodeDecodeError):
        return False
    return True


def _install(base: Path, target: Path, entries: dict[str, str]) -> None:
    """Build ``entries`` in a private staging directory, then rename it to ``target``.

    Whatever ``target`` held that is not exactly ``entries`` is moved aside first.  Another
    process building the same directory at the same time is fine: the name is a digest of
    the content, so either's result is the right one.
    """
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=base))  # mode 0700
    aside: Path | None = None
    try:
        for name, text in entries.items():
            (staging / name).write_text(text)
        try:
            os.replace(staging, target)  # atomic; fails if target is a non-empty directory
        except OSError:
            if _holds_exactly(target, entries):  # another process won the race
                return
            aside = Path(tempfile.mkdtemp(prefix=".old-", dir=base))
            os.replace(target, aside / "old")
            os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)


def _vendors_entries(drivers: list[Path], system_vendors: Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    try:
        for icd in sorted(system_vendors.glob("*.icd")):
            entries[icd.name] = icd.read_text()
    except OSError as exc:  # an unreadable system directory: register the wheels alone
        log.debug("cannot read %s: %s", system_vendors, exc)
    for path in drivers:
        entries[f"svmkit-wheel-{path.stem}.icd"] = f"{path}\n"
    return entries


def register_wheel_drivers(
    *,
    prefix: str | os.PathLike[str] | None = None,
    system_vendors: Path = SYSTEM_VENDORS,
    scratch: str | os.PathLike[str] | None = None,
) -> Path | None:
    """Point ``OCL_ICD_VENDORS`` at a vendors directory that includes the wheel drivers.

    Returns the directory, or ``None`` when nothing was changed.  The directory is
    ``<base>/icd-<digest of its content>``, so processes of one environment share it and a
    change of drivers makes a new one; ``base`` is the first of :func:`vendors_bases`
    (or ``scratch`` alone, when given) that is safe or can be made so.  An existing
    directory is used only when :func:`unsafe_reason` finds nothing and it holds exactly
    the expected files; otherwise it is rebuilt.
    """
    if os.environ.get("OCL_ICD_VENDORS") or os.environ.get("SVMKIT_WHEEL_DRIVERS") == "0":
        return None
    drivers = wheel_driver_paths(prefix)
    if not drivers:
        return None
    if not hasattr(os, "getuid"):  # no POSIX ownership to check: the loader is another one
        log.debug("wheel OpenCL drivers %s not registered: no POSIX file ownership", drivers)
        return None
    entries = _vendors_entries(drivers, system_vendors)
    digest = hashlib.sha256(repr(sorted(entries.items())).encode()).hexdigest()[:16]
    bases = [Path(scratch)] if scratch is not None else vendors_bases(prefix)
    refused: list[str] = []
    for base in bases:
        reason = _make_private(base)
        if reason is not None:
            refused.append(reason)
            continue
        target = base / f"icd-{digest}"
        try:
            if not _holds_exactly(target, entries):
                _install(base, target, entries)
        except OSError as exc:
            refused.append(f"cannot write {target}: {exc.strerror or exc}")
            continue
        if not _holds_exactly(target, entries):
            refused.append(f"{target} does not hold what svmkit wrote")
            continue
        os.environ["OCL_ICD_VENDORS"] = str(target)
        log.debug("OCL_ICD_VENDORS=%s (wheel drivers: %s)", target, [str(p) for p in drivers])
        return target
    log.warning(
        "cannot register wheel OpenCL drivers %s: no directory only this user can write (%s)",
        [str(p) for p in drivers],
        "; ".join(refused),
    )
    return None
