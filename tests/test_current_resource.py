"""``sk.set_current_resource``: the process-wide default resource for a context and policy.

Each test sets the default on a context of its own, so the suite's context keeps its
default.
"""

from __future__ import annotations

import threading

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk


@pytest.fixture
def own_ctx(ctx: cl.Context) -> cl.Context:
    return cl.Context([ctx.devices[0]])


@pytest.fixture
def buffer_policy(own_ctx: cl.Context) -> sk.Policy:
    return sk.Policy.best(own_ctx, system=False)


def test_sk_empty_draws_from_the_resource_set(
    own_ctx: cl.Context, buffer_policy: sk.Policy
) -> None:
    pool = sk.Pool(own_ctx, buffer_policy)
    assert sk.set_current_resource(pool) is None
    assert sk.current_resource(own_ctx, buffer_policy) is pool
    a = sk.empty(own_ctx, 1000, np.float32, policy=buffer_policy)
    assert pool.owns(a.allocation)
    assert pool.stats()["total_allocations"] == 1
    a.set(np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(a.get(), np.arange(1000, dtype=np.float32))
    a.free()
    b = sk.empty(own_ctx, 1000, np.float32, policy=buffer_policy)
    b.free()
    stats = pool.stats()
    assert stats["total_allocations"] == 2
    assert stats["upstream_allocations"] == 1  # the second array reused the cached block


def test_the_default_holds_in_every_thread(own_ctx: cl.Context, buffer_policy: sk.Policy) -> None:
    pool = sk.Pool(own_ctx, buffer_policy)
    sk.set_current_resource(pool)
    seen: list[sk.MemoryResource] = []
    thread = threading.Thread(
        target=lambda: seen.append(sk.current_resource(own_ctx, buffer_policy))
    )
    thread.start()
    thread.join()
    assert seen == [pool]


def test_use_resource_overrides_the_default(own_ctx: cl.Context, buffer_policy: sk.Policy) -> None:
    default, inner = sk.Pool(own_ctx, buffer_policy), sk.Pool(own_ctx, buffer_policy)
    sk.set_current_resource(default)
    with sk.use_resource(inner):
        assert sk.current_resource(own_ctx, buffer_policy) is inner
        with sk.empty(own_ctx, 16, policy=buffer_policy) as a:
            assert inner.owns(a.allocation)
    assert sk.current_resource(own_ctx, buffer_policy) is default
    assert inner.stats()["total_allocations"] == 1
    assert default.stats()["total_allocations"] == 0


def test_only_its_context_and_policy_change(
    own_ctx: cl.Context, ctx: cl.Context, buffer_policy: sk.Policy
) -> None:
    before = sk.current_resource(ctx, buffer_policy)
    pool = sk.Pool(own_ctx, buffer_policy)
    sk.set_current_resource(pool)
    assert sk.current_resource(ctx, buffer_policy) is before
    other = sk.Policy(buffer_policy.granularity, access=sk.Access.READ_ONLY)
    assert sk.current_resource(own_ctx, other) is not pool


def test_set_returns_the_previous_default_and_opts_out(
    own_ctx: cl.Context, buffer_policy: sk.Policy
) -> None:
    pool = sk.Pool(own_ctx, buffer_policy)
    sk.set_current_resource(pool)
    raw = sk.SVMResource(own_ctx, buffer_policy)
    assert sk.set_current_resource(raw) is pool
    with sk.empty(own_ctx, 64, policy=buffer_policy) as a:
        assert raw.owns(a.allocation)
    assert pool.stats()["total_allocations"] == 0


@pytest.mark.parametrize("bad", [None, 3, "pool", object()])
def test_a_non_resource_is_invalid(bad: object) -> None:
    with pytest.raises(sk.InvalidValueError, match="memory resource") as info:
        sk.set_current_resource(bad)  # type: ignore[arg-type]
    assert info.value.cl_error == "CL_INVALID_VALUE"
