"""The checked call: every check and conversion in Python, then the kernel through its packed wrapper.

The compiled entry point is the packed wrapper ``void f(void** args)``. A
:class:`CallPlan` lays out, once, a frame that holds that ``args`` array, the
descriptor pointers, every argument's descriptor or scalar bytes and the result
storage, all at fixed offsets. A call checks and converts the inputs once,
allocates the outputs ``out=`` left out (from the checked inputs), checks the
outputs, packs every argument's values into the frame with one ``struct`` call
and invokes the function pointer. Frames are pooled, so threads (and
re-entrant calls) never share one.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from .allocation import OutputAllocator, allocation_error
from .binders import Binder, CallState, ScalarBinder, import_arrays
from .descriptors import align
from .interrupts import HeldInterrupts
from .results import ResultReader
from ..load.guard import FRAME_SIZE, failure_error
from ..errors import ArgumentError, CallDepthError
from ..model.shapes import ShapeRules
from ..model.signature import ArgSpec

_WORD = 8
_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_GUARD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def _same_view(x: np.ndarray, y: np.ndarray) -> bool:
    """The very same elements in the same order: one buffer, whichever arguments it is passed as."""
    return (x.__array_interface__["data"][0] == y.__array_interface__["data"][0] and x.shape == y.shape
            and x.strides == y.strides and x.dtype == y.dtype)


class _Frame:
    """One call's memory: ``args`` array, descriptor pointers, argument values, results."""

    def __init__(self, plan: CallPlan) -> None:
        self.buffer = ctypes.create_string_buffer(plan.frame_size + FRAME_SIZE + 16)
        self.address = ctypes.addressof(self.buffer)
        self.guard = align(self.address + plan.frame_size, 16)
        """Where a guarded call keeps its jmp_buf and what failed (see :mod:`memkernel.compile.guard`)."""
        base = self.address
        for slot, target in plan.pointer_slots:
            struct.pack_into("<Q", self.buffer, slot, base + target)


