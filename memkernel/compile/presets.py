"""Pipeline presets: what each does to a kernel's IR before the default lowering.

``"default"`` lowers linalg to plain loops and leaves vectorization to LLVM.

``"fast"`` first applies transform-dialect strategies (``memkernel/compile/transforms``)
to the ops they know, sized for the host's vector width:

- ``linalg.matmul`` on f32/f64 memrefs (tensor kernels after bufferization):
  tiled for the caches and for registers, peeled so the main tiles are static,
  vectorized to broadcast-and-FMA outer products with the C block held in
  registers (see ``transforms/matmul.mlir``);
- 1-d reductions to a scalar on f32/f64 tensors (``linalg.reduce``, and
  ``linalg.generic`` with one reduction iterator): split into vector-wide
  partial results carried across the loop, vectorized with masks for the tail
  (see ``transforms/reduction.mlir``).

Every other op, and any op a strategy fails on, takes the default lowering:
a strategy is applied to a copy of the module, which is kept only if the whole
strategy succeeded, so a preset is never less correct than ``"default"``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from mlir import ir
from mlir.dialects.transform import interpreter

from . import objects as jit

_FLOATS = ("f32", "f64")


@functools.lru_cache(maxsize=None)
def host_vector_bits() -> int:
    """The widest vector register of the host: 512 with AVX-512, 256 with AVX2, else 128."""
    features = jit.host_cpu().split(";", 1)[1].split(",")
    if "+avx512f" in features:
        return 512
    if "+avx2" in features:
        return 256
    return 128


def _ops(module: ir.Module, name: str) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _element(value: ir.Value) -> str:
    return str(value.type.element_type)


def _matmul_parameters(module: ir.Module) -> dict[str, str] | None:
    matmuls = _ops(module, "linalg.matmul")
    types = {_element(v) for op in matmuls for v in op.operands}
    if not matmuls or not types <= set(_FLOATS) or len(types) != 1:
        return None
    bits = 64 if types == {"f64"} else 32
    lanes = host_vector_bits() // bits
    cache_n = 256 if bits == 32 else 128
    return {"cache_tiles": f"64, {cache_n}, 128", "register_tiles": f"8, {2 * lanes}, 8"}


_REDUCTION_ONLY = "[#linalg.iterator_type<reduction>]"


def _reduction_parameters(module: ir.Module) -> dict[str, str] | None:
    reductions = _ops(module, "linalg.reduce") + [
        op for op in _ops(module, "linalg.generic") if str(op.attributes["iterator_types"]) == _REDUCTION_ONLY
    ]
    if not reductions:
        return None
    for op in reductions:
        inputs = op.operands[0].type
        if (not isinstance(inputs, ir.RankedTensorType) or inputs.rank != 1 or len(op.results) != 1
                or len(op.operands) != 2 or _element(op.operands[0]) not in _FLOATS):
            return None
    bits = 64 if all(_element(op.operands[0]) == "f64" for op in reductions) else 32
    lanes = 4 * host_vector_bits() // bits
    return {"reduction_tiles": str(lanes), "vector_sizes": str(lanes)}


@dataclass(frozen=True)
class Strategy:
    """A transform script for the ops it knows; ``parameters`` says whether (and how) it applies."""

    script: str
    on_tensors: bool
    parameters: Callable[[ir.Module], dict[str, str] | None]

    @functools.cached_property
    def text(self) -> str:
        return resources.files("memkernel.compile").joinpath("transforms", self.script).read_text()

    def applied(self, module: ir.Module) -> ir.Module:
        """``module`` transformed, as a new module; the original one if the strategy does not apply or fails."""
        parameters = self.parameters(module)
        if parameters is None:
            return module
        text = self.text
        for key, value in parameters.items():
            text = text.replace("{" + key + "}", value)
        copy = ir.Module.parse(str(module), module.context)
        try:
            script = ir.Module.parse(text, module.context)
            interpreter.apply_named_sequence(copy.operation, script.body.operations[0], script.operation)
            copy.operation.verify()
        except (ValueError, ir.MLIRError):
            return module
        return copy


PRESETS: dict[str, tuple[Strategy, ...]] = {
    "default": (),
    "fast": (
        Strategy("reduction.mlir", True, _reduction_parameters),
        Strategy("matmul.mlir", False, _matmul_parameters),
    ),
}


def fingerprint(preset: str) -> str:
    """What identifies a preset's behaviour in a cache key: its name, scripts and the vector width."""
    texts = "".join(strategy.text for strategy in PRESETS[preset])
    return f"{preset}:{host_vector_bits()}:{hashlib.sha256(texts.encode()).hexdigest()[:16]}"
