"""The notebooks run top to bottom in a real Jupyter kernel, and what their key cells show is what they teach.

Each notebook is executed once per test module with nbclient (an ipykernel subprocess, which inherits the
session's private disk cache from ``conftest.py``). The tutorial's code cells carry a tag in their metadata
(``"tags": ["shape-error"]``) so the checks find their cell by topic, not by position, and new sections can be
inserted anywhere.
"""

from __future__ import annotations

import base64
import re
from importlib.util import find_spec
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def execute(name: str, folder: Path) -> nbformat.NotebookNode:
    """The notebook run in ``folder`` (its kernel's working directory), so what it writes (hypothesis's
    ``.hypothesis`` folder) stays out of the repository. A cell that raises does not stop the run: the error is
    in its outputs, where the tests find it, and the other sections are still checked."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=180, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return notebook


def code_cells(notebook: nbformat.NotebookNode) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def stream_text(cell) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []) if output["output_type"] == "stream")


def errors(cells) -> list[str]:
    """Each error a cell raised, with the cell's tag (or its first line)."""
    return [f"{(cell.metadata.get('tags') or cell.source.splitlines())[0]!r}: {output['ename']}: {output['evalue']}"
            for cell in cells for output in cell.get("outputs", []) if output["output_type"] == "error"]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    return code_cells(execute("quickstart.ipynb", tmp_path_factory.mktemp("quickstart")))


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    return execute("tutorial.ipynb", tmp_path_factory.mktemp("tutorial"))


@pytest.fixture(scope="module")
def tagged(tutorial):
    """The tutorial's code cells by their tag."""
    cells = {}
    for cell in code_cells(tutorial):
        for tag in cell.metadata.get("tags", []):
            assert tag not in cells, f"two cells tagged {tag!r}"
            cells[tag] = cell
    return cells


def lines(tagged, tag: str) -> list[str]:
    return stream_text(tagged[tag]).splitlines()


# -- committed clean -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["quickstart.ipynb", "tutorial.ipynb"])
def test_notebook_is_committed_without_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(notebook)
    for cell in code_cells(notebook):
        assert cell.outputs == [] and cell.execution_count is None, f"{name}: a cell has outputs: {cell.source[:60]!r}"


# -- quickstart ------------------------------------------------------------------------


def test_every_cell_runs_and_matches_numpy(quickstart):
    assert errors(quickstart) == []
    assert stream_text(quickstart[1]).count("matches numpy: True") == 1
    assert stream_text(quickstart[2]) == "matches numpy: True\n"


def test_kernel_output_shows_in_the_cell_in_order(quickstart):
    lines = stream_text(quickstart[3]).splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert "[0,  1,  2,  3]" in lines


def test_argument_error_is_shown_with_its_fix(quickstart):
    assert "Pass a.astype(np.float32)" in stream_text(quickstart[4])


# -- tutorial --------------------------------------------------------------------------


def test_every_tutorial_cell_runs_without_error(tutorial):
    cells = code_cells(tutorial)
    assert errors(cells) == []
    assert all(cell.execution_count is not None for cell in cells)


def test_first_kernel_matches_numpy(tagged):
    assert lines(tagged, "first-kernel")[1:] == ["add(x, y) = [0.5 1.5 2.5 3.5 4.5]", "matches numpy: True"]


def test_matmul_output_is_allocated_from_the_tied_dims(tagged):
    assert lines(tagged, "matmul-allocates") == ["c: float32 (4, 5)", "matches numpy: True"]


def test_wrong_size_call_shows_the_shape_error_naming_the_op(tagged):
    assert lines(tagged, "shape-error") == [
        "matmul(): a has 3 elements on dim 1 but b has 4 on dim 0; @matmul's linalg.matmul needs them equal."]


def test_shape_function_gives_the_output_shape_the_ir_does_not(tagged):
    assert lines(tagged, "shape-function") == ["evens(seven) = [0. 2. 4. 6.]", "matches numpy: True"]


def test_named_dims_tie_and_their_mismatch_is_shown(tagged):
    shown = lines(tagged, "named-dims")
    assert shown[0] == "<memkernel.Kernel scale(x: memref<?xf64> (N), s: f64, y: memref<?xf64> (N))>"
    assert shown[1] == "y = [0.  2.5 5.  7.5]"
    assert shown[2] == "scale(): N is 4 from x but 3 from y (dims 0 and 0); every dim named N must have one size."


def test_named_output_dims_are_taken_from_the_inputs(tagged):
    assert lines(tagged, "named-output")[-1] == "matches numpy: True"


def test_out_is_returned_and_accumulated_into(tagged):
    assert lines(tagged, "out") == ["returns out itself: True", "c == 1 + a @ b: True"]


