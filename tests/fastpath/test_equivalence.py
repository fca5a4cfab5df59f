"""The fast path, the checked path and an isolated call agree: same result bits, or the same error.

In the style of Triton's ``test_specialize.py``: hypothesis draws argument tuples,
valid and invalid, for kernels of varied signatures; each tuple is built three times,
identically, and given to the kernel compiled with the fast path, to the same
kernel compiled without it, and to the same kernel with ``isolate=True`` (whose
calls cross to the worker process through the control block, copied or, for the
``shared`` views, in ``memkernel.shared_empty`` memory). A value the fast path
accepts and the checked path refuses is a failure, and so is any difference in
what they return or write. Where torch is installed, the draws hold torch tensors
too, which the compiled code reads through DLPack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memkernel import Kernel, MemkernelError, mlir_kernel, shared_asarray

from ..kernels import SLICES_AND_CASTS, elementwise, loop_map, strided_window
from .conftest import HAS_ENTRIES, with_fast_path

try:
    import torch
except ImportError:  # memkernel[test] installs torch on Python 3.11 only: there the draws hold no tensors
    torch = None

STATS = """
func.func @stats(%x: memref<4x?xi32>, %shift: si16, %flag: i1, %u: ui8, %k: index, %f: f32, %d: f64, %s: i8)
    -> (i32, si16, i1, ui8, index, f32, f64, i8) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %n = memref.dim %x, %c1 : memref<4x?xi32>
  %zero = arith.constant 0 : i32
  %sum = scf.for %i = %c0 to %c4 step %c1 iter_args(%acc = %zero) -> i32 {
    %row = scf.for %j = %c0 to %n step %c1 iter_args(%a = %acc) -> i32 {
      %v = memref.load %x[%i, %j] : memref<4x?xi32>
      %t = arith.addi %a, %v : i32
      scf.yield %t : i32
    }
    scf.yield %row : i32
  }
  return %sum, %shift, %flag, %u, %k, %f, %d, %s : i32, si16, i1, ui8, index, f32, f64, i8
}"""

SCALE = """
func.func @scale(%x: memref<?x?xf64, strided<[?, ?], offset: ?>>, %s: f64,
                 %y: memref<?x?xf64, strided<[?, 1], offset: ?>>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<?x?xf64, strided<[?, ?], offset: ?>>)
      outs(%y : memref<?x?xf64, strided<[?, 1], offset: ?>>) {
  ^bb0(%a: f64, %b: f64):
    %m = arith.mulf %a, %s : f64
    linalg.yield %m : f64
  }
  return
}"""

SHIFTED = """
func.func @shifted(%x: memref<3x4xf32, strided<[4, 1], offset: 2>>, %y: memref<3x4xf32>) {
  linalg.copy ins(%x : memref<3x4xf32, strided<[4, 1], offset: 2>>) outs(%y : memref<3x4xf32>)
  return
}"""


@dataclass(frozen=True)
class ArrayRecipe:
    """How to build one array argument, so that two identical, independent copies can be made."""

    dtype: str
    shape: tuple[int, ...]
    view: str
    writeable: bool

    def build(self) -> Any:
        base_shape = tuple(2 * d + 1 for d in self.shape)
        base = (np.arange(int(np.prod(base_shape)), dtype=np.int64) % 7 - 3).reshape(base_shape)
        base = base.astype(self.dtype)
        plain = base[tuple(slice(0, d) for d in self.shape)].copy()
        if self.view == "contiguous":
            array = plain
        elif self.view == "step":
            array = base[tuple(slice(0, 2 * d, 2) for d in self.shape)]
        elif self.view == "negative":
            array = plain[tuple(slice(None, None, -1) for _ in self.shape)]
        elif self.view == "transposed":
            array = plain.T.copy().T
        elif self.view == "fortran":
            array = np.asfortranarray(plain)
        elif self.view == "offset":
            array = base[tuple(slice(1, 1 + d) for d in self.shape)]
        elif self.view == "misaligned":
            raw = np.zeros(plain.nbytes + 1, np.uint8)[1:]
            array = raw.view(plain.dtype).reshape(plain.shape) if plain.itemsize > 1 else plain
            array[...] = plain
        elif self.view == "subclass":
            array = plain.view(type("Sub", (np.ndarray,), {}))
        elif self.view == "shared":
            array = shared_asarray(plain)
        elif self.view == "shared step":
            array = shared_asarray(base)[tuple(slice(0, 2 * d, 2) for d in self.shape)]
        elif self.view == "shared negative":
            array = shared_asarray(plain)[tuple(slice(None, None, -1) for _ in self.shape)]
        elif self.view == "list":
            return plain.tolist()
        elif self.view.startswith("torch"):
            return self._tensor(base, plain)
        else:
            raise AssertionError(self.view)
        array.flags.writeable = self.writeable
        return array

    def _tensor(self, base: np.ndarray, plain: np.ndarray) -> Any:
        """A torch tensor of the view: one the compiled code reads through DLPack, or declines for the checked
        path. A tensor that is not writeable is one that requires grad (a float) or an inference tensor."""
        assert torch is not None
        if self.view == "torch step":
            tensor = torch.from_numpy(base.copy())[tuple(slice(0, 2 * d, 2) for d in self.shape)]
        elif self.view == "torch transposed":
            tensor = torch.from_numpy(plain.T.copy()).permute(*reversed(range(plain.ndim)))
        elif self.view == "torch expanded":
            tensor = torch.from_numpy(plain.reshape(-1)[:1].copy() if plain.size else np.zeros(1, plain.dtype))
            tensor = tensor.reshape((1,) * len(self.shape)).expand(self.shape)
        else:
            tensor = torch.from_numpy(plain.copy())
        if self.writeable:
            return tensor
        if tensor.is_floating_point():
            return tensor.requires_grad_()
        with torch.inference_mode():
            return tensor.clone()

TORCH_VIEWS = ["torch", "torch", "torch step", "torch transposed", "torch expanded"] if torch is not None else []
"""Tensors the compiled code reads through torch's DLPack exchange API, where torch is installed."""

