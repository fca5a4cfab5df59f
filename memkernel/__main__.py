"""``python -m memkernel``: with no arguments, compile a small built-in kernel, check it against numpy and
print the result; with arguments, the command line (see :mod:`memkernel.cli`)."""

from __future__ import annotations

import sys

import numpy as np

from memkernel import Kernel, MemkernelError, mlir_kernel

DEMO = """
func.func @matmul_bias(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %bias: memref<?xf32>,
                       %c: memref<?x?xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%bias : memref<?xf32>) outs(%c : memref<?x?xf32>) {
  ^bb0(%x: f32, %acc: f32):
    %sum = arith.addf %x, %acc : f32
    linalg.yield %sum : f32
  }
  return
}
"""


def demo_kernel() -> Kernel:
    """The demo's kernel, decorated when the demo runs (not at import: ``python -m memkernel build`` must not
    need the compiler to read it)."""

    @mlir_kernel(DEMO)
    def matmul_bias(a, b, bias):  # type: ignore[no-untyped-def]
        """``a @ b + bias``; the body gives the shape of the output ``c``."""
        return (a.shape[0], b.shape[1])

    return matmul_bias


def main() -> int:
    matmul_bias = demo_kernel()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3), dtype=np.float32)
    b = rng.standard_normal((3, 5), dtype=np.float32)
    bias = rng.standard_normal(5, dtype=np.float32)
    print(f"kernel: {matmul_bias!r}")
    c = matmul_bias(a, b[:, ::-1].copy()[:, ::-1], bias)  # a strided view works too
    expected = a @ b + bias
    np.set_printoptions(precision=4, suppress=True)
    print(f"result ({c.dtype}, shape {c.shape}):\n{c}")
    if not np.allclose(c, expected, rtol=1e-5, atol=1e-5):
        print("MISMATCH against numpy", file=sys.stderr)
        return 1
    print("matches numpy (a @ b + bias): OK")
    return 0


def run(arguments: list[str]) -> int:
    """The demo with no ``arguments``, else the command line; an error memkernel raises is one line,
    ``memkernel: error: ...``, and exit status 1 (the command line needs the compiler, which the runtime-only
    install lacks)."""
    try:
        if arguments:
            try:
                from memkernel.cli import main as command_line
            except ImportError as exc:
                print(f"memkernel: error: the command line needs memkernel's compiler and the MLIR Python bindings, "
                      f"which cannot be imported here ({exc}). Install them: pip install memkernel.", file=sys.stderr)
                return 1
            return command_line(arguments)
        return main()
    except MemkernelError as exc:
        print(f"memkernel: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
