"""``svmkit info``: real devices listed, nothing made up, broken devices reported."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from _helpers import CHILD_CWD, assert_quiet_exit, run_python

import svmkit as sk
import svmkit.cli.info as info_module
from svmkit.cli import main

cli_main = importlib.import_module("svmkit.cli.main")  # the module: svmkit.cli.main is main()


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
    monkeypatch.setattr(info_module, "compiler_failure", lambda d: failing)
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

    monkeypatch.setattr(info_module, "capabilities", broken)
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    entry = report["platforms"][0]["devices"][0]
    assert "simulated" in entry["error"] and "coarse_grain_buffer" not in entry
    assert main(["info"]) == 0
    assert "error: LogicError" in capsys.readouterr().out


def test_console_script_runs_as_a_program():
    result = subprocess.run(
        [sys.executable, "-m", "svmkit.cli", "info"],
        cwd=CHILD_CWD,
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


# -- what a user sees: one line, never a traceback --------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _svmkit(*args: str, env: dict[str, str | None] | None = None, **kw: Any) -> Any:
    """``svmkit ARGS`` as a user runs it: a fresh interpreter, the console script's code."""
    return run_python(args=["-m", "svmkit.cli", *args], env=env, **kw)


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_version():
    proc = _svmkit("--version")
    assert_quiet_exit(proc)
    assert proc.stdout == f"svmkit {sk.__version__}\n"


@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["demo", "workqueue"]])
def test_a_bad_pyopencl_ctx_is_one_line_listing_what_exists(command):
    proc = _svmkit(*command, env={"PYOPENCL_CTX": "no-such-platform-anywhere"})
    assert_quiet_exit(proc, 1)
    line = _one_line(proc.stderr)
    assert line.startswith(f"svmkit {command[0]}: PYOPENCL_CTX='no-such-platform-anywhere'")
    for index, platform in enumerate(cl.get_platforms()):
        assert f"platform {index}: {platform.name.strip()} [" in line
        for d_index, device in enumerate(platform.get_devices()):
            assert f"{d_index}: {device.name.strip()}" in line


@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["demo", "workqueue"]])
def test_no_platform_is_one_line_and_exit_1(command, tmp_path):
    # A vendors path that does not exist: the ICD loader lists no platform at all (an
    # empty directory would still leave the PoCL that PyOpenCL's wheel registers itself).
    vendors = str(tmp_path / "no-vendors")
    proc = _svmkit(*command, env={"OCL_ICD_VENDORS": vendors, "PYOPENCL_CTX": None})
    assert_quiet_exit(proc, 1)
    line = _one_line(proc.stderr)
    assert line.startswith(f"svmkit {command[0]}: no OpenCL platform found")
    assert vendors in line
    if "--json" in command:  # the report still goes to stdout, saying there is nothing
        assert json.loads(proc.stdout)["platforms"] == []


def test_an_empty_vendors_directory_lists_what_the_loader_still_finds(tmp_path):
    (tmp_path / "vendors").mkdir()
    env: dict[str, str | None] = {
        "OCL_ICD_VENDORS": str(tmp_path / "vendors"),
        "PYOPENCL_CTX": None,
    }
    seen = run_python("import pyopencl as cl; print(len(cl.get_platforms()))", env=env)
    proc = _svmkit("info", "--json", env=env)
    if seen.returncode != 0:  # no platform at all
        assert_quiet_exit(proc, 1)
        assert _one_line(proc.stderr).startswith("svmkit info: no OpenCL platform found")
    else:
        assert_quiet_exit(proc)
        assert len(json.loads(proc.stdout)["platforms"]) == int(seen.stdout)


@pytest.mark.needs("atomics")
def test_ctrl_c_in_a_running_demo_is_one_line_and_exit_130(ctx):
    # The demo's work-queue phase: host threads push one item at a time while the kernel
    # consumes; SIGINT arrives once the first progress line says the queue is running.
    argv = [sys.executable, "-m", "svmkit.cli", "demo", "workqueue", "--items", "4000000"]
    argv += ["--producers", "1", "--batch", "1", "--rounds", "8"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", POCL_DEVICES="pthread pthread")
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=CHILD_CWD
    ) as proc:
        assert proc.stderr is not None
        before: list[
            str
        ] = []  # what precedes the progress bar (warnings about passed-over devices)
        while "queue stream:" not in (line := proc.stderr.readline()):
            assert line, f"the demo ended before its queue ran: {''.join(before)}"
            before.append(line)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == "svmkit demo workqueue: interrupted"
    assert "Traceback" not in err and "Exception ignored" not in err
    assert "verified" not in out  # it stopped rather than ran to the end


def _fake_demo(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> str:
    """A demo named ``fake`` whose ``main`` raises ``error``."""
    module = types.ModuleType("svmkit_test_fake_demo")

    def fake_main(argv: list[str]) -> int:
        raise error

    module.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli_main.DEMOS, "fake", module.__name__)
    return "fake"