def test_zero_copy_only_where_the_layout_allows_it(tagged):
    flags = [line.split()[-1] for line in lines(tagged, "zero-copy")]
    assert flags == ["True", "False", "True"]


def test_views_and_overlapping_out_match_numpy(tagged):
    assert lines(tagged, "views")[-1] == "matches numpy: True"
    assert lines(tagged, "overlap")[-1] == "overlapping out= matches numpy: True"


def test_tensor_function_and_returned_memrefs(tagged):
    assert lines(tagged, "tensor")[-1] == "hypot = [ 5. 13. 17. 25.] · matches numpy: True"
    assert lines(tagged, "returned") == ["squares(6) = [ 0  1  4  9 16 25] int64",
                                         "first_row(grid[1:, ::2]) = [4. 6.] · a view of grid: True"]


def test_callback_prints_in_the_cell_and_its_writes_reach_the_array(tagged):
    assert lines(tagged, "callbacks") == ["row 0: [0. 1. 2.]", "row 1: [3. 4. 5.]",
                                          "after the call: [[0.0, 10.0, 20.0], [30.0, 40.0, 50.0]]"]


def test_printed_memref_and_vector_show_in_the_cell_in_order(tagged):
    shown = lines(tagged, "printed")
    assert shown[0] == "before" and shown[-1] == "after"
    assert shown[2:5] == ["[[0,   1,   2], ", " [3,   4,   5]]", "( 0, 1, 2 )"]


def test_each_error_is_shown_with_its_builtin_and_message(tagged):
    shown = stream_text(tagged["errors"])
    for expected in (
        "DTypeError (TypeError): add(): argument 'b' expects memref<?xf32> (float32, 1-d); got float64[5]. "
        "Pass b.astype(np.float32).",
        "ArgumentError (TypeError): add(): argument 'b' expects memref<?xf32> (float32, 1-d); got float32[5, 1].",
        "missing argument 'b'",
        "ArgumentError (TypeError): add(): argument 'out' expects memref<?xf32>; got a read-only array",
        "ShapeError (ValueError): add(): a has 5 elements on dim 0 but b has 4 on dim 0",
        "ValueRangeError (ValueError): clamp(): argument 'limit' expects i8: value 300 is out of range",
        "CompileError (RuntimeError): @calls_nothing calls not_defined_anywhere, which no linked library defines.",
    ):
        assert expected in shown
    assert shown.count("\n\n") == 7  # one report per attempt: none of them passed silently
    syntax = stream_text(tagged["syntax-error"])
    assert "5:19: error: use of value '%v' expects different type than prior uses: 'f64' vs 'f32'" in syntax


def test_ir_stages_show_linalg_then_loops_then_llvm(tagged):
    shown = stream_text(tagged["ir"])
    assert shown.count("linalg.add ins(") == 1  # the input stage; the loops stage has none
    assert "memref.load" in shown and "cf.cond_br" in shown
    assert "llvm.func @_mlir_ciface_add(" in shown


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_kernel_renders_itself_as_html(tagged):
    (result,) = [o for o in tagged["html"].outputs if o["output_type"] == "execute_result"]
    page = _Cells()
    page.feed(result["data"]["text/html"])
    assert {"table", "details"} <= set(page.tags)
    text = "".join(page.text)
    assert "@matmul" in text and "memref<?x?xf32>" in text
    assert result["data"]["text/plain"].startswith("<memkernel.Kernel matmul(")


def test_torch_op_section_matches_torch_or_says_torch_is_missing(tagged):
    if find_spec("torch") is None:
        assert lines(tagged, "torch-op") == [
            "torch is not installed here (pip install torch): this section shows nothing."]
        return
    assert lines(tagged, "torch-op") == [
        "eager matches torch: True", "compiled matches torch: True", "and at another size: True",
        "fake output: torch.Size([7, 2])", "opcheck: {'SUCCESS'}",
        "ShapeError: matmul(): a has 3 elements on dim 1 but b has 4 on dim 0; @matmul's linalg.matmul needs them "
        "equal."]


def test_fast_pipeline_vectorizes_the_matmul_into_fmas(tagged):
    default, fast, matches = lines(tagged, "fast")
    assert "'linalg.matmul': 1" in default and "'vector.fma': 0," in default
    assert "'linalg.matmul': 0" in fast and int(re.search(r"'vector.fma': (\d+)", fast).group(1)) > 0
    assert matches == "fast matmul matches numpy: True"


def test_testing_helpers_pass_and_their_failures_read(tagged):
    shown = stream_text(tagged["testing"])
    assert "assert_matches: fast_matmul matches np.matmul\n" in shown
    assert 'check_equivalent: "fast" computes what "default" computes on 25 drawn examples\n' in shown
    assert "output 'out' differs from the reference in 2100 of 2100 elements" in shown
    failure = stream_text(tagged["equivalence-failure"])
    assert failure.startswith("check_equivalent(unrolled against linalg): the kernels differ on this example")
    shrunk = re.search(r"x = array\(\[([^\]]*)\]", failure).group(1)
    assert len(shrunk.split(",")) % 2 == 1  # the planted bug needs an odd length
    assert "output 'out' differs from the reference" in failure


