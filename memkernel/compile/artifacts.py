"""``memkernel build``: compile every kernel a Python module defines into artifacts a package ships (see
:mod:`memkernel.load.artifacts`, which loads them where neither MLIR nor LLVM is installed)."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from ..errors import CompileError
from ..fastpath import abi
from ..kernel import Kernel, spec_digest
from ..load import artifacts
from ..load.cache import Entry
from ..load.objects import host_cpu
from . import requests, worker
from .fast_path import fast_path
from .requests import PipelineChoice


@dataclass(frozen=True)
class Built:
    """One kernel built: its name, the module it was decorated in, its key's digest, the shared object."""

    name: str
    module: str
    digest: str
    path: str


def target_requirements(target_cpu: str | None) -> tuple[str | None, str, list[str]]:
    """The LLVM CPU to compile for (None: the build host), the target's name in file names, and the CPU flags
    the code needs. CompileError for a CPU memkernel cannot say the requirements of."""
    if target_cpu is None:
        return None, host_cpu().split(";")[0], sorted(artifacts.host_flags() & artifacts.ISA_FLAGS)
    if target_cpu not in artifacts.LEVELS:
        raise CompileError(f"--target-cpu must be one of {', '.join(artifacts.LEVELS)} (the x86-64 psABI levels), "
                           f"or left out to build for this machine; got {target_cpu!r}")
    return target_cpu, target_cpu, sorted(artifacts.LEVELS[target_cpu])


def kernels_of(module_name: str) -> list[Kernel]:
    """The kernels module ``module_name`` defines at its top level (imported now)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CompileError(f"cannot import {module_name}: {exc}") from None
    found = [value for value in vars(module).values() if isinstance(value, Kernel)]
    return [k for k in found if getattr(k.function, "__module__", None) == module_name]


def linker() -> str:
    """The C compiler driver that links shared objects (``$CC``, else ``cc``); CompileError if there is none."""
    found = shutil.which(os.environ.get("CC", "cc"))
    if found is None:
        raise CompileError("memkernel build links each kernel into a shared object with the system's C compiler "
                           "driver ($CC, else cc), which is not installed: install gcc or clang (e.g. apt-get "
                           "install gcc), or set CC.")
    return found


def build_kernel(kernel: Kernel, out: str, target_cpu: str | None, manifest: dict[str, Any]) -> Built:
    """Compile ``kernel`` for ``target_cpu`` into ``out``, and describe it in ``manifest``."""
    options, spec, name = kernel.options, kernel.spec, kernel.spec.name
    why = ("it has callbacks (Python functions of the building process)" if options.callbacks else
           "it calls foreign code (memkernel.extern), whose library is a path on this machine" if spec.foreign else
           "parallel=True needs the MLIR async runtime, which is not installed where artifacts run"
           if options.parallel else None)
    if why is not None:
        raise CompileError(f"{name}(): memkernel build cannot build it: {why}.")
    cpu, target, requires = target_requirements(target_cpu)
    module = kernel.function.__module__
    key, digest = artifacts.artifact_key(kernel._artifact_fields())
    fast = fast_path(spec, spec.signature.results) if abi.fast_path_supported() else None
    made = worker.run(options.llvm_options, f"building @{name}", requests.object_code, options.source, name,
                      PipelineChoice.of(options), options.opt_level, tuple(kernel._shared_libs), fast, (), (), cpu)
    if made.initializers:
        raise CompileError(f"{name}(): memkernel build cannot build it: it has global constructors or destructors.")
    if made.externals and any(e.startswith(("_mlir_", "memref", "print")) for e in made.externals):
        raise CompileError(f"{name}(): memkernel build cannot build it: it calls {', '.join(made.externals)}, "
                           "from the MLIR runtime libraries, which are not installed where artifacts run.")
    path = os.path.join(out, f"{digest}.{target}.so")
    with tempfile.TemporaryDirectory(prefix="memkernel-build-") as folder:
        obj = os.path.join(folder, "kernel.o")
        with open(obj, "wb") as written:
            written.write(made.code)
        done = subprocess.run([linker(), "-shared", "-o", path + ".tmp", obj], capture_output=True, text=True)
        if done.returncode != 0:
            raise CompileError(f"{name}(): linking its shared object failed: {done.stderr.strip()}")
    os.replace(path + ".tmp", path)
    with open(path, "rb") as opened:
        sha256 = hashlib.sha256(opened.read()).hexdigest()
    entry = Entry(b"", (), fast.symbols if fast is not None and made.fast else None, True, made.guarded)
    described = manifest.setdefault(digest, artifacts.manifest_entry(key, kernel.kernel_ir, spec_digest(spec)))
    described["targets"][target] = artifacts.target_entry(entry, requires, sha256)
    return Built(name, module, digest, path)


def build(module_or_file: str, out: str | None = None, target_cpu: str | None = None) -> list[Built]:
    """Build every kernel of a Python module (a dotted name, or a ``.py`` file whose folder is put on the path)
    into ``out`` (default: ``_memkernel`` beside the module) for ``target_cpu``. Returns what was built.
    CompileError for a kernel that cannot be built or a folder that cannot be written."""
    name = module_or_file
    if module_or_file.endswith(".py"):
        folder, file = os.path.split(os.path.abspath(module_or_file))
        sys.path.insert(0, folder)
        name = file[:-3]
    kernels = kernels_of(name)
    if not kernels:
        raise CompileError(f"{module_or_file} defines no kernel at its top level (@mlir_kernel).")
    module_file = sys.modules[name].__file__ or ""
    out = out or os.path.join(os.path.dirname(os.path.abspath(module_file)), artifacts.FOLDER)
    try:
        os.makedirs(out, exist_ok=True)
        manifest = artifacts.read_manifest(out)
        built = [build_kernel(kernel, out, target_cpu, manifest) for kernel in kernels]
        text = json.dumps({"format": artifacts.FORMAT, "kernels": manifest}, indent=1, sort_keys=True)
        with open(os.path.join(out, artifacts.MANIFEST + ".tmp"), "w") as written:
            written.write(text)
        os.replace(os.path.join(out, artifacts.MANIFEST + ".tmp"), os.path.join(out, artifacts.MANIFEST))
    except OSError as exc:
        raise CompileError(f"cannot write the artifacts into {out}: {exc.strerror or exc}"
                           f"{f' ({exc.filename})' if exc.filename and exc.filename != out else ''}") from None
    return built
