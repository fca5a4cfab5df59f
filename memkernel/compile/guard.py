"""The guard: a kernel that fails a ``cf.assert`` or a heap allocation returns to its caller, which raises.

MLIR lowers a failed ``cf.assert`` to ``puts(msg); abort()``, and a
``memref.alloc`` to a ``malloc`` whose NULL the kernel then writes through
(SIGSEGV): either kills the Python process that called the kernel. After the
lowering to the LLVM dialect, :func:`contain` rewrites both (see
:mod:`memkernel.compile.assertions` and :mod:`memkernel.compile.allocations`)
into a call to ``__memkernel_unwind(message, size, text)``, and gives the
module a guard through which the kernel is called:

``__memkernel_guarded(frame, entry, args)`` records ``frame`` (a jmp_buf and
the failure's slots, memory the caller owns) for the calling thread under a
pthread key, ``setjmp``\\ s into it and calls the packed wrapper
``entry(args)``. ``__memkernel_unwind`` stores the failed assertion's message
(or NULL and the bytes a failed allocation asked for) in the frame and
``longjmp``\\ s back: the guard returns 1, and
:func:`memkernel.load.guard.failure_error` says what to raise. The kernel never runs on past the failure. Memory it allocated
before is not freed.

The fast path calls the kernel through ``__memkernel_run_<name>(frame,
results, operands...)`` (see :func:`runner`), the same guard for its unpacked
operands; in a module with nothing to guard, that is a plain call.

A failure on a thread with no guard in place (the async runtime's workers of
``parallel=True``) has nowhere to return to: it prints ``text`` and aborts.
A module that runs on the async runtime keeps its allocations as they were,
and a size too big for any allocation aborts there too: unwinding its calling
thread while workers run on would leave them working on memory the caller frees.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mlir import ir

from ..fastpath.symbols import runner_name
from ..load.guard import GUARD, KEY, MESSAGE_OFFSET, SIZE_OFFSET
from . import allocations, assertions

_SUPPORT = f"""
llvm.func @pthread_getspecific(i32) -> !llvm.ptr
llvm.func @pthread_setspecific(i32, !llvm.ptr) -> i32
llvm.func @longjmp(!llvm.ptr, i32) attributes {{passthrough = ["noreturn"]}}
llvm.func @_setjmp(!llvm.ptr) -> i32 attributes {{passthrough = ["returns_twice"]}}
llvm.mlir.global external @{KEY}(0 : i32) : i32

llvm.func @__memkernel_unwind(%msg: !llvm.ptr, %size: i64, %unguarded_msg: !llvm.ptr) {{
  %key_at = llvm.mlir.addressof @{KEY} : !llvm.ptr
  %key = llvm.load %key_at : !llvm.ptr -> i32
  %frame = llvm.call @pthread_getspecific(%key) : (i32) -> !llvm.ptr
  %null = llvm.mlir.zero : !llvm.ptr
  %unguarded = llvm.icmp "eq" %frame, %null : !llvm.ptr
  llvm.cond_br %unguarded, ^abort, ^jump
^abort:
  llvm.call @puts(%unguarded_msg) : (!llvm.ptr) -> ()
  llvm.call @abort() : () -> ()
  llvm.unreachable
^jump:
  %message_slot = llvm.getelementptr %frame[{MESSAGE_OFFSET}] : (!llvm.ptr) -> !llvm.ptr, i8
  llvm.store %msg, %message_slot : !llvm.ptr, !llvm.ptr
  %size_slot = llvm.getelementptr %frame[{SIZE_OFFSET}] : (!llvm.ptr) -> !llvm.ptr, i8
  llvm.store %size, %size_slot : i64, !llvm.ptr
  %one = llvm.mlir.constant(1 : i32) : i32
  llvm.call @longjmp(%frame, %one) : (!llvm.ptr, i32) -> ()
  llvm.unreachable
}}
"""


_RUNNER_DECLARATIONS = f"""
llvm.func @pthread_getspecific(i32) -> !llvm.ptr
llvm.func @pthread_setspecific(i32, !llvm.ptr) -> i32
llvm.func @_setjmp(!llvm.ptr) -> i32 attributes {{passthrough = ["returns_twice"]}}
llvm.mlir.global external @{KEY}() {{addr_space = 0 : i32}} : i32
"""
"""What a guarded runner refers to, declared beside it: the guarded module defines them."""


def _guarded_body(call: Sequence[str]) -> str:
    """A function body that runs ``call`` (lines using ``%frame``) under the guard: 0 if it returned, 1 if it
    unwound."""
    lines = "\n".join(f"  {line}" for line in call)
    return f"""  %key_at = llvm.mlir.addressof @{KEY} : !llvm.ptr
  %key = llvm.load %key_at : !llvm.ptr -> i32
  %outer = llvm.call @pthread_getspecific(%key) : (i32) -> !llvm.ptr
  %set = llvm.call @pthread_setspecific(%key, %frame) : (i32, !llvm.ptr) -> i32
  %jumped = llvm.call @_setjmp(%frame) : (!llvm.ptr) -> i32
  %zero = llvm.mlir.constant(0 : i32) : i32
  %first = llvm.icmp "eq" %jumped, %zero : i32
  llvm.cond_br %first, ^run, ^failed
