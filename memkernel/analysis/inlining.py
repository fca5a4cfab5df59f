"""A kernel's function as the shape rules read it: with the functions it calls inlined, named ops generalized.

A kernel whose work is done by a function it calls (``call @helper(%a, %b,
%out)``, and ``@helper``'s ``linalg.add``) asks of its arguments what the
callee asks of its own. The shape rules read a copy of the module in which
MLIR's inliner has put every callee's body in place of each call to it (a call
passed an argument's view is then an op on that view), and where linalg's named
ops are generalized, so that every structured op shows its indexing maps.

The inliner leaves a recursive call, and a call of a function of several blocks
from a region that takes one (an ``scf.for`` body); the shape rules then read the
callee on its own and carry its rules over to what the call passes
(:func:`memkernel.analysis.shapes.ir_rules`). A call of a function only declared,
such as a callback, is not followed.

Messages name the function an op was written in and its name before
generalizing (``@helper's linalg.add``): an inlined op's location is a
call-site location whose innermost callee is the op's location in its callee.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from mlir import ir, passmanager

from .ir_callbacks import walk

_INLINE = "builtin.module(inline{default-pipeline=''})"
"""Inline without the canonicalization the inliner runs by default, which would change what is analysed."""

_GENERALIZE = "builtin.module(func.func(linalg-generalize-named-ops))"

Origin = Callable[[ir.Operation], str]
"""Where an op was written, for messages (:meth:`Inlined.origin`)."""


class Inlined:
    """The copy of a module the shape rules read, and where each of its ops was written.

    ``before_generalizing`` is called with the function, calls inlined, before named ops are generalized, and
    with :meth:`origin`: generalizing folds a ``memref.cast`` into the linalg ops that use it, and with it the
    static sizes it casts to.
    """

    def __init__(self, module: ir.Module, function: str,
                 before_generalizing: Callable[[ir.Operation, Origin], None] | None = None) -> None:
        self.kernel = function
        self._written_in = _functions_by_location(module.operation)
        self.copy = module.operation.clone()
        target = _function(self.copy, function)
        if "sym_visibility" in target.attributes:
            del target.attributes["sym_visibility"]  # a private kernel must outlive the inliner's clean-up
        passmanager.PassManager.parse(_INLINE, module.context).run(self.copy)
        self._names = structured_names(self.copy)
        if before_generalizing is not None:
            before_generalizing(_function(self.copy, function), self.origin)
        passmanager.PassManager.parse(_GENERALIZE, module.context).run(self.copy)
        self.function = _function(self.copy, function)

    def origin(self, op: ir.Operation) -> str:
        """Where ``op`` was written, for messages: ``@helper's linalg.add``."""
        name = self._names.get(str(op.location), op.name)
        location = op.location
        while location.is_a_callsite():
            location = location.callee
        functions = self._written_in.get(str(location), set())
        function = next(iter(functions)) if len(functions) == 1 else self.kernel
        return f"@{function}'s {name}"


def defined_function(module: ir.Operation, name: str) -> ir.Operation | None:
    """The ``func.func @name`` of ``module`` with a body; None if it has none (a declaration) or no such one."""
    for op in module.regions[0].blocks[0].operations:
        function = op.operation
        if (function.name == "func.func" and ir.StringAttr(function.attributes["sym_name"]).value == name
                and len(function.regions[0].blocks) > 0):
            return function
    return None


def _function(module: ir.Operation, name: str) -> ir.Operation:
    function = defined_function(module, name)
    if function is None:
        raise LookupError(f"no func.func @{name} with a body")
    return function


def _functions_by_location(module: ir.Operation) -> dict[str, set[str]]:
    """The functions whose ops have each location of ``module``."""
    found: dict[str, set[str]] = defaultdict(set)
    for top in module.regions[0].blocks[0].operations:
        function = top.operation
        if function.name != "func.func":
            continue
        name = ir.StringAttr(function.attributes["sym_name"]).value

        def visit(op: ir.Operation, name: str = name) -> ir.WalkResult:
            found[str(op.location)].add(name)
            return ir.WalkResult.ADVANCE

        walk(function, visit)
    return found


def structured_names(module: ir.Module | ir.Operation) -> dict[str, str]:
    """The linalg ops of ``module`` by location: what a generalized op was called before."""
    names: dict[str, str] = {}
    if isinstance(module, ir.Module):
        module = module.operation

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name.startswith("linalg."):
            names.setdefault(str(op.location), op.name)
        return ir.WalkResult.ADVANCE

    walk(module, visit, ir.WalkOrder.PRE_ORDER)
    return names
