"""The gufunc's inner loop, emitted into the kernel's module in the LLVM dialect.

numpy calls a generalized ufunc's loop as

    void __memkernel_gufunc_<name>(char **args, npy_intp const *dimensions, npy_intp const *steps, void *data)

with ``dimensions[0]`` the batch size, then the core dims by name (see
:class:`~memkernel.ufunc.layout.GufuncLayout`), and ``steps`` the operands'
batch strides, then their core strides, in bytes. For each batch element the
loop builds each operand's descriptor (the kernel's contiguous strides), zero-fills
the outputs (memkernel's allocated outputs are zero-filled; destination-style
kernels accumulate) and calls the kernel through its runner
(``__memkernel_run_<name>``, the guard when the module has one). An operand
whose core is not C-contiguous (a transposed view, ``axes=``, a broadcast
core) is copied into a contiguous buffer of its own, and outputs copied back,
so the kernel only ever sees the contiguous memory its layout assumes. An
output whose core shares memory with an input's at that element (numpy hands
``out=`` an input as it is) is computed in its buffer and copied back after the
kernel ran, so the kernel never reads what it has already written.

With ``parallel`` the batch is split into one contiguous range per core, run on
threads the loop starts (each with its own guard frame and copies) and joins.
A range that stops (the kernel unwound to its guard, a copy that could not be
allocated) stores why in its frame; the loop then takes the GIL and calls the
table's ``failed`` with that frame, which sets the error numpy raises.
"""

from __future__ import annotations

from ..fastpath.symbols import runner_name
from ..load.guard import FRAME_SIZE, MESSAGE_OFFSET, SIZE_OFFSET
from ..ufunc.constants import STATUS_OFFSET, GuSlot, Status
from ..ufunc.layout import CoreArg, GufuncLayout
from .fast_path import _Emitter

_MIN_CHUNK = 16
"""Fewest batch elements a thread of a ``parallel=True`` gufunc gets: starting a thread costs about 20 µs."""
_CONTEXT = 64 + FRAME_SIZE
"""A thread's context: args, dims, steps, start, end, created flag, thread id, then its guard frame."""


def loop_name(kernel: str) -> str:
    """The symbol of kernel ``kernel``'s gufunc loop."""
    return f"__memkernel_gufunc_{kernel}"


def consts_name(kernel: str) -> str:
    """The symbol of the gufunc loop's constants table (see :mod:`memkernel.ufunc.constants`)."""
    return f"__memkernel_guconsts_{kernel}"


def operand_types(layout: GufuncLayout) -> tuple[str, ...]:
    """The lowered kernel's operand types, as the runner takes them."""
    types: list[str] = []
    for a in layout.args:
        rank = len(a.names)
        types += [a.llvm_type] if a.scalar else ["!llvm.ptr", "!llvm.ptr", "i64"] + ["i64"] * (2 * rank)
    return tuple(types)


