"""Every supported element type through memref arguments and outputs.

References are numpy / ml_dtypes: expected dtypes come from the table below
(written independently of memkernel/model/dtypes.py), expected values from numpy or
ml_dtypes arithmetic on the inputs.
"""

from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np
import pytest

import memkernel
from memkernel import mlir_kernel

from ..kernels import elementwise
from ..types import ALL_TYPES, COMPLEX, FLOATS, SIGNED, SIGNLESS, UNSIGNED

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_RNG_SEED = 20240601

IDENTITY_1D = "affine_map<(i) -> (i)>"


# -- kernel builders (cached: each distinct kernel compiles once per session) -----------------


@functools.lru_cache(maxsize=None)
def copy_kernel(t: str, rank: int = 1):
    """b = a, element-wise, through linalg.generic (memref.load/store after lowering)."""
    m = f"memref<{'?x' * rank}{t}>"
    dims = ", ".join(f"d{i}" for i in range(rank))
    amap = f"affine_map<({dims}) -> ({dims})>"
    iters = ", ".join(['"parallel"'] * rank)
    src = f"""
func.func @copy(%a: {m}, %b: {m}) {{
  linalg.generic {{indexing_maps = [{amap}, {amap}], iterator_types = [{iters}]}}
      ins(%a : {m}) outs(%b : {m}) {{
    ^bb0(%x: {t}, %y: {t}):
      linalg.yield %x : {t}
  }}
  return
}}"""

    @mlir_kernel(src)
    def copy(a):
        return None

    return copy


@functools.lru_cache(maxsize=None)
def binary_kernel(op: str, t: str, rank: int = 1):
    """c = a <op> b element-wise; ``op`` is the MLIR op name (arith.addf, complex.mul, ...)."""
    @mlir_kernel(elementwise(op, f"memref<{'?x' * rank}{t}>", t, rank, name="binop"))
    def binop(a, b):
        return None

    return binop


@functools.lru_cache(maxsize=None)
def not_kernel(in_type: str, rank: int):
    """b = not a on i1 memrefs; ``in_type`` is the input memref type."""
    m = f"memref<{'?x' * rank}i1>"
    dims = ", ".join(f"d{i}" for i in range(rank))
    amap = f"affine_map<({dims}) -> ({dims})>"
    iters = ", ".join(['"parallel"'] * rank)
    src = f"""
func.func @lnot(%a: {in_type}, %b: {m}) {{
  linalg.generic {{indexing_maps = [{amap}, {amap}], iterator_types = [{iters}]}}
      ins(%a : {in_type}) outs(%b : {m}) {{
    ^bb0(%x: i1, %y: i1):
      %true = arith.constant true
      %r = arith.xori %x, %true : i1
      linalg.yield %r : i1
  }}
  return
}}"""

    @mlir_kernel(src)
    def lnot(a):
        return None

    return lnot


