"""Every error memkernel raises: where it is raised, its classes and its message."""

from __future__ import annotations

import contextlib
import re
import sys

import numpy as np
import pytest

from memkernel import (
    ArgumentError,
    CompileError,
    DTypeError,
    MemkernelError,
    MissingDependencyError,
    MLIRSyntaxError,
    ShapeError,
    SignatureError,
    ValueRangeError,
    mlir_kernel,
)

from .kernels import loop_map

BUILTIN = {
    MLIRSyntaxError: ValueError,
    SignatureError: TypeError,
    CompileError: RuntimeError,
    ArgumentError: TypeError,
    DTypeError: TypeError,
    ShapeError: ValueError,
    ValueRangeError: ValueError,
    MissingDependencyError: ImportError,
}


@contextlib.contextmanager
def raises(error: type[MemkernelError], match: str):
    """pytest.raises(error, match=match), also checking the exception is a MemkernelError and its builtin."""
    with pytest.raises(error, match=match) as info:
        yield info
    assert isinstance(info.value, MemkernelError)
    assert isinstance(info.value, BUILTIN[error])


def esc(text: str) -> str:
    return re.escape(text)


@pytest.mark.parametrize("error, builtin", list(BUILTIN.items()), ids=lambda x: x.__name__)
def test_error_class_derives_from_memkernel_error_and_its_builtin(error, builtin):
    assert issubclass(error, MemkernelError)
    assert issubclass(error, builtin)
    with pytest.raises(builtin):
        raise error("message")


def decorate(source: str, body, **options):
    """Decorate ``body`` with the kernel ``@k`` of ``source`` (unless name= says otherwise)."""
    options.setdefault("name", "k")
    return mlir_kernel(source, **options)(body)


def none1(a):
    return None


# --------------------------------------------------------------------------------------
# MLIRSyntaxError, at decoration

PARSE_ERROR = """func.func @k(%a: memref<?xf32>) {
  return %a
}"""

VERIFY_ERROR = """func.func @k(%a: memref<?xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  %x = memref.load %a[%c0] : memref<?xf32>
  return
}"""


def _diagnostic_position(message: str) -> tuple[int, int]:
    found = re.search(r"^(\d+):(\d+): error: ", message, re.MULTILINE)
    assert found, message
    return int(found.group(1)), int(found.group(2))


def _assert_points_at_source(message: str, source: str, line: int, col: int) -> None:
    """The message quotes source line ``line`` and puts a caret under column ``col``."""
    lines = message.splitlines()
    header = next(i for i, text in enumerate(lines) if text.startswith(f"{line}:{col}: error: "))
    quoted, caret = lines[header + 1], lines[header + 2]
    assert quoted.strip() == source.splitlines()[line - 1].strip()
    indent = len(quoted) - len(source.splitlines()[line - 1])
    assert caret.rstrip() == " " * (indent + col - 1) + "^"


def test_parse_error_raises_mlir_syntax_error_at_decoration():
    with raises(MLIRSyntaxError, match="does not parse or verify"):
        decorate(PARSE_ERROR, none1)


def test_parse_error_message_points_at_line_and_column_with_a_caret():
    with raises(MLIRSyntaxError, match="error: ") as info:
        decorate(PARSE_ERROR, none1)
    line, col = _diagnostic_position(str(info.value))
    assert line == 2  # `return %a` lacks its type
    _assert_points_at_source(str(info.value), PARSE_ERROR, line, col)


def test_verifier_error_raises_mlir_syntax_error_at_decoration():
    with raises(MLIRSyntaxError, match=esc("'func.return' op has 0 operands")):
        decorate(VERIFY_ERROR, none1)


def test_verifier_error_message_points_at_the_offending_op():
    with raises(MLIRSyntaxError, match="error: ") as info:
        decorate(VERIFY_ERROR, none1)
    line, col = _diagnostic_position(str(info.value))
    assert (line, col) == (4, 3)  # the `return` on line 4, which starts at column 3
    _assert_points_at_source(str(info.value), VERIFY_ERROR, line, col)


# --------------------------------------------------------------------------------------
# SignatureError, at decoration

