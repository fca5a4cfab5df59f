"""Scalar arguments and results of every type, range checks, 0-d memrefs and list inputs.

Expected values come from numpy / ml_dtypes conversions and Python integer
arithmetic, never from memkernel itself.
"""

from __future__ import annotations

import functools
import re

import ml_dtypes
import numpy as np
import pytest

import memkernel
from memkernel import mlir_kernel

from ..types import ALL_TYPES, COMPLEX, FLOATS, INTEGERS

ML_FLOATS = [t for t in FLOATS if t not in ("f16", "f32", "f64")]


def int_range(t: str) -> tuple[int, int]:
    """Inclusive range of an integer argument, by the MLIR rules (signless takes both signs)."""
    if t == "i1":
        return -1, 1
    if t == "index":
        return -(2**63), 2**63 - 1
    width = int(t.lstrip("sui"))
    if t.startswith("si"):
        return -(2 ** (width - 1)), 2 ** (width - 1) - 1
    if t.startswith("ui"):
        return 0, 2**width - 1
    return -(2 ** (width - 1)), 2**width - 1


def as_type(t: str, value) -> np.generic:
    """The numpy scalar ``value`` becomes as type ``t``: integers by Python modular arithmetic."""
    dtype = ALL_TYPES[t]
    if t == "i1":
        return np.bool_(int(value) != 0)
    if t in INTEGERS:
        bits = 8 * dtype.itemsize
        v = int(value) % 2**bits
        if dtype.kind == "i" and v >= 2 ** (bits - 1):
            v -= 2**bits
        return dtype.type(v)
    return dtype.type(value)


def assert_same_scalar(actual, expected) -> None:
    """Same numpy scalar type and the same bits (NaN matches any NaN)."""
    assert type(actual) is type(expected), (type(actual), type(expected))
    a, e = np.array(actual), np.array(expected)
    if a.dtype.kind in "fcV" or a.dtype in [FLOATS[t] for t in ML_FLOATS]:
        a_parts = [a.real, a.imag] if a.dtype.kind == "c" else [a]
        e_parts = [e.real, e.imag] if e.dtype.kind == "c" else [e]
        for ap, ep in zip(a_parts, e_parts):
            if np.isnan(ep):
                assert np.isnan(ap), (actual, expected)
            else:
                assert ap.tobytes() == ep.tobytes(), (actual, expected)
    else:
        assert a.tobytes() == e.tobytes(), (actual, expected)


# -- kernels ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def identity(t: str):
    @mlir_kernel(f"func.func @ident(%x: {t}) -> {t} {{ return %x : {t} }}")
    def ident(x):
        pass

    return ident


@functools.lru_cache(maxsize=None)
def identities(types: tuple[str, ...]):
    args = ", ".join(f"%x{i}: {t}" for i, t in enumerate(types))
    values = ", ".join(f"%x{i}" for i in range(len(types)))
    src = f"func.func @ids({args}) -> ({', '.join(types)}) {{ return {values} : {', '.join(types)} }}"
    params = ", ".join(f"x{i}" for i in range(len(types)))
    namespace: dict = {}
    exec(f"def ids({params}):\n    pass", namespace)
    return mlir_kernel(src)(namespace["ids"])


@functools.lru_cache(maxsize=None)
def binary(op: str, t: str):
    src = f"""func.func @binop(%x: {t}, %y: {t}) -> {t} {{
  %r = {op} %x, %y : {t}
  return %r : {t}
}}"""

    @mlir_kernel(src)
    def binop(x, y):
        pass

    return binop


@functools.lru_cache(maxsize=None)
def zero_d_twice(t: str, op: str):
    """b[] = a[] <op> a[] on 0-d memrefs."""
    src = f"""func.func @twice(%a: memref<{t}>, %b: memref<{t}>) {{
  %x = memref.load %a[] : memref<{t}>
  %y = {op} %x, %x : {t}
  memref.store %y, %b[] : memref<{t}>
  return
}}"""

    @mlir_kernel(src)
    def twice(a):
        pass

    return twice


@functools.lru_cache(maxsize=None)
def copy_1d(t: str):
    m = f"memref<?x{t}>"

    @mlir_kernel(f"func.func @copy(%a: {m}, %b: {m}) {{ memref.copy %a, %b : {m} to {m}\n return }}")
    def copy(a):
        pass

    return copy


