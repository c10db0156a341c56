"""`svmkit demo workqueue`: verifies against NumPy, reports both measures, exits non-zero on
a mismatch, and turns bad options and interrupts into one line and an exit status."""

from __future__ import annotations

import json
import logging

import numpy as np
import pyopencl as cl
import pytest

from svmkit.cli import demo_workqueue as demo

SMALL = ["--items", "3000", "--latency-items", "40", "--rounds", "2", "--no-progress"]


def test_reference_matches_known_stopping_times() -> None:
    starts = np.array([1, 2, 3, 6, 7, 27, 97])
    np.testing.assert_array_equal(demo.collatz_reference(starts), [0, 1, 7, 8, 16, 111, 118])


def _summary(out: str) -> dict[str, object]:
    """The summary object, which is all that ``--json`` writes to stdout."""
    summary = json.loads(out)
    assert isinstance(summary, dict) and out.count("\n") == 1
    return summary


@pytest.mark.needs("fine", "atomics")
def test_queue_mode_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main([*SMALL, "--json"]) == 0
    captured = capsys.readouterr()
    text = captured.err  # with --json the text goes to stderr, stdout is the object alone
    assert "fine-grain work queues" in text and "verified: all 3040 results" in text
    assert "throughput (3000 items in batches of 16" in text and "M items/s" in text
    assert "latency (single items" in text and "µs" in text and text.count("why:") == 2
    summary = _summary(captured.out)
    assert set(summary) == {"device", "mode", "verified", "throughput", "latency_us"}
    assert summary["mode"] == "queue" and summary["verified"] is True
    throughput, latency = summary["throughput"], summary["latency_us"]
    assert isinstance(throughput, dict) and isinstance(latency, dict)
    assert set(throughput) == {"queue", "launches"}
    assert set(latency) == {"queue_p50", "launch_p50"}
    assert all(isinstance(v, float) and v > 0 for v in [*throughput.values(), *latency.values()])
    assert isinstance(summary["device"], str) and summary["device"] in text.splitlines()[0]


def test_batched_mode_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        demo.main(["--items", "2000", "--latency-items", "20", "--mode", "batched", "--json"]) == 0
    )
    captured = capsys.readouterr()
    assert "batched coarse-grain SVM" in captured.err
    assert "NumPy reference: 100%" in captured.err and "batched stream" not in captured.err
    summary = _summary(captured.out)
    assert summary["mode"] == "batched" and summary["verified"] is True


def test_without_json_the_text_goes_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--items", "200", "--latency-items", "4", "--mode", "batched", "--no-progress"]
    assert demo.main(argv) == 0
    captured = capsys.readouterr()
    assert "verified: all 204 results" in captured.out and captured.err == ""
    with pytest.raises(json.JSONDecodeError):
        json.loads(captured.out.strip().splitlines()[-1])


@pytest.mark.needs("fine", "atomics")
def test_one_item_prints_sensible_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--items", "1", "--latency-items", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "verified: all 2 results" in out and "median of 1 round(s)" in out
    assert "a stream this short times mostly start-up" in out
    assert "capacity / throughput" not in out


