"""Checking the ``dense_resource`` blobs of a source against the types that use them, at decoration.

MLIR's parser takes a blob of any size; only lowering it to an LLVM global
finds that its bytes do not fill the type, at the first call. Reading the
blobs' sizes from the source text moves that error to decoration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from mlir import ir

from .diagnostics import source_position
from ..errors import MLIRSyntaxError
from ..model.dtypes import element_named

_BLOB = re.compile(r'([A-Za-z_][\w.$-]*)\s*:\s*"0x([0-9A-Fa-f]*)"')
"""A blob in the ``dialect_resources`` section: its name and its hex bytes (a 4-byte alignment, then the data)."""

_ALIGNMENT_BYTES = 4


def _operations(block: ir.Block) -> Iterator[ir.Operation]:
    for op in block.operations:
        yield op.operation
        for region in op.regions:
            for inner in region.blocks:
                yield from _operations(inner)


def _blob_sizes(text: str) -> dict[str, int]:
    section = text.find("{-#")
    return {found[1]: len(found[2]) // 2 - _ALIGNMENT_BYTES for found in _BLOB.finditer(text, max(section, 0))}


_USE = re.compile(r"dense_resource<([^>]+)>")


def _name_in_source(lines: list[str], where: tuple[int, int] | None) -> str | None:
    """The blob name the source gives at ``where``: the context renames a blob whose name another module of
    the process's context took already (``blob1_1``)."""
    if where is None or not 1 <= where[0] <= len(lines):
        return None
    found = _USE.search(lines[where[0] - 1])
    return found[1] if found else None


def check_resources(module: ir.Module, text: str) -> None:
    """MLIRSyntaxError, with the line and column of the use, if a ``dense_resource`` of the source has a blob
    whose data is not as many bytes as the type it is used as (a static shape of a numpy-mapped element type)."""
    if "dense_resource<" not in text or "{-#" not in text:
        return
    blobs = _blob_sizes(text)
    lines = text.splitlines()
    for op in _operations(module.body):
        attributes = op.attributes
        for index in range(len(attributes)):
            attribute = attributes[index].attr
            said = str(attribute)
            if not said.startswith("dense_resource<"):
                continue
            where = source_position(op.location)
            name = _name_in_source(lines, where) or said[len("dense_resource<"):said.index(">")]
            shaped = ir.ShapedType(attribute.type)
            element = element_named(str(shaped.element_type))
            if name not in blobs or element is None or element.mlir == "i1" or not shaped.has_static_shape:
                continue
            needed = math.prod(shaped.shape) * element.itemsize
            if blobs[name] != needed:
                at = f"{where[0]}:{where[1]}: " if where else ""
                raise MLIRSyntaxError(
                    f"the MLIR source does not fit its resources:\n  {at}error: dense_resource<{name}> is used as "
                    f"{attribute.type}, {needed} bytes, but its blob holds {blobs[name]} bytes after its "
                    f"{_ALIGNMENT_BYTES}-byte alignment. Give the blob \"0x\" + 8 hex digits of alignment + "
                    f"{2 * needed} hex digits of data."
                )
