"""sk.launch: SVMArray arguments, pointer sharing through `uses`, map state, events."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk
import svmkit.driver.entrypoints as icd
import svmkit.ops as ops
import svmkit.ops.kernel_launch as launch_module
from svmkit.ops.placeholder import placeholder

COMPLETE = cl.command_execution_status.COMPLETE

SOURCE = """
/* Addresses are stored as ulong and cast back to pointers: valid in every OpenCL C
   version (OpenCL C 1.2 compilers, such as NVIDIA's, reject pointer-to-pointer kernel
   arguments). */
typedef struct node {
    ulong value;   /* address of a long in a second SVM array */
    ulong next;    /* address of a node in this array */
} node;

__kernel void walk(__global const node *nodes, __global long *out, int steps) {
    int i = get_global_id(0);
    __global const node *n = &nodes[i];
    long sum = 0;
    for (int k = 0; k < steps; ++k) {
        sum += *(__global const long *)n->value;
        n = (__global const node *)n->next;
    }
    out[i] = sum;
}

__kernel void twice(__global int *a) { a[get_global_id(0)] *= 2; }

__kernel void deref(__global const ulong *box, __global long *out) {
    out[get_global_id(0)] = ((__global const long *)box[0])[get_global_id(0)];
}
"""


@pytest.fixture(scope="module")
def program(ctx: cl.Context) -> cl.Program:
    return sk.build_program(ctx, SOURCE)


def test_linked_structure_across_two_arrays(queue, policy, program, caps):
    assert caps.address_bits == 64
    ctx = queue.context
    n, steps = 257, 40
    rng = np.random.default_rng(7)
    values = rng.integers(-1000, 1000, n).astype(np.int64)
    order = rng.permutation(n)  # node i -> node order[i]
    vals = sk.asarray(ctx, values, policy=policy)
    nodes = sk.empty(ctx, (n, 2), np.uint64, policy=policy)
    value_of = rng.permutation(n)  # node i holds a pointer to vals[value_of[i]]
    table = np.empty((n, 2), np.uint64)
    table[:, 0] = [vals.ptr + 8 * int(j) for j in value_of]
    table[:, 1] = [nodes.ptr + 16 * int(j) for j in order]
    with sk.mapped(queue, nodes, "w_invalidate") as h:  # the host writes device-valid pointers
        h[...] = table
    out = sk.zeros(ctx, n, np.int64, policy=policy)
    event = sk.launch(
        queue, cl.Kernel(program, "walk"), (n,), None, nodes, out, np.int32(steps), uses=[vals]
    )
    assert isinstance(event, cl.Event)
    for a in (nodes, out, vals):
        assert event in a.pending_events() or event.command_execution_status == COMPLETE
    expect = np.empty(n, np.int64)
    for i in range(n):  # the same walk on the host
        j, total = i, 0
        for _ in range(steps):
            total += values[value_of[j]]
            j = order[j]
        expect[i] = total
    np.testing.assert_array_equal(out.get(queue), expect)


def test_view_arguments_point_at_element_zero(queue, policy, program):
    a = sk.asarray(queue.context, np.arange(16, dtype=np.int32), policy=policy)
    sk.launch(queue, cl.Kernel(program, "twice"), (4,), None, a[8:12]).wait()
    np.testing.assert_array_equal(a.get(), np.r_[0:8, 16:24:2, 12:16])


def test_uses_registers_exec_info(queue, program, monkeypatch):
    ctx = queue.context
    calls: list[tuple[int, ...]] = []
    real = icd.set_kernel_exec_info_svm_ptrs
    monkeypatch.setattr(
        icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: (calls.append(p), real(k, p))[1]
    )
    kernel = cl.Kernel(program, "twice")
    buffer = sk.Policy.best(ctx, system=False)  # the list names clSVMAlloc memory only
    a = sk.zeros(ctx, 4, np.int32, policy=buffer)
    b = sk.zeros(ctx, 8, np.int32, policy=buffer)
    sk.launch(queue, kernel, (4,), None, a, uses=[b, b[4:]]).wait()
    assert calls == [(b.ptr, b.ptr + 16)]
    sk.launch(queue, kernel, (4,), None, a).wait()  # the stale list is replaced ...
    assert calls[1] == (placeholder(ctx).ptr,)  # ... by the context's placeholder
    sk.launch(queue, kernel, (4,), None, a).wait()  # nothing stale left to replace
    other = cl.Kernel(program, "twice")
    sk.launch(queue, other, (4,), None, a).wait()  # never registered: nothing to replace
    assert len(calls) == 2
    np.testing.assert_array_equal(a.get(), np.zeros(4, np.int32))


@pytest.mark.needs("system")
def test_system_memory_is_allowed_not_listed(queue, program, monkeypatch):
    # CL_KERNEL_EXEC_INFO_SVM_PTRS takes clSVMAlloc memory only (Intel's CPU runtime
    # answers CL_INVALID_VALUE for a malloc'd pointer); system memory is announced with
    # CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM instead, once per kernel.
    ctx = queue.context
    listed: list[tuple[int, ...]] = []
    allowed: list[bool] = []
    real_ptrs = icd.set_kernel_exec_info_svm_ptrs
    real_system = icd.set_kernel_exec_info_fine_grain_system
    monkeypatch.setattr(
        icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: (listed.append(p), real_ptrs(k, p))[1]
    )
    monkeypatch.setattr(
        icd,
        "set_kernel_exec_info_fine_grain_system",
        lambda k, on: (allowed.append(on), real_system(k, on))[1],
    )
    system = sk.Policy.system()
    target = sk.asarray(ctx, np.arange(8, dtype=np.int64) * 5, policy=system)
    box = sk.asarray(ctx, np.array([target.ptr], np.uint64), policy=system)
    fine_target = sk.asarray(ctx, np.arange(8, dtype=np.int64) * 7, policy=sk.Policy.fine())
    out = sk.zeros(ctx, 8, np.int64, policy=system)
    kernel = cl.Kernel(program, "deref")
    sk.launch(queue, kernel, (8,), None, box, out, uses=[target]).wait()
    np.testing.assert_array_equal(out.get(), np.arange(8) * 5)
    assert listed == [] and allowed == [True]
    box.host[0] = fine_target.ptr  # a clSVMAlloc target is still listed, without the system one
    sk.launch(queue, kernel, (8,), None, box, out, uses=[fine_target, target]).wait()
    np.testing.assert_array_equal(out.get(), np.arange(8) * 7)
    assert listed == [(fine_target.ptr,)] and allowed == [True]


class Box:
    """A work-queue-like object: passes as `kernel_arg`, registers `svm_pointers`."""

    def __init__(self, ctx: cl.Context, target: sk.SVMArray) -> None:
        self.cell = sk.empty(ctx, 1, np.uint64, policy=sk.Policy.fine())
        self.cell.host[0] = target.ptr
        self.target = target
        self.recorded: list[cl.Event] = []

    @property
    def kernel_arg(self) -> sk.SVMArray:
        return self.cell

    @property
    def svm_pointers(self) -> tuple[int, ...]:
        return (self.target.ptr,)

    def record(self, event: cl.Event) -> None:
        self.recorded.append(event)


@pytest.mark.needs("fine")
def test_work_queue_like_arguments(queue, program, monkeypatch):
    ctx = queue.context
    calls: list[tuple[int, ...]] = []
    real = icd.set_kernel_exec_info_svm_ptrs
    monkeypatch.setattr(
        icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: (calls.append(p), real(k, p))[1]
    )
    target = sk.asarray(ctx, np.arange(8, dtype=np.int64) * 3, policy=sk.Policy.fine())
    box = Box(ctx, target)
    out = sk.zeros(ctx, 8, np.int64)
    event = sk.launch(queue, cl.Kernel(program, "deref"), (8,), None, box, out)
    event.wait()
    assert calls == [(target.ptr,)]
    assert box.recorded == [event]
    np.testing.assert_array_equal(out.get(), np.arange(8) * 3)


@pytest.mark.needs("fine", "atomics")
def test_real_work_queue_passes(queue, monkeypatch):
    wq = sk.WorkQueue(queue.context, 8)
    calls: list[tuple[int, ...]] = []
    real = icd.set_kernel_exec_info_svm_ptrs
    monkeypatch.setattr(
        icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: (calls.append(p), real(k, p))[1]
    )
    prg = sk.build_program(
        queue.context,
        """
        #include "svmkit_workqueue.h"
        __kernel void put(__global svmkit_wq *q) { wq_try_push(q, (WQ_ITEM)42); }
    """,
        defines=wq.defines,
    )
    sk.launch(queue, prg.put, (1,), (1,), wq).wait()
    assert calls == [wq.svm_pointers]
    assert int(wq.pop(timeout=5)) == 42


def test_map_state_checks(queue, program):
    ctx = queue.context
    a = sk.zeros(ctx, 8, np.int32, policy=sk.Policy.coarse())
    ro = sk.zeros(ctx, 8, np.int32, policy=sk.Policy.coarse(access=sk.Access.READ_ONLY))
    kernel = cl.Kernel(program, "twice")
    with sk.mapped(queue, a[0:4], "r"), sk.mapped(queue, ro, "r"):
        for call in (
            lambda: sk.launch(queue, kernel, (4,), None, a),
            lambda: sk.launch(queue, kernel, (4,), None, a[4:8], uses=[a]),
        ):
            with pytest.raises(sk.MapStateError) as err:
                call()
            assert err.value.cl_error is None
        sk.launch(queue, kernel, (4,), None, a[4:8], uses=[ro]).wait()  # read-only: allowed
    with sk.mapped(queue, ro, "w"), pytest.raises(sk.MapStateError):
        sk.launch(queue, kernel, (4,), None, a, uses=[ro])


def test_contexts_and_bad_uses(queue, program, other_ctx, foreign_event):
    a = sk.zeros(queue.context, 4, np.int32)
    b = sk.zeros(other_ctx, 4, np.int32)
    kernel = cl.Kernel(program, "twice")
    for call in (
        lambda: sk.launch(cl.CommandQueue(other_ctx), kernel, (4,), None, b),
        lambda: sk.launch(queue, kernel, (4,), None, b),
        lambda: sk.launch(queue, kernel, (4,), None, a, uses=[b]),
        lambda: sk.launch(queue, kernel, (4,), None, a, wait_for=[foreign_event]),
    ):
        with pytest.raises(sk.InvalidContextError) as err:
            call()
        assert err.value.cl_error == "CL_INVALID_CONTEXT"
    with pytest.raises(sk.InvalidValueError) as err2:
        sk.launch(queue, kernel, (4,), None, a, uses=[a.ptr])
    assert err2.value.cl_error == "CL_INVALID_VALUE"


def test_freed_arguments(queue, program):
    a = sk.zeros(queue.context, 4, np.int32)
    b = sk.zeros(queue.context, 4, np.int32)
    b.free()
    kernel = cl.Kernel(program, "twice")
    for call in (
        lambda: sk.launch(queue, kernel, (4,), None, b),
        lambda: sk.launch(queue, kernel, (4,), None, a, uses=[b]),
    ):
        with pytest.raises(sk.UseAfterFreeError):
            call()


def test_event_recorded_on_arguments_and_uses(queue, program):
    ctx = queue.context
    a = sk.zeros(ctx, 4, np.int32)
    b = sk.zeros(ctx, 4, np.int32)
    gate = cl.UserEvent(ctx)
    event = sk.launch(queue, cl.Kernel(program, "twice"), (4,), None, a, uses=[b], wait_for=[gate])
    assert event in a.pending_events() and event in b.pending_events()
    gate.set_status(COMPLETE)
    event.wait()


def test_driver_errors_are_translated(queue, program):
    a = sk.zeros(queue.context, 4, np.int32)
    too_large = queue.device.max_work_group_size + 1  # CL_INVALID_WORK_GROUP_SIZE everywhere
    with pytest.raises(sk.SVMError) as err:
        sk.launch(queue, cl.Kernel(program, "twice"), (too_large,), (too_large,), a)
    assert err.value.cl_error is not None and err.value.cl_error.startswith("CL_")
    assert isinstance(err.value.__cause__, cl.Error)


def test_ops_module_exports():
    assert {sk.fill, sk.copy, sk.migrate, sk.launch} == {
        ops.fill,
        ops.copy,
        ops.migrate,
        ops.launch,
    }


def test_exec_info_failures_are_typed_errors(queue, program, monkeypatch):
    ctx = queue.context
    kernel = cl.Kernel(program, "twice")
    buffer = sk.Policy.best(ctx, system=False)
    a = sk.zeros(ctx, 4, np.int32, policy=buffer)
    monkeypatch.setattr(icd, "set_kernel_exec_info_svm_ptrs", lambda k, p: -30)
    with pytest.raises(sk.InvalidValueError, match="CL_KERNEL_EXEC_INFO_SVM_PTRS") as err:
        sk.launch(queue, kernel, (4,), None, a, uses=[a])
    assert err.value.cl_error == "CL_INVALID_VALUE"
    monkeypatch.setattr(icd, "set_kernel_exec_info_fine_grain_system", lambda k, on: -59)
    with pytest.raises(sk.SVMError, match="SVM_FINE_GRAIN_SYSTEM") as err2:
        launch_module._allow_fine_grain_system(kernel)  # what launch calls for SYSTEM memory
    assert err2.value.cl_error == "CL_INVALID_OPERATION"
    assert not getattr(kernel, "_svmkit_fine_grain_system", False)  # not marked as done


SCALARS_SOURCE = """
__kernel void scalars(__global double *out, char c, short h, int i, long l, float f, double d,
                      uint u, ulong ul) {
    out[0] = c; out[1] = h; out[2] = i; out[3] = l; out[4] = f; out[5] = d;
    out[6] = u; out[7] = ul;
}
__kernel void scale(__global float *a, float s, int n) {
    int i = get_global_id(0);
    if (i < n) a[i] *= s;
}
"""


@pytest.fixture(scope="module")
def scalars_program(ctx: cl.Context) -> cl.Program:
    if "cl_khr_fp64" not in ctx.devices[0].extensions:
        pytest.skip("the device has no double precision (cl_khr_fp64)")
    return sk.build_program(ctx, SCALARS_SOURCE)


def test_numpy_scalars_of_every_width_reach_the_kernel(queue, scalars_program):
    """NumPy scalars are set from their bytes: each width, signed and unsigned, arrives."""
    out = sk.zeros(queue.context, 8, np.float64)
    values = (
        np.int8(-7),
        np.int16(-300),
        np.int32(-70000),
        np.int64(-(2**40)),
        np.float32(1.5),
        np.float64(-0.0),
        np.uint32(4000000000),
        np.uint64(2**53),
    )
    for k in (scalars_program.scalars, cl.Kernel(scalars_program, "scalars")):
        out.set(np.full(8, 99.0))
        sk.launch(queue, k, (1,), None, out, *values).wait()
        got = out.get()
        np.testing.assert_array_equal(got, [float(v) for v in values])
        assert np.signbit(got[5])  # -0.0 travelled as its bytes


def test_scalar_arguments_change_between_launches(queue, scalars_program):
    a = sk.asarray(queue.context, np.ones(16, np.float32))
    k = scalars_program.scale
    for s, n in ((2.0, 16), (3.0, 8), (0.5, 4)):
        k(queue, (16,), None, a, np.float32(s), np.int32(n)).wait()
    want = np.ones(16, np.float32) * 2
    want[:8] *= 3
    want[:4] *= 0.5
    np.testing.assert_array_equal(a.get(), want)


def test_pyopencl_decides_what_bytes_cannot_take(queue, scalars_program):
    """Python numbers with scalar arg dtypes (PyOpenCL converts them), a scalar wider than its
    parameter and a wrong argument count all behave as under PyOpenCL's own call."""
    a = sk.asarray(queue.context, np.ones(4, np.float32))
    k = cl.Kernel(scalars_program, "scale")
    k.set_scalar_arg_dtypes([None, np.float32, np.int32])
    sk.launch(queue, k, (4,), None, a, 2, 4).wait()  # Python numbers, converted
    sk.launch(queue, k, (4,), None, a, np.float64(3.0), np.int64(2)).wait()  # converted too
    np.testing.assert_array_equal(a.get(), [6, 6, 2, 2])
    plain = cl.Kernel(scalars_program, "scale")
    with pytest.raises(sk.SVMError) as err:  # 8 bytes for a float, no dtypes to convert
        sk.launch(queue, plain, (4,), None, a, np.float64(3.0), np.int32(4))
    assert err.value.cl_error == "CL_INVALID_ARG_SIZE"
    with pytest.raises(TypeError):  # PyOpenCL's own count check
        sk.launch(queue, plain, (4,), None, a, np.float32(3.0))
    np.testing.assert_array_equal(a.get(), [6, 6, 2, 2])  # nothing ran


