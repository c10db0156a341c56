"""``svmkit info``: real devices listed, nothing made up, broken devices reported."""

from __future__ import annotations

import json
import subprocess
import sys

import pyopencl as cl
import pytest

import svmkit as sk
from svmkit.cli import main


def test_info_table_lists_every_device_with_its_svm(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for platform in cl.get_platforms():
        assert platform.name.strip() in out
        for device in platform.get_devices():
            assert device.name.strip() in out
    caps = sk.capabilities(cl.get_platforms()[0].get_devices()[0])
    assert str(sk.Policy.best(caps)) in out


def test_info_json_matches_capabilities(capsys):
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    platforms = cl.get_platforms()
    assert [p["name"] for p in report["platforms"]] == [p.name.strip() for p in platforms]
    for pentry, platform in zip(report["platforms"], platforms):
        devices = platform.get_devices()
        assert len(pentry["devices"]) == len(devices)
        for dentry, device in zip(pentry["devices"], devices):
            caps = sk.capabilities(device)
            assert dentry["coarse_grain_buffer"] == caps.coarse_grain_buffer
            assert dentry["fine_grain_buffer"] == caps.fine_grain_buffer
            assert dentry["fine_grain_system"] == caps.fine_grain_system
            assert dentry["atomics"] == caps.atomics
            assert dentry["atomic_scope_all_devices"] == caps.atomic_scope_all_devices
            assert dentry["max_alloc_bytes"] == device.max_mem_alloc_size
            assert dentry["max_alignment"] == caps.max_alignment
            assert dentry["policy"] == str(sk.Policy.best(caps))
            assert dentry["compiler_error"] == sys.modules["svmkit.capabilities"].compiler_failure(
                device
            )


def test_info_names_a_device_whose_compiler_fails(capsys, monkeypatch):
    failing = "error: unknown target CPU 'generic'"
    monkeypatch.setattr(sys.modules["svmkit.cli.info"], "compiler_failure", lambda d: failing)
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(d["compiler_error"] == failing for p in report["platforms"] for d in p["devices"])
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"the compiler fails ({failing}); sk.create_context() passes over this device" in out
    assert " fails " in out


def test_a_device_that_errors_is_reported_not_fatal(capsys, monkeypatch):
    def broken(device):
        raise cl.LogicError("clGetDeviceInfo failed: simulated")

    monkeypatch.setattr(sys.modules["svmkit.cli.info"], "capabilities", broken)
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    entry = report["platforms"][0]["devices"][0]
    assert "simulated" in entry["error"] and "coarse_grain_buffer" not in entry
    assert main(["info"]) == 0
    assert "error: LogicError" in capsys.readouterr().out


def test_console_script_runs_as_a_program():
    result = subprocess.run(
        [sys.executable, "-m", "svmkit.cli", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "coarse" in result.stdout


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as info:
        main(["nonsense"])
    assert info.value.code == 2
