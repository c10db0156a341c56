"""NumPy's whole ndarray surface on SVM arrays: every public method and attribute (a table
generated against ``dir(np.ndarray)``), the operators (``@`` for every shape), NumPy's
functions through ``__array_function__``, indexing beyond views, ``repr``/``print``;
results are SVMArrays of the array's resource, policy and context, scalars NumPy scalars;
mutating methods write the SVM memory and nothing else; COARSE arrays follow the
host-access rule."""

from __future__ import annotations

import ctypes
import io
import operator
import pickle
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import svmkit as sk

BASE = np.arange(1, 13, dtype=np.float64).reshape(3, 4)


@pytest.fixture(params=["fine", "system"])
def host_policy(request, caps):
    """FINE and SYSTEM: the granularities whose memory is host memory."""
    policy = sk.Policy.fine() if request.param == "fine" else sk.Policy.system()
    if policy.missing(caps):
        pytest.skip(f"the test device lacks {request.param} SVM ({caps.name})")
    return policy


@pytest.fixture
def pool(ctx, host_policy):
    return sk.Pool(ctx, host_policy)


def _dump(x: Any) -> Any:
    buffer = io.BytesIO()
    x.dump(buffer)
    return pickle.loads(buffer.getvalue()).tolist()


def _tofile(x: Any) -> Any:
    with tempfile.TemporaryFile() as f:
        x.tofile(f)
        f.seek(0)
        return f.read()


def _through_ctypes(x: Any) -> Any:
    pointer = x.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
    return np.ctypeslib.as_array(pointer, shape=(x.size,)).tolist()