class _Loop:
    def __init__(self, layout: GufuncLayout) -> None:
        self.layout = layout
        self.name = layout.kernel
        self.e = _Emitter()
        self.consts = consts_name(layout.kernel)

    def slot(self, slot: GuSlot) -> str:
        table = self.e.value(f"llvm.mlir.addressof @{self.consts} : !llvm.ptr")
        return self.e.load(table, "!llvm.ptr" if slot != GuSlot.THREADS else "i64", 8 * slot)

    def block(self, label: str) -> None:
        self.e.lines.append(f"^{label}:")

    def fresh(self, stem: str) -> str:
        self.e.blocks += 1
        return f"{stem}{self.e.blocks}"

    # -- the copy of one operand's core, to or from a contiguous buffer -----------------------

    def copy_function(self, a: CoreArg) -> str:
        """``@__memkernel_gucopy_<name>_<i>(contig, strided, gather, sizes..., byte strides...)``."""
        e = self.e = _Emitter()
        rank = len(a.names)
        sizes = [f"%s{d}" for d in range(rank)]
        strides = [f"%t{d}" for d in range(rank)]
        total = e.const(1)
        for s in sizes:
            total = e.value(f"llvm.mul {total}, {s} : i64")
        e.op(f"llvm.br ^head({e.const(0)} : i64)")
        e.lines.append("^head(%i: i64):")
        e.op(f"llvm.cond_br {e.icmp('slt', '%i', total)}, ^body, ^exit")
        self.block("body")
        rest, offset = "%i", e.const(0)
        for d in range(rank - 1, -1, -1):
            if d:
                quotient = e.value(f"llvm.udiv {rest}, {sizes[d]} : i64")
                index = e.value(f"llvm.sub {rest}, {e.value(f'llvm.mul {quotient}, {sizes[d]} : i64')} : i64")
            else:
                quotient, index = rest, rest
            offset = e.value(f"llvm.add {offset}, {e.value(f'llvm.mul {index}, {strides[d]} : i64')} : i64")
            rest = quotient
        far = e.value(f"llvm.getelementptr %strided[{offset}] : (!llvm.ptr, i64) -> !llvm.ptr, i8")
        near = e.value(f"llvm.getelementptr %contig[%i] : (!llvm.ptr, i64) -> !llvm.ptr, {_bytes(a)}")
        size = e.const(a.dtype.itemsize)
        e.op("llvm.cond_br %gather, ^gather, ^scatter")
        self.block("gather")
        e.op(f'"llvm.intr.memcpy"({near}, {far}, {size}) <{{isVolatile = false}}> : (!llvm.ptr, !llvm.ptr, i64) -> ()')
        e.op("llvm.br ^next")
        self.block("scatter")
        e.op(f'"llvm.intr.memcpy"({far}, {near}, {size}) <{{isVolatile = false}}> : (!llvm.ptr, !llvm.ptr, i64) -> ()')
        e.op("llvm.br ^next")
        self.block("next")
        e.op(f"llvm.br ^head({e.value(f'llvm.add %i, {e.const(1)} : i64')} : i64)")
        self.block("exit")
        e.op("llvm.return")
        params = ", ".join(["%contig: !llvm.ptr", "%strided: !llvm.ptr", "%gather: i1",
                            *(f"{s}: i64" for s in sizes), *(f"{t}: i64" for t in strides)])
        return f"llvm.func @{_copy_name(self.name, a.index)}({params}) {{\n{e.body()}\n}}"

    # -- one range of the batch -------------------------------------------------------------

    def range_function(self) -> str:
        """``@__memkernel_gurange_<name>(args, dims, steps, start, end, frame) -> i32``: 0, or a :class:`Status`."""
        e = self.e = _Emitter()
        layout = self.layout
        nargs = len(layout.args)
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        true = e.const(1, "i1")
        core_step = nargs
        operands: dict[int, dict[str, object]] = {}
        scratches: list[str] = []
        for p, a in enumerate(layout.args):
            info: dict[str, object] = {"outer": e.load("%steps", "i64", 8 * p)}
            operands[p] = info
            if a.scalar:
                continue
            rank = len(a.names)
            sizes = [e.load("%dims", "i64", 8 * d) if fixed is None else e.const(fixed)
                     for fixed, d in zip(a.fixed_sizes, a.dims)]  # a fixed size lets LLVM inline the zero-fill
            strides = [e.load("%steps", "i64", 8 * (core_step + d)) for d in range(rank)]
            core_step += rank
            one = e.const(1)
            contiguous = [one] * rank
            for d in range(rank - 2, -1, -1):
                at_least_one = e.value(f"llvm.intr.smax({sizes[d + 1]}, {one}) : (i64, i64) -> i64")
                contiguous[d] = e.value(f"llvm.mul {contiguous[d + 1]}, {at_least_one} : i64")
            itemsize = e.const(a.dtype.itemsize)
            fits = [true]
            for size, stride, want in zip(sizes, strides, contiguous):
                matches = e.icmp("eq", stride, e.value(f"llvm.mul {want}, {itemsize} : i64"))
                fits.append(e.value(f"llvm.or {matches}, {e.icmp('sle', size, one)} : i1"))
            direct = e.all_of(fits)
            total = itemsize
            for size in sizes:
                total = e.value(f"llvm.mul {total}, {size} : i64")
            info.update(sizes=sizes, strides=strides, contiguous=contiguous, direct=direct, bytes=total)
            allocate, done, failed = self.fresh("allocate"), self.fresh("allocated"), self.fresh("no_memory")
            if a.is_output:  # an output may need its buffer for any element: where it overlaps an input
                e.op(f"llvm.br ^{allocate}")
            else:
                e.op(f"llvm.cond_br {direct}, ^{done}({null} : !llvm.ptr), ^{allocate}")
            self.block(allocate)
            asked = e.value(f"llvm.intr.smax({total}, {one}) : (i64, i64) -> i64")
            made = e.value(f"llvm.call {self.slot(GuSlot.MALLOC)}({asked}) : !llvm.ptr, (i64) -> !llvm.ptr")
            e.op(f"llvm.cond_br {e.icmp('eq', made, null, '!llvm.ptr')}, ^{failed}, ^{done}({made} : !llvm.ptr)")
            self.block(failed)
            self.free(scratches)
            e.op(f"llvm.store {null}, {e.at('%frame', MESSAGE_OFFSET)} : !llvm.ptr, !llvm.ptr")
            e.op(f"llvm.store {asked}, {e.at('%frame', SIZE_OFFSET)} : i64, !llvm.ptr")
            self.stop(Status.NO_MEMORY)
            scratch = f"%scratch{p}"
            e.lines.append(f"^{done}({scratch}: !llvm.ptr):")
            scratches.append(scratch)
            info["scratch"] = scratch
        for p, a in enumerate(layout.args):
            if a.is_output:
                operands[p]["apart"] = self.range_apart(p, operands)
        e.op("llvm.br ^loop(%start : i64)")
        e.lines.append("^loop(%i: i64):")
        e.op(f"llvm.cond_br {e.icmp('slt', '%i', '%end')}, ^iteration, ^finished")
        self.block("iteration")
        values: list[str] = []
        for p, a in enumerate(layout.args):
            info = operands[p]
            data = e.load("%args", "!llvm.ptr", 8 * p)
            moved = e.value(f"llvm.mul %i, {info['outer']} : i64")
            base = e.value(f"llvm.getelementptr {data}[{moved}] : (!llvm.ptr, i64) -> !llvm.ptr, i8")
            info["base"] = base
            if a.scalar:
                values.append(self.scalar(a, base))
                continue
            if not a.is_output:
                info["skip"] = info["direct"]
                self.copy(a, info, gather=True)
            else:
                checked, done = self.fresh("overlap"), self.fresh("overlap_known")
                e.op(f"llvm.cond_br {info['apart']}, ^{done}({true} : i1), ^{checked}")
                self.block(checked)
                e.op(f"llvm.br ^{done}({self.apart(p, operands)} : i1)")
                e.lines.append(f"^{done}(%apart{p}: i1):")
                info["skip"] = e.value(f"llvm.and {info['direct']}, %apart{p} : i1")
            pointer = e.value(f"llvm.select {info['skip']}, {base}, {info['scratch']} : i1, !llvm.ptr")
            if a.is_output:
                zero = e.const(0, "i8")
                e.op(f'"llvm.intr.memset"({pointer}, {zero}, {info["bytes"]}) <{{isVolatile = false}}> : '
                     "(!llvm.ptr, i8, i64) -> ()")
            aligned = e.at(pointer, -a.layout_offset * a.dtype.itemsize) if a.layout_offset else pointer
            values += [pointer, aligned, e.const(a.layout_offset), *info["sizes"], *info["contiguous"]]  # type: ignore[misc]
        types = operand_types(layout)
        status = e.value(f"llvm.call @{runner_name(self.name)}(%frame, {null}, {', '.join(values)}) : "
                         f"({', '.join(['!llvm.ptr', '!llvm.ptr', *types])}) -> i32")
        e.op(f"llvm.cond_br {e.icmp('ne', status, e.const(0, 'i32'), 'i32')}, ^unwound, ^ran")
        self.block("ran")
        for p, a in enumerate(layout.args):
            if a.is_output:
                self.copy(a, operands[p], gather=False)
        e.op(f"llvm.br ^loop({e.value(f'llvm.add %i, {e.const(1)} : i64')} : i64)")
        self.block("unwound")
        self.free(scratches)
        self.stop(Status.UNWOUND)
        self.block("finished")
        self.free(scratches)
        e.op(f"llvm.return {e.const(0, 'i32')} : i32")
        params = "%args: !llvm.ptr, %dims: !llvm.ptr, %steps: !llvm.ptr, %start: i64, %end: i64, %frame: !llvm.ptr"
        copies = "\n".join(self.copy_function(a) for a in layout.args if not a.scalar)
        return f"llvm.func @{_range_name(self.name)}({params}) -> i32 {{\n{e.body()}\n}}\n{copies}"

    def extent(self, a: CoreArg, info: dict[str, object]) -> tuple[str, str]:
        """The bytes ``[lo, hi)`` operand ``a``'s core spans at this element (``lo == hi`` when it is empty)."""
        e = self.e
        zero, one = e.const(0), e.const(1)
        start = e.value(f"llvm.ptrtoint {info['base']} : !llvm.ptr to i64")
        low, high = start, e.value(f"llvm.add {start}, {e.const(a.dtype.itemsize)} : i64")
        empty = e.const(0, "i1")
        for size, stride in zip(info["sizes"], info["strides"]):  # type: ignore[call-overload]
            empty = e.value(f"llvm.or {empty}, {e.icmp('eq', size, zero)} : i1")
            last = e.value(f"llvm.mul {e.value(f'llvm.sub {size}, {one} : i64')}, {stride} : i64")
            low = e.value(f"llvm.add {low}, {e.value(f'llvm.intr.smin({last}, {zero}) : (i64, i64) -> i64')} : i64")
            high = e.value(f"llvm.add {high}, {e.value(f'llvm.intr.smax({last}, {zero}) : (i64, i64) -> i64')} : i64")
        return low, e.value(f"llvm.select {empty}, {low}, {high} : i1, i64")

    def range_apart(self, p: int, operands: dict[int, dict[str, object]]) -> str:
        """An i1: output ``p``'s cores over the whole range share no byte with any input's (then no element
        needs :meth:`apart`); false when the range is empty or the arithmetic could wrap."""
        e = self.e
        zero = e.const(0)
        count = e.value("llvm.sub %end, %start : i64")
        nonempty = e.icmp("sgt", count, zero)
        last = e.value(f"llvm.sub {count}, {e.const(1)} : i64")
        overflows: list[str] = []

        def spread(q: int) -> tuple[str, str]:
            a, info = self.layout.args[q], operands[q]
            data = e.load("%args", "!llvm.ptr", 8 * q)
            moved = e.exact("mul", "%start", str(info["outer"]), overflows)
            info["base"] = e.value(f"llvm.getelementptr {data}[{moved}] : (!llvm.ptr, i64) -> !llvm.ptr, i8")
            low, high = self.extent(a, info)
            reach = e.exact("mul", last, str(info["outer"]), overflows)
            low = e.exact("add", low, e.value(f"llvm.intr.smin({reach}, {zero}) : (i64, i64) -> i64"), overflows)
            high = e.exact("add", high, e.value(f"llvm.intr.smax({reach}, {zero}) : (i64, i64) -> i64"), overflows)
            return low, high

        lo, hi = spread(p)
        apart = nonempty
        for q, a in enumerate(self.layout.args):
            if a.is_output or a.scalar:
                continue
            other_lo, other_hi = spread(q)
            disjoint = e.value(f"llvm.or {e.icmp('ule', hi, other_lo)}, {e.icmp('ule', other_hi, lo)} : i1")
            apart = e.value(f"llvm.and {apart}, {disjoint} : i1")
        return e.value(f"llvm.and {apart}, {e.none_of(overflows)} : i1") if overflows else apart

    def apart(self, p: int, operands: dict[int, dict[str, object]]) -> str:
        """An i1: output ``p``'s core at this element shares no byte with any input's (numpy passes an ``out=``
        that is an input as it is; the kernel must not read what it has already written)."""
        e = self.e
        output = self.layout.args[p]
        lo, hi = self.extent(output, operands[p])
        apart = e.const(1, "i1")
        for q, a in enumerate(self.layout.args):
            if a.is_output or a.scalar:
                continue
            other_lo, other_hi = self.extent(a, operands[q])
            disjoint = e.value(f"llvm.or {e.icmp('ule', hi, other_lo)}, {e.icmp('ule', other_hi, lo)} : i1")
            apart = e.value(f"llvm.and {apart}, {disjoint} : i1")
        return apart

    def scalar(self, a: CoreArg, base: str) -> str:
        if a.llvm_type == "i1":
            byte = self.e.load(base, "i8")
            return self.e.icmp("ne", byte, self.e.const(0, "i8"), "i8")
        return self.e.load(base, a.llvm_type)

    def copy(self, a: CoreArg, info: dict[str, object], gather: bool) -> None:
        """Copy operand ``a``'s core into its contiguous buffer (``gather``) or back, when it has one."""
        e = self.e
        run, skip = self.fresh("copy"), self.fresh("copied")
        e.op(f"llvm.cond_br {info['skip']}, ^{skip}, ^{run}")
        self.block(run)
        sizes, strides = info["sizes"], info["strides"]
        arguments = [str(info["scratch"]), str(info["base"]), e.const(int(gather), "i1"), *sizes, *strides]  # type: ignore[misc]
        types = ["!llvm.ptr", "!llvm.ptr", "i1"] + ["i64"] * (2 * len(a.names))
        e.op(f"llvm.call @{_copy_name(self.name, a.index)}({', '.join(arguments)}) : ({', '.join(types)}) -> ()")
        e.op(f"llvm.br ^{skip}")
        self.block(skip)

    def free(self, scratches: list[str]) -> None:
        for scratch in scratches:
            self.e.op(f"llvm.call {self.slot(GuSlot.FREE)}({scratch}) : !llvm.ptr, (!llvm.ptr) -> ()")

    def stop(self, status: Status) -> None:
        e = self.e
        e.op(f"llvm.store {e.const(int(status))}, {e.at('%frame', STATUS_OFFSET)} : i64, !llvm.ptr")
        e.op(f"llvm.return {e.const(int(status), 'i32')} : i32")

    # -- raising, holding the GIL -------------------------------------------------------------

    def raise_function(self) -> str:
        """``@__memkernel_guraise_<name>(frame)``: the table's ``failed(frame)`` called under the GIL, which
        leaves the error set for numpy to raise."""
        e = self.e = _Emitter()
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        state = e.value(f"llvm.call {self.slot(GuSlot.GIL_ENSURE)}() : !llvm.ptr, () -> i32")
        address = e.value(f"llvm.call {self.slot(GuSlot.FROM_VOID_PTR)}(%frame) : !llvm.ptr, (!llvm.ptr) -> "
                          "!llvm.ptr")
        e.op(f"llvm.cond_br {e.icmp('eq', address, null, '!llvm.ptr')}, ^release, ^made")
        self.block("made")
        arguments = e.value(f"llvm.call {self.slot(GuSlot.TUPLE_NEW)}({e.const(1)}) : !llvm.ptr, (i64) -> !llvm.ptr")
        e.op(f"llvm.cond_br {e.icmp('eq', arguments, null, '!llvm.ptr')}, ^no_tuple, ^packed")
        self.block("no_tuple")
        e.op(f"llvm.call {self.slot(GuSlot.DECREF)}({address}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.op("llvm.br ^release")
        self.block("packed")
        e.value(f"llvm.call {self.slot(GuSlot.TUPLE_SET_ITEM)}({arguments}, {e.const(0)}, {address}) : "
                "!llvm.ptr, (!llvm.ptr, i64, !llvm.ptr) -> i32")  # steals the reference to the address
        raised = e.value(f"llvm.call {self.slot(GuSlot.CALL)}({self.slot(GuSlot.FAILED)}, {arguments}, {null}) : "
                         "!llvm.ptr, (!llvm.ptr, !llvm.ptr, !llvm.ptr) -> !llvm.ptr")
        e.op(f"llvm.call {self.slot(GuSlot.DECREF)}({arguments}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.op(f"llvm.call {self.slot(GuSlot.DECREF)}({raised}) : !llvm.ptr, (!llvm.ptr) -> ()")  # NULL: it raised
        e.op("llvm.br ^release")
        self.block("release")
        e.op(f"llvm.call {self.slot(GuSlot.GIL_RELEASE)}({state}) : !llvm.ptr, (i32) -> ()")
        e.op("llvm.return")
        return f"llvm.func @{_raise_name(self.name)}(%frame: !llvm.ptr) {{\n{e.body()}\n}}"

    # -- the loop numpy calls -----------------------------------------------------------------

    def serial_loop(self) -> str:
        e = self.e = _Emitter()
        frame = e.stack_bytes(FRAME_SIZE, 16)
        count = e.load("%dims", "i64")
        self.run_range(frame, e.const(0), count)
        e.op("llvm.return")
        return self._loop_function()

    def run_range(self, frame: str, start: str, end: str) -> None:
        e = self.e
        status = e.value(f"llvm.call @{_range_name(self.name)}(%args, %dims, %steps, {start}, {end}, {frame}) : "
                         "(!llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr) -> i32")
        stopped, ran = self.fresh("stopped"), self.fresh("ran")
        e.op(f"llvm.cond_br {e.icmp('ne', status, e.const(0, 'i32'), 'i32')}, ^{stopped}, ^{ran}")
        self.block(stopped)
        e.op(f"llvm.call @{_raise_name(self.name)}({frame}) : (!llvm.ptr) -> ()")
        e.op("llvm.return")
        self.block(ran)

    def _loop_function(self) -> str:
        params = "%args: !llvm.ptr, %dims: !llvm.ptr, %steps: !llvm.ptr, %data: !llvm.ptr"
        return f"llvm.func @{loop_name(self.name)}({params}) {{\n{self.e.body()}\n}}"

    def thread_function(self) -> str:
        """``@__memkernel_guthread_<name>(context) -> ptr``: one range of the batch, on a thread of its own."""
        e = self.e = _Emitter()
        fields = [e.load("%context", "!llvm.ptr", 8 * k) for k in range(3)]
        start, end = e.load("%context", "i64", 24), e.load("%context", "i64", 32)
        frame = e.at("%context", 64)
        e.value(f"llvm.call @{_range_name(self.name)}({', '.join(fields)}, {start}, {end}, {frame}) : "
                "(!llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, !llvm.ptr) -> i32")
        e.op(f"llvm.return {e.value('llvm.mlir.zero : !llvm.ptr')} : !llvm.ptr")
        return f"llvm.func @{_thread_name(self.name)}(%context: !llvm.ptr) -> !llvm.ptr {{\n{e.body()}\n}}"

    def parallel_loop(self) -> str:
        """Split the batch into one range per core (at least :data:`_MIN_CHUNK` elements each), run the first
        here and the others on threads it starts, join them, and raise the first range's failure in order."""
        e = self.e = _Emitter()
        null = e.value("llvm.mlir.zero : !llvm.ptr")
        count = e.load("%dims", "i64")
        by_size = e.value(f"llvm.sdiv {count}, {e.const(_MIN_CHUNK)} : i64")
        threads = e.value(f"llvm.intr.smin({self.slot(GuSlot.THREADS)}, {by_size}) : (i64, i64) -> i64")
        serial = e.icmp("sle", threads, e.const(1))
        e.op(f"llvm.cond_br {serial}, ^serial, ^split")
        self.block("serial")
        frame = e.stack_bytes(FRAME_SIZE, 16)
        self.run_range(frame, e.const(0), count)
        e.op("llvm.return")
        self.block("split")
        contexts = e.value(f"llvm.call {self.slot(GuSlot.MALLOC)}({e.value(f'llvm.mul {threads}, {e.const(_CONTEXT)} : i64')}) "
                           ": !llvm.ptr, (i64) -> !llvm.ptr")
        e.op(f"llvm.cond_br {e.icmp('eq', contexts, null, '!llvm.ptr')}, ^serial, ^start_threads")
        self.block("start_threads")
        share = e.value(f"llvm.sdiv {count}, {threads} : i64")
        extra = e.value(f"llvm.srem {count}, {threads} : i64")
        e.op(f"llvm.br ^fill({e.const(0)} : i64)")
        e.lines.append("^fill(%t: i64):")
        context = e.value(f"llvm.getelementptr {contexts}[%t] : (!llvm.ptr, i64) -> !llvm.ptr, !llvm.array<{_CONTEXT} x i8>")
        for k, field in enumerate(("%args", "%dims", "%steps")):
            e.op(f"llvm.store {field}, {e.at(context, 8 * k) if k else context} : !llvm.ptr, !llvm.ptr")
        start = e.value(f"llvm.add {e.value(f'llvm.mul %t, {share} : i64')}, "
                        f"{e.value(f'llvm.intr.smin(%t, {extra}) : (i64, i64) -> i64')} : i64")
        last = e.icmp("slt", "%t", extra)
        length = e.value(f"llvm.add {share}, {e.value(f'llvm.zext {last} : i1 to i64')} : i64")
        e.op(f"llvm.store {start}, {e.at(context, 24)} : i64, !llvm.ptr")
        e.op(f"llvm.store {e.value(f'llvm.add {start}, {length} : i64')}, {e.at(context, 32)} : i64, !llvm.ptr")
        e.op(f"llvm.store {e.const(0)}, {e.at(context, 40)} : i64, !llvm.ptr")
        e.op(f"llvm.store {e.const(0)}, {e.at(context, 64 + STATUS_OFFSET)} : i64, !llvm.ptr")
        worker = e.value(f"llvm.mlir.addressof @{_thread_name(self.name)} : !llvm.ptr")
        first = e.icmp("eq", "%t", e.const(0))
        e.op(f"llvm.cond_br {first}, ^filled, ^create")
        self.block("create")
        created = e.value(f"llvm.call {self.slot(GuSlot.THREAD_CREATE)}({e.at(context, 48)}, {null}, {worker}, "
                          f"{context}) : !llvm.ptr, (!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> i32")
        started = e.icmp("eq", created, e.const(0, "i32"), "i32")
        e.op(f"llvm.store {e.value(f'llvm.zext {started} : i1 to i64')}, {e.at(context, 40)} : i64, !llvm.ptr")
        e.op(f"llvm.cond_br {started}, ^filled, ^inline")
        self.block("inline")  # no thread to be had: this range runs here
        e.value(f"llvm.call @{_thread_name(self.name)}({context}) : (!llvm.ptr) -> !llvm.ptr")
        e.op("llvm.br ^filled")
        self.block("filled")
        following = e.value(f"llvm.add %t, {e.const(1)} : i64")
        e.op(f"llvm.cond_br {e.icmp('slt', following, threads)}, ^fill({following} : i64), ^own")
        self.block("own")
        e.value(f"llvm.call @{_thread_name(self.name)}({contexts}) : (!llvm.ptr) -> !llvm.ptr")
        e.op(f"llvm.br ^join({e.const(1)} : i64)")
        e.lines.append("^join(%j: i64):")
        e.op(f"llvm.cond_br {e.icmp('slt', '%j', threads)}, ^joining, ^check({e.const(0)} : i64)")
        self.block("joining")
        joined = e.value(f"llvm.getelementptr {contexts}[%j] : (!llvm.ptr, i64) -> !llvm.ptr, !llvm.array<{_CONTEXT} x i8>")
        flag = e.load(joined, "i64", 40)
        e.op(f"llvm.cond_br {e.icmp('ne', flag, e.const(0))}, ^wait, ^joined")
        self.block("wait")
        handle = e.load(joined, "i64", 48)
        e.value(f"llvm.call {self.slot(GuSlot.THREAD_JOIN)}({handle}, {null}) : !llvm.ptr, (i64, !llvm.ptr) -> i32")
        e.op("llvm.br ^joined")
        self.block("joined")
        e.op(f"llvm.br ^join({e.value(f'llvm.add %j, {e.const(1)} : i64')} : i64)")
        e.lines.append("^check(%c: i64):")
        e.op(f"llvm.cond_br {e.icmp('slt', '%c', threads)}, ^checking, ^done")
        self.block("checking")
        checked = e.value(f"llvm.getelementptr {contexts}[%c] : (!llvm.ptr, i64) -> !llvm.ptr, !llvm.array<{_CONTEXT} x i8>")
        frame = e.at(checked, 64)
        status = e.load(frame, "i64", STATUS_OFFSET)
        e.op(f"llvm.cond_br {e.icmp('ne', status, e.const(0))}, ^failed, ^fine")
        self.block("failed")
        e.op(f"llvm.call @{_raise_name(self.name)}({frame}) : (!llvm.ptr) -> ()")
        e.op("llvm.br ^done")
        self.block("fine")
        e.op(f"llvm.br ^check({e.value(f'llvm.add %c, {e.const(1)} : i64')} : i64)")
        self.block("done")
        e.op(f"llvm.call {self.slot(GuSlot.FREE)}({contexts}) : !llvm.ptr, (!llvm.ptr) -> ()")
        e.op("llvm.return")
        return self._loop_function() + "\n" + self.thread_function()


def _bytes(a: CoreArg) -> str:
    return f"!llvm.array<{a.dtype.itemsize} x i8>"


def _copy_name(kernel: str, index: int) -> str:
    return f"__memkernel_gucopy_{kernel}_{index}"


def _range_name(kernel: str) -> str:
    return f"__memkernel_gurange_{kernel}"


def _raise_name(kernel: str) -> str:
    return f"__memkernel_guraise_{kernel}"


def _thread_name(kernel: str) -> str:
    return f"__memkernel_guthread_{kernel}"


def loop_text(layout: GufuncLayout, parallel: bool) -> str:
    """The loop's functions, the kernel's declaration and the constants table, in the LLVM dialect."""
    loop = _Loop(layout)
    functions = [loop.range_function(), loop.raise_function(),
                 loop.parallel_loop() if parallel else loop.serial_loop()]
    declaration = f"llvm.func @{layout.kernel}({', '.join(operand_types(layout))})"
    return f"""
llvm.mlir.global external @{consts_name(layout.kernel)}(dense<0> : tensor<{len(GuSlot)}xi64>) : !llvm.array<{len(GuSlot)} x i64>
{declaration}
{chr(10).join(functions)}
"""
