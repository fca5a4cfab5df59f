"""Everything decoration learns about a kernel, as plain data.

:class:`KernelIR` is what the MLIR source says (read by
:func:`memkernel.analysis.analyse.analyse`, kept in the disk cache, so a cached
kernel needs no compiler to be decorated); :func:`bind` adds the Python
function that names its inputs and makes the frozen :class:`KernelSpec` every
call reads. Nothing at call time reads MLIR again.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import SignatureError
from .contract import BufferContract, Contract, contract_for
from .foreign import ForeignSymbol
from .shapes import Dim, ShapeRules, named_rules
from .signature import ArgSpec, MemRefSpec, ScalarSpec, Signature


@dataclass(frozen=True)
class KernelIR:
    """What the kernel's IR says, read once at decoration: its signature, the memref arguments it may
    write, the rules its ops put on its arguments' dims (no dim names yet), whether its module runs
    code on the async runtime's worker threads (it has ``async`` ops), where its callbacks may run too, and
    the foreign symbols it calls (see :mod:`memkernel.model.foreign`)."""

    name: str
    signature: Signature
    written: frozenset[int]
    rules: ShapeRules
    asynchronous: bool
    foreign: tuple[ForeignSymbol, ...] = ()


_PARAMETER = inspect.Parameter


class _TypeText(str):
    """An annotation that shows as the MLIR type text, unquoted, in signatures."""

    def __repr__(self) -> str:
        return str(self)


@dataclass(frozen=True)
class KernelSpec:
    """A kernel as decoration reads it.

    ``parameters`` are the Python function's parameters, naming the leading
    MLIR arguments; the trailing ones are outputs. ``written`` holds the
    indices of the memref arguments the kernel may write. ``contracts`` has
    one entry per MLIR argument. ``shapes`` says which of their dims must agree.
    ``foreign`` are the foreign symbols the kernel calls (see :mod:`memkernel.model.foreign`).
    """

    name: str
    signature: Signature
    parameters: tuple[inspect.Parameter, ...]
    written: frozenset[int]
    contracts: tuple[Contract, ...]
    shapes: ShapeRules
    foreign: tuple[ForeignSymbol, ...] = ()

    @property
    def overlap_pairs(self) -> tuple[tuple[int, int], ...]:
        """The pairs of memref arguments, at least one of them written, whose memory must not partly overlap.

        Where a written argument partly overlaps another, numpy computes as if the
        inputs had been copied first; both call paths check these pairs.
        """
        buffers = [c for c in self.contracts if isinstance(c, BufferContract)]
        return tuple((a.index, b.index) for k, a in enumerate(buffers) for b in buffers[k + 1:]
                     if a.needs_writeable or b.needs_writeable)

    @property
    def argument_names(self) -> tuple[str, ...]:
        """How messages call each MLIR argument: its parameter's name, ``out`` or ``out[i]``."""
        return tuple(c.name for c in self.contracts)

    def output_sources(self) -> list[tuple[Dim | int | None, ...] | None]:
        """Per output, where each of its dims' sizes comes from (see :meth:`ShapeRules.source_of`)."""
        args = self.signature.args
        return [
            tuple(self.shapes.source_of(Dim(i, k), self.n_inputs, args) for k in range(spec.rank))
            if isinstance(spec, MemRefSpec) else None
            for i, spec in enumerate(args) if i >= self.n_inputs
        ]

    @property
    def n_inputs(self) -> int:
        return len(self.parameters)

    @property
    def n_outputs(self) -> int:
        return len(self.signature.args) - len(self.parameters)

    @property
    def outputs(self) -> tuple[ArgSpec, ...]:
        return self.signature.args[self.n_inputs:]

    @property
    def python_signature(self) -> inspect.Signature:
        """The call signature, each parameter annotated with its MLIR type; ``out=`` when there are outputs."""
        args = self.signature.args
        params = [p.replace(annotation=_TypeText(self._shown(i))) for i, p in enumerate(self.parameters)]
        outputs = range(self.n_inputs, len(args))
        if outputs:
            params.append(_PARAMETER("out", _PARAMETER.KEYWORD_ONLY, default=None,
                                     annotation=_TypeText(" | ".join(["None", *(args[i].mlir for i in outputs)]))))
        returned = [self._shown(i) for i in outputs] + [r.mlir for r in self.signature.results]
        annotation: Any = inspect.Signature.empty
        if len(returned) == 1:
            annotation = _TypeText(returned[0])
        elif returned:
            annotation = _TypeText(f"tuple[{', '.join(returned)}]")
        return inspect.Signature(params, return_annotation=annotation)


    def _shown(self, i: int) -> str:
        """Argument ``i``'s MLIR type, with its dim names when the Python signature gives them."""
        names = self.shapes.names.get(i)
        mlir = self.signature.args[i].mlir
        return f"{mlir} ({', '.join(names)})" if names else mlir


def _parameters(name: str, function: Callable[..., Any], signature: Signature) -> tuple[inspect.Parameter, ...]:
    params = list(inspect.signature(function).parameters.values())
    mlir_args = signature.args
    for p in params:
        if p.kind in (_PARAMETER.VAR_POSITIONAL, _PARAMETER.VAR_KEYWORD):
            raise SignatureError(
                f"{name}(): parameter {p} cannot name an MLIR argument; name each argument with its own parameter."
            )
    if len(params) > len(mlir_args):
        raise SignatureError(
            f"{name}(): the Python function has {len(params)} parameters but @{name} takes {len(mlir_args)} "
            f"arguments ({', '.join(a.mlir for a in mlir_args) or 'none'})."
        )
    for i, spec in enumerate(mlir_args[len(params):], start=len(params)):
        if getattr(spec, "tensor", False):
            raise SignatureError(
                f"{name}(): MLIR argument #{i} ({spec.mlir}) has no Python parameter. A tensor argument is an "
                "input (a tensor function returns its results); add a parameter for it."
            )
        if isinstance(spec, ScalarSpec):
            raise SignatureError(
                f"{name}(): MLIR argument #{i} ({spec.mlir}) has no Python parameter. Arguments the Python "
                "signature leaves out are outputs, which must be memrefs; add a parameter for it."
            )
    if len(params) < len(mlir_args) and any(p.name == "out" for p in params):
        raise SignatureError(
            f"{name}(): a parameter named 'out' clashes with the out= keyword of a kernel with outputs; rename it."
        )
    return tuple(params)


def output_names(count: int) -> list[str]:
    """How messages call the outputs: ``out`` for one, ``out[i]`` for several."""
    return ["out"] if count == 1 else [f"out[{i}]" for i in range(count)]


def bind(ir: KernelIR, function: Callable[..., Any]) -> KernelSpec:
    """The kernel ``ir`` describes, its leading arguments named by the Python ``function``'s parameters
    (and its dims by their annotations). Raises SignatureError when the Python signature does not fit."""
    name, signature, written = ir.name, ir.signature, ir.written
    parameters = _parameters(name, function, signature)
    returned = inspect.signature(function).return_annotation
    n_inputs = len(parameters)
    called = [p.name for p in parameters] + output_names(len(signature.args) - n_inputs)
    contracts = tuple(
        contract_for(name, called[i], i, spec, is_output=i >= n_inputs, may_write=i in written)
        for i, spec in enumerate(signature.args)
    )
    named, names, outputs = named_rules(name, parameters, returned, signature.args)
    shapes = dataclasses.replace(ir.rules, ties=ir.rules.ties + tuple(named), names=names, output_names=outputs)
    shapes.unnamed(name, signature.args, called)
    return KernelSpec(name, signature, parameters, written, contracts, shapes, ir.foreign)
