"""What decoration asks of the compiler when the disk cache cannot answer: parse the source, check the
pipeline, read the kernel's IR (:func:`read_kernel`), and its callback declarations (:func:`declarations`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir import ir

from ..analysis.analyse import analyse, kernel_name
from ..analysis.source import MLIR_LOCK, ParsedSource, parse_source
from ..analysis.types import read_signature
from ..model.kernel_spec import KernelIR
from ..model.signature import Signature
from ..options import KernelOptions
from .pipeline import check_before_lowering, pipeline_of


def read_kernel(options: KernelOptions, requested: str | None,
                parameters: Sequence[str] = ()) -> tuple[KernelIR, ParsedSource]:
    """The IR of kernel ``requested`` (None: a lambda's, the source's only function) of ``options.source``,
    and the parsed source; ``parameters`` name its inputs in messages. Raises CompileError for a pass
    pipeline that does not parse, MLIRSyntaxError for a source that does not, SignatureError for a kernel
    memkernel cannot call."""
    pipeline = pipeline_of(options)
    parsed = parse_source(options.source)
    kernel = analyse(parsed, kernel_name(parsed, requested), parameters)
    with MLIR_LOCK, parsed.context:
        check_before_lowering(parsed.module, pipeline)
    return kernel, parsed


def declarations(parsed: ParsedSource) -> dict[str, Callable[[], Signature]]:
    """Every ``func.func`` declaration (no body) of the source, by name, with what reads its signature.

    Only the declarations bound to callbacks have their signature read: one that
    a library defines (``printMemrefVector4x4xf32`` on a memref of vectors) may
    have types no callback could take, and one nothing calls is no concern.
    """
    def reader(func: ir.Operation) -> Callable[[], Signature]:
        def read() -> Signature:
            with MLIR_LOCK, parsed.context:
                return read_signature(func)
        return read

    with MLIR_LOCK, parsed.context:
        return {ir.StringAttr(func.attributes["sym_name"]).value: reader(func.operation)
                for func in parsed.functions() if len(func.regions[0].blocks) == 0}
