"""The compiled code reads torch tensors through torch's DLPack exchange API, and declines what the checked path
refuses or copies: against torch, with the path each call took."""

from __future__ import annotations

import re

import numpy as np
import pytest

from memkernel import ArgumentError, mlir_kernel

from ..kernels import MATMUL, elementwise
from .conftest import HAS_ENTRIES, with_fast_path

torch = pytest.importorskip(
    "torch", reason="torch is not installed: memkernel[test] installs it on Python 3.11 only (its CPU build)")

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1)
ADD_2D = elementwise("arith.addf", "memref<?x?xf32>", "f32", 2)
STRIDED_ADD = elementwise("arith.addf", "memref<?xf32, strided<[?], offset: ?>>", "f32", 1)
FIRST_AND_SIZE = """func.func @first_and_size(%x: memref<?xf32>) -> (f32, index) {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<?xf32>
  %n = memref.dim %x, %c0 : memref<?xf32>
  return %v, %n : f32, index
}"""


def compiled(source: str, inputs: int = 2):
    function = (lambda a, b: None) if inputs == 2 else (lambda x: None)
    return with_fast_path(mlir_kernel(source)(function))


@pytest.fixture(scope="module")
def add():
    kernel = compiled(ADD)
    kernel(torch.ones(1), torch.ones(1))  # torch is imported: the compiled code reads tensors from now on
    return kernel


def test_out_tensors_run_in_compiled_code(add):
    a, b, c = torch.rand(16), torch.rand(16), torch.zeros(16)
    assert add(a, b, out=c) is c
    assert add.invoker.last_path == "fast"
    assert torch.equal(c, torch.add(a, b))


def test_an_allocating_call_on_tensors_returns_a_tensor_and_runs_in_compiled_code(add):
    a, b = torch.rand(7), torch.rand(7)
    got = add(a, b)
    assert add.invoker.last_path == "fast"
    assert type(got) is torch.Tensor and torch.equal(got, a + b)


def test_a_kernel_with_results_reads_tensors_in_compiled_code():
    kernel = compiled(FIRST_AND_SIZE, inputs=1)
    x = torch.arange(3, 8, dtype=torch.float32)
    assert kernel(x) == (3.0, 5)
    assert kernel(x) == (3.0, 5) and kernel.invoker.last_path == "fast"


def test_a_tensor_view_in_a_strided_layout_is_read_in_place_in_compiled_code():
    kernel = compiled(STRIDED_ADD)
    kernel(torch.ones(1), torch.ones(1))
    base = torch.zeros(12)
    kernel(torch.arange(4, dtype=torch.float32)[::1], torch.ones(8)[::2], out=base[1::3])
    assert kernel.invoker.last_path == "fast"
    expected = torch.zeros(12)
    expected[1::3] = torch.arange(4, dtype=torch.float32) + 1
    assert torch.equal(base, expected)


def test_a_transposed_tensor_for_an_identity_layout_is_left_to_the_checked_path_which_copies():
    kernel = compiled(ADD_2D)
    kernel(torch.ones(1, 1), torch.ones(1, 1))
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3).T
    got = kernel(a, torch.ones(3, 2))
    assert kernel.invoker.last_path == "checked"
    assert torch.equal(got, a + 1)


def test_an_expanded_tensor_of_2_to_the_62_elements_is_declined_and_numpy_cannot_view_it():
    kernel = compiled(ADD_2D)
    kernel(torch.ones(1, 1), torch.ones(1, 1))
    huge = torch.ones(1, 1).expand(2**31, 2**31)
    with pytest.raises(ArgumentError, match="argument 'a' .* through DLPack .*array is too big"):
        kernel(huge, huge)
    assert kernel.invoker.last_path == "checked"


@pytest.mark.parametrize("made", ["requires grad", "negative bit", "inference out"])
def test_tensors_the_checked_path_refuses_are_declined_by_the_compiled_code(add, made):
    a, b, out = torch.ones(3), torch.ones(3), torch.zeros(3)
    if made == "requires grad":
        a.requires_grad_()
    elif made == "negative bit":
        a = torch.tensor([1j, 2j, 3j], dtype=torch.complex64).conj().imag
    else:
        with torch.inference_mode():
            out = torch.zeros(3)
    with pytest.raises(ArgumentError):
        add(a, b, out=out)
    assert add.invoker.last_path == "checked"


