"""A failed ``cf.assert`` returns to the guard instead of killing the process.

MLIR lowers ``cf.assert %ok, "msg"`` to ``puts(msg); abort()``: a user's own
assertion, or one that ``generate-runtime-verification`` inserted
(``checked=True``), kills the Python process that called the kernel. After the
lowering to the LLVM dialect, :func:`contain` turns each such pair into a call
to ``__memkernel_assert_failed(msg)``, which unwinds to the guard the call path
runs the kernel through (see :mod:`memkernel.compile.guard`); the call raises
a KernelAssertionError.

Before lowering, :func:`annotate` appends each ``cf.assert``'s source location to
its message, so the error can show the line.
"""

from __future__ import annotations

import re

from mlir import ir

from ..load.guard import LOCATION
from ..analysis.ir_callbacks import walk

_PUTS_ABORT = re.compile(
    r"llvm\.call @puts\((%[\w.]+)\) : \(!llvm\.ptr\) -> \(\)\n(\s*)llvm\.call @abort\(\) : \(\) -> \(\)"
)

_SUPPORT = """
llvm.func @__memkernel_assert_failed(%msg: !llvm.ptr) {
  %none = llvm.mlir.constant(0 : i64) : i64
  llvm.call @__memkernel_unwind(%msg, %none, %msg) : (!llvm.ptr, i64, !llvm.ptr) -> ()
  llvm.unreachable
}
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


def contain(text: str) -> tuple[str, str]:
    """The lowered module's ``text`` with each failed assertion unwinding to the guard, and the functions
    that needs (to add to the module); ``(text, "")`` if it has no assertion."""
    rewritten, count = _PUTS_ABORT.subn(r"llvm.call @__memkernel_assert_failed(\1) : (!llvm.ptr) -> ()", text)
    return rewritten, _SUPPORT if count else ""

