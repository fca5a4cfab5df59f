"""The fuzz test's kernels and calls, as plain data, and the code that runs one call and judges it.

A :class:`KernelCase` is a kernel template with its parameters (the MLIR source
and a numpy reference follow from it); a :class:`CallCase` says how to build
each argument. :func:`run` builds the kernel (once per process), builds the
arguments inside guarded buffers, calls the kernel and returns what went wrong:
an answer unlike numpy's, a write outside the arrays passed, a changed input
the kernel does not write, or an error that is not a MemkernelError naming an
argument. It runs in the fuzz worker process (``tests/fuzz/worker.py``), so a
crash is a reported failure rather than a dead test run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..kernels import elementwise

SENTINEL = 0x5A


@dataclass(frozen=True)
class KernelCase:
    """One kernel: ``kind`` picks the template; the rest are its parameters."""

    kind: str  # "binary", "matmul", "reduce", "loop", "two", "scalars"
    element: str = "f32"
    rank: int = 1
    static: tuple[int | None, ...] = ()
    strided: bool = False

    @property
    def dtype(self) -> np.dtype:
        return np.dtype({"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}[self.element])

    def memref(self, shape: tuple[int | None, ...] | None = None) -> str:
        dims = shape if shape is not None else (self.static or (None,) * self.rank)
        text = "x".join("?" if d is None else str(d) for d in dims)
        layout = ""
        if self.strided and dims:
            layout = ", strided<[" + ", ".join("?" for _ in dims) + "], offset: ?>"
        return f"memref<{text}{'x' if dims else ''}{self.element}{layout}>"

    @property
    def names(self) -> tuple[str, ...]:
        return {"binary": ("a", "b"), "matmul": ("a", "b"), "reduce": ("x",), "loop": ("x", "s", "y"),
                "two": ("a", "b"), "scalars": ("p", "q", "r")}[self.kind]

    def source(self) -> str:
        t, m = self.element, self.memref()
        floating = t.startswith("f")
        add, mul, sub = ("arith.addf", "arith.mulf", "arith.subf") if floating else \
            ("arith.addi", "arith.muli", "arith.subi")
        if self.kind == "binary":
            return elementwise(add, m, t, self.rank)
        if self.kind == "matmul":
            m2 = self.memref((None, None))
            return f"""func.func @k(%a: {m2}, %b: {m2}, %c: {m2}) {{
  linalg.matmul ins(%a, %b : {m2}, {m2}) outs(%c : {m2})
  return
}}"""
        if self.kind == "reduce":
            m1 = self.memref((None,))
            return f"""func.func @k(%x: {m1}, %out: memref<{t}>) {{
  linalg.reduce ins(%x : {m1}) outs(%out : memref<{t}>) dimensions = [0]
    (%v: {t}, %acc: {t}) {{
      %s = {add} %v, %acc : {t}
      linalg.yield %s : {t}
    }}
  return
}}"""
        if self.kind == "loop":
            m1 = self.memref((None,))
            return f"""func.func @k(%x: {m1}, %s: {t}, %y: {m1}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : {m1}
  scf.for %i = %c0 to %n step %c1 {{
    %v = memref.load %x[%i] : {m1}
    %w = {mul} %v, %s : {t}
    memref.store %w, %y[%i] : {m1}
  }}
  return
}}"""
        if self.kind == "two":
            m1 = self.memref((None,))
            return f"""func.func @k(%a: {m1}, %b: {m1}, %s: {m1}, %d: {m1}) {{
  linalg.generic {{indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>,
                                   affine_map<(i) -> (i)>],
                  iterator_types = ["parallel"]}}
      ins(%a, %b : {m1}, {m1}) outs(%s, %d : {m1}, {m1}) {{
  ^bb0(%x: {t}, %y: {t}, %u: {t}, %v: {t}):
    %p = {add} %x, %y : {t}
    %q = {sub} %x, %y : {t}
    linalg.yield %p, %q : {t}, {t}
  }}
  return
}}"""
        assert self.kind == "scalars"
        return """func.func @k(%p: i8, %q: i32, %r: f32) -> (i8, i32, f32) {
  %one8 = arith.constant 1 : i8
  %one32 = arith.constant 1 : i32
  %two = arith.constant 2.0 : f32
  %a = arith.addi %p, %one8 : i8
  %b = arith.addi %q, %one32 : i32
  %c = arith.mulf %r, %two : f32
  return %a, %b, %c : i8, i32, f32
}"""

    def python_function(self) -> Callable[..., Any]:
        if self.kind == "loop":
            def loop(x: "N", s, y: "N"): ...  # noqa: F821 - dim names

            return loop
        params = ", ".join(self.names)
        namespace: dict[str, Any] = {}
        exec(f"def k({params}): return None", namespace)
        return namespace["k"]

    def reference(self, args: list[Any], out: np.ndarray | None) -> Any:
        """numpy's answer for valid arguments (in the kernel's dtype); ``out`` as it was before the call,
        into which matmul and the reduction accumulate (an allocated output starts at zero)."""
        dtype = self.dtype
        start = np.asarray(0, dtype) if out is None else out
        if self.kind == "binary":
            return np.asarray(args[0], dtype) + np.asarray(args[1], dtype)
        if self.kind == "matmul":
            return start + np.asarray(args[0], dtype) @ np.asarray(args[1], dtype)
        if self.kind == "reduce":
            return np.asarray(start + np.asarray(args[0], dtype).sum(dtype=dtype))
        if self.kind == "loop":
            return np.asarray(args[0], dtype) * dtype.type(args[1])
        if self.kind == "two":
            a, b = np.asarray(args[0], dtype), np.asarray(args[1], dtype)
            return a + b, a - b
        p, q, r = args
        return (np.int8((int(p) + 1) & 0xFF if int(p) < 128 else int(p) + 1 - 256),
                np.int32((int(q) + 1 + 2**31) % 2**32 - 2**31), np.float32(np.float32(r) * np.float32(2)))


@dataclass(frozen=True)
class ArrayArg:
    """An array argument: its dtype and shape, how it is viewed, and whether it is read-only or a list."""

    dtype: str
    shape: tuple[int, ...]
    view: str = "plain"  # plain, step, negative, transposed, offset, list, liar
    readonly: bool = False
    fill: str = "small"  # small, nan


@dataclass(frozen=True)
class OverlapOut:
    """``out=`` as a view of input ``source``'s buffer, shifted by ``shift`` elements."""

    source: int
    shift: int


