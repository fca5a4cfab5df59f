"""Benchmark memkernel against numpy and its peers, side by side, in one process.

Three benchmarks: the overhead of a call on 16-element arrays, the bandwidth of an
elementwise add on large arrays, and the compile time (cold, memory cache, disk cache).
Prints one table and writes it as markdown to ``--markdown``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import os
import platform
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
from mlir import ir
from mlir.execution_engine import ExecutionEngine
from mlir.runtime.np_to_memref import get_ranked_memref_descriptor

from memkernel import mlir_kernel, pipeline

ADD = """func.func @{name}(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) {{
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%c : memref<?xf32>)
  return
}}"""
IREE_ADD = """func.func @add(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %c = arith.addf %a, %b : tensor<{n}xf32>
  return %c : tensor<{n}xf32>
}}"""
# Run in a fresh interpreter: decorate the add kernel and call it once, timing only that.
FIRST_CALL_SCRIPT = """import sys, time
import numpy as np
from memkernel import mlir_kernel
a = np.ones(16, np.float32)
start = time.perf_counter()
mlir_kernel(sys.argv[1], name=sys.argv[2])(lambda a, b: None)(a, a)
print(time.perf_counter() - start)
"""
SMALL = 16
HEADER = ("benchmark", "variant", "time", "ratio to numpy", "target")


@dataclass(frozen=True)
class Settings:
    """How long to measure: repeats (the minimum is kept), seconds per repeat, sizes."""

    repeats: int
    min_seconds: float
    bandwidth_n: int
    compile_repeats: int


FULL = Settings(repeats=7, min_seconds=0.2, bandwidth_n=10**7, compile_repeats=3)
QUICK = Settings(repeats=3, min_seconds=0.01, bandwidth_n=10**6, compile_repeats=1)


@dataclass(frozen=True)
class Target:
    """A bound on a row's ratio: at most ``bound`` (times), or at least ``bound`` (throughput)."""

    bound: float
    at_least: bool = False

    def verdict(self, ratio: float) -> str:
        met = ratio >= self.bound if self.at_least else ratio <= self.bound
        return f"{'≥' if self.at_least else '≤'} {self.bound:g}: {'met' if met else 'MISSED'}"


@dataclass(frozen=True)
class Case:
    """One variant: a no-argument call, or None when its peer is not installed.

    ``output`` is the array the call writes; without it the call returns its result.
    """

    variant: str
    call: Callable[[], Any] | None
    output: np.ndarray | None = None
    target: Target | None = None


Row = tuple[str, str, str, str, str]


def seconds_per_call(call: Callable[[], Any], settings: Settings) -> float:
    """The minimum over repeats of the mean time per call, each repeat lasting ≥ min_seconds."""
    timer = timeit.Timer(call)
    number = 1
    while timer.timeit(number) < settings.min_seconds:
        number *= 2
    return min(timer.repeat(settings.repeats, number)) / number


def verify(case: Case, expected: np.ndarray) -> None:
    """Run the case once (also a warm-up) and check that it computes what numpy does."""
    assert case.call is not None
    if case.output is None:
        got = np.asarray(case.call())
    else:
        case.output.fill(0)
        case.call()
        got = case.output
    np.testing.assert_array_equal(got, expected, err_msg=case.variant)


def compare(benchmark: str, cases: Sequence[Case], expected: np.ndarray, settings: Settings,
            show: Callable[[float], str], throughput: bool = False) -> list[Row]:
    """Time each case against the first (the numpy baseline); rows in the cases' order.

    The ratio is time / baseline time, or with ``throughput`` baseline time / time.
    """
    timings: list[float | None] = []
    for case in cases:
        if case.call is not None:
            verify(case, expected)
        timings.append(None if case.call is None else seconds_per_call(case.call, settings))
    base = timings[0]
    assert base is not None
    rows: list[Row] = []
    for case, seconds in zip(cases, timings):
        if seconds is None:
            rows.append((benchmark, case.variant, "not installed", "—", "—"))
            continue
        ratio = base / seconds if throughput else seconds / base
        verdict = case.target.verdict(ratio) if case.target else "—"
        rows.append((benchmark, case.variant, show(seconds), f"{ratio:.2f}", verdict))
    return rows


def add_kernel(name: str = "add", cache: bool = True) -> Any:
    """The memkernel add kernel: two inputs, the output from ``out=`` or allocated like them."""
    return mlir_kernel(ADD.format(name=name), name=name, cache=cache)(lambda a, b: None)


def execution_engine() -> ExecutionEngine:
    """The add kernel compiled by hand, as memkernel lowers it, with its C interface."""
    source = ADD.format(name="add")
    with ir.Context(), ir.Location.unknown():
        module = ir.Module.parse(source)
        module.body.operations[0].attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        module = pipeline.lower(module, pipeline.parse_pipeline(None), source)
        return ExecutionEngine(module, opt_level=3)


