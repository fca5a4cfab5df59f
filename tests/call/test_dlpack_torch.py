"""torch tensors as arguments: zero-copy through DLPack, checked as numpy arrays are, and torch out, against torch."""

from __future__ import annotations

import concurrent.futures
import re

import numpy as np
import pytest

from memkernel import ArgumentError, DTypeError, mlir_kernel

from ..kernels import elementwise
from ..fastpath.conftest import with_fast_path
from ..processes import run_python

torch = pytest.importorskip(
    "torch", reason="torch is not installed: memkernel[test] installs it on Python 3.11 only (its CPU build)")

ADD = elementwise("arith.addf", "memref<?xf32>", "f32", 1)
ADD_2D = elementwise("arith.addf", "memref<?x?xf32>", "f32", 2)
ADD_BF16 = elementwise("arith.addf", "memref<?xbf16>", "bf16", 1)
SAME = """func.func @same(%a: memref<?xf32>) -> memref<?xf32> {
  return %a : memref<?xf32>
}"""


@pytest.fixture(scope="module", params=[ADD], ids=["1-d"])
def add(request):
    return mlir_kernel(request.param)(lambda a, b: None)


@pytest.fixture(scope="module", params=[ADD_2D], ids=["2-d"])
def add2d(request):
    return mlir_kernel(request.param)(lambda a, b: None)


def test_a_call_on_tensors_returns_a_tensor_equal_to_torch_add(add):
    a, b = torch.arange(16, dtype=torch.float32), torch.full((16,), 0.25)
    got = add(a, b)
    assert type(got) is torch.Tensor and got.dtype == torch.float32
    assert torch.equal(got, torch.add(a, b))


def test_out_takes_a_tensor_writes_it_in_place_and_returns_it(add):
    a, b, c = torch.arange(16, dtype=torch.float32), torch.ones(16), torch.zeros(16)
    assert add(a, b, out=c) is c
    assert torch.equal(c, a + b)


def test_a_returned_memref_aliasing_a_tensor_is_a_tensor_sharing_its_memory():
    same = mlir_kernel(SAME)(lambda a: None)
    a = torch.arange(4, dtype=torch.float32)
    got = same(a)
    assert type(got) is torch.Tensor and got.data_ptr() == a.data_ptr()
    got[0] = 7
    assert a[0] == 7


def test_mixed_torch_and_numpy_arguments_return_numpy(add):
    a = torch.arange(4, dtype=torch.float32)
    got = add(a, np.ones(4, np.float32))
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, (a + 1).numpy())


def test_a_numpy_out_in_a_torch_call_is_returned_as_given(add):
    c = np.zeros(4, np.float32)
    assert add(torch.ones(4), torch.ones(4), out=c) is c
    np.testing.assert_array_equal(c, np.full(4, 2, np.float32))


def test_a_float64_tensor_for_f32_is_a_dtype_error_naming_the_argument_and_the_fix(add):
    with pytest.raises(DTypeError, match=re.escape(
            "k(): argument 'b' expects memref<?xf32> (float32, 1-d); got torch.Tensor float64[3]. "
            "Pass b.to(torch.float32).")) as caught:
        add(torch.zeros(3), torch.zeros(3, dtype=torch.float64))
    assert isinstance(caught.value, TypeError)


@pytest.mark.parametrize("step", [2, 3])
def test_a_strided_tensor_view_as_out_is_written_back_leaving_the_rest(add, step):
    base = torch.full((16,), -1.0)
    view = base[::step][:4]
    add(torch.arange(4, dtype=torch.float32), torch.ones(4), out=view)
    expected = torch.full((16,), -1.0)
    expected[::step][:4] = torch.arange(4, dtype=torch.float32) + 1
    assert torch.equal(base, expected)


def test_transposed_tensors_are_read_and_written_as_torch_does(add2d):
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4).T
    b = torch.ones(4, 3)
    out = torch.zeros(3, 4).T
    add2d(a, b, out=out)
    assert torch.equal(out, a + b)


def test_an_expanded_stride_0_tensor_is_read_as_its_repeated_element(add2d):
    row = torch.arange(3, dtype=torch.float32).expand(4, 3)
    assert row.stride() == (0, 1)
    assert torch.equal(add2d(row, torch.ones(4, 3)), row + 1)


