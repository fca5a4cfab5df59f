"""A heap allocation of the kernel's that fails returns to the guard instead of handing the kernel NULL.

``memref.alloc`` (the source's own, or one bufferization made) lowers to a
call of ``malloc`` (``aligned_alloc`` with ``use-aligned-alloc``), and the
kernel uses what it returns unchecked: a size no memory can hold (2**63 bytes)
gave NULL, and the first store through it killed the process (SIGSEGV).
:func:`contain` calls ``__memkernel_malloc`` and ``__memkernel_aligned_alloc``
instead, which return what the C function returned unless it is NULL for a
size that is not 0; then they unwind to the guard the call path runs the
kernel through (see :mod:`memkernel.compile.guard`), and the call raises an
AllocationError naming the kernel and the size.

The lowering computes an allocation's size in bytes with 64-bit products that
wrap: ``2**62 + 1`` floats asked ``malloc`` for 4 bytes, which it gave, and the
kernel wrote past them (SIGSEGV, or a corrupted heap). So before the lowering,
:func:`check_sizes` computes each ``memref.alloc``'s size in bytes
with overflow checks and passes the verdict to ``__memkernel_check_allocation``:
a size of 2**63 bytes or more (a product that overflows, a negative dim), its
``alignment`` (which the lowering adds to what it asks ``malloc`` for)
included, unwinds to the guard too, reported as size 0.
"""

from __future__ import annotations

import re

from mlir import ir
from mlir.dialects import arith, func

from ..analysis.ir_callbacks import walk

_UNGUARDED = b"memkernel: a memref.alloc of the kernel failed, on a thread with no guard to return to\0"
_UNSTOPPABLE = (b"memkernel: a memref.alloc of a kernel on the async runtime (parallel=True) asked for 2**63 bytes or "
                b"more; its worker threads cannot be stopped\0")
_TEXT = "__memkernel_allocation_failed_text"

_CALL = {
    "malloc": re.compile(r"llvm\.call @malloc\((%[\w.#]+)\) : \(i64\) -> !llvm\.ptr"),
    "aligned_alloc": re.compile(r"llvm\.call @aligned_alloc\((%[\w.#]+), (%[\w.#]+)\) : \(i64, i64\) -> !llvm\.ptr"),
}
_WRAPPED = {
    "malloc": (r"llvm.call @__memkernel_malloc(\1) : (i64) -> !llvm.ptr", ["%size"]),
    "aligned_alloc": (r"llvm.call @__memkernel_aligned_alloc(\1, \2) : (i64, i64) -> !llvm.ptr",
                      ["%alignment", "%size"]),
}


def _wrapper(function: str, params: list[str]) -> str:
    """``__memkernel_<function>``: the C function's pointer, or an unwinding to the guard if it is NULL."""
    declared = ", ".join(f"{p}: i64" for p in params)
    types = ", ".join("i64" for _ in params)
    return f"""
llvm.func @__memkernel_{function}({declared}) -> !llvm.ptr {{
  %p = llvm.call @{function}({', '.join(params)}) : ({types}) -> !llvm.ptr
  %null = llvm.mlir.zero : !llvm.ptr
  %is_null = llvm.icmp "eq" %p, %null : !llvm.ptr
  %zero = llvm.mlir.constant(0 : i64) : i64
  %asked = llvm.icmp "ne" %size, %zero : i64
  %failed = llvm.and %is_null, %asked : i1
  llvm.cond_br %failed, ^failed, ^done
^done:
  llvm.return %p : !llvm.ptr
^failed:
  %text = llvm.mlir.addressof @{_TEXT} : !llvm.ptr
  llvm.call @__memkernel_unwind(%null, %size, %text) : (!llvm.ptr, i64, !llvm.ptr) -> ()
  llvm.unreachable
}}
"""


CHECK = "__memkernel_check_allocation"

_CHECK_DECLARATION = re.compile(rf"^ *llvm\.func @{CHECK}\(i1\)[^\n]*\n", re.MULTILINE)
"""The declaration :func:`check_sizes` made, as lowered: the definition takes its place."""
_UNWIND = "llvm.call @__memkernel_unwind(%null, %none, %text) : (!llvm.ptr, i64, !llvm.ptr) -> ()"
_CHECKER = f"""
llvm.func @{CHECK}(%too_big: i1) {{
  llvm.cond_br %too_big, ^failed, ^done
^done:
  llvm.return
^failed:
  %null = llvm.mlir.zero : !llvm.ptr
  %none = llvm.mlir.constant(0 : i64) : i64
  %text = llvm.mlir.addressof @{_TEXT} : !llvm.ptr
  {_UNWIND}
  llvm.unreachable
}}
"""