SEVERAL_FUNCTIONS = """
func.func private @declared(f32) -> f32
func.func @first(%a: memref<?xf32>) { return }
func.func @second(%a: memref<?xf32>) { return }
"""


def test_missing_function_lists_the_defined_functions():
    with raises(SignatureError, match=esc("no func.func @missing with a body") + ".*"
                + esc("functions defined: @first, @second.")):
        decorate(SEVERAL_FUNCTIONS, none1, name="missing")


def test_a_source_of_many_functions_lists_ten_and_counts_the_rest():
    source = "\n".join(f"func.func @f{i}(%a: memref<?xf32>) {{ return }}" for i in range(25))
    with raises(SignatureError, match=esc("functions defined: @f0, @f1, @f2, @f3, @f4, @f5, @f6, @f7, @f8, @f9 "
                                          "and 15 more. Pass name=")):
        decorate(source, none1, name="missing")
    with raises(SignatureError, match=esc("(defined: @f0, @f1, @f2, @f3, @f4, @f5, @f6, @f7, @f8, @f9 and 15 more)")):
        mlir_kernel(source)(lambda a: None)


def test_missing_function_does_not_list_a_declaration_without_body():
    with raises(SignatureError, match="functions defined") as info:
        decorate(SEVERAL_FUNCTIONS, none1, name="missing")
    assert "declared" not in str(info.value)


def test_naming_a_declaration_without_body_is_a_missing_function():
    with raises(SignatureError, match=esc("no func.func @declared with a body")):
        decorate(SEVERAL_FUNCTIONS, none1, name="declared")


def test_missing_function_defaults_to_the_python_function_name():
    def not_there(a):
        return None

    with raises(SignatureError, match=esc("no func.func @not_there with a body")):
        mlir_kernel(SEVERAL_FUNCTIONS)(not_there)


def test_missing_function_in_a_source_defining_none_says_none():
    with raises(SignatureError, match=esc("functions defined: none")):
        decorate("func.func private @declared(f32) -> f32", none1)


@pytest.mark.parametrize("element", ["i7", "i128", "tf32", "f80", "complex<f16>"])
@pytest.mark.parametrize("wrap", [pytest.param("memref<?x{}>", id="memref"), pytest.param("{}", id="scalar")])
def test_unsupported_element_type(element, wrap):
    arg_type = wrap.format(element)
    with raises(SignatureError, match=esc(f"@k argument #0 has type {arg_type}: element type "
                                          f"{element} is not supported")):
        decorate(f"func.func @k(%a: {arg_type}) {{ return }}", none1)


@pytest.mark.parametrize("shape", ["4x4", "?x?"])
def test_non_strided_affine_layout(shape):
    arg_type = f"memref<{shape}xf32, affine_map<(d0, d1) -> (d1, d0)>>"
    with raises(SignatureError, match=esc(f"@k argument #0 has type {arg_type}: its layout is not a strided layout")):
        decorate(f"func.func @k(%a: {arg_type}) {{ return }}", none1)


@pytest.mark.parametrize("arg_type", ["memref<?xf32, 1>", "memref<*xf32, 1>"])
def test_memref_in_a_memory_space(arg_type):
    with raises(SignatureError, match=esc(f"has type {arg_type}: memrefs in a memory space are not supported")):
        decorate(f"func.func @k(%a: {arg_type}) {{ return }}", none1)


def test_sparse_tensor_argument_is_refused():
    source = """#csr = #sparse_tensor.encoding<{ map = (i, j) -> (i : dense, j : compressed) }>
func.func @k(%a: tensor<4x4xf32, #csr>) { return }"""
    with raises(SignatureError, match=esc("has type tensor<4x4xf32, #sparse") + ".*"
                + esc("tensors with an encoding (sparse) are not supported.")):
        decorate(source, none1)


def test_tensor_argument_left_out_of_the_python_signature():
    source = "func.func @k(%a: tensor<?xf32>, %b: tensor<?xf32>) { return }"
    with raises(SignatureError, match=esc("k(): MLIR argument #1 (tensor<?xf32>) has no Python parameter. "
                                          "A tensor argument is an input")):
        decorate(source, none1)


