"""Kernels built ahead of time by ``memkernel build``, shipped as package data, loaded without LLVM.

A package's artifacts live in a folder ``_memkernel`` beside the module that
decorates the kernels (or in a folder of ``$MEMKERNEL_ARTIFACTS``, separated by
``os.pathsep``): a ``manifest.json`` and one shared object per kernel and target
CPU. The manifest maps each kernel's key (:func:`artifact_key`: the source, the
function, the options that decide its code, the memkernel, Python and numpy
versions; never the build host) to what decoration read of its IR, the target
it was built for, its symbols and the SHA-256 of its shared object.

Loading verifies the artifact as the disk cache verifies its entries: the
manifest's key fields must equal the key asked for, and the shared object's
digest the manifest's, or the artifact is not used. An artifact for a CPU whose
features the host lacks is refused (:class:`ArtifactError`), never run. The
shared object is opened with ``dlopen``: no LLVM, no linker.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CompileError
from ..model import codec
from ..model.kernel_spec import KernelIR
from .entry import Entry, code_digest, symbols_data, symbols_from_data
from .compiled import CompiledFunction, bind_function
from .files import NotRegularFile, read_regular

FOLDER = "_memkernel"
"""The folder, beside the decorating module, that ``memkernel build`` writes by default."""

MANIFEST = "manifest.json"
ENVIRONMENT = "MEMKERNEL_ARTIFACTS"
FORMAT = 1

LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64": ("cmov", "cx8", "fpu", "fxsr", "mmx", "syscall", "sse", "sse2"),
}
LEVELS["x86-64-v2"] = LEVELS["x86-64"] + ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")
LEVELS["x86-64-v3"] = LEVELS["x86-64-v2"] + ("abm", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")
LEVELS["x86-64-v4"] = LEVELS["x86-64-v3"] + ("avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl")
"""The x86-64 psABI levels ``--target-cpu`` builds for, as the ``/proc/cpuinfo`` flags they need."""

ISA_FLAGS = frozenset(LEVELS["x86-64-v4"]) | {
    "aes", "pclmulqdq", "sha_ni", "adx", "rdrand", "rdseed", "avx512vnni", "avx512_vnni", "avx512ifma",
    "avx512vbmi", "avx512_vbmi2", "avx512_bitalg", "avx512_vpopcntdq", "avx512_bf16", "avx512_fp16", "avx_vnni",
    "gfni", "vaes", "vpclmulqdq", "amx_tile", "amx_int8", "amx_bf16", "clflushopt", "clwb", "prfchw", "xsavec",
    "xsaveopt", "xsaves", "fsgsbase", "invpcid", "lzcnt", "popcnt"}
"""The CPU flags compiled code may use: what a build for the build host requires of the machine that runs it."""


class ArtifactError(CompileError):
    """A built artifact that exists for a kernel but cannot run here (a CPU the host lacks)."""


@functools.lru_cache(maxsize=None)
def host_flags() -> frozenset[str]:
    """The host CPU's flags, from ``/proc/cpuinfo`` (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def artifact_key(fields: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The key of an artifact of a kernel with ``fields`` (source digest, function, pipeline fields), and its
    digest: the fields plus the memkernel, Python and numpy versions it runs with."""
    version = getattr(sys.modules.get("memkernel"), "__version__", "absent")
    complete = {**fields, "memkernel": f"{version}+{code_digest()}",
                "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
                "numpy": np.__version__.split(".")[0]}
    text = json.dumps(complete, sort_keys=True, separators=(",", ":"))
    return json.loads(text), hashlib.sha256(text.encode()).hexdigest()


def folders(module: str | None) -> list[str]:
    """Where the artifacts of kernels decorated in ``module`` may be: ``$MEMKERNEL_ARTIFACTS``, then the
    ``_memkernel`` folder beside the module's file."""
    found = [f for f in os.environ.get(ENVIRONMENT, "").split(os.pathsep) if f]
    file = getattr(sys.modules.get(module or ""), "__file__", None)
    if file:
        found.append(os.path.join(os.path.dirname(os.path.abspath(file)), FOLDER))
    return found


