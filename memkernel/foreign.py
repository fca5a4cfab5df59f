"""``@memkernel.extern``: call a function another toolchain compiled, checked against a declared MLIR signature.

The library is a shared object (``dlopen``) or a relocatable object file (linked
by the JIT linker that links memkernel's own kernels, see
:mod:`memkernel.load.foreign`). memkernel makes a kernel of the declared
signature that calls the foreign function, so every check of
:func:`~memkernel.mlir_kernel` applies, the fast path serves the calls, and
``isolate=True`` runs them in a worker process.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .errors import CompileError, OptionError
from .kernel import Kernel, _needs_compiler
from .model.foreign import CONVENTIONS
from .options import KernelOptions

EXTERN_OPTIONS = ("opt_level", "cache", "capture_output", "isolate", "timeout", "checked")
"""The options of :func:`~memkernel.mlir_kernel` that :func:`extern` takes too."""


def extern(library: str | os.PathLike[str], declaration: str, *, abi: str | None = None,
           **options: Any) -> Callable[[Callable[..., Any]], Kernel]:
    """Turn a Python function into a checked call of ``@<name>`` of ``library``, declared in MLIR.

    ``declaration`` is one ``func.func`` declaration, such as
    ``"func.func private @scale(%a: memref<?xf32> {memkernel.read_only}, %s: f32, %o: memref<?xf32>)"``.
    The Python function names the leading arguments and shapes the outputs, as
    with :func:`~memkernel.mlir_kernel`. There is no IR to read, so every memref
    argument counts as written (copied back when it had to be copied) unless it
    is marked ``{memkernel.read_only}``, and dims are tied only by the names the
    Python annotations give them.

    ``library`` is a shared object or a relocatable object file. ``abi`` is
    ``"ciface"`` (``_mlir_ciface_<name>``: descriptors by pointer, a memref result
    through a pointer passed first), ``"expanded"`` (``func-to-llvm``'s: each memref
    as allocated, aligned, offset, sizes..., strides...), or None (the default):
    ``"ciface"`` when the library defines ``_mlir_ciface_<name>``, else ``"expanded"``.
    ``options`` are those of :func:`~memkernel.mlir_kernel` in :data:`EXTERN_OPTIONS`.

    Decoration reads the declaration with the MLIR bindings. Raises
    MLIRSyntaxError for a declaration that does not parse, SignatureError for one
    memkernel cannot call, CompileError for a library that does not load or lacks
    the symbol, OptionError for an unknown option or ``abi``, or a library that is not a path.
    """
    unknown = sorted(set(options) - set(EXTERN_OPTIONS))
    if unknown:
        raise OptionError(f"memkernel.extern() got an unexpected keyword argument {unknown[0]!r}; it takes abi, "
                          f"{', '.join(EXTERN_OPTIONS)}")
    if abi is not None and abi not in CONVENTIONS:
        raise OptionError(f"memkernel.extern(): abi must be None (the C interface where the library has it) or one "
                          f"of {', '.join(map(repr, CONVENTIONS))}; got {abi!r}")
    if not isinstance(library, (str, os.PathLike)):
        raise OptionError(f"memkernel.extern(): the library must be the path (a str or os.PathLike) of a shared "
                          f"object or an object file; got {type(library).__name__} {library!r}")
    if not isinstance(declaration, str):
        raise OptionError(f"memkernel.extern(): the declaration must be MLIR text (a str), got "
                          f"{type(declaration).__name__}")
    with _needs_compiler(None, "reading an extern declaration"):
        from .compile.foreign import kernel_source, read_declaration
    from .load import foreign as loaded

    declared = read_declaration(declaration)
    name = declared.name
    path = loaded.library(library, name)
    ciface_symbol = f"_mlir_ciface_{name}"
    ciface = abi == "ciface" or (abi is None and loaded.defines(path, ciface_symbol, name))
    symbol = ciface_symbol if ciface else name
    if not loaded.defines(path, symbol, name):
        looked = symbol if abi is not None else f"{ciface_symbol} (the C interface) nor {name} (expanded)"
        raise CompileError(f"{name}(): the library {path} defines neither {looked}."
                           if abi is None else f"{name}(): the library {path} does not define {looked} "
                           f"(abi={abi!r}).")
    made = KernelOptions(kernel_source(declared, path, symbol, ciface), name=name, **options)

    def decorate(function: Callable[..., Any]) -> Kernel:
        return Kernel(function, made)

    return decorate