def test_more_python_parameters_than_mlir_arguments():
    def k(a, b, c):
        return None

    source = "func.func @k(%a: memref<?xf32>, %n: i32) { return }"
    with raises(SignatureError, match=esc("k(): the Python function has 3 parameters but @k takes 2 arguments "
                                          "(memref<?xf32>, i32)")):
        mlir_kernel(source)(k)


def test_trailing_scalar_argument_left_out_of_the_python_signature():
    source = "func.func @k(%a: memref<?xf32>, %b: memref<?xf32>, %n: i32) { return }"
    with raises(SignatureError, match=esc("MLIR argument #2 (i32) has no Python parameter")):
        decorate(source, none1)


@pytest.mark.parametrize("variadic", ["args", "kwargs"])
def test_variadic_parameter_cannot_name_an_argument(variadic):
    def star(a, *args):
        return None

    def star_star(a, **kwargs):
        return None

    body, shown = {"args": (star, "*args"), "kwargs": (star_star, "**kwargs")}[variadic]
    source = "func.func @k(%a: memref<?xf32>, %b: memref<?xf32>) { return }"
    with raises(SignatureError, match=esc(f"parameter {shown} cannot name an MLIR argument")):
        decorate(source, body)


def test_parameter_named_out_clashes_with_out_keyword_of_a_kernel_with_outputs():
    def k(a, out):
        return None

    source = "func.func @k(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) { return }"
    with raises(SignatureError, match=esc("a parameter named 'out' clashes with the out= keyword")):
        mlir_kernel(source)(k)


I1_VECTOR_LOAD = """func.func @k(%a: memref<?xi1>) {
  %c0 = arith.constant 0 : index
  %v = vector.load %a[%c0] : memref<?xi1>, vector<8xi1>
  return
}"""

I1_LOAD = """func.func @k(%a: memref<?xi1>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %a[%c0] : memref<?xi1>
  return
}"""


def test_vector_load_on_an_i1_memref():
    with raises(SignatureError, match=esc("vector.load on an i1 memref")):
        decorate(I1_VECTOR_LOAD, none1)


def test_i1_memref_with_a_custom_pipeline():
    with raises(SignatureError, match=esc("memref.load uses an i1 memref, which only the preset pipelines support")):
        decorate(I1_LOAD, none1, pipeline="convert-func-to-llvm")


# --------------------------------------------------------------------------------------
# CompileError

TRIVIAL = "func.func @k(%a: memref<?xf32>) { return }"


@pytest.mark.parametrize("pipeline", ["no-such-pass", "builtin.module(canonicalize"])
def test_pipeline_that_does_not_parse_fails_at_decoration(pipeline):
    with raises(CompileError, match=esc("pipeline= does not parse as a pass pipeline")):
        decorate(TRIVIAL, none1, pipeline=pipeline)


def test_unknown_shared_library_fails_at_decoration():
    with raises(CompileError, match=esc("shared library 'no_such_library_xyz' not found") + ".*"
                + esc("memkernel[runtime]")):
        decorate(TRIVIAL, none1, shared_libs=["no_such_library_xyz"])


CALLS_UNDEFINED = """func.func private @no_such_fn(f32) -> f32
func.func @k(%a: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %x = memref.load %a[%c0] : memref<?xf32>
  %y = func.call @no_such_fn(%x) : (f32) -> f32
  memref.store %y, %a[%c0] : memref<?xf32>
  return
}"""


def test_undefined_external_function_decorates_fine():
    decorate(CALLS_UNDEFINED, none1)


def test_undefined_external_function_fails_compile_naming_the_symbol():
    k = decorate(CALLS_UNDEFINED, none1)
    with raises(CompileError, match=esc("@k calls no_such_fn, which no linked library defines")):
        k.compile()


def test_undefined_external_function_fails_at_the_first_call():
    k = decorate(CALLS_UNDEFINED, none1)
    with raises(CompileError, match=esc("no_such_fn")):
        k(np.zeros(3, np.float32))


def test_custom_pipeline_not_lowering_to_llvm_gives_mlir_reason():
    k = decorate(TRIVIAL, none1, pipeline="canonicalize")
    with raises(CompileError, match=esc("JIT compilation of @k failed") + "(.|\n)*"
                + esc("cannot be converted to LLVM IR")):
        k.compile()


