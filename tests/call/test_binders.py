"""What the binders read of an array, and what a copy they cannot make raises, on every call path.

An ndarray subclass can override any property (``shape``, ``strides``,
``dtype``, ``flags``, ``ctypes``, ``__array_interface__``); the binders read
numpy's C fields instead, so a subclass that lies is called as the array it
really is. Each lie below points into a bigger buffer of the test's own, so
the code that believed it read or wrote memory of the test's, never past it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from memkernel import AllocationError, ArgumentError, Kernel, ShapeError, mlir_kernel

from ..fastpath.conftest import with_fast_path
from ..kernels import total

F32 = np.float32
PATHS = ["fast", "checked", "isolated"]

COPY = """func.func @copy(%x: memref<?xf32>, %out: memref<?xf32>) {
  linalg.copy ins(%x : memref<?xf32>) outs(%out : memref<?xf32>)
  return
}"""

STRIDED_COPY = """func.func @copy(%x: memref<?xf32, strided<[?], offset: ?>>, %out: memref<?xf32>) {
  linalg.copy ins(%x : memref<?xf32, strided<[?], offset: ?>>) outs(%out : memref<?xf32>)
  return
}"""

SCALE = """func.func @scale(%x: memref<?xf32>, %s: f32) {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>], iterator_types = ["parallel"]} outs(%x : memref<?xf32>) {
  ^bb0(%v: f32):
    %m = arith.mulf %v, %s : f32
    linalg.yield %m : f32
  }
  return
}"""



def build(source: str, function: Callable[..., Any], path: str) -> Kernel:
    """The kernel compiled for ``path``: with the fast path, without it, or isolated in a worker."""
    kernel = mlir_kernel(source, isolate=path == "isolated")(function)
    return kernel.compile() if path == "isolated" else with_fast_path(kernel, enabled=path == "fast")


@pytest.fixture(scope="module", params=PATHS)
def copy(request):
    return build(COPY, lambda x: None, request.param)


@pytest.fixture(scope="module", params=PATHS)
def strided_copy(request):
    return build(STRIDED_COPY, lambda x: None, request.param)


@pytest.fixture(scope="module", params=PATHS)
def scale(request):
    return build(SCALE, lambda x, s: None, request.param)


def lying(array: np.ndarray, **lies: Any) -> np.ndarray:
    """``array`` as an ndarray subclass whose properties named in ``lies`` return the values given."""
    properties = {name: property(lambda self, value=value: value) for name, value in lies.items()}
    return array.view(type("Lying", (np.ndarray,), properties))


def test_an_input_whose_shape_lies_is_read_by_its_real_shape(copy):
    base = np.arange(64, dtype=F32)
    got = copy(lying(base[:4], shape=(64,)))
    np.testing.assert_array_equal(got, base[:4].copy())


def test_an_out_whose_shape_lies_is_checked_by_its_real_shape(copy):
    base = np.zeros(64, F32)
    with pytest.raises(ShapeError, match=re.escape("copy(): x has 64 elements on dim 0 but out has 4 on dim 0")):
        copy(np.arange(64, dtype=F32), out=lying(base[:4], shape=(64,)))
    assert not base.any()


def test_an_out_whose_shape_lies_is_written_by_its_real_shape(copy):
    base = np.zeros(64, F32)
    out = lying(base[:4], shape=(64,))
    assert copy(np.arange(4, dtype=F32), out=out) is out
    np.testing.assert_array_equal(base, np.concatenate([np.arange(4, dtype=F32), np.zeros(60, F32)]))


def test_strides_that_lie_are_not_read(strided_copy):
    base = np.arange(64, dtype=F32)
    got = strided_copy(lying(base[:4], strides=(8,)))
    np.testing.assert_array_equal(got, base[:4].copy())


def test_a_data_pointer_that_lies_is_not_read(copy):
    decoy = np.full(4, 9, F32)
    x = np.arange(4, dtype=F32)
    got = copy(lying(x, ctypes=decoy.ctypes, __array_interface__=decoy.__array_interface__))
    np.testing.assert_array_equal(got, x.copy())


def test_a_dtype_that_lies_is_refused_by_its_real_dtype(copy):
    x = lying(np.arange(4, dtype=np.float64), dtype=np.dtype(F32), itemsize=4)
    with pytest.raises(ArgumentError, match=re.escape(
            "copy(): argument 'x' expects memref<?xf32> (float32, 1-d); got float64[4]. Pass x.astype(np.float32)")):
        copy(x)


def test_flags_that_lie_do_not_make_a_read_only_array_writable(scale):
    x = np.ones(4, F32)
    x.flags.writeable = False
    with pytest.raises(ArgumentError, match=re.escape(
            "scale(): argument 'x' expects memref<?xf32>; got a read-only array float32[4] for an argument the "
            "kernel may write")):
        scale(lying(x, flags=np.ones(4, F32).flags), 2.0)
    np.testing.assert_array_equal(x, np.ones(4, F32))


def test_an_object_that_only_claims_to_be_an_ndarray_is_read_as_numpy_reads_it(copy):
    base = np.arange(64, dtype=F32)

    class Impostor:
        """Says it is an ndarray of 64 elements; its array interface, as numpy reads it, has 4."""

        __class__ = property(lambda self: np.ndarray)  # type: ignore[assignment]
        shape = (64,)

        def __getattr__(self, name: str) -> Any:
            return getattr(base[:4], name)

    assert isinstance(Impostor(), np.ndarray)
    np.testing.assert_array_equal(copy(Impostor()), np.asarray(Impostor()).copy())


@pytest.fixture(scope="module", params=["fast", "checked"])
def total_kernel(request):
    return build(total(), lambda x: None, request.param)


@pytest.fixture(scope="module", params=["fast", "checked"])
def strided_total(request):
    return build(total(", strided<[?], offset: ?>"), lambda x: None, request.param)


HUGE = 2**46
"""Elements of a broadcast float32 view whose copy (256 TiB) is more than a 47-bit address space holds."""


def test_a_view_too_big_to_copy_contiguous_is_an_allocation_error_naming_it(total_kernel):
    with pytest.raises(AllocationError, match=re.escape(
            f"total(): argument 'x' expects memref<?xf32>; got float32[{HUGE}] with byte strides (0,), which the "
            f"kernel cannot use in place: it needs a C-contiguous copy of shape ({HUGE},) and dtype float32 "
            f"({HUGE * 4 / 2**30:.3g} GiB): not enough memory. Pass a smaller or C-contiguous array, or give the "
            "memref a strided layout (strided<[?], offset: ?>)")):
        total_kernel(np.broadcast_to(F32(1), (HUGE,)))
    assert issubclass(AllocationError, MemoryError)


def test_a_view_too_big_to_copy_away_from_an_overlapping_output_is_an_allocation_error(strided_total):
    out = np.zeros((), F32)
    with pytest.raises(AllocationError, match=re.escape(
            "total(): argument 'x' overlaps 'out', which the kernel may write, so it is read from a copy, as numpy "
            f"does; that copy of shape ({HUGE},) and dtype float32")):
        strided_total(np.broadcast_to(out.reshape(1), (HUGE,)), out=out)
    assert out == 0
