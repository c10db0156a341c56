"""DLPack producer: kDLCPU zero-copy for FINE and SYSTEM, refusal and host copies for
COARSE, versioned and legacy capsules, NumPy 2's __array__ copy= rules, sk.asarray
imports."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from _helpers import CHILD_CWD

import svmkit as sk

fine = pytest.mark.needs("fine")
coarse = pytest.mark.needs("coarse")


def capsule_name(capsule: object) -> bytes:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return bytes(get_name(capsule))


@fine
def test_numpy_consumer_shares_memory_after_recorded_work(ctx, queue):
    a = sk.zeros(ctx, 64, np.float32, policy=sk.Policy.fine())
    prg = sk.build_program(ctx, "__kernel void one(__global float *p) { p[get_global_id(0)] = 1; }")
    sk.launch(queue, prg.one, (64,), None, a)  # not waited for: __dlpack__ must wait
    n = np.from_dlpack(a)
    assert n.tolist() == [1.0] * 64
    n[3] = 7
    assert a.host[3] == 7 and n.ctypes.data == a.ptr and n.flags.writeable
    assert a.__dlpack_device__() == (1, 0)


@fine
def test_versioned_and_legacy_capsules(ctx):
    a = sk.zeros(ctx, 4, policy=sk.Policy.fine())
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(1, 3))) == b"dltensor_versioned"
    assert capsule_name(a.__dlpack__()) == b"dltensor"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == b"dltensor"
    with pytest.raises(BufferError, match="stream"):
        a.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="kDLCPU"):
        a.__dlpack__(dl_device=(4, 0))
    copied = np.from_dlpack(a, copy=True)
    copied[:] = 5
    assert a.host.tolist() == [0.0] * 4


@fine
def test_torch_consumer_shares_memory(ctx):
    torch = pytest.importorskip("torch")
    a = sk.asarray(ctx, np.arange(6, dtype=np.float32), policy=sk.Policy.fine())
    t = torch.from_dlpack(a)
    t.mul_(2)
    assert a.host.tolist() == [0, 2, 4, 6, 8, 10]
    assert t.data_ptr() == a.ptr


@coarse
def test_coarse_refuses_pointer_export_and_copies_to_the_host(ctx, queue):
    a = sk.asarray(ctx, np.arange(5, dtype=np.int32), policy=sk.Policy.coarse())
    device = ctx.devices[0]
    assert a.__dlpack_device__() == (4, device.platform.get_devices().index(device))
    with pytest.raises(BufferError, match=r"sk\.mapped|svmkit\.mapped") as info:
        a.__dlpack__()
    assert 'device="cpu"' in str(info.value)
    with pytest.raises(BufferError):
        a.__dlpack__(dl_device=(1, 0), copy=False)
    host = np.from_dlpack(a, device="cpu")
    assert host.tolist() == [0, 1, 2, 3, 4]
    host[0] = 9  # a copy: the array is unchanged
    assert a.get().tolist() == [0, 1, 2, 3, 4]
    with sk.mapped(queue, a) as h:
        assert np.from_dlpack(h).tolist() == [0, 1, 2, 3, 4]  # the mapped view exports


@coarse
def test_coarse_array_conversion_needs_a_map(ctx, queue):
    a = sk.zeros(ctx, 3, policy=sk.Policy.coarse())
    for convert in (np.asarray, np.array):
        with pytest.raises(sk.MapStateError):
            convert(a)


@fine
def test_array_follows_numpy2_copy_rules(ctx):
    a = sk.asarray(ctx, np.arange(4, dtype=np.int32), policy=sk.Policy.fine())
    same = np.asarray(a)
    assert same.ctypes.data == a.ptr
    assert np.array(a, copy=False).ctypes.data == a.ptr
    copied = np.array(a, copy=True)
    assert copied.ctypes.data != a.ptr and copied.tolist() == [0, 1, 2, 3]
    assert np.asarray(a, dtype=np.float64).tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="copy"):
        np.array(a, dtype=np.float64, copy=False)


@fine
def test_asarray_imports_dlpack_and_buffer_objects(ctx):
    torch = pytest.importorskip("torch")
    t = torch.arange(5, dtype=torch.int64)
    a = sk.asarray(ctx, t, policy=sk.Policy.fine())
    assert isinstance(a, sk.SVMArray) and a.host.tolist() == [0, 1, 2, 3, 4]
    assert a.ptr != t.data_ptr()  # copied into SVM
    b = sk.asarray(ctx, bytearray(b"\x01\x02\x03"), policy=sk.Policy.fine())
    assert b.dtype == np.uint8 and b.host.tolist() == [1, 2, 3]
    m = sk.asarray(
        ctx, memoryview(np.arange(3, dtype=np.float32).tobytes()).cast("f"), policy=sk.Policy.fine()
    )
    assert m.dtype == np.float32 and m.host.tolist() == [0, 1, 2]
    assert sk.asarray(ctx, a) is a  # an SVMArray of the context comes back as it is


def test_asarray_of_a_producer_without_a_cpu_copy_is_a_buffer_error(ctx):
    class OnADevice:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            raise BufferError("no CPU copy here")

    with pytest.raises(BufferError):
        sk.asarray(ctx, OnADevice())


def test_numpy_floor_is_2_1():
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")

    data = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    deps = data["project"]["dependencies"]
    assert "numpy>=2.1" in deps and "mako" in deps


@fine
def test_negative_strides_are_refused_not_handed_to_a_consumer_that_aborts(tmp_path):
    # PyTorch aborts the process (an uncaught c10::Error) on a DLPack tensor with negative
    # strides: svmkit refuses to export one (BufferError), so the consumer never sees it.
    pytest.importorskip("torch")
    import subprocess
    import sys

    code = (
        "import numpy as np, torch, svmkit as sk\n"
        "ctx = sk.create_context()\n"
        "a = sk.asarray(ctx, np.arange(8.0), policy=sk.Policy.fine())\n"
        "r = a[::-1]\n"
        "for consume in (torch.from_dlpack, np.from_dlpack):\n"
        "    try:\n"
        "        consume(r)\n"
        "    except BufferError as exc:\n"
        "        print('refused', 'negative strides' in str(exc))\n"
        "print(np.from_dlpack(r, copy=True).tolist())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=CHILD_CWD
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == [
        "refused True",
        "refused True",
        str([7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]),
    ]
