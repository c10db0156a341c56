"""`svmkit demo workqueue`: verifies against NumPy, exits non-zero on a mismatch."""

from __future__ import annotations

import numpy as np
import pytest

from svmkit.cli import demo_workqueue as demo


def test_reference_matches_known_stopping_times() -> None:
    starts = np.array([1, 2, 3, 6, 7, 27, 97])
    np.testing.assert_array_equal(demo.collatz_reference(starts), [0, 1, 7, 8, 16, 111, 118])


@pytest.mark.needs("fine", "atomics")
def test_queue_mode_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--items", "20000", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "fine-grain work queue" in out and "verified: all 20000 results" in out
    assert "push->pop latency: p50" in out and "static per-batch launches" in out


def test_batched_mode_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--items", "5000", "--mode", "batched"]) == 0
    captured = capsys.readouterr()
    assert "batched coarse-grain SVM" in captured.out
    assert "progress" in captured.err


@pytest.mark.needs("fine", "atomics")
def test_mismatch_exits_non_zero(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = demo.collatz_reference
    monkeypatch.setattr(demo, "collatz_reference", lambda s: real(s) + (np.arange(len(s)) == 3))
    assert demo.main(["--items", "2000", "--no-progress"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_bad_options_exit_2() -> None:
    assert demo.main(["--items", "0"]) == 2