def test_a_tensor_that_requires_grad_is_an_error_that_says_detach(add):
    weights = torch.ones(3, requires_grad=True)
    for args, out, name in [((weights, torch.ones(3)), None, "a"), ((torch.ones(3), torch.ones(3)), weights, "out")]:
        with pytest.raises(ArgumentError, match=re.escape(
                f"argument '{name}' expects memref<?xf32>; got a torch.Tensor that requires grad: a kernel is not "
                f"differentiated by autograd, so torch does not share it. Pass {name}.detach().")):
            add(*args, out=out)


def test_a_subclass_that_lies_about_requires_grad_is_refused_all_the_same(add):
    class Lying(torch.Tensor):
        @property
        def requires_grad(self):
            return False

    out = torch.zeros(3, requires_grad=True).as_subclass(Lying)
    with pytest.raises(ArgumentError, match="requires grad"):
        add(torch.ones(3), torch.ones(3), out=out)


def test_a_subclass_whose_dlpack_lies_is_read_as_the_tensor_it_is(add):
    """torch's own C export reads a tensor, never the ``__dlpack__`` a subclass overrides."""
    class Garbage(torch.Tensor):
        def __dlpack__(self, **kwargs):
            return object()

    a = torch.arange(3, dtype=torch.float32).as_subclass(Garbage)
    assert torch.equal(add(a, torch.ones(3)).as_subclass(torch.Tensor), torch.arange(3, dtype=torch.float32) + 1)


@pytest.mark.parametrize("fast_path", ["1", "0"])
def test_a_torch_function_mode_that_resizes_an_argument_while_asked_cannot_free_what_a_call_reads(fast_path):
    """Asking a tensor its flags may run a mode's Python code: every argument is asked before any is read. In a
    subprocess: reading freed memory may crash."""
    shown = run_python(f"""
        import torch
        from memkernel import mlir_kernel

        add = mlir_kernel({ADD!r})(lambda a, b: None)
        add(torch.ones(1), torch.ones(1))
        base, b, out = torch.ones(4), torch.ones(4), torch.zeros(4)
        a = base[:4]  # shares base's storage
        asked = []

        class Resizing(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") == "is_neg":  # asked of each argument in turn
                    asked.append(func)
                    base.resize_(len(asked) << 20).fill_(len(asked))  # a new buffer each time, the old one freed
                return func(*args, **(kwargs or {{}}))

        with Resizing():
            add(a, b, out=out)
        print(len(asked) >= 2, torch.equal(out, a + b), out.tolist() == [len(asked) + 1.0] * 4)
    """, MEMKERNEL_FAST_PATH=fast_path)
    assert shown.split() == ["True", "True", "True"]


def test_a_tensor_with_its_negative_bit_set_is_refused_rather_than_read_negated(add):
    imaginary = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64).conj().imag
    assert imaginary.is_neg()
    with pytest.raises(ArgumentError, match=re.escape("with its negative bit set, whose memory holds the negated "
                                                      "values. Pass a.resolve_neg().")):
        add(imaginary, torch.ones(2))
    assert torch.equal(add(imaginary.resolve_neg(), torch.ones(2)), imaginary + 1)


def test_an_inference_tensor_is_read_only_outside_inference_mode(add):
    with torch.inference_mode():
        out = torch.zeros(3)
    with pytest.raises(ArgumentError, match=re.escape(
            "got a read-only torch.Tensor float32[3] as out=: it is an inference tensor, which torch forbids "
            "writing outside torch.inference_mode(). Pass out.clone()")):
        add(torch.ones(3), torch.ones(3), out=out)
    with torch.inference_mode():
        add(torch.ones(3), torch.ones(3), out=out)
    assert torch.equal(out, torch.full((3,), 2.0))


def test_a_tensor_on_the_meta_device_is_an_argument_error(add):
    with pytest.raises(ArgumentError, match="whose device memkernel cannot read"):
        add(torch.empty(3, device="meta"), torch.ones(3))


def test_bf16_tensors_compute_as_torch_does():
    add = mlir_kernel(ADD_BF16)(lambda a, b: None)
    a = torch.linspace(-3, 3, 11).to(torch.bfloat16)
    b = torch.full((11,), 0.125, dtype=torch.bfloat16)
    got = add(a, b)
    assert got.dtype == torch.bfloat16 and torch.equal(got, a + b)
    out = torch.zeros(22, dtype=torch.bfloat16)[::2]
    add(a, b, out=out)
    assert torch.equal(out, a + b)


def test_calls_from_threads_on_their_own_tensors_match_torch(add):
    def agree(seed: int) -> bool:
        generator = torch.Generator().manual_seed(seed)
        pairs = [(torch.rand(64, generator=generator), torch.rand(64, generator=generator)) for _ in range(200)]
        return all(torch.equal(add(a, b), a + b) for a, b in pairs)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert all(pool.map(agree, range(4)))


