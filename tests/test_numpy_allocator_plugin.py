"""The pytest plugin ``tests/numpy_allocator_plugin.py``: a session under the NumPy allocator.

A child pytest loads the plugin and runs a probe module (every array, in the main thread
and in threads the tests start, is svmkit's; a test that leaves another handler set does
not leak it into the next) together with a handful of NumPy's own core tests that exercise
every function of the handler (calloc, realloc in place and without the GIL, free of
views' owners, pickling, threads).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from _helpers import run_python

TESTS = Path(__file__).resolve().parent
NUMPY_CORE_TESTS = Path(np.__file__).resolve().parent / "_core" / "tests"

# NumPy's tests that go through calloc (np.zeros), realloc (resize, text-mode fromfile and
# fromstring, which reallocate without the GIL), and many arrays made and freed.
NUMPY_SELECTION = [
    "test_multiarray.py::TestResize",
    "test_multiarray.py::TestIO",
    "test_multiarray.py::TestFromBuffer",
    "test_multiarray.py::TestPickling",
    "test_multiarray.py::TestCreation",
    "test_numeric.py::TestCreationFuncs",
]

PROBE = """
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numpy._core.multiarray import get_handler_name

from svmkit.arrays.numpy_owned import allocation_of
from svmkit.resources import _cpool


def made_by_svmkit():
    a = np.arange(1000.0)
    return get_handler_name(), get_handler_name(a), allocation_of(a) is not None


def test_main_thread():
    assert made_by_svmkit() == ("svmkit", "svmkit", True)


def test_started_thread():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(made_by_svmkit()))
    thread.start()
    thread.join()
    assert seen == [("svmkit", "svmkit", True)]


def test_thread_subclass():
    class Worker(threading.Thread):
        def run(self):
            self.seen = made_by_svmkit()

    worker = Worker()
    worker.start()
    worker.join()
    assert worker.seen == ("svmkit", "svmkit", True)


def test_thread_pool():
    with ThreadPoolExecutor(3) as pool:
        seen = list(pool.map(lambda _: made_by_svmkit(), range(6)))
    assert seen == [("svmkit", "svmkit", True)] * 6


def test_leaves_the_default_handler_set():
    _cpool.set_numpy_handler(None)
    assert get_handler_name() == "default_allocator"


def test_next_test_is_under_svmkit_again():
    assert made_by_svmkit() == ("svmkit", "svmkit", True)
"""


def run_session(
    tmp_path: Path, *selection: str, plugin: Sequence[str] = ("-p", "numpy_allocator_plugin")
) -> tuple[str, int]:
    """Run the probe module and ``selection`` in a child pytest with the plugin (the
    options ``plugin``); its output and exit status."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    args = ["-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path), "-q"]
    args += ["-p", "no:cacheprovider", "-p", "no:randomly", *plugin]
    args += [str(probe), *selection]
    done = run_python(args=args, env=env, cwd=tmp_path, timeout=300)
    return done.stdout + "\n" + done.stderr, done.returncode


def counts(output: str) -> dict[str, int]:
    """pytest's final tally: ``{"passed": 12, "skipped": 1, ...}``."""
    tally = [
        line
        for line in output.splitlines()
        if re.search(r"\d+ (passed|failed)\b.* in [\d.]+s", line)
    ]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", tally[-1])} if tally else {}


@pytest.mark.needs("fine")  # sk.numpy_allocator: NumPy writes without maps
def test_plugin_runs_numpy_tests_under_the_allocator(tmp_path: Path) -> None:
    selection = [str(NUMPY_CORE_TESTS / test) for test in NUMPY_SELECTION]
    output, status = run_session(tmp_path, *selection)
    assert status == 0, output
    tally = counts(output)
    assert tally.get("failed", 0) == 0 and tally.get("error", 0) == 0, output
    assert tally["passed"] >= 6 + 100, output  # the probe's six and NumPy's
    # The one warning: NumPy's test of a failing malloc asks for 2**63 - 1 bytes, which the
    # handler refuses (NumPy raises its MemoryError); no free or realloc failed.
    assert "1 warning(s) of the allocator" in output, output
    assert re.search(r"::test_malloc_fails: .*allocation failed: InvalidValueError", output)


@pytest.mark.needs("fine")  # sk.numpy_allocator: NumPy writes without maps
def test_plugin_reports_the_allocators_warnings(tmp_path: Path) -> None:
    """A free that fails is logged by the handler (NumPy cannot be told): the plugin lists
    it with its test."""
    failing = tmp_path / "test_failing_free.py"
    failing.write_text(
        "import logging\n"
        "def test_logs():\n"
        "    logging.getLogger('svmkit.resources.numpy_allocator').warning('free failed: %s', 7)\n"
    )
    output, status = run_session(tmp_path, str(failing))
    assert status == 0, output
    assert "1 warning(s) of the allocator" in output, output
    assert "test_failing_free.py::test_logs: free failed: 7" in output, output


def test_probe_fails_without_the_plugin(tmp_path: Path) -> None:
    """The probe asserts what only the plugin makes true."""
    output, _ = run_session(tmp_path, plugin=())
    tally = counts(output)
    assert tally.get("failed") == 5 and tally.get("passed") == 1, output
