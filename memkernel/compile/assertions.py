"""A failed ``cf.assert`` becomes a Python exception instead of killing the process.

MLIR lowers ``cf.assert %ok, "msg"`` to ``puts(msg); abort()``: a user's own
assertion, or one that ``generate-runtime-verification`` inserted
(``checked=True``), kills the Python process that called the kernel. Here,
after the lowering to the LLVM dialect, each such pair becomes a call to
``__memkernel_assert_failed(msg)``, and the module gains a guard through which
the call path runs the kernel:

``__memkernel_guarded(frame, entry, args)`` records ``frame`` (a jmp_buf and a
message slot the caller owns) for the calling thread under a pthread key,
``setjmp``\\ s into it and calls the packed wrapper ``entry(args)``. A failed
assertion stores its message in the frame and ``longjmp``\\ s back: the guard
returns 1 and the caller raises. The kernel never runs on past a failed check.
Memory the kernel allocated before the failure is not freed.

An assertion that fails on a thread with no guard in place (the async
runtime's workers of ``parallel=True``) has nowhere to return to: it prints its
message and aborts, as before.

Before lowering, :func:`annotate` appends each ``cf.assert``'s source location to
its message, so the error can show the line.
"""

from __future__ import annotations

import re

from mlir import ir

from ..load.guard import GUARD, KEY, LOCATION, MESSAGE_OFFSET
from ..analysis.ir_callbacks import walk


_PUTS_ABORT = re.compile(
    r"llvm\.call @puts\((%[\w.]+)\) : \(!llvm\.ptr\) -> \(\)\n(\s*)llvm\.call @abort\(\) : \(\) -> \(\)"
)

_SUPPORT = f"""
llvm.func @pthread_getspecific(i32) -> !llvm.ptr
llvm.func @pthread_setspecific(i32, !llvm.ptr) -> i32
llvm.func @longjmp(!llvm.ptr, i32) attributes {{passthrough = ["noreturn"]}}
llvm.func @_setjmp(!llvm.ptr) -> i32 attributes {{passthrough = ["returns_twice"]}}
llvm.mlir.global external @{KEY}(0 : i32) : i32

llvm.func @__memkernel_assert_failed(%msg: !llvm.ptr) {{
  %key_at = llvm.mlir.addressof @{KEY} : !llvm.ptr
  %key = llvm.load %key_at : !llvm.ptr -> i32
  %frame = llvm.call @pthread_getspecific(%key) : (i32) -> !llvm.ptr
  %null = llvm.mlir.zero : !llvm.ptr
  %unguarded = llvm.icmp "eq" %frame, %null : !llvm.ptr
  llvm.cond_br %unguarded, ^abort, ^jump
^abort:
  llvm.call @puts(%msg) : (!llvm.ptr) -> ()
  llvm.call @abort() : () -> ()
  llvm.unreachable
^jump:
  %slot = llvm.getelementptr %frame[{MESSAGE_OFFSET}] : (!llvm.ptr) -> !llvm.ptr, i8
  llvm.store %msg, %slot : !llvm.ptr, !llvm.ptr
  %one = llvm.mlir.constant(1 : i32) : i32
  llvm.call @longjmp(%frame, %one) : (!llvm.ptr, i32) -> ()
  llvm.unreachable
}}

llvm.func @{GUARD}(%frame: !llvm.ptr, %entry: !llvm.ptr, %args: !llvm.ptr) -> i32 {{
  %key_at = llvm.mlir.addressof @{KEY} : !llvm.ptr
  %key = llvm.load %key_at : !llvm.ptr -> i32
  %outer = llvm.call @pthread_getspecific(%key) : (i32) -> !llvm.ptr
  %set = llvm.call @pthread_setspecific(%key, %frame) : (i32, !llvm.ptr) -> i32
  %jumped = llvm.call @_setjmp(%frame) : (!llvm.ptr) -> i32
  %zero = llvm.mlir.constant(0 : i32) : i32
  %first = llvm.icmp "eq" %jumped, %zero : i32
  llvm.cond_br %first, ^run, ^failed
^run:
  llvm.call %entry(%args) : !llvm.ptr, (!llvm.ptr) -> ()
  %restored = llvm.call @pthread_setspecific(%key, %outer) : (i32, !llvm.ptr) -> i32
  llvm.return %zero : i32
^failed:
  %again = llvm.call @pthread_setspecific(%key, %outer) : (i32, !llvm.ptr) -> i32
  %one = llvm.mlir.constant(1 : i32) : i32
  llvm.return %one : i32
}}
"""


def located(message: str, location: ir.Location) -> str:
    """``message`` followed by the source line and column of ``location``, where it has them."""
    where = LOCATION.search(str(location))
    if where is None or "Location:" in message:
        return message
    return f"{message}\nLocation: line {where[1]}, column {where[2]}"


def annotate(module: ir.Module) -> None:
    """Append each ``cf.assert``'s source location to its message (unless it names one already)."""

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "cf.assert":
            message = ir.StringAttr(op.attributes["msg"]).value
            op.attributes["msg"] = ir.StringAttr.get(located(message, op.location))
        return ir.WalkResult.ADVANCE

    walk(module.operation, visit)


def contain(module: ir.Module) -> ir.Module | None:
    """The lowered ``module`` with its failed assertions returning to the guard; None if it has none."""
    text = str(module)
    rewritten, count = _PUTS_ABORT.subn(r"llvm.call @__memkernel_assert_failed(\1) : (!llvm.ptr) -> ()", text)
    if not count:
        return None
    declarations = "".join(f"\n  {d}" for d in ("llvm.func @puts(!llvm.ptr)", "llvm.func @abort()")
                           if d.split("(")[0] not in rewritten)
    support = declarations + _SUPPORT
    closing = rewritten.rstrip().rfind("}")
    return ir.Module.parse(rewritten[:closing] + support + "\n}\n", module.context)