def _mutated(method: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Run a method that works in place; its result is the array itself, after."""
    return lambda x: (method(x), x)[1]


# Every public name of np.ndarray: what it is called with here, on an SVMArray and on a
# NumPy array holding BASE (the results must agree).
CASES: dict[str, Callable[[Any], Any]] = {
    "T": lambda x: x.T,
    "all": lambda x: (x > 1).all(axis=0),
    "any": lambda x: (x > 11).any(),
    "argmax": lambda x: x.argmax(axis=1),
    "argmin": lambda x: x.argmin(),
    "argpartition": lambda x: x.argpartition(1, axis=1),
    "argsort": lambda x: (-x).argsort(axis=0),
    "astype": lambda x: x.astype(np.int32),
    "base": lambda x: x.base is None,
    "byteswap": lambda x: x.byteswap(),
    "choose": lambda x: (x[0] % 3).astype(np.intp).choose([x[0], x[1], x[2]]),
    "clip": lambda x: x.clip(3, 8),
    "compress": lambda x: x.compress([True, False, True], axis=0),
    "conj": lambda x: (x * 1j).conj(),
    "conjugate": lambda x: (x * (1 + 1j)).conjugate(),
    "copy": lambda x: x.copy(),
    "ctypes": _through_ctypes,
    "cumprod": lambda x: x.cumprod(axis=1),
    "cumsum": lambda x: x.cumsum(),
    "data": lambda x: bytes(x.data),
    "device": lambda x: x.device,
    "diagonal": lambda x: x.diagonal(),
    "dot": lambda x: x.dot(x.T),
    "dtype": lambda x: x.dtype,
    "dump": _dump,
    "dumps": lambda x: pickle.loads(x.dumps()).tolist(),
    "fill": _mutated(lambda x: x.fill(7.5)),
    "flags": lambda x: (x.flags.c_contiguous, x.flags.f_contiguous, x.T.flags.f_contiguous),
    "flat": lambda x: x.flat[5],
    "flatten": lambda x: x.flatten(),
    "getfield": lambda x: x.getfield(np.float64),
    "imag": lambda x: (x * 2j).imag,
    "item": lambda x: x.item(5),
    "itemsize": lambda x: x.itemsize,
    "mT": lambda x: x.mT,
    "max": lambda x: x.max(axis=0),
    "mean": lambda x: x.mean(axis=1),
    "min": lambda x: x.min(),
    "nbytes": lambda x: x.nbytes,
    "ndim": lambda x: x.ndim,
    "nonzero": lambda x: (x % 5 == 0).nonzero(),
    "partition": _mutated(lambda x: x.partition(1, axis=1)),
    "prod": lambda x: x.prod(axis=0),
    "put": _mutated(lambda x: x.put([0, 5], [-1.0, -2.0])),
    "ravel": lambda x: x.ravel(),
    "real": lambda x: (x + 3j).real,
    "repeat": lambda x: x.repeat(2, axis=0),
    "reshape": lambda x: x.reshape(4, 3),
    "round": lambda x: (x / 7).round(2),
    "searchsorted": lambda x: x.ravel().searchsorted([3.5, 7.0]),
    "setfield": _mutated(lambda x: x.setfield(0.5, np.float64)),
    "shape": lambda x: x.shape,
    "size": lambda x: x.size,
    "sort": lambda x: _mutated(lambda y: y.sort(axis=0))(-x),
    "squeeze": lambda x: x.reshape(1, 12, 1).squeeze(),
    "std": lambda x: x.std(axis=1),
    "strides": lambda x: x.strides,
    "sum": lambda x: x.sum(axis=0),
    "swapaxes": lambda x: x.swapaxes(0, 1),
    "take": lambda x: x.take([0, 5, 11]),
    "to_device": lambda x: x.to_device("cpu"),
    "tobytes": lambda x: x.tobytes(),
    "tofile": _tofile,
    "tolist": lambda x: x.tolist(),
    "trace": lambda x: x.trace(),
    "transpose": lambda x: x.transpose(),
    "var": lambda x: x.var(),
    "view": lambda x: x.view(np.int64),
}
REFUSED = {"resize", "setflags"}  # in-place changes of what the allocation and policy fix
VIEWS = ["T", "mT", "diagonal", "getfield", "ravel", "reshape", "squeeze", "swapaxes"]
VIEWS += ["to_device", "transpose", "view"]


def _assert_like(got: Any, want: Any, a: sk.SVMArray, what: str) -> None:
    """``got`` (from the SVMArray ``a``) is what NumPy gave (``want``): arrays as SVMArrays
    of ``a``'s policy, context and resource holding the same values; NumPy scalars of the
    same type; anything else equal."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, sk.SVMArray), what
        assert got.policy == a.policy and got.context is a.context, what
        assert a.allocation.resource.owns(got.allocation), what
        assert got.shape == want.shape and got.dtype == want.dtype, what
        np.testing.assert_array_equal(got.host, want, err_msg=what)
    elif isinstance(want, (tuple, list)) and any(isinstance(w, np.ndarray) for w in want):
        assert type(got) is type(want) and len(got) == len(want), what
        for g, w in zip(got, want):
            _assert_like(g, w, a, what)
    else:
        assert type(got) is type(want), what
        assert got == want, what


def test_the_table_covers_every_public_ndarray_name():
    public = {name for name in dir(np.ndarray) if not name.startswith("_")}
    assert set(CASES) | REFUSED == public  # a name NumPy adds must join the table
    assert all(hasattr(sk.SVMArray, name) for name in public)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_method_and_attribute_gives_numpys_values(ctx, pool, name):
    a = pool.asarray(BASE)
    bystander = pool.asarray(np.arange(5.0))
    want = CASES[name](BASE.copy())
    got = CASES[name](a)
    _assert_like(got, want, a, name)
    assert bystander.host.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # no other array changed


@pytest.mark.parametrize("name", VIEWS)
def test_view_results_are_views_of_the_same_memory(pool, name):
    a = pool.asarray(BASE)
    got = CASES[name](a)
    assert isinstance(got, sk.SVMArray) and got.allocation is a.allocation
    assert np.shares_memory(got.host, a.host)
    assert got.base is a


def test_views_of_coarse_memory_need_no_map(ctx, queue):
    a = sk.asarray(ctx, BASE, policy=sk.Policy.coarse())
    t = a.T.swapaxes(0, 1).reshape(12)
    assert t.allocation is a.allocation and t.shape == (12,)
    with sk.mapped(queue, a, "w"):
        t[3] = -4.0  # the view writes the allocation
    assert a.get()[0, 3] == -4.0


@pytest.mark.parametrize("name", ["fill", "sort", "partition", "put", "setfield", "setitem"])
def test_mutating_methods_write_the_svm_memory_and_nothing_else(pool, name):
    a = pool.asarray(BASE[::-1].copy())
    before = pool.asarray(np.arange(6.0))
    ptr = a.ptr
    mutations: dict[str, Callable[[Any], Any]] = {
        "fill": lambda x: x.fill(2.5),
        "sort": lambda x: x.sort(axis=None if x.ndim == 1 else 0),
        "partition": lambda x: x.partition(0, axis=1),
        "put": lambda x: x.put([1, 7], [-5.0, -6.0]),
        "setfield": lambda x: x.setfield(1.25, np.float64),
        "setitem": lambda x: x.__setitem__(x > 6, 0.0),
    }
    want = BASE[::-1].copy()
    mutations[name](want)
    assert mutations[name](a) is None and a.ptr == ptr
    assert a.host.tolist() == want.tolist()  # read back through the memory ...
    assert a.get().tolist() == want.tolist()  # ... and through the device
    assert before.host.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_byteswap_in_place_and_not(pool):
    a = pool.asarray(np.arange(3, dtype=np.int32))
    swapped = a.byteswap()
    assert swapped.host.tolist() == np.arange(3, dtype=np.int32).byteswap().tolist()
    assert a.host.tolist() == [0, 1, 2]
    assert a.byteswap(inplace=True) is a
    assert a.host.tolist() == [0, 1 << 24, 2 << 24]


def test_in_place_resize_and_setflags_are_invalid_value_errors(pool):
    a = pool.asarray(np.arange(4.0))
    with pytest.raises(sk.InvalidValueError, match=r"np\.resize"):
        a.resize((8,))
    with pytest.raises(sk.InvalidValueError):
        a.resize(8, refcheck=False)
    with pytest.raises(sk.InvalidValueError, match="policy"):
        a.setflags(write=False)
    assert a.shape == (4,) and a.host.flags.writeable
    bigger = np.resize(a, (2, 4))  # NumPy's function makes a new array
    assert isinstance(bigger, sk.SVMArray) and bigger.host.tolist() == [[0, 1, 2, 3]] * 2


def test_scalars_are_numpy_scalars(pool):
    a = pool.asarray(BASE)
    assert type(a.sum()) is np.float64 and a.sum() == BASE.sum()
    assert type(a.argmax()) is np.int64 and a.argmax() == 11
    assert type(a[1, 2]) is np.float64 and a[1, 2] == 7.0
    assert type(np.sum(a)) is np.float64
    assert type(a[0] @ a[1]) is np.float64 and a[0] @ a[1] == BASE[0] @ BASE[1]
    assert type((a > 3).any()) is np.bool_
    assert type(a.item(0)) is float  # as NumPy: item() gives a Python scalar
    assert float(a[0, 0:1].reshape(())) == 1.0 and int(a[2, 3]) == 12 and bool(a[0, 0])
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a)
    assert 5.0 in a and 13.0 not in a