class MemRef1D(ctypes.Structure):
    """The descriptor of a rank-1 memref: allocated and aligned pointers, offset, size, stride."""

    _fields_ = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64),
                ("size", ctypes.c_int64 * 1), ("stride", ctypes.c_int64 * 1)]


def bare_call(engine: ExecutionEngine, arrays: Sequence[np.ndarray]) -> Callable[[], None]:
    """The packed C interface called on descriptors built once; ``engine`` must outlive the call.

    ``args[i]`` points at a pointer to the descriptor of ``arrays[i]``; the ctypes array
    keeps the pointers and descriptors alive.
    """
    handle = ctypes.POINTER(ctypes.POINTER(MemRef1D))
    descriptors = [MemRef1D(x.ctypes.data, x.ctypes.data, 0, (x.size,), (1,)) for x in arrays]
    args = (handle * len(arrays))(*(ctypes.pointer(ctypes.pointer(d)) for d in descriptors))
    function = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.raw_lookup("_mlir_ciface_add"))
    return lambda: function(args)


def upstream_call(engine: ExecutionEngine, arrays: Sequence[np.ndarray]) -> Callable[[], None]:
    """How upstream MLIR users call a kernel: new descriptors and ``invoke`` on every call."""
    return lambda: engine.invoke(
        "add", *[ctypes.pointer(ctypes.pointer(get_ranked_memref_descriptor(x))) for x in arrays])


@functools.cache
def numba_add() -> Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None:
    """An ``@njit`` loop ``c[i] = a[i] + b[i]``, or None without numba."""
    try:
        import numba
    except ImportError:
        return None

    @numba.njit
    def add(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        for i in range(a.shape[0]):
            c[i] = a[i] + b[i]

    return add


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it; its parent packages are)."""
    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def iree_add(n: int) -> Callable[[np.ndarray, np.ndarray], Any] | None:
    """The tensor add compiled by IREE for llvm-cpu (host CPU), loaded on local-sync; None without IREE.

    ``iree-compile`` runs in a subprocess: IREE's compiler bindings and memkernel's MLIR
    bindings cannot be loaded in one process (their nanobind symbols clash).
    """
    if not (installed("iree.compiler") and installed("iree.runtime")):
        return None
    import iree.runtime

    compiled = subprocess.run(
        [sys.executable, "-m", "iree.compiler.tools.scripts.iree_compile", "-", "-o", "-",
         "--iree-hal-target-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host"],
        input=IREE_ADD.format(n=n).encode(), capture_output=True, check=True)
    return iree.runtime.load_vm_flatbuffer(compiled.stdout, driver="local-sync").add


def operands(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two random float32 inputs of ``n`` elements and an output buffer."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32),
            np.zeros(n, np.float32))


def microseconds(seconds: float) -> str:
    """``seconds`` shown in µs."""
    return f"{seconds * 1e6:.3f} µs"


def overhead_rows(settings: Settings) -> list[Row]:
    """Call overhead on 16 float32s: into a preallocated output, then allocating it."""
    a, b, c = operands(SMALL)
    expected = a + b
    kernel, engine, nb, iree = add_kernel(), execution_engine(), numba_add(), iree_add(SMALL)
    into = [
        Case("np.add(a, b, out=c)", lambda: np.add(a, b, out=c), c),
        Case("memkernel add(a, b, out=c)", lambda: kernel(a, b, out=c), c, Target(3)),
        Case("bare ctypes, prebuilt descriptors", bare_call(engine, (a, b, c)), c),
        Case("upstream ExecutionEngine.invoke", upstream_call(engine, (a, b, c)), c),
        Case("numba @njit loop add(a, b, c)", None if nb is None else lambda: nb(a, b, c), c),
    ]
    allocating = [
        Case("np.add(a, b)", lambda: np.add(a, b)),
        Case("memkernel add(a, b)", lambda: kernel(a, b), target=Target(5)),
        Case("IREE llvm-cpu local-sync add(a, b)", None if iree is None else lambda: iree(a, b).to_host()),
    ]
    return (compare(f"call overhead, {SMALL}×f32, out=", into, expected, settings, microseconds)
            + compare(f"call overhead, {SMALL}×f32, allocating", allocating, expected, settings, microseconds))


def bandwidth_rows(settings: Settings) -> list[Row]:
    """GB/s of ``c = a + b`` into a preallocated output, counting 3 arrays of 4-byte elements."""
    n = settings.bandwidth_n
    a, b, c = operands(n)
    kernel, nb = add_kernel(), numba_add()

    def show(seconds: float) -> str:
        return f"{3 * 4 * n / seconds / 1e9:.1f} GB/s ({seconds * 1e3:.2f} ms)"

    cases = [
        Case("np.add(a, b, out=c)", lambda: np.add(a, b, out=c), c),
        Case("memkernel add(a, b, out=c)", lambda: kernel(a, b, out=c), c, Target(0.9, at_least=True)),
        Case("numba @njit loop add(a, b, c)", None if nb is None else lambda: nb(a, b, c), c),
    ]
    return compare(f"bandwidth, {n:,}×f32, out=", cases, a + b, settings, show, throughput=True)


def unique_name() -> str:
    """A kernel name no earlier measurement compiled, so no cache can hold it."""
    return f"add_{uuid.uuid4().hex[:12]}"


def first_call_seconds(name: str, cache: bool) -> float:
    """Seconds from decorating the add kernel named ``name`` through its first call, in this process."""
    a = np.ones(SMALL, np.float32)
    start = time.perf_counter()
    add_kernel(name, cache)(a, a)
    return time.perf_counter() - start


def fresh_process_seconds(name: str, cache_dir: str) -> float:
    """Decoration through first call in a new interpreter with disk cache ``cache_dir`` (start-up excluded)."""
    done = subprocess.run([sys.executable, "-c", FIRST_CALL_SCRIPT, ADD.format(name=name), name],
                          env={**os.environ, "MEMKERNEL_CACHE_DIR": cache_dir},
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def disk_cache_seconds(repeats: int) -> tuple[float, float]:
    """The fastest first calls of fresh processes: with an empty disk cache, then with it filled."""
    uncached, cached = [], []
    for _ in range(repeats):
        name = unique_name()
        with tempfile.TemporaryDirectory(prefix="memkernel-bench-") as folder:
            uncached.append(fresh_process_seconds(name, folder))
            cached.append(fresh_process_seconds(name, folder))
    return min(uncached), min(cached)


def compile_rows(settings: Settings) -> list[Row]:
    """Decoration through first call: compiled, from the memory cache, from the disk cache."""
    repeats = settings.compile_repeats
    cold = min(first_call_seconds(unique_name(), cache=False) for _ in range(repeats))
    name = unique_name()
    first_call_seconds(name, cache=True)
    warm = min(first_call_seconds(name, cache=True) for _ in range(settings.repeats))
    uncached, cached = disk_cache_seconds(repeats)

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.2f} ms"

    benchmark = "compile, add kernel"
    return [
        (benchmark, "in process, cache=False (compiles)", ms(cold), "1.00 (base A)", "—"),
        (benchmark, "in process, re-decorated (memory cache)", ms(warm), f"{warm / cold:.3f} of A", "—"),
        (benchmark, "fresh process, empty disk cache", ms(uncached), "1.00 (base B)", "—"),
        (benchmark, "fresh process, disk cache hit", ms(cached), f"{cached / uncached:.3f} of B",
         Target(0.2).verdict(cached / uncached)),
    ]


def version(distribution: str) -> str:
    """The installed version of ``distribution``, or "not installed"."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, else what ``platform`` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return models[0] if models else platform.processor() or platform.machine()