# -- scalars in, the same scalar out ------------------------------------------------------------


def _float_inputs(t: str) -> list:
    dtype = FLOATS[t]
    info = ml_dtypes.finfo(dtype)
    values = [1.0, 0.3, 2, True, float(info.max), np.float32(0.75), np.float64(0.1), np.int16(4)]
    if t != "f8E8M0FNU":  # the only type without a sign and without zero
        values += [-1.5, -3, np.float64(-0.2), 0.0, False, np.int8(-2)]
    if t == "f8E8M0FNU" or float(info.smallest_subnormal) != float(info.tiny):
        values.append(float(info.smallest_subnormal))
    return values


SCALAR_INPUTS: list[tuple[str, object]] = []
for _t in ["f16", "f32", "f64"]:
    SCALAR_INPUTS += [(_t, v) for v in _float_inputs(_t)]
SCALAR_INPUTS += [
    ("f16", 65504.0), ("f16", 6e-8), ("f16", np.float16(-1.5)), ("f16", -0.0),
    ("f32", 16777217), ("f32", 3.4e38), ("f32", np.float16(0.5)), ("f32", np.uint8(200)),
    ("f32", np.float32(-0.0)), ("f32", 1e-45),
    ("f64", 2**53 + 1), ("f64", -1e308), ("f64", 5e-324), ("f64", np.float32(0.1)),
    ("f64", np.int64(-(2**62))), ("f64", np.uint64(2**64 - 1)),
]
for _t in ML_FLOATS:
    SCALAR_INPUTS += [(_t, v) for v in _float_inputs(_t)]
for _t in INTEGERS:
    _low, _high = int_range(_t)
    SCALAR_INPUTS += [(_t, v) for v in (_low, _high, 0, 1, True, np.bool_(False), np.int64(_low),
                                        np.uint64(_high), INTEGERS[_t].type(7))]
SCALAR_INPUTS += [("i8", np.uint8(200)), ("i16", np.int8(-5)), ("i32", np.uint16(65535)),
                  ("si32", np.int16(-300)), ("ui16", np.uint8(255)), ("index", np.int32(-9))]
SCALAR_INPUTS += [("i1", v) for v in (True, False, np.bool_(True), np.bool_(False), 1, 0, -1,
                                      np.int8(-1), np.uint8(1))]
SCALAR_INPUTS += [
    ("complex<f32>", 1 + 2j), ("complex<f32>", np.complex64(0.1 - 0.2j)),
    ("complex<f32>", np.complex128(1 / 3 + 1j / 7)), ("complex<f32>", 2.5), ("complex<f32>", 7),
    ("complex<f32>", np.float32(-0.5)), ("complex<f32>", True), ("complex<f32>", complex(-0.0, 3e38)),
    ("complex<f64>", 1 / 3 + 2j), ("complex<f64>", np.complex64(0.1 + 0.2j)),
    ("complex<f64>", complex(1e308, -5e-324)), ("complex<f64>", np.int8(-4)), ("complex<f64>", 0.1),
]


def _id(case):
    t, v = case
    return f"{t}-{type(v).__name__}({v!r})"


@pytest.mark.parametrize("t,value", SCALAR_INPUTS, ids=[_id(c) for c in SCALAR_INPUTS])
def test_scalar_argument_comes_back_as_numpy_scalar_of_the_type(t, value):
    with np.errstate(all="ignore"):
        expected = as_type(t, value)
    assert_same_scalar(identity(t)(value), expected)




@pytest.mark.parametrize("t", list(ALL_TYPES))
def test_numpy_scalar_of_the_argument_dtype_is_accepted(t):
    value = as_type(t, 1) if t not in COMPLEX else COMPLEX[t].type(1.5 - 2j)
    assert_same_scalar(identity(t)(value), value)


@pytest.mark.parametrize("source,t", [("bf16", "f32"), ("f8E4M3FN", "f64"), ("f8E5M2", "f16"),
                                      ("bf16", "complex<f64>")])