^run:
{lines}
  %restored = llvm.call @pthread_setspecific(%key, %outer) : (i32, !llvm.ptr) -> i32
  llvm.return %zero : i32
^failed:
  %again = llvm.call @pthread_setspecific(%key, %outer) : (i32, !llvm.ptr) -> i32
  %one = llvm.mlir.constant(1 : i32) : i32
  llvm.return %one : i32"""


def runner(name: str, operand_types: Sequence[str], result_type: str | None, guarded: bool) -> str:
    """``llvm.func @__memkernel_run_<name>(frame, results, operands...) -> i32``: the fast path's call of
    the lowered kernel ``@name``, storing its result (if ``result_type``) at ``results``; under the guard
    when ``guarded`` (1 if the kernel unwound), else a plain call that returns 0."""
    params = ", ".join(["%frame: !llvm.ptr", "%results: !llvm.ptr",
                        *(f"%a{i}: {t}" for i, t in enumerate(operand_types))])
    args = ", ".join(f"%a{i}" for i in range(len(operand_types)))
    signature = f"({', '.join(operand_types)}) -> {result_type or '()'}"
    call = [f"%r = llvm.call @{name}({args}) : {signature}" if result_type else f"llvm.call @{name}({args}) : "
            f"{signature}"]
    if result_type:
        call.append(f"llvm.store %r, %results : {result_type}, !llvm.ptr")
    if guarded:
        body = _guarded_body(call)
    else:
        body = "\n".join(f"  {line}" for line in call) + "\n  %zero = llvm.mlir.constant(0 : i32) : i32\n" \
               "  llvm.return %zero : i32"
    return (_RUNNER_DECLARATIONS if guarded else "") + f"llvm.func @{runner_name(name)}({params}) -> i32 {{\n{body}\n}}\n"



def contain(module: ir.Module) -> ir.Module | None:
    """The lowered ``module`` with its failed assertions and allocations returning to the guard; None if it
    has neither."""
    text, asserts = assertions.contain(str(module))
    text, allocs = allocations.contain(text, unwinding="@mlirAsyncRuntime" not in text)  # see the docstring
    if not asserts and not allocs:
        return None
    declarations = "".join(f"\n  {d}" for d in ("llvm.func @puts(!llvm.ptr)", "llvm.func @abort()")
                           if d.split("(")[0] not in text)
    guard = (f"llvm.func @{GUARD}(%frame: !llvm.ptr, %entry: !llvm.ptr, %args: !llvm.ptr) -> i32 {{\n"
             + _guarded_body(["llvm.call %entry(%args) : !llvm.ptr, (!llvm.ptr) -> ()"]) + "\n}\n")
    resources = re.search(r"^\{-#", text, re.MULTILINE)  # the blobs the module's dense_resource constants hold
    body, tail = (text[:resources.start()], text[resources.start():]) if resources else (text, "")
    closing = body.rstrip().rfind("}")
    return ir.Module.parse(body[:closing] + declarations + _SUPPORT + guard + asserts + allocs + "\n}\n" + tail,
                           module.context)
