"""kernel.as_torch_op(): a torch custom op whose fake comes from the shape rules, checked against torch."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.errors import ArgumentError, MemkernelError, ShapeError, SignatureError, ValueRangeError
from tests.kernels import (ADD, MATMUL, MATVEC_IN_PLACE, PAIRS, SCALE, SPREAD, TENSOR_ADD, TWO_RESULTS, UNRANKED_RANK,
                           copy)
from tests.test_stdio import run_threads
from tests.ufunc.test_gufunc import MATMUL_4X4_VECTOR

torch = pytest.importorskip("torch", reason="torch is not installed in this environment (the 3.11 venv has it)")

_names = itertools.count()


def op_name(base: str) -> str:
    """A fresh op name: torch keeps ops for the whole process."""
    return f"memkernel_tests::{base}_{next(_names)}"


def add_op():
    @mlir_kernel(ADD)
    def add(a, b):
        pass

    return add.as_torch_op(op_name("add"))


def matmul_op():
    @mlir_kernel(MATMUL)
    def matmul(a, b):
        pass

    return matmul.as_torch_op(op_name("matmul"))


def matvec_op():
    @mlir_kernel(MATVEC_IN_PLACE)
    def matvec(a, x, y):
        pass

    return matvec.as_torch_op(op_name("matvec"))


def scale_op():
    @mlir_kernel(SCALE)
    def scale(x: "n", s) -> "n":
        pass

    return scale.as_torch_op(op_name("scale"))


def pairs_op():
    @mlir_kernel(PAIRS)
    def pairs(x):
        return (x.shape[0] - 1,)

    return pairs.as_torch_op(op_name("pairs"))


def test_add_matches_torch_add():
    a, b = torch.randn(7), torch.randn(7)
    assert torch.equal(add_op()(a, b), a + b)


def test_op_is_reachable_through_torch_ops():
    name = op_name("add")

    @mlir_kernel(ADD)
    def add(a, b):
        pass

    add.as_torch_op(name)
    namespace, opname = name.split("::")
    a = torch.randn(4)
    assert torch.equal(getattr(getattr(torch.ops, namespace), opname)(a, a), a + a)


def test_matmul_matches_torch_matmul():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(matmul_op()(a, b), a @ b)


@pytest.mark.parametrize("make, args", [
    (add_op, lambda: (torch.randn(5), torch.randn(5))),
    (matmul_op, lambda: (torch.randn(3, 4), torch.randn(4, 2))),
    (matvec_op, lambda: (torch.randn(3, 4), torch.randn(4), torch.randn(3))),
    (scale_op, lambda: (torch.randn(6), 2.5)),
    (pairs_op, lambda: (torch.randn(6),)),
], ids=["add", "matmul", "in-place matvec", "scalar parameter", "shape function"])
def test_op_passes_opcheck(make, args):
    torch.library.opcheck(make(), args())


def test_in_place_kernel_declares_its_written_argument_and_writes_it():
    op = matvec_op()
    a, x, y = torch.randn(3, 4), torch.randn(4), torch.randn(3)
    expected = y + a @ x
    assert op(a, x, y) is None
    torch.testing.assert_close(y, expected)
    assert op._opoverload._schema.arguments[2].alias_info.is_write


def test_in_place_kernel_writes_a_strided_view_only_where_it_looks():
    y = torch.zeros(6)
    matvec_op()(torch.ones(3, 3), torch.ones(3), y[::2])
    assert torch.equal(y, torch.tensor([3.0, 0, 3, 0, 3, 0]))


def test_non_contiguous_inputs_match_torch():
    a, b = torch.randn(4, 3), torch.randn(5, 4)
    torch.testing.assert_close(matmul_op()(a.T, b.T), a.T @ b.T)


def test_scalar_parameter_is_a_float_in_the_schema():
    op = scale_op()
    x = torch.randn(5)
    torch.testing.assert_close(op(x, 3.0), x * 3.0)
    assert str(op._opoverload._schema.arguments[1].type) == "float"


def test_scalar_results_are_zero_dim_tensors():
    @mlir_kernel(TWO_RESULTS)
    def two(x, n):
        pass

    x, n = two.as_torch_op(op_name("two"))(1.5, 7)
    assert (x.dtype, x.shape, x.item()) == (torch.float64, (), 1.5)
    assert (n.dtype, n.shape, n.item()) == (torch.int32, (), 7)


def test_output_shaped_by_the_decorated_function():
    x = torch.arange(6.0)
    assert torch.equal(pairs_op()(x), x[:-1] + x[1:])


@pytest.mark.parametrize("element, dtype", [("bf16", "bfloat16"), ("i1", "bool"), ("ui16", "uint16"),
                                            ("complex<f32>", "complex64")])
def test_dtypes_travel_unchanged(element, dtype):
    x = torch.tensor([1, 0, 1], dtype=getattr(torch, dtype))
    op = mlir_kernel(copy(element))(lambda a: None).as_torch_op(op_name("copy"))
    out = op(x)
    assert out.dtype == x.dtype and torch.equal(out, x)


@pytest.mark.parametrize("element, dtype", [("bf16", "bfloat16"), ("i1", "bool"), ("complex<f32>", "complex64")])
def test_dtypes_pass_the_fake_under_torch_compile(element, dtype):
    x = torch.tensor([1, 0, 1], dtype=getattr(torch, dtype))
    op = mlir_kernel(copy(element))(lambda a: None).as_torch_op(op_name("copy"))
    assert torch.equal(torch.compile(lambda x: op(x), fullgraph=True)(x), x)


def test_conjugate_view_is_read_as_its_values():
    x = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    op = mlir_kernel(copy("complex<f32>"))(lambda a: None).as_torch_op(op_name("copy"))
    assert torch.equal(op(x), x.resolve_conj())


def test_tensor_requiring_grad_runs_forward_and_refuses_backward_without_a_formula():
    a = torch.randn(4, requires_grad=True)
    out = add_op()(a, a)
    torch.testing.assert_close(out, (a + a).detach())
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.sum().backward()


def test_register_autograd_pairs_a_backward():
    op = scale_op()

    def backward(ctx, grad):
        return op(grad, ctx.s), None

    def setup_context(ctx, inputs, output):
        ctx.s = inputs[1]

    op.register_autograd(backward, setup_context=setup_context)
    x = torch.randn(5, requires_grad=True)
    op(x, 2.5).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((5,), 2.5))


def test_meta_tensors_get_derived_shapes():
    out = matmul_op()(torch.empty(3, 4, device="meta"), torch.empty(4, 6, device="meta"))
    assert (out.device.type, out.shape) == ("meta", (3, 6))


@pytest.mark.parametrize("dynamic", [False, True])
def test_runs_inside_torch_compile_fullgraph(dynamic):
    op = matmul_op()
    compiled = torch.compile(lambda a, b: op(a, b) + 1, fullgraph=True, dynamic=dynamic)
    for m, k, n in [(3, 4, 5), (6, 2, 7)]:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.testing.assert_close(compiled(a, b), a @ b + 1)


def test_shape_function_runs_under_dynamic_shapes():
    op = pairs_op()
    compiled = torch.compile(lambda x: op(x) * 2, fullgraph=True, dynamic=True)
    for n in (6, 9):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), (x[:-1] + x[1:]) * 2)


def test_in_place_op_under_torch_compile_writes_its_argument():
    op = matvec_op()
    compiled = torch.compile(lambda a, x, y: op(a, x, y), fullgraph=True, dynamic=True)
    a, x, y = torch.randn(3, 4), torch.randn(4), torch.randn(3)
    expected = y + a @ x
    compiled(a, x, y)
    torch.testing.assert_close(y, expected)


def test_mismatched_tie_is_a_shape_error():
    with pytest.raises(ShapeError, match="a has 5 elements on dim 0 but b has 4"):
        add_op()(torch.ones(5), torch.ones(4))


def test_mismatched_tie_under_torch_compile_fails_at_trace_with_memkernels_error():
    op = matmul_op()
    compiled = torch.compile(lambda a, b: op(a, b), fullgraph=True, dynamic=True)
    with pytest.raises(Exception, match=r"ShapeError.*matmul\(\): a has s\d+ elements on dim 1 but b has s\d+"):
        compiled(torch.ones(3, 2), torch.ones(4, 5))


def test_fake_refuses_a_wrong_dtype_with_the_torch_cast():
    with pytest.raises(ArgumentError, match=r"argument 'a' expects memref<\?xf32> \(float32, 1-d\); got float64\[5\]\. "
                                            r"Pass a.to\(torch.float32\)\.$"):
        add_op()(torch.ones(5, dtype=torch.float64, device="meta"), torch.ones(5, device="meta"))


def test_wrong_dtype_is_an_argument_error_naming_the_cast():
    with pytest.raises(ArgumentError, match=r"got a torch.bfloat16 tensor of shape \(5,\)\. Pass a.to\(torch.float32\)"):
        add_op()(torch.ones(5, dtype=torch.bfloat16), torch.ones(5))


def test_wrong_rank_is_an_argument_error():
    with pytest.raises(ArgumentError, match=r"argument 'a' expects memref<\?xf32> \(float32, 1-d\); got float32\[2, 2\]"):
        add_op()(torch.ones(2, 2), torch.ones(2, 2))


def test_wrong_rank_in_the_fake_is_an_argument_error():
    with pytest.raises(ArgumentError, match=r"got float32\[2, 2\]\. Pass a with shape \(\*,\)\."):
        add_op()(torch.ones(2, 2, device="meta"), torch.ones(2, 2, device="meta"))


def test_calls_from_threads_agree_with_torch():
    op = add_op()
    a = torch.randn(1000)

    def work():
        for _ in range(100):
            torch.testing.assert_close(op(a, a), a + a)

    run_threads(*[work] * 4)


def test_same_name_returns_the_same_op():
    @mlir_kernel(ADD)
    def add(a, b):
        pass

    name = op_name("add")
    assert add.as_torch_op(name) is add.as_torch_op(name)


def test_name_of_another_kernels_op_is_refused():
    name = op_name("add")
    first = mlir_kernel(ADD, name="add")(lambda a, b: None)
    first.as_torch_op(name)
    other = mlir_kernel(MATMUL)(lambda a, b: None)
    with pytest.raises(SignatureError, match=rf"matmul.as_torch_op\('{name}'\): the op {name} already calls the "
                                             r"kernel @add; give this one another name\."):
        other.as_torch_op(name)


def test_name_of_a_torch_op_is_refused():
    with pytest.raises(SignatureError, match=r"torch already has an op aten::sin"):
        mlir_kernel(ADD, name="add")(lambda a, b: None).as_torch_op("aten::sin")


def test_name_without_namespace_is_refused():
    with pytest.raises(SignatureError, match=r"add.as_torch_op\('add'\): torch refuses the op"):
        mlir_kernel(ADD, name="add")(lambda a, b: None).as_torch_op("add")


def test_result_with_dynamic_dims_is_refused_at_registration():
    with pytest.raises(SignatureError, match=r"tadd.as_torch_op\('x::tadd'\): result 0 \(tensor<\?x\?xf32>\) has a dim "
                                             r"no rule gives"):
        mlir_kernel(TENSOR_ADD)(lambda a, b: None).as_torch_op("x::tadd")


def test_output_no_rule_shapes_is_refused_at_registration():
    with pytest.raises(SignatureError, match=r"spread.as_torch_op\('x::spread'\): output 'out' has a \? dim that "
                                             r"neither .* the op's output shape cannot be derived"):
        mlir_kernel(SPREAD)(lambda x: None).as_torch_op("x::spread")


def test_callbacks_are_refused_at_registration():
    source = """
    func.func private @log(f32)
    func.func @k(%x: f32) {
      func.call @log(%x) : (f32) -> ()
      return
    }"""
    kernel = mlir_kernel(source, callbacks={"log": lambda x: None})(lambda x: None)
    with pytest.raises(SignatureError, match=r"k.as_torch_op\('x::k'\): the kernel calls Python through callbacks="):
        kernel.as_torch_op("x::k")


def test_unranked_input_takes_any_rank():
    @mlir_kernel(UNRANKED_RANK)
    def rank(a):
        pass

    assert rank.as_torch_op(op_name("rank"))(torch.ones(2, 3, 4)).item() == 3


def test_errors_are_memkernel_errors():
    with pytest.raises(MemkernelError):
        add_op()(torch.ones(3), torch.ones(4))


def test_numpy_call_and_op_agree():
    @mlir_kernel(MATMUL)
    def matmul(a, b):
        pass

    a, b = np.random.rand(3, 4).astype(np.float32), np.random.rand(4, 2).astype(np.float32)
    op = matmul.as_torch_op(op_name("matmul"))
    np.testing.assert_array_equal(op(torch.from_numpy(a), torch.from_numpy(b)).numpy(), matmul(a, b))


def test_a_kernel_of_the_same_name_replaces_the_op_as_a_rerun_cell_does():
    name = op_name("add")
    mlir_kernel(ADD, name="add")(lambda a, b: None).as_torch_op(name)
    doubled = ADD.replace("arith.addf %x0, %x1", "arith.mulf %x0, %x1")
    op = mlir_kernel(doubled, name="add")(lambda a, b: None).as_torch_op(name)
    a = torch.arange(4.0)
    assert torch.equal(op(a, a), a * a)


def test_sparse_tensor_is_an_argument_error_naming_to_dense():
    with pytest.raises(ArgumentError, match=r"argument 'a' expects memref<\?xf32>; got a torch.sparse_coo tensor\. "
                                            r"A kernel reads dense memory: pass a.to_dense\(\)\."):
        add_op()(torch.ones(3).to_sparse(), torch.ones(3))


def test_zero_size_tensors():
    assert add_op()(torch.ones(0), torch.ones(0)).shape == (0,)


def test_scalar_defaults_are_in_the_schema():
    @mlir_kernel(SCALE)
    def scale(x: "n", s=2.0) -> "n":
        pass

    op = scale.as_torch_op(op_name("scale"))
    x = torch.arange(4.0)
    assert torch.equal(op(x), x * 2.0)
    assert "float s=2." in str(op._opoverload._schema)


@pytest.mark.parametrize("dynamic", [False, True])
def test_arguments_torch_compile_leaves_at_their_defaults_are_filled_in(dynamic):
    @mlir_kernel(SCALE)
    def scale(x: "n", s=2.0) -> "n":
        pass

    op = scale.as_torch_op(op_name("scale"))
    x = torch.arange(4.0)
    compiled = torch.compile(lambda x: op(x, 2.0), fullgraph=True, dynamic=dynamic)
    assert torch.equal(compiled(x), x * 2.0)


def test_int_scalar_out_of_range_is_memkernels_value_range_error():
    @mlir_kernel(TWO_RESULTS)
    def two(x, n):
        pass

    with pytest.raises(ValueRangeError, match=r"two\(\): argument 'n' expects i32: value 1099511627776 is out of "
                                              r"range for i32"):
        two.as_torch_op(op_name("two"))(1.5, 2**40)


def test_torch_vmap_runs_the_op_per_batch_element():
    a, b = torch.randn(5, 3, 4), torch.randn(5, 4, 2)
    torch.testing.assert_close(torch.vmap(matmul_op())(a, b), torch.bmm(a, b))


def test_fake_refuses_an_output_shape_past_a_bound():
    @mlir_kernel(PAIRS)
    def pairs(x):
        return (x.shape[0] + 1,)  # out would make the kernel read past x's end

    op = pairs.as_torch_op(op_name("pairs"))
    with pytest.raises(ShapeError, match=r"pairs\(\): x has 4 elements on dim 0 but @pairs's memref.load reaches"):
        op(torch.empty(4, device="meta"))


def test_input_that_is_also_the_written_argument_is_read_as_it_was():
    y = torch.tensor([3.0, 0.0, 3.0])
    expected = y + torch.ones(3, 3) @ y
    matvec_op()(torch.ones(3, 3), y, y)
    torch.testing.assert_close(y, expected)


def test_wrong_static_dim_is_a_shape_error_in_the_call_and_in_the_fake():
    op = mlir_kernel(MATMUL_4X4_VECTOR)(lambda a, b: None).as_torch_op(op_name("matmul4"))
    expected = r"argument 'a' expects memref<4x4xf32> \(float32, 2-d, dim 0 == 4, dim 1 == 4\); got float32\[4, 5\]: " \
               r"dim 1 is 5, not 4\. Pass "
    with pytest.raises(ShapeError, match=expected):
        op(torch.ones(4, 5), torch.ones(4, 4))
    with pytest.raises(ShapeError, match=expected):
        op(torch.ones(4, 5, device="meta"), torch.ones(4, 4, device="meta"))


def test_in_place_op_refuses_an_inference_tensor_outside_inference_mode_as_the_kernel_does():
    op = matvec_op()
    with torch.inference_mode():
        y = torch.zeros(2)
    with pytest.raises(ArgumentError, match=re.escape(
            "matvec(): argument 'y' expects memref<?xf32>; got a read-only torch.Tensor for an argument the kernel "
            "may write: it is an inference tensor, which torch forbids writing outside torch.inference_mode(). "
            "Pass y.clone(), or call the kernel inside inference mode.")):
        op(torch.ones(2, 3), torch.ones(3), y)
    assert torch.equal(y, torch.zeros(2))
    with torch.inference_mode():
        op(torch.ones(2, 3), torch.ones(3), y)
    assert torch.equal(y, torch.ones(2, 3) @ torch.ones(3))
