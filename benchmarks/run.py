"""Benchmark memkernel against numpy and its peers, side by side, in one process.

The overhead of a call on 16-element arrays; the bandwidth of an elementwise add and of
a sum on large arrays; the GFLOP/s of a matmul and of a convolution; parallel=True
against serial code; and the compile time (cold, memory cache, disk cache). Prints one
table and writes it as markdown to ``--markdown``. See benchmarks/README.md.
"""

from __future__ import annotations

import os

# numpy's OpenBLAS threads (the parallel matmul rows give it several) spin for 2^28 cycles
# after each call before they sleep, taking a core from the kernel timed next in turn: it
# measured 25% slower at 2048³. 2^4 cycles is OpenBLAS's minimum; it reads the variable when
# numpy loads it, hence before the import.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import argparse
import contextlib
import ctypes
import functools
import importlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
from mlir import ir
from mlir.execution_engine import ExecutionEngine
from mlir.runtime.np_to_memref import get_ranked_memref_descriptor

from memkernel import mlir_kernel, shared_asarray
from memkernel.compile import pipeline
from memkernel.load.libraries import find_library
from memkernel.options import ASYNC_RUNTIME

ADD = """func.func @{name}(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>) {{
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%c : memref<?xf32>)
  return
}}"""
IREE_ADD = """func.func @add(%a: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> tensor<{n}xf32> {{
  %c = arith.addf %a, %b : tensor<{n}xf32>
  return %c : tensor<{n}xf32>
}}"""
TENSOR_SUM = """func.func @total(%x: tensor<?xf32>) -> tensor<f32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<f32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<f32>) -> tensor<f32>
  %sum = linalg.reduce ins(%x : tensor<?xf32>) outs(%init : tensor<f32>) dimensions = [0]
    (%v: f32, %acc: f32) {
      %s = arith.addf %v, %acc : f32
      linalg.yield %s : f32
    }
  return %sum : tensor<f32>
}"""
# The output is zero-filled by memkernel when it allocates it; linalg.reduce adds to it.
MEMREF_SUM = """func.func @total(%x: memref<?xf32>, %out: memref<f32>) {
  linalg.reduce ins(%x : memref<?xf32>) outs(%out : memref<f32>) dimensions = [0]
    (%v: f32, %acc: f32) {
      %s = arith.addf %v, %acc : f32
      linalg.yield %s : f32
    }
  return
}"""
MATMUL = """func.func @matmul(%a: {t}, %b: {t}, %c: {t}) {{
  linalg.matmul ins(%a, %b : {t}, {t}) outs(%c : {t})
  return
}}"""
IREE_MATMUL = """func.func @matmul(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<{m}x{n}xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  %c = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%init : tensor<{m}x{n}xf32>)
      -> tensor<{m}x{n}xf32>
  return %c : tensor<{m}x{n}xf32>
}}"""
MATMUL_STATIC = """func.func @matmul(%a: {a}, %b: {b}, %c: {c}) {{
  linalg.matmul ins(%a, %b : {a}, {b}) outs(%c : {c})
  return
}}"""
CONV = """func.func @conv(%x: {x}, %w: {w}, %y: {y}) {{
  linalg.conv_2d_nhwc_hwcf {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
      ins(%x, %w : {x}, {w}) outs(%y : {y})
  return
}}"""
IREE_CONV = """func.func @conv(%x: tensor<{x}>, %w: tensor<{w}>) -> tensor<{y}> {{
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<{y}>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<{y}>) -> tensor<{y}>
  %y = linalg.conv_2d_nhwc_hwcf {{dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}}
      ins(%x, %w : tensor<{x}>, tensor<{w}>) outs(%init : tensor<{y}>) -> tensor<{y}>
  return %y : tensor<{y}>
}}"""
EXP_EXP = """func.func @exp_exp(%x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<?x?xf32>) outs(%y : memref<?x?xf32>) {
  ^bb0(%v: f32, %unused: f32):
    %e = math.exp %v : f32
    %ee = math.exp %e : f32
    linalg.yield %ee : f32
  }
  return
}"""
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
MATMUL_SIZE = 512  # M = N = K
# The other matmul shapes (M, N, K, dtype): large, odd, a row times a matrix, double precision.
MATMUL_SHAPES = ((1000, 1000, 1000, "f32"), (513, 257, 129, "f32"), (1, 512, 512, "f32"), (512, 512, 512, "f64"))
# Where an array's data starts relative to a 64-byte boundary: numpy's own allocations
# land 16 bytes past one (16-byte aligned), as users have them; 0 is 64-byte aligned.
NUMPY_OFFSET = 16
# IREE's flags for its matmul peers: its defaults, then data tiling with its ukernels.
IREE_DATA_TILING = ("--iree-opt-data-tiling", "--iree-llvmcpu-enable-ukernels=all")
CONV_INPUT = (1, 56, 56, 64)  # N, H, W, C: a ResNet stage-2 activation
CONV_FILTER = (3, 3, 64, 64)  # KH, KW, C, F
EXP_SIDE = 2000
PARALLEL_MATMUL_SIZE = 2048  # M = N = K: a block of rows per worker, 1024 on 2 cores
# (prefix, suffix) of OpenBLAS's C functions: numpy 2's scipy-openblas, 64-bit and plain builds.
OPENBLAS_NAMES = (("scipy_openblas_", "64_"), ("openblas_", "64_"), ("openblas_", ""))
HEADER = ("benchmark", "variant", "time", "ratio to numpy", "target")


@dataclass(frozen=True)
class Settings:
    """How long to measure: repeats (the minimum is kept), seconds per repeat, sizes.

    ``bandwidth_n`` is the length of the add and sum arrays; the matmul, convolution and
    parallel shapes are the same in both settings.
    """

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
    """One variant: a no-argument call, or None when its peer (or a library it needs) is not installed.

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


def verify(case: Case, expected: np.ndarray, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Run the case once (also a warm-up) and check that it computes what numpy does.

    A preallocated output is zeroed first (``linalg`` kernels accumulate into it); without
    tolerances the result must be equal.
    """
    assert case.call is not None
    if case.output is None:
        got = np.asarray(case.call())
    else:
        case.output.fill(0)
        case.call()
        got = case.output
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=case.variant)


def measure(case: Case, expected: np.ndarray, settings: Settings, rtol: float = 0.0,
            atol: float = 0.0) -> float | None:
    """Seconds per call of a verified case (see :func:`verify`); None when it is not installed."""
    if case.call is None:
        return None
    verify(case, expected, rtol, atol)
    return seconds_per_call(case.call, settings)


def not_installed(benchmark: str, variant: str) -> Row:
    """The row of a variant whose peer or library is not installed."""
    return (benchmark, variant, "not installed", "—", "—")


def alternating_rounds(cases: Sequence[Case], settings: Settings) -> list[list[float]]:
    """Seconds per call of each case in each round: ``rounds[r][i]`` for case ``i``.

    Each case's timeit loop is calibrated to last at least ``min_seconds``; then every
    round times each case once, in order, so a noisy neighbour slows the cases of a round
    alike instead of whichever was running when it came.
    """
    timers = [timeit.Timer(case.call) for case in cases if case.call is not None]
    numbers = []
    for timer in timers:
        number = 1
        while timer.timeit(number) < settings.min_seconds:
            number *= 2
        numbers.append(number)
    return [[timer.timeit(number) / number for timer, number in zip(timers, numbers)]
            for _ in range(settings.repeats)]