def machine() -> str:
    """One line: the CPU, Python and the versions of what is compared."""
    packages = ["memkernel", "numpy", "xtc-mlir-python-bindings", "numba", "iree-base-compiler",
                "iree-base-runtime"]
    listed = ", ".join(f"{p} {version(p)}" for p in packages)
    return f"{cpu_model()} ({os.cpu_count()} CPUs), Python {platform.python_version()}; {listed}"


NOTES = """\
- Each time is the minimum over repeats of the mean of a timeit loop, after a call that
  checks the result against numpy. The ratio is time / numpy time of the same group, except
  for bandwidth (GB/s / numpy GB/s, higher is better) and compile time (see its rows).
- Targets: memkernel `out=` ≤ 3× `np.add(out=)`; allocating ≤ 5× `np.add`; bandwidth ≥ 0.9
  of numpy; disk cache hit ≤ 0.2 of the fresh-process compile (base B).
- bare ctypes: the kernel's packed C interface called on descriptors built once: the floor
  of any Python caller. upstream: `ExecutionEngine.invoke` with `get_ranked_memref_descriptor`
  per call. IREE returns a new array (`.to_host()`), so it is timed against `np.add(a, b)`;
  it runs on the `local-sync` driver, the one without a thread pool to dispatch to.
- Compile rows time decoration through the first call. Base A compiles in this process;
  base B is a new interpreter (import start-up excluded) with an empty disk cache, and
  includes writing the cache entry that the disk-cache-hit row then loads.
"""


def markdown(rows: Sequence[Row], info: str, command: str) -> str:
    """The report: machine line, command, the table with padded columns, notes."""
    table = [HEADER, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(cells, widths)) + " |"

    body = [line(HEADER), line(["-" * w for w in widths]), *(line(row) for row in rows)]
    return "\n".join(["# memkernel benchmarks", "", f"Machine: {info}", "", f"Command: `{command}`", "",
                      "## Results", "", *body, "", "## Notes", "", NOTES])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few repeats, smaller arrays")
    parser.add_argument("--markdown", type=Path, default=Path(__file__).with_name("results.md"),
                        help="where to write the markdown table (default: benchmarks/results.md)")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    os.environ["MEMKERNEL_CACHE_DIR"] = ""  # in this process: no disk cache, and the user's is untouched
    rows = overhead_rows(settings) + bandwidth_rows(settings) + compile_rows(settings)
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "")
    report = markdown(rows, machine(), command)
    print(report)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
