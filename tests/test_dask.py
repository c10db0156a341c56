"""svmkit on Dask: a real ``distributed.LocalCluster`` of worker processes.

One cluster (two worker processes, two threads each) serves the module; results are
compared with NumPy on the same data.  In-process tests drive the worker state the
plugin sets up directly (limits, teardown, threads, granularities).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyopencl as cl
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
import dask  # noqa: E402

import svmkit as sk  # noqa: E402
from svmkit.dask import BuildError, SVMWorkerPlugin, map_kernel, worker_stats  # noqa: E402
from svmkit.dask import worker as dask_worker  # noqa: E402
from svmkit.dask.demo import run_demo  # noqa: E402
from svmkit.dask.map_kernel import run_chunk  # noqa: E402
from svmkit.dask.stats import local_stats  # noqa: E402

AXPB = """
__kernel void axpb(__global float *out, __global const float *in, float a, float b)
{ size_t i = get_global_id(0); out[i] = a * in[i] + b; }
"""
INT_AXPB = """
__kernel void iaxpb(__global int *out, __global const int *in, int a, int b)
{ size_t i = get_global_id(0); out[i] = a * in[i] + b; }
"""
MIX = """
/* (not `mix`: PoCL 3.0 renames a kernel named like a builtin to `_cl_mix`) */
__kernel void mix_scalars(__global double *out, __global const int *in,
                  double a, uint b, long c, char d, float e, ushort f)
{ size_t i = get_global_id(0); out[i] = in[i] * a + b + c + d + e + f; }
"""
RTOL = ATOL = 1e-6  # a * x + b may be contracted into an FMA


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dask-markers")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 3}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        c.register_plugin(SVMWorkerPlugin())
        yield c


def _random(n: int, chunks: int, dtype: Any = np.float32, seed: int = 0) -> Any:
    return da.random.default_rng(seed).random(n, chunks=chunks, dtype=dtype)


# -- results equal NumPy's -----------------------------------------------------------------


def test_map_kernel_matches_numpy_over_many_chunks(client: Any) -> None:
    x = _random(100_000, 3_000)  # 34 chunks, the last one short
    y = map_kernel(x, AXPB, "axpb", 2.5, -1)
    assert isinstance(y, da.Array) and y.dtype == np.float32 and y.chunks == x.chunks
    np.testing.assert_allclose(y.compute(), 2.5 * x.compute() - 1, rtol=RTOL, atol=ATOL)


def test_two_dimensional_uneven_chunks(client: Any) -> None:
    host = np.arange(300 * 70, dtype=np.int32).reshape(300, 70)
    x = da.from_array(host, chunks=(64, 25))
    y = map_kernel(x, INT_AXPB, "iaxpb", 3, 7)
    np.testing.assert_array_equal(y.compute(), 3 * host + 7)


def test_scalars_of_several_types_become_the_parameter_types(client: Any) -> None:
    host = np.arange(-500, 500, dtype=np.int32)
    x = da.from_array(host, chunks=128)
    scalars = (0.5, np.uint8(7), 2**40, -3, np.float32(0.25), True)
    y = map_kernel(x, MIX, "mix_scalars", *scalars, dtype=np.float64)
    assert y.dtype == np.float64
    expected = host * 0.5 + 7 + 2**40 - 3 + 0.25 + 1
    np.testing.assert_array_equal(y.compute(), expected)


def test_composes_with_sum_map_blocks_and_persist(client: Any) -> None:
    host = np.arange(200_000, dtype=np.int32) % 1000
    x = da.from_array(host, chunks=6_250)  # 32 chunks
    y = map_kernel(x, INT_AXPB, "iaxpb", 2, 1).persist()
    expected = 2 * host + 1
    assert int(y.sum(dtype=np.int64).compute()) == int(expected.sum(dtype=np.int64))
    z = y.map_blocks(lambda b: b * 3, dtype=np.int32)
    np.testing.assert_array_equal(z.compute(), 3 * expected)
    twice = map_kernel(y, INT_AXPB, "iaxpb", -1, 5)  # a kernel over a kernel's output
    np.testing.assert_array_equal(twice.compute(), -expected + 5)


def test_pool_blocks_are_reused_across_chunks(client: Any) -> None:
    before = worker_stats(client)
    x = _random(64 * 4096, 4096, seed=3)  # 64 chunks of 16 KiB
    np.testing.assert_allclose(
        map_kernel(x, AXPB, "axpb", 1.5, 0.5).compute(),
        1.5 * x.compute() + 0.5,
        rtol=RTOL,
        atol=ATOL,
    )
    after = worker_stats(client)
    assert len(after) == 2

    def delta(key: str) -> int:
        return sum(s.get(key, 0) - before.get(a, {}).get(key, 0) for a, s in after.items())

    assert delta("total_allocations") >= 128  # an input and an output block per chunk
    assert delta("upstream_allocations") * 8 <= delta("total_allocations")
    for stats in after.values():
        assert stats["current_allocations"] == 0  # every chunk's blocks went back


# -- bad input: a typed error on the client, never a hung graph ------------------------------


def test_a_kernel_name_the_source_never_mentions_fails_at_once() -> None:
    x = da.ones(10, chunks=5, dtype=np.float32)
    with pytest.raises(sk.InvalidValueError, match="nope") as info:
        map_kernel(x, AXPB, "nope", 1.0, 2.0)
    assert info.value.cl_error == "CL_INVALID_KERNEL_NAME"


def test_a_name_that_is_not_a_kernel_fails_on_compute(client: Any) -> None:
    source = "float helper(float v) { return v; }\n" + AXPB
    y = map_kernel(da.ones(10, chunks=5, dtype=np.float32), source, "helper", 1.0, 2.0)
    with pytest.raises(sk.InvalidValueError, match="axpb") as info:
        y.compute()
    assert info.value.cl_error == "CL_INVALID_KERNEL_NAME"


def test_a_build_error_reaches_the_client_with_the_build_log(client: Any) -> None:
    source = "__kernel void broken(__global float *o, __global const float *i)\n" + (
        "{ o[get_global_id(0)] = undeclared_identifier_xyz; }"
    )
    y = map_kernel(da.ones(10, chunks=5, dtype=np.float32), source, "broken")
    with pytest.raises(BuildError) as info:
        y.compute()
    assert isinstance(info.value, sk.SVMError)
    assert info.value.cl_error == "CL_BUILD_PROGRAM_FAILURE"
    assert "undeclared_identifier_xyz" in str(info.value)
    assert "undeclared_identifier_xyz" in info.value.build_log


def test_a_dtype_mismatch_names_the_parameter(client: Any) -> None:
    doubles = da.ones(10, chunks=5, dtype=np.float64)
    y = map_kernel(doubles, AXPB, "axpb", 1.0, 2.0, dtype=np.float32)
    with pytest.raises(sk.InvalidValueError, match=r"parameter 1 \(in\).*float64") as info:
        y.compute()
    assert info.value.cl_error == "CL_INVALID_ARG_VALUE"
    out = map_kernel(da.ones(10, chunks=5, dtype=np.float32), AXPB, "axpb", 1.0, 2.0, dtype="i4")
    with pytest.raises(sk.InvalidValueError, match=r"parameter 0 \(out\).*int32"):
        out.compute()


def test_wrong_scalar_count_and_values(client: Any) -> None:
    x = da.ones(10, chunks=5, dtype=np.float32)
    with pytest.raises(sk.InvalidValueError, match="takes 4 parameters") as info:
        map_kernel(x, AXPB, "axpb", 1.0).compute()
    assert info.value.cl_error == "CL_INVALID_KERNEL_ARGS"
    ints = da.ones(10, chunks=5, dtype=np.int32)
    with pytest.raises(sk.InvalidValueError, match="cannot hold") as info:
        map_kernel(ints, INT_AXPB, "iaxpb", 2**31, 0).compute()
    assert info.value.cl_error == "CL_INVALID_ARG_VALUE"
    with pytest.raises(sk.InvalidValueError, match="cannot hold"):
        map_kernel(ints, INT_AXPB, "iaxpb", 1.5, 0).compute()
    with pytest.raises(sk.InvalidValueError, match="real number"):
        map_kernel(ints, INT_AXPB, "iaxpb", "2", 0)  # at once, on the client
    with pytest.raises(sk.InvalidValueError, match="complex"):
        map_kernel(da.ones(4, chunks=2, dtype=np.complex64), AXPB, "axpb", 1.0, 2.0)


# -- failures and setup ------------------------------------------------------------------


def test_a_worker_killed_mid_computation_is_retried(client: Any, marker_dir: Path) -> None:
    marker = marker_dir / "killed"

    def die_once(block: np.ndarray) -> np.ndarray:
        """Kill this worker process the first time any task gets here (a local function,
        so it travels by value: the workers cannot import this module)."""
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return block
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
        return block  # not reached

    host = np.arange(40_000, dtype=np.int32)
    x = da.from_array(host, chunks=2_500)
    first = map_kernel(x, INT_AXPB, "iaxpb", 4, -2)
    # meta= given: dask must not call _die_once on the client to learn the output type
    dying = first.map_blocks(die_once, meta=np.empty(0, np.int32))
    y = map_kernel(dying, INT_AXPB, "iaxpb", 1, 1)
    np.testing.assert_array_equal(y.compute(), 4 * host - 2 + 1)
    assert marker.exists()  # a worker did die
    client.wait_for_workers(2, timeout=60)
    # the restarted worker was set up by the plugin again and computes correctly
    np.testing.assert_array_equal(map_kernel(x, INT_AXPB, "iaxpb", 1, 0).compute(), host)
    assert all(stats for stats in worker_stats(client).values())


def test_a_worker_without_the_plugin_sets_itself_up(client: Any) -> None:
    released = client.run(dask_worker.teardown)
    assert len(released) == 2
    assert all(stats == {} for stats in worker_stats(client).values())
    host = np.arange(1000, dtype=np.int32)
    y = map_kernel(da.from_array(host, chunks=100), INT_AXPB, "iaxpb", 1, 1)
    np.testing.assert_array_equal(y.compute(), host + 1)
    assert any(stats.get("total_allocations", 0) > 0 for stats in worker_stats(client).values())


# -- the worker state in this process ------------------------------------------------------


class _FakeWorker:
    name = 0


@pytest.fixture
def plugin_state() -> Iterator[None]:
    yield
    dask_worker.teardown()


@pytest.mark.usefixtures("plugin_state")
def test_setup_serves_the_policy_with_copies_only(policy: sk.Policy) -> None:
    SVMWorkerPlugin(policy=policy).setup(_FakeWorker())
    state = dask_worker.state()
    assert state.policy == policy
    assert sk.current_resource(state.context, policy) is state.pool
    host = np.linspace(0, 1, 5000, dtype=np.float32)
    out = run_chunk(host, AXPB, "axpb", (2.0, 1.0), "<f4")
    np.testing.assert_allclose(out, 2 * host + 1, rtol=RTOL, atol=ATOL)
    assert local_stats()["total_allocations"] == 2


@pytest.mark.usefixtures("plugin_state")
def test_the_limit_counts_cached_blocks_and_raises_beyond_it() -> None:
    SVMWorkerPlugin(limit_bytes=1 << 20).setup(_FakeWorker())
    state = dask_worker.state()
    small = np.ones(64 << 10, np.float32)  # 256 KiB: two blocks of ~272 KiB
    np.testing.assert_array_equal(run_chunk(small, AXPB, "axpb", (1.0, 1.0), "<f4"), 2 * small)
    assert state.pool.stats()["cached_bytes"] > 0
    # 700 KiB fits the limit only once the pool gives its cache back (it does, then retries)
    with state.pool.empty(700 << 10, np.uint8):
        assert state.pool.stats()["upstream_bytes"] <= 1 << 20
    big = np.ones(256 << 10, np.float32)  # 1 MiB in and 1 MiB out: beyond the limit
    with pytest.raises(sk.OutOfMemoryError, match="limit of 1048576") as info:
        run_chunk(big, AXPB, "axpb", (1.0, 1.0), "<f4")
    assert info.value.limit_bytes == 1 << 20
    assert local_stats()["limit_bytes"] == 1 << 20


def test_a_limit_beyond_the_device_fails_at_setup(ctx: cl.Context) -> None:
    too_much = max(d.global_mem_size for d in ctx.devices) + 1
    plugin = SVMWorkerPlugin(limit_bytes=too_much)
    with pytest.raises(sk.InvalidValueError, match="global memory"):
        plugin.setup(_FakeWorker())
    assert dask_worker.existing() is None


@pytest.mark.parametrize("bad", [{"device": -1}, {"limit_bytes": 1.5}, {"policy": "fine"}])
def test_bad_plugin_parameters(bad: dict[str, Any]) -> None:
    with pytest.raises(sk.InvalidValueError):
        SVMWorkerPlugin(**bad)


def test_teardown_returns_the_cache_and_the_default() -> None:
    plugin = SVMWorkerPlugin()
    plugin.setup(_FakeWorker())
    state = dask_worker.state()
    run_chunk(np.ones(10_000, np.float32), AXPB, "axpb", (1.0, 0.0), "<f4")
    assert state.pool.stats()["cached_bytes"] > 0
    plugin.teardown(_FakeWorker())
    assert dask_worker.existing() is None
    assert state.pool.stats()["upstream_bytes"] == 0
    assert sk.current_resource(state.context, state.policy) is not state.pool


@pytest.mark.usefixtures("plugin_state")
def test_threads_share_programs_but_not_kernels() -> None:
    SVMWorkerPlugin().setup(_FakeWorker())
    state = dask_worker.state()
    errors: list[BaseException] = []
    kernels: list[cl.Kernel] = []  # held, so no two ids can be the same object's

    def work(seed: int) -> None:
        try:
            host = np.arange(seed, seed + 20_000, dtype=np.int32)
            for _ in range(10):
                out = run_chunk(host, INT_AXPB, "iaxpb", (seed, 1), "<i4")
                np.testing.assert_array_equal(out, seed * host + 1)
            kernels.append(state.programs.kernel(INT_AXPB, "iaxpb").kernel)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert state.programs.builds == 1
    assert len({id(k) for k in kernels}) == 6


# -- the demo --------------------------------------------------------------------------------


def test_demo_runs_and_checks_against_numpy() -> None:
    lines: list[str] = []
    assert run_demo(workers=1, mb=2, chunks=8, write=lines.append) == 0
    text = "\n".join(lines)
    assert "8/8 chunks done" in text
    assert "from the driver" in text
    assert "elements equal" in text and "(equal)" in text


@pytest.mark.parametrize("option", ["workers", "mb", "chunks"])
def test_demo_rejects_bad_options(option: str) -> None:
    with pytest.raises(sk.InvalidValueError, match=f"--{option}"):
        run_demo(**{option: 0}, write=lambda _line: None)
