"""A kernel's gufunc layout: its core signature, derived from the shape rules, or why it has none.

numpy's generalized ufuncs name each core dim of each operand
(``(m,k),(k,n)->(m,n)``) and check that dims of one name agree, and that
numbered dims have their size. That is exactly what a kernel's ties say: dims
tied to each other (by its ops or by dim names) get one name, dims fixed by
the type or tied to a constant get their number. :func:`gufunc_layout` reads
the :class:`~memkernel.model.kernel_spec.KernelSpec` into a
:class:`GufuncLayout`, which the compiler's loop emitter
(:mod:`memkernel.compile.gufunc_loop`) and the ufunc maker
(:mod:`memkernel.ufunc.make`) read; a kernel whose rules say more than a
signature can (bounds, views, outputs shaped by the Python function) is a
:class:`~memkernel.errors.SignatureError` naming the rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import SignatureError
from ..model.contract import BufferContract, ScalarContract
from ..model.dims import Dim
from ..model.kernel_spec import KernelSpec
from ..model.shapes import Bound
from ..model.signature import MemRefSpec

_NAMES = ("m", "k", "n", "p", "q", "r", "s", "t", "u", "v", "w", "x", "y", "z")
"""Names for dims no annotation names, in order of first appearance (a matmul reads ``(m,k),(k,n)->(m,n)``)."""


@dataclass(frozen=True)
class CoreArg:
    """One operand of the gufunc: MLIR argument ``index``, its core dims' names, and what the loop needs.

    ``dims`` holds, per core dim, its position in numpy's ``dimensions`` array (1 is the first core dim
    name). ``scalar`` marks a scalar argument (core ``()``), passed by value.
    """

    index: int
    name: str
    names: tuple[str, ...]
    dims: tuple[int, ...]
    dtype: np.dtype
    llvm_type: str
    scalar: bool
    is_output: bool
    layout_offset: int = 0

    @property
    def fixed_sizes(self) -> tuple[int | None, ...]:
        """Per core dim, the size the kernel fixes (such a dim is named by its size, and numpy refuses any
        other), or None."""
        return tuple(int(n) if n.isdigit() else None for n in self.names)


@dataclass(frozen=True)
class GufuncLayout:
    """What the gufunc of a kernel is: its numpy core signature and its operands, inputs first."""

    kernel: str
    signature: str
    args: tuple[CoreArg, ...]
    n_inputs: int

    @property
    def n_outputs(self) -> int:
        return len(self.args) - self.n_inputs

    @property
    def type_numbers(self) -> bytes:
        """The operands' numpy type numbers: the one loop the ufunc registers."""
        return bytes(a.dtype.num for a in self.args)


def _refuse(kernel: str, why: str) -> SignatureError:
    return SignatureError(f"{kernel}.gufunc(): {why}")


def _classes(spec: KernelSpec) -> dict[Dim, Dim]:
    """Every memref dim's representative: dims the ties make equal share one."""
    parent: dict[Dim, Dim] = {}

    def find(d: Dim) -> Dim:
        while parent.setdefault(d, d) != d:
            d = parent[d]
        return d

    for c in spec.contracts:
        if isinstance(c, BufferContract) and isinstance(c.spec, MemRefSpec):
            for k in range(c.spec.rank):
                find(Dim(c.index, k))
    for tie in spec.shapes.ties:
        if tie.b is not None:
            a, b = find(tie.a), find(tie.b)
            if a != b:
                parent[max(a, b, key=lambda d: (d.arg, d.dim))] = min(a, b, key=lambda d: (d.arg, d.dim))
    return {d: find(d) for d in parent}


def _refuse_unsupported(spec: KernelSpec, results: int, callbacks: bool) -> None:
    name = spec.name
    shapes = spec.shapes
    if results:
        raise _refuse(name, f"@{name} returns {results} result(s); a gufunc's values are its outputs. Write the "
                      "results into output memrefs.")
    if callbacks:
        raise _refuse(name, "a kernel with callbacks= cannot be a gufunc: its loop runs without the GIL.")
    if shapes.affine_bounds:
        reason = shapes.affine_bounds[0].reason
        raise _refuse(name, f"{reason} needs a dim at least as large as other dims (a window or an offset "
                      "access); a gufunc signature can only say that dims are equal or fixed.")
    if shapes.views:
        raise _refuse(name, "its shape rules hold on reshaped views of its arguments, which a gufunc signature "
                      "cannot say.")
    if spec.n_outputs == 0:
        raise _refuse(name, "it has no output memref (every argument is a parameter); a gufunc computes outputs "
                      "from inputs. Leave the outputs out of the Python signature.")


def _check_operand(spec: KernelSpec, contract: BufferContract | ScalarContract) -> None:
    name = spec.name
    where = f"argument '{contract.name}' ({contract.spec.mlir})"
    if contract.element.dtype.num >= 256 or contract.element.kind == "complex" and isinstance(
            contract, ScalarContract):
        raise _refuse(name, f"{where}: numpy's ufunc loops take builtin dtypes only, not "
                      f"{contract.element.dtype.name}{' scalars' if contract.element.kind == 'complex' else ''}.")
    if isinstance(contract, ScalarContract):
        if contract.element.kind == "float" and contract.element.mlir not in ("f32", "f64"):
            raise _refuse(name, f"{where}: scalar {contract.element.mlir} is not supported; pass it as a 0-d "
                          "memref.")
        return
    if not isinstance(contract.spec, MemRefSpec):
        raise _refuse(name, f"{where}: an unranked memref has no core dims to name.")
    if contract.spec.tensor:
        raise _refuse(name, f"{where}: a tensor function returns results; a gufunc writes outputs.")
    if not contract.is_output and contract.may_write:
        raise _refuse(name, f"{where}: @{name} may write this input, and a gufunc's inputs are read-only. "
                      "Make it an output (leave it out of the Python signature).")
    strides = contract.layout_strides
    if strides is not None:
        shape = contract.spec.shape
        for k, stride in enumerate(strides):
            inner = shape[k + 1:]
            sizes = [size for size in inner if size is not None]
            if stride is not None and (len(sizes) < len(inner) or math.prod(sizes) != stride):
                raise _refuse(name, f"{where}: its layout fixes the stride of dim {k} to {stride}, which a "
                              "contiguous core of every size does not have (the gufunc's loop hands the kernel "
                              "contiguous cores); use ? for that stride.")


