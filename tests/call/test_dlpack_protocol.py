"""Arrays of any library that speaks DLPack: read and written zero-copy, checked as numpy arrays are, and every
way a ``__dlpack__`` can lie is an error that names the argument, never a crash.

The arrays here are of a library memkernel knows nothing of (:class:`Shared`, which shares a numpy array's memory
through numpy's own ``__dlpack__``), so these tests need neither torch nor JAX.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from memkernel import ArgumentError, DTypeError, mlir_kernel

from ..kernels import elementwise
from ..processes import run_python

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1)
STRIDED_ADD = elementwise("arith.addf", "memref<?xf32, strided<[?], offset: ?>>", "f32", 1)


class Shared:
    """An array of a library memkernel does not know: ``array``'s memory, shared through DLPack."""

    def __init__(self, array: np.ndarray, device: Any = (1, 0)) -> None:
        self.array = array
        self.device = device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.device


SHARED = f"{Shared.__module__}.Shared"
LYING = f"{Shared.__module__}.Lying"
"""How messages name these types."""


@pytest.fixture(scope="module")
def add():
    return mlir_kernel(ADD)(lambda a, b: None)


@pytest.fixture(scope="module")
def strided_add():
    return mlir_kernel(STRIDED_ADD)(lambda a, b: None)


def test_a_dlpack_array_is_read_in_place_and_the_result_is_numpy(add):
    a, b = np.arange(5, dtype=np.float32), np.full(5, 0.5, np.float32)
    got = add(Shared(a), Shared(b))
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, a + b)


def test_a_dlpack_array_as_out_is_written_in_place_and_returned(add):
    a, b, c = np.arange(5, dtype=np.float32), np.ones(5, np.float32), np.zeros(5, np.float32)
    out = Shared(c)
    assert add(a, b, out=out) is out
    np.testing.assert_array_equal(c, a + b)


@pytest.mark.parametrize("step", [2, -1, -2])
def test_a_strided_dlpack_view_as_out_is_copied_and_written_back_as_a_numpy_view_is(add, strided_add, step):
    for kernel in (add, strided_add):
        base = np.zeros(12, np.float32)
        view = base[::step][:5]
        kernel(np.arange(5, dtype=np.float32), np.ones(5, np.float32), out=Shared(view))
        expected = np.zeros(12, np.float32)
        expected[::step][:5] = np.arange(5) + 1
        np.testing.assert_array_equal(base, expected)


def test_a_stride_0_dlpack_view_is_read_as_its_repeated_element(add):
    one = np.lib.stride_tricks.as_strided(np.full(1, 3, np.float32), shape=(4,), strides=(0,), writeable=False)
    np.testing.assert_array_equal(add(Shared(one), np.ones(4, np.float32)), np.full(4, 4, np.float32))


def test_a_dlpack_array_of_the_wrong_dtype_is_a_dtype_error_that_is_a_type_error(add):
    with pytest.raises(DTypeError, match=re.escape(
            f"k(): argument 'a' expects memref<?xf32> (float32, 1-d); got {SHARED} float64[3]. "
            "Pass a.astype(np.float32).")) as caught:
        add(Shared(np.zeros(3)), np.zeros(3, np.float32))
    assert isinstance(caught.value, TypeError)


def test_a_numpy_array_of_the_wrong_dtype_is_a_dtype_error_too(add):
    with pytest.raises(DTypeError, match=re.escape("got float64[3]. Pass a.astype(np.float32).")):
        add(np.zeros(3), np.zeros(3, np.float32))


def test_a_dlpack_array_of_the_wrong_rank_is_an_argument_error_naming_it(add):
    with pytest.raises(ArgumentError, match=re.escape("k(): argument 'b' expects memref<?xf32> (float32, 1-d); "
                                                      "got float32[2, 2]. Pass an array of shape (*,).")):
        add(np.zeros(4, np.float32), Shared(np.zeros((2, 2), np.float32)))


def test_a_read_only_export_as_out_is_an_error_saying_it_is_read_only(add):
    c = np.zeros(3, np.float32)
    c.flags.writeable = False
    with pytest.raises(ArgumentError, match=re.escape(
            f"k(): argument 'out' expects memref<?xf32>; got a read-only {SHARED} float32[3] "
            f"as out=: its library exports a {SHARED} read-only through DLPack")):
        add(np.zeros(3, np.float32), np.zeros(3, np.float32), out=Shared(c))