def test_ml_dtypes_scalar_converts_to_a_wider_float_argument(source, t):
    value = FLOATS[source].type(1.5)
    assert_same_scalar(identity(t)(value), ALL_TYPES[t].type(1.5))


RESULT_SCALAR_TYPES = {
    "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f8E4M3FN": ml_dtypes.float8_e4m3fn,
    "f8E5M2": ml_dtypes.float8_e5m2, "f8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "f8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz, "f8E4M3B11FNUZ": ml_dtypes.float8_e4m3b11fnuz,
    "f8E4M3": ml_dtypes.float8_e4m3, "f8E3M4": ml_dtypes.float8_e3m4,
    "f8E8M0FNU": ml_dtypes.float8_e8m0fnu, "f32": np.float32, "f64": np.float64, "i1": np.bool_,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "si8": np.int8, "si16": np.int16, "si32": np.int32, "si64": np.int64,
    "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
    "index": np.int64, "complex<f32>": np.complex64, "complex<f64>": np.complex128,
}


@pytest.mark.parametrize("t", list(RESULT_SCALAR_TYPES))
def test_scalar_result_has_the_numpy_scalar_type(t):
    assert type(identity(t)(1)) is RESULT_SCALAR_TYPES[t]


# -- scalar arithmetic --------------------------------------------------------------------------


def _native(op):
    return lambda t, x, y: op(ALL_TYPES[t].type(x), ALL_TYPES[t].type(y))


def _via_f32(op):
    return lambda t, x, y: FLOATS[t].type(op(np.float32(FLOATS[t].type(x)), np.float32(FLOATS[t].type(y))))


def _wrapped(op):
    return lambda t, x, y: as_type(t, op(int(x), int(y)))


def _logical(op):
    return lambda t, x, y: np.bool_(op(bool(x), bool(y)))


_add = lambda a, b: a + b  # noqa: E731
_mul = lambda a, b: a * b  # noqa: E731
_div = lambda a, b: a / b  # noqa: E731

ARITHMETIC = [
    ("arith.addf", "f16", 0.1, 0.2, _native(_add)),
    ("arith.mulf", "f16", 300.0, 300.0, _native(_mul)),  # overflows to inf
    ("arith.mulf", "f16", 1e-4, 1e-3, _native(_mul)),  # subnormal result
    ("arith.addf", "f32", 0.1, 0.2, _native(_add)),
    ("arith.divf", "f32", 1.0, 3.0, _native(_div)),
    ("arith.mulf", "f32", 3e38, 10.0, _native(_mul)),
    ("arith.addf", "f64", 0.1, 0.2, _native(_add)),
    ("arith.divf", "f64", 2.0, 3.0, _native(_div)),
    ("arith.mulf", "f64", 1e-200, 1e-200, _native(_mul)),
    ("arith.addf", "bf16", 1.0, 0.00390625, _via_f32(_add)),
    ("arith.mulf", "bf16", 3.14159, 2.71828, _via_f32(_mul)),
    ("arith.addf", "f8E4M3FN", 1.5, 0.3, _via_f32(_add)),
    ("arith.mulf", "f8E4M3FN", 240.0, 2.0, _via_f32(_mul)),  # past max: NaN (no inf in FN)
    ("arith.addf", "f8E5M2", 3.0, 0.25, _via_f32(_add)),
    ("arith.mulf", "f8E5M2", -1.75, 5.0, _via_f32(_mul)),
    ("complex.add", "complex<f32>", 1 + 2j, 3.5 - 1j, _native(_add)),
    ("complex.mul", "complex<f32>", 1 + 2j, 3 - 4j, _native(_mul)),
    ("complex.add", "complex<f64>", 0.1 + 0.2j, 0.3 - 0.4j, _native(_add)),
    ("complex.mul", "complex<f64>", 2 - 5j, -3 + 0.5j, _native(_mul)),
    ("arith.addi", "i8", 100, 100, _wrapped(_add)),
    ("arith.addi", "i8", 255, 1, _wrapped(_add)),
    ("arith.muli", "i16", 300, 300, _wrapped(_mul)),
    ("arith.addi", "i32", 2**31 - 1, 1, _wrapped(_add)),
    ("arith.muli", "i64", 2**40, 2**40, _wrapped(_mul)),
    ("arith.addi", "i64", 2**64 - 1, 2, _wrapped(_add)),
    ("arith.addi", "index", 2**63 - 1, 1, _wrapped(_add)),
    ("arith.andi", "i1", True, False, _logical(lambda a, b: a and b)),
    ("arith.ori", "i1", True, False, _logical(lambda a, b: a or b)),
    ("arith.xori", "i1", True, True, _logical(lambda a, b: a != b)),
]


