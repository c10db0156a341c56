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