I1_ATOMIC = """func.func @k(%a: memref<?xi1>, %v: i1) {
  %c0 = arith.constant 0 : index
  %x = memref.atomic_rmw ori %v, %a[%c0] : (i1, memref<?xi1>) -> i1
  return
}"""


def test_lowering_failure_is_a_compile_error_with_diagnostics():
    k = decorate(I1_ATOMIC, lambda a, v: None)
    with raises(CompileError, match="lowering failed:") as info:
        k.compile()
    message = str(info.value)
    line, col = _diagnostic_position(message)
    assert line == 3  # the atomic_rmw
    _assert_points_at_source(message, I1_ATOMIC, line, col)


COMPILE_FAILURES = [
    pytest.param(CALLS_UNDEFINED, {}, none1, "no_such_fn", id="undefined-symbol"),
    pytest.param(TRIVIAL, {"pipeline": "canonicalize"}, none1, "cannot be converted to LLVM IR", id="no-llvm"),
    pytest.param(I1_ATOMIC, {}, lambda a, v: None, "lowering failed", id="lowering"),
]


@pytest.mark.parametrize("source, options, body, reason", COMPILE_FAILURES)
def test_compile_error_is_raised_again_on_a_later_attempt(source, options, body, reason):
    k = decorate(source, body, **options)
    with raises(CompileError, match=esc(reason)):
        k.compile()
    with raises(CompileError, match=esc(reason)):
        k.compile()


# --------------------------------------------------------------------------------------
# ArgumentError, at call

MATMUL = """func.func @matmul(%a: memref<?x?xf32>, %b: memref<?x4xf32>, %c: memref<?x4xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x4xf32>) outs(%c : memref<?x4xf32>)
  return
}"""

MATMUL_SIGNATURE = ("matmul(a: memref<?x?xf32>, b: memref<?x4xf32>, *, "
                    "out: None | memref<?x4xf32> = None) -> memref<?x4xf32>: ")


@mlir_kernel(MATMUL)
def matmul(a, b):
    return (a.shape[0], 4)


@mlir_kernel(loop_map("scale", "f32", "%r = arith.mulf %v, %s : f32", scalar="%s: f32", in_place=True))
def scale(a, s):
    return None


TWO_OUTPUTS = """func.func @two(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) {
  linalg.copy ins(%a : memref<?xf32>) outs(%b : memref<?xf32>)
  linalg.copy ins(%a : memref<?xf32>) outs(%c : memref<?xf32>)
  return
}"""

TWO_SIGNATURE = "two(a: memref<?xf32>, *, out: None | memref<?xf32> | memref<?xf32> = None)"


@mlir_kernel(TWO_OUTPUTS)
def two(a):
    return None


A = np.ones((2, 3), np.float32)
B = np.ones((3, 4), np.float32)


@pytest.mark.parametrize("args, kwargs, problem", [
    pytest.param((A, B, A), {}, "takes 2 positional arguments but 3 were given", id="too-many"),
    pytest.param((A,), {}, "missing argument 'b'", id="too-few"),
    pytest.param((), {"b": B}, "missing argument 'a'", id="missing-first"),
    pytest.param((A,), {"b": B, "c": A}, "got an unexpected keyword argument 'c'", id="unknown-keyword"),
    pytest.param((A, B), {"a": A}, "got multiple values for argument 'a'", id="given-twice"),
])
def test_wrong_arguments_show_the_call_signature(args, kwargs, problem):
    with raises(ArgumentError, match="^" + esc(MATMUL_SIGNATURE + problem) + "$"):
        matmul(*args, **kwargs)


@pytest.mark.parametrize("b_dtype", [np.float64, np.int32, np.float16])
def test_wrong_dtype_is_a_dtype_error(b_dtype):
    b = np.ones((3, 5), b_dtype)
    got = f"got {np.dtype(b_dtype).name}[3, 5]"
    with raises(DTypeError, match=esc("matmul(): argument 'b' expects memref<?x4xf32> (float32")
                + ".*" + esc(got) + ".*" + esc("b.astype(np.float32)")):
        matmul(A, b)


