"""The fast path: a marshalling function compiled into the kernel's own module.

For the common call (exact ndarrays or torch tensors of the right dtype, rank
and static dims, contiguous where the layout needs it; Python floats, ints and
bools for scalars) a Python-level call costs several microseconds of checks and
descriptor packing. This module writes, in the LLVM dialect, a CPython
``METH_FASTCALL`` function

    PyObject* __memkernel_fast_<name>(PyObject* self, PyObject** argv, Py_ssize_t nargs)

called as ``fast(args, outputs[, results])`` with the bound arguments, the
output arrays (tuples) and, for kernels with scalar results, a byte array to
store them in. It performs every check on the objects themselves, builds the
descriptors in registers, releases the GIL, calls the lowered kernel and stores
its results. It returns the ``done`` object when it ran the kernel, and the
``declined`` object, before running anything, for any value it does not handle;
the caller then takes the checked Python path, which handles (or explains)
everything else. The fast path never accepts a value the Python path would
refuse or convert.

A torch tensor (exactly ``torch.Tensor``, once torch is imported: see
:mod:`memkernel.fastpath.torch_tensors`) is read through torch's DLPack exchange
API into a ``DLTensor`` on the stack, after every tensor argument has been asked
what DLPack does not say (``requires_grad``, ``is_neg()``, ``is_conj()``,
``is_inference()``), so that Python code those questions may run comes before
any argument's memory is read. The compiled entry allocates the output of a call
whose inputs are all tensors as a torch tensor, through the same API.

It calls the kernel through ``__memkernel_run_<name>`` (defined when the module
is compiled, see :func:`memkernel.compile.guard.runner`), with a guard frame on
its stack: when the kernel unwound to the guard (a failed assertion or heap
allocation), the fast path calls the kernel's ``failed`` callable from the
constants table with the frame's address, which raises the error the checked
path raises, and returns NULL with that error set.

A kernel with no results and at most one output also gets a compiled entry,
``__memkernel_entry_<name>``, a ``METH_FASTCALL | METH_KEYWORDS`` function
called as the kernel itself is, ``kernel(*inputs)`` or ``kernel(*inputs,
out=out)``: the same checks, then, without ``out=`` (or with ``out=None``), it
allocates the output zero-filled through numpy's C API (``PyArray_Zeros``)
when the output's dims are static or tied to input dims and its layout is the
identity; it returns the output (None for an in-place kernel). Whatever it
does not take (other keywords, declined values, outputs it cannot shape) it
passes on, as it came, to the Python fallback held in its ``self``.

Process-specific addresses (type objects, dtype objects, C API functions) are
not compiled in: they live in the global table ``__memkernel_consts_<name>``,
filled after loading (see :mod:`memkernel.fastpath.constants`), so the compiled
code can be cached on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..load.guard import FRAME_SIZE as GUARD_FRAME_SIZE
from ..model.contract import BufferContract, Contract, ScalarContract
from ..model.kernel_spec import KernelSpec
from ..model.shapes import Dim
from ..model.signature import ArgSpec, MemRefSpec, ScalarSpec, UnrankedSpec
from ..fastpath.abi import LAYOUT, has_c_function
from ..fastpath.constants import FIRST_DTYPE, Slot
from ..fastpath.symbols import CallPath, FastSymbols, runner_name
from ..fastpath.torch_tensors import (DLPACK_ALLOCATOR, DLPACK_CPU, DLPACK_DLTENSOR_FROM_OBJECT, DLPACK_TO_OBJECT,
                                      DLTENSOR_BYTE_OFFSET, DLTENSOR_DEVICE, DLTENSOR_DTYPE, DLTENSOR_NDIM,
                                      DLTENSOR_SHAPE, DLTENSOR_SIZE, DLTENSOR_STRIDES, MANAGED_DELETER,
                                      MANAGED_DLTENSOR, dlpack_code)


@dataclass(frozen=True)
class FastPath:
    """The fast path's MLIR text, and the symbols a process binds it by."""

    text: str
    symbols: FastSymbols
    kernel: str = ""
    operand_types: tuple[str, ...] = ()
    result_type: str | None = None
    """The lowered kernel it calls, its operands' and result's LLVM types: what ``__memkernel_run_<kernel>``
    takes and stores."""
    optimized: bool = False
    """Whether LLVM optimizes its functions. A call's marshalling runs once per call, and optimizing it took
    most of a compile (120 of 190 ms for an add kernel at ``opt_level=3``) for no gain measured per call: it is
    compiled ``optnone``. A gufunc's loop, which calls the kernel once per batch element, is optimized."""


def _handles(contract: Contract) -> bool:
    if isinstance(contract, BufferContract):
        return contract.rank is not None
    return contract.element.kind in ("int", "bool") or contract.element.mlir in ("f32", "f64")


def lowered_argument_types(spec: ArgSpec) -> list[str]:
    """The LLVM types the default calling convention (64-bit index) expands one argument into."""
    if isinstance(spec, MemRefSpec):
        return ["!llvm.ptr", "!llvm.ptr", "i64"] + ["i64"] * (2 * spec.rank)
    if isinstance(spec, UnrankedSpec):
        return ["i64", "!llvm.ptr"]
    return [spec.element.llvm_type]


def _lowered_result_type(spec: ArgSpec) -> str:
    if isinstance(spec, MemRefSpec):
        arrays = f", !llvm.array<{spec.rank} x i64>" * 2 if spec.rank else ""
        return f"!llvm.struct<(!llvm.ptr, !llvm.ptr, i64{arrays})>"
    if isinstance(spec, UnrankedSpec):
        return "!llvm.struct<(i64, !llvm.ptr)>"
    return spec.element.llvm_type


def lowered_function_type(args: Sequence[ArgSpec], results: Sequence[ArgSpec]) -> str:
    """The ``!llvm.func`` type the default lowering gives a kernel: what every call path of memkernel assumes."""
    inputs = ", ".join(t for spec in args for t in lowered_argument_types(spec))
    returned = [_lowered_result_type(r) for r in results]
    if not returned:
        result = "void"
    elif len(returned) == 1:
        result = returned[0]
    else:
        result = f"!llvm.struct<({', '.join(returned)})>"
    return f"!llvm.func<{result} ({inputs})>"