@pytest.mark.parametrize("op,t,x,y,reference", ARITHMETIC,
                         ids=[f"{op}-{t}-{x!r}-{y!r}" for op, t, x, y, _ in ARITHMETIC])
def test_scalar_arithmetic_matches_reference(op, t, x, y, reference):
    with np.errstate(all="ignore"):
        expected = reference(t, x, y)
    assert_same_scalar(binary(op, t)(x, y), expected)


# -- several results, outputs with results, no results ---------------------------------------

MULTI_SOURCE = """
func.func @multi(%a: f32, %b: i64, %c: complex<f64>, %d: i1) -> (f32, i64, complex<f64>, i1) {
  %a2 = arith.addf %a, %a : f32
  %one = arith.constant 1 : i64
  %b1 = arith.addi %b, %one : i64
  %c2 = complex.mul %c, %c : complex<f64>
  %true = arith.constant true
  %nd = arith.xori %d, %true : i1
  return %a2, %b1, %c2, %nd : f32, i64, complex<f64>, i1
}"""


@pytest.fixture(scope="module")
def multi():
    @mlir_kernel(MULTI_SOURCE)
    def multi(a, b, c, d):
        pass

    return multi


def test_several_results_come_back_as_a_tuple_in_order(multi):
    result = multi(1.25, -7, 2 - 3j, False)
    assert isinstance(result, tuple) and len(result) == 4
    assert_same_scalar(result[0], np.float32(1.25) + np.float32(1.25))
    assert_same_scalar(result[1], np.int64(-7 + 1))
    assert_same_scalar(result[2], np.complex128((2 - 3j) * (2 - 3j)))
    assert_same_scalar(result[3], np.bool_(True))


SAMPLE = {
    "i1": True, "i8": -3, "i16": -30000, "i32": -2_000_000_000, "i64": -(2**62) - 5,
    "si8": -100, "si16": 12345, "si32": -7, "si64": 2**63 - 1, "ui8": 250, "ui16": 65000,
    "ui32": 4_000_000_000, "ui64": 2**64 - 2, "index": -(2**63),
    "f16": -0.333, "bf16": 1.0e30, "f8E4M3FN": -3.5, "f8E5M2": 0.0625, "f8E3M4": 1.25,
    "f32": 3.0e-39, "f64": -1.0e300, "complex<f32>": 1.5 - 2.5j, "complex<f64>": -1e-300 + 1e300j,
}
RESULT_COMBOS = [
    ("i1", "f64"),
    ("i8", "i16", "i32", "i64"),
    ("f16", "complex<f32>", "i8"),
    ("bf16", "f8E4M3FN", "f64"),
    ("complex<f64>", "i1", "complex<f32>"),
    ("index", "ui8", "si16", "f32"),
    ("i8", "complex<f64>"),
    ("f32", "f32", "f32"),
    ("ui64", "i1"),
    ("f8E5M2", "f8E3M4", "si64", "ui16"),
    ("ui32", "f16", "si8", "complex<f64>", "si32"),
]


@pytest.mark.parametrize("types", RESULT_COMBOS, ids=["-".join(c) for c in RESULT_COMBOS])
def test_mixed_results_keep_each_value_and_type(types):
    values = [SAMPLE[t] for t in types]
    result = identities(types)(*values)
    assert isinstance(result, tuple) and len(result) == len(types)
    for t, v, r in zip(types, values, result):
        assert_same_scalar(r, as_type(t, v))


SUM_COPY = """
func.func @sum_copy(%a: memref<?xf32>, %b: memref<?xf32>) -> (f32, index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %a, %c0 : memref<?xf32>
  %zero = arith.constant 0.0 : f32
  %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> (f32) {
    %x = memref.load %a[%i] : memref<?xf32>
    memref.store %x, %b[%i] : memref<?xf32>
    %t = arith.addf %acc, %x : f32
    scf.yield %t : f32
  }
  return %s, %n : f32, index
}"""


