"""Regression tests for defects the model-based fuzzer (tests/test_fuzz.py) found."""

from __future__ import annotations

import numpy as np
import pytest

import svmkit as sk


@pytest.mark.needs("coarse")
def test_zero_byte_coarse_array_host_access_needs_no_map(ctx):
    # Found by the fuzzer: `.host` of a zero-element COARSE array raised MapStateError
    # until the allocation had once been mapped, and passed afterwards; it touches no bytes.
    a = sk.empty(ctx, 0, np.uint8, policy=sk.Policy.coarse())
    assert a.host.shape == (0,)
    assert np.asarray(a).size == 0
    b = sk.zeros(ctx, 8, np.uint8, policy=sk.Policy.coarse())
    empty_view = b[3:3]
    assert empty_view.host.size == 0
    with pytest.raises(sk.MapStateError) as info:
        _ = b[3:4].host  # one byte outside a map is still refused
    assert info.value.cl_error is None