# -- operators ----------------------------------------------------------------------------------

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "<<": operator.lshift,
    ">>": operator.rshift,
    "&": operator.and_,
    "^": operator.xor,
    "|": operator.or_,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "divmod": divmod,
}
IN_PLACE: dict[str, Callable[[Any, Any], Any]] = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "//=": operator.ifloordiv,
    "%=": operator.imod,
    "**=": operator.ipow,
    "<<=": operator.ilshift,
    ">>=": operator.irshift,
    "&=": operator.iand,
    "^=": operator.ixor,
    "|=": operator.ior,
}
LEFT = np.arange(1, 13, dtype=np.int64)
RIGHT = np.arange(12, 0, -1, dtype=np.int64) % 5 + 1


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("other", ["svm", "ndarray", "scalar"])
def test_binary_operators_forward_and_reflected(pool, op, other):
    a = pool.asarray(LEFT)
    b = {"svm": pool.asarray(RIGHT), "ndarray": RIGHT, "scalar": 3}[other]
    b_np = 3 if other == "scalar" else RIGHT
    _assert_like(BINARY[op](a, b), BINARY[op](LEFT, b_np), a, f"a {op} {other}")
    _assert_like(BINARY[op](b, a), BINARY[op](b_np, LEFT), a, f"{other} {op} a")
    assert a.host.tolist() == LEFT.tolist()  # the operands are only read