def test_a_loop_past_the_end_is_refused_and_a_checked_kernel_stops_at_a_computed_index(tagged):
    shown = stream_text(tagged["checked"])
    assert shown.startswith("ShapeError: shift_left(): x has 5 elements on dim 0 but @shift_left's memref.load "
                            "reaches up to index 5 there (out dim 0 = 5); pass at least 6.\n")
    assert "\ngather(x, [4, 0]) = [4. 0.]\n" in shown
    assert "KernelAssertionError: gather(): the kernel stopped at a failed assertion:" in shown
    assert "^ out-of-bounds access" in shown and "%v = memref.load %x[%j] : memref<?xf32>" in shown
    assert "\nsafe_div(7, 2) = 3\n" in shown
    assert "KernelAssertionError: safe_div(): the kernel stopped at a failed assertion:\ndivision by zero" in shown


def test_isolated_crash_is_an_exception_and_the_kernel_survives(tagged):
    shown = lines(tagged, "isolate")
    assert shown[0] == "after scale_in_place(values[::2], 10): [ 0.  1. 20.  3. 40.  5.]"
    assert shown[1].startswith("KernelCrashed: poke(address=8, value=1.0): the worker process")
    assert "killed by SIGSEGV" in shown[1]
    assert shown[-1] == "this process is still here"


def test_an_llvm_abort_while_compiling_is_a_compile_error_and_llvm_options_fix_it(tagged):
    shown = stream_text(tagged["compile-worker"])
    assert shown.startswith("CompileError: compiling @transpose crashed the compile worker: it was killed by SIGABRT")
    assert "LLVM ERROR: Do not know how to widen the result of this operator!" in shown
    assert shown.endswith("\nwith -enable-matrix, matches numpy: True\n")


def test_dask_matmul_is_chunked_from_the_ir_and_matches_numpy(tagged):
    shown = lines(tagged, "dask")
    assert "indices=('ab', 'bc', 'ac'), reductions=frozenset({'b'})" in shown[0]
    assert shown[2] == "dask matmul matches numpy: True"
    assert shown[-1].startswith("ChunkingError: apply(@outer): memkernel cannot tell from the IR which dims")


def png_images(cell) -> list[bytes]:
    return [base64.b64decode(output["data"]["image/png"]) for output in cell.outputs
            if output["output_type"] == "display_data" and "image/png" in output.get("data", {})]


def timings(text: str, unit: str) -> list[float]:
    return [float(value) for value in re.findall(rf"(\d+\.\d+) {unit}", text)]


@pytest.mark.parametrize(("tag", "described", "unit", "n_timings"), [
    pytest.param("plot-add", "2 axes, 13 sizes from 16 to 10000000 elements", "µs", 4, id="add-over-16-to-10M"),
    pytest.param("plot-matmul", "1 axes, 5 sizes", "GFLOP/s", 10, id="matmul-gflops"),
])
def test_a_performance_plot_is_drawn_with_its_timings(tagged, tag, described, unit, n_timings):
    cell = tagged[tag]
    (image,) = png_images(cell)
    assert image.startswith(PNG_SIGNATURE)
    shown = stream_text(cell)
    assert described in shown
    measured = timings(shown, unit)
    assert len(measured) == n_timings and all(t > 0 for t in measured)


def test_torch_tensors_come_back_as_tensors_and_errors_speak_torch(tagged):
    pytest.importorskip("torch", reason="torch is not installed: memkernel[test] installs it on Python 3.11 only")
    shown = lines(tagged, "torch-tensors")
    assert shown[:3] == ["Tensor [0.5, 1.5, 2.5, 3.5, 4.5] matches torch: True", "out= returns the tensor itself: True",
                         "mixed with numpy, numpy comes back: ndarray"]
    assert shown[3] == ("DTypeError: add(): argument 'a' expects memref<?xf32> (float32, 1-d); got torch.Tensor "
                        "float64[5]. Pass a.to(torch.float32).")
    assert shown[4].startswith("ArgumentError: add(): argument 'out' expects memref<?xf32>; got a torch.Tensor that "
                               "requires grad")


def test_jax_arrays_come_back_as_jax_arrays_and_cannot_be_written(tagged):
    pytest.importorskip("jax", reason="JAX is not installed: memkernel[test] installs it on Python 3.11 only")
    shown = lines(tagged, "jax-arrays")
    assert shown[0] == "a jax.Array: True [0.0, 2.0, 4.0, 6.0, 8.0] matches jax.numpy: True"
    assert "JAX arrays are immutable" in shown[1]
