"""kernels_dir and build_program: shipped headers, -cl-std, SVMKIT_SCOPE, defines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyopencl as cl
import pytest

import svmkit as sk
from svmkit.programs import build_options

SCOPE_PROBE = """
#include "svmkit_atomics.h"
#define STR2(x) #x
#define STR(x) STR2(x)
__kernel void probe(__global int *out) {
#if defined(SVMKIT_SCOPE_IS_ALL)
    out[0] = 2;
#else
    out[0] = 1;
#endif
    out[1] = ANSWER;
    out[2] = __OPENCL_C_VERSION__;
}
"""


def test_kernels_dir_holds_the_headers():
    directory = sk.kernels_dir()
    assert (directory / "svmkit_atomics.h").is_file()
    assert any(directory.glob("*.h"))


def test_installed_package_finds_its_kernels_inside_the_package():
    package_dir = Path(sk.__file__).resolve().parent
    if "site-packages" not in str(package_dir):
        pytest.skip("svmkit is imported from a source checkout, not an installed wheel")
    assert sk.kernels_dir().resolve().parent == package_dir


def test_build_program_defines_scope_std_and_user_defines(ctx, caps):
    opts = build_options(ctx, defines={"ANSWER": 42})
    expected_scope = (
        "memory_scope_all_svm_devices" if caps.atomic_scope_all_devices else "memory_scope_device"
    )
    assert f"-DSVMKIT_SCOPE={expected_scope}" in opts
    assert any(o.startswith("-cl-std=CL") for o in opts)
    assert f"-I{sk.kernels_dir()}" in opts
    is_all = {"SVMKIT_SCOPE_IS_ALL": None} if caps.atomic_scope_all_devices else {}
    prg = sk.build_program(ctx, SCOPE_PROBE, defines={"ANSWER": 42, **is_all})
    out = sk.zeros(ctx, 3, np.int32)
    q = cl.CommandQueue(ctx)
    cl.Kernel(prg, "probe")(q, (1,), None, out).wait()
    got = out.get()
    assert got[0] == (2 if caps.atomic_scope_all_devices else 1)
    assert got[1] == 42
    std = next(o for o in opts if o.startswith("-cl-std=CL"))
    major, minor = std.removeprefix("-cl-std=CL").split(".")
    assert got[2] == int(major) * 100 + int(minor) * 10


@pytest.mark.needs("atomics")
def test_atomics_header_compiles_with_the_chosen_scope(ctx):
    src = """
    #include "svmkit_atomics.h"
    __kernel void bump(__global atomic_int *counter) { svmkit_fetch_add(counter, 1); }
    """
    prg = sk.build_program(ctx, src)
    counter = sk.zeros(ctx, 1, np.int32, policy=sk.Policy.fine(atomics=True))
    q = cl.CommandQueue(ctx)
    cl.Kernel(prg, "bump")(q, (1000,), None, counter).wait()
    assert int(counter.host[0]) == 1000


def test_compiler_output_goes_to_the_log_not_to_warnings(ctx, caplog):
    import logging
    import uuid
    import warnings

    token = f"svmkit-build-log-probe-{uuid.uuid4().hex}"  # a new source: no cached binary
    source = f'#warning "{token}"\n__kernel void k(__global int *p) {{ p[0] = 1; }}'
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, "svmkit"):
        warnings.simplefilter("always")
        program = sk.build_program(ctx, source)
    assert [w for w in caught if issubclass(w.category, cl.CompilerWarning)] == []
    assert program.k.function_name == "k"
    assert token in caplog.text