@dataclass(frozen=True)
class CallCase:
    args: tuple[Any, ...]
    out: Any = None  # None, an ArrayArg or an OverlapOut
    inplace_y: Any = None  # for "loop": the y argument


@dataclass
class Built:
    """The arguments of one call, the guarded buffers behind them, and copies of them as they were."""

    values: list[Any]
    guards: list[np.ndarray] = field(default_factory=list)
    bases: dict[int, np.ndarray] = field(default_factory=dict)
    originals: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)


def _guarded(dtype: np.dtype, count: int) -> tuple[np.ndarray, np.ndarray]:
    """A buffer of ``count`` elements with 64 sentinel bytes on each side; returns (whole bytes, elements)."""
    raw = np.full(count * dtype.itemsize + 128 + 16, SENTINEL, np.uint8)
    start = 64 + (-raw.ctypes.data - 64) % 16
    elements = raw[start:start + count * dtype.itemsize].view(dtype)
    return raw, elements


def build_array(spec: ArrayArg, built: Built, index: int) -> Any:
    dtype = np.dtype(spec.dtype)
    base_shape = tuple(2 * d + 2 for d in spec.shape)
    raw, flat = _guarded(dtype, int(np.prod(base_shape)))
    flat[...] = (np.arange(flat.size) % 7 - 3).astype(dtype)
    if spec.fill == "nan" and dtype.kind == "f" and flat.size:
        flat[::3] = np.nan
    base = flat.reshape(base_shape)
    built.guards.append(raw)
    built.bases[index] = flat
    inner = tuple(slice(0, d) for d in spec.shape) or Ellipsis
    if not spec.shape:
        array = base[...]
    elif spec.view == "step":
        array = base[tuple(slice(0, 2 * d, 2) for d in spec.shape)]
    elif spec.view == "negative":
        array = base[inner][tuple(slice(None, None, -1) for _ in spec.shape)]
    elif spec.view == "transposed":
        array = base[inner].T if len(spec.shape) == 2 else base[inner]
    elif spec.view == "offset":
        array = base[tuple(slice(1, 1 + d) for d in spec.shape)]
    else:
        array = base[inner]
    if spec.view == "list":
        return array.tolist()
    if spec.view == "liar":
        return Liar(array)
    if spec.readonly:
        array.flags.writeable = False
    built.originals.append((index, array, array.copy()))
    return array