def read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of ``folder``'s artifacts; empty when it has none or it does not parse. ArtifactError for
    a manifest that is not a regular file (a FIFO, a device: never opened blocking, never read)."""
    path = os.path.join(folder, MANIFEST)
    try:
        manifest = json.loads(read_regular(path))
    except NotRegularFile as exc:
        raise ArtifactError(f"the artifacts' manifest {path} cannot be read: {exc}. Rebuild it with memkernel "
                            "build, or remove it.") from None
    except (OSError, ValueError):
        return {}
    ok = isinstance(manifest, dict) and manifest.get("format") == FORMAT and isinstance(manifest.get("kernels"), dict)
    return manifest["kernels"] if ok else {}


@dataclass(frozen=True)
class Artifact:
    """One kernel's built code for one target, as its manifest describes it, verified."""

    kernel_ir: KernelIR
    spec: str
    target: str
    path: str
    entry: Entry
    sha256: str

    def load(self) -> CompiledFunction:
        """The kernel's code, opened with ``dlopen``; ArtifactError if its file is missing, is not a regular
        file, or no longer verifies against the manifest's digest."""
        name = self.kernel_ir.name
        try:
            data = read_regular(self.path)
        except OSError as exc:
            missing = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc}"
            raise ArtifactError(f"{name}(): its built artifact {self.path}, which the manifest lists, {missing}. "
                                "Reinstall the package, or rebuild its kernels with memkernel build.") from None
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise ArtifactError(f"{name}(): the artifact {self.path} does not match its manifest "
                                "(edited or replaced after memkernel build): rebuild it with memkernel build.")
        return bind_function(SharedObject(self.path), self.entry, name)


def find(module: str | None, fields: dict[str, Any], kernel: str) -> tuple[Artifact | None, str]:
    """The artifact of the kernel with key ``fields`` decorated in ``module`` that this host can run, if some
    folder holds one, and the key's digest. ArtifactError if artifacts exist only for CPUs the host lacks."""
    key, digest = artifact_key(fields)
    refused = []
    for folder in folders(module):
        try:
            described = read_manifest(folder).get(digest)
        except ArtifactError as exc:
            raise ArtifactError(f"{kernel}(): {exc}") from None
        if not isinstance(described, dict) or described.get("key") != key:
            continue
        try:
            kernel_ir = codec.loads(json.dumps(described["decoration"]).encode())
        except (codec.CodecError, KeyError, ValueError):
            continue
        for target, built in sorted(described.get("targets", {}).items()):
            missing = sorted(set(built.get("requires", ())) - host_flags())
            if missing:
                refused.append(f"{target} (needs {', '.join(missing)})")
                continue
            entry = Entry(b"", (), symbols_from_data(built.get("fast")), bool(built.get("may_print", True)),
                          bool(built.get("guarded")), False)
            path = os.path.join(folder, f"{digest}.{target}.so")
            return Artifact(kernel_ir, str(described.get("spec")), target, path, entry,
                            str(built.get("sha256"))), digest
    if refused:
        raise ArtifactError(f"{kernel}(): its built artifacts are for CPUs this host is not: {'; '.join(refused)}. "
                            "Rebuild with memkernel build --target-cpu x86-64-v2 (or another level this host has).")
    return None, digest


def manifest_entry(key: dict[str, Any], kernel_ir: KernelIR, spec: str) -> dict[str, Any]:
    """The manifest's description of a kernel, before its targets are added."""
    return {"key": key, "decoration": json.loads(codec.dumps(kernel_ir)), "spec": spec, "targets": {}}


def target_entry(entry: Entry, requires: list[str], sha256: str) -> dict[str, Any]:
    """The manifest's description of a kernel's build for one target."""
    return {"fast": symbols_data(entry.fast), "may_print": entry.may_print, "guarded": entry.guarded,
            "requires": requires, "sha256": sha256}


class SharedObject:
    """Compiled code opened with ``dlopen``: it stays loaded for the life of the process."""

    def __init__(self, path: str) -> None:
        self._library = ctypes.CDLL(path)

    def symbol(self, name: str) -> int:
        """Address of ``name``; CompileError if the shared object does not define it."""
        try:
            return ctypes.cast(getattr(self._library, name), ctypes.c_void_p).value or 0
        except AttributeError:
            raise CompileError(f"the artifact {self._library._name} does not define {name}") from None

    def at_release(self, function: Callable[[], object]) -> None:
        """Nothing to do: the code is never unloaded."""