def test_an_inference_tensor_is_read_in_compiled_code(add):
    with torch.inference_mode():
        a = torch.ones(3)
    got = add(a, torch.ones(3))
    assert add.invoker.last_path == "fast" and torch.equal(got, torch.full((3,), 2.0))


def test_a_tensor_subclass_takes_the_checked_path(add):
    class Sub(torch.Tensor):
        pass

    a = torch.ones(3).as_subclass(Sub)
    got = add(a, torch.ones(3))
    assert add.invoker.last_path == "checked" and torch.equal(got, torch.full((3,), 2.0))


def test_a_call_inside_a_torch_function_mode_computes_as_torch_does(add):
    """Inside a ``__torch_function__`` mode torch asks the mode what a tensor is: the compiled code's questions go
    through it too."""

    class Everything(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    a, b, c = torch.rand(4), torch.rand(4), torch.zeros(4)
    with Everything():
        assert add(a, b, out=c) is c
    assert torch.equal(c, a + b)


@pytest.mark.skipif(not HAS_ENTRIES, reason="Python 3.10 has no compiled entries")
def test_mixed_numpy_and_tensor_arguments_are_read_in_compiled_code_and_give_numpy(add):
    a = torch.arange(4, dtype=torch.float32)
    got = add(a, np.ones(4, np.float32))
    assert add.invoker.last_path == "fast"
    assert type(got) is np.ndarray and np.array_equal(got, (a + 1).numpy())


@pytest.mark.skipif(not HAS_ENTRIES, reason="Python 3.10 has no compiled entries")
def test_an_output_torch_allocates_in_compiled_code_is_zero_filled_before_a_kernel_accumulates():
    matmul = with_fast_path(mlir_kernel(MATMUL)(lambda a, b: None))
    matmul(torch.ones(1, 1), torch.ones(1, 1))
    for _ in range(20):  # torch reuses freed blocks: garbage would show
        a, b = torch.rand(5, 3), torch.rand(3, 4)
        got = matmul(a, b)
        assert matmul.invoker.last_path == "fast"
        assert type(got) is torch.Tensor and got.is_contiguous() and got.shape == (5, 4)
        torch.testing.assert_close(got, a @ b)
        del got


@pytest.mark.skipif(not HAS_ENTRIES, reason="Python 3.10 has no compiled entries")
def test_an_allocated_tensor_lives_on_its_own_after_the_call(add):
    got = add(torch.ones(3), torch.ones(3))
    clone = got.clone()
    got.add_(1)  # torch owns it: writable, freed by torch
    assert torch.equal(clone, torch.full((3,), 2.0)) and torch.equal(got, torch.full((3,), 3.0))


def test_a_mode_that_answers_a_flag_with_a_truthy_non_bool_is_declined_and_refused(add):
    """Only ``False`` itself lets the compiled code read a tensor; the checked path reads any answer's truth."""

    class Truthy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            answer = func(*args, **(kwargs or {}))
            return 1 if getattr(func, "__name__", "") == "is_neg" else answer

    with Truthy(), pytest.raises(ArgumentError, match="negative bit"):
        add(torch.ones(3), torch.ones(3))
    assert add.invoker.last_path == "checked"


def test_a_fake_tensor_takes_the_checked_path_which_refuses_it(add):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.ones(4)
    with pytest.raises(ArgumentError, match=re.escape("got a torch.Tensor whose storage is on device meta")):
        add(fake, torch.ones(4))
    assert add.invoker.last_path == "checked"


def test_a_kernel_with_callbacks_leaves_tensors_to_the_checked_path_which_holds_their_storage():
    kernel = with_fast_path(mlir_kernel("""
    func.func private @cb()
    func.func @copy(%x: memref<?xf32>, %y: memref<?xf32>) {
      func.call @cb() : () -> ()
      linalg.copy ins(%x : memref<?xf32>) outs(%y : memref<?xf32>)
      return
    }""", callbacks={"cb": lambda: None})(lambda x: None))
    x = torch.arange(5, dtype=torch.float32)
    kernel(x)
    assert torch.equal(kernel(x), x)
    assert kernel.invoker.last_path == "checked"
    np.testing.assert_array_equal(kernel(x.numpy()), x.numpy())
    assert kernel.invoker.last_path == "fast"