class ArgumentCheck:
    """Every rule of a call, before anything runs: what both the call plan and an isolated call apply."""

    def __init__(self, kernel: str, binders: Sequence[Binder], n_inputs: int, allocator: OutputAllocator,
                 shapes: ShapeRules) -> None:
        self._kernel = kernel
        self._inputs = tuple(binders[:n_inputs])
        self._outputs = tuple(binders[n_inputs:])
        self._names = tuple(b.contract.name for b in binders)
        self._allocator = allocator
        self._shapes = shapes

    def __call__(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> tuple[CallState, list[Any], tuple[Any, ...]]:
        """Check and convert each input of ``args``, allocate the outputs ``given`` leaves out (None) from them,
        check each output and the shape rules; the call's state, the checked arguments and the outputs."""
        state = CallState()
        everything = self._inputs + self._outputs
        arrays = [v for b, v in zip(everything, args + given) if not isinstance(b, ScalarBinder)]
        foreign = {} if all(type(v) is np.ndarray for v in arrays) else import_arrays(everything, args + given, state)
        checked = [binder.check(value, state, foreign.get(i)) for i, (binder, value) in enumerate(zip(self._inputs, args))]
        if any(g is None for g in given):
            # the inputs' mismatches first: an output allocated from a wrong input could be of any size
            self._shapes.check_ties(self._kernel, self._names,
                                    [None if isinstance(b, ScalarBinder) else c.shape
                                     for b, c in zip(self._inputs, checked)]
                                    + [None] * len(given))
            shown = tuple(c if not isinstance(b, ScalarBinder) else v
                          for b, c, v in zip(self._inputs, checked, args))
            outputs = self._allocator.allocate(shown, given)
        else:
            outputs = given
        n = len(self._inputs)
        checked += [binder.check(value, state, foreign.get(n + i))
                    for i, (binder, value) in enumerate(zip(self._outputs, outputs))]
        self._shapes.check(self._kernel, self._names,
                           [None if isinstance(b, ScalarBinder) else c.shape
                            for b, c in zip(self._inputs + self._outputs, checked)],
                           [len(self._inputs) + i for i, g in enumerate(given) if g is None])
        return state, checked, outputs


class CallPlan:
    """Packs arguments into a frame, calls the kernel and decodes its results."""

    def __init__(self, kernel: str, binders: Sequence[Binder], n_inputs: int, allocator: OutputAllocator,
                 shapes: ShapeRules, overlaps: Sequence[tuple[int, int]], results: Sequence[ArgSpec], address: int,
                 keep_alive: Any, guard: int = 0, source: str = "") -> None:
        """``guard``, when not 0, is the compiled module's ``__memkernel_guarded`` (see
        :mod:`memkernel.compile.guard`): calls go through it, and a failed ``cf.assert`` is raised as a
        KernelAssertionError showing the line of ``source`` it points at, a failed heap allocation as an
        AllocationError."""
        self.binders = tuple(binders)
        self._check = ArgumentCheck(kernel, binders, n_inputs, allocator, shapes)
        self._overlaps = tuple(overlaps)
        self._kernel = kernel
        self._reader = ResultReader(results, self._kernel)
        self._address = address
        self._function = _ENTRY(address)
        self._guard = _GUARD(guard) if guard else None
        self._source = source
        self._keep_alive = keep_alive
        self._frames: list[_Frame] = []

        struct_result = self._reader.is_struct
        n_slots = len(binders) + (1 if results else 0)
        first_arg_slot = 1 if struct_result else 0
        offset = n_slots * _WORD
        pointer_slots: list[tuple[int, int]] = []  # (where a pointer is stored, frame offset it points to)

        # Memref arguments are passed as pointers to descriptors: one slot per pointer.
        descriptor_pointer: dict[int, int] = {}
        for i, binder in enumerate(binders):
            if not isinstance(binder, ScalarBinder):
                descriptor_pointer[i] = offset
                offset += _WORD
        result_pointer = offset if struct_result else None
        if struct_result:
            offset += _WORD

        # Argument values, each 8-byte aligned, packed by one struct.
        self._values_offset = offset
        fmt = "<"
        for i, binder in enumerate(binders):
            start = align(offset, _WORD)
            fmt += "x" * (start - offset)
            if i in descriptor_pointer:
                pointer_slots.append((descriptor_pointer[i], start))
                pointer_slots.append(((first_arg_slot + i) * _WORD, descriptor_pointer[i]))
            else:
                pointer_slots.append(((first_arg_slot + i) * _WORD, start))
            fmt += binder.struct_format
            offset = start + struct.calcsize("<" + binder.struct_format)
        self._values = struct.Struct(fmt)
        offset = self._values_offset + self._values.size

        # Results: one value stored through the trailing slot, or an LLVM struct through the first.
        self._results_offset = align(offset, 16)
        if struct_result:
            assert result_pointer is not None
            pointer_slots.append((0, result_pointer))
            pointer_slots.append((result_pointer, self._results_offset))
        elif results:
            pointer_slots.append((len(binders) * _WORD, self._results_offset))
        self.frame_size = self._results_offset + self._reader.size
        self.pointer_slots = tuple(pointer_slots)

    def _separate_overlaps(self, checked: list[Any]) -> None:
        """Copy each input that a written argument partly overlaps, as numpy does; refuse written ones that do.

        The same view passed twice stays one buffer. The check is numpy's cheap
        extent test, so interleaved views that never touch are copied too.
        """
        for i, j in self._overlaps:
            x, y = checked[i], checked[j]
            if _same_view(x, y) or not np.may_share_memory(x, y):
                continue
            first, second = self.binders[i].contract, self.binders[j].contract
            if first.needs_writeable and second.needs_writeable:  # type: ignore[union-attr]
                if np.shares_memory(x, y):
                    raise ArgumentError(
                        f"{self._kernel}(): '{first.name}' and '{second.name}' overlap in memory without being "
                        "the same view, and the kernel may write both: the result would depend on the order of "
                        "its writes. Pass arrays that do not overlap, or the very same array for both."
                    )
                continue
            reader, writer = (j, first) if first.needs_writeable else (i, second)  # type: ignore[union-attr]
            try:
                checked[reader] = np.array(checked[reader], copy=True)
            except MemoryError:
                read = checked[reader]
                raise allocation_error(
                    f"{self._kernel}(): argument '{self.binders[reader].contract.name}' overlaps "
                    f"'{writer.name}', which the kernel may write, so it is read from a copy, as numpy does; "
                    "that copy", read.shape, read.dtype, "Pass arrays that do not overlap.") from None

    def call(self, args: tuple[Any, ...], given: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """Run the kernel on the inputs ``args`` and the outputs ``given`` (None for each to allocate).

        Returns the output arrays and the decoded results; raises the error that
        explains the first wrong argument.
        """
        state, checked, outputs = self._check(args, given)
        self._separate_overlaps(checked)
        packed: list[Any] = []
        for binder, value in zip(self.binders, checked):
            packed.extend(binder.pack(value, state))
        try:
            frame = self._frames.pop()
        except IndexError:
            frame = _Frame(self)
        if state.copy_back:
            with HeldInterrupts(holding=False) as interrupts:
                error, results = self._invoke(frame, packed, state, interrupts)
        else:
            error, results = self._invoke(frame, packed, state, None)
        if error is not None:
            raise error
        return outputs, results

    def _invoke(self, frame: _Frame, packed: list[Any], state: CallState, interrupts: HeldInterrupts | None
                ) -> tuple[Exception | None, tuple[Any, ...]]:
        """Run the kernel on ``packed`` in ``frame``: the error of a failure it returned to its guard with (a
        failed assertion or heap allocation), if one stopped it, and the results (none then).

        Whatever happens, what the kernel wrote into copies then reaches the
        caller's arrays, all of it: a failure stopped the kernel after its
        writes, and a KeyboardInterrupt either arrives before the kernel
        starts (the copies still hold the arrays' values) or is held by
        ``interrupts`` from the copy-back's start to its end.
        """
        failed = False
        try:
            self._values.pack_into(frame.buffer, self._values_offset, *packed)
            try:
                failed = self._run(frame)
            except ctypes.ArgumentError as exc:
                raise CallDepthError(
                    f"{self._kernel}(): Python's recursion limit was reached while passing the call to the "
                    f"kernel ({exc}). Call it with more of the limit left, or raise sys.setrecursionlimit()."
                ) from None
            error = failure_error(self._kernel, self._source, frame.guard) if failed else None
            results = (self._reader.read(frame.buffer, self._results_offset, state.buffers)
                       if self._reader.results and not failed else ())
            return error, results
        finally:
            if interrupts is not None:
                interrupts.holding = True  # first: no handler runs during an attribute store
            self._frames.append(frame)
            state.finish()

    def _run(self, frame: _Frame) -> bool:
        """Run the kernel on the frame's arguments; whether it unwound to its guard (the frame says why)."""
        if self._guard is None:
            self._function(frame.address)
            return False
        return bool(self._guard(frame.guard, self._address, frame.address))