def test_a_simulated_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    name = _fake_demo(monkeypatch, KeyboardInterrupt())
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert main(["demo", name]) == cli_main.EXIT_INTERRUPTED == 130
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL  # a second Ctrl-C ends it
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().err == "svmkit demo: interrupted\n"


def test_an_svmkit_error_is_one_line_and_exit_1(monkeypatch, capsys):
    error = sk.UnsupportedError("Policy(FINE) cannot be used in this context: no fine SVM")
    name = _fake_demo(monkeypatch, error)
    assert main(["demo", name]) == 1
    assert capsys.readouterr().err == f"svmkit demo: {error}\n"


def test_any_other_error_is_one_line_with_its_type_and_traceback_shows_it(monkeypatch, capsys):
    name = _fake_demo(monkeypatch, cl.LogicError("clEnqueueNDRangeKernel failed:\nsimulated"))
    assert main(["demo", name]) == 1
    assert capsys.readouterr().err == (
        "svmkit demo: LogicError: clEnqueueNDRangeKernel failed: simulated\n"
    )
    with pytest.raises(cl.LogicError):
        main(["--traceback", "demo", name])


def test_a_demo_that_is_not_installed_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setitem(cli_main.DEMOS, "absent", "svmkit.no_such_package.demo_cli")
    assert main(["demo", "absent"]) == 2
    assert capsys.readouterr().err == (
        "svmkit demo: demo 'absent' is not part of this installation "
        "(svmkit.no_such_package.demo_cli is missing)\n"
    )


def test_demos_are_a_table_of_modules_with_main():
    assert cli_main.DEMOS["workqueue"] == "svmkit.cli.demo_workqueue"
    assert cli_main.DEMOS["dask"] == "svmkit.dask.demo"
    for name in ("workqueue", "dask"):
        demo = importlib.import_module(cli_main.DEMOS[name])
        assert callable(demo.main)


def test_demo_dask_bad_option_is_a_usage_error_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "dask", "--chunks", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--chunks" in err and "Traceback" not in err