@pytest.mark.parametrize("op", sorted(IN_PLACE))
def test_in_place_operators_write_the_memory(pool, op):
    a = pool.asarray(LEFT)
    b = pool.asarray(RIGHT)
    ptr = a.ptr
    want = IN_PLACE[op](LEFT.copy(), RIGHT)
    assert IN_PLACE[op](a, b) is a and a.ptr == ptr
    assert a.host.tolist() == want.tolist() and b.host.tolist() == RIGHT.tolist()
    c = pool.asarray(LEFT.astype(np.float64))
    c /= 2
    assert c.host.tolist() == (LEFT / 2).tolist()


def test_unary_operators(pool):
    a = pool.asarray(LEFT - 6)
    unary: dict[str, Callable[[Any], Any]] = {
        "-": operator.neg,
        "+": operator.pos,
        "abs": abs,
        "~": operator.invert,
    }
    for name, fn in unary.items():
        _assert_like(fn(a), fn(LEFT - 6), a, name)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ((3, 4), (4, 2)),
        ((4,), (4, 3)),
        ((3, 4), (4,)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 4, 3), (5, 3, 2)),
    ],
    ids=str,
)
def test_matmul_for_every_shape(pool, left, right):
    x = np.arange(np.prod(left), dtype=np.float64).reshape(left)
    y = np.arange(np.prod(right), dtype=np.float64).reshape(right) - 3
    a, b = pool.asarray(x), pool.asarray(y)
    _assert_like(a @ b, x @ y, a, "svm @ svm")
    _assert_like(a @ y, x @ y, a, "svm @ ndarray")
    _assert_like(x @ b, x @ y, b, "ndarray @ svm (__rmatmul__)")
    _assert_like(x.tolist() @ b, x @ y, b, "list @ svm")
    _assert_like(np.matmul(a, b), x @ y, a, "np.matmul")


def test_matmul_of_a_non_square_array_and_its_transpose(pool):
    a = pool.asarray(BASE)
    _assert_like(a @ a.T, BASE @ BASE.T, a, "a @ a.T")
    _assert_like(a.T @ a, BASE.T @ BASE, a, "a.T @ a")
    s = pool.asarray(np.eye(4) * 2)
    b = pool.asarray(BASE)
    b @= s
    assert b.host.tolist() == (BASE * 2).tolist()


# -- NumPy functions, indexing ----------------------------------------------------------------


def test_numpy_functions_return_svm_arrays_of_the_same_resource(pool):
    a = pool.asarray(np.array([3, 1, 2, 3, 1], dtype=np.int64))
    x = a.get()
    _assert_like(np.concatenate([a, a]), np.concatenate([x, x]), a, "concatenate")
    _assert_like(np.concatenate([x, a]), np.concatenate([x, x]), a, "concatenate(nd, svm)")
    _assert_like(np.where(a > 1, a, -a), np.where(x > 1, x, -x), a, "where")
    _assert_like(np.where(a > 2), np.where(x > 2), a, "where(condition)")
    _assert_like(np.sort(a), np.sort(x), a, "sort")
    _assert_like(np.unique(a), np.unique(x), a, "unique")
    _assert_like(np.unique(a, return_counts=True), np.unique(x, return_counts=True), a, "counts")
    _assert_like(np.stack([a, a]), np.stack([x, x]), a, "stack")
    _assert_like(np.cumsum(a), np.cumsum(x), a, "cumsum")
    assert type(np.sum(a)) is np.int64 and np.allclose(a, x) is True
    assert np.shape(a) == (5,) and a.host.tolist() == [3, 1, 2, 3, 1]