def compare(benchmark: str, cases: Sequence[Case], expected: np.ndarray, settings: Settings,
            show: Callable[[float], str], throughput: bool = False, rtol: float = 0.0,
            atol: float = 0.0) -> list[Row]:
    """Time each case against the first (the numpy baseline), in turns; rows in the cases' order.

    The time shown is a case's fastest round. The ratio is the median over rounds of the
    round's ratio, time / baseline time (with ``throughput``, baseline time / time): the two
    sides of each ratio ran moments apart. Results are checked against ``expected`` within
    ``rtol`` and ``atol`` (exactly by default).
    """
    installed_cases = [case for case in cases if case.call is not None]
    for case in installed_cases:
        verify(case, expected, rtol, atol)
    rounds = alternating_rounds(installed_cases, settings)
    column = {id(case): i for i, case in enumerate(installed_cases)}
    base = column[id(cases[0])]
    rows: list[Row] = []
    for case in cases:
        if id(case) not in column:
            rows.append(not_installed(benchmark, case.variant))
            continue
        i = column[id(case)]
        ratios = [r[base] / r[i] if throughput else r[i] / r[base] for r in rounds]
        ratio = statistics.median(ratios)
        verdict = case.target.verdict(ratio) if case.target else "—"
        rows.append((benchmark, case.variant, show(min(r[i] for r in rounds)), f"{ratio:.2f}", verdict))
    return rows


def add_kernel(name: str = "add", cache: bool = True, preset: str = "default") -> Any:
    """The memkernel add kernel: two inputs, the output from ``out=`` or allocated like them."""
    return mlir_kernel(ADD.format(name=name), name=name, cache=cache, pipeline=preset)(lambda a, b: None)


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


def iree_function(source: str, name: str, flags: Sequence[str] = ()) -> Callable[..., Any] | None:
    """``source`` compiled by IREE for llvm-cpu (host CPU), loaded on local-sync; None without IREE.

    ``iree-compile`` runs in a subprocess: IREE's compiler bindings and memkernel's MLIR
    bindings cannot be loaded in one process (their nanobind symbols clash).
    """
    if not (installed("iree.compiler") and installed("iree.runtime")):
        return None
    import iree.runtime

    compiled = subprocess.run(
        [sys.executable, "-m", "iree.compiler.tools.scripts.iree_compile", "-", "-o", "-",
         "--iree-hal-target-backends=llvm-cpu", "--iree-llvmcpu-target-cpu=host", *flags],
        input=source.encode(), capture_output=True, check=True)
    return getattr(iree.runtime.load_vm_flatbuffer(compiled.stdout, driver="local-sync"), name)


def iree_add(n: int) -> Callable[[np.ndarray, np.ndarray], Any] | None:
    """The tensor add of ``n`` float32s compiled by IREE (see :func:`iree_function`)."""
    return iree_function(IREE_ADD.format(n=n), "add")


def iree_case(variant: str, function: Callable[..., Any] | None, *arrays: np.ndarray) -> Case:
    """An IREE function called on ``arrays``, its result copied back to the host; None when not installed."""
    return Case(variant, None if function is None else lambda: function(*arrays).to_host())


def operands(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two random float32 inputs of ``n`` elements and an output buffer."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32),
            np.zeros(n, np.float32))


