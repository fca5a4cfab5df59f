"""A kernel shows itself in Jupyter: ``_repr_html_``, read back with the stdlib's HTML parser."""

from __future__ import annotations

import inspect
from html.parser import HTMLParser

import numpy as np
import pytest

from memkernel import mlir_kernel

from .kernels import MATMUL, axpy

AXPY = axpy(in_place=True)

STATIC_MATMUL = """
func.func @mm4(%a: memref<?x4xf64>, %b: memref<4x?xf64>, %c: memref<?x?xf64>) {
  linalg.matmul ins(%a, %b : memref<?x4xf64>, memref<4x?xf64>) outs(%c : memref<?x?xf64>)
  return
}"""

TWO_OUTPUTS = """
func.func @split(%x: memref<?xi32>, %free: memref<?xi8>, %any: memref<*xf32>, %o1: memref<?xi32>,
                 %o2: memref<3x?xf32>) -> (index, memref<2xf32>) {
  memref.copy %x, %o1 : memref<?xi32> to memref<?xi32>
  %c0 = arith.constant 0 : index
  %n = memref.dim %x, %c0 : memref<?xi32>
  %r = memref.alloc() : memref<2xf32>
  return %n, %r : index, memref<2xf32>
}"""

TENSOR_ADD = """
func.func @add(%a: tensor<?xf32>, %b: tensor<?xf32>) -> tensor<?xf32> {
  %c = arith.addf %a, %b : tensor<?xf32>
  return %c : tensor<?xf32>
}"""