def test_numpy_functions_that_give_views_give_svm_views(pool):
    a = pool.asarray(np.arange(6.0))
    halves: Any = np.split(a, 2)
    assert [type(h) for h in halves] == [sk.SVMArray, sk.SVMArray]
    assert all(h.allocation is a.allocation for h in halves)
    halves[1][0] = 30.0
    assert a.host.tolist() == [0, 1, 2, 30, 4, 5]
    transposed: Any = np.transpose(a.reshape(2, 3))
    assert transposed.allocation is a.allocation


def test_numpy_functions_that_write_their_first_argument(pool):
    a = pool.asarray(np.zeros(4))
    other = pool.asarray(np.ones(3))
    np.copyto(a, np.arange(4.0))
    np.putmask(a, a > 2, -1.0)
    assert a.host.tolist() == [0, 1, 2, -1] and other.host.tolist() == [1, 1, 1]


def test_boolean_and_fancy_indexing_give_svm_arrays(pool):
    a = pool.asarray(BASE)
    _assert_like(a[a > 6], BASE[BASE > 6], a, "a[a > 6]")
    _assert_like(a[BASE > 6], BASE[BASE > 6], a, "a[ndarray mask]")
    _assert_like(a[[0, 2]], BASE[[0, 2]], a, "a[[0, 2]]")
    index = pool.asarray(np.array([2, 0]))
    _assert_like(a[index, 1:3], BASE[[2, 0], 1:3], a, "a[svm index, slice]")
    picked = a[a > 6]
    assert picked.ptr != a.ptr and not np.shares_memory(picked.host, a.host)
    a[a > 10] = 0.0
    a[[0, 1], [0, 0]] = -1.0
    want = np.where(BASE > 10, 0.0, BASE)
    want[[0, 1], [0, 0]] = -1.0
    assert a.host.tolist() == want.tolist()


def test_iteration_gives_rows_and_scalars(pool):
    a = pool.asarray(BASE)
    rows = list(a)
    assert [type(r) for r in rows] == [sk.SVMArray] * 3 and rows[1].host.tolist() == [5, 6, 7, 8]
    assert [type(v) for v in a[0]] == [np.float64] * 4 and list(a[0]) == [1, 2, 3, 4]
    with pytest.raises(TypeError, match="0-d"):
        iter(a[0, 0:1].reshape(()))


def test_out_arguments_write_the_given_svm_array(pool):
    a = pool.asarray(BASE)
    out = pool.zeros(4)
    assert a.sum(axis=0, out=out) is out and out.host.tolist() == BASE.sum(axis=0).tolist()
    assert np.concatenate([a[0], a[1]], out=pool.zeros(8)).host.tolist() == list(range(1, 9))


# -- repr, print ----------------------------------------------------------------------------


def test_repr_and_str_show_the_values_as_numpy_does_plus_the_policy(pool, host_policy, capsys):
    a = pool.asarray(BASE.astype(np.float32))
    body = np.array_repr(BASE.astype(np.float32))[len("array(") : -1]
    assert repr(a) == f"SVMArray({body.replace(chr(10), chr(10) + '   ')}, policy={host_policy})"
    assert repr(pool.asarray(np.arange(3.0))) == f"SVMArray([0., 1., 2.], policy={host_policy})"
    print(a)
    assert capsys.readouterr().out == f"{BASE.astype(np.float32)} {host_policy}\n"
    a.free()
    assert "freed" in repr(a) and "freed" in str(a)


def test_repr_of_coarse_memory_shows_values_only_while_mapped_for_reading(ctx, queue):
    a = sk.asarray(ctx, np.arange(3.0), policy=sk.Policy.coarse())
    text = repr(a)
    assert "COARSE" in text and "values not shown" in text and "0." not in text
    with sk.mapped(queue, a, "r"):
        assert repr(a) == "SVMArray([0., 1., 2.], policy=Policy(COARSE))"
        assert str(a) == "[0. 1. 2.] Policy(COARSE)"


# -- COARSE: the host-access rule ----------------------------------------------------------------