@pytest.fixture(scope="module")
def sum_copy():
    @mlir_kernel(SUM_COPY)
    def sum_copy(a):
        pass

    return sum_copy


def test_output_memref_comes_before_scalar_results(sum_copy):
    a = np.array([0.5, -1.25, 3.0, 8.0, 0.125], np.float32)
    result = sum_copy(a)
    assert isinstance(result, tuple) and len(result) == 3
    out, total, n = result
    np.testing.assert_array_equal(out, a)
    assert out.dtype == np.float32
    expected_total = np.float32(0)
    for x in a:
        expected_total = np.float32(expected_total + x)
    assert_same_scalar(total, expected_total)
    assert_same_scalar(n, np.int64(len(a)))


def test_output_memref_with_results_uses_out_array(sum_copy):
    a = np.array([1.0, 2.0], np.float32)
    out = np.full(2, -1.0, np.float32)
    returned, total, n = sum_copy(a, out=out)
    assert returned is out
    np.testing.assert_array_equal(out, a)
    assert_same_scalar(total, np.float32(3.0))


def test_kernel_without_results_or_outputs_returns_none():
    @mlir_kernel("func.func @nothing(%x: f32, %y: i8) { return }")
    def nothing(x, y):
        pass

    assert nothing(1.0, 2) is None


# -- integer range checks -----------------------------------------------------------------------

INT_TYPES = ["i1", *INTEGERS]


@pytest.mark.parametrize("t", INT_TYPES)
def test_integer_argument_accepts_both_ends_of_its_range(t):
    low, high = int_range(t)
    kernel = identity(t)
    assert_same_scalar(kernel(low), as_type(t, low))
    assert_same_scalar(kernel(high), as_type(t, high))


def _range_message(t, value):
    low, high = int_range(t)
    return (re.escape(f"argument 'x' expects {t}") + ".*" + re.escape(str(value)) + ".*"
            + re.escape(f"{low} .. {high}"))


@pytest.mark.parametrize("t", INT_TYPES)
@pytest.mark.parametrize("end", ["below", "above"])
def test_integer_argument_just_outside_its_range_is_rejected(t, end):
    low, high = int_range(t)
    value = low - 1 if end == "below" else high + 1
    with pytest.raises(memkernel.ValueRangeError, match=_range_message(t, value)):
        identity(t)(value)


def test_i8_takes_minus_128_and_255_as_the_same_bits_as_numpy():
    kernel = identity("i8")
    assert_same_scalar(kernel(-128), np.int8(-128))
    assert_same_scalar(kernel(255), np.array(255, np.uint8).view(np.int8)[()])


@pytest.mark.parametrize("value", [256, -129, 2**70, -(2**70)])
def test_i8_never_wraps_out_of_range_values(value):
    with pytest.raises(memkernel.ValueRangeError, match=_range_message("i8", value)):
        identity("i8")(value)


NUMPY_OUT_OF_RANGE = [
    ("i8", np.int16(300)),
    ("i8", np.int64(-129)),
    ("si64", np.uint64(2**64 - 1)),
    ("ui64", np.int64(-1)),
    ("ui8", np.int8(-1)),
    ("si8", np.uint8(128)),
    ("index", np.uint64(2**63)),
    ("i1", np.int8(2)),
]


@pytest.mark.parametrize("t,value", NUMPY_OUT_OF_RANGE, ids=[_id(c) for c in NUMPY_OUT_OF_RANGE])
def test_numpy_integer_scalar_out_of_range_is_rejected(t, value):
    with pytest.raises(memkernel.ValueRangeError, match=_range_message(t, int(value))):
        identity(t)(value)


def test_value_range_error_is_a_value_error():
    with pytest.raises(ValueError):
        identity("ui8")(-1)


FLOAT_FOR_INT = [("i32", 1.0), ("i8", 2.5), ("index", np.float64(3.0)), ("ui8", np.float32(1)),
                 ("si16", np.float16(2)), ("i1", 1.0), ("i64", 1 + 0j)]


