"""The call path against a fake compiled entry: a Python function behind a C pointer reads the descriptors the
plan built, so binding, conversion, checks, allocation and copy-backs are tested without compiling anything."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from memkernel import ArgumentError, ShapeError
from memkernel.analysis.analyse import analyse
from memkernel.analysis.source import parse_source
from memkernel.call.allocation import allocator_for
from memkernel.call.binders import binder_for
from memkernel.call.invoker import Invoker
from memkernel.call.plan import CallPlan
from memkernel.model.kernel_spec import bind

from ..kernels import elementwise

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p))

IDENTITY = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")
STRIDED = elementwise("arith.addf", "memref<?xf32, strided<[?], offset: ?>>", "f32", 1, name="add")


class FakeAdd:
    """Plays ``@add(%a, %b, %out)`` on rank-1 f32 descriptors: records what it was given, adds in numpy."""

    def __init__(self) -> None:
        self.seen: list[list[tuple[int, int, tuple[int, ...], tuple[int, ...]]]] = []
        self.entry = _ENTRY(self._run)
        self.address = ctypes.cast(self.entry, ctypes.c_void_p).value

    @staticmethod
    def _descriptor(args: ctypes.Array, i: int) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
        pointer = ctypes.cast(args[i], ctypes.POINTER(ctypes.c_void_p))[0]  # args[i] points at the pointer
        words = (ctypes.c_int64 * 5).from_address(pointer)
        return words[1], words[2], (words[3],), (words[4],)

    @staticmethod
    def _view(descriptor: tuple[int, int, tuple[int, ...], tuple[int, ...]]) -> np.ndarray:
        aligned, offset, (size,), (stride,) = descriptor
        if size == 0:
            return np.zeros(0, np.float32)
        span = (size - 1) * abs(stride) + 1
        start = aligned + 4 * (offset - (span - 1 if stride < 0 else 0))
        memory = np.ctypeslib.as_array(ctypes.cast(start, ctypes.POINTER(ctypes.c_float)), shape=(span,))
        return memory[::stride] if stride > 0 else memory[::stride]

    def _run(self, args: ctypes.Array) -> None:
        descriptors = [self._descriptor(args, i) for i in range(3)]
        self.seen.append(descriptors)
        a, b, out = (self._view(d) for d in descriptors)
        out[...] = a + b


def invoker_of(source: str, fake: FakeAdd, function=lambda a, b: None) -> Invoker:
    spec = bind(analyse(parse_source(source), "add"), function)
    allocator = allocator_for(spec, function)
    plan = CallPlan(spec.name, [binder_for(c) for c in spec.contracts], spec.n_inputs, allocator, spec.shapes,
                    spec.overlap_pairs, spec.signature.results, fake.address, fake.entry)
    return Invoker(spec, plan, None, allocator, lambda run: run)


def test_an_allocated_output_is_returned_with_what_the_entry_wrote():
    fake = FakeAdd()
    add = invoker_of(IDENTITY, fake)
    a, b = np.arange(6, dtype=np.float32), np.full(6, 0.5, np.float32)
    np.testing.assert_array_equal(add((a, b), {}, None), a + b)
    assert add.last_path == "checked"


def test_a_step_slice_to_an_identity_layout_reaches_the_entry_as_a_contiguous_copy():
    fake = FakeAdd()
    add = invoker_of(IDENTITY, fake)
    a = np.arange(12, dtype=np.float32)
    out = add((a[::2], a[1::2]), {}, None)
    np.testing.assert_array_equal(out, a[::2] + a[1::2])
    (a_descriptor, b_descriptor, _), = fake.seen
    assert a_descriptor[3] == (1,) and b_descriptor[3] == (1,)
    assert a_descriptor[0] != a.ctypes.data  # a copy, not the caller's memory


def test_a_step_slice_to_a_strided_layout_reaches_the_entry_zero_copy():
    fake = FakeAdd()
    add = invoker_of(STRIDED, fake)
    a = np.arange(12, dtype=np.float32)
    out = add((a[::2], a[1::2]), {}, None)
    np.testing.assert_array_equal(out, a[::2] + a[1::2])
    (a_descriptor, b_descriptor, _), = fake.seen
    assert a_descriptor[3] == (2,) and a_descriptor[0] + 4 * a_descriptor[1] == a.ctypes.data
    assert b_descriptor[0] + 4 * b_descriptor[1] == a[1:].ctypes.data


def test_an_out_view_is_written_back_and_its_gaps_are_untouched():
    fake = FakeAdd()
    add = invoker_of(IDENTITY, fake)
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    target = np.full(8, -1.0, np.float32)
    returned = add((a, b), {}, target[::2])
    np.testing.assert_array_equal(target[::2], a + b)
    np.testing.assert_array_equal(target[1::2], -1.0)
    assert returned.base is target


def test_sizes_that_disagree_are_a_shape_error_and_never_reach_the_entry():
    fake = FakeAdd()
    add = invoker_of(IDENTITY, fake)
    with pytest.raises(ShapeError, match="a has 4 elements on dim 0 but b has 3 on dim 0"):
        add((np.zeros(4, np.float32), np.zeros(3, np.float32)), {}, None)
    assert fake.seen == []


def test_keywords_and_defaults_bind_as_python_does():
    fake = FakeAdd()
    b_default = np.full(3, 2.0, np.float32)
    add = invoker_of(IDENTITY, fake, lambda a, b=b_default: None)
    a = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(add((), {"a": a}, None), a + b_default)
    np.testing.assert_array_equal(add((), {"b": a, "a": a}, None), a + a)
    with pytest.raises(ArgumentError, match="missing argument 'a'"):
        add((), {}, None)
    with pytest.raises(ArgumentError, match="got multiple values for argument 'a'"):
        add((a,), {"a": a}, None)
    assert len(fake.seen) == 2
