"""Reading MLIR types into the signature model of :mod:`memkernel.model.signature`, once, at decoration."""

from __future__ import annotations

import math

from mlir import ir

from ..errors import SignatureError
from ..model.dtypes import ElementType, element_named
from ..model.signature import ArgSpec, MemRefSpec, ScalarSpec, Signature, Strided, UnrankedSpec

_DYNAMIC = ir.ShapedType.get_dynamic_size()
_DYNAMIC_STRIDE = ir.ShapedType.get_dynamic_stride_or_offset()


def element_type(t: ir.Type) -> ElementType | None:
    """The :class:`ElementType` of an MLIR scalar type, or None if memkernel has none."""
    return element_named(str(t))


def _element(t: ir.Type, where: str, whole: ir.Type) -> ElementType:
    element = element_type(t)
    if element is None:
        raise SignatureError(
            f"{where} has type {whole}: element type {t} is not supported. "
            "Supported: i1, i8..i64, si8..si64, ui8..ui64, index, f16, bf16, f32, f64, "
            "f8 types, complex<f32>, complex<f64>."
        )
    return element


def _layout(t: ir.MemRefType, where: str) -> Strided | None:
    layout = t.layout
    if isinstance(layout, ir.AffineMapAttr) and layout.value == ir.AffineMap.get_identity(t.rank):
        return None
    try:
        strides, offset = t.get_strides_and_offset()
    except (RuntimeError, ValueError):
        raise SignatureError(
            f"{where} has type {t}: its layout is not a strided layout. memkernel passes "
            "identity and strided<[...], offset: ...> layouts; rewrite the layout as strided "
            "or copy into such a memref inside the kernel."
        ) from None
    return Strided(
        tuple(None if s == _DYNAMIC_STRIDE else s for s in strides),
        None if offset == _DYNAMIC_STRIDE else offset,
    )


_INT64_LIMIT = 2**63


def _static_shape(t: ir.ShapedType, where: str, element: ElementType) -> tuple[int | None, ...]:
    """The shape of a ranked memref or tensor, None for ``?``; SignatureError if its static part holds more
    elements, or bytes, than int64 counts (MLIR's sizes and strides are int64: it cannot lower the type)."""
    shape = tuple(None if d == _DYNAMIC else d for d in t.shape)
    count = math.prod(d for d in shape if d is not None)
    if count * element.itemsize >= _INT64_LIMIT:
        raise SignatureError(
            f"{where} has type {t}: its static dims hold {count} elements of {element.itemsize} byte(s), more "
            "than an int64 size or stride can count (2**63 - 1 bytes); make the dims smaller or dynamic (?)."
        )
    return shape


def spec_of(t: ir.Type, where: str) -> ArgSpec:
    """Read one MLIR argument or result type into its spec."""
    if isinstance(t, ir.MemRefType):
        if t.memory_space is not None:
            raise SignatureError(f"{where} has type {t}: memrefs in a memory space are not supported.")
        element = _element(t.element_type, where, t)
        return MemRefSpec(str(t), _static_shape(t, where, element), element, _layout(t, where))
    if isinstance(t, ir.UnrankedMemRefType):
        if t.memory_space is not None:
            raise SignatureError(f"{where} has type {t}: memrefs in a memory space are not supported.")
        return UnrankedSpec(str(t), _element(t.element_type, where, t))
    if isinstance(t, ir.RankedTensorType):
        if t.encoding is not None:
            raise SignatureError(f"{where} has type {t}: tensors with an encoding (sparse) are not supported.")
        element = _element(t.element_type, where, t)
        return MemRefSpec(str(t), _static_shape(t, where, element), element, None, tensor=True)
    if isinstance(t, ir.UnrankedTensorType):
        return UnrankedSpec(str(t), _element(t.element_type, where, t), tensor=True)
    return ScalarSpec(str(t), _element(t, where, t))


def _top_level_paren(text: str) -> int:
    """Where the argument list of an ``!llvm.func<result (args)>`` body starts."""
    depth = 0
    for i, char in enumerate(text):
        if char in "<[{" or (char == "(" and depth > 0):
            depth += 1
        elif char in ">]})":
            depth -= 1
        elif char == "(":
            return i
    raise ValueError(f"not an LLVM function type: {text}")


def llvm_function_types(func: ir.Operation) -> tuple[list[ir.Type], list[ir.Type]]:
    """An ``llvm.func`` definition's argument types and its result type (none for ``void``);
    SignatureError if it takes variadic arguments."""
    name = ir.StringAttr(func.attributes["sym_name"]).value
    text = str(ir.TypeAttr(func.attributes["function_type"]).value)
    body = text.removeprefix("!llvm.func<").removesuffix(">")
    if body.endswith("...)"):
        raise SignatureError(f"@{name} is {text}: memkernel cannot call a function with variadic arguments.")
    result = body[:_top_level_paren(body)].strip()
    inputs = [arg.type for arg in func.regions[0].blocks[0].arguments]
    return inputs, [] if result == "void" else [ir.Type.parse(result)]


def _llvm_scalar(t: ir.Type, where: str) -> ArgSpec:
    spec = spec_of(t, where) if element_type(t) is not None else None
    if not isinstance(spec, ScalarSpec):
        raise SignatureError(
            f"{where} has type {t}: memkernel calls an llvm.func with scalar arguments and results only "
            "(integers, floats, none); pointers and aggregates have no numpy counterpart it could check. "
            "Write the entry as a func.func taking memrefs, or wrap the llvm.func in one."
        )
    return spec


def read_signature(func: ir.Operation) -> Signature:
    """Read a ``func.func`` operation's signature, or an ``llvm.func`` one's on scalars, into a
    :class:`Signature`. SignatureError for a type memkernel cannot pass."""
    name = ir.StringAttr(func.attributes["sym_name"]).value
    if func.name == "llvm.func":
        inputs, outputs = llvm_function_types(func)
        return Signature(name, tuple(_llvm_scalar(t, f"@{name} argument #{i}") for i, t in enumerate(inputs)),
                         tuple(_llvm_scalar(t, f"@{name} result #{i}") for i, t in enumerate(outputs)))
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    args = tuple(spec_of(t, f"@{name} argument #{i}") for i, t in enumerate(ftype.inputs))
    results = tuple(spec_of(t, f"@{name} result #{i}") for i, t in enumerate(ftype.results))
    return Signature(name, args, results)