def test_wrong_rank():
    with raises(ArgumentError, match=esc("matmul(): argument 'b' expects memref<?x4xf32> (float32, 2-d, dim 1 == 4); "
                                         "got float32[3]. Pass an array of shape (*, 4).")):
        matmul(A, np.ones(3, np.float32))


def test_non_native_byte_order():
    with raises(ArgumentError, match=esc("argument 'b' expects memref<?x4xf32>; got float32 (>f4, non-native byte order)")):
        matmul(A, np.ones((3, 4), ">f4"))


@pytest.mark.parametrize("value, shown", [("abc", "str"), ({}, "dict"), ({"x": 1.0}, "dict"), (None, "NoneType")])
def test_non_array_for_a_memref(value, shown):
    with raises(ArgumentError, match=esc(f"matmul(): argument 'b' expects memref<?x4xf32>; got {shown}")):
        matmul(A, value)


def test_list_for_an_argument_the_kernel_writes():
    with raises(ArgumentError, match=esc("scale(): argument 'a' expects memref<?xf32>; got list. It is an argument "
                                         "the kernel may write, so pass a writable numpy array of dtype float32.")):
        scale([1.0, 2.0], 2.0)


def test_read_only_array_for_an_argument_the_kernel_writes():
    x = np.ones(4, np.float32)
    x.flags.writeable = False
    with raises(ArgumentError, match=esc("argument 'a' expects memref<?xf32>") + ".*writable"):
        scale(x, 3.0)


def test_list_as_out():
    with raises(ArgumentError, match=esc("matmul(): argument 'out' expects memref<?x4xf32>; got list. It is an output")):
        matmul(A, B, out=[[0.0] * 4] * 2)


def test_read_only_array_as_out():
    out = np.zeros((2, 4), np.float32)
    out.flags.writeable = False
    with raises(ArgumentError, match=esc("matmul(): argument 'out' expects memref<?x4xf32>; "
                                         "got a read-only array float32[2, 4] as out=")):
        matmul(A, B, out=out)


def test_wrong_dtype_as_out():
    with raises(ArgumentError, match=esc("matmul(): argument 'out' expects memref<?x4xf32> (float32") + ".*"
                + esc("got float64[2, 4]")):
        matmul(A, B, out=np.zeros((2, 4)))


def test_out_given_to_a_kernel_without_outputs():
    with raises(ArgumentError, match=esc("scale(a: memref<?xf32>, s: f32): takes no out=: the kernel has no output arguments")):
        scale(np.ones(3, np.float32), 2.0, out=np.ones(3, np.float32))


@pytest.mark.parametrize("kernel, out, count, given", [
    pytest.param(matmul, (None, None), 1, 2, id="one-output"),
    pytest.param(two, (None,), 2, 1, id="two-outputs-short"),
    pytest.param(two, (None, None, None), 2, 3, id="two-outputs-long"),
])
def test_out_tuple_of_wrong_length(kernel, out, count, given):
    args = (A, B) if kernel is matmul else (np.ones(3, np.float32),)
    with raises(ArgumentError, match=esc(f"out= must hold {count} entries, one per output; got {given}")):
        kernel(*args, out=out)


def test_non_tuple_out_for_a_kernel_with_two_outputs():
    with raises(ArgumentError, match=esc(TWO_SIGNATURE) + ".*" + esc("has 2 outputs: pass out= as a tuple of 2 arrays (or None)")):
        two(np.ones(3, np.float32), out=np.zeros(3, np.float32))


def test_wrong_scalar_type():
    with raises(ArgumentError, match=esc("scale(): argument 's' expects f32: expects a real number for f32, got str")):
        scale(np.ones(3, np.float32), "2")


# --------------------------------------------------------------------------------------
# ValueRangeError, at call

SCALARS = "func.func @k(%a: memref<?xi8>, %x: i8, %f: f32) { return }"


@pytest.fixture(scope="module")
def scalars_kernel():
    return decorate(SCALARS, lambda a, x, f: None)