class _Emitter:
    """Writes LLVM-dialect text: fresh SSA names, and checks that branch to the fallback block."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.deferred: list[str] = []
        """Blocks written after the function's others (a failed kernel's)."""
        self.counter = 0
        self.blocks = 0

    def value(self, expression: str) -> str:
        self.counter += 1
        name = f"%v{self.counter}"
        self.lines.append(f"  {name} = {expression}")
        return name

    def value_name(self) -> str:
        """A fresh SSA name for a value defined elsewhere (a block argument)."""
        self.counter += 1
        return f"%v{self.counter}"

    def op(self, expression: str) -> None:
        self.lines.append(f"  {expression}")

    def stack_bytes(self, size: int, alignment: int) -> str:
        """A pointer to ``size`` bytes on the stack, allocated in the entry block (once per call)."""
        self.counter += 2
        count, name = f"%v{self.counter - 1}", f"%v{self.counter}"
        self.lines[:0] = [f"  {count} = llvm.mlir.constant({size} : i64) : i64",
                          f"  {name} = llvm.alloca {count} x i8 {{alignment = {alignment} : i64}} : (i64) -> !llvm.ptr"]
        return name

    def body(self) -> str:
        """The function's blocks, the deferred ones last."""
        return "\n".join(self.lines + self.deferred)

    def const(self, value: int, llvm_type: str = "i64") -> str:
        if llvm_type == "i1":
            return self.value(f"llvm.mlir.constant({'true' if value else 'false'}) : i1")
        return self.value(f"llvm.mlir.constant({value} : {llvm_type}) : {llvm_type}")

    def at(self, pointer: str, offset: int) -> str:
        return self.value(f"llvm.getelementptr {pointer}[{offset}] : (!llvm.ptr) -> !llvm.ptr, i8")

    def load(self, pointer: str, llvm_type: str, offset: int = 0) -> str:
        address = self.at(pointer, offset) if offset else pointer
        return self.value(f"llvm.load {address} : !llvm.ptr -> {llvm_type}")

    def check(self, condition: str) -> None:
        """Continue only if ``condition`` (an i1) holds; else return 1 (take the Python path)."""
        self.blocks += 1
        self.op(f"llvm.cond_br {condition}, ^ok{self.blocks}, ^fallback")
        self.lines.append(f"^ok{self.blocks}:")

    def all_of(self, conditions: Sequence[str]) -> str:
        result = conditions[0]
        for c in conditions[1:]:
            result = self.value(f"llvm.and {result}, {c} : i1")
        return result

    def icmp(self, predicate: str, a: str, b: str, llvm_type: str = "i64") -> str:
        return self.value(f"llvm.icmp \"{predicate}\" {a}, {b} : {llvm_type}")

    def exact(self, operation: str, a: str, b: str, overflows: list[str]) -> str:
        """``a`` times or plus ``b`` (``operation`` "mul" or "add") in i64; appends to ``overflows`` an i1
        that is true when the result wrapped. A check that computes a size uses this, never a plain
        ``llvm.mul``/``llvm.add``: a wrapped sum passes a comparison it should fail."""
        pair = self.value(f'"llvm.intr.s{operation}.with.overflow"({a}, {b}) : (i64, i64) -> !llvm.struct<(i64, i1)>')
        overflows.append(self.value(f"llvm.extractvalue {pair}[1] : !llvm.struct<(i64, i1)>"))
        return self.value(f"llvm.extractvalue {pair}[0] : !llvm.struct<(i64, i1)>")

    def none_of(self, conditions: Sequence[str]) -> str:
        """An i1 that is true when none of ``conditions`` (i1s) is."""
        any_of = conditions[0]
        for c in conditions[1:]:
            any_of = self.value(f"llvm.or {any_of}, {c} : i1")
        return self.value(f"llvm.xor {any_of}, {self.const(1, 'i1')} : i1")


