"""The runtime layer needs no compiler: ``import memkernel`` loads no MLIR, and a kernel the disk cache holds
is decorated and called without importing the compiler, even where the MLIR bindings cannot be imported."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memkernel
from .kernels import elementwise

SOURCE = elementwise("arith.addf", "memref<?xf32>", "f32", 1, name="add")

PATH = "checked" if os.environ.get("MEMKERNEL_FAST_PATH") == "0" else "fast"
"""The path a valid call takes: the compiled fast path, unless the environment switches it off."""

PROGRAM = textwrap.dedent("""
    import sys
    if sys.argv[1] == "no-mlir":
        sys.modules["mlir"] = None  # the MLIR bindings cannot be imported
    import numpy as np
    import memkernel
    def compiler_modules():
        return sorted(m for m, module in sys.modules.items() if module is not None and (
            m == "mlir" or m.startswith(("mlir.", "memkernel.compile", "memkernel.analysis"))))
    after_import = compiler_modules()
    add = memkernel.mlir_kernel(open(sys.argv[2]).read())(lambda a, b: None)
    a, b = np.arange(5, dtype=np.float32), np.full(5, 0.5, np.float32)
    assert np.array_equal(add(a, b), a + b), add(a, b)
    path = add.invoker.last_path
    try:
        add(a, b[:4])
    except memkernel.ShapeError as exc:
        shape_error = str(exc)
    loaded = compiler_modules()
    print(after_import, loaded, path, shape_error, sep="\\n")
""")


def _run(mode: str, source_file: str, cache: str) -> list[str]:
    environment = {**os.environ, "MEMKERNEL_CACHE_DIR": cache}
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode, source_file], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def source_file(tmp_path):
    path = tmp_path / "add.mlir"
    path.write_text(SOURCE)
    return str(path)


PACKAGE = Path(memkernel.__file__).parent

RUNTIME_FOLDERS = ("model", "call", "fastpath", "load", "isolate", "ufunc", "testing")
"""The runtime layer's folders; with them, every module at the package's top but those below."""

COMPILER_SIDE = {
    "cli.py": "the command line reads and compiles sources",
    "dask.py": "chunking reads the kernel's IR at apply()",
    "chunk_offsets.py": "rewrites a source's linalg.index for dask.py",
}
"""The top-level modules that read or compile MLIR, and why; a cached kernel's call never imports them."""

COMPILER_MODULES = ("mlir", "memkernel.compile", "memkernel.analysis")


def _runtime_modules() -> list[Path]:
    top = [path for path in PACKAGE.glob("*.py") if path.name not in COMPILER_SIDE]
    return sorted(top + [path for folder in RUNTIME_FOLDERS for path in (PACKAGE / folder).glob("*.py")])


def _imported_at_load(path: Path) -> list[tuple[int, str]]:
    """The modules ``path`` imports when it is loaded (function bodies and ``if TYPE_CHECKING:`` left out),
    relative imports resolved against the package, with their lines."""
    package = ["memkernel", *path.relative_to(PACKAGE).parent.parts]
    found = []
    pending = list(ast.parse(path.read_text(), str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] if node.level else [])
            module = ".".join(part for part in (base, node.module or "") if part)
            names = [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names]
        pending.extend(ast.iter_child_nodes(node))
    return found


def test_the_layer_lists_name_what_exists():
    missing = [name for name in COMPILER_SIDE if not (PACKAGE / name).is_file()]
    missing += [folder for folder in RUNTIME_FOLDERS if not list((PACKAGE / folder).glob("*.py"))]
    assert missing == []


def test_no_runtime_module_imports_mlir_or_the_compiler_when_loaded():
    offending = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
                 for path in _runtime_modules() for line, name in _imported_at_load(path)
                 if name == "mlir" or name.startswith(tuple(f"{module}." for module in COMPILER_MODULES))
                 or name in COMPILER_MODULES]
    assert offending == [], "import these inside the function that compiles:\n" + "\n".join(offending)


def test_import_memkernel_loads_neither_mlir_nor_the_compiler():
    done = subprocess.run([sys.executable, "-c", "import sys, memkernel; print(sorted(m for m in sys.modules if "
                           "m == 'mlir' or m.startswith(('mlir.', 'memkernel.compile', 'memkernel.analysis'))))"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_cached_kernel_is_decorated_and_called_without_the_compiler(source_file, tmp_path):
    cache = str(tmp_path / "cache")
    first = _run("with-mlir", source_file, cache)
    assert first[0] == "[]"
    # Nothing was cached: the compile worker read and compiled the kernel; this process asked it to and linked the
    # code, without importing MLIR itself (memkernel.compile.requests).
    assert "'memkernel.compile.requests'" in first[1] and "'mlir'" not in first[1]
    after_import, loaded, path, shape_error = _run("with-mlir", source_file, cache)
    assert (after_import, loaded, path) == ("[]", "[]", PATH)
    assert "a has 5 elements on dim 0 but b has 4 on dim 0" in shape_error


def test_a_cached_kernel_runs_where_the_mlir_bindings_cannot_be_imported(source_file, tmp_path):
    cache = str(tmp_path / "cache")
    _run("with-mlir", source_file, cache)
    after_import, loaded, path, shape_error = _run("no-mlir", source_file, cache)
    assert (after_import, loaded, path) == ("[]", "[]", PATH)
    assert "a has 5 elements on dim 0 but b has 4 on dim 0" in shape_error


def test_an_uncached_kernel_without_the_mlir_bindings_is_a_missing_dependency_error(source_file, tmp_path):
    program = textwrap.dedent("""
        import sys
        sys.modules["mlir"] = None
        import memkernel
        try:
            memkernel.mlir_kernel(open(sys.argv[1]).read())(lambda a, b: None)
        except memkernel.MissingDependencyError as exc:
            assert isinstance(exc, ImportError)
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", program, source_file], capture_output=True, text=True,
                          env={**os.environ, "MEMKERNEL_CACHE_DIR": str(tmp_path / "empty")}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "needs memkernel's compiler and the MLIR Python bindings" in done.stdout
    assert "pip install memkernel" in done.stdout


def test_an_edited_decoration_entry_is_read_afresh_never_trusted(source_file, tmp_path):
    cache = tmp_path / "cache"
    _run("with-mlir", source_file, str(cache))
    (entry,) = [name for name in os.listdir(cache) if name.endswith(".mks")]
    data = bytearray((cache / entry).read_bytes())
    at = data.index(b'"mlir":"memref<?xf32>"')
    data[at:at + len(b'"mlir":"memref<?xf32>"')] = b'"mlir":"memref<?xf64>"'  # same length, tag now wrong
    (cache / entry).write_bytes(bytes(data))
    after_import, loaded, path, shape_error = _run("with-mlir", source_file, str(cache))
    assert "memkernel.compile.reading" in loaded  # the entry did not verify: the source was read again
    assert path == PATH