def test_integer_scalar_out_of_range(scalars_kernel):
    with raises(ValueRangeError, match=esc("k(): argument 'x' expects i8: value 300 is out of range for i8")):
        scalars_kernel(np.zeros(2, np.int8), 300, 1.0)


def test_float_scalar_that_overflows(scalars_kernel):
    with raises(ValueRangeError, match=esc("k(): argument 'f' expects f32: value 1e+39 overflows f32")):
        scalars_kernel(np.zeros(2, np.int8), 1, 1e39)


def test_list_with_values_out_of_range(scalars_kernel):
    with raises(ValueRangeError, match=esc("k(): argument 'a' expects memref<?xi8>; got list with values out of range for i8")):
        scalars_kernel([1, 1000], 1, 1.0)


# --------------------------------------------------------------------------------------
# MissingDependencyError, at decoration


def test_bf16_without_ml_dtypes(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # makes `import ml_dtypes` fail
    with raises(MissingDependencyError, match=esc("element type bf16 needs the optional package ml_dtypes")):
        decorate("func.func @k(%a: memref<?xbf16>) { return }", none1)


# --------------------------------------------------------------------------------------
# ShapeError, at call

ADD = """func.func @add(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  linalg.add ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  return
}"""


def test_static_dim_mismatch_names_the_dim_expected_and_got():
    with raises(ShapeError, match=esc("matmul(): argument 'b' expects memref<?x4xf32> (float32, 2-d, dim 1 == 4); "
                                      "got float32[3, 5]: dim 1 is 5, not 4.")):
        matmul(A, np.ones((3, 5), np.float32))


def test_static_dim_mismatch_of_out():
    with raises(ShapeError, match=esc("argument 'out' expects memref<?x4xf32>") + ".*" + esc("dim 1 is 5, not 4")):
        matmul(A, B, out=np.zeros((2, 5), np.float32))


def test_output_shape_not_derivable_when_no_input_has_the_pattern():
    k = decorate("func.func @k(%a: memref<?xf32>, %c: memref<?x?xf32>) { return }", none1)
    with raises(ShapeError, match=esc("k(): cannot derive the shape of output 'out' (memref<?x?xf32>): "
                                      "no input has that shape pattern") + ".*"
                + esc("Return the output shapes from the decorated function (e.g. `return (n, n)`), or pass out=.")):
        k(np.ones(3, np.float32))


# Nothing in this kernel ties its output to its inputs: only the decorated function can shape it.
UNTIED = "func.func @add(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) { return }"


def test_output_shape_not_derivable_when_inputs_disagree():
    k = decorate(UNTIED, lambda a, b: None, name="add")
    with raises(ShapeError, match=esc("the inputs of that shape pattern disagree: (2, 3), (3, 3)") + ".*"
                + esc("Return the output shapes from the decorated function")):
        k(np.ones((2, 3), np.float32), np.ones((3, 3), np.float32))


NOT_A_SHAPE = "add(): the decorated function returned {!r}; to give the output shapes it must return a shape " \
    "tuple, or None."
DOES_NOT_FIT = "add(): the decorated function gave shape {} for output 'out', which does not fit memref<?x?xf32>"


@pytest.mark.parametrize(("returned", "message"), [
    pytest.param((6,), DOES_NOT_FIT, id="rank-too-low"),
    pytest.param((2, 3, 1), DOES_NOT_FIT, id="rank-too-high"),
    pytest.param((2, -3), DOES_NOT_FIT, id="negative"),
    pytest.param("garbage", NOT_A_SHAPE, id="string"),
    pytest.param(42, NOT_A_SHAPE, id="int"),
    pytest.param((2.0, 3), NOT_A_SHAPE, id="float-dim"),
    pytest.param({"shape": (2, 3)}, NOT_A_SHAPE, id="dict"),
])
def test_decorated_function_returning_no_fitting_shape_is_a_shape_error_saying_what_it_gave(returned, message):
    k = decorate(UNTIED, lambda a, b: returned, name="add")
    with raises(ShapeError, match=esc(message.format(returned))):
        k(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))