class _Generator:
    def __init__(self, spec: KernelSpec, results: Sequence[ScalarSpec]) -> None:
        self.name = spec.name
        self.contracts = spec.contracts
        self.n_inputs = spec.n_inputs
        self.ties = spec.shapes.ties
        self.bounds = spec.shapes.bounds
        self.overlaps = spec.overlap_pairs
        self.sizes: dict[int, list[str]] = {}
        self.tensors: dict[int, str] = {}
        """Per memref argument: an i1, true when it is a torch tensor (see _tensor_fields), not an ndarray."""
        self.descriptors: dict[int, tuple[str, list[str], list[str]]] = {}
        self.results = results
        self.dtypes: list[np.dtype] = []
        self.e = _Emitter()
        self.sources = spec.output_sources()
        self.consts = f"__memkernel_consts_{spec.name}"
        self.function = f"__memkernel_fast_{spec.name}"
        self.failed = f"__memkernel_failed_{spec.name}"
        self.ignore_error = f"__memkernel_ignore_error_{spec.name}"
        """``SetError(context, kind, message)`` of torch's allocator: the call declines, and the Python path
        allocates again, raising what fails."""
        self.kernel_types: tuple[str, ...] = ()
        self.kernel_result: str | None = None

    def _const_slot(self, slot: int) -> str:
        """Load the constants table's entry ``slot`` (a :class:`Slot` or a dtype slot)."""
        table = self.e.value(f"llvm.mlir.addressof @{self.consts} : !llvm.ptr")
        return self.e.load(table, "!llvm.ptr", 8 * slot)

    def _dtype_slot(self, dtype: np.dtype) -> int:
        if dtype not in self.dtypes:
            self.dtypes.append(dtype)
        return FIRST_DTYPE + self.dtypes.index(dtype)

    def _object(self, contract: Contract) -> str:
        """The Python object of an argument: from the inputs' array of objects, or the outputs' for an output."""
        if contract.index < self.n_inputs:
            return self.e.load(self.inputs, "!llvm.ptr", 8 * contract.index)
        return self.e.load(self.outputs, "!llvm.ptr", 8 * (contract.index - self.n_inputs))

    def _returning(self, slot: Slot) -> None:
        """Return the object in constants slot ``slot`` as a new reference."""
        e = self.e
        obj = self._const_slot(slot)
        count = e.load(obj, "i64")
        e.op(f"llvm.store {e.value(f'llvm.add {count}, {e.const(1)} : i64')}, {obj} : i64, !llvm.ptr")
        e.op(f"llvm.return {obj} : !llvm.ptr")

    def _is_type(self, obj: str, slot: int) -> str:
        actual = self.e.load(obj, "!llvm.ptr", LAYOUT.ob_type)
        return self.e.icmp("eq", actual, self._const_slot(slot), "!llvm.ptr")

    def _memref(self, contract: BufferContract) -> list[str]:
        """Check a memref argument, an exact ndarray or a torch tensor, and return its descriptor's operands."""
        e = self.e
        rank = contract.rank
        assert rank is not None
        obj = self._object(contract)
        e.blocks += 1
        block = e.blocks
        strided = not contract.needs_contiguous
        types = ["i1", "!llvm.ptr"] + ["i64"] * (rank * (2 if strided else 1))
        e.op(f"llvm.cond_br {self._is_type(obj, Slot.ARRAY_TYPE)}, ^array{block}, ^tensor{block}")
        for label, read, is_tensor in ((f"^array{block}", self._array_fields, 0),
                                       (f"^tensor{block}", self._tensor_fields, 1)):
            e.lines.append(f"{label}:")
            data, sizes, strides = read(obj, contract)
            values = [e.const(is_tensor, "i1"), data, *sizes, *(strides if strided else [])]
            e.op(f"llvm.br ^join{block}({', '.join(values)} : {', '.join(types)})")
        names = [e.value_name() for _ in types]
        e.lines.append(f"^join{block}({', '.join(f'{n}: {t}' for n, t in zip(names, types))}):")
        self.tensors[contract.index] = names.pop(0)
        data, sizes = names[0], names[1:1 + rank]
        self.sizes[contract.index] = sizes
        conditions = [e.icmp("eq", sizes[i], e.const(want)) for i, want in contract.static_dims]
        if contract.needs_contiguous:
            strides = self._contiguous_strides(sizes)
            aligned, offset = data, e.const(0)
        else:
            strides = self._layout_strides(contract, sizes, names[1 + rank:], conditions)
            static_offset = contract.layout_offset
            offset = e.const(static_offset)
            aligned = e.at(data, -static_offset * contract.element.itemsize) if static_offset else data
        if conditions:
            e.check(e.all_of(conditions))
        self.descriptors[contract.index] = (data, sizes, strides)
        return [data, aligned, offset, *sizes, *strides]

    def _array_fields(self, obj: str, contract: BufferContract) -> tuple[str, list[str], list[str]]:
        """An exact ndarray's data pointer, sizes and element strides (the strides only for a strided layout),
        once its dtype, rank and flags fit ``contract``."""
        e = self.e
        rank = contract.rank
        assert rank is not None
        descr = e.load(obj, "!llvm.ptr", LAYOUT.array_descr)
        dtype_ok = [e.icmp("eq", descr, self._const_slot(self._dtype_slot(d)), "!llvm.ptr")
                    for d in contract.dtypes]
        any_dtype = dtype_ok[0]
        for ok in dtype_ok[1:]:
            any_dtype = e.value(f"llvm.or {any_dtype}, {ok} : i1")
        nd = e.load(obj, "i32", LAYOUT.array_nd)
        rank_ok = e.icmp("eq", nd, e.const(rank, "i32"), "i32")
        mask = LAYOUT.aligned | (LAYOUT.c_contiguous if contract.needs_contiguous else 0)
        mask |= LAYOUT.writeable if contract.needs_writeable else 0
        flags = e.load(obj, "i32", LAYOUT.array_flags)
        masked = e.value(f"llvm.and {flags}, {e.const(mask, 'i32')} : i32")
        flags_ok = e.icmp("eq", masked, e.const(mask, "i32"), "i32")
        e.check(e.all_of([any_dtype, rank_ok, flags_ok]))
        data = e.load(obj, "!llvm.ptr", LAYOUT.array_data)
        dims = e.load(obj, "!llvm.ptr", LAYOUT.array_dims)
        sizes = [e.load(dims, "i64", 8 * i) for i in range(rank)]
        if contract.needs_contiguous:
            return data, sizes, []
        itemsize, zero = e.const(contract.element.itemsize), e.const(0)
        byte_strides = e.load(obj, "!llvm.ptr", LAYOUT.array_strides)
        strides, whole = [], []
        for i in range(rank):
            in_bytes = e.load(byte_strides, "i64", 8 * i)
            whole.append(e.icmp("eq", e.value(f"llvm.srem {in_bytes}, {itemsize} : i64"), zero))
            strides.append(e.value(f"llvm.sdiv {in_bytes}, {itemsize} : i64"))
        if whole:
            e.check(e.all_of(whole))
        return data, sizes, strides

    def _tensor_fields(self, obj: str, contract: BufferContract) -> tuple[str, list[str], list[str]]:
        """A torch tensor's data pointer, sizes and element strides, read through the DLPack exchange API, once
        its device, dtype, rank, alignment and (for an identity layout) C-contiguity fit ``contract``: the
        checks numpy makes of the array ``np.from_dlpack`` gives (see :mod:`memkernel.fastpath.torch_tensors`).
        A non-empty tensor whose data pointer is null (no storage, as a fake tensor's) is declined too."""
        e = self.e
        rank = contract.rank
        assert rank is not None
        e.check(self._is_type(obj, Slot.TORCH_TENSOR))
        function = e.load(self._const_slot(Slot.TORCH_DLPACK_API), "!llvm.ptr", DLPACK_DLTENSOR_FROM_OBJECT)
        tensor = e.stack_bytes(DLTENSOR_SIZE, 8)
        status = e.value(f"llvm.call {function}({obj}, {tensor}) : !llvm.ptr, (!llvm.ptr, !llvm.ptr) -> i32")
        self._check_status(e.icmp("eq", status, e.const(0, "i32"), "i32"))
        device = e.load(tensor, "i32", DLTENSOR_DEVICE)
        ndim = e.load(tensor, "i32", DLTENSOR_NDIM)
        code = e.load(tensor, "i32", DLTENSOR_DTYPE)
        codes = sorted(c for c in {dlpack_code(d) for d in contract.dtypes} if c is not None)
        dtype_ok = [e.icmp("eq", code, e.const(c, "i32"), "i32") for c in codes] or [e.const(0, "i1")]
        any_dtype = dtype_ok[0]
        for ok in dtype_ok[1:]:
            any_dtype = e.value(f"llvm.or {any_dtype}, {ok} : i1")
        e.check(e.all_of([e.icmp("eq", device, e.const(DLPACK_CPU, "i32"), "i32"),
                          e.icmp("eq", ndim, e.const(rank, "i32"), "i32"), any_dtype]))
        start, byte_offset = e.load(tensor, "!llvm.ptr"), e.load(tensor, "i64", DLTENSOR_BYTE_OFFSET)
        data = e.value(f"llvm.getelementptr {start}[{byte_offset}] : (!llvm.ptr, i64) -> !llvm.ptr, i8")
        alignment = contract.element.dtype.alignment
        address = e.value(f"llvm.ptrtoint {data} : !llvm.ptr to i64")
        misplaced = e.value(f"llvm.and {address}, {e.const(alignment - 1)} : i64")
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        memory = e.icmp("ne", start, null, "!llvm.ptr")  # a tensor without storage (null data) is declined
        conditions = [e.icmp("eq", misplaced, e.const(0))]
        if not rank:
            e.check(e.all_of([conditions[0], memory]))
            return data, [], []
        shape = e.load(tensor, "!llvm.ptr", DLTENSOR_SHAPE)
        strides_at = e.load(tensor, "!llvm.ptr", DLTENSOR_STRIDES)
        e.check(e.all_of([e.icmp("ne", shape, null, "!llvm.ptr"), e.icmp("ne", strides_at, null, "!llvm.ptr")]))
        sizes = [e.load(shape, "i64", 8 * i) for i in range(rank)]
        strides = [e.load(strides_at, "i64", 8 * i) for i in range(rank)]
        nonempty = e.none_of([e.icmp("eq", size, e.const(0)) for size in sizes])
        empty = e.value(f"llvm.xor {nonempty}, {e.const(1, 'i1')} : i1")
        conditions.append(e.value(f"llvm.or {memory}, {empty} : i1"))
        if contract.needs_contiguous:
            conditions.append(self._c_contiguous(sizes, strides))
        e.check(e.all_of(conditions))
        return data, sizes, strides

    def _c_contiguous(self, sizes: list[str], strides: list[str]) -> str:
        """numpy's C-contiguity of element ``strides``: each dim longer than 1 steps over all the later ones,
        or the array is empty. A product of sizes that wraps (an expanded view of 2**80 elements) is not."""
        e = self.e
        zero, one = e.const(0), e.const(1)
        expected = one
        fits: list[str] = []
        overflows: list[str] = []
        empty: list[str] = []
        for size, stride in zip(reversed(sizes), reversed(strides)):
            fits.append(e.value(f"llvm.or {e.icmp('sle', size, one)}, {e.icmp('eq', stride, expected)} : i1"))
            empty.append(e.icmp("eq", size, zero))
            expected = e.exact("mul", expected, size, overflows)
        contiguous = e.value(f"llvm.and {e.all_of(fits)}, {e.none_of(overflows)} : i1")
        is_empty = e.value(f"llvm.xor {e.none_of(empty)}, {e.const(1, 'i1')} : i1")
        return e.value(f"llvm.or {contiguous}, {is_empty} : i1")

    def _check_status(self, ok: str) -> None:
        """Continue if ``ok``; else clear the Python error a C API call set and decline."""
        e = self.e
        e.blocks += 1
        e.op(f"llvm.cond_br {ok}, ^ok{e.blocks}, ^clear{e.blocks}")
        e.lines.append(f"^clear{e.blocks}:")
        e.op(f"llvm.call {self._const_slot(Slot.CLEAR_ERROR)}() : !llvm.ptr, () -> ()")
        e.op("llvm.br ^fallback")
        e.lines.append(f"^ok{e.blocks}:")

    def _tensor_flags(self, contract: BufferContract) -> None:
        """Decline a torch tensor argument that requires grad, has its negative or (a complex one) its conjugate bit
        set or, when the kernel writes it, is an inference tensor: what its DLTensor does not say, and the checked
        path refuses.

        Asking may run Python code (a ``__torch_function__`` mode), so every argument is asked this before any
        argument's memory is read.
        """
        e = self.e
        obj = self._object(contract)
        e.blocks += 1
        block = e.blocks
        e.op(f"llvm.cond_br {self._is_type(obj, Slot.TORCH_TENSOR)}, ^flags{block}, ^flagged{block}")
        e.lines.append(f"^flags{block}:")
        false = self._const_slot(Slot.FALSE)
        answer = e.value(f"llvm.call {self._const_slot(Slot.GET_ATTR)}({obj}, {self._const_slot(Slot.REQUIRES_GRAD)}) "
                         ": !llvm.ptr, (!llvm.ptr, !llvm.ptr) -> !llvm.ptr")
        answers = [answer]
        arguments = e.stack_bytes(8, 8)
        e.op(f"llvm.store {obj}, {arguments} : !llvm.ptr, !llvm.ptr")
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        methods = [Slot.IS_NEG]
        methods += [Slot.IS_CONJ] if any(d.kind == "c" for d in contract.dtypes) else []  # torch sets it on no other
        methods += [Slot.IS_INFERENCE] if contract.needs_writeable else []
        for method in methods:
            self._check_status(e.icmp("ne", answers[-1], null, "!llvm.ptr"))
            answers.append(e.value(
                f"llvm.call {self._const_slot(Slot.CALL_METHOD)}({self._const_slot(method)}, {arguments}, {e.const(1)}, "
                f"{null}) : !llvm.ptr, (!llvm.ptr, !llvm.ptr, i64, !llvm.ptr) -> !llvm.ptr"))
        self._check_status(e.icmp("ne", answers[-1], null, "!llvm.ptr"))
        unset = []  # False itself: anything else a mode may answer is declined
        for answer in answers:
            unset.append(e.icmp("eq", answer, false, "!llvm.ptr"))
            e.op(f"llvm.call {self._const_slot(Slot.DECREF)}({answer}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.check(e.all_of(unset))
        e.op(f"llvm.br ^flagged{block}")
        e.lines.append(f"^flagged{block}:")

    def _layout_strides(self, contract: BufferContract, sizes: list[str], actual: list[str],
                        conditions: list[str]) -> list[str]:
        """The compiled form of :meth:`BufferContract.descriptor_strides` on the ``actual`` element strides; its
        failures join ``conditions``.

        An empty array is declined: the checked path gives it the layout's strides.
        """
        e = self.e
        assert contract.layout_strides is not None
        zero, one = e.const(0), e.const(1)
        conditions += [e.icmp("ne", size, zero) for size in sizes]
        strides = []
        for want, size, stride in zip(contract.layout_strides, sizes, actual):
            if want is None:
                strides.append(stride)
                continue
            expected = e.const(want)
            matches = e.icmp("eq", stride, expected)
            trivial = e.icmp("sle", size, one)
            conditions.append(e.value(f"llvm.or {matches}, {trivial} : i1"))
            strides.append(expected)
        return strides

    def _contiguous_strides(self, sizes: list[str]) -> list[str]:
        e = self.e
        one = e.const(1)
        strides = [one] * len(sizes)
        for i in range(len(sizes) - 2, -1, -1):
            at_least_one = e.value(f"llvm.intr.smax({sizes[i + 1]}, {one}) : (i64, i64) -> i64")
            strides[i] = e.value(f"llvm.mul {strides[i + 1]}, {at_least_one} : i64")
        return strides

    def _scalar(self, contract: ScalarContract) -> list[str]:
        e = self.e
        element = contract.element
        obj = self._object(contract)
        if element.kind == "bool":
            e.check(self._is_type(obj, Slot.BOOL_TYPE))
            is_true = e.icmp("eq", obj, self._const_slot(Slot.TRUE), "!llvm.ptr")
            return [is_true]
        if element.kind == "float":
            e.check(self._is_type(obj, Slot.FLOAT_TYPE))
            value = e.load(obj, "f64", LAYOUT.float_value)
            if element.mlir == "f64":
                return [value]
            narrow = e.value(f"llvm.fptrunc {value} : f64 to f32")
            wide = e.value(f"llvm.fpext {narrow} : f32 to f64")
            inf = e.value("llvm.mlir.constant(0x7FF0000000000000 : f64) : f64")
            was_finite = e.value(f"llvm.fcmp \"one\" {self._fabs(value)}, {inf} : f64")
            overflowed = e.value(f"llvm.fcmp \"oeq\" {self._fabs(wide)}, {inf} : f64")
            not_overflowed = e.value(f"llvm.xor {overflowed}, {e.const(1, 'i1')} : i1")
            is_nan = e.value(f"llvm.fcmp \"uno\" {value}, {value} : f64")
            finite_ok = e.value(f"llvm.or {not_overflowed}, {is_nan} : i1")
            not_finite = e.value(f"llvm.xor {was_finite}, {e.const(1, 'i1')} : i1")
            e.check(e.value(f"llvm.or {finite_ok}, {not_finite} : i1"))
            return [narrow]
        e.check(self._is_type(obj, Slot.LONG_TYPE))
        overflow = e.value("llvm.alloca " + e.const(1) + " x i32 : (i64) -> !llvm.ptr")
        convert = self._const_slot(Slot.AS_LONG_LONG)
        value = e.value(f"llvm.call {convert}({obj}, {overflow}) : !llvm.ptr, (!llvm.ptr, !llvm.ptr) -> i64")
        flag = e.load(overflow, "i32")
        conditions = [e.icmp("eq", flag, e.const(0, "i32"), "i32")]
        assert contract.int_range is not None
        low, high = contract.int_range
        if low > -(1 << 63):
            conditions.append(e.icmp("sge", value, e.const(low)))
        if high < (1 << 63) - 1:
            conditions.append(e.icmp("sle", value, e.const(high)))
        e.check(e.all_of(conditions))
        llvm_type = element.llvm_type
        if llvm_type == "i64":
            return [value]
        return [e.value(f"llvm.trunc {value} : i64 to {llvm_type}")]

    def _check_shapes(self) -> None:
        """The compiled form of :meth:`ShapeRules.check`'s ties (dims that must be equal, or a constant) and
        bounds (a dim that must reach a linear sum of others, and no index below 0, unless one of those is
        empty)."""
        e = self.e
        conditions = []
        for tie in self.ties:
            size = self.sizes[tie.a.arg][tie.a.dim]
            other = e.const(tie.size) if tie.b is None else self.sizes[tie.b.arg][tie.b.dim]
            conditions.append(e.icmp("eq", size, other))
        for bound in self.bounds:
            reach = e.const(bound.constant)
            empty = None
            overflows: list[str] = []
            for coefficient, dim in bound.terms:
                size = self.sizes[dim.arg][dim.dim]
                last = e.value(f"llvm.sub {size}, {e.const(1)} : i64")  # a size is never negative: exact
                reach = e.exact("add", reach, e.exact("mul", last, e.const(coefficient), overflows), overflows)
                none = e.icmp("eq", size, e.const(0))
                empty = none if empty is None else e.value(f"llvm.or {empty}, {none} : i1")
            fits = e.icmp("sgt", self.sizes[bound.target.arg][bound.target.dim], reach)
            if bound.lowest < 0:  # an index below 0 is outside the target whatever its size
                fits = e.const(0, "i1")
            if overflows:  # a reach past 2**63 is declined; the checked path says by how much it misses
                fits = e.value(f"llvm.and {fits}, {e.none_of(overflows)} : i1")
            conditions.append(fits if empty is None else e.value(f"llvm.or {fits}, {empty} : i1"))
        if conditions:
            e.check(e.all_of(conditions))

    def _extent(self, index: int, overflows: list[str]) -> tuple[str, str, str]:
        """Argument ``index``'s memory as ``[lo, hi)`` byte addresses, and whether it is empty; appends to
        ``overflows`` whether each step of the arithmetic wrapped (only strides that lie about the memory can)."""
        e = self.e
        data, sizes, strides = self.descriptors[index]
        itemsize = self.contracts[index].element.itemsize
        zero, one = e.const(0), e.const(1)
        start = e.value(f"llvm.ptrtoint {data} : !llvm.ptr to i64")
        low, high = zero, one
        empty = e.const(0, "i1")
        for size, stride in zip(sizes, strides):
            empty = e.value(f"llvm.or {empty}, {e.icmp('eq', size, zero)} : i1")
            last = e.exact("mul", e.value(f"llvm.sub {size}, {one} : i64"), stride, overflows)
            low = e.exact("add", low, e.value(f"llvm.intr.smin({last}, {zero}) : (i64, i64) -> i64"), overflows)
            high = e.exact("add", high, e.value(f"llvm.intr.smax({last}, {zero}) : (i64, i64) -> i64"), overflows)
        scale = e.const(itemsize)
        lo = e.exact("add", start, e.exact("mul", low, scale, overflows), overflows)
        hi = e.exact("add", start, e.exact("mul", high, scale, overflows), overflows)
        return lo, hi, empty

    def _check_overlaps(self, fresh: int | None = None) -> None:
        """The compiled form of the checked path's overlap rule: disjoint, empty or the very same view,
        else decline (the checked path copies the input, as numpy does). Argument ``fresh`` is an output
        about to be allocated: it overlaps nothing."""
        e = self.e
        conditions = []
        for i, j in self.overlaps:
            if fresh in (i, j):
                continue
            overflows: list[str] = []
            lo_a, hi_a, empty_a = self._extent(i, overflows)
            lo_b, hi_b, empty_b = self._extent(j, overflows)
            apart = e.value(f"llvm.or {e.icmp('ule', hi_a, lo_b)}, {e.icmp('ule', hi_b, lo_a)} : i1")
            apart = e.value(f"llvm.and {apart}, {e.none_of(overflows)} : i1")
            fine = e.value(f"llvm.or {apart}, {e.value(f'llvm.or {empty_a}, {empty_b} : i1')} : i1")
            first, second = self.contracts[i], self.contracts[j]
            if first.element.dtype == second.element.dtype and first.spec.rank == second.spec.rank:  # type: ignore[union-attr]
                (data_a, sizes_a, strides_a), (data_b, sizes_b, strides_b) = self.descriptors[i], self.descriptors[j]
                same = [e.icmp("eq", data_a, data_b, "!llvm.ptr")]
                same += [e.icmp("eq", x, y) for x, y in zip(sizes_a + strides_a, sizes_b + strides_b)]
                fine = e.value(f"llvm.or {fine}, {e.all_of(same)} : i1")
            conditions.append(fine)
        if conditions:
            e.check(e.all_of(conditions))

    def _fabs(self, value: str) -> str:
        return self.e.value(f"llvm.intr.fabs({value}) : (f64) -> f64")

    def _operands(self, contracts: Sequence[Contract]) -> tuple[list[str], list[str]]:
        """Check each argument of ``contracts`` and return its lowered operands, and their LLVM types."""
        operands: list[str] = []
        types: list[str] = []
        for contract in contracts:
            if isinstance(contract, BufferContract):
                self._tensor_flags(contract)
        for contract in contracts:
            if isinstance(contract, BufferContract):
                operands += self._memref(contract)
            else:
                operands += self._scalar(contract)
            types += lowered_argument_types(contract.spec)
        return operands, types

    def _call_kernel(self, operands: list[str], types: list[str], results: str | None = None,
                     owned: str | None = None) -> None:
        """Release the GIL, call the kernel (storing its result at ``results``), take the GIL back.

        If the kernel unwound to its guard, release ``owned`` (a new reference the call made) and return NULL
        with the error set that the kernel's ``failed`` callable raises.
        """
        e = self.e
        frame = e.stack_bytes(GUARD_FRAME_SIZE, 16)
        save = self._const_slot(Slot.SAVE_THREAD)
        restore = self._const_slot(Slot.RESTORE_THREAD)
        state = e.value(f"llvm.call {save}() : !llvm.ptr, () -> !llvm.ptr")
        results = results or e.value("llvm.mlir.zero : !llvm.ptr")
        signature = f"({', '.join(['!llvm.ptr', '!llvm.ptr', *types])}) -> i32"
        status = e.value(f"llvm.call @{runner_name(self.name)}({', '.join([frame, results, *operands])}) : "
                         f"{signature}")
        e.op(f"llvm.call {restore}({state}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.blocks += 1
        block = e.blocks
        e.op(f"llvm.cond_br {e.icmp('ne', status, e.const(0, 'i32'), 'i32')}, ^failed{block}, ^ran{block}")
        e.lines.append(f"^ran{block}:")
        lines, e.lines = e.lines, e.deferred
        e.lines.append(f"^failed{block}:")
        if owned is not None:
            e.op(f"llvm.call {self._const_slot(Slot.DECREF)}({owned}) : !llvm.ptr, (!llvm.ptr) -> ()")
        raised = e.value(f"llvm.call @{self.failed}({frame}) : (!llvm.ptr) -> !llvm.ptr")
        e.op(f"llvm.return {raised} : !llvm.ptr")
        e.lines = lines

    def generate(self) -> str:
        """The ``fast(args, outputs[, results])`` function, as LLVM-dialect text."""
        e = self.e
        e.check(e.icmp("eq", "%nargs", e.const(3 if self.results else 2)))
        self.inputs = e.at(e.load("%argv", "!llvm.ptr"), LAYOUT.tuple_items)
        self.outputs = e.at(e.load("%argv", "!llvm.ptr", 8), LAYOUT.tuple_items)
        operands, types = self._operands(self.contracts)
        self._check_shapes()
        self._check_overlaps()
        result_types = [r.element.llvm_type for r in self.results]
        if not result_types:
            returned = None
        elif len(result_types) == 1:
            returned = str(result_types[0])
        else:
            returned = f"!llvm.struct<({', '.join(str(t) for t in result_types)})>"
        self.kernel_types, self.kernel_result = tuple(types), returned
        if returned:
            results_array = e.load("%argv", "!llvm.ptr", 16)
            results = e.load(results_array, "!llvm.ptr", LAYOUT.array_data)
            self._call_kernel(operands, types, results)
        else:
            self._call_kernel(operands, types)
        self._returning(Slot.DONE)
        e.lines.append("^fallback:")
        self._returning(Slot.DECLINED)
        body = e.body()
        self.declaration = f"llvm.func @{self.name}({', '.join(types)}){f' -> {returned}' if returned else ''}"
        return f"""llvm.func @{self.function}(%self: !llvm.ptr, %argv: !llvm.ptr, %nargs: i64) -> !llvm.ptr {{
{body}
}}"""

    def module_text(self, entry: str | None) -> FastPath:
        """The fast path's functions, the kernel's declaration and the constants table, as one text."""
        functions = [self.generate()]
        if entry is not None:
            functions.append(_EntryGenerator(self).generate(entry))
        functions.append(self._failed_function())
        functions.append(f"llvm.func @{self.ignore_error}(%context: !llvm.ptr, %kind: !llvm.ptr, %message: !llvm.ptr) "
                         "{\n  llvm.return\n}")
        size = FIRST_DTYPE + len(self.dtypes)
        text = f"""
llvm.mlir.global external @{self.consts}(dense<0> : tensor<{size}xi64>) : !llvm.array<{size} x i64>
{self.declaration}
{chr(10).join(functions)}
"""
        return FastPath(text, FastSymbols(self.function, self.consts, tuple(self.dtypes), entry), self.name,
                        self.kernel_types, self.kernel_result)

    def _failed_function(self) -> str:
        """``__memkernel_failed_<name>(frame)``: the kernel's ``failed`` callable called with the frame's address
        (it raises); returns NULL, the error set."""
        self.e = e = _Emitter()
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        address = e.value(f"llvm.call {self._const_slot(Slot.FROM_VOID_PTR)}(%frame) : !llvm.ptr, (!llvm.ptr) -> "
                          "!llvm.ptr")
        e.op(f"llvm.cond_br {e.icmp('eq', address, null, '!llvm.ptr')}, ^no_memory, ^made")
        e.lines.append("^made:")
        arguments = e.value(f"llvm.call {self._const_slot(Slot.TUPLE_NEW)}({e.const(1)}) : !llvm.ptr, (i64) -> "
                            "!llvm.ptr")
        e.op(f"llvm.cond_br {e.icmp('eq', arguments, null, '!llvm.ptr')}, ^no_tuple, ^packed")
        e.lines.append("^no_tuple:")
        e.op(f"llvm.call {self._const_slot(Slot.DECREF)}({address}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.op("llvm.br ^no_memory")
        e.lines.append("^packed:")
        e.value(f"llvm.call {self._const_slot(Slot.TUPLE_SET_ITEM)}({arguments}, {e.const(0)}, {address}) : "
                "!llvm.ptr, (!llvm.ptr, i64, !llvm.ptr) -> i32")  # steals the reference to the address
        raised = e.value(f"llvm.call {self._const_slot(Slot.CALL)}({self._const_slot(Slot.FAILED)}, {arguments}, "
                         f"{null}) : !llvm.ptr, (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> !llvm.ptr")
        e.op(f"llvm.call {self._const_slot(Slot.DECREF)}({arguments}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.op(f"llvm.return {raised} : !llvm.ptr")
        e.lines.append("^no_memory:")
        e.op(f"llvm.return {null} : !llvm.ptr")
        return f"llvm.func @{self.failed}(%frame: !llvm.ptr) -> !llvm.ptr {{\n{e.body()}\n}}"




class _EntryGenerator:
    """Writes the compiled entry: ``kernel(*inputs[, out=out])`` itself, as a ``METH_FASTCALL | METH_KEYWORDS``
    function whose ``self`` is the tuple ``(definition, fallback, path cell)``."""

    def __init__(self, raw: _Generator) -> None:
        self.g = raw
        raw.e = self.e = _Emitter()
        raw.sizes, raw.descriptors, raw.tensors = {}, {}, {}
        self.n_inputs = raw.n_inputs
        self.output = raw.contracts[raw.n_inputs] if len(raw.contracts) > raw.n_inputs else None

    def _self_item(self, position: int) -> str:
        return self.e.load("%self", "!llvm.ptr", LAYOUT.tuple_items + 8 * position)

    def _call_c(self, slot: Slot, arguments: Sequence[tuple[str, str]], returned: str = "") -> str | None:
        """Call the C function in constants slot ``slot`` with ``(value, type)`` arguments."""
        e = self.e
        function = self.g._const_slot(slot)
        values = ", ".join(v for v, _ in arguments)
        signature = f"!llvm.ptr, ({', '.join(t for _, t in arguments)}) -> {returned or '()'}"
        if returned:
            return e.value(f"llvm.call {function}({values}) : {signature}")
        e.op(f"llvm.call {function}({values}) : {signature}")
        return None

    def _ran(self, returned: str, new_reference: bool = False) -> None:
        """Mark the call fast in the path cell and return ``returned`` (a new reference to it, unless it is one)."""
        e = self.e
        cell = e.load(self._self_item(2), "!llvm.ptr", LAYOUT.array_data)
        e.op(f"llvm.store {e.const(int(CallPath.FAST))}, {cell} : i64, !llvm.ptr")
        if not new_reference:
            self._call_c(Slot.INCREF, [(returned, "!llvm.ptr")])
        e.op(f"llvm.return {returned} : !llvm.ptr")

    def _run_given(self, contracts: Sequence[Contract]) -> None:
        """Check every argument (the output, if any, is ``out=``), run the kernel and return the output or None."""
        g = self.g
        operands, types = g._operands(contracts)
        g._check_shapes()
        g._check_overlaps()
        g._call_kernel(operands, types)
        if self.output is None:
            self._ran(g._const_slot(Slot.NONE))
        else:
            self._ran(g._object(self.output))

    def _allocatable(self, sources: Sequence[object] | None) -> bool:
        output = self.output
        return (isinstance(output, BufferContract) and output.needs_contiguous and output.rank is not None
                and sources is not None and None not in sources)

    def _run_allocating(self, sources: Sequence[Dim | int]) -> None:
        """Check the inputs, allocate the output zero-filled from the dims its ties give, run the kernel and
        return the output; decline (before allocating) whatever the checks refuse.

        When every memref input is a torch tensor the output is a torch tensor, allocated by torch (see
        :meth:`_torch_zeros`); else an ndarray (``PyArray_Zeros``).
        """
        g, e = self.g, self.e
        output = self.output
        assert isinstance(output, BufferContract)
        operands, types = g._operands(g.contracts[:self.n_inputs])
        sizes = [e.const(s) if isinstance(s, int) else g.sizes[s.arg][s.dim] for s in sources]
        g.sizes[output.index] = sizes
        if output.static_dims:
            e.check(e.all_of([e.icmp("eq", sizes[i], e.const(want)) for i, want in output.static_dims]))
        g._check_shapes()
        g._check_overlaps(fresh=output.index)
        rank = len(sizes)
        dims = e.value(f"llvm.alloca {e.const(max(rank, 1))} x i64 : (i64) -> !llvm.ptr")
        for i, size in enumerate(sizes):
            e.op(f"llvm.store {size}, {e.at(dims, 8 * i) if i else dims} : i64, !llvm.ptr")
        tensors = list(g.tensors.values())
        code = dlpack_code(output.element.dtype)
        if tensors:
            e.op(f"llvm.cond_br {e.all_of(tensors)}, ^torch_zeros, ^numpy_zeros")
            e.lines.append("^torch_zeros:")
            if code is None:  # a dtype torch has none for: the Python path says so
                e.op("llvm.br ^fallback")
            else:
                tensor, data = self._torch_zeros(dims, rank, code, sizes, output.element.itemsize)
                e.op(f"llvm.br ^allocated({tensor}, {data} : !llvm.ptr, !llvm.ptr)")
            e.lines.append("^numpy_zeros:")
        descr = g._const_slot(g._dtype_slot(output.element.dtype))
        self._call_c(Slot.INCREF, [(descr, "!llvm.ptr")])  # PyArray_Zeros steals a reference to it
        array = self._call_c(Slot.ZEROS, [(e.const(rank, "i32"), "i32"), (dims, "!llvm.ptr"),
                                          (descr, "!llvm.ptr"), (e.const(0, "i32"), "i32")], "!llvm.ptr")
        assert array is not None
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        e.op(f"llvm.cond_br {e.icmp('eq', array, null, '!llvm.ptr')}, ^allocation_failed, ^numpy_allocated")
        e.lines.append("^allocation_failed:")
        self._call_c(Slot.CLEAR_ERROR, [])
        e.op("llvm.br ^fallback")
        e.lines.append("^numpy_allocated:")
        e.op(f"llvm.br ^allocated({array}, {e.load(array, '!llvm.ptr', LAYOUT.array_data)} : !llvm.ptr, !llvm.ptr)")
        made, data = e.value_name(), e.value_name()
        e.lines.append(f"^allocated({made}: !llvm.ptr, {data}: !llvm.ptr):")
        operands += [data, data, e.const(0), *sizes, *g._contiguous_strides(sizes)]
        g._call_kernel(operands, types + lowered_argument_types(output.spec), owned=made)
        self._ran(made, new_reference=True)

    def _torch_zeros(self, dims: str, rank: int, code: int, sizes: list[str], itemsize: int) -> tuple[str, str]:
        """A new torch tensor of ``sizes`` (stored at ``dims``) and DLPack dtype ``code``, zero-filled, and its
        data pointer: allocated by torch's exchange API (``managed_tensor_allocator``), checked C-contiguous and
        made a Python tensor (``managed_tensor_to_py_object_no_sync``). Declines when torch cannot allocate it."""
        g, e = self.g, self.e
        api = g._const_slot(Slot.TORCH_DLPACK_API)
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        prototype = e.stack_bytes(DLTENSOR_SIZE, 8)
        e.op(f"llvm.store {null}, {prototype} : !llvm.ptr, !llvm.ptr")
        for offset, value, kind in ((DLTENSOR_DEVICE, DLPACK_CPU, "i32"), (DLTENSOR_DEVICE + 4, 0, "i32"),
                                    (DLTENSOR_NDIM, rank, "i32"), (DLTENSOR_DTYPE, code, "i32"),
                                    (DLTENSOR_BYTE_OFFSET, 0, "i64")):
            e.op(f"llvm.store {e.const(value, kind)}, {e.at(prototype, offset)} : {kind}, !llvm.ptr")
        e.op(f"llvm.store {dims}, {e.at(prototype, DLTENSOR_SHAPE)} : !llvm.ptr, !llvm.ptr")
        e.op(f"llvm.store {null}, {e.at(prototype, DLTENSOR_STRIDES)} : !llvm.ptr, !llvm.ptr")
        slot = e.stack_bytes(8, 8)
        allocate = e.load(api, "!llvm.ptr", DLPACK_ALLOCATOR)
        ignore = e.value(f"llvm.mlir.addressof @{g.ignore_error} : !llvm.ptr")
        status = e.value(f"llvm.call {allocate}({prototype}, {slot}, {null}, {ignore}) : !llvm.ptr, "
                         "(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> i32")
        g._check_status(e.icmp("eq", status, e.const(0, "i32"), "i32"))
        managed = e.load(slot, "!llvm.ptr")
        tensor = e.at(managed, MANAGED_DLTENSOR)
        start, byte_offset = e.load(tensor, "!llvm.ptr"), e.load(tensor, "i64", DLTENSOR_BYTE_OFFSET)
        data = e.value(f"llvm.getelementptr {start}[{byte_offset}] : (!llvm.ptr, i64) -> !llvm.ptr, i8")
        contiguous = e.const(1, "i1")
        if rank:
            strides_at = e.load(tensor, "!llvm.ptr", DLTENSOR_STRIDES)
            has_strides = e.icmp("ne", strides_at, null, "!llvm.ptr")
            e.blocks += 1
            block = e.blocks
            # No strides (DLPack before 1.2) mean C-contiguous.
            e.op(f"llvm.cond_br {has_strides}, ^strides{block}, ^strided{block}({contiguous} : i1)")
            e.lines.append(f"^strides{block}:")
            strides = [e.load(strides_at, "i64", 8 * i) for i in range(rank)]
            e.op(f"llvm.br ^strided{block}({g._c_contiguous(sizes, strides)} : i1)")
            contiguous = e.value_name()
            e.lines.append(f"^strided{block}({contiguous}: i1):")
        e.blocks += 1
        block = e.blocks
        e.op(f"llvm.cond_br {contiguous}, ^wrap{block}, ^unwanted{block}")
        e.lines.append(f"^unwanted{block}:")
        deleter = e.load(managed, "!llvm.ptr", MANAGED_DELETER)
        e.op(f"llvm.call {deleter}({managed}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.op("llvm.br ^fallback")
        e.lines.append(f"^wrap{block}:")
        count = e.const(itemsize)
        for size in sizes:
            count = e.value(f"llvm.mul {count}, {size} : i64")  # torch allocated as many bytes: no wrap
        e.op(f'"llvm.intr.memset"({data}, {e.const(0, "i8")}, {count}) <{{isVolatile = false}}> : '
             "(!llvm.ptr, i8, i64) -> ()")
        wrap = e.load(api, "!llvm.ptr", DLPACK_TO_OBJECT)
        status = e.value(f"llvm.call {wrap}({managed}, {slot}) : !llvm.ptr, (!llvm.ptr, !llvm.ptr) -> i32")
        g._check_status(e.icmp("eq", status, e.const(0, "i32"), "i32"))
        return e.load(slot, "!llvm.ptr"), data

    def generate(self, name: str) -> str:
        g, e = self.g, self.e
        mask = e.const((1 << 63) - 1)  # PY_VECTORCALL_ARGUMENTS_OFFSET is the top bit of nargsf
        nargs = e.value(f"llvm.and %nargsf, {mask} : i64")
        e.check(e.icmp("eq", nargs, e.const(self.n_inputs)))
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        keywords = e.icmp("ne", "%kwnames", null, "!llvm.ptr")
        g.inputs = "%argv"
        if self.output is None:
            e.check(e.value(f"llvm.xor {keywords}, {e.const(1, 'i1')} : i1"))
            self._run_given(g.contracts)
        else:
            e.op(f"llvm.cond_br {keywords}, ^keyword, ^allocate")
            e.lines.append("^keyword:")
            count = e.load("%kwnames", "i64", LAYOUT.tuple_size)
            keyword = e.load("%kwnames", "!llvm.ptr", LAYOUT.tuple_items)
            e.check(e.all_of([e.icmp("eq", count, e.const(1)),
                              e.icmp("eq", keyword, g._const_slot(Slot.OUT_NAME), "!llvm.ptr")]))
            g.outputs = e.at("%argv", 8 * self.n_inputs)
            out = e.load(g.outputs, "!llvm.ptr")
            e.op(f"llvm.cond_br {e.icmp('eq', out, g._const_slot(Slot.NONE), '!llvm.ptr')}, ^allocate, ^given")
            e.lines.append("^given:")
            self._run_given(g.contracts)
            e.lines.append("^allocate:")
            g.sizes, g.descriptors, g.tensors = {}, {}, {}
            sources = g.sources[0] if g.sources else None
            if self._allocatable(sources):
                self._run_allocating(sources)  # type: ignore[arg-type]
            else:
                e.op("llvm.br ^fallback")
        e.lines.append("^fallback:")
        fallback = self._self_item(1)
        result = self._call_c(Slot.VECTORCALL, [(fallback, "!llvm.ptr"), ("%argv", "!llvm.ptr"),
                                                ("%nargsf", "i64"), ("%kwnames", "!llvm.ptr")], "!llvm.ptr")
        e.op(f"llvm.return {result} : !llvm.ptr")
        body = e.body()
        parameters = "%self: !llvm.ptr, %argv: !llvm.ptr, %nargsf: i64, %kwnames: !llvm.ptr"
        return f"""llvm.func @{name}({parameters}) -> !llvm.ptr {{
{body}
}}"""


def fast_path(spec: KernelSpec, results: Sequence[ArgSpec]) -> FastPath | None:
    """The fast path for a kernel (with its compiled entry, for a kernel with no results and at most one
    output), or None if one of its argument kinds is not handled.

    Its arguments' contracts come from the inputs tuple (the first
    ``n_inputs``) and the outputs tuple. The shape ties and the overlap pairs
    are checked in compiled code, and so are the linear bounds (a dim at least a
    sum of others, as a convolution's window asks); a kernel with other affine
    bounds, or with rules on views of its arguments, is left to the checked
    path, which checks them.
    """
    scalars = [r for r in results if isinstance(r, ScalarSpec)]
    if not all(_handles(c) for c in spec.contracts) or len(scalars) != len(results) or spec.shapes.affine_bounds \
            or spec.shapes.views:
        return None
    # The entry passes declined calls on with PyObject_Vectorcall, a real export from Python 3.11 on.
    has_entry = not results and spec.n_outputs <= 1 and has_c_function("PyObject_Vectorcall")
    entry = f"__memkernel_entry_{spec.name}" if has_entry else None
    return _Generator(spec, scalars).module_text(entry)