def test_temporaries_passed_to_a_call_live_until_it_returns(add):
    for n in range(1, 50):
        assert torch.equal(add(torch.arange(n, dtype=torch.float32), torch.ones(n)),
                           torch.arange(n, dtype=torch.float32) + 1)


def test_an_isolated_call_on_tensors_returns_a_tensor(add):
    isolated = mlir_kernel(ADD, isolate=True)(lambda a, b: None)
    a, b = torch.arange(4, dtype=torch.float32), torch.ones(4)
    got = isolated(a, b)
    assert type(got) is torch.Tensor and torch.equal(got, a + b)


@pytest.mark.parametrize("fast_path", ["1", "0"])
def test_a_callback_that_frees_a_tensors_storage_cannot_free_what_the_call_reads(fast_path):
    """A callback runs Python during the call, after the tensors are read: the call holds each tensor's storage, so
    ``x.set_()`` in the callback leaves the memory the kernel reads alive. In a subprocess: reading freed memory
    may crash."""
    shown = run_python("""
        import gc
        import torch
        from memkernel import mlir_kernel

        source = '''
        func.func private @cb()
        func.func @copy(%x: memref<?xf32>, %y: memref<?xf32>) {
          func.call @cb() : () -> ()
          linalg.copy ins(%x : memref<?xf32>) outs(%y : memref<?xf32>)
          return
        }'''
        x = torch.ones(1)
        junk = []

        def cb():
            x.set_()  # drops x's only reference to its storage
            gc.collect()
            junk.extend(torch.full((4096,), 7.0) for _ in range(8))

        copy = mlir_kernel(source, callbacks={"cb": cb})(lambda x: None)
        copy(torch.ones(1))  # torch is imported before the call that matters
        x = torch.ones(1 << 24)  # 64 MiB: freed with munmap
        y = copy(x)
        print(copy.invoker.last_path, torch.equal(y, torch.ones(1 << 24)))
    """, MEMKERNEL_FAST_PATH=fast_path)
    assert shown.split() == ["checked", "True"]


def _fake(*shape):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        return torch.ones(*shape)


FAKE = ("got a torch.Tensor whose storage is on device meta with data pointer 0x0 (a fake tensor of FakeTensorMode, "
        "or a meta tensor): it has no memory for a kernel to read or write. Pass a real tensor on the CPU.")


def test_a_fake_tensor_input_is_refused_rather_than_read_from_a_null_pointer(add):
    with pytest.raises(ArgumentError, match=re.escape(f"k(): argument 'a' expects memref<?xf32>; {FAKE}")):
        add(_fake(4), torch.ones(4))


def test_a_fake_tensor_as_out_is_refused_rather_than_written(add):
    with pytest.raises(ArgumentError, match=re.escape(f"k(): argument 'out' expects memref<?xf32>; {FAKE}")):
        add(torch.ones(4), torch.ones(4), out=_fake(4))


@pytest.mark.parametrize("fast_path", ["1", "0"])
def test_a_tensor_whose_storage_was_freed_under_it_is_refused_rather_than_read(fast_path):
    """Its data pointer is null: the compiled code declines it and the checked path refuses it. In a subprocess, as
    reading it crashes."""
    shown = run_python(f"""
        import torch
        from memkernel import ArgumentError, mlir_kernel

        add = mlir_kernel({ADD!r})(lambda a, b: None)
        add(torch.ones(1), torch.ones(1))
        x = torch.ones(4)
        x.untyped_storage().resize_(0)
        try:
            add(x, torch.ones(4))
        except ArgumentError as error:
            print(add.invoker.last_path, error)
    """, MEMKERNEL_FAST_PATH=fast_path)
    assert shown.strip() == ("checked k(): argument 'a' expects memref<?xf32>; got a torch.Tensor whose storage is on "
                             "device cpu with data pointer 0x0: it has no memory for a kernel to read or write. Pass a "
                             "real tensor on the CPU.")


def test_the_checked_path_refuses_a_tensor_whose_storage_shrank_under_it_rather_than_read_past_its_end():
    add = with_fast_path(mlir_kernel(ADD)(lambda a, b: None), enabled=False)
    x = torch.ones(1024)
    x.untyped_storage().resize_(16)
    with pytest.raises(ArgumentError, match=re.escape(
            "got a torch.Tensor whose storage holds 16 bytes, fewer than the 4096 its view reaches")):
        add(x, torch.ones(1024))
