"""The shape rules of a kernel's arguments, as data: which dims must agree, how far accesses reach, and the
reshapes of arguments (:mod:`memkernel.model.views`) the rules also name.

:mod:`memkernel.analysis.shapes` derives them from the IR at decoration, and
:func:`named_rules` from the dim names of the Python signature. Both call paths
check them before every call: the checked path through :meth:`ShapeRules.check`,
the compiled fast path through the code :mod:`memkernel.compile.fast_path`
derives from the same rules (a kernel with rules on views takes the checked path).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ShapeError, SignatureError
from .dims import Dim
from .signature import ArgSpec, MemRefSpec
from .views import View

__all__ = ["AffineBound", "Bound", "Dim", "Expr", "ShapeRules", "Tie", "interval", "named_rules"]


@dataclass(frozen=True)
class Tie:
    """Two dims that must be equal (``b`` None: ``a`` must equal ``size``).

    ``reason`` is what requires it: ``@add's linalg.generic``, or a dim name.
    ``named`` tells which of the two the reason is.
    """

    a: Dim
    b: Dim | None
    reason: str
    named: bool = False
    size: int = 0
    has: str = ""
    """What has ``size``, for the message (``@k's memref.subview of x has 4 on dim 0``); empty: ``reason``."""


@dataclass(frozen=True)
class Bound:
    """``target``'s size must be at least ``sum(coefficient * (size(dim) - 1)) + constant + 1``
    whenever every ``dim`` of ``terms`` is non-empty: the largest index an affine access reaches."""

    target: Dim
    terms: tuple[tuple[int, Dim], ...]
    constant: int
    reason: str
    verb: str = "reads"
    """What ``reason`` does at the index: a linalg op reads there; a load, store or slice reaches it."""
    lowest: int = 0
    """The least index reached (when every ``dim`` of ``terms`` is non-empty): one below 0 is outside
    ``target`` whatever its size, so the bound then holds only when one of those dims is empty."""


Expr = tuple
"""An affine expression of loop dims, as nested tuples: ``("d", j)``, ``("c", k)``, ``("+", a, b)``,
``("*", a, k)``, ``("//", a, q)``, ``("cd", a, q)`` (ceildiv), ``("%", a, q)``."""


def interval(expr: Expr, sizes: dict[int, int]) -> tuple[int, int]:
    """The least and greatest value ``expr`` takes while each loop dim ``j`` runs over ``range(sizes[j])``."""
    kind = expr[0]
    if kind == "d":
        return 0, sizes[expr[1]] - 1
    if kind == "c":
        return expr[1], expr[1]
    low, high = interval(expr[1], sizes)
    if kind == "+":
        other = interval(expr[2], sizes)
        return low + other[0], high + other[1]
    factor = expr[2]
    if kind == "*":
        return (low * factor, high * factor) if factor >= 0 else (high * factor, low * factor)
    if kind == "//":
        return low // factor, high // factor
    if kind == "cd":
        return -(-low // factor), -(-high // factor)
    return (low, high) if 0 <= low and high < factor else (0, factor - 1)


@dataclass(frozen=True)
class AffineBound:
    """Every index ``expr`` takes over the loops (each loop dim's size that of its ``loops`` dim) must lie
    in ``target``: what a map other than a sum of loop dims with non-negative coefficients asks."""

    target: Dim
    expr: Expr
    loops: tuple[tuple[int, Dim], ...]
    reason: str


@dataclass(frozen=True)
class ShapeRules:
    """The shape constraints of one kernel's arguments."""

    ties: tuple[Tie, ...]
    bounds: tuple[Bound, ...]
    names: dict[int, tuple[str, ...]]
    output_names: tuple[tuple[str, ...] | None, ...]
    affine_bounds: tuple[AffineBound, ...] = ()
    views: tuple[View, ...] = ()
    """Reshapes of the arguments (see :mod:`memkernel.model.views`), which ``through_views`` names: dim ``k`` of
    view ``i`` of a kernel of ``n`` arguments is ``Dim(n + i, k)``. The checked path alone checks them."""
    through_views: ShapeRules | None = None
    unfollowed: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Calls the rules cannot follow (a ``func.call_indirect`` of a function chosen at run time): what makes
    each (``@k's func.call_indirect``) and the arguments it is passed, whose dims must all be named or static
    (see :meth:`unnamed`)."""

    def unnamed(self, kernel: str, specs: Sequence[ArgSpec], called: Sequence[str]) -> None:
        """Raise a SignatureError for a call the rules cannot follow that is passed an argument with a ``?``
        dim its annotation does not name: nothing else would tie the dims the callee indexes."""
        for reason, args in self.unfollowed:
            for arg in args:
                spec, tokens = specs[arg], self.names.get(arg, ())
                dynamic = [k for k, size in enumerate(spec.shape) if size is None] \
                    if isinstance(spec, MemRefSpec) else [0]
                if any(k >= len(tokens) or tokens[k] == "_" for k in dynamic):
                    raise SignatureError(
                        f"{kernel}(): {reason} calls a function that is not a func.constant, passing "
                        f"{called[arg]}: the shape rules cannot read which function runs, so nothing ties the dims "
                        f"it indexes. Name every dim of what it is passed (e.g. {called[arg]}: \"N\"), or call the "
                        "function with func.call."
                    )

    def source_of(self, dim: Dim, n_inputs: int, specs: Sequence[ArgSpec]) -> Dim | int | None:
        """Where an output dim's size comes from: an input's dim, a static size, or None if nothing says."""
        seen, todo = {dim}, [dim]
        while todo:
            current = todo.pop()
            spec = specs[current.arg]
            if isinstance(spec, MemRefSpec) and spec.shape[current.dim] is not None:
                return spec.shape[current.dim]
            if current.arg < n_inputs:
                return current
            for tie in self.ties:
                if tie.b is None and tie.a == current:
                    return tie.size
                for x, y in ((tie.a, tie.b), (tie.b, tie.a)):
                    if x == current and y is not None and y not in seen:
                        seen.add(y)
                        todo.append(y)
        return None

    def check(self, kernel: str, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None],
              allocated: Collection[int] = ()) -> None:
        """Raise a ShapeError naming the arguments, dims and sizes of the first rule ``shapes`` break.

        ``allocated``: the arguments memkernel allocated for this call, which the message does not ask the
        caller to pass longer."""
        self.check_ties(kernel, names, shapes)
        for bound in self.bounds:
            self._check_bound(kernel, names, shapes, bound, allocated)
        for affine in self.affine_bounds:
            self._check_affine(kernel, names, shapes, affine)
        if self.views:
            self._check_views(kernel, names, shapes, allocated)

    def check_ties(self, kernel: str, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None]) -> None:
        """Raise a ShapeError for the first equal-size rule ``shapes`` break (None: an argument not known yet,
        an output still to allocate, whose rules are skipped)."""
        for tie in self.ties:
            first = shapes[tie.a.arg]
            if first is None:
                continue
            if tie.b is None:
                if first[tie.a.dim] != tie.size and tie.has:
                    raise ShapeError(
                        f"{kernel}(): {names[tie.a.arg]} has {first[tie.a.dim]} elements on dim {tie.a.dim} but "
                        f"{tie.reason} needs {tie.size} there ({tie.has}). Pass {names[tie.a.arg]} with dim "
                        f"{tie.a.dim} == {tie.size}."
                    )
                if first[tie.a.dim] != tie.size:
                    raise ShapeError(
                        f"{kernel}(): {names[tie.a.arg]} has {first[tie.a.dim]} elements on dim {tie.a.dim} but "
                        f"{tie.reason} is {tie.size}. Pass {names[tie.a.arg]} with dim {tie.a.dim} == {tie.size}."
                    )
                continue
            second = shapes[tie.b.arg]
            if second is None or first[tie.a.dim] == second[tie.b.dim]:
                continue
            x, y = first[tie.a.dim], second[tie.b.dim]
            if tie.named:
                raise ShapeError(
                    f"{kernel}(): {tie.reason} is {x} from {names[tie.a.arg]} but {y} from {names[tie.b.arg]} "
                    f"(dims {tie.a.dim} and {tie.b.dim}); every dim named {tie.reason} must have one size."
                )
            raise ShapeError(
                f"{kernel}(): {names[tie.a.arg]} has {x} elements on dim {tie.a.dim} but {names[tie.b.arg]} has {y} "
                f"on dim {tie.b.dim}; {tie.reason} needs them equal."
            )

    def _check_views(self, kernel: str, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None],
                     allocated: Collection[int]) -> None:
        """Work out each view's shape from the arguments' (checking what the view asks of them), then check the
        rules on the views' dims."""
        names, shapes = list(names), list(shapes)
        for view in self.views:
            shapes.append(view.shape(kernel, names, shapes))
            names.append(view.name(names))
        if self.through_views is not None:
            self.through_views.check(kernel, names, shapes, allocated)

    @staticmethod
    def _check_affine(kernel: str, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None],
                      bound: AffineBound) -> None:
        target = shapes[bound.target.arg]
        loop_shapes = [shapes[d.arg] for _, d in bound.loops]
        if target is None or any(s is None for s in loop_shapes):
            return
        sizes = {j: s[d.dim] for (j, d), s in zip(bound.loops, loop_shapes) if s is not None}
        if any(n == 0 for n in sizes.values()):
            return
        low, high = interval(bound.expr, sizes)
        have = target[bound.target.dim]
        if low < 0 or high >= have:
            given = ", ".join(f"{names[d.arg]} dim {d.dim} = {sizes[j]}" for j, d in bound.loops) or "constant"
            raise ShapeError(
                f"{kernel}(): {names[bound.target.arg]} has {have} elements on dim {bound.target.dim} but "
                f"{bound.reason} reads indices {low} to {high} there ({given}); they must lie in 0 to {have - 1}."
            )

    @staticmethod
    def _check_bound(kernel: str, names: Sequence[str], shapes: Sequence[tuple[int, ...] | None],
                     bound: Bound, allocated: Collection[int]) -> None:
        target = shapes[bound.target.arg]
        sizes = [shapes[d.arg] for _, d in bound.terms]
        if target is None or any(s is None for s in sizes):
            return
        lengths = [s[d.dim] for s, (_, d) in zip(sizes, bound.terms) if s is not None]
        if any(n == 0 for n in lengths):
            return
        needed = sum(c * (n - 1) for (c, _), n in zip(bound.terms, lengths)) + bound.constant + 1
        have = target[bound.target.dim]
        given = ", ".join(f"{names[d.arg]} dim {d.dim} = {n}" for (_, d), n in zip(bound.terms, lengths))
        name = names[bound.target.arg]
        if bound.lowest < 0:
            raise ShapeError(
                f"{kernel}(): {name} has {have} elements on dim {bound.target.dim} but {bound.reason} "
                f"{bound.verb} indices {bound.lowest} to {needed - 1} there{f' ({given})' if given else ''}; they "
                f"must lie in 0 to {have - 1}, and index {bound.lowest} is before the start of {name} whatever its "
                "size: the kernel indexes out of bounds."
            )
        if have < needed:
            if any(c > 0 and d == bound.target for c, d in bound.terms):
                remedy = (f"that is past the end of {name} whatever its size, since the loops run over its own "
                          "length: the kernel indexes out of bounds.")
            elif bound.target.arg in allocated:
                remedy = (f"{name} was allocated for this call with that size; pass out= with at least {needed} "
                          "there, or return that shape from the decorated function.")
            else:
                remedy = f"pass at least {needed}."
            raise ShapeError(
                f"{kernel}(): {name} has {have} elements on dim {bound.target.dim} but "
                f"{bound.reason} {bound.verb} up to index {needed - 1} there"
                f"{f' ({given})' if given else ''}; {remedy}"
            )


# -- named dims -------------------------------------------------------------------


def _pattern(annotation: Any) -> Any:
    """An annotation as written: a string literal under ``from __future__ import annotations`` is unquoted."""
    if isinstance(annotation, str):
        try:
            value = ast.literal_eval(annotation)
        except (ValueError, SyntaxError):
            return annotation
        return value if isinstance(value, (str, tuple, list, int)) else annotation
    return annotation


_FORMS = ("a dim pattern is names, numbers and _ separated by spaces, e.g. \"M K\", in one string (a tuple "
          "of such strings only as the return annotation, one per output)")

_LARGEST_DIM = 2**63 - 1


def _refuse_form(kernel: str, where: str, annotation: Any) -> None:
    """SignatureError for an annotation that looks like a dim pattern but is not one (an int, a tuple)."""
    if isinstance(annotation, (int, tuple, list)):
        raise SignatureError(f"{kernel}(): {where} is annotated {annotation!r}: {_FORMS}.")


def _is_number(token: str) -> bool:
    return token.isascii() and token.isdigit()


def _tokens(kernel: str, pattern: str, where: str, spec: ArgSpec | None) -> tuple[str, ...]:
    tokens = tuple(pattern.split())
    for k, token in enumerate(tokens):
        if not (token.isidentifier() or _is_number(token)):
            raise SignatureError(f"{kernel}(): {where} is annotated {pattern!r}: {_FORMS}.")
        if _is_number(token) and int(token) > _LARGEST_DIM:
            raise SignatureError(
                f"{kernel}(): {where} is annotated {pattern!r}: dim {k} = {token} is past the largest size "
                f"a dim can have ({_LARGEST_DIM}, int64)."
            )
    if not isinstance(spec, MemRefSpec):
        raise SignatureError(f"{kernel}(): {where} is annotated {pattern!r} but is not a ranked memref or tensor.")
    if len(tokens) != spec.rank:
        raise SignatureError(
            f"{kernel}(): {where} is annotated {pattern!r}, {len(tokens)} dims, but its type {spec.mlir} "
            f"has {spec.rank}."
        )
    for k, (token, size) in enumerate(zip(tokens, spec.shape)):
        if _is_number(token) and size is not None and int(token) != size:
            raise SignatureError(
                f"{kernel}(): {where} is annotated {pattern!r}, dim {k} = {token}, but its type {spec.mlir} "
                f"fixes dim {k} to {size}."
            )
    return tokens


def named_rules(kernel: str, parameters: Sequence[inspect.Parameter], returned: Any,
                specs: Sequence[ArgSpec]) -> tuple[list[Tie], dict[int, tuple[str, ...]], tuple[Any, ...]]:
    """The ties the dim names of the Python signature put on the arguments, the names per argument,
    and the names of each output (None where the return annotation names none)."""
    names: dict[int, tuple[str, ...]] = {}
    for i, p in enumerate(parameters):
        pattern = _pattern(p.annotation)
        if isinstance(pattern, str):
            names[i] = _tokens(kernel, pattern, f"parameter '{p.name}'", specs[i])
        else:
            _refuse_form(kernel, f"parameter '{p.name}'", pattern)
    n_outputs = len(specs) - len(parameters)
    pattern = _pattern(returned)
    if not isinstance(pattern, (str, tuple)):
        _refuse_form(kernel, "the return", pattern)
    outputs: tuple[Any, ...] = (None,) * n_outputs
    if pattern is not inspect.Signature.empty and isinstance(pattern, (str, tuple)):
        patterns = (pattern,) if isinstance(pattern, str) else pattern
        if n_outputs == 0 or len(patterns) != n_outputs or not all(isinstance(x, str) for x in patterns):
            raise SignatureError(
                f"{kernel}(): the return annotation {pattern!r} must name the dims of the {n_outputs} output(s) "
                "the call allocates: a string for one, a tuple of strings for several."
            )
        outputs = tuple(_tokens(kernel, x, f"output {j}", specs[len(parameters) + j])
                        for j, x in enumerate(patterns))
        for j, tokens in enumerate(outputs):
            names[len(parameters) + j] = tokens
    ties: list[Tie] = []
    first: dict[str, Dim] = {}
    for arg, tokens in sorted(names.items()):
        for k, token in enumerate(tokens):
            here = Dim(arg, k)
            if token == "_":
                continue
            if _is_number(token):
                if isinstance(specs[arg], MemRefSpec) and specs[arg].shape[k] is None:  # type: ignore[union-attr]
                    ties.append(Tie(here, None, f"its annotation {' '.join(tokens)!r}", size=int(token)))
                continue
            if token in first:
                ties.append(Tie(first[token], here, token, named=True))
            else:
                first[token] = here
    return ties, names, outputs