@pytest.mark.needs("fine", "atomics")
def test_mismatch_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = demo.collatz_reference
    monkeypatch.setattr(demo, "collatz_reference", lambda s: real(s) + (np.arange(len(s)) == 3))
    assert demo.main(SMALL) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "verified: all" not in out


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--items", "0"], "--items"),
        (["--capacity", "1000"], "--capacity"),
        (["--host-cores", "-1"], "--host-cores"),
        (["--batch", "x"], "--batch"),
        (["--local-size", "65"], "--local-size"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "Traceback" not in err


def test_interrupt_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "run", interrupted)
    assert demo.main([]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "svmkit demo workqueue: interrupted"


def test_driver_error_is_one_line_and_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import svmkit as sk

    def failing(*args: object) -> int:
        raise sk.UnsupportedError("no SVM device")

    monkeypatch.setattr(demo, "run", failing)
    assert demo.main([]) == 1
    assert capsys.readouterr().err.strip() == "svmkit demo workqueue: error: no SVM device"


# --- svmkit demo tasks ----------------------------------------------------------------------


@pytest.mark.needs("fine", "atomics")
def test_tasks_demo_verifies_and_reports_json(capsys: pytest.CaptureFixture[str]) -> None:
    from svmkit.cli import demo_tasks

    assert demo_tasks.main(["--counts", "700,960", "--rounds", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert "every element of every run matches NumPy" in captured.err
    summary = _summary(captured.out)
    assert summary["verified"] is True
    ms = summary["ms"]
    assert isinstance(ms, dict) and set(ms) == {"700 mixed", "700 light", "960 mixed", "960 light"}
    for per in ms.values():
        assert set(per) == {"queue", "launches+copies", "launches"}
        assert all(isinstance(v, float) and v > 0 for v in per.values())
    assert "| 700 (" in captured.err and "| 960 light |" in captured.err


@pytest.mark.needs("fine", "atomics")
def test_tasks_demo_reference_and_mismatch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The NumPy reference is the kernel's arithmetic, and a wrong element fails the run."""
    from svmkit.cli import demo_tasks

    tasks = demo_tasks.make_tasks(4, 0.0, 0)
    tasks["op"][1] = 1
    ref = demo_tasks.reference(tasks).reshape(4, 64)
    start = demo_tasks.initial_data(4).reshape(4, 64).astype(np.uint64)
    light = (start[0] * 1664525 + 1013904223) % 2**32
    np.testing.assert_array_equal(ref[0], light)
    heavy = start[1]
    for p in range(demo_tasks.HEAVY_PASSES):
        heavy = (heavy * 1664525 + 1013904223 + p) % 2**32
    np.testing.assert_array_equal(ref[1], heavy)
    real = demo_tasks.reference
    monkeypatch.setattr(demo_tasks, "reference", lambda t: real(t) + np.uint32(1))
    assert demo_tasks.main(["--counts", "320", "--rounds", "1"]) == 1
    assert "wrong elements" in capsys.readouterr().err


@pytest.mark.parametrize("demo_name", ["tasks", "workqueue"])
def test_intels_cpu_compiler_vectorizes_the_demos_kernels(
    caplog: pytest.LogCaptureFixture, demo_name: str
) -> None:
    """wq_group_pop and wq_group_push have no loop that one work-item runs alone with
    atomics in it, so Intel's CPU compiler vectorizes a work-group consumer across its
    work-items, its tasks included (with the leader's claim loop it compiled run_tasks
    without vectorizing it: 4.0 against 1.4 ms for 32,000 tasks)."""
    from svmkit.cli import demo_tasks
    from svmkit.programs import build_program

    intel = [p for p in cl.get_platforms() if p.name == "Intel(R) OpenCL"]
    if not intel:
        pytest.skip("Intel's CPU runtime (the [cpu] extra) is not installed")
    intel_ctx = cl.Context(devices=intel[0].get_devices()[:1])
    if demo_name == "tasks":
        source, defines, kernels = demo_tasks.program_source(64), {}, ["run_tasks", "run_batch"]
    else:
        source, defines = demo.program_source(), {"DEMO_BATCH": demo.GROUP_BATCH}
        kernels = ["collatz_group", "collatz_launch"]
    with caplog.at_level(logging.DEBUG, logger="svmkit"):
        build_program(intel_ctx, source, defines=defines, cache=False)
    for name in kernels:
        assert f'Kernel "{name}" was successfully vectorized' in caplog.text


def test_tasks_demo_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    from svmkit.cli import demo_tasks

    assert demo_tasks.main(["--counts", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
    assert demo_tasks.main(["--rounds", "x"]) == 2
    assert "argument --rounds" in capsys.readouterr().err