def _check_bound(kernel: str, bound: Bound, classes: dict[Dim, Dim], fixed: dict[Dim, int]) -> None:
    """Accept a bound every size the signature allows meets: one the fixed sizes meet (a static access in a
    static memref), or a dim at least as large as the dim it is tied to; refuse the others."""
    target = classes[bound.target]
    terms = [(c, d) for c, d in bound.terms if c]  # a dim with coefficient 0 moves the access nowhere
    if bound.constant <= 0 and bound.lowest >= 0 and len(terms) == 1 and terms[0][0] == 1 \
            and classes[terms[0][1]] == target:
        return
    dims = [target, *(classes[d] for _, d in terms)]
    if all(d in fixed for d in dims):
        reach = bound.constant + sum(c * (fixed[classes[d]] - 1) for c, d in terms)
        if fixed[target] > reach and bound.lowest >= 0 or any(fixed[classes[d]] == 0 for _, d in terms):
            return
    raise _refuse(kernel, f"{bound.reason} needs a dim at least as large as other dims (a window or an offset "
                  "access); a gufunc signature can only say that dims are equal or fixed.")


def gufunc_layout(spec: KernelSpec, results: int = 0, callbacks: bool = False) -> GufuncLayout:
    """The gufunc layout of ``spec``'s kernel. ``results`` counts its MLIR results, ``callbacks`` tells whether
    it binds callbacks. Raises SignatureError (naming the kernel and the rule) when no signature expresses
    its shape rules, or an operand cannot be one of a gufunc."""
    _refuse_unsupported(spec, results, callbacks)
    for contract in spec.contracts:
        _check_operand(spec, contract)
    classes = _classes(spec)
    fixed: dict[Dim, int] = {}
    for c in spec.contracts:
        if isinstance(c.spec, MemRefSpec):
            for k, size in c.static_dims:  # type: ignore[union-attr]
                if size == 0:
                    raise _refuse(spec.name, f"dim {k} of {c.name} ({c.spec.mlir}) is 0, a size numpy does not "
                                  "take in a gufunc signature (a fixed core dim is 1 or more).")
                fixed.setdefault(classes[Dim(c.index, k)], size)
    for tie in spec.shapes.ties:
        if tie.b is None:
            fixed.setdefault(classes[tie.a], tie.size)
    for bound in spec.shapes.bounds:
        _check_bound(spec.name, bound, classes, fixed)
    for output, sources in zip(spec.contracts[spec.n_inputs:], spec.output_sources()):
        for k, source in enumerate(sources or ()):
            if source is None and classes[Dim(output.index, k)] not in fixed:
                raise _refuse(spec.name, f"dim {k} of {output.name} ({output.spec.mlir}) is tied to no input dim, "
                              "so only the Python function (or out=) could give its size, which a gufunc "
                              "signature cannot say. Tie it to an input dim, or name it after one.")
    named = {classes[Dim(i, k)]: n for i, names in spec.shapes.names.items() for k, n in enumerate(names)
             if n.isidentifier() and n != "_"}
    named.update({classes[Dim(spec.n_inputs + o, k)]: n for o, names in enumerate(spec.shapes.output_names)
                  if names for k, n in enumerate(names) if n.isidentifier() and n != "_"})
    free = iter(n for n in _NAMES if n not in named.values())
    memref_classes = [classes[Dim(c.index, k)] for c in spec.contracts if isinstance(c.spec, MemRefSpec)
                      for k in range(c.spec.rank)]
    unnamed = [r for r in dict.fromkeys(memref_classes) if r not in fixed and r not in named]
    label = {r: str(fixed[r]) for r in fixed}
    label.update({r: named[r] for r in named if r not in fixed})
    label.update({r: "n" if len(unnamed) == 1 and "n" not in named.values() else next(free) for r in unnamed})
    order: list[str] = []
    args = []
    for c in spec.contracts:
        names = tuple(label[classes[Dim(c.index, k)]] for k in range(c.spec.rank)) \
            if isinstance(c.spec, MemRefSpec) else ()
        order += [n for n in names if n not in order]
        args.append((c, names))
    core = tuple(
        CoreArg(c.index, c.name, names, tuple(1 + order.index(n) for n in names), c.element.dtype,
                c.element.llvm_type, isinstance(c, ScalarContract), c.index >= spec.n_inputs,
                c.layout_offset if isinstance(c, BufferContract) else 0)
        for c, names in args)
    text = ",".join(f"({','.join(a.names)})" for a in core[:spec.n_inputs]) + "->" + \
        ",".join(f"({','.join(a.names)})" for a in core[spec.n_inputs:])
    return GufuncLayout(spec.name, text, core, spec.n_inputs)