@pytest.mark.parametrize(("device", "named"), [((2, 1), "CUDA:1"), ((10, 0), "ROCm:0"), ((99, 3), "DLPack device type 99:3")])
def test_memory_on_another_device_is_an_error_naming_the_device(add, device, named):
    with pytest.raises(ArgumentError, match=re.escape(
            f"k(): argument 'a' expects memref<?xf32>; got a {SHARED} on device {named}. "
            "memkernel's kernels run on the CPU")):
        add(Shared(np.zeros(3, np.float32), device), np.zeros(3, np.float32))


class NoDevice:
    def __dlpack__(self, **kwargs: Any) -> Any:
        return np.zeros(3, np.float32).__dlpack__(**kwargs)


class Lying(Shared):
    """A ``__dlpack__`` that returns ``made()`` instead of a capsule of its array."""

    def __init__(self, made: Any) -> None:
        super().__init__(np.zeros(3, np.float32))
        self.made = made

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.made()


def _raise() -> Any:
    raise KeyError("nothing to export")


@pytest.mark.parametrize(("value", "says"), [
    (NoDevice(), "TypeError: its type has __dlpack__ but no __dlpack_device__"),
    (Shared(np.zeros(3, np.float32), "cpu"), "TypeError: __dlpack_device__() returned 'cpu', not a (device type"),
    (Shared(np.zeros(3, np.float32), (1, 0, 0)), "TypeError: __dlpack_device__() returned (1, 0, 0), not a"),
    (Shared(np.zeros(3, np.float32), (1.5, 0)), "TypeError: 'float' object cannot be interpreted as an integer"),
])
def test_a_dlpack_device_that_lies_is_an_argument_error(add, value, says):
    with pytest.raises(ArgumentError, match=re.escape("k(): argument 'a' expects memref<?xf32>; got a ") + ".*"
                       + re.escape(f"whose device memkernel cannot read ({says}")):
        add(value, np.zeros(3, np.float32))


@pytest.mark.parametrize(("made", "says"), [
    (_raise, "KeyError: 'nothing to export'"),
    (lambda: None, "ValueError: PyCapsule_GetPointer called with invalid PyCapsule object"),
    (lambda: "capsule", "ValueError"),
    (lambda: np._core.multiarray._ARRAY_API, ""),  # a capsule, of another name
])
def test_a_dlpack_that_raises_or_returns_no_dlpack_capsule_is_an_argument_error(add, made, says):
    for as_out in (False, True):
        with pytest.raises(ArgumentError, match=re.escape(
                f"expects memref<?xf32>; got a {LYING} whose memory memkernel cannot read "
                f"through DLPack ({says}")):
            if as_out:
                add(np.zeros(3, np.float32), np.zeros(3, np.float32), out=Lying(made))
            else:
                add(Lying(made), np.zeros(3, np.float32))


def test_a_dlpack_method_on_the_instance_is_not_asked(add):
    """Only a type's ``__dlpack__`` makes an array of another library, as ``np.from_dlpack`` asks the type."""
    value = NoDevice.__new__(type("Plain", (), {}))
    value.__dlpack__ = lambda **kwargs: np.zeros(3, np.float32).__dlpack__()
    with pytest.raises(ArgumentError, match="got Plain"):
        add(value, np.zeros(3, np.float32))


def test_the_same_memory_shared_twice_as_input_and_out_computes_as_numpy_does(add):
    """Overlap is checked on the memory, whoever shares it: an output over its own input is the same view."""
    a = np.arange(4, dtype=np.float32)
    expected = a + a
    add(Shared(a), Shared(a), out=Shared(a))
    np.testing.assert_array_equal(a, expected)


def test_a_shifted_view_overlapping_the_output_is_read_from_a_copy(add):
    base = np.arange(8, dtype=np.float32)
    expected = base.copy()
    expected[1:5] = base[0:4] + 1
    add(Shared(base[0:4]), np.ones(4, np.float32), out=Shared(base[1:5]))
    np.testing.assert_array_equal(base, expected)


def test_memkernel_imports_neither_torch_nor_jax():
    shown = run_python(f"""
        import sys
        import numpy as np
        import memkernel
        add = memkernel.mlir_kernel({ADD!r})(lambda a, b: None)
        add(np.ones(3, np.float32), np.ones(3, np.float32))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "jax", "jaxlib")))
    """)
    assert shown.strip() == "[]"
