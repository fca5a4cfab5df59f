"""Python called back from MLIR's C++: a walk's visitor and the attribute casters never abort the process."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlir import ir

from memkernel.errors import CompileError, SignatureError
from memkernel.analysis.ir_callbacks import walk
from memkernel.analysis.source import MLIR_LOCK, ParsedSource, parse_source

REPO = str(Path(__file__).resolve().parents[2])

COMPLEX_CONSTANT = """func.func @k() {
  %c = arith.constant dense<(1.0,5.0)> : tensor<3x3xcomplex<f32>>
  return
}"""


def _function(source: str) -> tuple[ParsedSource, ir.Operation]:
    """The parsed source (which keeps its module alive) and its @k."""
    parsed = parse_source(source)
    return parsed, parsed.function("k")


def test_a_complex_dense_constant_reads_as_a_dense_elements_attribute_without_aborting() -> None:
    # The bindings' own caster raised TypeError inside C++ here, and terminate() aborted the process.
    script = textwrap.dedent("""
        import sys
        from mlir import ir
        from memkernel.analysis.source import parse_source
        parsed = parse_source(sys.argv[1])
        with parsed.context:
            constant = parsed.function("k").regions[0].blocks[0].operations[0].operation
            value = constant.attributes[0].attr
            print(type(value).__name__, ir.ShapedType(value.type).element_type)
    """)
    run = subprocess.run([sys.executable, "-c", script, COMPLEX_CONSTANT], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["DenseElementsAttr", "complex<f32>"]


@pytest.mark.parametrize(("constant", "kind"), [("dense<1.5> : tensor<2xf32>", ir.DenseFPElementsAttr),
                                                 ("dense<[1, 2]> : tensor<2xi32>", ir.DenseIntElementsAttr),
                                                 ("dense<[1, 2]> : tensor<2xindex>", ir.DenseIntElementsAttr)])
def test_integer_and_float_dense_constants_keep_the_bindings_classes(constant: str, kind: type) -> None:
    parsed, function = _function(f"func.func @k() {{\n  %c = arith.constant {constant}\n  return\n}}")
    with MLIR_LOCK, parsed.context:
        assert type(function.regions[0].blocks[0].operations[0].attributes["value"]) is kind


def test_an_exception_in_a_visitor_is_a_compile_error_naming_the_op() -> None:
    parsed, function = _function(COMPLEX_CONSTANT)

    def visit(visited: ir.Operation) -> None:
        if visited.name == "arith.constant":
            raise TypeError("cannot read this")

    with MLIR_LOCK, parsed.context, pytest.raises(CompileError, match=re.escape(
            'memkernel failed reading the IR at arith.constant (loc("-":2:8)): TypeError: cannot read this')):
        walk(function, visit)


def test_a_memkernel_error_in_a_visitor_is_raised_as_it_is() -> None:
    parsed, function = _function(COMPLEX_CONSTANT)

    def visit(visited: ir.Operation) -> None:
        raise SignatureError("refused")

    with MLIR_LOCK, parsed.context, pytest.raises(SignatureError, match="^refused$"):
        walk(function, visit)


def test_a_visitor_stops_the_walk_by_returning_interrupt_and_sees_nothing_after() -> None:
    parsed, function = _function(COMPLEX_CONSTANT)
    seen: list[str] = []

    def visit(visited: ir.Operation) -> ir.WalkResult | None:
        seen.append(visited.name)
        return ir.WalkResult.INTERRUPT if visited.name == "arith.constant" else None

    with MLIR_LOCK, parsed.context:
        walk(function, visit, ir.WalkOrder.PRE_ORDER)
    assert seen == ["func.func", "arith.constant"]