@pytest.mark.parametrize("t,value", FLOAT_FOR_INT, ids=[_id(c) for c in FLOAT_FOR_INT])
def test_inexact_value_for_an_integer_argument_is_an_argument_error(t, value):
    pattern = re.escape(f"argument 'x' expects {t}") + ".*" + re.escape(f"integer for {t}")
    with pytest.raises(memkernel.ArgumentError, match=pattern):
        identity(t)(value)


def test_float_for_an_integer_argument_is_a_type_error():
    with pytest.raises(TypeError):
        identity("i32")(1.0)


COMPLEX_FOR_REAL = [("f32", 1j), ("f64", 1 + 0j), ("f16", np.complex64(2)), ("bf16", np.complex128(1j)),
                    ("f8E4M3FN", 0.5 + 0.5j)]


@pytest.mark.parametrize("t,value", COMPLEX_FOR_REAL, ids=[_id(c) for c in COMPLEX_FOR_REAL])
def test_complex_for_a_float_argument_is_an_argument_error(t, value):
    pattern = re.escape(f"argument 'x' expects {t}") + ".*" + re.escape(f"real number for {t}")
    with pytest.raises(memkernel.ArgumentError, match=pattern):
        identity(t)(value)


@pytest.mark.parametrize("t", ["f32", "i32", "complex<f64>", "i1"])
def test_string_for_a_scalar_argument_is_an_argument_error(t):
    with pytest.raises(memkernel.ArgumentError, match=re.escape(f"argument 'x' expects {t}")):
        identity(t)("1")


# -- float overflow, inf and nan ----------------------------------------------------------------

OVERFLOWS = [
    ("f16", 1e6), ("f16", -1e6), ("f16", 65520.0), ("f16", 70000), ("f16", np.float32(1e5)),
    ("f32", 1e39), ("f32", -1e39), ("f32", np.float64(3.5e38)), ("f32", 10**40),
    ("bf16", 1e39), ("f8E4M3FN", 1000.0), ("f8E5M2", 1e6), ("f8E4M3FNUZ", 300.0),
    ("complex<f32>", complex(1e39, 0.0)), ("complex<f32>", complex(0.0, -1e39)),
    ("f64", 10**400),
]


def _overflow_id(case):
    t, v = case
    shown = f"{v:.3g}" if not isinstance(v, int) or abs(v) < 10**20 else f"int(~1e{len(str(v)) - 1})"
    return f"{t}-{type(v).__name__}-{shown}"


@pytest.mark.parametrize("t,value", OVERFLOWS, ids=[_overflow_id(c) for c in OVERFLOWS])
def test_finite_value_overflowing_a_float_type_is_a_value_range_error(t, value):
    with pytest.raises(memkernel.ValueRangeError,
                       match=re.escape(f"argument 'x' expects {t}") + ".*" + re.escape(f"overflows {t}")):
        identity(t)(value)


def test_largest_value_that_rounds_into_f16_is_accepted():
    # 65519 is below the rounding midpoint between f16 max (65504) and 65536.
    assert_same_scalar(identity("f16")(65519.0), np.float16(65519.0))


INF_TYPES = ["f16", "bf16", "f32", "f64", "f8E5M2", "f8E4M3", "f8E3M4"]


@pytest.mark.parametrize("t", INF_TYPES)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), np.float32("-inf")], ids=["inf", "-inf", "np-inf"])
def test_infinity_passes_through(t, value):
    assert_same_scalar(identity(t)(value), FLOATS[t].type(value))


@pytest.mark.parametrize("t", list(FLOATS))
@pytest.mark.parametrize("value", [float("nan"), np.float64("nan")], ids=["nan", "np-nan"])
def test_nan_passes_through(t, value):
    result = identity(t)(value)
    assert type(result) is FLOATS[t].type
    assert np.isnan(result)


@pytest.mark.parametrize("t", list(COMPLEX))
def test_complex_inf_and_nan_parts_pass_through(t):
    result = identity(t)(complex(float("inf"), float("nan")))
    assert type(result) is COMPLEX[t].type
    assert result.real == np.inf and np.isnan(result.imag)


# -- 0-d memrefs --------------------------------------------------------------------------------

ZERO_D_INPUTS = [np.array(1.5, np.float32), 1.5, np.float32(1.5), 3, np.float64(-0.25), True]


