"""The driver chokepoint: every driver failure reaches users as a typed svmkit error, and
the queue rule has one home for every granularity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk
import svmkit.driver.calls as driver_calls

CL_INVALID_VALUE = -30


class FailingEntryPoints:
    """Stands in for ``pyopencl._cl``: every SVM entry point fails as a driver would."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_enqueue_svm_"):
            return getattr(self.real, name)

        def fail(*args: Any, **kwargs: Any) -> Any:
            self.called.append(name)
            raise cl.RuntimeError(cl._cl._ErrorRecord(name, CL_INVALID_VALUE, "refused"))

        return fail


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Callable[[], FailingEntryPoints]:
    """Installs the failing entry points when called (arrays are made before that)."""

    def install() -> FailingEntryPoints:
        stub = FailingEntryPoints(driver_calls._cl)
        monkeypatch.setattr(driver_calls, "_cl", stub)
        return stub

    return install


def _operations(queue: cl.CommandQueue, policy: sk.Policy) -> dict[str, Callable[[], Any]]:
    ctx = queue.context
    a = sk.zeros(ctx, 16, np.int32, policy=policy)
    b = sk.zeros(ctx, 16, np.int32, policy=policy)
    host = np.zeros(16, np.int32)
    ops: dict[str, Callable[[], Any]] = {
        "fill": lambda: sk.fill(queue, a, 3),
        "copy svm->svm": lambda: sk.copy(queue, b, a),
        "copy host->svm": lambda: sk.copy(queue, a, host),
        "copy svm->host non-blocking": lambda: sk.copy(queue, host, a, blocking=False),
    }
    if sk.capabilities(ctx).migrate:
        ops["migrate"] = lambda: sk.migrate(queue, [a])
    if policy.needs_map:
        ops["get"] = lambda: a.get(queue)
        ops["set"] = lambda: a.set(np.ones(16, np.int32), queue)

        def map_block() -> None:
            with sk.mapped(queue, a, "rw"):
                pass

        ops["mapped"] = map_block
    return ops


def test_every_driver_failure_is_a_typed_error(queue, policy, failing):
    operations = _operations(queue, policy)
    stub = failing()
    for name, operation in operations.items():
        stub.called.clear()
        with pytest.raises(sk.InvalidValueError) as info:
            operation()
        assert stub.called, f"{name} never reached the driver"
        assert info.value.cl_error == "CL_INVALID_VALUE", name
        assert isinstance(info.value.__cause__, cl.Error), name


def test_a_failed_fill_of_a_new_array_is_typed(queue, failing):
    stub = failing()
    with pytest.raises(sk.InvalidValueError) as info:
        sk.full(queue.context, 8, 7, np.int32, policy=sk.Policy.coarse())
    assert info.value.cl_error == "CL_INVALID_VALUE"
    assert stub.called == ["_enqueue_svm_memfill"]


@pytest.mark.parametrize("bad", ["x", 5, object()])
def test_get_and_set_check_the_queue_for_every_granularity(ctx, policy, bad):
    a = sk.asarray(ctx, np.arange(4, dtype=np.int32), policy=policy)
    with pytest.raises(sk.InvalidValueError) as got:
        a.get(queue=bad)
    assert got.value.cl_error == "CL_INVALID_COMMAND_QUEUE"
    with pytest.raises(sk.InvalidValueError) as put:
        a.set(np.zeros(4, np.int32), queue=bad)
    assert put.value.cl_error == "CL_INVALID_COMMAND_QUEUE"
    np.testing.assert_array_equal(a.get(), np.arange(4))  # nothing was written


def test_get_and_set_refuse_a_queue_of_another_context(ctx, policy):
    other_context = cl.Context([ctx.devices[0]])
    other = cl.CommandQueue(other_context)
    a = sk.zeros(ctx, 4, np.int32, policy=policy)
    with pytest.raises(sk.InvalidContextError) as got:
        a.get(queue=other)
    assert got.value.cl_error == "CL_INVALID_CONTEXT"
    with pytest.raises(sk.InvalidContextError):
        a.set(np.ones(4, np.int32), queue=other)
    np.testing.assert_array_equal(a.get(), np.zeros(4))


# -- events, queues, contexts, kernels ------------------------------------------------------


def _expect_typed(cls: type[sk.SVMError], cl_error: str, fn: Callable[[], Any]) -> sk.SVMError:
    with pytest.raises(cls) as info:
        fn()
    assert type(info.value) is cls
    assert info.value.cl_error == cl_error
    assert isinstance(info.value.__cause__, cl.Error)  # chained from the driver's error
    return info.value


def test_waits_on_a_failed_event_are_typed(ctx):
    failed = driver_calls.new_user_event(ctx)
    assert not driver_calls.event_complete(failed)
    assert driver_calls.event_status(failed) > 0  # CL_SUBMITTED
    driver_calls.set_event_status(failed, -1)
    assert driver_calls.event_status(failed) == -1 and driver_calls.event_complete(failed)
    name = "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST"
    # Intel's and PoCL's clWaitForEvents fail; NVIDIA's returns success and the event's
    # status says it failed: the same typed error either way.
    for wait in (
        lambda: driver_calls.wait(failed, "the test's command"),
        lambda: driver_calls.wait_for_events([failed]),
    ):
        with pytest.raises(sk.SVMError) as info:
            wait()
        assert type(info.value) is sk.SVMError and info.value.cl_error == name
        assert "waiting for" in str(info.value)
    with pytest.raises(sk.SVMError, match="waiting for the test's command"):
        driver_calls.wait(failed, "the test's command")


