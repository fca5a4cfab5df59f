"""Turning MLIR's diagnostics into text for exception messages.

MLIR reports through two channels: diagnostics attached to ``MLIRError`` (parse,
verify and pass failures), formatted here, and plain text on the C ``stderr``
stream (the ExecutionEngine and the JIT linker), which
:func:`memkernel.stdio.capture_c_stderr` collects. Both end up in memkernel's
exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence

from mlir import ir


def source_position(loc: ir.Location) -> tuple[int, int] | None:
    """The line and column in the source that ``loc`` points at, or None."""
    while loc.is_a_callsite():
        loc = loc.callee
    if loc.is_a_fused():
        for child in loc.locations:
            found = source_position(child)
            if found:
                return found
        return None
    if loc.is_a_name():
        return source_position(loc.child_loc)
    if loc.is_a_file():
        return loc.start_line, loc.start_col
    return None


def _format_one(diag: ir.DiagnosticInfo, lines: Sequence[str], indent: str) -> list[str]:
    where = source_position(diag.location)
    severity = str(diag.severity).rsplit(".", 1)[-1].lower()
    if where is None:
        out = [f"{indent}{severity}: {diag.message}"]
    else:
        line, col = where
        out = [f"{indent}{line}:{col}: {severity}: {diag.message}"]
        if 1 <= line <= len(lines):
            out.append(f"{indent}    {lines[line - 1]}")
            out.append(f"{indent}    {' ' * (col - 1)}^")
    for note in diag.notes:
        out.extend(_format_one(note, lines, indent + "  "))
    return out


def format_diagnostics(diagnostics: Sequence[ir.DiagnosticInfo], source: str) -> str:
    """Each diagnostic as ``line:col: severity: message`` with the source line it points at."""
    lines = source.splitlines()
    out: list[str] = []
    for diag in diagnostics:
        out.extend(_format_one(diag, lines, ""))
    return "\n".join(out)


LISTED_NAMES = 10
"""How many function names an error lists before it counts the rest."""


def function_list(names: Sequence[str]) -> str:
    """``@a, @b`` for the functions ``names``, the first :data:`LISTED_NAMES` of them and how many more; ``none``."""
    shown = ", ".join(f"@{name}" for name in names[:LISTED_NAMES]) or "none"
    more = len(names) - LISTED_NAMES
    return f"{shown} and {more} more" if more > 0 else shown
