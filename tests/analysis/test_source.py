"""Parsing the MLIR source in the caller's process: an error is an MLIRSyntaxError, never an abort."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[2])


def test_errors_in_nested_modules_are_a_syntax_error_every_time_never_an_abort() -> None:
    # With MLIR's threads on, 20 parses of this source aborted the process in 3 runs of 3
    # ("Critical nanobind error: incref_check ... GIL was not held").
    script = textwrap.dedent("""
        from memkernel.errors import MLIRSyntaxError
        from memkernel.analysis.source import parse_source

        def functions(prefix):
            return "\\n".join(f'''func.func @{prefix}{i}(%a: memref<4xf32>) {{
              %c = arith.constant 0 : index
              %v = memref.load %a[%c, %c] : memref<4xf32>
              return
            }}''' for i in range(16))

        source = "\\n".join(f"module @m{j} {{ {functions(f'f{j}_')} }}" for j in range(8))
        raised = 0
        for _ in range(20):
            try:
                parse_source(source)
            except MLIRSyntaxError as error:
                assert "incorrect number of indices for load" in str(error)
                raised += 1
        print(raised)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env={"PYTHONPATH": REPO, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["20"]