COARSE_READS: dict[str, Callable[[Any], Any]] = {
    "a.argmax()": lambda a: a.argmax(),
    "a.cumsum()": lambda a: a.cumsum(),
    "a @ a.T": lambda a: a @ a.T,
    "np.concatenate": lambda a: np.concatenate([a, a]),
    "np.sort": lambda a: np.sort(a, axis=None),
    "a[mask]": lambda a: a[BASE > 5],
    "a.ravel()": lambda a: a.T.ravel(),
}


@pytest.mark.needs("coarse")
@pytest.mark.parametrize("name", sorted(COARSE_READS))
def test_coarse_reads_raise_outside_mapped_and_work_inside(ctx, queue, name):
    a = sk.asarray(ctx, BASE, policy=sk.Policy.coarse())
    with pytest.raises(sk.MapStateError, match="mapped"):
        COARSE_READS[name](a)
    with sk.mapped(queue, a, "r"):
        got = COARSE_READS[name](a)
    want = COARSE_READS[name](BASE)
    if isinstance(want, np.ndarray):
        assert isinstance(got, sk.SVMArray) and got.policy == sk.Policy.coarse()
        assert got.get().tolist() == want.tolist()  # filled while mapped, read by the device
    else:
        assert type(got) is type(want) and got == want


@pytest.mark.needs("coarse")
def test_coarse_writes_need_a_map_for_writing(ctx, queue):
    a = sk.asarray(ctx, -BASE, policy=sk.Policy.coarse())
    with pytest.raises(sk.MapStateError, match="mapped"):
        a.fill(1.0)
    with sk.mapped(queue, a, "r"), pytest.raises(sk.MapStateError, match="host write"):
        a.fill(1.0)
    with sk.mapped(queue, a, "w"), pytest.raises(sk.MapStateError, match='mode "rw"'):
        a.sort(axis=0)  # reads and writes
    with sk.mapped(queue, a, "rw"):
        a.sort(axis=0)
    assert a.get().tolist() == np.sort(-BASE, axis=0).tolist()
    with sk.mapped(queue, a, "w"):
        a.fill(2.0)
        a[BASE > 6] = 3.0
    assert a.get().tolist() == np.where(BASE > 6, 3.0, 2.0).tolist()


# -- where results live -------------------------------------------------------------------------


def test_results_come_from_the_arrays_resource(ctx, host_policy):
    stats = sk.StatisticsAdaptor(sk.SVMResource(ctx, host_policy))
    a = sk.asarray(ctx, BASE, resource=stats)
    elsewhere = sk.Pool(ctx, host_policy)
    with sk.use_resource(elsewhere):  # the current resource is not the array's
        results = [a + 1, a @ a.T, np.sort(a), a[a > 3], a.cumsum(), a.copy(), a.astype(int)]
    assert all(stats.owns(r.allocation) for r in results)
    assert elsewhere.stats()["total_allocations"] == 0


def test_numpys_results_are_allocated_by_the_resource_and_not_copied(ctx, host_policy):
    stats = sk.StatisticsAdaptor(sk.SVMResource(ctx, host_policy))
    a = sk.asarray(ctx, np.arange(1000.0), resource=stats)

    def allocations() -> int:
        return stats.stats()["total_allocations"]

    before = allocations()
    assert a.var() == np.arange(1000.0).var()
    assert allocations() > before  # NumPy's own temporaries came from the resource ...
    before = allocations()
    joined: Any = np.concatenate([a, a])
    assert allocations() - before == 1  # ... and its result is the SVMArray: no second one
    assert stats.owns(joined.allocation) and joined.host.tolist() == [*range(1000)] * 2


def test_array_interface_ctypes_and_data_are_exports(pool):
    a = pool.asarray(np.arange(4.0))
    viewed = np.asarray(a)
    interface = a.__array_interface__
    assert interface["shape"] == (4,) and viewed.ctypes.data == a.ptr
    data, pointer = a.data, a.ctypes
    a.free()
    assert pool.stats()["current_bytes"] > 0  # the exports keep the memory
    assert viewed.tolist() == [0, 1, 2, 3] and bytes(data) == np.arange(4.0).tobytes()
    del viewed, interface, data, pointer
    assert pool.stats()["current_bytes"] == 0
    with pytest.raises(sk.UseAfterFreeError):
        a.sum()
