"""memkernel's pytest plugin: its session options, the kernel named in failure reports, and MLIR
test files collected as tests. Each case runs pytest in a subprocess on files written here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memkernel.pytest_plugin import RunLine, run_lines
from tests.integrations.test_mlir_files import plugin_arguments

PRINTING = """\
// RUN: mlir-opt %s -convert-vector-to-llvm | mlir-runner -e main -entry-point-result=void | FileCheck %s
func.func @main() {
  %v = arith.constant dense<[1.0, 2.0]> : vector<2xf32>
  vector.print %v : vector<2xf32>
  return
}
"""


def run_pytest(folder: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("MEMKERNEL_CHECKED", "MEMKERNEL_ISOLATE")}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_arguments(), *arguments]
    return subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=600,
                          env={**environment, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


ENVIRONMENT_TEST = """\
import os

def test_environment():
    assert os.environ.get("MEMKERNEL_CHECKED") == {checked!r}
    assert os.environ.get("MEMKERNEL_ISOLATE") == {isolate!r}
"""


def test_session_options_set_the_environment_variables_and_none_without_them(tmp_path: Path) -> None:
    write(tmp_path, "test_with.py", ENVIRONMENT_TEST.format(checked="1", isolate="1"))
    write(tmp_path, "test_without.py", ENVIRONMENT_TEST.format(checked=None, isolate=None))
    with_options = run_pytest(tmp_path, "--memkernel-checked", "--memkernel-isolate", "test_with.py")
    assert with_options.returncode == 0, with_options.stdout
    without = run_pytest(tmp_path, "test_without.py")
    assert without.returncode == 0, without.stdout


KERNEL_TESTS = """\
import numpy as np
from memkernel import mlir_kernel

ADD = '''
func.func @add(%a: memref<4xf32>, %b: memref<4xf32>, %c: memref<4xf32>) {
  linalg.add ins(%a, %b : memref<4xf32>, memref<4xf32>) outs(%c : memref<4xf32>)
  return
}'''

@mlir_kernel(ADD)
def add(a, b): ...

def test_wrong_dtype():
    add(np.ones(4, np.float64), np.ones(4, np.float32))

def test_unsupported_type():
    @mlir_kernel("func.func @seven(%a: memref<4xi7>) { return }")
    def seven(a): ...

def test_not_memkernel():
    raise KeyError("plain")
"""


def _sections(output: str) -> dict[str, str]:
    """The failure reports of a pytest run's output, by test name."""
    found = re.split(r"^_+ (test_\w+) _+$", output, flags=re.MULTILINE)
    return dict(zip(found[1::2], found[2::2]))


