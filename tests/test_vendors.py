"""Wheel-installed OpenCL drivers: the vendors directory svmkit points the ICD loader at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_import_makes_the_installed_wheel_drivers_visible():
    # A fresh interpreter with no OCL_ICD_VENDORS: every wheel driver of this environment
    # is a platform once svmkit is imported (Intel's CPU runtime where `[cpu]` is installed).
    env = {k: v for k, v in os.environ.items() if k != "OCL_ICD_VENDORS"}
    script = (
        "import svmkit, pyopencl as cl, os\n"
        "print(os.environ.get('OCL_ICD_VENDORS', ''))\n"
        "print('|'.join(p.name for p in cl.get_platforms()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    vendors, platforms = out[0], out[1].split("|")
    drivers = icd_vendors.wheel_driver_paths()
    assert bool(vendors) == bool(drivers)
    if any(p.name == "libintelocl.so" for p in drivers):
        assert "Intel(R) OpenCL" in platforms
