"""The foreign symbols a kernel's module calls: its declarations that carry ``memkernel.extern``
(see :mod:`memkernel.model.foreign`)."""

from __future__ import annotations

from mlir import ir

from ..model.foreign import EXTERN_ATTRIBUTE, ForeignSymbol
from .source import ParsedSource


def foreign_symbols(parsed: ParsedSource) -> tuple[ForeignSymbol, ...]:
    """Each ``func.func`` declaration with ``memkernel.extern = [library, symbol]``, as the symbol the
    lowered module calls (``_mlir_ciface_<name>`` when it has ``llvm.emit_c_interface``, else ``<name>``)."""
    found = []
    for func in parsed.functions():
        attributes = func.attributes
        if len(func.regions[0].blocks) > 0 or EXTERN_ATTRIBUTE not in attributes:
            continue
        library, symbol = (ir.StringAttr(a).value for a in ir.ArrayAttr(attributes[EXTERN_ATTRIBUTE]))
        name = ir.StringAttr(attributes["sym_name"]).value
        linked = f"_mlir_ciface_{name}" if "llvm.emit_c_interface" in attributes else name
        found.append(ForeignSymbol(linked, library, symbol))
    return tuple(sorted(found, key=lambda f: f.linked))