class _Table(HTMLParser):
    """The text of the caption, each row's cells (headers included), the summary and the ``<pre>``."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.titles: list[list[str | None]] = []
        self.text: dict[str, str] = {"caption": "", "summary": "", "pre": ""}
        self._cell: list[str] | None = None
        self._in: str | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
            self.titles.append([])
        elif tag in ("td", "th"):
            self._cell = []
            self.titles[-1].append(dict(attrs).get("title"))
        elif tag in self.text:
            self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == self._in:
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        elif self._in is not None:
            self.text[self._in] += data

    def row(self, first: str) -> list[str]:
        (found,) = [r for r in self.rows if r and r[0] == first]
        return found

    def fact(self, name: str) -> str:
        return self.row(name)[1]


def _table(kernel) -> _Table:
    return _Table(kernel._repr_html_())


def test_header_names_the_columns():
    table = _table(mlir_kernel(MATMUL)(lambda a, b: None))
    assert table.rows[0] == ["argument", "MLIR type", "dtype", "shape", "tied to", "role"]


def test_caption_names_the_kernel():
    assert _table(mlir_kernel(MATMUL)(lambda a, b: None)).text["caption"] == "memkernel.Kernel @matmul"


def test_named_dims_label_the_shapes_and_the_allocated_output():
    @mlir_kernel(MATMUL)
    def matmul(a: "M K", b: "K N") -> "M N":  # noqa: F821
        return None

    table = _table(matmul)
    assert table.row("a") == ["a", "memref<?x?xf32>", "float32", "(M, K)", "dim 0 = out dim 0; dim 1 = b dim 0",
                              "input"]
    assert table.row("b")[3:] == ["(K, N)", "dim 0 = a dim 1; dim 1 = out dim 1", "input"]
    assert table.row("out")[3:] == ["(M, N)", "dim 0 = a dim 0; dim 1 = b dim 1", "output (allocated, or out=)"]


def test_ties_read_from_the_ir_get_d_labels_and_their_reason():
    table = _table(mlir_kernel(MATMUL)(lambda a, b: None))
    assert [table.row(n)[3] for n in ("a", "b", "out")] == ["(d0, d1)", "(d1, d2)", "(d0, d2)"]
    titles = dict(zip((r[0] for r in table.rows if r), (t for r, t in zip(table.rows, table.titles) if r)))
    assert titles["a"][4] == "@matmul's linalg.matmul"


def test_a_dim_tied_to_a_static_dim_shows_the_size():
    table = _table(mlir_kernel(STATIC_MATMUL)(lambda a, b: None))
    assert table.row("a")[3] == "(d0, 4)"
    assert table.row("b")[3] == "(4, d1)"
    assert table.row("out")[2:4] == ["float64", "(d0, d1)"]


def test_a_dim_fixed_by_an_annotation_shows_the_size_and_why():
    @mlir_kernel(AXPY)
    def axpy(alpha, x: "8", y):
        return None

    table = _table(axpy)
    assert table.row("x")[3:5] == ["(8,)", "dim 0 = y dim 0; dim 0 = 8 (its annotation '8')"]
    assert table.row("y")[3] == "(8,)"


def test_in_place_scalar_and_written_roles():
    table = _table(mlir_kernel(AXPY)(lambda alpha, x, y: None))
    assert table.row("alpha") == ["alpha", "f64", "float64", "scalar", "", "input (scalar)"]
    assert table.row("x")[5] == "input"
    assert table.row("y")[3:] == ["(d0,)", "dim 0 = x dim 0", "written in place"]


def test_several_outputs_free_dims_unranked_and_results():
    table = _table(mlir_kernel(TWO_OUTPUTS)(lambda x, free, any: None))
    assert table.row("x")[3:] == ["(d0,)", "dim 0 = out[0] dim 0", "input"]
    assert table.row("free")[2:] == ["int8", "(?,)", "", "input"]
    assert table.row("any")[1:4] == ["memref<*xf32>", "float32", "any rank"]
    assert table.row("out[0]")[1:] == ["memref<?xi32>", "int32", "(d0,)", "dim 0 = x dim 0",
                                       "output (allocated, or out=)"]
    assert table.row("out[1]")[2:4] == ["float32", "(3, ?)"]
    assert table.row("result 0") == ["result 0", "index", "int64", "scalar", "", "result"]
    assert table.row("result 1") == ["result 1", "memref<2xf32>", "float32", "(2,)", "", "result"]


def test_tensor_arguments_are_inputs():
    table = _table(mlir_kernel(TENSOR_ADD)(lambda a, b: None))
    assert table.row("a")[5] == "input (tensor)"
    assert table.row("result 0")[1] == "tensor<?xf32>"


def test_pipeline_and_options_are_shown():
    kernel = mlir_kernel(MATMUL, pipeline="fast", opt_level=2)(lambda a, b: None)
    assert _table(kernel).fact("pipeline") == "fast, opt_level=2"
    assert _table(mlir_kernel(MATMUL)(lambda a, b: None)).fact("pipeline") == "default, opt_level=3"


def test_compile_state_and_time_follow_compilation():
    kernel = mlir_kernel(AXPY, cache=False)(lambda alpha, x, y: None)
    assert not kernel.compiled
    assert _table(kernel).fact("state").startswith("not compiled yet")
    x, y = np.arange(5.0), np.ones(5)
    kernel(2.0, x, y)
    np.testing.assert_array_equal(y, 2.0 * np.arange(5.0) + 1)
    assert kernel.compiled
    state = _table(kernel).fact("state")
    milliseconds = float(state.split(" in ")[1].split(" ms")[0])
    assert milliseconds > 0 and state.startswith("compiled in ")
    assert state.endswith("(fast path)") == (kernel.invoker.fast is not None)


def test_source_is_escaped_collapsed_and_round_trips():
    kernel = mlir_kernel(MATMUL)(lambda a, b: None)
    html = kernel._repr_html_()
    assert "memref<" not in html and "memref&lt;?x?xf32&gt;" in html
    assert "<details><summary>" in html
    table = _Table(html)
    assert table.text["pre"] == MATMUL
    assert table.text["summary"] == f"MLIR source ({MATMUL.count(chr(10)) + 1} lines)"


def test_html_special_characters_in_names_and_reasons_are_escaped():
    kernel = mlir_kernel(MATMUL)(lambda a, b: None)
    html = kernel._repr_html_()
    assert "@matmul&#x27;s linalg.matmul" in html and "'s linalg" not in html


def test_repr_stays_plain_text():
    kernel = mlir_kernel(MATMUL)(lambda a, b: None)
    assert repr(kernel) == f"<memkernel.Kernel matmul{inspect.signature(kernel)}>"


@pytest.mark.parametrize("source, function", [
    (MATMUL, lambda a, b: None),
    (AXPY, lambda alpha, x, y: None),
    (TWO_OUTPUTS, lambda x, free, any: None),
    (TENSOR_ADD, lambda a, b: None),
])
def test_every_argument_and_result_has_a_row_of_six_cells(source, function):
    kernel = mlir_kernel(source)(function)
    table = _table(kernel)
    results = [f"result {j}" for j in range(len(kernel.spec.signature.results))]
    body = [r for r in table.rows[1:] if r[0] not in ("pipeline", "state")]
    assert [r[0] for r in body] == list(kernel.spec.argument_names) + results
    assert all(len(r) == 6 for r in body)
