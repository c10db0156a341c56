"""A pytest plugin: a whole test session with svmkit's NumPy allocator installed.

Any test suite that uses NumPy (NumPy's own included) runs with every array's data an
svmkit allocation::

    PYTHONPATH=tests python -m pytest -p numpy_allocator_plugin \\
        "$(python -c 'import numpy, os; print(os.path.dirname(numpy.__file__))')/_core/tests"

The allocator is ``sk.numpy_allocator()`` (the current resource of ``sk.default_context()``
for its best host policy).  It is installed

* at ``pytest_configure``, in every process of the session (each pytest-xdist worker loads
  the plugin from its ``-p`` option and configures itself);
* again before each test's setup, so a test that set another handler and did not restore
  it leaves the next test under svmkit's;
* in every thread the :mod:`threading` module starts.  NumPy keeps its handler in a context
  variable (NEP 49), and a new thread starts in an empty context before Python 3.14 (from
  3.14 only when ``sys.flags.thread_inherit_context`` is set), so it would get NumPy's
  default handler: :func:`threading.setprofile` runs :func:`_install_in_new_thread` first in
  each new thread, which installs the allocator there and removes itself.

Threads started otherwise (``_thread.start_new_thread``, threads of C libraries) keep
NumPy's default handler; so does a test that replaces the ``threading`` profile function.
Tasks of :mod:`asyncio` and :mod:`contextvars` copies inherit the allocator, as context
variables do.

Memory: the default resource is a pool, which keeps every freed block for reuse, so a
process would keep the peak of all its tests (NumPy's "huge" tests allocate several GiB;
its ``requires_memory`` checks read the system's available memory).  After each test whose
arrays left more than :data:`TRIM_ABOVE` bytes cached, the plugin gives the cache back
(``trim()``), as NumPy's default handler gives large blocks back to the system when they
are freed.

The allocator reports a failure it cannot return to NumPy (a free that raised, an allocation
NumPy turns into its own ``MemoryError``) as a warning of its logger
(:data:`ALLOCATOR_LOGGER`): the plugin collects those, with the test that was running, from
every worker (pytest-xdist's worker output), and lists them in the terminal summary.
"""

from __future__ import annotations

import logging
import sys
import threading
from types import FrameType
from typing import Any

import pytest

import svmkit as sk
from svmkit.resources.current import current_resource
from svmkit.resources.numpy_allocator import host_policy

_allocator: sk.NumpyAllocator | None = None
"""The allocator of this session (made at ``pytest_configure``)."""

WORKER_OUTPUT_KEY = "svmkit_numpy_allocator_warnings"
ALLOCATOR_LOGGER = "svmkit.resources.numpy_allocator"
"""The logger the handler reports to (failures it cannot return to NumPy)."""

TRIM_ABOVE = 256 << 20
"""Bytes a resource may keep cached between tests before the plugin trims it."""


class _Warnings(logging.Handler):
    """The allocator's warnings in this process, each with the test it came in."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.test = "(no test)"
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{self.test}: {record.getMessage()}")


_warnings = _Warnings()


def _resource() -> sk.MemoryResource:
    """The resource the allocator serves arrays from now."""
    assert _allocator is not None
    if _allocator.resource is not None:
        return _allocator.resource
    ctx = sk.default_context()
    return current_resource(ctx, host_policy(ctx))


def trim_cache(above: int = TRIM_ABOVE) -> int:
    """Give the allocator's cached blocks back when they exceed ``above`` bytes; the bytes
    given back."""
    resource = _resource()
    cached, trim = getattr(resource, "cached_bytes", 0), getattr(resource, "trim", None)
    if cached <= above or trim is None:
        return 0
    released: int = trim()
    return released


_collected = pytest.StashKey[list[str]]()
"""The warnings of every process of the session (in the process that reports)."""


def _install_in_new_thread(frame: FrameType, event: str, arg: Any) -> None:
    """The profile function of a thread :mod:`threading` starts: called at the thread's
    first event (before its ``run``), it installs the allocator in the thread's context and
    turns itself off."""
    sys.setprofile(None)
    if _allocator is not None:
        _allocator.install()


def install() -> sk.NumpyAllocator:
    """Install the allocator in the current context and in the threads started from now
    on; returns it."""
    global _allocator
    if _allocator is None:
        _allocator = sk.numpy_allocator()
    _allocator.install()
    threading.setprofile(_install_in_new_thread)
    return _allocator


def pytest_configure(config: pytest.Config) -> None:
    logging.getLogger(ALLOCATOR_LOGGER).addHandler(_warnings)
    config.stash[_collected] = []
    install()


def pytest_report_header(config: pytest.Config) -> str:
    return f"svmkit: NumPy arrays allocated by {_allocator!r}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _warnings.test = item.nodeid
    if _allocator is not None:
        _allocator.install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    yield  # (after the test's fixtures are gone)
    if _allocator is not None:
        trim_cache()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _warnings.test = "(after the tests)"
    config = session.config
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:  # a pytest-xdist worker: the controller reports
        worker_output[WORKER_OUTPUT_KEY] = list(_warnings.messages)
    else:
        config.stash[_collected].extend(_warnings.messages)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: a worker finished; keep what it logged."""
    output = getattr(node, "workeroutput", {})
    node.config.stash[_collected].extend(output.get(WORKER_OUTPUT_KEY, ()))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    messages = config.stash[_collected]
    terminalreporter.section("svmkit NumPy allocator")
    terminalreporter.write_line(f"{len(messages)} warning(s) of the allocator")
    for message in messages[:50]:
        terminalreporter.write_line(f"  {message}")


def pytest_unconfigure(config: pytest.Config) -> None:
    logging.getLogger(ALLOCATOR_LOGGER).removeHandler(_warnings)
    threading.setprofile(None)
