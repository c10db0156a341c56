"""Policy: every rule of the spec's SVM Memory Flags table, and clSVMAlloc's failures."""

from __future__ import annotations

import dataclasses
import pickle

import pyopencl as cl
import pytest
from _helpers import run_python

import svmkit as sk
from svmkit.driver import entrypoints

F = cl.svm_mem_flags


def test_default_policy_is_coarse_read_write():
    p = sk.Policy()
    assert (p.granularity, p.atomics, p.access) == (
        sk.Granularity.COARSE,
        False,
        sk.Access.READ_WRITE,
    )
    assert p.flags == int(F.READ_WRITE)
    assert p.needs_map is True


@pytest.mark.parametrize(
    ("policy", "flags"),
    [
        (sk.Policy.coarse(), F.READ_WRITE),
        (sk.Policy.fine(), F.READ_WRITE | F.SVM_FINE_GRAIN_BUFFER),
        (sk.Policy.fine(atomics=True), F.READ_WRITE | F.SVM_FINE_GRAIN_BUFFER | F.SVM_ATOMICS),
        (sk.Policy.coarse(sk.Access.READ_ONLY), F.READ_ONLY),
        (sk.Policy.fine(access=sk.Access.WRITE_ONLY), F.WRITE_ONLY | F.SVM_FINE_GRAIN_BUFFER),
    ],
)
def test_flags_round_trip(policy, flags):
    assert policy.flags == int(flags)
    assert sk.Policy.from_flags(int(flags)) == policy
    assert policy.needs_map == (policy.granularity is sk.Granularity.COARSE)


def test_policy_is_hashable_and_frozen():
    assert len({sk.Policy.fine(), sk.Policy.fine(), sk.Policy.coarse()}) == 2
    with pytest.raises(AttributeError):
        sk.Policy.fine().atomics = True  # type: ignore[misc]


def test_a_pickled_policy_keys_the_same_entry_in_another_process():
    # The hash is cached per object; a pickle must not carry it to a process whose string
    # hashes differ (a Dask worker looking up its default resource by policy).
    policy = sk.Policy(sk.Granularity.FINE, atomics=True)
    code = (
        "import pickle, sys, svmkit as sk\n"
        "got = pickle.loads(bytes.fromhex(sys.argv[1]))\n"
        "table = {sk.Policy(sk.Granularity.FINE, atomics=True): 'found'}\n"
        "print(table.get(got, 'missing'), hash(got) == hash(sk.Policy.fine(atomics=True)))\n"
    )
    for seed in ("1", "2"):
        proc = run_python(code, args=[pickle.dumps(policy).hex()], env={"PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == ["found", "True"]


def test_atomics_with_coarse_is_invalid():
    with pytest.raises(sk.InvalidValueError, match="CL_MEM_SVM_ATOMICS") as info:
        sk.Policy(sk.Granularity.COARSE, atomics=True)
    assert info.value.cl_error == "CL_INVALID_VALUE"


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        (F.SVM_ATOMICS, "SVM_ATOMICS without SVM_FINE_GRAIN_BUFFER"),
        (F.READ_WRITE | F.SVM_ATOMICS, "SVM_ATOMICS without SVM_FINE_GRAIN_BUFFER"),
        (F.READ_WRITE | F.WRITE_ONLY, "mutually exclusive"),
        (F.READ_WRITE | F.READ_ONLY, "mutually exclusive"),
        (F.WRITE_ONLY | F.READ_ONLY, "mutually exclusive"),
        (1 << 3, "not SVM memory flags"),  # CL_MEM_USE_HOST_PTR: a buffer flag, not an SVM one
        (1 << 20, "not SVM memory flags"),
        (-1, "not SVM memory flags"),
    ],
)
def test_from_flags_rejects_every_rule_breach(flags, rule):
    with pytest.raises(sk.InvalidValueError, match=rule) as info:
        sk.Policy.from_flags(int(flags))
    assert info.value.cl_error == "CL_INVALID_VALUE"


def test_from_flags_with_no_access_bit_means_read_write():
    assert sk.Policy.from_flags(int(F.SVM_FINE_GRAIN_BUFFER)) == sk.Policy.fine()


def test_best_is_the_finest_supported(ctx, caps):
    best = sk.Policy.best(ctx)
    if caps.fine_grain_system:
        assert best.granularity is sk.Granularity.SYSTEM
    elif caps.fine_grain_buffer:
        assert best.granularity is sk.Granularity.FINE
    else:
        assert best.granularity is sk.Granularity.COARSE
    assert best.atomics is False


def test_best_without_system_is_the_finest_clsvmalloc_granularity(caps):
    with_system = dataclasses.replace(caps, fine_grain_system=True)  # faked: capabilities only
    object.__setattr__(with_system, "devices", (with_system,))
    assert sk.Policy.best(with_system).granularity is sk.Granularity.SYSTEM
    expect = sk.Granularity.FINE if caps.fine_grain_buffer else sk.Granularity.COARSE
    for source in (caps, with_system):
        assert sk.Policy.best(source, system=False).granularity is expect
        assert sk.Policy.best(source, system=False, atomics=caps.atomics).atomics is caps.atomics


@pytest.mark.needs("atomics")
def test_best_with_atomics(ctx):
    best = sk.Policy.best(ctx, atomics=True)
    assert best.atomics and best.granularity is not sk.Granularity.COARSE