# -- data that exercises each type ------------------------------------------------------------


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bytes of each element, as unsigned integers (complex: two words per element)."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "c":
        return a.view(_BITS[a.itemsize // 2])
    return a.view(_BITS[a.itemsize])


def float_samples(dtype: np.dtype) -> np.ndarray:
    """Every bit pattern for 8- and 16-bit floats; specials plus random bit patterns for f32/f64."""
    if dtype.itemsize <= 2:
        return np.arange(1 << (8 * dtype.itemsize), dtype=_BITS[dtype.itemsize]).view(dtype)
    fi = np.finfo(dtype)
    specials = np.array(
        [0.0, -0.0, 1.0, -1.0, fi.max, fi.min, fi.tiny, -fi.tiny, fi.smallest_subnormal,
         -fi.smallest_subnormal, fi.eps, np.inf, -np.inf, np.nan, -np.nan],
        dtype=dtype,
    )
    rng = np.random.default_rng(_RNG_SEED)
    uint = _BITS[dtype.itemsize]
    random_bits = rng.integers(0, np.iinfo(uint).max, size=500, dtype=uint, endpoint=True)
    return np.concatenate([specials, random_bits.view(dtype)])


def int_samples(dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = [info.min, info.min + 1, info.max - 1, info.max, 0, 1]
    if info.min < 0:
        edges += [-1, -2]
    rng = np.random.default_rng(_RNG_SEED)
    random = rng.integers(info.min, info.max, size=200, dtype=dtype, endpoint=True)
    return np.concatenate([np.array(edges, dtype=dtype), random])


def complex_samples(dtype: np.dtype) -> np.ndarray:
    part = np.dtype(np.float32) if dtype == np.complex64 else np.dtype(np.float64)
    reals = float_samples(part)[:15]
    re, im = np.meshgrid(reals, reals[::-1])
    out = np.empty(re.size, dtype=dtype)
    out.real = re.ravel()
    out.imag = im.ravel()
    return out


def samples(t: str) -> np.ndarray:
    dtype = ALL_TYPES[t]
    if t in FLOATS:
        return float_samples(dtype)
    if t in COMPLEX:
        return complex_samples(dtype)
    if t == "i1":
        return np.random.default_rng(_RNG_SEED).integers(0, 2, size=101).astype(np.bool_)
    return int_samples(dtype)


def assert_same_floats(actual: np.ndarray, expected: np.ndarray) -> None:
    """Same NaN positions; identical bits (so -0.0 != 0.0) everywhere else."""
    assert actual.dtype == expected.dtype
    actual_nan = np.isnan(actual)
    expected_nan = np.isnan(expected)
    np.testing.assert_array_equal(actual_nan, expected_nan)
    np.testing.assert_array_equal(bits(actual)[~actual_nan], bits(expected)[~expected_nan])


# -- every type through a copy kernel ---------------------------------------------------------


@pytest.mark.parametrize("t", list(ALL_TYPES))
def test_copy_returns_input_bit_for_bit(t):
    a = samples(t)
    out = copy_kernel(t)(a)
    np.testing.assert_array_equal(bits(out), bits(a))


@pytest.mark.parametrize("t", list(ALL_TYPES))
def test_copy_output_has_the_type_dtype(t):
    out = copy_kernel(t)(samples(t))
    assert out.dtype == ALL_TYPES[t]


@pytest.mark.parametrize("t", list(ALL_TYPES))
def test_copy_of_a_non_contiguous_view_reads_the_view(t):
    a = samples(t)
    view = a[1::3]
    out = copy_kernel(t)(view)
    np.testing.assert_array_equal(bits(out), bits(view))


@pytest.mark.parametrize("t", list(ALL_TYPES))
def test_copy_2d_returns_input_bit_for_bit(t):
    a = samples(t)[:60].reshape(6, 10)
    out = copy_kernel(t, 2)(a)
    assert out.shape == (6, 10)
    np.testing.assert_array_equal(bits(out), bits(a))


@pytest.mark.parametrize("t", list(ALL_TYPES))
def test_copy_into_out_array_fills_it(t):
    a = samples(t)
    out = np.zeros(a.shape, ALL_TYPES[t])
    returned = copy_kernel(t)(a, out=out)
    assert returned is out
    np.testing.assert_array_equal(bits(out), bits(a))


@pytest.mark.parametrize("t", list(SIGNLESS))
def test_signless_memref_accepts_unsigned_input_and_allocates_signed(t):
    unsigned = np.dtype(SIGNLESS[t].str.replace("i", "u"))
    info = np.iinfo(unsigned)
    a = np.array([0, 1, info.max // 2, info.max // 2 + 1, info.max], dtype=unsigned)
    out = copy_kernel(t)(a)
    assert out.dtype == SIGNLESS[t]
    np.testing.assert_array_equal(out, a.view(SIGNLESS[t]))


@pytest.mark.parametrize("t", list(SIGNLESS))
def test_signless_output_accepts_unsigned_out_array(t):
    unsigned = np.dtype(SIGNLESS[t].str.replace("i", "u"))
    a = np.array([-1, 0, 5], dtype=SIGNLESS[t])
    out = np.zeros(3, unsigned)
    copy_kernel(t)(a, out=out)
    np.testing.assert_array_equal(out, a.view(unsigned))


# -- arithmetic against numpy -----------------------------------------------------------------


def random_floats(dtype, n, rng, scale_exp):
    """Random values of mixed sign and magnitude up to 10**scale_exp, plus specials."""
    values = rng.standard_normal(n) * 10.0 ** rng.uniform(-scale_exp, scale_exp, n)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0])
    with np.errstate(over="ignore"):
        return np.concatenate([values, specials]).astype(dtype)


NATIVE_FLOAT_CASES = [
    ("arith.addf", np.add), ("arith.mulf", np.multiply), ("arith.subf", np.subtract),
    ("arith.divf", np.divide),
]


@pytest.mark.parametrize("t,scale", [("f16", 5), ("f32", 40), ("f64", 300)])
@pytest.mark.parametrize("op,ufunc", NATIVE_FLOAT_CASES, ids=[c[0] for c in NATIVE_FLOAT_CASES])
def test_float_arithmetic_matches_numpy(t, scale, op, ufunc):
    rng = np.random.default_rng(_RNG_SEED)
    dtype = FLOATS[t]
    a = random_floats(dtype, 400, rng, scale)
    b = rng.permutation(random_floats(dtype, 400, rng, scale))
    with np.errstate(all="ignore"):
        expected = ufunc(a, b)
    assert_same_floats(binary_kernel(op, t)(a, b), expected)


def test_f16_addition_over_all_finite_pairs_of_a_grid_matches_numpy():
    grid = np.arange(0, 1 << 16, 97, dtype=np.uint16).view(np.float16)
    a, b = (x.ravel() for x in np.meshgrid(grid, grid[::-1]))
    with np.errstate(all="ignore"):
        expected = a + b
    assert_same_floats(binary_kernel("arith.addf", "f16")(a, b), expected)


def _complex_values(dtype, rng, n=300):
    out = np.empty(n, dtype)
    out.real = rng.standard_normal(n) * 10.0 ** rng.uniform(-5, 5, n)
    out.imag = rng.standard_normal(n) * 10.0 ** rng.uniform(-5, 5, n)
    return out


@pytest.mark.parametrize("t", list(COMPLEX))
def test_complex_add_matches_numpy(t):
    rng = np.random.default_rng(_RNG_SEED)
    a, b = _complex_values(COMPLEX[t], rng), _complex_values(COMPLEX[t], rng)
    out = binary_kernel("complex.add", t)(a, b)
    assert out.dtype == COMPLEX[t]
    np.testing.assert_array_equal(out, a + b)


@pytest.mark.parametrize("t", list(COMPLEX))
def test_complex_mul_matches_numpy(t):
    rng = np.random.default_rng(_RNG_SEED)
    dtype = COMPLEX[t]
    a, b = _complex_values(dtype, rng), _complex_values(dtype, rng)
    out = binary_kernel("complex.mul", t)(a, b)
    assert out.dtype == dtype
    # numpy and the complex dialect may round the two products differently (fma): compare
    # to a few ulp of the magnitude.
    rtol = 1e-6 if dtype == np.complex64 else 1e-15
    np.testing.assert_allclose(out, a * b, rtol=rtol)


@pytest.mark.parametrize("t", list(SIGNLESS))
@pytest.mark.parametrize("op,ufunc", [("arith.addi", np.add), ("arith.muli", np.multiply),
                                      ("arith.subi", np.subtract)])
def test_signless_integer_arithmetic_wraps_like_numpy(t, op, ufunc):
    dtype = SIGNLESS[t]
    a = int_samples(dtype)
    b = np.random.default_rng(_RNG_SEED + 1).permutation(a)
    out = binary_kernel(op, t)(a, b)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, ufunc(a, b))


def test_i8_addition_wraps_around():
    a = np.array([127, -128, 100, -1], np.int8)
    b = np.array([1, -1, 100, 1], np.int8)
    # Python arithmetic modulo 2**8, brought back to the signed range.
    expected = [((int(x) + int(y) + 128) % 256) - 128 for x, y in zip(a, b)]
    np.testing.assert_array_equal(binary_kernel("arith.addi", "i8")(a, b), np.array(expected, np.int8))


@pytest.mark.parametrize("t", list(SIGNLESS))
def test_signless_addition_of_unsigned_inputs_wraps_like_numpy_unsigned(t):
    unsigned = np.dtype(SIGNLESS[t].str.replace("i", "u"))
    a = int_samples(unsigned)
    b = a[::-1].copy()
    out = binary_kernel("arith.addi", t)(a, b)
    np.testing.assert_array_equal(out.view(unsigned), a + b)


def _all_f8_pairs(dtype):
    values = np.arange(256, dtype=np.uint8).view(dtype)
    a, b = np.meshgrid(values, values)
    return a.ravel().copy(), b.ravel().copy()


@pytest.mark.parametrize("t", ["f8E4M3FN", "f8E5M2"])
@pytest.mark.parametrize("op,ufunc", [("arith.addf", np.add), ("arith.mulf", np.multiply)])
def test_f8_arithmetic_matches_float32_rounded_to_f8(t, op, ufunc):
    dtype = FLOATS[t]
    a, b = _all_f8_pairs(dtype)
    with np.errstate(all="ignore"):
        expected = ufunc(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    assert_same_floats(binary_kernel(op, t)(a, b), expected)


BF16_OPS = [("arith.addf", np.add), ("arith.subf", np.subtract), ("arith.mulf", np.multiply),
            ("arith.divf", np.divide)]


@pytest.mark.parametrize("op,ufunc", BF16_OPS, ids=[o for o, _ in BF16_OPS])
def test_bf16_arithmetic_matches_float32_rounded_to_bf16(op, ufunc):
    rng = np.random.default_rng(_RNG_SEED)
    dtype = FLOATS["bf16"]
    # Magnitudes 1e-15 .. 1e15: every result is a normal bf16 (or 0, inf, nan from the specials).
    a = random_floats(dtype, 2000, rng, 15)
    b = rng.permutation(random_floats(dtype, 2000, rng, 15))
    with np.errstate(all="ignore"):
        expected = ufunc(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    assert_same_floats(binary_kernel(op, "bf16")(a, b), expected)


@pytest.mark.parametrize("op,ufunc", BF16_OPS, ids=[o for o, _ in BF16_OPS])
def test_bf16_arithmetic_keeps_subnormal_results(op, ufunc):
    dtype = FLOATS["bf16"]
    a = np.geomspace(1.0e-38, 1.1e-38, 8).astype(dtype)
    b = {
        "arith.addf": -np.geomspace(0.95e-38, 1.05e-38, 8),
        "arith.subf": np.geomspace(0.95e-38, 1.05e-38, 8),
        "arith.mulf": np.linspace(0.1, 0.9, 8),
        "arith.divf": np.linspace(2.0, 9.0, 8),
    }[op].astype(dtype)
    with np.errstate(all="ignore"):
        expected = ufunc(a.astype(np.float32), b.astype(np.float32)).astype(dtype)
    magnitude = np.abs(expected.astype(np.float32))
    assert np.all((magnitude > 0) & (magnitude < np.finfo(np.float32).tiny))  # nonzero subnormals
    assert_same_floats(binary_kernel(op, "bf16")(a, b), expected)


# -- i1 memrefs ---------------------------------------------------------------------------------


def _bools(shape):
    return np.random.default_rng(_RNG_SEED).integers(0, 2, size=shape).astype(np.bool_)


@pytest.mark.parametrize("shape", [(37,), (5, 7)], ids=["1d", "2d"])
def test_i1_logical_not(shape):
    rank = len(shape)
    a = _bools(shape)
    out = not_kernel(f"memref<{'?x' * rank}i1>", rank)(a)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, np.logical_not(a))


@pytest.mark.parametrize("shape", [(37,), (5, 7)], ids=["1d", "2d"])
def test_i1_logical_and(shape):
    a = _bools(shape)
    b = np.random.default_rng(_RNG_SEED + 7).integers(0, 2, size=shape).astype(np.bool_)
    out = binary_kernel("arith.andi", "i1", len(shape))(a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, np.logical_and(a, b))


@pytest.mark.parametrize("step", [slice(None, None, 2), slice(1, None, 3), slice(None, None, -1)],
                         ids=["x[::2]", "x[1::3]", "x[::-1]"])
def test_i1_strided_memref_reads_a_view_in_place(step):
    x = _bools(41)
    kernel = not_kernel("memref<?xi1, strided<[?], offset: ?>>", 1)
    out = kernel(x[step])
    np.testing.assert_array_equal(out, np.logical_not(x[step]))


def test_i1_strided_view_of_a_2d_array_column():
    x = _bools((6, 4))
    kernel = not_kernel("memref<?xi1, strided<[?], offset: ?>>", 1)
    np.testing.assert_array_equal(kernel(x[:, 2]), np.logical_not(x[:, 2]))


NONCANONICAL_BYTES = np.array([2, 0, 255, 1, 128, 0], np.uint8)


def test_i1_nonzero_byte_reads_as_true_in_not():
    a = NONCANONICAL_BYTES.view(np.bool_)
    out = not_kernel("memref<?xi1>", 1)(a)
    np.testing.assert_array_equal(out, NONCANONICAL_BYTES == 0)


def test_i1_nonzero_byte_reads_as_true_in_and():
    a = NONCANONICAL_BYTES.view(np.bool_)
    ones = np.ones(a.shape, np.bool_)
    out = binary_kernel("arith.andi", "i1")(a, ones)
    np.testing.assert_array_equal(out, NONCANONICAL_BYTES != 0)


def test_i1_copy_of_nonzero_bytes_stores_canonical_bytes():
    a = NONCANONICAL_BYTES.view(np.bool_)
    out = copy_kernel("i1")(a)
    np.testing.assert_array_equal(out.view(np.uint8), (NONCANONICAL_BYTES != 0).astype(np.uint8))


# -- dtype rejection ----------------------------------------------------------------------------

WRONG_DTYPES = [
    ("f32", np.float64),
    ("f64", np.float32),
    ("f16", np.float32),
    ("bf16", np.float32),
    ("f8E4M3FN", ml_dtypes.float8_e5m2),
    ("f8E5M2", np.uint8),
    ("i32", np.int64),
    ("i32", np.float32),
    ("i8", np.bool_),
    ("si8", np.uint8),
    ("si64", np.uint64),
    ("ui8", np.int8),
    ("ui32", np.int32),
    ("index", np.int32),
    ("index", np.uint64),
    ("i1", np.uint8),
    ("complex<f32>", np.complex128),
    ("complex<f64>", np.float64),
]


def _dtype_code(dtype: np.dtype) -> str:
    """How the fix names a dtype: numpy's own under np, the ml_dtypes ones under ml_dtypes."""
    return f"{'np' if hasattr(np, dtype.name) else 'ml_dtypes'}.{dtype.name}"


def _wrong_dtype_message(t, given: np.dtype, shape: str) -> str:
    return (
        re.escape(f"copy(): argument 'a' expects memref<?x{t}>") + ".*"
        + re.escape(f"got {np.dtype(given).name}[{shape}]") + ".*"
        + re.escape(f"a.astype({_dtype_code(ALL_TYPES[t])})")
    )


@pytest.mark.parametrize("t,given", WRONG_DTYPES, ids=[f"{t}-{np.dtype(g).name}" for t, g in WRONG_DTYPES])
def test_wrong_dtype_is_rejected_with_a_message_naming_argument_type_and_fix(t, given):
    a = np.zeros(3, dtype=given)
    with pytest.raises(memkernel.ArgumentError, match=_wrong_dtype_message(t, given, "3")):
        copy_kernel(t)(a)


def test_wrong_dtype_error_is_a_type_error():
    with pytest.raises(TypeError):
        copy_kernel("f32")(np.zeros(3, np.float64))


def test_wrong_dtype_message_shows_the_full_shape():
    a = np.zeros((2, 3), np.float64)
    pattern = re.escape("expects memref<?x?xf32>") + ".*" + re.escape("got float64[2, 3]")
    with pytest.raises(memkernel.ArgumentError, match=pattern):
        copy_kernel("f32", 2)(a)


@pytest.mark.parametrize("t", ["f32", "bf16", "f8E4M3FN", "complex<f64>", "ui16"])
def test_wrong_dtype_hint_is_runnable_code(t):
    """The `.astype(...)` the message suggests evaluates (with numpy and ml_dtypes imported) and is accepted."""
    a = np.zeros(3, np.int8 if t != "i8" else np.float32)
    with pytest.raises(memkernel.ArgumentError) as info:
        copy_kernel(t)(a)
    hint = re.search(r"a\.astype\(((?:np|ml_dtypes)\.\w+)\)", str(info.value))
    assert hint is not None, str(info.value)
    fixed = a.astype(eval(hint.group(1), {"np": np, "ml_dtypes": ml_dtypes}))
    assert copy_kernel(t)(fixed).dtype == ALL_TYPES[t]


@pytest.mark.parametrize("t", list(SIGNLESS))
@pytest.mark.parametrize("sign", ["int", "uint"])
def test_signless_memref_accepts_both_signs(t, sign):
    dtype = np.dtype(f"{sign}{t[1:]}")
    a = np.arange(4, dtype=dtype)
    np.testing.assert_array_equal(copy_kernel(t)(a), np.arange(4))


@pytest.mark.parametrize("t", list(SIGNED))
def test_signed_memref_rejects_unsigned(t):
    unsigned = np.dtype(f"uint{t[2:]}")
    with pytest.raises(memkernel.ArgumentError, match=_wrong_dtype_message(t, unsigned, "3")):
        copy_kernel(t)(np.zeros(3, unsigned))


@pytest.mark.parametrize("t", list(UNSIGNED))
def test_unsigned_memref_rejects_signed(t):
    signed = np.dtype(f"int{t[2:]}")
    with pytest.raises(memkernel.ArgumentError, match=_wrong_dtype_message(t, signed, "3")):
        copy_kernel(t)(np.zeros(3, signed))


BYTE_SWAPPED = [("f32", ">f4"), ("f64", ">f8"), ("i32", ">i4"), ("i16", ">u2"),
                ("complex<f32>", ">c8"), ("ui64", ">u8")]


@pytest.mark.parametrize("t,swapped", BYTE_SWAPPED, ids=[s for _, s in BYTE_SWAPPED])
def test_non_native_byte_order_is_rejected(t, swapped):
    a = np.arange(3).astype(swapped)
    pattern = (re.escape(f"argument 'a' expects memref<?x{t}>") + ".*byte order.*"
               + re.escape(f"a.astype({_dtype_code(ALL_TYPES[t])})"))
    with pytest.raises(memkernel.ArgumentError, match=pattern):
        copy_kernel(t)(a)


def test_byte_order_fix_from_message_is_accepted():
    a = np.array([1.5, -2.0, 3.25]).astype(">f4")
    out = copy_kernel("f32")(a.astype(np.float32))
    np.testing.assert_array_equal(out, np.array([1.5, -2.0, 3.25], np.float32))