def test_decorated_function_returning_a_shape_contradicting_a_static_dim():
    k = decorate("func.func @k(%a: memref<?xf32>, %c: memref<4x?xf32>) { return }", lambda a: (5, 3))
    with raises(ShapeError, match=esc("gave shape (5, 3) for output 'out', which does not fit memref<4x?xf32>")):
        k(np.ones(3, np.float32))


def test_decorated_function_returning_one_shape_for_two_outputs():
    untied = "func.func @two(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) { return }"
    k = decorate(untied, lambda a: (3,), name="two")
    with raises(ShapeError, match=esc("must return a tuple of 2 shape tuples (or None), or None.")):
        k(np.ones(3, np.float32))


def test_unranked_output_without_out():
    k = decorate("func.func @k(%a: memref<?xf32>, %c: memref<*xf32>) { return }", none1)
    with raises(ShapeError, match=esc("k(): output 'out' is memref<*xf32>, whose rank is unknown, so memkernel "
                                      "cannot allocate it. Pass out= with an array of dtype float32.")):
        k(np.ones(3, np.float32))


def test_unranked_output_with_out_is_accepted():
    k = decorate("func.func @k(%a: memref<?xf32>, %c: memref<*xf32>) { return }", none1)
    out = np.zeros((2, 2), np.float32)
    assert k(np.ones(3, np.float32), out=out) is out


def test_output_shape_hint_names_every_output_when_there_are_several():
    k = decorate("func.func @k(%a: memref<?xf32>, %c: memref<?x?xf32>, %d: memref<4xf32>) { return }", none1)
    with raises(ShapeError, match=esc("e.g. `return ((n, n), (4,))`")):
        k(np.ones(3, np.float32))


def test_f8_arithmetic_without_the_runtime_libraries_names_the_missing_routines(monkeypatch):
    import memkernel.load.libraries

    # As without memkernel[runtime]: no library, and not the process either (an earlier test
    # may have loaded the APFloat routines into it), defines them.
    monkeypatch.setattr(memkernel.load.libraries, "_defines", lambda path, symbol: False)
    source = """func.func @k(%a: f8E4M3FN, %b: f8E4M3FN) -> f8E4M3FN {
  %s = arith.addf %a, %b : f8E4M3FN
  return %s : f8E4M3FN
}"""
    kernel = decorate(source, lambda a, b: None, cache=False)
    with raises(CompileError, match=r"@k calls _mlir_apfloat_\w+.*which no linked library defines.*"
                                    r"the APFloat routines of f8 arithmetic\) come with: "
                                    + esc("pip install 'memkernel[runtime]'")):
        kernel.compile()


# -- errors found at decoration that came late, or as another library's exception -----------------------------

TWO_D = "func.func @k(%x: memref<?x?xf32>) { return }"


def _annotated(annotation: object):
    def k(x): ...

    k.__annotations__ = {"x": annotation}
    return k


def test_a_dim_annotation_past_int64_is_a_signature_error_at_decoration():
    with pytest.raises(SignatureError) as caught:
        mlir_kernel(TWO_D, name="k")(_annotated("99999999999999999999 N"))
    assert str(caught.value) == (
        "k(): parameter 'x' is annotated '99999999999999999999 N': dim 0 = 99999999999999999999 is past the "
        "largest size a dim can have (9223372036854775807, int64).")


@pytest.mark.parametrize("annotation", ["N,M", 3, ("N", "M"), ["N", "M"]], ids=["commas", "int", "tuple", "list"])
def test_an_annotation_that_is_not_a_dim_pattern_says_what_the_forms_are(annotation):
    with pytest.raises(SignatureError) as caught:
        mlir_kernel(TWO_D, name="k")(_annotated(annotation))
    assert str(caught.value) == (
        f"k(): parameter 'x' is annotated {annotation!r}: a dim pattern is names, numbers and _ separated by "
        "spaces, e.g. \"M K\", in one string (a tuple of such strings only as the return annotation, one per "
        "output).")