def test_a_user_event_completes_once(ctx):
    event = driver_calls.new_user_event(ctx)
    driver_calls.set_event_status(event)
    assert driver_calls.event_status(event) == 0 and driver_calls.event_complete(event)
    driver_calls.wait(event)
    driver_calls.wait_for_events([event, event])
    # the spec: clSetUserEventStatus on an event whose status was set is
    # CL_INVALID_OPERATION (Intel, PoCL); NVIDIA's driver accepts the second call
    if "NVIDIA" in ctx.devices[0].platform.name:
        return
    _expect_typed(
        sk.UnsupportedError, "CL_INVALID_OPERATION", lambda: driver_calls.set_event_status(event)
    )
    assert driver_calls.event_status(event) == 0  # completed once, and stays so


def test_queues_and_contexts_are_made_or_refused_typed(ctx):
    queue = driver_calls.new_queue(ctx)
    assert isinstance(queue, cl.CommandQueue) and queue.device == ctx.devices[0]
    marker = driver_calls.enqueue_marker(queue)
    driver_calls.flush(queue)
    driver_calls.finish(queue)
    assert driver_calls.event_complete(marker)
    assert ctx.devices[0] in driver_calls.platform_devices(ctx.devices[0].platform)
    _expect_typed(
        sk.InvalidValueError, "CL_INVALID_VALUE", lambda: driver_calls.new_queue(ctx, None, 1 << 20)
    )
    _expect_typed(sk.InvalidValueError, "CL_INVALID_VALUE", lambda: driver_calls.new_context([]))
    own = driver_calls.new_context(list(ctx.devices))
    assert own.devices == ctx.devices


def test_kernels_are_made_or_refused_typed(ctx):
    source = "__kernel void k(__global int *a, float x) {}"
    program = driver_calls.new_program(ctx, source, cached=False)
    _expect_typed(
        sk.SVMError, "CL_INVALID_PROGRAM_EXECUTABLE", lambda: driver_calls.kernel_names(program)
    )
    program.build(b"-cl-kernel-arg-info", list(ctx.devices))
    assert driver_calls.kernel_names(program) == ["k"]
    err = _expect_typed(
        sk.InvalidValueError,
        "CL_INVALID_KERNEL_NAME",
        lambda: driver_calls.new_kernel(program, "j"),
    )
    assert "'j'" in str(err)
    kernel = driver_calls.new_kernel(program, "k")
    assert isinstance(kernel, cl.Kernel) and kernel is not driver_calls.new_kernel(program, "k")
    assert driver_calls.kernel_arg_type_name(kernel, 0).replace(" ", "") == "int*"
    assert driver_calls.kernel_arg_type_name(kernel, 1) == "float"
    with pytest.raises(sk.InvalidValueError) as info:  # the spec's code, or Intel's
        driver_calls.kernel_arg_type_name(kernel, 2)
    assert info.value.cl_error in {"CL_INVALID_ARG_INDEX", "CL_INVALID_VALUE"}
    assert isinstance(info.value.__cause__, cl.Error)


class BrokenDriverObject:
    """A queue, event and platform whose every driver call fails, as a lost device's would
    (no device here can be made to fail these calls on purpose)."""

    @staticmethod
    def _fail(name: str, code: int) -> Any:
        raise cl.LogicError(cl._cl._ErrorRecord(name, code, "device lost"))

    def finish(self) -> None:
        self._fail("clFinish", -36)

    def flush(self) -> None:
        self._fail("clFlush", -36)

    def get_devices(self) -> list[Any]:
        return self._fail("clGetDeviceIDs", -5)  # type: ignore[no-any-return]

    @property
    def command_execution_status(self) -> int:
        return self._fail("clGetEventInfo", -58)  # type: ignore[no-any-return]


def test_failing_queue_event_and_platform_calls_are_typed():
    broken: Any = BrokenDriverObject()
    _expect_typed(sk.SVMError, "CL_INVALID_COMMAND_QUEUE", lambda: driver_calls.finish(broken))
    _expect_typed(sk.SVMError, "CL_INVALID_COMMAND_QUEUE", lambda: driver_calls.flush(broken))
    _expect_typed(sk.SVMError, "CL_INVALID_EVENT", lambda: driver_calls.event_status(broken))
    _expect_typed(sk.SVMError, "CL_INVALID_EVENT", lambda: driver_calls.event_complete(broken))
    _expect_typed(
        sk.OutOfMemoryError, "CL_OUT_OF_RESOURCES", lambda: driver_calls.platform_devices(broken)
    )


def test_the_event_record_reads_status_through_the_chokepoint():
    from svmkit.events import is_complete

    assert is_complete is driver_calls.event_complete  # the query itself: no call between