VIEWS = ["contiguous", "contiguous", "contiguous", "step", "negative", "transposed", "fortran", "offset",
         "misaligned", "subclass", "list", "shared", "shared", "shared step", "shared negative",
         *TORCH_VIEWS]


def arrays(dtypes: list[str], shape: st.SearchStrategy[tuple[int, ...]]) -> st.SearchStrategy[ArrayRecipe]:
    return st.builds(ArrayRecipe, st.sampled_from(dtypes), shape, st.sampled_from(VIEWS),
                     st.sampled_from([True, True, True, False]))


def dims(rank: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.tuples(*[st.integers(0, 5)] * rank)


def integers(bits: int, signed: bool, signless: bool) -> st.SearchStrategy[Any]:
    low = -(1 << (bits - 1)) if signed or signless else 0
    high = (1 << bits) - 1 if signless or not signed else (1 << (bits - 1)) - 1
    edges = [low, high, low - 1, high + 1, 0, 1, -1, 2**64, -2**64]
    edge = st.sampled_from(edges)
    numpy = st.sampled_from([np.int8(-1), np.uint8(200), np.int64(min(high, 2**63 - 1)), np.uint64(2**64 - 1),
                             np.int32(3), np.bool_(True)])
    other = st.sampled_from([1.0, 2.5, "3", None, True, False, complex(1, 0), np.float32(1)])
    return st.one_of(edge, st.integers(low, high), numpy, other)


def floats(bits: int) -> st.SearchStrategy[Any]:
    edges = st.sampled_from([3.4e38, 3.5e38, -3.5e38, 1e308, float("inf"), float("nan"), -0.0, 1e-46, 5e-324])
    others = st.sampled_from([1, True, np.float32(1.5), np.float64(2.5), np.float16(3), 2**70, "1.0", None,
                              1 + 2j, np.longdouble(1)])
    return st.one_of(edges, st.floats(width=bits), others)


def booleans() -> st.SearchStrategy[Any]:
    return st.sampled_from([True, False, 0, 1, -1, 2, np.bool_(True), np.int8(1), 1.0, None, "x"])


def build(value: Any) -> Any:
    return value.build() if isinstance(value, ArrayRecipe) else value


FORMS = ["positional", "positional", "out=None", "keywords", "uninterned out"]
"""How a call passes its arguments: the compiled entry takes the first two (and out=None); the Python path
binds the others."""


def call(kernel: Kernel, args: tuple[Any, ...], out: Any, form: str) -> Any:
    """``kernel(*args, out=out)``, its arguments passed as ``form`` says (``out=`` left out when None)."""
    keywords = {} if out is None and form != "out=None" else {"out": out}
    if form == "keywords":
        names = [p.name for p in kernel.spec.parameters]
        return kernel(**dict(zip(names, args)), **keywords)
    if form == "uninterned out":
        keywords = {"".join(["o", "ut"]): value for value in keywords.values()}
    return kernel(*args, **keywords)


def outcome(kernel: Kernel, args: tuple[Any, ...], out: Any, form: str) -> tuple[str, Any, tuple[Any, ...]]:
    """What a call gives: ("ok", returned, args) or ("error", exception type, args)."""
    built = tuple(build(a) for a in args)
    built_out = None if out is None else build(out)
    try:
        returned = call(kernel, built, built_out, form)
    except MemkernelError as exc:
        return "error", type(exc), built
    return "ok", returned, built


def _is_tensor(value: Any) -> bool:
    return torch is not None and isinstance(value, torch.Tensor)


def as_numpy(value: Any) -> Any:
    """``value``, a torch tensor made a numpy array (a view of its memory)."""
    return value.detach().numpy() if _is_tensor(value) else value


def same_bits(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    if _is_tensor(a) != _is_tensor(b):  # a torch call returns tensors on both paths
        return False
    a, b = np.asarray(as_numpy(a)), np.asarray(as_numpy(b))
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return a.tobytes() == b.tobytes()


def check_equivalent(fast: Kernel, checked: Kernel, isolated: Kernel, args: tuple[Any, ...], out: Any = None,
                     form: str = "positional") -> None:
    got_fast = outcome(fast, args, out, form)
    took_fast = fast.invoker.last_path == "fast"
    got_checked = outcome(checked, args, out, form)
    assert checked.invoker.last_path == "checked"
    got_isolated = outcome(isolated, args, out, form)
    if took_fast:
        assert got_checked[0] == "ok", f"the fast path accepted what the checked path refuses: {got_checked[1]}"
    for got, path in [(got_fast, "fast"), (got_isolated, "isolated")]:
        assert got[0] == got_checked[0], (path, got[1], got_checked[1])
        if got[0] == "error":
            assert got[1] is got_checked[1], path
            continue
        assert same_bits(got[1], got_checked[1]), path
        for a, b in zip(got[2], got_checked[2]):
            if isinstance(a, np.ndarray) or _is_tensor(a):
                assert same_bits(a, b), f"the {path} and the checked path wrote different values into an argument"


def variants(source: str, name: str, function: Any, entry: bool = True) -> tuple[Kernel, Kernel, Kernel]:
    """The kernel compiled with the fast path (and a compiled entry, if ``entry``), without, and isolated."""
    fast = with_fast_path(mlir_kernel(source, name=name)(function))
    checked = with_fast_path(mlir_kernel(source, name=name, cache=False)(function), enabled=False)
    isolated = mlir_kernel(source, name=name, isolate=True)(function).compile()
    assert fast.invoker.fast is not None and checked.invoker.fast is None
    assert (fast.invoker.entry is not None) == (entry and HAS_ENTRIES) and checked.invoker.entry is None
    return fast, checked, isolated


EXAMPLES = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def add():
    return variants(elementwise("arith.addf", "memref<?x?xf32>", "f32", 2), "k", lambda a, b: None)


@pytest.fixture(scope="module")
def stats():
    return variants(STATS, "stats", lambda x, shift, flag, u, k, f, d, s: None, entry=False)  # results: none


@pytest.fixture(scope="module")
def scale():
    return variants(SCALE, "scale", lambda x, s: None)


@pytest.fixture(scope="module")
def shifted():
    return variants(SHIFTED, "shifted", lambda x: None)


@pytest.fixture(scope="module")
def increment():
    source = loop_map("increment", "i64", "%r = arith.addi %v, %by : i64", scalar="%by: i64", in_place=True)
    return variants(source, "increment", lambda x, by: None)


@EXAMPLES
@given(data=st.data())
def test_elementwise_add(add, data):
    shape = data.draw(st.one_of(dims(2), dims(1), dims(3)), label="shape")
    f32 = ["float32", "float32", "float32", "float64", "int32"]
    other = st.one_of(st.just(shape), st.just(shape), st.just(shape), dims(len(shape)))  # sizes the ties refuse
    a = data.draw(arrays(f32, st.just(shape)), label="a")
    b = data.draw(arrays(f32, other), label="b")
    out = data.draw(st.one_of(st.none(), arrays(f32, other)), label="out")
    check_equivalent(*add, (a, b), out, data.draw(st.sampled_from(FORMS), label="form"))


@EXAMPLES
@given(data=st.data())
def test_scalars_of_every_kind_and_a_static_dim(stats, data):
    x = data.draw(arrays(["int32", "int32", "uint32", "int64", "float32"],
                         st.one_of(st.tuples(st.just(4), st.integers(0, 5)), dims(2), dims(1))), label="x")
    args = (x, data.draw(integers(16, True, False), label="si16"), data.draw(booleans(), label="i1"),
            data.draw(integers(8, False, False), label="ui8"), data.draw(integers(64, True, False), label="index"),
            data.draw(floats(32), label="f32"), data.draw(floats(64), label="f64"),
            data.draw(integers(8, False, True), label="i8"))
    check_equivalent(*stats, args)


@EXAMPLES
@given(data=st.data())
def test_strided_layouts_and_a_float_scalar(scale, data):
    shape = data.draw(st.one_of(dims(2), dims(1)), label="shape")
    f64 = ["float64", "float64", "float32"]
    x = data.draw(arrays(f64, st.just(shape)), label="x")
    out = data.draw(st.one_of(st.none(), arrays(f64, st.just(shape)), arrays(f64, dims(len(shape)))), label="out")
    form = data.draw(st.sampled_from(FORMS), label="form")
    check_equivalent(*scale, (x, data.draw(floats(64), label="s")), out, form)


@EXAMPLES
@given(data=st.data())
def test_static_shape_and_offset(shifted, data):
    x = data.draw(arrays(["float32", "float32", "float64"],
                         st.sampled_from([(3, 4), (3, 4), (4, 3), (3, 5), (12,)])), label="x")
    out = data.draw(st.one_of(st.none(), arrays(["float32"], st.sampled_from([(3, 4), (4, 3)]))), label="out")
    check_equivalent(*shifted, (x,), out, data.draw(st.sampled_from(FORMS), label="form"))


@EXAMPLES
@given(data=st.data())
def test_an_argument_written_in_place(increment, data):
    x = data.draw(arrays(["int64", "int64", "uint64", "int32"], st.one_of(dims(1), dims(2))), label="x")
    check_equivalent(*increment, (x, data.draw(integers(64, True, True), label="by")),
                     form=data.draw(st.sampled_from(FORMS), label="form"))


@pytest.fixture(scope="module")
def add1d():
    return variants(elementwise("arith.addf", "memref<?xf32>", "f32", 1), "k", lambda a, b: None)


@EXAMPLES
@given(n=st.integers(0, 6), offsets=st.tuples(*[st.integers(0, 12)] * 3), steps=st.tuples(*[st.sampled_from([1, 2, -1])] * 3))
def test_overlapping_views_of_one_buffer_compute_as_numpy_does(add1d, n, offsets, steps):
    """numpy computes as if the inputs were copied first when the output overlaps them: so do the three calls,
    on plain and on shared memory."""

    def views(shared: bool) -> tuple[np.ndarray, ...]:
        base = np.arange(40, dtype=np.float32)
        if shared:
            base = shared_asarray(base)
        made = [base]
        for offset, step in zip(offsets, steps):
            start = offset if step > 0 else offset + (n - 1) * -step
            made.append(base[start:start + n * step:step] if step > 0 else base[start::step][:n])
        return tuple(made)

    base, a, b, out = views(False)
    np.add(a.copy(), b.copy(), out=out)
    for kernel in add1d:
        for shared in (False, True):
            got_base, a, b, out = views(shared)
            kernel(a, b, out=out)
            np.testing.assert_array_equal(got_base, base)


# Both kinds of bound: x must reach y's and w's sizes (the window) and index 2 (the load).
WINDOWS = """
func.func @windows(%x: memref<?xf32>, %w: memref<?xf32>, %y: memref<?xf32>, %third: memref<f32>) {
  linalg.conv_1d ins(%x, %w : memref<?xf32>, memref<?xf32>) outs(%y : memref<?xf32>)
  %c2 = arith.constant 2 : index
  %e = memref.load %x[%c2] : memref<?xf32>
  memref.store %e, %third[] : memref<f32>
  return
}"""


@pytest.fixture(scope="module")
def windows():
    return variants(WINDOWS, "windows", lambda x, w: None, entry=False)  # two outputs: no compiled entry


@EXAMPLES
@given(data=st.data())
def test_bounds_on_sums_of_dims_and_on_constants(windows, data):
    f32 = ["float32", "float32", "float32", "float64"]
    x = data.draw(arrays(f32, st.tuples(st.integers(0, 9))), label="x")
    w = data.draw(arrays(f32, st.tuples(st.integers(0, 4))), label="w")
    y = data.draw(arrays(f32, st.tuples(st.integers(0, 9))), label="y")
    outcomes = []
    for kernel in windows:
        args = (x.build(), w.build())
        out = (y.build(), np.zeros((), np.float32))
        try:
            kernel(*args, out=out)
            outcomes.append(("ok", out))
        except MemkernelError as exc:
            outcomes.append(("error", type(exc)))
    (checked_kind, checked_value) = outcomes[1]
    for kind, value in outcomes[::2]:
        assert kind == checked_kind, outcomes
        if kind == "ok":
            assert all(same_bits(a, b) for a, b in zip(value, checked_value))
        else:
            assert value is checked_value


@pytest.fixture(scope="module")
def parts():
    return variants(SLICES_AND_CASTS, "parts", lambda x, w, z: None)


@EXAMPLES
@given(data=st.data())
def test_slices_casts_and_an_index_below_0(parts, data):
    """A cast to a static size, a constant-size slice, a slice sized by another argument and a load at i - 1:
    both paths accept and refuse the same calls."""
    f32 = ["float32", "float32", "float32", "float64"]
    x = data.draw(arrays(f32, st.tuples(st.integers(0, 7))), label="x")
    w = data.draw(arrays(f32, st.tuples(st.integers(0, 7))), label="w")
    z = data.draw(arrays(f32, st.tuples(st.sampled_from([0, 0, 0, 1, 2]))), label="z")
    out = data.draw(st.one_of(st.none(), arrays(f32, st.tuples(st.integers(0, 5)))), label="out")
    check_equivalent(*parts, (x, w, z), out, data.draw(st.sampled_from(FORMS), label="form"))


@dataclass(frozen=True)
class Broadcast:
    """A stride-0 view of one element repeated ``size`` times: a legal array of any size numpy allows."""

    dtype: str
    size: int
    value: int
    writeable: bool

    def build(self) -> np.ndarray:
        one = np.full(1, self.value, self.dtype)
        return np.lib.stride_tricks.as_strided(one, shape=(self.size,), strides=(0,), writeable=self.writeable)


NEAR_2_62 = [2**61 + 1, 2**62 - 1, 2**62, 2**62 + 1, 2**63 - 1]
"""Sizes whose sums in a window's reach pass 2**63 (the largest an int8 array may have is 2**63 - 1)."""


def window_argument(small: st.SearchStrategy[int], huge: list[int], writeable: bool = True
                    ) -> st.SearchStrategy[Any]:
    """An int8 argument of the window kernel: a small array of any view, or a stride-0 one of a ``huge`` size."""
    views = arrays(["int8", "int8", "int8", "int16"], st.tuples(small))
    broadcasts = st.builds(Broadcast, st.just("int8"), st.sampled_from(huge), st.integers(-3, 3),
                           st.sampled_from([writeable, writeable, not writeable]))
    return st.one_of(views, broadcasts) if huge else views


@pytest.fixture(scope="module")
def window():
    return variants(strided_window(), "window", lambda x, w: None)


@EXAMPLES
@given(data=st.data())
def test_window_bounds_near_2_to_the_62(window, data):
    """Reaches past 2**63 from stride-0 arrays near 2**62 elements: the fast path declines what it cannot
    compute in 64 bits, so both paths give numpy's answer or the same error. The sizes are drawn so that no
    call that passes the checks loops 2**62 times: a huge ``y`` gets a ``w`` of at least one element, which
    no drawn ``x`` reaches, and a huge ``w`` is longer than any ``x``."""
    x = data.draw(window_argument(st.integers(0, 9), [2**62 - 1, 2**62], writeable=False), label="x")
    y = data.draw(window_argument(st.integers(0, 5), NEAR_2_62), label="y")
    huge_y = isinstance(y, Broadcast)
    w = data.draw(window_argument(st.integers(1 if huge_y else 0, 4), [2**62 + 1, 2**63 - 1]), label="w")
    form = data.draw(st.sampled_from(FORMS), label="form")
    outcomes = []
    for kernel in window:
        built_y = y.build()
        try:
            call(kernel, (x.build(), w.build()), built_y, form)
            outcomes.append(("ok", built_y.base.tobytes() if huge_y else as_numpy(built_y).tobytes()))
        except MemkernelError as exc:
            outcomes.append(("error", type(exc)))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    # An expanded tensor's elements share memory: what the kernel leaves there depends on its order of writes (the
    # three paths agree on it above); numpy's element-by-element answer is for outputs whose elements are apart.
    aliased = not huge_y and y.view == "torch expanded"
    if outcomes[0][0] == "ok" and not isinstance(x, Broadcast) and not isinstance(w, Broadcast) and not aliased:
        a, b, out = (as_numpy(v.build()) for v in (x, w, y))
        expected = out.astype(np.int64) + [sum(int(a[2 * i + j]) * int(b[j]) for j in range(len(b)))
                                          for i in range(len(out))]
        assert outcomes[0][1] == expected.astype(np.int8).tobytes()
