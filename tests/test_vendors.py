"""Wheel-installed OpenCL drivers: the vendors directory svmkit points the ICD loader at."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from _helpers import assert_quiet_exit, run_python

from svmkit.driver import icd_vendors


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)
    monkeypatch.delenv("SVMKIT_WHEEL_DRIVERS", raising=False)
    prefix = tmp_path / "venv"
    (prefix / "lib").mkdir(parents=True)
    system = tmp_path / "etc-vendors"
    system.mkdir()
    (system / "nvidia.icd").write_text("/usr/lib/libnvidia-opencl.so.1\n")
    (system / "README").write_text("not an ICD file\n")
    return {"prefix": prefix, "system": system, "scratch": tmp_path / "scratch"}


def _register(env: dict[str, Path]) -> Path | None:
    return icd_vendors.register_wheel_drivers(
        prefix=env["prefix"], system_vendors=env["system"], scratch=env["scratch"]
    )


def test_wheel_driver_joins_the_system_drivers(env):
    driver = env["prefix"] / "lib" / "libintelocl.so"
    driver.write_bytes(b"")
    target = _register(env)
    assert target is not None and os.environ["OCL_ICD_VENDORS"] == str(target)
    files = {p.name: p.read_text() for p in target.iterdir()}
    assert files == {
        "nvidia.icd": "/usr/lib/libnvidia-opencl.so.1\n",
        "svmkit-wheel-libintelocl.icd": f"{driver}\n",
    }
    assert [p.name for p in env["scratch"].iterdir()] == [target.name]  # no staging left


def test_the_same_drivers_share_one_directory_and_new_ones_get_another(env, monkeypatch):
    (env["prefix"] / "lib" / "libintelocl.so").write_bytes(b"")
    first = _register(env)
    monkeypatch.delenv("OCL_ICD_VENDORS")
    assert _register(env) == first
    monkeypatch.delenv("OCL_ICD_VENDORS")
    (env["system"] / "pocl.icd").write_text("libpocl.so.2\n")
    second = _register(env)
    assert second is not None and second != first
    assert (second / "pocl.icd").read_text() == "libpocl.so.2\n"


def test_nothing_changes_without_a_wheel_driver(env):
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert not env["scratch"].exists()


def test_the_users_choice_wins(env, monkeypatch):
    (env["prefix"] / "lib" / "libintelocl.so").write_bytes(b"")
    monkeypatch.setenv("OCL_ICD_VENDORS", "/opt/my-vendors")
    assert _register(env) is None
    assert os.environ["OCL_ICD_VENDORS"] == "/opt/my-vendors"
    monkeypatch.delenv("OCL_ICD_VENDORS")
    monkeypatch.setenv("SVMKIT_WHEEL_DRIVERS", "0")
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ


def test_an_unwritable_scratch_directory_changes_nothing(env, caplog):
    (env["prefix"] / "lib" / "libintelocl.so").write_bytes(b"")
    env["scratch"].write_text("a file where the directory should be")
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert "cannot register wheel OpenCL drivers" in caplog.text


# -- where the vendors directory lives, and what svmkit refuses to trust -------------------

EVIL_LIBRARY = "/home/mallory/libevil.so"


def _expected_name(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp: Path) -> str:
    """The name of the vendors directory for ``env``'s drivers (built once elsewhere)."""
    target = icd_vendors.register_wheel_drivers(
        prefix=env["prefix"], system_vendors=env["system"], scratch=tmp / "reference"
    )
    assert target is not None
    monkeypatch.delenv("OCL_ICD_VENDORS")
    return target.name


