"""The benchmark script runs end to end (a --quick smoke run) and writes every row; no timing is checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

VARIANTS = [
    "np.add(a, b, out=c)",
    "memkernel add(a, b, out=c)",
    "bare ctypes, prebuilt descriptors",
    "upstream ExecutionEngine.invoke",
    "numba @njit loop add(a, b, c)",
    "np.add(a, b)",
    "memkernel add(a, b)",
    "IREE llvm-cpu local-sync add(a, b)",
    "in process, cache=False (compiles)",
    "in process, re-decorated (memory cache)",
    "fresh process, empty disk cache",
    "fresh process, disk cache hit",
]


def test_quick_run_writes_the_table(tmp_path: Path) -> None:
    report = tmp_path / "results.md"
    done = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--markdown", str(report)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = report.read_text(encoding="utf-8")
    for header in ["# memkernel benchmarks", "Machine: ", "## Results", "## Notes",
                   "| benchmark ", "| variant ", "| time ", "| ratio to numpy ", "| target "]:
        assert header in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    counts = {"call overhead, 16×f32, out=": 5, "call overhead, 16×f32, allocating": 3,
              "bandwidth, 1,000,000×f32, out=": 3, "compile, add kernel": 4}
    for benchmark, count in counts.items():
        assert sum(line.startswith(f"| {benchmark} ") for line in rows) == count, benchmark
    for variant in VARIANTS:
        assert any(f"| {variant} " in line for line in rows), variant
    assert text.strip() in done.stdout
