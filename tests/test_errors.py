"""The error hierarchy: bases, cl_error names, figures, pickling, driver translation."""

from __future__ import annotations

import pickle

import pyopencl as cl
import pytest

import svmkit as sk
from svmkit.errors import cl_error_name, error_for_name, translate


@pytest.mark.parametrize(
    ("cls", "bases", "cl_error"),
    [
        (sk.InvalidValueError, (sk.SVMError, ValueError), "CL_INVALID_VALUE"),
        (sk.CopyOverlapError, (sk.InvalidValueError,), "CL_MEM_COPY_OVERLAP"),
        (sk.UnsupportedError, (sk.SVMError,), None),
        (sk.InvalidContextError, (sk.SVMError, ValueError), "CL_INVALID_CONTEXT"),
        (sk.MapStateError, (sk.SVMError,), None),
        (sk.UseAfterFreeError, (sk.SVMError,), None),
        (sk.QueueClosed, (sk.SVMError,), None),
    ],
)
def test_classes_derive_and_carry_default_cl_error(cls, bases, cl_error):
    err = cls("message")
    for base in bases:
        assert isinstance(err, base)
    assert err.cl_error == cl_error
    assert str(err) == "message"


def test_out_of_memory_is_memory_error_with_figures_and_pickles():
    err = sk.OutOfMemoryError(
        "no room",
        nbytes=64,
        cl_error="CL_MEM_OBJECT_ALLOCATION_FAILURE",
        limit_bytes=128,
        in_use_bytes=100,
        cached_bytes=20,
    )
    assert isinstance(err, MemoryError) and isinstance(err, sk.SVMError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is sk.OutOfMemoryError
    assert (back.nbytes, back.limit_bytes, back.in_use_bytes, back.cached_bytes) == (
        64,
        128,
        100,
        20,
    )
    assert back.cl_error == "CL_MEM_OBJECT_ALLOCATION_FAILURE"
    assert str(back) == "no room"


def test_every_class_pickles_with_its_cl_error():
    err = sk.InvalidValueError("bad", cl_error="CL_INVALID_EVENT_WAIT_LIST")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is sk.InvalidValueError and back.cl_error == "CL_INVALID_EVENT_WAIT_LIST"


def test_error_names_and_classes_for_codes():
    assert cl_error_name(-30) == "CL_INVALID_VALUE"
    assert cl_error_name(-12345) == "CL_ERROR_-12345"
    assert type(error_for_name("CL_MEM_COPY_OVERLAP", "x")) is sk.CopyOverlapError
    oom = error_for_name("CL_OUT_OF_RESOURCES", "x", nbytes=7)
    assert type(oom) is sk.OutOfMemoryError and oom.nbytes == 7
    assert type(error_for_name("CL_SOMETHING_ELSE", "x")) is sk.SVMError


def test_a_real_driver_error_is_translated(ctx):
    with pytest.raises(cl.Error) as info:
        cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 0)
    err = translate(info.value, what="clCreateBuffer")
    assert type(err) is sk.SVMError
    assert err.cl_error == "CL_INVALID_BUFFER_SIZE"
    assert "clCreateBuffer" in str(err)