def test_numpy_scalars_of_another_type_are_converted_where_dtypes_are_set(ctx, queue):
    """A NumPy scalar goes from its bytes only where those are what PyOpenCL's call passes:
    with ``set_scalar_arg_dtypes`` an ``int32`` for a ``float`` parameter is converted
    (2 -> 2.0), on a raw kernel with argument info, one without (a cached binary), and an
    :class:`svmkit.Kernel`; the scalar of the parameter's own type still goes as bytes."""
    source = "__kernel void put(__global float *o, float x, int n) { o[0] = x; o[1] = n; }"
    with_info = sk.build_program(ctx, source, options=["-cl-kernel-arg-info"], cache=False)
    cached = sk.build_program(ctx, source)
    out = sk.zeros(ctx, 2, np.float32)
    from_bytes: list[int] = []
    real = cl.Kernel._set_arg_buf

    def counted(self: cl.Kernel, index: int, value: Any) -> None:
        from_bytes.append(index)
        real(self, index, value)

    kernels = [cl.Kernel(with_info, "put"), cl.Kernel(cached, "put"), sk.Kernel(cached, "put")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cl.Kernel, "_set_arg_buf", counted)
        for k in kernels:
            k.set_scalar_arg_dtypes([None, np.float32, np.int32])
            out.set(np.zeros(2, np.float32))
            sk.launch(queue, k, (1,), None, out, np.int32(2), np.int32(5)).wait()
            np.testing.assert_array_equal(out.get(), [2.0, 5.0])
        assert 1 not in from_bytes  # each went through PyOpenCL's conversion
        from_bytes.clear()
        sk.launch(queue, kernels[0], (1,), None, out, np.float32(1.5), np.int32(7)).wait()
        assert from_bytes == [1, 2]  # the parameters' own types: from their bytes
        np.testing.assert_array_equal(out.get(), [1.5, 7.0])
        untyped = sk.build_program(ctx, source).put  # no dtypes: PyOpenCL would pass bytes
        sk.launch(queue, untyped, (1,), None, out, np.float32(0.25), np.int32(-3)).wait()
        assert from_bytes == [1, 2, 1, 2]
        np.testing.assert_array_equal(out.get(), [0.25, -3.0])
