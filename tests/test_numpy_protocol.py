"""NumPy protocol on SVM arrays: ufuncs, operators, reductions, methods, results from the
current resource, elementwise comparisons (so unhashable), and the one host-access rule
for COARSE memory (mapped, as the map mode allows)."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import numpy as np
import pyopencl as cl
import pytest
from _helpers import CHILD_CWD

import svmkit as sk

fine = pytest.mark.needs("fine")


@pytest.fixture
def pool(ctx):
    if not sk.capabilities(ctx).fine_grain_buffer:
        pytest.skip("NumPy on SVM memory needs fine-grain SVM")
    pool = sk.Pool(ctx, sk.Policy.fine())
    with sk.use_resource(pool):
        yield pool


def test_operators_give_svm_arrays_from_the_current_resource(ctx, pool):
    a = pool.asarray(np.arange(6, dtype=np.float64))
    before = pool.stats()["total_allocations"]
    results = {
        "add": (a + 1, np.arange(6) + 1),
        "radd": (1 + a, 1 + np.arange(6)),
        "sub": (a - 2, np.arange(6) - 2),
        "rsub": (10 - a, 10 - np.arange(6)),
        "mul": (a * a, np.arange(6) ** 2),
        "truediv": (a / 2, np.arange(6) / 2),
        "rtruediv": (1 / (a + 1), 1 / (np.arange(6) + 1)),
        "pow": (a**2, np.arange(6) ** 2),
        "neg": (-a, -np.arange(6)),
        "sqrt": (np.sqrt(a), np.sqrt(np.arange(6))),
        "broadcast": (
            a.reshape(2, 3) + np.array([1, 2, 3]),
            np.arange(6).reshape(2, 3) + [1, 2, 3],
        ),
    }
    for name, (got, want) in results.items():
        assert isinstance(got, sk.SVMArray), name
        assert got.context == ctx and got.policy == sk.Policy.fine(), name
        np.testing.assert_allclose(got.host, want, err_msg=name)
    assert pool.stats()["total_allocations"] - before >= len(results)


def test_result_dtypes_follow_numpy(pool):
    i = pool.asarray(np.arange(4, dtype=np.int32))
    f = pool.asarray(np.ones(4, dtype=np.float32))
    assert (i + 1).dtype == np.int32  # a Python int is weak (NEP 50)
    assert (f + 1.5).dtype == np.float32
    assert (i / 2).dtype == np.float64
    assert (i + f).dtype == np.float64
    assert (i == 2).dtype == np.bool_ and (i == 2).host.tolist() == [False, False, True, False]
    assert np.isnan(f).dtype == np.bool_
    assert (i + True).host.tolist() == [1, 2, 3, 4]


def test_inplace_and_out_write_in_place(pool):
    a = pool.asarray(np.arange(4, dtype=np.float64))
    ptr = a.ptr
    a += 1
    a *= 2
    a -= 1
    a /= 2
    assert a.ptr == ptr and a.host.tolist() == [0.5, 1.5, 2.5, 3.5]
    b = pool.zeros(4)
    assert np.add(a, a, out=b) is b and b.host.tolist() == [1.0, 3.0, 5.0, 7.0]
    assert np.multiply(a, 2, out=a) is a and a.host.tolist() == [1.0, 3.0, 5.0, 7.0]
    n = np.empty(4)
    assert np.add(a, 1, out=n) is n and n.tolist() == [2.0, 4.0, 6.0, 8.0]


def test_reductions_and_methods(pool):
    data = np.arange(12, dtype=np.float64).reshape(3, 4)
    a = pool.asarray(data)
    assert a.sum() == data.sum() and isinstance(a.sum(), np.float64)
    assert a.mean() == data.mean() and a.min() == 0 and a.max() == 11
    assert a.std() == pytest.approx(data.std())
    col = a.sum(axis=0)
    assert isinstance(col, sk.SVMArray) and col.host.tolist() == data.sum(axis=0).tolist()
    assert np.add.reduce(a, axis=1).host.tolist() == data.sum(axis=1).tolist()
    assert np.sum(a) == data.sum()  # NumPy's function reaches the method
    out = pool.zeros(4)
    assert a.sum(axis=0, out=out) is out and out.host.tolist() == data.sum(axis=0).tolist()
    i = a.astype(np.int16)
    assert isinstance(i, sk.SVMArray) and i.dtype == np.int16 and i.host.tolist() == data.tolist()
    assert a.astype(np.float64, copy=False) is a
    c = a.copy()
    assert c.ptr != a.ptr and c.host.tolist() == data.tolist()
    assert a.tolist() == data.tolist()


def test_numpy_functions_outside_ufuncs_return_svm_arrays(pool):
    a = pool.asarray(np.arange(3))
    joined = np.concatenate([a, a])
    assert isinstance(joined, sk.SVMArray) and joined.host.tolist() == [0, 1, 2, 0, 1, 2]
    picked = np.where(a > 0, a, -1)
    assert isinstance(picked, sk.SVMArray) and picked.host.tolist() == [-1, 1, 2]
    assert picked.policy == a.policy and pool.owns(picked.allocation)


def test_comparisons_are_elementwise_so_arrays_are_unhashable(pool):
    a = pool.asarray(np.arange(3))
    b = pool.asarray(np.arange(3))
    eq = a == b
    assert isinstance(eq, sk.SVMArray) and eq.host.tolist() == [True, True, True]
    assert (a != b).host.tolist() == [False] * 3 and (a < 1).host.tolist() == [True, False, False]
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)
    with pytest.raises(TypeError):
        {a}  # noqa: B018


def test_work_recorded_on_an_operand_is_waited_for(ctx, queue, pool):
    a = pool.zeros(256, np.int32)
    prg = sk.build_program(
        ctx,
        "__kernel void slow(__global int *p, int n) {"
        " int i = get_global_id(0); int v = 0;"
        " for (int k = 0; k < n; k++) v += (k & 1); p[i] = v; }",
    )
    sk.launch(queue, prg.slow, (256,), None, a, np.int32(200_000))
    assert (a + 0).host.tolist() == [100_000] * 256  # after the kernel, never before
    sk.launch(queue, prg.slow, (256,), None, a, np.int32(100_000))
    assert a.max() == 50_000  # methods wait too ...
    sk.launch(queue, prg.slow, (256,), None, a, np.int32(60_000))
    both: Any = np.concatenate([a[:1], a[-1:]])  # (NumPy's stubs type it ndarray)
    assert both.host.tolist() == [30_000] * 2  # ... and functions


def test_launch_uses_and_kernels_accept_unhashable_arrays(ctx, queue, pool):
    a = pool.zeros(4, np.int32)
    prg = sk.build_program(ctx, "__kernel void w(__global int *p) { p[get_global_id(0)] = 3; }")
    sk.launch(queue, prg.w, (4,), None, a, uses=[a, a]).wait()
    assert a.host.tolist() == [3] * 4


@pytest.mark.needs("coarse")
def test_coarse_operands_name_mapped(ctx):
    a = sk.zeros(ctx, 4, policy=sk.Policy.coarse())
    for op in (lambda: a + 1, lambda: np.sqrt(a), lambda: a.sum(), lambda: a.astype(int)):
        with pytest.raises(sk.MapStateError, match="mapped"):
            op()
    with pytest.raises(sk.MapStateError, match="mapped"):
        a += 1
    assert a.tolist() == [0.0] * 4  # tolist and copy work for every granularity
    assert a.copy().get().tolist() == [0.0] * 4


def test_freed_operands_raise(pool):
    a = pool.zeros(4)
    a.free()
    for op in (lambda: a + 1, lambda: 1 + a, lambda: np.sqrt(a), lambda: a.sum()):
        with pytest.raises(sk.UseAfterFreeError):
            op()


def test_default_resource_is_a_pool_per_context_and_policy(ctx, monkeypatch):
    # A context of its own: its default is made here (with debug mode off), whatever ran
    # before in this process.
    monkeypatch.delenv("SVMKIT_DEBUG", raising=False)
    own = cl.Context([ctx.devices[0]])
    best = sk.Policy.best(own)
    resource = sk.current_resource(own, best)
    assert isinstance(resource, sk.PoolResource)
    assert sk.current_resource(own, best) is resource
    a = sk.empty(own, 100, np.uint8)
    address = a.ptr
    a.free()
    b = sk.empty(own, 100, np.uint8)
    assert b.ptr == address  # reused from the default pool
    assert resource.owns(b.allocation)


def test_copy_deepcopy_and_pickle(ctx, pool):
    a = pool.asarray(np.arange(5, dtype=np.int16))
    for dup in (copy.copy(a), copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert isinstance(dup, sk.SVMArray) and dup.ptr != a.ptr
        assert dup.dtype == np.int16 and dup.host.tolist() == [0, 1, 2, 3, 4]
        assert dup.policy == a.policy


def test_unpickling_in_a_fresh_process_uses_its_default_context(ctx, pool, tmp_path):
    import subprocess
    import sys

    a = pool.asarray(np.arange(4, dtype=np.float32))
    path = tmp_path / "a.pkl"
    path.write_bytes(pickle.dumps(a))
    code = (
        "import pickle, sys, svmkit as sk\n"
        f"a = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        "print(type(a).__name__, a.policy, a.get().tolist())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=CHILD_CWD
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["SVMArray", "Policy(FINE)", "[0.0,", "1.0,", "2.0,", "3.0]"]


# -- the one host-access rule (COARSE) -----------------------------------------------------

MODES = ["r", "w", "rw", "w_invalidate"]
READS = {"r", "rw"}
WRITES = {"w", "rw", "w_invalidate"}


def _coarse(ctx):
    return sk.asarray(ctx, np.arange(4, dtype=np.float32), policy=sk.Policy.coarse())


@pytest.mark.needs("coarse")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["host", "asarray"])
def test_a_view_is_allowed_in_every_mode_and_writable_only_under_a_write_map(ctx, queue, mode, how):
    a = _coarse(ctx)
    with sk.mapped(queue, a, mode):
        view = a.host if how == "host" else np.asarray(a)
        assert view.flags.writeable == (mode in WRITES)
        if mode in READS:
            assert view.tolist() == [0, 1, 2, 3]
        if mode in WRITES:
            view[:] = 9
        else:
            with pytest.raises(ValueError, match="read-only"):
                view[:] = 9
    assert a.get().tolist() == ([9] * 4 if mode in WRITES else [0, 1, 2, 3])


@pytest.mark.needs("coarse")
@pytest.mark.parametrize("mode", MODES)
def test_reads_follow_the_map_mode(ctx, queue, mode):
    a = _coarse(ctx)
    reads = {
        "a + 1": lambda: a + 1,
        "1 + a": lambda: 1 + a,
        "np.sqrt(a)": lambda: np.sqrt(a),
        "np.array(a)": lambda: np.array(a),
        "a.sum()": lambda: a.sum(),
        "a[1]": lambda: a[1],
    }
    with sk.mapped(queue, a, mode):
        for name, read in reads.items():
            if mode in READS:
                got = read()
                expected = {
                    "a + 1": [1, 2, 3, 4],
                    "1 + a": [1, 2, 3, 4],
                    "np.sqrt(a)": np.sqrt(np.arange(4, dtype=np.float32)).tolist(),
                    "np.array(a)": [0, 1, 2, 3],
                    "a.sum()": 6.0,
                    "a[1]": 1.0,
                }[name]
                if isinstance(got, sk.SVMArray):  # a COARSE result, filled while mapped
                    assert got.policy == sk.Policy.coarse(), name
                    got = got.get()
                assert np.asarray(got).tolist() == expected, name
            else:
                with pytest.raises(sk.MapStateError, match=r'host read .*mode "r" or "rw"'):
                    read()
    if mode != "w_invalidate":  # (whose unmap leaves the bytes undefined: the spec)
        assert a.get().tolist() == [0, 1, 2, 3]


@pytest.mark.needs("coarse")
@pytest.mark.parametrize("mode", MODES)
def test_writes_follow_the_map_mode(ctx, queue, mode):
    a = _coarse(ctx)
    x, y = np.full(4, 2, np.float32), np.full(4, 3, np.float32)
    with sk.mapped(queue, a, mode):
        if mode in WRITES:
            assert np.add(x, y, out=a) is a
            a[0] = 7
        else:
            with pytest.raises(sk.MapStateError, match=r"host write .*\"w\", \"rw\""):
                np.add(x, y, out=a)
            with pytest.raises(sk.MapStateError, match="host write"):
                a[0] = 7
    assert a.get().tolist() == ([7, 5, 5, 5] if mode in WRITES else [0, 1, 2, 3])


@pytest.mark.needs("coarse")
@pytest.mark.parametrize("mode", MODES)
def test_an_in_place_operator_reads_and_writes_its_target(ctx, queue, mode):
    a = _coarse(ctx)
    with sk.mapped(queue, a, mode):
        if mode == "rw":
            a += 1
            a *= 2
        else:
            with pytest.raises(sk.MapStateError, match=r'host read and write .*mode "rw"'):
                a += 1
    if mode != "w_invalidate":  # (whose unmap leaves the bytes undefined: the spec)
        assert a.get().tolist() == ([2, 4, 6, 8] if mode == "rw" else [0, 1, 2, 3])


@pytest.mark.needs("coarse")
def test_host_access_needs_every_byte_mapped_for_it(ctx, queue):
    a = _coarse(ctx)
    with sk.mapped(queue, a[:2], "rw"), sk.mapped(queue, a[2:], "r"):
        assert (a + 1).get().tolist() == [1, 2, 3, 4]  # read maps cover every byte
        assert not a.host.flags.writeable  # a write map covers only half
        head = a[:2]
        head += 1  # the view's bytes are mapped "rw"
        with pytest.raises(sk.MapStateError, match="host write"):
            np.add(a, 1, out=a)
    with pytest.raises(sk.MapStateError, match="host read"):
        a + 1
    assert a.get().tolist() == [1, 2, 2, 3]


@pytest.mark.needs("coarse")
@pytest.mark.parametrize("mode", MODES)
def test_tolist_and_copy_read_on_the_host_under_a_read_map(ctx, queue, mode):
    a = _coarse(ctx)
    with sk.mapped(queue, a, mode):
        if mode in READS:  # the host reads: no command on the mapped bytes
            assert a.tolist() == [0, 1, 2, 3]
            b = a.copy()
            assert b.policy == sk.Policy.coarse() and b.get().tolist() == [0, 1, 2, 3]
        else:  # the device would read bytes mapped for writing: refused
            with pytest.raises(sk.MapStateError, match="mapped on the host for writing"):
                a.tolist()
    if mode != "w_invalidate":  # (whose unmap leaves the bytes undefined: the spec)
        assert a.tolist() == [0, 1, 2, 3] and a.copy().get().tolist() == [0, 1, 2, 3]