def test_check_refuses_system_svm_on_pocl_naming_the_device(ctx, caps):
    if caps.fine_grain_system:
        pytest.skip("this device has fine-grain system SVM")
    with pytest.raises(sk.UnsupportedError, match="CL_DEVICE_SVM_FINE_GRAIN_SYSTEM") as info:
        sk.Policy.system().check(ctx)
    assert caps.devices[0].name in str(info.value)
    with pytest.raises(sk.UnsupportedError):
        sk.SVMResource(ctx, sk.Policy.system())


# -- clSVMAlloc rules, checked before the driver sees the call --------------------------------


@pytest.fixture
def no_driver(monkeypatch):
    """Fail the test if a checked-invalid allocation reached clSVMAlloc."""
    calls = []

    def refuse(*args):
        calls.append(args)
        raise AssertionError("clSVMAlloc was called with invalid arguments")

    monkeypatch.setattr(entrypoints, "svm_alloc", refuse)
    return calls


@pytest.mark.parametrize("alignment", [3, 24, 100, -8])
def test_alignment_must_be_a_power_of_two(ctx, alignment, no_driver):
    with pytest.raises(sk.InvalidValueError, match="power of two") as info:
        sk.empty(ctx, 16, alignment=alignment)
    assert info.value.cl_error == "CL_INVALID_VALUE"
    assert no_driver == []


def test_alignment_above_the_largest_data_type_is_invalid(ctx, caps, no_driver):
    with pytest.raises(sk.InvalidValueError, match="largest data type") as info:
        sk.empty(ctx, 16, alignment=caps.max_alignment * 2)
    assert info.value.cl_error == "CL_INVALID_VALUE"
    assert no_driver == []


def test_alignment_must_be_an_int(ctx, no_driver):
    with pytest.raises(sk.InvalidValueError) as info:
        sk.empty(ctx, 16, alignment=8.0)  # type: ignore[arg-type]
    assert info.value.cl_error == "CL_INVALID_VALUE"


def test_every_supported_alignment_is_honoured(ctx, caps, policy):
    alignment = 1
    while alignment <= caps.max_alignment:
        with sk.empty(ctx, 3, dtype="u1", policy=policy, alignment=alignment) as a:
            assert a.ptr % alignment == 0
        alignment *= 2


def test_default_alignment_is_max_alignment(ctx, caps):
    for _ in range(4):
        with sk.empty(ctx, 1, dtype="u1") as a:
            assert a.ptr % caps.max_alignment == 0


def test_size_above_max_alloc_names_device_and_limit(ctx, caps, no_driver):
    too_many = caps.max_alloc_bytes // 8 + 1
    with pytest.raises(sk.InvalidValueError) as info:
        sk.empty(ctx, too_many, dtype="f8")
    assert info.value.cl_error == "CL_INVALID_VALUE"
    assert str(caps.max_alloc_bytes) in str(info.value)
    assert caps.devices[0].name in str(info.value)
    assert no_driver == []


def test_size_limit_is_the_minimum_over_devices(two_device_ctx):
    caps = sk.capabilities(two_device_ctx)
    with pytest.raises(sk.InvalidValueError, match="CL_DEVICE_MAX_MEM_ALLOC_SIZE") as info:
        sk.empty(two_device_ctx, caps.max_alloc_bytes + 1, dtype="u1")
    assert info.value.cl_error == "CL_INVALID_VALUE"


def test_negative_shape_is_invalid(ctx, no_driver):
    with pytest.raises(sk.InvalidValueError, match="negative") as info:
        sk.empty(ctx, (4, -1))
    assert info.value.cl_error == "CL_INVALID_VALUE"


def test_zero_size_allocates_nothing(ctx, no_driver):
    a = sk.empty(ctx, (0, 4), dtype="f4")
    assert a.size == 0 and a.nbytes == 0 and a.shape == (0, 4)
    assert a.get().shape == (0, 4)
    a.free()
    assert no_driver == []


def test_driver_null_becomes_out_of_memory(ctx, monkeypatch):
    monkeypatch.setattr(entrypoints, "svm_alloc", lambda *args: 0)
    raw = sk.SVMResource(ctx, sk.Policy.coarse())
    # (the default resource is a pool whose cache may serve 1000 bytes without the driver)
    for resource in (raw, sk.PoolResource(raw)):
        with pytest.raises(sk.OutOfMemoryError) as info:
            sk.empty(ctx, 1000, dtype="u1", resource=resource)
        assert info.value.cl_error == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
        assert info.value.nbytes == 1000


def test_policy_differing_from_the_resource_is_invalid(ctx):
    resource = sk.SVMResource(ctx, sk.Policy.coarse())
    with pytest.raises(sk.InvalidValueError, match="differs") as info:
        sk.empty(ctx, 4, policy=sk.Policy.fine(), resource=resource)
    assert info.value.cl_error == "CL_INVALID_VALUE"
    with sk.empty(ctx, 4, policy=sk.Policy.coarse(), resource=resource) as a:
        assert a.policy == sk.Policy.coarse()


def test_resource_of_another_context_is_invalid(ctx):
    other = cl.Context(ctx.devices)
    resource = sk.SVMResource(other, sk.Policy.coarse())
    with pytest.raises(sk.InvalidContextError) as info:
        sk.empty(ctx, 4, resource=resource)
    assert info.value.cl_error == "CL_INVALID_CONTEXT"