@pytest.fixture(scope="module")
def kernel_failures(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("kernels")
    path = write(folder, "test_kernels.py", KERNEL_TESTS)
    run = run_pytest(folder, "test_kernels.py")
    assert run.returncode == 1 and "3 failed" in run.stdout, run.stdout
    return path, _sections(run.stdout)


def test_a_failure_from_a_kernel_call_names_the_kernel_and_the_line_it_was_decorated_at(
        kernel_failures: tuple[Path, dict[str, str]]) -> None:
    path, sections = kernel_failures
    report = sections["test_wrong_dtype"]
    assert "ArgumentError" in report and "- memkernel -" in report
    assert f"kernel @add, decorated at {path}:10: @mlir_kernel(ADD)" in report


def test_a_failure_at_decoration_names_the_kernel_and_where_it_was_decorated(
        kernel_failures: tuple[Path, dict[str, str]]) -> None:
    path, sections = kernel_failures
    report = sections["test_unsupported_type"]
    assert "SignatureError" in report
    assert f'kernel @seven, decorated at {path}:17: @mlir_kernel("func.func @seven' in report


def test_other_failures_get_no_memkernel_section(kernel_failures: tuple[Path, dict[str, str]]) -> None:
    report = kernel_failures[1]["test_not_memkernel"]
    assert "KeyError" in report and "- memkernel -" not in report


def test_mlir_files_are_collected_from_the_given_folder_only_when_a_run_line_calls_an_entry(tmp_path: Path) -> None:
    write(tmp_path, "checks/printing.mlir", PRINTING + "// CHECK: ( 1, 2 )\n")
    write(tmp_path, "checks/no_runner.mlir", "// RUN: mlir-opt %s | FileCheck %s\n// CHECK: func\nfunc.func @f() {\n  return\n}\n")
    write(tmp_path, "elsewhere/printing.mlir", PRINTING + "// CHECK: ( 1, 2 )\n")
    run = run_pytest(tmp_path, "-v", "--memkernel-mlir=checks", ".")
    assert run.returncode == 0, run.stdout
    assert "checks/printing.mlir::main PASSED" in run.stdout
    assert "no_runner" not in run.stdout and "elsewhere" not in run.stdout
    assert "1 passed" in run.stdout


def test_the_ini_option_names_the_folders_too_and_a_folder_outside_the_arguments_is_collected(tmp_path: Path) -> None:
    write(tmp_path, "checks/printing.mlir", PRINTING + "// CHECK: ( 1, 2 )\n")
    write(tmp_path, "pytest.ini", "[pytest]\nmemkernel_mlir = checks\n")
    write(tmp_path, "tests/test_nothing.py", "def test_nothing():\n    pass\n")
    run = run_pytest(tmp_path, "-v", "tests")
    assert run.returncode == 0, run.stdout
    assert "checks/printing.mlir::main PASSED" in run.stdout and "2 passed" in run.stdout


def test_a_missed_check_line_or_an_entry_that_cannot_run_fails_with_a_report_that_says_why(tmp_path: Path) -> None:
    write(tmp_path, "checks/printing.mlir", PRINTING + "// CHECK: ( 1, 3 )\n")
    write(tmp_path, "checks/nowhere.mlir", PRINTING.replace("-e main", "-e nowhere") + "// CHECK: ( 1, 2 )\n")
    run = run_pytest(tmp_path, "--memkernel-mlir=checks", "checks")
    assert run.returncode == 1 and "2 failed" in run.stdout
    assert "printing.mlir, RUN line 1 (@main):" in run.stdout
    assert 'error: Couldn\'t match "( 1, 3 )"' in run.stdout
    assert "The output was:\n( 1, 2 )" in run.stdout
    assert "nowhere.mlir, RUN line 1 (@nowhere): " in run.stdout and "defines no function @nowhere" in run.stdout


def test_several_run_lines_of_one_entry_are_several_tests_named_by_line(tmp_path: Path) -> None:
    second = PRINTING.splitlines()[0].replace("FileCheck %s", "FileCheck %s --check-prefix=OTHER")
    write(tmp_path, "checks/printing.mlir", second + "\n" + PRINTING + "// CHECK: ( 1, 2 )\n// OTHER: 2 )\n")
    run = run_pytest(tmp_path, "-v", "--memkernel-mlir=checks", "checks")
    assert run.returncode == 0, run.stdout
    assert "printing.mlir::main:line1 PASSED" in run.stdout and "printing.mlir::main:line2 PASSED" in run.stdout


@pytest.mark.parametrize(("command", "expected"), [
    ("mlir-opt %s -test-lower-to-llvm | mlir-runner -e main -entry-point-result=void | FileCheck %s",
     RunLine(1, "main", "void", (), 3, None, ("CHECK",), schedule="skip")),
    ("mlir-opt %s | mlir-runner -e=entry --entry-point-result i32 -O0 "
     "-shared-libs=%mlir_lib_dir/libmlir_c_runner_utils%shlibext,%mlir_runner_utils | "
     "FileCheck %s --check-prefixes=A,B",
     RunLine(1, "entry", "i32", ("mlir_c_runner_utils", "mlir_runner_utils"), 0, None, ("A", "B"), schedule="skip")),
    ("memkernel run %s -e go --pipeline=fast -O2 -shared-libs=/opt/lib/libx.so --llvm-option=-enable-matrix",
     RunLine(1, "go", "void", ("/opt/lib/libx.so",), 2, "fast", None, ("-enable-matrix",))),
    ("mlir-runner -e main -enable-matrix -march=x86-64 -mattr=+avx2 -matrix-default-layout=row-major "
     "-shared-libs=%mlir_c_runner_utils",
     RunLine(1, "main", "void", ("mlir_c_runner_utils",), 3, None, None,
             ("-enable-matrix", "-matrix-default-layout=row-major"), "skip")),
])
def test_a_run_line_gives_the_entry_its_result_libraries_level_pipeline_prefixes_and_llvm_options(command: str,
                                                                                    expected: RunLine) -> None:
    assert run_lines(f"// RUN: {command}\n") == [expected]


def test_run_lines_join_continuations_and_skip_commands_that_run_no_entry() -> None:
    text = ("// RUN: mlir-opt %s | FileCheck %s\n"
            "// RUN: mlir-opt %s -pass \\\n"
            "// RUN:   | mlir-runner -e f \\\n"
            "// RUN:   -entry-point-result=f32 | FileCheck %s --check-prefix=F\n")
    assert run_lines(text) == [RunLine(2, "f", "f32", (), 3, None, ("F",), schedule="skip")]


def test_run_lines_substitute_lits_definitions() -> None:
    text = ("// DEFINE: %{entry} = go\n"
            "// DEFINE: %{run} = mlir-runner %t -e %{entry} \\\n"
            "// DEFINE:    -entry-point-result=i64 -shared-libs=%mlir_runner_utils\n"
            "// RUN: %{run} | FileCheck %s\n")
    assert run_lines(text) == [RunLine(4, "go", "i64", ("mlir_runner_utils",), 3, None, ("CHECK",))]


@pytest.mark.parametrize(("command", "expected"), [
    ("mlir-opt %s -convert-to-llvm | not mlir-runner -e main 2>&1 | FileCheck %s",
     RunLine(1, check_prefixes=("CHECK",), schedule="skip", fails=True, merges_stderr=True)),
    ("mlir-opt %s | not --crash mlir-runner -e main", RunLine(1, schedule="skip", fails=True)),
    ("mlir-opt %s -transform-interpreter -one-shot-bufferize | mlir-runner -e main",
     RunLine(1, schedule="before-bufferization")),
    ("mlir-opt %s -one-shot-bufferize -transform-interpreter | mlir-runner -e main",
     RunLine(1, schedule="after-bufferization")),
    ("mlir-opt %s -test-transform-dialect-interpreter | mlir-runner -e main",
     RunLine(1, schedule="before-bufferization")),
    ("mlir-runner %s -e main", RunLine(1, schedule="skip")),
    ("not memkernel run %s --schedule=skip 2>&1", RunLine(1, schedule="skip", fails=True, merges_stderr=True)),
    ("memkernel run %s", RunLine(1)),
])
def test_a_run_line_says_whether_the_entry_fails_its_stderr_is_checked_and_where_the_schedule_applies(
        command: str, expected: RunLine) -> None:
    assert run_lines(f"// RUN: {command}\n") == [expected]


def test_a_runner_of_a_file_an_earlier_run_line_wrote_takes_the_schedule_of_the_line_that_wrote_it() -> None:
    text = ("// RUN: mlir-opt %s -o %t\n"
            "// RUN: mlir-opt %s -transform-interpreter -convert-to-llvm -o %t\n"
            "// RUN: mlir-runner %t -e main | FileCheck %s\n"
            "// RUN: mlir-runner %t.other -e main\n")
    assert [run.schedule for run in run_lines(text)] == ["before-bufferization", None]


FAILING_ASSERTION = """\
// RUN: mlir-opt %s -convert-to-llvm | not mlir-runner -e main | FileCheck %s
// RUN: mlir-opt %s -convert-to-llvm | not mlir-runner -e main 2>&1 | FileCheck %s --check-prefix=ERROR
// RUN: mlir-opt %s -convert-to-llvm | mlir-runner -e main
func.func @main() {
  %no = arith.constant 0 : i1
  vector.print str "before\\n"
  cf.assert %no, "assertion foo"
  vector.print str "after\\n"
  return
}
// CHECK: before
// CHECK-NEXT: assertion foo
// CHECK-NOT: after
// ERROR: assertion foo
// ERROR: memkernel: error: main(): the kernel stopped at a failed assertion:
"""

FAILING_SCHEDULE = """\
// RUN: mlir-opt %s -convert-to-llvm | mlir-runner -e main | FileCheck %s
// RUN: mlir-opt %s -transform-interpreter -convert-to-llvm | mlir-runner -e main | FileCheck %s
func.func @main() {
  %a = memref.alloc() : memref<4xf32>
  %two = arith.constant 2.0 : f32
  %c0 = arith.constant 0 : index
  linalg.fill ins(%two : f32) outs(%a : memref<4xf32>)
  %v = vector.transfer_read %a[%c0], %two : memref<4xf32>, vector<4xf32>
  vector.print %v : vector<4xf32>
  memref.dealloc %a : memref<4xf32>
  return
}
module attributes {transform.with_named_sequence} {
  transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {
    %fill = transform.structured.match ops{["linalg.fill"]} in %root : (!transform.any_op) -> !transform.any_op
    %loop = transform.get_parent_op %fill {op_name = "scf.for"} : (!transform.any_op) -> !transform.any_op
    transform.yield
  }
}
// CHECK: ( 2, 2, 2, 2 )
"""


def test_a_runner_under_not_passes_when_the_entry_stops_at_a_failed_assertion_and_fails_otherwise(
        tmp_path: Path) -> None:
    write(tmp_path, "checks/assert.mlir", FAILING_ASSERTION)
    write(tmp_path, "checks/returns.mlir", PRINTING.replace("| mlir-runner", "| not mlir-runner") + "// CHECK: 1\n")
    run = run_pytest(tmp_path, "-v", "--memkernel-mlir=checks", "checks")
    assert "assert.mlir::main:line1 PASSED" in run.stdout and "assert.mlir::main:line2 PASSED" in run.stdout
    assert "assert.mlir::main:line3 FAILED" in run.stdout
    assert "assert.mlir, RUN line 3 (@main): main(): the kernel stopped at a failed assertion" in run.stdout
    assert "returns.mlir::main FAILED" in run.stdout
    assert "the RUN line runs the entry under `not`, but it returned" in run.stdout
    assert "2 failed, 2 passed" in run.stdout, run.stdout


def test_the_schedule_is_applied_only_where_the_run_lines_mlir_opt_runs_the_interpreter(tmp_path: Path) -> None:
    write(tmp_path, "checks/schedule.mlir", FAILING_SCHEDULE)
    run = run_pytest(tmp_path, "-v", "--memkernel-mlir=checks", "checks")
    assert "schedule.mlir::main:line1 PASSED" in run.stdout, run.stdout
    assert "schedule.mlir::main:line2 FAILED" in run.stdout
    assert "the module's transform schedule failed" in run.stdout


def test_a_runner_chained_with_and_after_the_command_that_wrote_its_file_is_collected_with_its_schedule() -> None:
    text = ("// RUN: rm -f %t && mlir-opt %s -transform-interpreter | mlir-opt -test-lower-to-llvm -o %t && "
            "mlir-runner %t -e main -entry-point-result=void | FileCheck %s\n")
    assert run_lines(text) == [RunLine(1, "main", "void", (), 3, None, ("CHECK",), schedule="before-bufferization")]
