"""The MLIR source of a :func:`memkernel.extern` kernel: a ``func.func`` of the declared signature that calls
the foreign function (see :mod:`memkernel.model.foreign`)."""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from ..analysis.source import MLIR_LOCK, parse_source
from ..analysis.writes import marked_read_only
from ..errors import SignatureError
from ..model.foreign import DECLARED_PREFIX, EXTERN_ATTRIBUTE, READ_ONLY_ATTRIBUTE


@dataclass(frozen=True)
class Declaration:
    """A foreign function's declared signature, as MLIR text: its name, each argument's type and
    attributes, its result types."""

    name: str
    arguments: tuple[tuple[str, str], ...]
    results: tuple[str, ...]


def read_declaration(text: str) -> Declaration:
    """The one ``func.func`` declaration of ``text``. MLIRSyntaxError if it does not parse; SignatureError
    if it is not one declaration, or declares what foreign code cannot take (tensors)."""
    parsed = parse_source(text)
    with MLIR_LOCK, parsed.context:
        operations = list(parsed.module.body.operations)
        if len(operations) != 1 or operations[0].operation.name != "func.func" or len(operations[0].regions[0].blocks):
            raise SignatureError(
                "memkernel.extern(): the declaration must be one func.func with no body, such as "
                "'func.func private @scale(%a: memref<?xf32>, %s: f32, %o: memref<?xf32>)'; got "
                f"{text.strip()!r}")
        func = operations[0].operation
        name = ir.StringAttr(func.attributes["sym_name"]).value
        ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        attrs = list(ir.ArrayAttr(func.attributes["arg_attrs"])) if "arg_attrs" in func.attributes else []
        for i, t in enumerate([*ftype.inputs, *ftype.results]):
            if isinstance(t, (ir.RankedTensorType, ir.UnrankedTensorType)):
                where = f"argument #{i}" if i < len(ftype.inputs) else f"result #{i - len(ftype.inputs)}"
                raise SignatureError(
                    f"{name}(): @{name} {where} is {t}: foreign code takes memrefs, not tensors (a tensor has no "
                    "calling convention). Declare it as a memref.")
        marked_read_only(func)  # a mark whose value is not true is refused here, naming the argument
        arguments = []
        for i, t in enumerate(ftype.inputs):
            entries = {a.name for a in ir.DictAttr(attrs[i])} if i < len(attrs) else set()
            unknown = sorted(entries - {READ_ONLY_ATTRIBUTE})
            if unknown:
                raise SignatureError(
                    f"{name}(): argument #{i} of @{name} has attribute {unknown[0]}; a declaration's arguments "
                    f"take only {{{READ_ONLY_ATTRIBUTE}}} (a memref the function never writes).")
            if entries and not isinstance(t, (ir.MemRefType, ir.UnrankedMemRefType)):
                raise SignatureError(
                    f"{name}(): argument #{i} of @{name} is {t}, which is passed by value: only a memref can be "
                    f"{{{READ_ONLY_ATTRIBUTE}}}.")
            arguments.append((str(t), str(attrs[i]) if entries else ""))
        return Declaration(name, tuple(arguments), tuple(str(t) for t in ftype.results))


def kernel_source(declaration: Declaration, library: str, symbol: str, ciface: bool) -> str:
    """MLIR text of a kernel ``@<name>`` that calls ``symbol`` of ``library`` with its arguments, through the
    C interface (``ciface``) or the expanded convention, and returns its results."""
    name, results = declaration.name, declaration.results
    declared = f"@{DECLARED_PREFIX}{name}"
    types = ", ".join(t for t, _ in declaration.arguments)
    returned = f"({', '.join(results)})"
    attributes = [f"{EXTERN_ATTRIBUTE} = [{_string(library)}, {_string(symbol)}]"]
    if ciface:
        attributes.insert(0, "llvm.emit_c_interface")
    params = ", ".join(f"%a{i}: {t} {a}".rstrip() for i, (t, a) in enumerate(declaration.arguments))
    args = ", ".join(f"%a{i}: {t}" for i, (t, _) in enumerate(declaration.arguments))
    passed = ", ".join(f"%a{i}" for i in range(len(declaration.arguments)))
    values = ", ".join(f"%r#{i}" for i in range(len(results)))
    call = f"func.call {declared}({passed}) : ({types}) -> {returned}"
    body = f"  %r:{len(results)} = {call}\n  return {values} : {', '.join(results)}" if results else \
        f"  {call}\n  return"
    return (f"func.func private {declared}({params}) -> {returned} attributes {{{', '.join(attributes)}}}\n"
            f"func.func @{name}({args}) -> {returned} {{\n{body}\n}}\n")


def _string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