def test_demo_dask_without_dask_says_which_extra(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    for module in [m for m in sys.modules if m.startswith("svmkit.dask")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(builtins, "__import__", no_dask)
    assert main(["demo", "dask"]) == 1
    assert capsys.readouterr().err == (
        "svmkit demo: demo 'dask' needs Dask: pip install 'svmkit[dask]'\n"
    )


@pytest.mark.parametrize("argv", [[], ["info"], ["demo"], ["bench"]])
def test_help_is_plain_text(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: svmkit")
    for markup in ("``", ":func:", ":class:", ":mod:", ":meth:", ":data:"):
        assert markup not in text, text
    if not argv:
        assert "svmkit info" in text and "--version" in text


def test_info_marks_the_device_create_context_picks(capsys):
    chosen = sk.create_context().devices[0]
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    marked = [
        (p, d)
        for p, platform in enumerate(report["platforms"])
        for d, device in enumerate(platform["devices"])
        if device["selected"]
    ]
    assert marked == [(report["selected"]["platform"], report["selected"]["device"])]
    p, d = marked[0]
    device = cl.get_platforms()[p].get_devices()[d]
    assert device.int_ptr == chosen.int_ptr
    assert main(["info"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  *")]
    assert rows == [rows[0]] and rows[0].startswith(f"  *{d}: {chosen.name.strip()}")


def test_info_json_names_the_versions(capsys):
    assert main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["versions"]["svmkit"] == sk.__version__
    assert report["versions"]["pyopencl"] == cl.VERSION_TEXT
    assert report["versions"]["numpy"] == np.__version__
    for pentry, platform in zip(report["platforms"], cl.get_platforms()):
        drivers = {d.driver_version.strip() for d in platform.get_devices()}
        assert pentry["driver_version"] == ", ".join(sorted(drivers))
        for dentry, device in zip(pentry["devices"], platform.get_devices()):
            assert dentry["driver_version"] == device.driver_version.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the benchmark scripts and RESULTS.md, as a source checkout holds them."""
    (tmp_path / "benchmarks").mkdir()
    for path in (REPO / "benchmarks").iterdir():
        if path.suffix in (".py", ".md"):
            shutil.copy(path, tmp_path / "benchmarks" / path.name)
    return tmp_path


def test_bench_passes_options_through_and_writes_only_with_write(checkout):
    results = checkout / "benchmarks" / "RESULTS.md"
    before = results.read_bytes()
    quick = ["bench", "ops", "--quick"]
    proc = run_python(args=["-m", "svmkit.cli", *quick], cwd=checkout)
    assert_quiet_exit(proc)
    assert "| " in proc.stdout  # the script's table, printed
    assert results.read_bytes() == before
    proc = run_python(
        args=["-m", "svmkit.cli", *quick, "--write", "--section", "cli-check"], cwd=checkout
    )
    assert_quiet_exit(proc)
    text = results.read_text()
    assert text.startswith(before.decode()) and "<!-- cli-check:begin -->" in text
    assert sorted(p.name for p in (checkout / "benchmarks").glob("*.png")) == []


def test_bench_outside_a_checkout_is_a_usage_error(tmp_path):
    proc = run_python(args=["-m", "svmkit.cli", "bench", "ops"], cwd=tmp_path)
    assert_quiet_exit(proc, 2)
    assert _one_line(proc.stderr) == (
        f"svmkit bench: {tmp_path / 'benchmarks' / 'ops.py'} not found (run from a source checkout)"
    )


def test_info_names_the_backend_of_each_hot_path(monkeypatch):
    from svmkit.cli.info import collect, render_table
    from svmkit.workqueue import ring

    report = collect()
    expected = "C" if "native" in ring.available_backends() else "Python"
    assert report["backends"]["ring"] == expected
    assert report["backends"]["pools"] == "C (svmkit.resources._cpool)"
    assert "pools C (svmkit.resources._cpool)" in render_table(report)
    assert f"ring {expected}" in render_table(report)
    monkeypatch.setenv("SVMKIT_HOSTATOMICS", "python")  # forced: what the queues then use
    assert collect()["backends"]["ring"] == "Python"


def test_info_marks_no_device_when_pyopencl_ctx_names_one_whose_compiler_fails(capsys, monkeypatch):
    capmod = sys.modules["svmkit.capabilities"]
    device = cl.get_platforms()[0].get_devices()[0]
    failing = "error: unknown target CPU 'generic'"
    fake = lambda d: failing if d == device else None  # noqa: E731
    monkeypatch.setattr(capmod, "compiler_failure", fake)
    monkeypatch.setattr(info_module, "compiler_failure", fake)
    monkeypatch.setenv("PYOPENCL_CTX", "0:0")
    report = info_module.collect()
    assert report["selected"] is None
    assert not any(d["selected"] for p in report["platforms"] for d in p["devices"])
    assert f"compiler fails ({failing})" in report["selection_error"]
    assert main(["info"]) == 1  # the table, then the one line saying why
    captured = capsys.readouterr()
    assert not [line for line in captured.out.splitlines() if line.startswith("  *")]
    assert "sk.create_context() picks no device: UnsupportedError: PYOPENCL_CTX='0:0'" in (
        captured.out
    )
    assert _one_line(captured.err).startswith("svmkit info: PYOPENCL_CTX='0:0' selects ")


# -- --json, lists of subcommands, Ctrl-C on Dask ---------------------------------------------


def test_demo_workqueue_json_writes_only_the_object_to_stdout():
    proc = _svmkit("demo", "workqueue", "--json", "--items", "2000", "--latency-items", "20")
    assert_quiet_exit(proc)
    summary = json.loads(proc.stdout)  # the whole of stdout: `| python -m json.tool` works
    assert proc.stdout.count("\n") == 1 and summary["verified"] is True
    assert "verified: all 2020 results" in proc.stderr  # the text went to stderr
    tool = subprocess.run(
        [sys.executable, "-m", "json.tool"],
        input=proc.stdout,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert tool.returncode == 0 and json.loads(tool.stdout) == summary


def test_info_json_writes_only_the_report_to_stdout():
    proc = _svmkit("info", "--json")
    assert_quiet_exit(proc)
    assert set(json.loads(proc.stdout)) >= {"versions", "backends", "platforms", "selected"}


@pytest.mark.parametrize(
    ("command", "names"),
    [("demo", sorted(cli_main.DEMOS)), ("bench", list(cli_main.BENCHMARKS))],
)
def test_demo_and_bench_alone_list_what_they_run(command, names, capsys):
    summaries = cli_main.DEMO_SUMMARIES if command == "demo" else cli_main.BENCHMARK_SUMMARIES
    assert set(summaries) == set(names)
    assert main([command]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "required" not in captured.out
    assert captured.out.startswith(f"usage: svmkit {command} NAME")
    for name in names:
        assert f"\n  {name} " in captured.out


def test_ctrl_c_in_demo_dask_is_one_line_and_exit_130():
    pytest.importorskip("distributed")
    # A terminal's Ctrl-C reaches the whole foreground process group, worker processes
    # included: the demo runs in a group of its own and the signal goes to all of it.
    argv = [sys.executable, "-m", "svmkit.cli", "demo", "dask", "--mb", "128", "--chunks", "128"]
    with tempfile.TemporaryDirectory() as scratch:  # Dask's scratch space, removed after
        env = dict(os.environ, PYTHONUNBUFFERED="1", DASK_TEMPORARY_DIRECTORY=scratch)
        env.setdefault("POCL_DEVICES", "pthread pthread")
        with subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=CHILD_CWD,
            start_new_session=True,
        ) as proc:
            assert proc.stdout is not None
            seen: list[str] = []
            while "kernel:" not in (line := proc.stdout.readline()):  # progress: chunks done
                assert line, f"the demo ended before its kernels ran: {''.join(seen)}"
                seen.append(line)
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines() == ["svmkit demo: interrupted"], err
    assert "Traceback" not in err
    assert "check against NumPy" not in out  # it stopped rather than ran to the end