class Liar:
    """An object whose ``__array__`` answers a different shape on every other conversion."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.calls = 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        self.calls += 1
        return self.array if self.calls % 2 else self.array[..., :1]


def build(case: KernelCase, call: CallCase) -> tuple[Built, Any]:
    built = Built([])
    for i, arg in enumerate(call.args):
        built.values.append(build_array(arg, built, i) if isinstance(arg, ArrayArg) else arg)
    out: Any = None
    if isinstance(call.out, ArrayArg):
        out = build_array(call.out, built, -1)
    elif isinstance(call.out, OverlapOut) and call.out.source in built.bases:
        source, flat = built.values[call.out.source], built.bases[call.out.source]
        shape = np.shape(source)
        count = int(np.prod(shape))
        start = max(0, min(call.out.shift, flat.size - count))
        out = flat[start:start + count].reshape(shape)
    return built, out


def names_an_argument(message: str, names: tuple[str, ...]) -> bool:
    return any(re.search(rf"(?<!\w){re.escape(name)}(?![\w])", message) for name in (*names, "out"))


def judge(case: KernelCase, call: CallCase, kernel: Any, memkernel: Any) -> list[str]:
    """Run one call and return the problems found (an empty list when all is well)."""
    built, out = build(case, call)
    inputs_before = [np.array(v, copy=True) if isinstance(v, np.ndarray) else v for v in built.values]
    out_before = np.array(out, copy=True) if isinstance(out, np.ndarray) else None
    problems: list[str] = []
    try:
        returned = kernel(*built.values) if out is None else kernel(*built.values, out=out)
    except memkernel.MemkernelError as exc:
        if not names_an_argument(str(exc), case.names):
            problems.append(f"{type(exc).__name__} names no argument: {exc}")
        returned = None
        failed = True
    except Exception as exc:  # noqa: BLE001 - any other exception is the finding
        return [f"raised {type(exc).__name__} (not a MemkernelError): {exc}"]
    else:
        failed = False
    for raw in built.guards:
        if raw[:64].tolist() != [SENTINEL] * 64 or raw[-64:].tolist() != [SENTINEL] * 64:
            problems.append("wrote outside the arrays passed (a guard band changed)")
    written = {i for i, c in enumerate(kernel.spec.contracts) if c.__class__.__name__ == "BufferContract"
               and c.needs_writeable and i < len(built.values)}
    for index, array, before in built.originals:
        overlapped = isinstance(out, np.ndarray) and np.shares_memory(array, out)
        if index >= 0 and index not in written and not overlapped and \
                not np.array_equal(array, before, equal_nan=True):
            problems.append(f"changed input '{case.names[index]}', which the kernel does not write")
    if failed or problems or any(isinstance(v, Liar) for v in built.values):
        return problems  # a liar has no one right answer: it must only do no harm
    try:
        expected = case.reference(inputs_before, out_before)
    except Exception:  # noqa: BLE001 - inputs numpy cannot take either: nothing to compare
        return problems
    got = returned
    if case.kind == "loop":
        got = built.values[2]
    if case.kind in ("two", "scalars"):
        pairs = list(zip(got, expected))
    else:
        pairs = [(got, expected)]
    for mine, theirs in pairs:
        mine, theirs = np.asarray(mine), np.asarray(theirs)
        if mine.shape != theirs.shape:
            problems.append(f"returned shape {mine.shape}, numpy {theirs.shape}")
        elif not np.allclose(mine, theirs, rtol=1e-5, atol=1e-5, equal_nan=True):
            problems.append(f"returned {mine!r}, numpy {theirs!r}")
    return problems
