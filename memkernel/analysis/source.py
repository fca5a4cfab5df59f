"""Parsing the MLIR source and finding the kernel function in it.

Every kernel's modules live in one MLIR context per process: creating a
context registers every dialect (~6 ms), which a notebook re-running its cells
would otherwise pay per decoration. ``MLIR_LOCK`` serializes the work done on
that context (parsing, analysis, lowering, JIT); kernel calls never take it.

The context runs single-threaded. With MLIR's threads on, the verifier checks
nested modules' functions on worker threads, and the bindings record a failed
check's diagnostic there, without the GIL: a source with errors in a nested
module aborted the process ("Critical nanobind error: incref_check ... GIL was
not held") in most of its parses. Single-threaded, parsing 2000 functions took
the same 85 ms on the 2-core machine it was measured on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from mlir import ir

from .diagnostics import format_diagnostics, function_list
from ..errors import MLIRSyntaxError, OptionError, SignatureError
from .ir_callbacks import install_attribute_casters
from .resources import check_resources
from .. import forking


@dataclass
class ParsedSource:
    """A parsed, verified module with the context that owns it."""

    text: str
    context: ir.Context
    module: ir.Module

    def functions(self) -> list[ir.Operation]:
        return [op for op in self.module.body.operations if op.operation.name == "func.func"]

    def defined_names(self) -> list[str]:
        """Names of the functions that have a body."""
        return [ir.StringAttr(f.attributes["sym_name"]).value for f in self.functions()
                if len(f.regions[0].blocks) > 0]

    def function(self, name: str) -> ir.Operation:
        """The ``func.func @name`` (or ``llvm.func @name``) with a body; SignatureError listing the others if absent."""
        defined = []
        for func in self.module.body.operations:
            if func.operation.name not in _CALLABLE:
                continue
            func_name = ir.StringAttr(func.attributes["sym_name"]).value
            has_body = len(func.regions[0].blocks) > 0
            if func_name == name and has_body:
                return func.operation
            if has_body:
                defined.append(func_name)
        raise SignatureError(
            f"no func.func @{name} with a body in the MLIR source; functions defined: {function_list(defined)}. "
            "Pass name= to pick one."
        )


_CALLABLE = ("func.func", "llvm.func")
"""The functions a kernel may be: a ``func.func``, or an ``llvm.func`` on scalars (see
:func:`memkernel.analysis.types.read_signature`)."""


MLIR_LOCK = forking.rlock()


@functools.lru_cache(maxsize=None)
def shared_context() -> ir.Context:
    """The process's MLIR context for kernel modules, single-threaded (see the module's docstring)."""
    context = ir.Context()
    context.enable_multithreading(False)
    with context:
        install_attribute_casters()
    return context


def parse_source(text: str) -> ParsedSource:
    """Parse and verify ``text`` into a new module; MLIRSyntaxError on failure."""
    if not isinstance(text, str):
        raise OptionError(f"mlir_kernel(): the MLIR source must be a str, got {type(text).__name__}")
    _check_encodable(text)
    context = shared_context()
    with MLIR_LOCK, context, ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise MLIRSyntaxError(
                "the MLIR source does not parse or verify:\n"
                + format_diagnostics(exc.error_diagnostics, text)
            ) from None
        check_resources(module, text)
    return ParsedSource(text, context, module)


def _check_encodable(text: str) -> None:
    """MLIRSyntaxError naming the line and column of a character UTF-8 cannot encode (a lone surrogate),
    which MLIR, reading UTF-8, could not be given."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        line = text.count("\n", 0, error.start) + 1
        column = error.start - (text.rfind("\n", 0, error.start) + 1) + 1
        raise MLIRSyntaxError(
            f"the MLIR source is not valid text: {line}:{column}: character U+{ord(text[error.start]):04X} "
            "(a lone surrogate) cannot be encoded as UTF-8. Remove it, or decode the file the source came "
            "from with errors='strict' to find the bad bytes."
        ) from None