@pytest.mark.parametrize("memref", ["memref<4294967296x4294967296xi8>", "tensor<4611686018427387904x2xf32>"])
def test_a_type_whose_size_int64_cannot_count_is_a_signature_error_at_decoration(memref):
    with pytest.raises(SignatureError, match=re.escape(
            f"@k argument #0 has type {memref}: its static dims hold ")) as caught:
        mlir_kernel(f"func.func @k(%a: {memref}) {{ return }}", name="k")(lambda a: None)
    assert "more than an int64 size or stride can count (2**63 - 1 bytes)" in str(caught.value)


def test_a_lone_surrogate_in_the_source_is_a_syntax_error_naming_its_position():
    with pytest.raises(MLIRSyntaxError) as caught:
        mlir_kernel("func.func @k() {\n  return } // \udcff", name="k")(lambda: None)
    assert str(caught.value).startswith(
        "the MLIR source is not valid text: 2:15: character U+DCFF (a lone surrogate) cannot be encoded as UTF-8.")


RESOURCE = """
func.func @k(%o: memref<4xf32>) {{
  %g = arith.constant dense_resource<blob1> : tensor<4xf32>
  %m = bufferization.to_buffer %g : tensor<4xf32> to memref<4xf32>
  memref.copy %m, %o : memref<4xf32> to memref<4xf32>
  return
}}
{{-#
  dialect_resources: {{ builtin: {{ blob1: "0x04000000{data}" }} }}
#-}}"""


def test_a_dense_resource_constant_the_kernel_uses_compiles_and_gives_its_values():
    data = np.array([1, 2, 3, 4], "<f4").tobytes().hex()
    k = mlir_kernel(RESOURCE.format(data=data), name="k")(lambda: None)
    np.testing.assert_array_equal(k(), np.array([1, 2, 3, 4], np.float32))


def test_a_dense_resource_blob_of_the_wrong_size_is_a_syntax_error_at_decoration():
    with pytest.raises(MLIRSyntaxError) as caught:
        mlir_kernel(RESOURCE.format(data="0000803f"), name="k")(lambda: None)
    assert str(caught.value) == (
        "the MLIR source does not fit its resources:\n  3:8: error: dense_resource<blob1> is used as tensor<4xf32>, "
        "16 bytes, but its blob holds 4 bytes after its 4-byte alignment. Give the blob \"0x\" + 8 hex digits of "
        "alignment + 32 hex digits of data.")


ATOMIC = """
func.func @k(%a: memref<?x{t}>) {{
  %c0 = arith.constant 0 : index
  %x = memref.generic_atomic_rmw %a[%c0] : memref<?x{t}> {{
  ^bb0(%cur: {t}):
    %v = arith.constant 99{dot} : {t}
    memref.atomic_yield %v : {t}
  }}
  return
}}"""


def test_a_generic_atomic_rmw_that_yields_a_constant_compiles():
    k = mlir_kernel(ATOMIC.format(t="i32", dot=""), name="k")(lambda a: None)
    a = np.ones(4, np.int32)
    k(a)
    np.testing.assert_array_equal(a, [99, 1, 1, 1])


def test_a_generic_atomic_rmw_mlir_cannot_lower_is_a_compile_error_with_its_diagnostics():
    k = mlir_kernel(ATOMIC.format(t="f32", dot=".0"), name="k")(lambda a: None)
    with pytest.raises(CompileError) as caught:
        k(np.ones(4, np.float32))
    assert str(caught.value).startswith(
        "lowering failed:\n4:8: error: 'llvm.cmpxchg' op operand #1 must be signless integer or LLVM pointer type, "
        "but got 'f32'")


class _ClaimsHuge:
    """An object whose ``__array_interface__`` claims 2**40 elements over 4 real ones (stride 0)."""

    def __init__(self) -> None:
        self.array = np.ones(4, np.float32)

    @property
    def __array_interface__(self) -> dict:
        return {**self.array.__array_interface__, "shape": (1 << 40,), "strides": (0,)}


def test_mismatched_inputs_are_a_shape_error_before_any_output_is_allocated():
    add = mlir_kernel("""
func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}""")(lambda a, b: None)
    with pytest.raises(ShapeError) as caught:
        add(_ClaimsHuge(), np.ones(16, np.float32))
    assert str(caught.value) == (
        "add(): a has 1099511627776 elements on dim 0 but b has 16 on dim 0; @add's linalg.add needs them equal.")