def _plant(directory: Path) -> Path:
    """A vendors directory as another user would prepare it: an .icd naming their library."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "svmkit-wheel-libintelocl.icd").write_text(f"{EVIL_LIBRARY}\n")
    (directory / "zz-evil.icd").write_text(f"{EVIL_LIBRARY}\n")
    return directory


def _assert_nothing_planted_is_registered() -> None:
    vendors = os.environ.get("OCL_ICD_VENDORS")
    if vendors is None:
        return
    texts = [p.read_text() for p in Path(vendors).iterdir()]
    assert texts and not any(EVIL_LIBRARY in t for t in texts)
    assert not Path(vendors).is_symlink()


@pytest.fixture
def driver(env: dict[str, Path]) -> Path:
    path = env["prefix"] / "lib" / "libintelocl.so"
    path.write_bytes(b"")
    return path


def test_the_vendors_directory_is_private(env, driver):
    target = _register(env)
    assert target is not None
    for path in (env["scratch"], target):
        st = os.lstat(path)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_a_world_writable_directory_is_not_used(env, driver, monkeypatch, tmp_path, caplog):
    name = _expected_name(env, monkeypatch, tmp_path)
    _plant(env["scratch"] / name)
    env["scratch"].chmod(0o777)  # as another user could have created it
    (env["scratch"] / name).chmod(0o777)
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert f"{env['scratch']} is writable by group or others (mode 777)" in caplog.text
    assert (env["scratch"] / name / "zz-evil.icd").is_file()  # left alone, not used


def test_a_directory_of_another_user_is_not_used(env, driver, monkeypatch, tmp_path, caplog):
    name = _expected_name(env, monkeypatch, tmp_path)
    _plant(env["scratch"] / name)
    env["scratch"].chmod(0o700)
    uid = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: uid + 4242)  # it is not ours now
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert f"is owned by uid {uid}" in caplog.text


def test_a_symbolic_link_is_not_followed(env, driver, monkeypatch, tmp_path, caplog):
    name = _expected_name(env, monkeypatch, tmp_path)
    elsewhere = _plant(tmp_path / "elsewhere" / name).parent
    elsewhere.chmod(0o700)
    env["scratch"].symlink_to(elsewhere, target_is_directory=True)
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert f"{env['scratch']} is a symbolic link" in caplog.text


def test_a_directory_below_a_world_writable_one_is_not_used(env, driver, tmp_path, caplog):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # anyone could rename our directory away and put theirs there
    env["scratch"] = open_dir / "scratch"
    assert _register(env) is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert f"{open_dir} is writable by group or others (mode 777)" in caplog.text


def test_a_sticky_world_writable_parent_is_fine(env, driver, tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: others cannot rename or remove what we put there
    env["scratch"] = sticky / "scratch"
    target = _register(env)
    assert target is not None and target.parent == env["scratch"]
    assert os.environ["OCL_ICD_VENDORS"] == str(target)


def _fake_owner(monkeypatch: pytest.MonkeyPatch, victim: Path, uid: int) -> None:
    """``os.lstat`` reports the directory now at ``victim`` as owned by ``uid``."""
    real_lstat = os.lstat
    inode = (real_lstat(victim).st_dev, real_lstat(victim).st_ino)

    def lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        st = real_lstat(path, *args, **kwargs)
        if (st.st_dev, st.st_ino) != inode:
            return st
        fields = list(st[:10])
        fields[4] = uid
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", lstat)


@pytest.mark.parametrize("planted", ["extra file", "symbolic link", "other owner", "group write"])
def test_a_planted_vendors_directory_is_rebuilt(env, driver, monkeypatch, tmp_path, planted):
    name = _expected_name(env, monkeypatch, tmp_path)
    env["scratch"].mkdir(mode=0o700)
    target = env["scratch"] / name
    if planted == "symbolic link":
        evil = _plant(tmp_path / "evil")
        target.symlink_to(evil, target_is_directory=True)
    else:
        _plant(target)
        target.chmod(0o770 if planted == "group write" else 0o700)
        if planted == "other owner":
            _fake_owner(monkeypatch, target, os.getuid() + 4242)
    assert _register(env) == target
    _assert_nothing_planted_is_registered()
    assert not target.is_symlink()
    assert {p.name: p.read_text() for p in target.iterdir()} == {
        "nvidia.icd": "/usr/lib/libnvidia-opencl.so.1\n",
        "svmkit-wheel-libintelocl.icd": f"{driver}\n",
    }
    assert [p.name for p in env["scratch"].iterdir()] == [name]  # nothing left aside
    if planted == "symbolic link":  # what the link pointed at is not touched
        assert (tmp_path / "evil" / "zz-evil.icd").read_text() == f"{EVIL_LIBRARY}\n"


def test_the_environment_is_the_first_choice(env, driver, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = icd_vendors.register_wheel_drivers(prefix=env["prefix"], system_vendors=env["system"])
    assert target is not None
    assert target.parent == env["prefix"] / "var" / "cache" / "svmkit"
    assert not (tmp_path / "cache").exists()


def test_an_environment_others_can_write_gives_way_to_the_users_cache(
    env, driver, monkeypatch, tmp_path
):
    env["prefix"].chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    target = icd_vendors.register_wheel_drivers(prefix=env["prefix"], system_vendors=env["system"])
    assert target is not None and target.parent == tmp_path / "cache" / "svmkit"
    assert stat.S_IMODE(os.lstat(target.parent).st_mode) == 0o700
    assert not (env["prefix"] / "var").exists()


def test_no_safe_place_registers_nothing(env, driver, monkeypatch, tmp_path, caplog):
    env["prefix"].chmod(0o777)
    cache = tmp_path / "cache"
    _plant(cache / "svmkit")
    (cache / "svmkit").chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    target = icd_vendors.register_wheel_drivers(prefix=env["prefix"], system_vendors=env["system"])
    assert target is None
    assert "OCL_ICD_VENDORS" not in os.environ
    assert "cannot register wheel OpenCL drivers" in caplog.text
    assert f"{env['prefix']} is writable by group or others" in caplog.text
    assert f"{cache / 'svmkit'} is writable by group or others" in caplog.text


def test_import_makes_the_installed_wheel_drivers_visible():
    # A fresh interpreter with no OCL_ICD_VENDORS: every wheel driver of this environment
    # is a platform once svmkit is imported (Intel's CPU runtime where `[cpu]` is installed).
    script = (
        "import svmkit, pyopencl as cl, os\n"
        "print(os.environ.get('OCL_ICD_VENDORS', ''))\n"
        "print('|'.join(p.name for p in cl.get_platforms()))\n"
    )
    proc = run_python(script, env={"OCL_ICD_VENDORS": None})
    assert_quiet_exit(proc)
    out = proc.stdout.splitlines()
    vendors, platforms = out[0], out[1].split("|")
    drivers = icd_vendors.wheel_driver_paths()
    assert bool(vendors) == bool(drivers)
    if vendors:  # in a place only this user can write
        assert Path(vendors).parent in icd_vendors.vendors_bases()
        assert icd_vendors.unsafe_reason(Path(vendors)) is None
    if any(p.name == "libintelocl.so" for p in drivers):
        assert "Intel(R) OpenCL" in platforms
