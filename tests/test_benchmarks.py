"""The benchmark script runs end to end (a --quick smoke run) and writes every row; no timing is checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The script imports memkernel: this tree's, whichever copy is installed.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}

# Every row of the --quick run (10^6-element bandwidth and sum arrays), in order: each
# benchmark with the start of its variants' names (two end in what the machine has).
ROWS = {
    "call overhead, 16×f32, out=": [
        "np.add(a, b, out=c)",
        "memkernel add(a, b, out=c)",
        "bare ctypes, prebuilt descriptors",
        "upstream ExecutionEngine.invoke",
        "numba @njit loop add(a, b, c)",
    ],
    "call overhead, 16×f32, allocating": [
        "np.add(a, b)",
        "memkernel add(a, b)",
        "IREE llvm-cpu local-sync add(a, b)",
    ],
    "torch, 16×f32, out=": ["torch.add(a, b, out=c)", "memkernel add(a, b, out=c)"],
    "torch, 16×f32, allocating": ["torch.add(a, b)", "memkernel add(a, b)"],
    "JAX, 16×f32, allocating": ["jnp.add(a, b)", "memkernel add(a, b)"],
    "bandwidth, 1,000,000×f32, out=": [
        "np.add(a, b, out=c)",
        "memkernel add(a, b, out=c)",
        "memkernel add, pipeline=fast",
        "numba @njit loop add(a, b, c)",
    ],
    "sum, 1,000,000×f32": [
        "x.sum()",
        "memkernel tensor reduce, pipeline=fast",
        "memkernel tensor reduce, pipeline=default",
        "memkernel memref reduce, pipeline=fast",
        "memkernel memref reduce, pipeline=default",
    ],
    "matmul, 512×512×512 f32, out=, numpy's 16-byte-aligned arrays": [
        "np.matmul(a, b, out=c), OPENBLAS_NUM_THREADS=",
        "memkernel memref<512x512xf32>, pipeline=fast",
        "memkernel memref<?x?xf32>, pipeline=fast",
        "memkernel memref<512x512xf32>, pipeline=default",
        "IREE llvm-cpu local-sync, default flags",
        "IREE llvm-cpu local-sync, --iree-opt-data-tiling",
    ],
    "matmul, 512×512×512 f32, out=, 64-byte-aligned arrays": [
        "np.matmul(a, b, out=c), OPENBLAS_NUM_THREADS=",
        "memkernel memref<512x512xf32>, pipeline=fast",
        "memkernel memref<?x?xf32>, pipeline=fast",
    ],
    **{f"matmul, {shape}, out=, numpy's 16-byte-aligned arrays": [
        "np.matmul(a, b, out=c), OPENBLAS_NUM_THREADS=",
        f"memkernel memref<?x?x{shape[-3:]}>, pipeline=fast",
        "memkernel static memrefs, pipeline=fast",
    ] for shape in ("1000×1000×1000 f32", "513×257×129 f32", "1×512×512 f32", "512×512×512 f64")},
    "conv 3×3, 1×56×56×64 → 1×54×54×64 f32": [
        "numpy im2col: sliding_window_view + tensordot",
        "memkernel conv_2d_nhwc_hwcf, pipeline=fast",
        "memkernel conv_2d_nhwc_hwcf, pipeline=default",
        "IREE llvm-cpu local-sync conv_2d_nhwc_hwcf",
    ],
    "parallel=True, exp(exp(x)), 2000×2000×f32, out=": [
        "memkernel exp(exp(x)), serial",
        "memkernel exp(exp(x)), parallel=True (",
    ],
    "parallel=True, matmul 2048×2048×2048 f32, out=, numpy's 16-byte-aligned arrays": [
        "memkernel memref<?x?xf32>, pipeline=fast, serial (base)",
        "memkernel memref<?x?xf32>, pipeline=fast, parallel=True (",
        "np.matmul(a, b, out=c), ",
        "memkernel memref<?x?xf32>, pipeline=fast, parallel=True (",
    ],
    "parallel=True, matmul 1024×1024×1024 f32, out=, after other work": [
        "parallel=True (",
        "the same right after np.matmul on ",
    ],
    "gufunc, 10000 × (8×8 @ 8×8) f32, out=": [
        "numpy np.matmul",
        "memkernel gufunc, vector-dialect memref<8x8xf32> kernel",
        "memkernel gufunc, the kernel keeping B in registers, C never read",
        "memkernel gufunc, the first kernel, parallel=True (",
        "memkernel gufunc, linalg.matmul on memref<?x?xf32>, pipeline=default",
        "memkernel gufunc, linalg.matmul on memref<?x?xf32>, pipeline=fast",
    ],
    **{f"torch op, {n}×f32, allocating": [
        "torch.add(a, b)",
        "memkernel add op (as_torch_op), eager",
        "memkernel add op in torch.compile(fullgraph=True)",
    ] for n in ("16", "1,000,000")},
    **{f"JAX under jit, {n}×f32": [
        "jax.jit(jnp.add)(a, b)",
        "jax.jit(kernel.as_jax())(a, b), XLA FFI handler",
    ] for n in ("16", "1,000,000")},
    "compile, add kernel": [
        "cache=False, compiled in the compile worker",
        "MEMKERNEL_COMPILE_WORKER=0, cache=False (compiles here)",
        "in process, re-decorated (memory cache)",
        "fresh process, empty disk cache",
        "fresh process, disk cache hit",
    ],
    "start-up, fresh process to first result": [
        'python -c "import numpy"',
        "import memkernel, decorate, first call: warm disk cache",
        "the same, empty disk cache (compiles)",
        "the same, a new kernel, compile server left running by the last process",
    ],
    "compile, 16 distinct add kernels, decoration to first call": ["one at a time (base)", "from 16 threads at once ("],
    "checked=True, add, 16×f32, out=": ["memkernel add, unchecked (base)", "memkernel add, checked=True"],
    "checked=True, add, 1,000,000×f32, out=": ["memkernel add, unchecked (base)", "memkernel add, checked=True"],
    "checked=True, scf loop y = 2x, 1,000,000×f32": ["memkernel loop, unchecked (base)",
                                                     "memkernel loop, checked=True"],
    "checked=True, matmul 256³ f32, pipeline=fast": ["memkernel matmul, unchecked (base)",
                                                     "memkernel matmul, checked=True"],
    "isolate=True, add, 16×f32, out=": ["np.add(a, b, out=c)", "memkernel add, in process",
                                        "memkernel add, isolate=True",
                                        "memkernel add, isolate=True, shared_empty arrays"],
    "isolate=True, add, 1,000,000×f32, out=": ["memkernel add, in process (base)", "memkernel add, isolate=True"],
    "isolate=True, add, 1,000,000×f32 in shared_empty arrays, out=": ["memkernel add, in process (base)",
                                                                       "memkernel add, isolate=True"],
}
# The rows with a target, which show a verdict ("≥ 0.9: met" or "...: MISSED"); the others show "—".
TARGETED = {
    ("call overhead, 16×f32, out=", "memkernel add(a, b, out=c)"),
    ("call overhead, 16×f32, allocating", "memkernel add(a, b)"),
    ("torch, 16×f32, out=", "memkernel add(a, b, out=c)"),
    ("bandwidth, 1,000,000×f32, out=", "memkernel add(a, b, out=c)"),
    ("bandwidth, 1,000,000×f32, out=", "memkernel add, pipeline=fast"),
    ("sum, 1,000,000×f32", "memkernel tensor reduce, pipeline=fast"),
    ("sum, 1,000,000×f32", "memkernel memref reduce, pipeline=fast"),
    *((f"matmul, 512×512×512 f32, out=, {arrays}", variant)
      for arrays in ("numpy's 16-byte-aligned arrays", "64-byte-aligned arrays")
      for variant in ("memkernel memref<512x512xf32>, pipeline=fast", "memkernel memref<?x?xf32>, pipeline=fast")),
    *((f"matmul, {shape}, out=, numpy's 16-byte-aligned arrays", variant)
      for shape in ("1000×1000×1000 f32", "513×257×129 f32", "1×512×512 f32", "512×512×512 f64")
      for variant in (f"memkernel memref<?x?x{shape[-3:]}>, pipeline=fast", "memkernel static memrefs, pipeline=fast")),
    ("conv 3×3, 1×56×56×64 → 1×54×54×64 f32", "memkernel conv_2d_nhwc_hwcf, pipeline=fast"),
    ("parallel=True, matmul 2048×2048×2048 f32, out=, numpy's 16-byte-aligned arrays",
     "memkernel memref<?x?xf32>, pipeline=fast, parallel=True ("),
    ("gufunc, 10000 × (8×8 @ 8×8) f32, out=", "memkernel gufunc, vector-dialect memref<8x8xf32> kernel"),
    ("gufunc, 10000 × (8×8 @ 8×8) f32, out=", "memkernel gufunc, the kernel keeping B in registers, C never read"),
    ("compile, add kernel", "fresh process, disk cache hit"),
    ("compile, add kernel", "MEMKERNEL_COMPILE_WORKER=0, cache=False (compiles here)"),
    ("start-up, fresh process to first result", "import memkernel, decorate, first call: warm disk cache"),
    ("start-up, fresh process to first result", "the same, empty disk cache (compiles)"),
    ("start-up, fresh process to first result",
     "the same, a new kernel, compile server left running by the last process"),
    ("checked=True, add, 16×f32, out=", "memkernel add, checked=True"),
    ("isolate=True, add, 16×f32, out=", "memkernel add, isolate=True"),
    ("isolate=True, add, 1,000,000×f32 in shared_empty arrays, out=", "memkernel add, isolate=True"),
}


def cells(line: str) -> list[str]:
    """The stripped cells of a markdown table row."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_quick_run_writes_the_table(tmp_path: Path) -> None:
    report = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--markdown", str(report)],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    text = report.read_text(encoding="utf-8")
    for header in ["# memkernel benchmarks", "Machine: ", "numpy's BLAS: ", "## Results", "## Notes"]:
        assert header in text
    header, rule, *rows = [cells(line) for line in text.splitlines() if line.startswith("| ")]
    assert header == ["benchmark", "variant", "time", "ratio to numpy", "target"]
    assert set("".join(rule)) == {"-"}
    expected = [(benchmark, variant) for benchmark, variants in ROWS.items() for variant in variants]
    assert len(rows) == len(expected)
    for row, (benchmark, variant) in zip(rows, expected):
        assert len(row) == 5 and row[0] == benchmark and row[1].startswith(variant), row
        assert row[2] and row[3], row  # a time (or "not installed") and a ratio (or "—")
        if (benchmark, variant) in TARGETED and row[2] != "not installed":  # torch is on Python 3.11 only
            assert row[4].endswith((": met", ": MISSED")), row
        else:
            assert row[4] == "—", row
    assert text.strip() in done.stdout


def test_only_runs_the_sections_named(tmp_path: Path) -> None:
    report = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--only", "sum", "--markdown",
                           str(report)], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    text = report.read_text(encoding="utf-8")
    rows = [cells(line) for line in text.splitlines() if line.startswith("| ")][2:]
    assert [row[1] for row in rows] == ROWS["sum, 1,000,000×f32"]
    assert "Command: `python benchmarks/run.py --quick --only sum`" in text
