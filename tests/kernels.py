"""MLIR text builders shared by the tests."""

from __future__ import annotations


def elementwise(op: str, memref: str, element: str, rank: int, *, n_inputs: int = 2, name: str = "k") -> str:
    """``func.func @name(inputs..., out)`` applying ``op`` (an arith op name) elementwise."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    identity = f"affine_map<({dims}) -> ({dims})>"
    maps = ", ".join([identity] * (n_inputs + 1))
    iterators = ", ".join(['"parallel"'] * rank)
    ins = ", ".join(f"%in{i}" for i in range(n_inputs))
    in_types = ", ".join([memref] * n_inputs)
    block_args = ", ".join(f"%x{i}: {element}" for i in range(n_inputs))
    operands = ", ".join(f"%x{i}" for i in range(n_inputs))
    params = ", ".join(f"%in{i}: {memref}" for i in range(n_inputs))
    return f"""
func.func @{name}({params}, %out: {memref}) {{
  linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iterators}]}}
      ins({ins} : {in_types}) outs(%out : {memref}) {{
  ^bb0({block_args}, %o: {element}):
    %r = {op} {operands} : {element}
    linalg.yield %r : {element}
  }}
  return
}}
"""
