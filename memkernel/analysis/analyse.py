"""Reading a kernel's IR at decoration into a :class:`~memkernel.model.kernel_spec.KernelIR`: its signature,
which memref arguments it may write (:mod:`memkernel.analysis.writes`), which dims of its arguments must
agree (:mod:`memkernel.analysis.shapes`), whether it runs on the async runtime (:mod:`memkernel.analysis.lowerings`)."""

from __future__ import annotations

from collections.abc import Sequence


from ..errors import SignatureError
from ..model.kernel_spec import KernelIR, output_names
from ..model.shapes import ShapeRules
from ..model.signature import ScalarSpec
from .diagnostics import function_list
from .foreign import foreign_symbols
from .lowerings import needs
from .shapes import ir_rules
from .source import MLIR_LOCK, ParsedSource
from .types import read_signature
from .writes import freed_arguments, written_arguments


def kernel_name(parsed: ParsedSource, requested: str | None) -> str:
    """``requested``; None (a lambda's kernel) picks the source's only function."""
    if requested is not None:
        return requested
    with MLIR_LOCK, parsed.context:
        defined = parsed.defined_names()
    if len(defined) != 1:
        raise SignatureError(f"a lambda has no name to pick a function by (defined: {function_list(defined)}); "
                             "pass name=.")
    return defined[0]


def analyse(parsed: ParsedSource, name: str, parameters: Sequence[str] = ()) -> KernelIR:
    """Read ``func.func @name`` (or an ``llvm.func`` on scalars) of ``parsed``; ``parameters`` name its
    leading arguments in the messages of errors raised here (the rules read do not depend on them).

    Raises SignatureError when the function is missing, a type is not
    supported, the kernel frees an argument, or it reshapes one in a way the rules cannot read.
    """
    with MLIR_LOCK, parsed.context:
        signature = read_signature(parsed.function(name))
        buffers = any(not isinstance(a, ScalarSpec) for a in signature.args)  # an llvm.func takes scalars only
        written = written_arguments(parsed.module, name) if buffers else frozenset()
        freed = freed_arguments(parsed.module, name) if buffers else []
        if freed:
            raise SignatureError(
                f"{name}(): @{name} passes argument #{freed[0]} to memref.dealloc, but an argument's memory "
                "belongs to the caller (a numpy array): freeing it would corrupt the heap. Deallocate only what "
                "the kernel allocated."
            )
        called = (list(parameters[:len(signature.args)]) + output_names(len(signature.args) - len(parameters))
                  if parameters else [])
        rules = ir_rules(parsed.module, name, signature.args, called) if buffers else ShapeRules((), (), {}, ())
        asynchronous = needs(parsed.module.operation).asynchronous
        foreign = foreign_symbols(parsed)
    return KernelIR(name, signature, written, rules, asynchronous, foreign)