def _element_bytes(element: ir.Type) -> int | None:
    """Bytes of one element in memory (an ``i1`` takes one), or None for a type this check leaves alone."""
    if isinstance(element, ir.ComplexType):
        part = _element_bytes(element.element_type)
        return None if part is None else 2 * part
    if isinstance(element, ir.IndexType):
        return 8
    if isinstance(element, (ir.IntegerType, ir.FloatType)):
        return max(1, (element.width + 7) // 8)
    return None


_LARGEST_SIZE = 2**63 - 1


def _alignment(alloc: ir.OpView) -> int:
    """The ``alignment`` an alloc asks for (its lowering adds it to the size given to ``malloc``), else 0."""
    if "alignment" not in alloc.attributes:
        return 0
    return ir.IntegerAttr(alloc.attributes["alignment"]).value


def _check_size(alloc: ir.OpView) -> bool:
    """Insert before ``alloc`` the call of :data:`CHECK` with whether its size is 2**63 bytes or more."""
    memref_type = ir.MemRefType(alloc.result.type)
    size = _element_bytes(memref_type.element_type)
    if size is None:
        return False
    index, i1 = ir.IndexType.get(), ir.IntegerType.get_signless(1)
    with ir.InsertionPoint(alloc), alloc.location:
        zero = arith.ConstantOp(index, 0).result
        total = arith.ConstantOp(index, size).result
        too_big = arith.ConstantOp(i1, 0).result
        dynamic = iter(alloc.dynamicSizes)
        for dim in memref_type.shape:
            extent = next(dynamic) if ir.ShapedType.is_dynamic_size(dim) else arith.ConstantOp(index, dim).result
            product = arith.MulUIExtendedOp(total, extent)
            total = product.low
            too_big = arith.OrIOp(too_big, arith.CmpIOp(arith.CmpIPredicate.ne, product.high, zero).result).result
        # the lowering asks malloc for the size plus the alignment: that sum must stay below 2**63 too
        largest = arith.ConstantOp(index, _LARGEST_SIZE - _alignment(alloc)).result
        past = arith.CmpIOp(arith.CmpIPredicate.ugt, total, largest).result
        func.CallOp([], ir.FlatSymbolRefAttr.get(CHECK), [arith.OrIOp(too_big, past).result])
    return True


def check_sizes(module: ir.Module) -> None:
    """Before each ``memref.alloc``, call :data:`CHECK` with whether its size in bytes is 2**63 or more, in
    place (see the module's docstring; LLVM folds the check of a static size); declares :data:`CHECK` if it
    calls it."""
    allocs: list[ir.OpView] = []
    walk(module.operation, lambda op: allocs.append(op.opview) if op.name == "memref.alloc" else None)
    with module.context, ir.Location.unknown():
        checked = [alloc for alloc in allocs if _check_size(alloc)]
        if checked:
            with ir.InsertionPoint.at_block_begin(module.body):
                declaration = func.FuncOp(CHECK, ir.FunctionType.get([ir.IntegerType.get_signless(1)], []))
            declaration.attributes["sym_visibility"] = ir.StringAttr.get("private")


def contain(text: str, unwinding: bool = True) -> tuple[str, str]:
    """The lowered module's ``text`` with its ``malloc`` and ``aligned_alloc`` calls made through the
    wrappers, and the functions that needs (to add to the module); ``(text, "")`` if it allocates nothing.

    Not ``unwinding`` (a module on the async runtime, see :mod:`memkernel.compile.guard`), its allocations
    stay as they were, and a size :func:`check_sizes` finds too big prints a message and aborts.
    """
    support = ""
    text, declared = _CHECK_DECLARATION.subn("", text)
    if declared:
        support += _CHECKER if unwinding else _CHECKER.replace(_UNWIND, "llvm.call @puts(%text) : (!llvm.ptr) -> ()\n"
                                                                        "  llvm.call @abort() : () -> ()")
    for function, call in _CALL.items() if unwinding else ():
        replacement, params = _WRAPPED[function]
        text, count = call.subn(replacement, text)
        if count:
            support += _wrapper(function, params)
    if not support:
        return text, ""
    return text, _text_global(_UNGUARDED if unwinding else _UNSTOPPABLE) + support


def _text_global(text: bytes) -> str:
    """The global :data:`_TEXT` holding ``text`` (NUL-terminated), as LLVM-dialect text."""
    characters = "".join(chr(b) if 32 <= b < 127 and chr(b) not in '"\\' else f"\\{b:02X}" for b in text)
    return (f'llvm.mlir.global private constant @{_TEXT}("{characters}") {{addr_space = 0 : i32}} '
            f": !llvm.array<{len(text)} x i8>\n")
