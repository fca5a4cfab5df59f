"""A module's global constructors and destructors (``llvm.mlir.global_ctors`` / ``global_dtors``).

LLVM puts them in the object's init and fini arrays, which nothing runs when
memkernel links the object itself (see :mod:`memkernel.load.objects`);
the compile worker's ExecutionEngine would instead run the destructors there,
when it is freed. So, once the module is lowered, :func:`gather` replaces the
two lists by two functions of the module, :data:`CONSTRUCTORS` and
:data:`DESTRUCTORS`, that call them in LLVM's order: constructors by ascending
priority, destructors by descending priority (as LLVM's and MLIR's documentation
say; mlir-runner's ORC runs them by ascending priority), functions of one priority in
the order the list gives them. The process that loads the code runs the
constructors once per load, before the first call, and the destructors once,
when the code is released or the interpreter exits (see
:mod:`memkernel.load.initializers`).
"""

from __future__ import annotations

from mlir import ir

from ..load.initializers import CONSTRUCTORS, DESTRUCTORS

_LISTS = {"llvm.mlir.global_ctors": "ctors", "llvm.mlir.global_dtors": "dtors"}


def _runner(name: str, callees: list[str]) -> str:
    calls = "".join(f'  llvm.call @"{callee}"() : () -> ()\n' for callee in callees)
    return f'llvm.func @{name}() {{\n{calls}  llvm.return\n}}\n'


def gather(module: ir.Module) -> bool:
    """Replace the lowered ``module``'s constructor and destructor lists by :data:`CONSTRUCTORS` and
    :data:`DESTRUCTORS`, in place; whether it had either list."""
    found: dict[str, list[tuple[int, str]]] = {"ctors": [], "dtors": []}
    for op in list(module.body.operations):
        op = op.operation
        kind = _LISTS.get(op.name)
        if kind is None:
            continue
        functions = [ir.FlatSymbolRefAttr(f).value for f in ir.ArrayAttr(op.attributes[kind])]
        priorities = [ir.IntegerAttr(p).value for p in ir.ArrayAttr(op.attributes["priorities"])]
        found[kind] += zip(priorities, functions)
        op.erase()
    if not found["ctors"] and not found["dtors"]:
        return False
    constructors = [f for _, f in sorted(found["ctors"], key=lambda entry: entry[0])]
    destructors = [f for _, f in sorted(found["dtors"], key=lambda entry: -entry[0])]
    declared = dict.fromkeys(constructors + destructors)
    declarations = "".join(f'llvm.func @"{callee}"()\n' for callee in declared)  # parsed beside the runners
    text = declarations + _runner(CONSTRUCTORS, constructors) + _runner(DESTRUCTORS, destructors)
    parsed = ir.Module.parse(text, module.context)
    for op in list(parsed.body.operations)[len(declared):]:
        module.body.append(op.detach_from_parent())
    return True