@pytest.mark.parametrize("value", ZERO_D_INPUTS, ids=[f"{type(v).__name__}({v!r})" for v in ZERO_D_INPUTS])
def test_zero_d_f32_memref_takes_arrays_and_scalars(value):
    out = zero_d_twice("f32", "arith.addf")(value)
    expected = np.float32(value) + np.float32(value)
    np.testing.assert_array_equal(out, np.array(expected, np.float32))


def test_zero_d_output_is_allocated_as_a_zero_d_array():
    out = zero_d_twice("f32", "arith.addf")(np.array(2.0, np.float32))
    assert isinstance(out, np.ndarray)
    assert out.shape == () and out.dtype == np.float32


ZERO_D_TYPED = [("i8", "arith.addi", -5), ("i1", "arith.andi", True), ("f64", "arith.mulf", 0.1),
                ("complex<f64>", "complex.add", 1 - 2j), ("bf16", "arith.addf", 1.5),
                ("i16", "arith.addi", -20000)]


@pytest.mark.parametrize("t,op,value", ZERO_D_TYPED, ids=[c[0] for c in ZERO_D_TYPED])
def test_zero_d_memref_of_each_kind_takes_a_python_scalar(t, op, value):
    out = zero_d_twice(t, op)(value)
    assert out.shape == () and out.dtype == ALL_TYPES[t]
    x = ALL_TYPES[t].type(value)
    if t == "i1":
        expected = np.bool_(x and x)
    elif t in ("i8", "i16"):
        expected = as_type(t, int(value) * 2)
    elif t == "f64":
        expected = x * x
    else:
        expected = ALL_TYPES[t].type(np.float32(x) + np.float32(x)) if t == "bf16" else x + x
    np.testing.assert_array_equal(out, np.array(expected, ALL_TYPES[t]))


def test_zero_d_memref_python_int_out_of_range_is_a_value_range_error():
    with pytest.raises(memkernel.ValueRangeError, match=re.escape("expects memref<i8>")):
        zero_d_twice("i8", "arith.addi")(300)


def test_zero_d_memref_python_float_overflowing_f32_is_a_value_range_error():
    with pytest.raises(memkernel.ValueRangeError, match=re.escape("expects memref<f32>")):
        zero_d_twice("f32", "arith.addf")(1e39)


# -- Python lists -------------------------------------------------------------------------------


def test_int_list_converts_for_an_f32_memref():
    out = copy_1d("f32")([1, 2, -3])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([1, 2, -3], np.float32))


def test_bool_list_converts_for_an_i1_memref():
    out = copy_1d("i1")([True, False, True])
    np.testing.assert_array_equal(out, np.array([True, False, True]))


def test_float_list_converts_for_a_complex_memref():
    out = copy_1d("complex<f64>")([0.5, 2, 1j])
    np.testing.assert_array_equal(out, np.array([0.5, 2, 1j], np.complex128))


LIST_OUT_OF_RANGE = [("i8", [1, 300]), ("i8", [-129]), ("ui8", [-1]), ("si8", [128]), ("ui16", [70000])]


@pytest.mark.parametrize("t,values", LIST_OUT_OF_RANGE, ids=[f"{t}-{v}" for t, v in LIST_OUT_OF_RANGE])
def test_int_list_out_of_range_is_a_value_range_error(t, values):
    pattern = re.escape(f"argument 'a' expects memref<?x{t}>") + ".*" + re.escape(f"out of range for {t}")
    with pytest.raises(memkernel.ValueRangeError, match=pattern):
        copy_1d(t)(values)


LIST_WRONG_KIND = [("i32", [1.5, 2.0]), ("f64", [1 + 2j]), ("i1", [0.0, 1.0]), ("f32", ["a"])]


@pytest.mark.parametrize("t,values", LIST_WRONG_KIND, ids=[f"{t}-{v}" for t, v in LIST_WRONG_KIND])
def test_list_that_does_not_convert_is_an_argument_error(t, values):
    pattern = re.escape(f"argument 'a' expects memref<?x{t}>") + ".*" + re.escape("does not convert")
    with pytest.raises(memkernel.ArgumentError, match=pattern):
        copy_1d(t)(values)