def small_integers(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    """Random float32 arrays of integers in [-4, 4], one per shape.

    A matmul or convolution of them sums a few hundred products of magnitude ≤ 16: every
    partial sum is an integer far below 2**24, exact in float32 in any order, so every
    variant must equal numpy exactly.
    """
    rng = np.random.default_rng(0)
    return [rng.integers(-4, 5, shape).astype(np.float32) for shape in shapes]


def memref(shape: Sequence[int], element: str = "f32") -> str:
    """The static memref type of ``shape``."""
    return f"memref<{'x'.join(map(str, shape))}x{element}>"


def placed(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``array`` whose data starts ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    copy = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def microseconds(seconds: float) -> str:
    """``seconds`` shown in µs."""
    return f"{seconds * 1e6:.3f} µs"


def milliseconds(seconds: float) -> str:
    """``seconds`` shown in ms."""
    return f"{seconds * 1e3:.2f} ms"


def per_second(amount: float, unit: str) -> Callable[[float], str]:
    """Shows a time as ``amount`` (giga-``unit``) per second, then the time in ms."""
    return lambda seconds: f"{amount / seconds / 1e9:.1f} {unit} ({milliseconds(seconds)})"


def overhead_rows(settings: Settings) -> list[Row]:
    """Call overhead on 16 float32s: into a preallocated output, then allocating it."""
    a, b, c = operands(SMALL)
    expected = a + b
    kernel, engine, nb, iree = add_kernel(), execution_engine(), numba_add(), iree_add(SMALL)
    into = [
        Case("np.add(a, b, out=c)", lambda: np.add(a, b, out=c), c),
        Case("memkernel add(a, b, out=c)", lambda: kernel(a, b, out=c), c, Target(1.0)),
        Case("bare ctypes, prebuilt descriptors", bare_call(engine, (a, b, c)), c),
        Case("upstream ExecutionEngine.invoke", upstream_call(engine, (a, b, c)), c),
        Case("numba @njit loop add(a, b, c)", None if nb is None else lambda: nb(a, b, c), c),
    ]
    allocating = [
        Case("np.add(a, b)", lambda: np.add(a, b)),
        Case("memkernel add(a, b)", lambda: kernel(a, b), target=Target(1.5)),
        Case("IREE llvm-cpu local-sync add(a, b)", None if iree is None else lambda: iree(a, b).to_host()),
    ]
    return (compare(f"call overhead, {SMALL}×f32, out=", into, expected, settings, microseconds)
            + compare(f"call overhead, {SMALL}×f32, allocating", allocating, expected, settings, microseconds))


def tensor_rows(settings: Settings) -> list[Row]:
    """The add kernel on 16 float32s of torch tensors and JAX arrays, against torch's and jax.numpy's add."""
    rows: list[Row] = []
    a, b, _ = operands(SMALL)
    expected = a + b
    kernel = add_kernel()
    if not installed("torch"):
        rows += [not_installed(f"torch, {SMALL}×f32, {form}", variant) for form, variant in
                 (("out=", "torch.add(a, b, out=c)"), ("out=", "memkernel add(a, b, out=c)"),
                  ("allocating", "torch.add(a, b)"), ("allocating", "memkernel add(a, b)"))]
    else:
        torch = importlib.import_module("torch")
        ta, tb, tc = torch.from_numpy(a.copy()), torch.from_numpy(b.copy()), torch.zeros(SMALL)
        rows += compare(f"torch, {SMALL}×f32, out=", [
            Case("torch.add(a, b, out=c)", lambda: torch.add(ta, tb, out=tc), tc.numpy()),
            Case("memkernel add(a, b, out=c)", lambda: kernel(ta, tb, out=tc), tc.numpy(), Target(1.0)),
        ], expected, settings, microseconds)
        rows += compare(f"torch, {SMALL}×f32, allocating", [
            Case("torch.add(a, b)", lambda: torch.add(ta, tb)),
            Case("memkernel add(a, b)", lambda: kernel(ta, tb)),
        ], expected, settings, microseconds)
    if not installed("jax"):
        return rows + [not_installed(f"JAX, {SMALL}×f32, allocating", variant)
                       for variant in ("jnp.add(a, b)", "memkernel add(a, b)")]
    jnp = importlib.import_module("jax.numpy")
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    return rows + compare(f"JAX, {SMALL}×f32, allocating", [
        Case("jnp.add(a, b)", lambda: jnp.add(ja, jb).block_until_ready()),
        Case("memkernel add(a, b)", lambda: kernel(ja, jb)),
    ], expected, settings, microseconds)


def bandwidth_rows(settings: Settings) -> list[Row]:
    """GB/s of ``c = a + b`` into a preallocated output, counting 3 arrays of 4-byte elements."""
    n = settings.bandwidth_n
    a, b, c = operands(n)
    kernel, fast, nb = add_kernel(), add_kernel(preset="fast"), numba_add()
    cases = [
        Case("np.add(a, b, out=c)", lambda: np.add(a, b, out=c), c),
        Case("memkernel add(a, b, out=c)", lambda: kernel(a, b, out=c), c, Target(0.9, at_least=True)),
        Case("memkernel add, pipeline=fast", lambda: fast(a, b, out=c), c, Target(0.9, at_least=True)),
        Case("numba @njit loop add(a, b, c)", None if nb is None else lambda: nb(a, b, c), c),
    ]
    return compare(f"bandwidth, {n:,}×f32, out=", cases, a + b, settings, per_second(3 * 4 * n, "GB/s"),
                   throughput=True)


def sum_rows(settings: Settings) -> list[Row]:
    """GB/s of summing float32s to one, counting the input: the tensor and memref forms of ``linalg.reduce``."""
    n = settings.bandwidth_n
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    tensor_fast, tensor_default, memref_fast, memref_default = (
        mlir_kernel(source, pipeline=preset)(lambda x: None)
        for source, preset in ((TENSOR_SUM, "fast"), (TENSOR_SUM, "default"), (MEMREF_SUM, "fast"),
                               (MEMREF_SUM, "default")))
    cases = [
        Case("x.sum()", x.sum),
        Case("memkernel tensor reduce, pipeline=fast", lambda: tensor_fast(x), target=Target(0.9, at_least=True)),
        Case("memkernel tensor reduce, pipeline=default", lambda: tensor_default(x)),
        Case("memkernel memref reduce, pipeline=fast", lambda: memref_fast(x), target=Target(0.9, at_least=True)),
        Case("memkernel memref reduce, pipeline=default", lambda: memref_default(x)),
    ]
    # Each variant adds in its own order; rtol is the tests' bound for float32 sums.
    return compare(f"sum, {n:,}×f32", cases, np.sum(x, dtype=np.float64), settings, per_second(4 * n, "GB/s"),
                   throughput=True, rtol=1e-4)


def matmul_kernel(memref_type: str, preset: str) -> Any:
    """``linalg.matmul`` on three memrefs of ``memref_type``; the output comes from ``out=``."""
    return mlir_kernel(MATMUL.format(t=memref_type), pipeline=preset)(lambda a, b: None)


def blas_variant() -> str:
    """The numpy matmul variant's name, with the BLAS threads it was told to use."""
    return f"np.matmul(a, b, out=c), OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"


def matmul_arrays(m: int, n: int, k: int, dtype: type, offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A, B (small integers) and a zeroed C, their data ``offset`` bytes past a 64-byte boundary."""
    a, b = small_integers((m, k), (k, n))
    return placed(a.astype(dtype), offset), placed(b.astype(dtype), offset), placed(np.zeros((m, n), dtype), offset)


def matmul_rows(settings: Settings) -> list[Row]:
    """GFLOP/s of a square f32 matmul into a preallocated output, on 16- then 64-byte-aligned arrays."""
    size = MATMUL_SIZE
    static = memref((size, size))
    default, fast, dynamic = (matmul_kernel(static, "default"), matmul_kernel(static, "fast"),
                              matmul_kernel("memref<?x?xf32>", "fast"))
    source = IREE_MATMUL.format(m=size, n=size, k=size)
    iree, iree_tiled = iree_function(source, "matmul"), iree_function(source, "matmul", IREE_DATA_TILING)
    show = per_second(2 * size**3, "GFLOP/s")
    rows: list[Row] = []
    for offset in (NUMPY_OFFSET, 0):
        a, b, c = matmul_arrays(size, size, size, np.float32, offset)
        blas_out = c.copy()
        # Timed calls accumulate into c (linalg.matmul adds to its output): the same work each time.
        cases = [
            Case(blas_variant(), lambda: np.matmul(a, b, out=blas_out), blas_out),
            Case(f"memkernel {static}, pipeline=fast", lambda: fast(a, b, out=c), c, Target(0.95, at_least=True)),
            Case("memkernel memref<?x?xf32>, pipeline=fast", lambda: dynamic(a, b, out=c), c,
                 Target(0.9, at_least=True)),
        ]
        if offset == NUMPY_OFFSET:
            cases += [
                Case(f"memkernel {static}, pipeline=default", lambda: default(a, b, out=c), c),
                iree_case("IREE llvm-cpu local-sync, default flags", iree, a, b),
                iree_case(f"IREE llvm-cpu local-sync, {' '.join(IREE_DATA_TILING)}", iree_tiled, a, b),
            ]
        aligned = "numpy's 16-byte-aligned arrays" if offset else "64-byte-aligned arrays"
        rows += compare(f"matmul, {size}×{size}×{size} f32, out=, {aligned}", cases, a @ b, settings, show,
                        throughput=True)
    return rows


def odd_matmul_rows(settings: Settings) -> list[Row]:
    """GFLOP/s of the other matmul shapes, dynamic memrefs with the fast preset, on numpy-aligned arrays."""
    rows: list[Row] = []
    for m, n, k, element in MATMUL_SHAPES:
        dtype = np.float32 if element == "f32" else np.float64
        a, b, c = matmul_arrays(m, n, k, dtype, NUMPY_OFFSET)
        blas_out = c.copy()
        dynamic = matmul_kernel(f"memref<?x?x{element}>", "fast")
        static_type = memref((m, k), element), memref((k, n), element), memref((m, n), element)
        static = mlir_kernel(MATMUL_STATIC.format(a=static_type[0], b=static_type[1], c=static_type[2]),
                             pipeline="fast")(lambda a, b: None)
        cases = [
            Case(blas_variant(), lambda: np.matmul(a, b, out=blas_out), blas_out),
            Case(f"memkernel memref<?x?x{element}>, pipeline=fast", lambda: dynamic(a, b, out=c), c,
                 Target(0.8, at_least=True)),
            Case("memkernel static memrefs, pipeline=fast", lambda: static(a, b, out=c), c,
                 Target(0.8, at_least=True)),
        ]
        rows += compare(f"matmul, {m}×{n}×{k} {element}, out=, numpy's 16-byte-aligned arrays", cases, a @ b,
                        settings, per_second(2 * m * n * k, "GFLOP/s"), throughput=True)
    return rows


def im2col_conv(x: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """A stride-1, unpadded NHWC × HWCF convolution in numpy, im2col style.

    The windows of ``x`` are a view, which ``np.tensordot`` copies into an im2col matrix
    and multiplies by the filters in one BLAS call.
    """
    windows = np.lib.stride_tricks.sliding_window_view(x, filters.shape[:2], axis=(1, 2))  # n oh ow c kh kw
    return np.tensordot(windows, filters, axes=([3, 4, 5], [2, 0, 1]))


def conv_rows(settings: Settings) -> list[Row]:
    """GFLOP/s of a 3×3 convolution, memkernel's ``linalg.conv_2d_nhwc_hwcf`` against numpy's im2col."""
    (n, h, w, c), (kh, kw, _, f) = CONV_INPUT, CONV_FILTER
    out_shape = (n, h - kh + 1, w - kw + 1, f)
    x, filters = (placed(array, NUMPY_OFFSET) for array in small_integers(CONV_INPUT, CONV_FILTER))
    y = placed(np.zeros(out_shape, np.float32), NUMPY_OFFSET)
    source = CONV.format(x=memref(CONV_INPUT), w=memref(CONV_FILTER), y=memref(out_shape))
    default, fast = (mlir_kernel(source, pipeline=preset)(lambda x, w: None) for preset in ("default", "fast"))
    dims = {name: "x".join(map(str, shape)) + "xf32"
            for name, shape in (("x", CONV_INPUT), ("w", CONV_FILTER), ("y", out_shape))}
    iree = iree_function(IREE_CONV.format(**dims), "conv")
    cases = [
        Case("numpy im2col: sliding_window_view + tensordot", lambda: im2col_conv(x, filters)),
        Case("memkernel conv_2d_nhwc_hwcf, pipeline=fast", lambda: fast(x, filters, out=y), y,
             Target(1.5, at_least=True)),
        Case("memkernel conv_2d_nhwc_hwcf, pipeline=default", lambda: default(x, filters, out=y), y),
        iree_case("IREE llvm-cpu local-sync conv_2d_nhwc_hwcf", iree, x, filters),
    ]
    flops = 2 * n * out_shape[1] * out_shape[2] * kh * kw * c * f
    benchmark = f"conv {kh}×{kw}, {'×'.join(map(str, CONV_INPUT))} → {'×'.join(map(str, out_shape))} f32"
    return compare(benchmark, cases, im2col_conv(x, filters), settings, per_second(flops, "GFLOP/s"),
                   throughput=True)


def parallel_rows(settings: Settings) -> list[Row]:
    """``exp(exp(x))`` on a square float32 array: ``parallel=True`` against the serial kernel."""
    x = np.linspace(-1, 1, EXP_SIDE * EXP_SIDE, dtype=np.float32).reshape(EXP_SIDE, EXP_SIDE)
    y = np.zeros_like(x)
    serial = mlir_kernel(EXP_EXP)(lambda x: None)
    runtime = find_library(ASYNC_RUNTIME) is not None
    threaded = mlir_kernel(EXP_EXP, parallel=True)(lambda x: None) if runtime else None
    cases = [
        Case("memkernel exp(exp(x)), serial", lambda: serial(x, out=y), y),
        Case(f"memkernel exp(exp(x)), parallel=True ({os.cpu_count()} workers)",
             None if threaded is None else lambda: threaded(x, out=y), y),
    ]
    # libm's expf against numpy's own exp: a few ulps apart.
    base, seconds = (measure(case, np.exp(np.exp(x)), settings, rtol=1e-5) for case in cases)
    assert base is not None
    benchmark = f"parallel=True, exp(exp(x)), {EXP_SIDE}×{EXP_SIDE}×f32, out="
    rows = [(benchmark, cases[0].variant, milliseconds(base), "1.00 (base: serial)", "—")]
    if seconds is None:
        return [*rows, not_installed(benchmark, cases[1].variant)]
    ratio = f"{seconds / base:.2f} of serial ({base / seconds:.2f}× speedup)"
    return [*rows, (benchmark, cases[1].variant, milliseconds(seconds), ratio, "—"), *parallel_matmul_rows(settings),
            *after_blas_rows(settings)]


def parallel_matmul_rows(settings: Settings) -> list[Row]:
    """GFLOP/s of a large f32 matmul with ``parallel=True``: against the serial kernel, then numpy on as many threads."""
    size = PARALLEL_MATMUL_SIZE
    workers = os.cpu_count() or 1
    benchmark = f"parallel=True, matmul {size}×{size}×{size} f32, out=, numpy's 16-byte-aligned arrays"
    base = "memkernel memref<?x?xf32>, pipeline=fast, serial (base)"
    variant = f"memkernel memref<?x?xf32>, pipeline=fast, parallel=True ({workers} workers)"
    blas = f"np.matmul(a, b, out=c), {workers} OpenBLAS threads"
    if find_library(ASYNC_RUNTIME) is None:  # the table keeps its rows
        return [not_installed(benchmark, name) for name in (base, variant, blas, variant)]
    a, b, c = matmul_arrays(size, size, size, np.float32, NUMPY_OFFSET)
    blas_out = c.copy()
    serial, threaded = (mlir_kernel(MATMUL.format(t="memref<?x?xf32>"), pipeline="fast", parallel=parallel)(
        lambda a, b: None) for parallel in (False, True))
    show = per_second(2 * size**3, "GFLOP/s")
    rows = compare(benchmark, [
        Case(base, lambda: serial(a, b, out=c), c),
        Case(variant, lambda: threaded(a, b, out=c), c, Target(0.9 * workers, at_least=True)),
    ], a @ b, settings, show, throughput=True)
    with blas_threads(workers) as switched:
        if not switched:
            return [*rows, (benchmark, blas, "not OpenBLAS: its threads are not set", "—", "—")]
        return rows + compare(benchmark, [
            Case(blas, lambda: np.matmul(a, b, out=blas_out), blas_out),
            Case(variant, lambda: threaded(a, b, out=c), c, Target(0.9, at_least=True)),
        ], a @ b, settings, show, throughput=True)


AFTER_BLAS_SIZE = 1024


def after_blas_rows(settings: Settings) -> list[Row]:
    """``parallel=True`` as a user's process meets it: right after numpy's matmul on as many OpenBLAS threads, whose
    threads busy-wait for work about 0.1 s after each call (``OPENBLAS_THREAD_TIMEOUT``), against the same kernel
    when nothing ran before it. Each round runs the OpenBLAS matmul (untimed), then times the serial and the
    parallel kernel, each right after it; the ratio is the median of serial time / parallel time, and its worst
    round. Whether the kernel's threads meet the spinning ones varies from process to process."""
    size, workers = AFTER_BLAS_SIZE, os.cpu_count() or 1
    benchmark = f"parallel=True, matmul {size}×{size}×{size} f32, out=, after other work"
    quiet = f"parallel=True ({workers} workers), nothing just before: speed-up over serial"
    blas = f"the same right after np.matmul on {workers} OpenBLAS threads"
    if find_library(ASYNC_RUNTIME) is None:  # the table keeps its rows
        return [not_installed(benchmark, name) for name in (quiet, blas)]
    with blas_threads(workers) as switched:
        if not switched:
            return [(benchmark, name, "not OpenBLAS: its threads are not set", "—", "—") for name in (quiet, blas)]
        speedups = _speedups_after_blas(size, settings)
    return [
        (benchmark, quiet, "—", f"{statistics.median(speedups['quiet']):.2f}× speed-up "
         f"(worst round {min(speedups['quiet']):.2f}×)", "—"),
        (benchmark, blas, "—", f"{statistics.median(speedups['blas']):.2f}× speed-up "
         f"(worst round {min(speedups['blas']):.2f}×)", "—"),
    ]


def _speedups_after_blas(size: int, settings: Settings) -> dict[str, list[float]]:
    """Each round's serial time / parallel time, right after numpy's matmul ("blas") and after a sleep ("quiet")."""
    a, b, c = matmul_arrays(size, size, size, np.float32, NUMPY_OFFSET)
    serial, threaded = (mlir_kernel(MATMUL.format(t="memref<?x?xf32>"), pipeline="fast", parallel=parallel)(
        lambda a, b: None) for parallel in (False, True))
    speedups: dict[str, list[float]] = {"blas": [], "quiet": []}
    for case in speedups:
        for _ in range(settings.repeats):
            times = []
            for kernel in (serial, threaded):
                if case == "blas":
                    np.matmul(a, b)
                else:
                    time.sleep(0.3)  # longer than any OpenBLAS thread spins
                c.fill(0)  # linalg.matmul accumulates
                start = time.perf_counter()
                kernel(a, b, out=c)
                times.append(time.perf_counter() - start)
            speedups[case].append(times[0] / times[1])
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-2)
    return speedups


GUFUNC_BATCH = 10**4
# C = A @ B on 8x8 f32 matrices in the vector dialect: a row of C in a register, one FMA per k.
MATMUL_8X8_VECTOR = """
func.func @matmul8(%a: memref<8x8xf32>, %b: memref<8x8xf32>, %c: memref<8x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %i = %c0 to %c8 step %c1 {
    %init = vector.load %c[%i, %c0] : memref<8x8xf32>, vector<8xf32>
    %row = scf.for %k = %c0 to %c8 step %c1 iter_args(%acc = %init) -> (vector<8xf32>) {
      %x = memref.load %a[%i, %k] : memref<8x8xf32>
      %y = vector.load %b[%k, %c0] : memref<8x8xf32>, vector<8xf32>
      %s = vector.broadcast %x : f32 to vector<8xf32>
      %n = vector.fma %s, %y, %acc : vector<8xf32>
      scf.yield %n : vector<8xf32>
    }
    vector.store %row, %c[%i, %c0] : memref<8x8xf32>, vector<8xf32>
  }
  return
}
"""

# The same product written to keep B in registers: B's eight rows loaded once, each row of C summed from zero and
# stored, never read. The first kernel reads C (which the loop zero-fills) and, as C may alias B, reloads B's rows
# for every row of C.
MATMUL_8X8_REGISTERS = """
func.func @matmul8r(%a: memref<8x8xf32>, %b: memref<8x8xf32>, %c: memref<8x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  %c5 = arith.constant 5 : index
  %c6 = arith.constant 6 : index
  %c7 = arith.constant 7 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant dense<0.0> : vector<8xf32>
  %b0 = vector.load %b[%c0, %c0] : memref<8x8xf32>, vector<8xf32>
  %b1 = vector.load %b[%c1, %c0] : memref<8x8xf32>, vector<8xf32>
  %b2 = vector.load %b[%c2, %c0] : memref<8x8xf32>, vector<8xf32>
  %b3 = vector.load %b[%c3, %c0] : memref<8x8xf32>, vector<8xf32>
  %b4 = vector.load %b[%c4, %c0] : memref<8x8xf32>, vector<8xf32>
  %b5 = vector.load %b[%c5, %c0] : memref<8x8xf32>, vector<8xf32>
  %b6 = vector.load %b[%c6, %c0] : memref<8x8xf32>, vector<8xf32>
  %b7 = vector.load %b[%c7, %c0] : memref<8x8xf32>, vector<8xf32>
  scf.for %i = %c0 to %c8 step %c1 {
    %x0 = memref.load %a[%i, %c0] : memref<8x8xf32>
    %x1 = memref.load %a[%i, %c1] : memref<8x8xf32>
    %x2 = memref.load %a[%i, %c2] : memref<8x8xf32>
    %x3 = memref.load %a[%i, %c3] : memref<8x8xf32>
    %x4 = memref.load %a[%i, %c4] : memref<8x8xf32>
    %x5 = memref.load %a[%i, %c5] : memref<8x8xf32>
    %x6 = memref.load %a[%i, %c6] : memref<8x8xf32>
    %x7 = memref.load %a[%i, %c7] : memref<8x8xf32>
    %s0 = vector.broadcast %x0 : f32 to vector<8xf32>
    %s1 = vector.broadcast %x1 : f32 to vector<8xf32>
    %s2 = vector.broadcast %x2 : f32 to vector<8xf32>
    %s3 = vector.broadcast %x3 : f32 to vector<8xf32>
    %s4 = vector.broadcast %x4 : f32 to vector<8xf32>
    %s5 = vector.broadcast %x5 : f32 to vector<8xf32>
    %s6 = vector.broadcast %x6 : f32 to vector<8xf32>
    %s7 = vector.broadcast %x7 : f32 to vector<8xf32>
    %r0 = vector.fma %s0, %b0, %zero : vector<8xf32>
    %r1 = vector.fma %s1, %b1, %r0 : vector<8xf32>
    %r2 = vector.fma %s2, %b2, %r1 : vector<8xf32>
    %r3 = vector.fma %s3, %b3, %r2 : vector<8xf32>
    %r4 = vector.fma %s4, %b4, %r3 : vector<8xf32>
    %r5 = vector.fma %s5, %b5, %r4 : vector<8xf32>
    %r6 = vector.fma %s6, %b6, %r5 : vector<8xf32>
    %r7 = vector.fma %s7, %b7, %r6 : vector<8xf32>
    vector.store %r7, %c[%i, %c0] : memref<8x8xf32>, vector<8xf32>
  }
  return
}
"""


def gufunc_rows(settings: Settings) -> list[Row]:
    """10^4 × (8×8 @ 8×8) f32 through ``kernel.gufunc()``, against ``np.matmul`` on the same arrays, ``out=``."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((GUFUNC_BATCH, 8, 8), dtype=np.float32) for _ in range(2))
    out = np.zeros_like(a)
    vector = mlir_kernel(MATMUL_8X8_VECTOR)(lambda a, b: None).gufunc()
    threaded = mlir_kernel(MATMUL_8X8_VECTOR, parallel=True)(lambda a, b: None).gufunc()
    registers = mlir_kernel(MATMUL_8X8_REGISTERS)(lambda a, b: None).gufunc()
    dynamic = mlir_kernel(MATMUL.format(t="memref<?x?xf32>"))(lambda a, b: None).gufunc()
    fast = mlir_kernel(MATMUL.format(t="memref<?x?xf32>"), pipeline="fast")(lambda a, b: None).gufunc()
    cases = [
        Case("numpy np.matmul", lambda: np.matmul(a, b, out=out), out),
        Case("memkernel gufunc, vector-dialect memref<8x8xf32> kernel", lambda: vector(a, b, out=out), out,
             Target(0.667)),
        Case("memkernel gufunc, the kernel keeping B in registers, C never read", lambda: registers(a, b, out=out),
             out, Target(0.667)),
        Case(f"memkernel gufunc, the first kernel, parallel=True ({os.cpu_count()} threads)",
             lambda: threaded(a, b, out=out), out),
        Case("memkernel gufunc, linalg.matmul on memref<?x?xf32>, pipeline=default", lambda: dynamic(a, b, out=out),
             out),
        Case("memkernel gufunc, linalg.matmul on memref<?x?xf32>, pipeline=fast", lambda: fast(a, b, out=out), out),
    ]
    return compare(f"gufunc, {GUFUNC_BATCH} × (8×8 @ 8×8) f32, out=", cases, np.matmul(a, b), settings,
                   microseconds, rtol=1e-5, atol=1e-5)


def torch_rows(settings: Settings) -> list[Row]:
    """The add kernel as a torch op (``kernel.as_torch_op``), eager and compiled, against ``torch.add``."""
    sizes = (SMALL, settings.bandwidth_n)
    variants = ("torch.add(a, b)", "memkernel add op (as_torch_op), eager",
                "memkernel add op in torch.compile(fullgraph=True)")
    if not installed("torch"):
        return [not_installed(f"torch op, {n:,}×f32, allocating", v) for n in sizes for v in variants]
    import torch

    torch.set_num_threads(1)  # one thread, as the kernel runs on one and numpy's BLAS does in the other rows
    op = add_kernel("torch_add").as_torch_op(f"memkernel_benchmarks::add_{uuid.uuid4().hex[:8]}")
    compiled = torch.compile(lambda a, b: op(a, b), fullgraph=True)
    rows = []
    for n in sizes:
        a, b = (torch.from_numpy(x) for x in operands(n)[:2])
        rows += compare(f"torch op, {n:,}×f32, allocating", [
            Case(variants[0], lambda: torch.add(a, b)),
            Case(variants[1], lambda: op(a, b)),
            Case(variants[2], lambda: compiled(a, b)),
        ], (a + b).numpy(), settings, microseconds)
    return rows


def jax_rows(settings: Settings) -> list[Row]:
    """The add kernel as a JAX function (``kernel.as_jax``, an XLA FFI call) under ``jax.jit``, against
    ``jnp.add`` under ``jax.jit``, each call waited for."""
    sizes = (SMALL, settings.bandwidth_n)
    variants = ("jax.jit(jnp.add)(a, b)", "jax.jit(kernel.as_jax())(a, b), XLA FFI handler")
    if not installed("jax"):
        return [not_installed(f"JAX under jit, {n:,}×f32", v) for n in sizes for v in variants]
    # One thread for XLA's CPU ops, as the kernel runs on one; XLA reads the flags when JAX starts its backend.
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp

    add, mine = jax.jit(jnp.add), jax.jit(add_kernel("jax_add").as_jax())
    rows = []
    for n in sizes:
        a, b = (jnp.asarray(x) for x in operands(n)[:2])
        rows += compare(f"JAX under jit, {n:,}×f32", [
            Case(variants[0], lambda: add(a, b).block_until_ready()),
            Case(variants[1], lambda: mine(a, b).block_until_ready()),
        ], np.asarray(a + b), settings, microseconds)
    return rows


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
    first_call_seconds(unique_name(), cache=False)  # the compile worker started: the rows time warm compiles
    cold, here = [], []
    for _ in range(repeats):  # the worker and in-process compiles alternately
        cold.append(first_call_seconds(unique_name(), cache=False))
        os.environ["MEMKERNEL_COMPILE_WORKER"] = "0"
        try:
            here.append(first_call_seconds(unique_name(), cache=False))
        finally:
            del os.environ["MEMKERNEL_COMPILE_WORKER"]
    cold_time, here_time = min(cold), min(here)
    name = unique_name()
    first_call_seconds(name, cache=True)
    warm = min(first_call_seconds(name, cache=True) for _ in range(settings.repeats))
    uncached, cached = disk_cache_seconds(repeats)
    benchmark = "compile, add kernel"
    return [
        (benchmark, "cache=False, compiled in the compile worker", milliseconds(cold_time), "1.00 (base A)", "—"),
        (benchmark, "MEMKERNEL_COMPILE_WORKER=0, cache=False (compiles here)", milliseconds(here_time),
         f"{cold_time / here_time:.2f}: worker / here", Target(1.2).verdict(cold_time / here_time)),
        (benchmark, "in process, re-decorated (memory cache)", milliseconds(warm), f"{warm / cold_time:.3f} of A",
         "—"),
        (benchmark, "fresh process, empty disk cache", milliseconds(uncached), "1.00 (base B)", "—"),
        (benchmark, "fresh process, disk cache hit", milliseconds(cached), f"{cached / uncached:.3f} of B",
         Target(0.2).verdict(cached / uncached)),
    ]


START_SCRIPT = """import sys
import numpy as np
from memkernel import mlir_kernel
a = np.ones(16, np.float32)
assert (mlir_kernel(sys.argv[1], name=sys.argv[2])(lambda a, b: None)(a, a) == 2).all()
"""
"""A user's script: import memkernel, decorate the add kernel named ``argv[2]``, call it once."""
COMPILE_THREADS = 16


def process_seconds(arguments: Sequence[str], cache_dir: str) -> float:
    """Wall-clock seconds of a new interpreter running ``arguments``, start-up included."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *arguments], env={**os.environ, "MEMKERNEL_CACHE_DIR": cache_dir},
                   capture_output=True, text=True, check=True)
    return time.perf_counter() - start


def startup_rows(settings: Settings) -> list[Row]:
    """A whole fresh process, import to first result, against ``python -c "import numpy"``: with the kernel in
    the disk cache, then with an empty one (the compile included); each round times the three in turn."""
    numpy_only, warm, cold, served = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="memkernel-bench-") as folder:
        name = unique_name()
        script = ["-c", START_SCRIPT, ADD.format(name=name), name]
        process_seconds(script, folder)  # the entry the warm rows load (and the compile server the last row uses)
        for _ in range(settings.repeats):
            numpy_only.append(process_seconds(["-c", "import numpy"], folder))
            warm.append(process_seconds(script, folder))
            with tempfile.TemporaryDirectory(prefix="memkernel-bench-") as empty:
                fresh = unique_name()
                cold.append(process_seconds(["-c", START_SCRIPT, ADD.format(name=fresh), fresh], empty))
            fresh = unique_name()
            served.append(process_seconds(["-c", START_SCRIPT, ADD.format(name=fresh), fresh], folder))
    base = statistics.median(numpy_only)
    benchmark = "start-up, fresh process to first result"
    return [
        (benchmark, 'python -c "import numpy"', milliseconds(base), "1.00", "—"),
        (benchmark, "import memkernel, decorate, first call: warm disk cache", milliseconds(statistics.median(warm)),
         f"{statistics.median(warm) / base:.2f}", Target(2.0).verdict(statistics.median(warm) / base)),
        (benchmark, "the same, empty disk cache (compiles)", milliseconds(statistics.median(cold)),
         f"{statistics.median(cold) / base:.2f}", Target(4.0).verdict(statistics.median(cold) / base)),
        (benchmark, "the same, a new kernel, compile server left running by the last process",
         milliseconds(statistics.median(served)), f"{statistics.median(served) / base:.2f}",
         Target(4.0).verdict(statistics.median(served) / base)),
    ]


def compile_many_seconds(threads: bool) -> float:
    """Seconds to decorate and first-call :data:`COMPILE_THREADS` distinct add kernels: each in a thread of its
    own, all started at once, or one after the other."""
    a = np.ones(SMALL, np.float32)

    def first_call() -> None:
        add_kernel(unique_name(), cache=False)(a, a)

    start = time.perf_counter()
    if threads:
        workers = [threading.Thread(target=first_call) for _ in range(COMPILE_THREADS)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    else:
        for _ in range(COMPILE_THREADS):
            first_call()
    return time.perf_counter() - start


def compile_threads_rows(settings: Settings) -> list[Row]:
    """Many first compiles at once (a test session, a notebook's first cell), against one at a time."""
    compile_many_seconds(threads=True)  # the pool's worker processes started: the rows time warm compiles
    alone, together = [], []
    for _ in range(settings.compile_repeats):
        alone.append(compile_many_seconds(threads=False))
        together.append(compile_many_seconds(threads=True))
    base, seconds = min(alone), min(together)
    benchmark = f"compile, {COMPILE_THREADS} distinct add kernels, decoration to first call"
    return [
        (benchmark, "one at a time (base)", milliseconds(base), "1.00 (base)", "—"),
        (benchmark, f"from {COMPILE_THREADS} threads at once ({os.cpu_count()} CPUs)", milliseconds(seconds),
         f"{seconds / base:.2f} of one at a time", "—"),
    ]


# y[i] = x[i] * s in an scf loop bounded by memref.dim: what checked=True guards access by access.
SCALE_LOOP = """func.func @scale(%x: memref<?xf32>, %s: f32, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    %w = arith.mulf %v, %s : f32
    memref.store %w, %y[%i] : memref<?xf32>
  }
  return
}"""


def checked_rows(settings: Settings) -> list[Row]:
    """What checked=True costs: the same kernels with and without runtime verification, time / unchecked."""
    small, large = operands(SMALL), operands(settings.bandwidth_n)
    rows: list[Row] = []
    for label, (a, b, c), show in ((f"{SMALL}×f32", small, microseconds),
                                   (f"{settings.bandwidth_n:,}×f32", large, milliseconds)):
        plain, checked = (add_kernel(), mlir_kernel(ADD.format(name="add"), checked=True)(lambda a, b: None))
        rows += compare(f"checked=True, add, {label}, out=", [
            Case("memkernel add, unchecked (base)", lambda: plain(a, b, out=c), c),
            Case("memkernel add, checked=True", lambda: checked(a, b, out=c), c,
                 Target(3.0) if show is microseconds else None),
        ], a + b, settings, show)
    x = large[0]
    y = np.zeros_like(x)
    loop, loop_checked = (mlir_kernel(SCALE_LOOP, checked=flag)(lambda x, s, y: None) for flag in (False, True))
    rows += compare(f"checked=True, scf loop y = 2x, {settings.bandwidth_n:,}×f32", [
        Case("memkernel loop, unchecked (base)", lambda: loop(x, 2.0, y), y),
        Case("memkernel loop, checked=True", lambda: loop_checked(x, 2.0, y), y),
    ], 2 * x, settings, milliseconds)
    a, b = small_integers((256, 256), (256, 256))
    c = np.zeros((256, 256), np.float32)
    source = MATMUL.format(t="memref<?x?xf32>")
    mm, mm_checked = (mlir_kernel(source, pipeline="fast", checked=flag)(lambda a, b: None) for flag in (False, True))

    def zeroed(kernel: Any) -> Callable[[], Any]:
        return lambda: (c.fill(0), kernel(a, b, out=c))

    rows += compare("checked=True, matmul 256³ f32, pipeline=fast", [
        Case("memkernel matmul, unchecked (base)", zeroed(mm), c),
        Case("memkernel matmul, checked=True", zeroed(mm_checked), c),
    ], a @ b, settings, milliseconds)
    return based(rows)


def based(rows: list[Row]) -> list[Row]:
    """``rows`` whose baseline is memkernel itself, its ratio marked as the base."""
    return [(bench, variant, time, "1.00 (base)" if "(base)" in variant else ratio, target)
            for bench, variant, time, ratio, target in rows]


def isolate_rows(settings: Settings) -> list[Row]:
    """What isolate=True costs: the add kernel on 16 floats against np.add, then on large arrays, plain and in
    shared_empty memory, in the worker process against in process (time / in process)."""
    isolated = mlir_kernel(ADD.format(name="add"), isolate=True)(lambda a, b: None)
    plain = add_kernel()
    a, b, c = operands(SMALL)
    sa, sb, sc = (shared_asarray(x) for x in (a, b, c))
    rows = compare(f"isolate=True, add, {SMALL}×f32, out=", [
        Case("np.add(a, b, out=c)", lambda: np.add(a, b, out=c), c),
        Case("memkernel add, in process", lambda: plain(a, b, out=c), c),
        Case("memkernel add, isolate=True", lambda: isolated(a, b, out=c), c, Target(50)),
        Case("memkernel add, isolate=True, shared_empty arrays", lambda: isolated(sa, sb, out=sc), sc),
    ], a + b, settings, microseconds)
    a, b, c = operands(settings.bandwidth_n)
    rows += based(compare(f"isolate=True, add, {settings.bandwidth_n:,}×f32, out=", [
        Case("memkernel add, in process (base)", lambda: plain(a, b, out=c), c),
        Case("memkernel add, isolate=True", lambda: isolated(a, b, out=c), c),
    ], a + b, settings, milliseconds))
    sa, sb, sc = (shared_asarray(x) for x in (a, b, c))
    del a, b, c
    rows += based(compare(f"isolate=True, add, {settings.bandwidth_n:,}×f32 in shared_empty arrays, out=", [
        Case("memkernel add, in process (base)", lambda: plain(sa, sb, out=sc), sc),
        Case("memkernel add, isolate=True", lambda: isolated(sa, sb, out=sc), sc, Target(1.2)),
    ], sa + sb, settings, milliseconds))
    return rows


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


def openblas_function(name: str) -> Any | None:
    """The C function ``name`` (``get_num_threads``, say) of the OpenBLAS numpy loaded; None without one.

    Found from the library's path in /proc/self/maps, as threadpoolctl does.
    """
    maps = Path("/proc/self/maps")
    lines = maps.read_text().splitlines() if maps.exists() else []
    paths = sorted({line.split()[-1] for line in lines if "openblas" in line.rsplit("/", 1)[-1]})
    for path in paths:
        library = ctypes.CDLL(path)
        for prefix, suffix in OPENBLAS_NAMES:
            if hasattr(library, f"{prefix}get_config{suffix}"):
                return getattr(library, f"{prefix}{name}{suffix}")
    return None


def numpy_blas() -> str:
    """numpy's OpenBLAS as it runs in this process: version, the CPU kernels it picked, threads."""
    config, corename, get_threads = map(openblas_function, ("get_config", "get_corename", "get_num_threads"))
    if config is None or corename is None or get_threads is None:
        return "not OpenBLAS"
    threads = get_threads()
    config.restype = corename.restype = ctypes.c_char_p
    name = " ".join(config().decode().split()[:2])
    return f"{name}, {corename().decode()} kernels, {threads} thread{'s' if threads > 1 else ''}"


@contextlib.contextmanager
def blas_threads(threads: int) -> Iterator[bool]:
    """Let numpy's OpenBLAS use ``threads`` threads inside the block, then as many as before.

    Yields whether it could (False when numpy's BLAS is not OpenBLAS).
    """
    get, set_threads = openblas_function("get_num_threads"), openblas_function("set_num_threads")
    if get is None or set_threads is None:
        yield False
        return
    before = get()
    set_threads(threads)
    try:
        yield True
    finally:
        set_threads(before)


def machine() -> str:
    """One line: the CPU, Python, the versions of what is compared and numpy's BLAS."""
    packages = ["memkernel", "numpy", "xtc-mlir-python-bindings", "numba", "iree-base-compiler",
                "iree-base-runtime"]
    listed = ", ".join(f"{p} {version(p)}" for p in packages)
    return (f"{cpu_model()} ({os.cpu_count()} CPUs), Python {platform.python_version()}; {listed}; "
            f"numpy's BLAS: {numpy_blas()}")


NOTES = """\
- Each time is the minimum over repeats of the mean of a timeit loop, after a call that
  checks the result against numpy; the variants of a group are timed in turns, one loop
  each per round, so load from other processes falls on all of them alike. The ratio is
  the median over rounds of each round's time / numpy time of the same group, except
  for the rows shown in GB/s or GFLOP/s (throughput / numpy's, higher is better), the
  parallel rows (exp: time / serial time; the matmul's first group: throughput / the
  serial kernel's) and compile time (see its rows).
- torch and JAX rows: the kernel called on torch tensors (JAX arrays), which it reads through
  DLPack; the ratio is time / torch's (jax.numpy's) add on the same arrays, and the JAX call
  returns a JAX array holding a copy of the output (`jnp.asarray`).
- Targets: memkernel `out=` ≤ 1× `np.add(out=)`, and ≤ 1× `torch.add(out=)` on tensors; allocating ≤ 1.5× `np.add`; add bandwidth
  ≥ 0.9 of numpy with either pipeline; sum with `pipeline="fast"` ≥ 0.9 of `x.sum()`;
  matmul 512³ f32 with `pipeline="fast"` ≥ 0.95 of numpy (static shapes) and ≥ 0.9 (dynamic,
  on either alignment); the other matmul shapes ≥ 0.8; the convolution with
  `pipeline="fast"` ≥ 1.5× numpy's im2col; disk cache hit ≤ 0.2 of the fresh-process
  compile (base B); the 2048³ f32 matmul with `parallel=True` ≥ 0.9 × workers times its
  serial throughput, and ≥ 0.9 of numpy's on as many OpenBLAS threads; an `isolate=True`
  call on 16 floats ≤ 50× `np.add(out=)`, and on large `shared_empty` arrays ≤ 1.2× the same
  call in process. The other rows have no target.
- Alignment: numpy's own allocations start 16 bytes past a 64-byte boundary; the matmul
  and convolution arrays are placed so (and, in the second 512³ group, 64-byte aligned),
  whatever the allocator happens to return in this run.
- numpy's BLAS should run on one thread, as memkernel's kernels do (`parallel=True`
  aside), and without the `OPENBLAS_CORETYPE`/`OPENBLAS_L2_SIZE` overrides some machines
  set for old OpenBLAS builds: run the script as `env -u OPENBLAS_CORETYPE -u
  OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 python benchmarks/run.py`. The machine line shows
  the BLAS kernels and threads numpy actually used. The parallel matmul's second group
  alone lets numpy's OpenBLAS use one thread per worker (`openblas_set_num_threads`), and
  sets it back after.
- The memref sum with the fast preset has its add marked `reassoc`; LLVM then vectorizes it,
  behind its own runtime check that the output does not overlap the input. The fast preset
  has no strategy for elementwise ops: those rows take the default lowering.
- IREE rows (matmul, convolution) allocate and return their output and copy it back with
  `.to_host()`, which the preallocated numpy and memkernel calls do not; on these sizes the
  copy is a few percent of the time.
- bare ctypes: the kernel's packed C interface called on descriptors built once: the floor
  of any Python caller. upstream: `ExecutionEngine.invoke` with `get_ranked_memref_descriptor`
  per call. IREE returns a new array (`.to_host()`), so it is timed against `np.add(a, b)`;
  it runs on the `local-sync` driver, the one without a thread pool to dispatch to.
- checked=True rows: the same kernel with and without runtime verification; the ratio is
  time / unchecked time (the checked kernel takes the Python call path, through its guard).
  isolate=True rows: the add kernel on 16 floats, against `np.add(out=)` (target ≤ 50×); then
  on large arrays in this process and in the worker process, the ratio time / in-process time:
  plain arrays are copied into shared memory and the written one back, `memkernel.shared_empty`
  arrays are not copied (target ≤ 1.2×).
- Compile rows time decoration through the first call. Base A compiles in the compile worker
  (started before timing); the row after it compiles in this process (`MEMKERNEL_COMPILE_WORKER=0`),
  alternately with A, and shows what the worker adds (target ≤ 1.2×);
  base B is a new interpreter (import start-up excluded) with an empty disk cache, and
  includes writing the cache entry that the disk-cache-hit row then loads.
- Start-up rows time whole new interpreters from the outside, start-up included: `python -c
  "import numpy"`, then a script that imports memkernel, decorates the add kernel and calls it
  once, with the kernel in the disk cache, then with an empty one (so it compiles, starting the
  compile server), then a new kernel in the first cache folder, whose compile server the earlier
  processes left running (an edit-run loop); they run in turn each round and the median is kept.
  Targets: ≤ 2× and ≤ 4× numpy's import.
- The 16-kernel compile rows decorate and first-call 16 distinct add kernels (no cache), one
  after the other, then each from a thread of its own, all at once: the compile worker's pool
  (up to one process per CPU) serves them in parallel.
- The checked=True 16-float row's target is ≤ 3× the unchecked call.
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


SECTIONS: dict[str, Callable[[Settings], list[Row]]] = {
    "overhead": overhead_rows, "tensors": tensor_rows, "bandwidth": bandwidth_rows, "sum": sum_rows, "matmul": matmul_rows,
    "matmul-shapes": odd_matmul_rows, "conv": conv_rows, "parallel": parallel_rows, "gufunc": gufunc_rows,
    "torch": torch_rows, "jax": jax_rows,
    "compile": compile_rows, "startup": startup_rows, "compile-threads": compile_threads_rows,
    "checked": checked_rows, "isolate": isolate_rows,
}
"""The table's sections, in order, by the name ``--only`` takes."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few repeats, smaller arrays")
    parser.add_argument("--markdown", type=Path, default=Path(__file__).with_name("results.md"),
                        help="where to write the markdown table (default: benchmarks/results.md)")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), metavar="SECTION",
                        help=f"run only these sections, in the table's order: {', '.join(SECTIONS)}")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    os.environ["MEMKERNEL_CACHE_DIR"] = ""  # in this process: no disk cache, and the user's is untouched
    chosen = [name for name in SECTIONS if not args.only or name in args.only]
    rows = [row for name in chosen for row in SECTIONS[name](settings)]
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "") + (
        f" --only {' '.join(chosen)}" if args.only else "")
    report = markdown(rows, machine(), command)
    print(report)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
