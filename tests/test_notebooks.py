"""The notebooks run top to bottom in a real Jupyter kernel, and what kernels print shows in the cells."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def stream_text(cell) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []) if output["output_type"] == "stream")


@pytest.fixture(scope="module")
def quickstart():
    notebook = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_every_cell_runs_and_matches_numpy(quickstart):
    assert all(not any(o["output_type"] == "error" for o in cell.get("outputs", [])) for cell in quickstart)
    assert stream_text(quickstart[1]).count("matches numpy: True") == 1
    assert stream_text(quickstart[2]) == "matches numpy: True\n"


def test_kernel_output_shows_in_the_cell_in_order(quickstart):
    lines = stream_text(quickstart[3]).splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert "[0,  1,  2,  3]" in lines


def test_argument_error_is_shown_with_its_fix(quickstart):
    assert "Pass a.astype(np.float32)" in stream_text(quickstart[4])
