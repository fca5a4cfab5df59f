"""What a compiled kernel is made of, as the disk cache and built artifacts keep it: an :class:`Entry`, its
fast path symbols as JSON data, and the digest of memkernel's own code that their keys hold. Kept apart from
:mod:`memkernel.load.cache`, so that a built kernel loads without the disk cache's machinery."""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ..errors import MissingDependencyError
from ..fastpath.symbols import FastSymbols
from ..model.dtypes import dtype_named


@functools.lru_cache(maxsize=None)
def code_digest(package: str | os.PathLike[str] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) -> str:
    """A digest of memkernel's own source files (those of ``package``): an entry made by other memkernel
    code is never loaded. Read once per process, with ``os.scandir`` (``pathlib``'s globbing cost more than
    the reading and hashing)."""
    found: list[tuple[tuple[str, ...], str]] = []
    folders: list[tuple[str, tuple[str, ...]]] = [(os.fspath(package), ())]
    while folders:
        folder, parts = folders.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        folders.append((entry.path, (*parts, entry.name)))
                elif entry.name.endswith((".py", ".mlir")):
                    found.append(((*parts, entry.name), entry.path))
    digest = hashlib.sha256()
    for parts, path in sorted(found):
        with open(path, "rb") as opened:
            digest.update("/".join(parts).encode() + b"\0" + opened.read())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    """A disk cache entry: the object code, the libraries it links against, its fast path's
    symbols (None when it has none), whether it may print, whether its failed assertions and allocations
    return to a guard (see :mod:`memkernel.compile.guard`), and whether it has global constructors or
    destructors to run (see :mod:`memkernel.compile.initializers`)."""

    code: bytes
    libraries: tuple[str, ...]
    fast: FastSymbols | None
    may_print: bool
    guarded: bool = False
    initializers: bool = False


def symbols_data(symbols: FastSymbols | None) -> dict[str, Any] | None:
    """The fast path symbols as a header's JSON data (None for none)."""
    if symbols is None:
        return None
    return {"function": symbols.function, "consts": symbols.consts, "entry": symbols.entry,
            "dtypes": [d.name for d in symbols.dtypes]}


def symbols_from_data(data: Any) -> FastSymbols | None:
    """The fast path symbols of a header; None for none, and for anything malformed (the entry then binds
    no fast path, and calls take the checked path)."""
    try:
        return FastSymbols(str(data["function"]), str(data["consts"]),
                           tuple(dtype_named(name) for name in data["dtypes"]),
                           None if data["entry"] is None else str(data["entry"]))
    except (TypeError, KeyError, ValueError, MissingDependencyError):
        return None
