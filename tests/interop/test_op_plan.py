"""What a kernel is as another library's op, read from its spec: no torch or JAX needed."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from memkernel import mlir_kernel
from memkernel.errors import ArgumentError, MissingDependencyError, ShapeError
from memkernel.interop.op_plan import op_plan, returns_nothing
from tests.kernels import MATMUL, MATVEC_IN_PLACE, PAIRS, TWO_RESULTS


def plan_of(kernel):
    return op_plan(kernel.spec, kernel.function, False, "test()")


def symbolic(*shape):
    """An array-like whose sizes are symbols, as torch's SymInts are under torch.compile."""
    return SimpleNamespace(shape=shape, dtype=np.dtype(np.float32))


def shape_of(value):
    return tuple(value.shape)


def test_tied_output_dims_are_the_inputs_sizes_themselves():
    plan = plan_of(mlir_kernel(MATMUL)(lambda a, b: None))
    assert plan.shapes([symbolic("m", "k"), symbolic("k", "n")], shape_of) == (("m", "n"),)


def test_output_shaped_by_the_function_gets_the_function_s_shape():
    plan = plan_of(mlir_kernel(PAIRS)(lambda x: (x.shape[0] - 1,)))
    assert plan.shapes([np.ones(6, np.float32)], shape_of) == ((5,),)


def test_scalar_results_are_zero_dim():
    plan = plan_of(mlir_kernel(TWO_RESULTS)(lambda x, n: None))
    assert [(r.dtype, r.shape) for r in plan.returned] == [(np.dtype(np.float64), ()), (np.dtype(np.int32), ())]


def test_written_parameters_are_named():
    assert plan_of(mlir_kernel(MATVEC_IN_PLACE)(lambda a, x, y: None)).written == ("y",)


def test_check_reads_the_library_s_dtype_and_names_its_cast():
    plan = plan_of(mlir_kernel(MATMUL)(lambda a, b: None))
    wrong = SimpleNamespace(shape=(2, 3), dtype=np.dtype(np.float64))
    with pytest.raises(ArgumentError, match=r"argument 'a' .*; got float64\[2, 3\]\. Pass CAST\(a, float32\)\.$"):
        plan.checked_shapes([wrong, symbolic(3, 4)], lambda v: v.dtype, shape_of, lambda n, d: f"CAST({n}, {d.name})")


def test_check_applies_the_ties():
    plan = plan_of(mlir_kernel(MATMUL)(lambda a, b: None))
    with pytest.raises(ShapeError, match="a has 3 elements on dim 1 but b has 4 on dim 0"):
        plan.checked_shapes([symbolic(2, 3), symbolic(4, 5)], lambda v: v.dtype, shape_of, lambda n, d: n)


@pytest.mark.parametrize("function, expected", [
    (lambda x: None, True),
    (lambda x: (x.shape[0],), False),
    (len, False),
])
def test_returns_nothing_reads_the_body(function, expected):
    assert returns_nothing(function) is expected


def test_a_body_of_a_docstring_and_pass_returns_nothing():
    def documented(x):
        """Only a docstring."""
        pass

    assert returns_nothing(documented)


@pytest.mark.parametrize("library, method", [("torch", "as_torch_op"), ("jax", "as_jax")])
def test_without_the_library_it_is_a_missing_dependency_error(monkeypatch, library, method):
    monkeypatch.setitem(sys.modules, library, None)
    for module in ("memkernel.interop.torch_op", "memkernel.interop.jax_function"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    kernel = mlir_kernel(MATMUL)(lambda a, b: None)
    call = getattr(kernel, method)
    with pytest.raises(MissingDependencyError, match=rf"matmul.{method}\(\) needs {library}, which cannot be "
                                                     rf"imported here .* pip install {library}"):
        call("x::y") if method == "as_torch_op" else call()


def test_an_output_the_function_shapes_past_a_bound_is_a_shape_error_before_the_call():
    plan = plan_of(mlir_kernel(PAIRS)(lambda x: (x.shape[0] + 1,)))
    with pytest.raises(ShapeError, match=r"pairs\(\): x has 4 elements on dim 0 but @pairs.s memref.load reaches up "
                                         r"to index 4 there \(out dim 0 = 5\); pass at least 5\."):
        plan.checked_shapes([np.ones(4, np.float32)], lambda v: v.dtype, shape_of, lambda n, d: n)
