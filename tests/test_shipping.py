"""``memkernel build``: a package's kernels built ahead of time, shipped as package data, and called where the
MLIR bindings (and LLVM) are not installed, with every check and the fast path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from memkernel.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PACKAGE = '''
"""Two kernels, built by memkernel build and shipped in _memkernel/."""
from memkernel import mlir_kernel

@mlir_kernel("""
func.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  linalg.add ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}""")
def add(a, b): ...

@mlir_kernel("""
func.func @matmul(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  return
}""", pipeline="fast")
def matmul(a, b): ...

subtract = mlir_kernel("""
func.func @subtract(%a: memref<?xf32>, %b: memref<?xf32>, %o: memref<?xf32>) {
  linalg.sub ins(%a, %b : memref<?xf32>, memref<?xf32>) outs(%o : memref<?xf32>)
  return
}""")(lambda a, b: None)
'''

PYPROJECT = '''
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "shipped"
version = "0.1.0"
dependencies = ["memkernel-runtime"]

[tool.setuptools]
packages = ["shipped"]

[tool.setuptools.package-data]
shipped = ["_memkernel/*"]
'''

CALLER = textwrap.dedent("""
    import sys, time
    if "no-mlir" in sys.argv:
        sys.modules["mlir"] = None
    if "no-llvm" in sys.argv:  # neither the MLIR bindings nor libLLVM: the runtime-only install
        sys.modules["mlir"] = sys.modules["llvm"] = None
    started = time.perf_counter()
    import numpy as np
    numpy_imported = time.perf_counter()
    import shipped
    a = np.arange(5, dtype=np.float32)
    added = shipped.add(a, a)
    first_call = time.perf_counter()
    assert np.array_equal(added, a + a), added
    x = np.random.default_rng(0).standard_normal((37, 19)).astype(np.float32)
    y = np.random.default_rng(1).standard_normal((19, 23)).astype(np.float32)
    assert np.allclose(shipped.matmul(x, y), x @ y, rtol=1e-5, atol=1e-5)
    assert np.array_equal(shipped.subtract(a, a[::-1]), a - a[::-1])
    path = shipped.matmul.invoker.last_path
    import memkernel
    try:
        shipped.add(a, a[:4])
        shape_error = "none"
    except memkernel.ShapeError as exc:
        shape_error = str(exc)
    print("mlir" in sys.modules and sys.modules["mlir"] is not None, path, shape_error, sep="\\n")
    print(1000 * (first_call - numpy_imported))
""")


def _package(folder):
    os.makedirs(folder / "shipped")
    (folder / "shipped" / "__init__.py").write_text(PACKAGE)
    (folder / "pyproject.toml").write_text(PYPROJECT)


def _build(folder, *arguments):
    return subprocess.run([sys.executable, "-m", "memkernel", "build", "shipped", *arguments], cwd=folder,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{folder}"}, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("package")
    _package(folder)
    done = _build(folder, "--target-cpu", "x86-64-v2")
    assert done.returncode == 0, done.stderr
    return folder


def _call(folder, *arguments, env=None, timeout=300):
    return subprocess.run([sys.executable, "-c", CALLER, *arguments], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{folder}", "MEMKERNEL_CACHE_DIR": "",
                               **(env or {})}, timeout=timeout)


def test_build_writes_a_manifest_and_one_shared_object_per_kernel(built):
    files = sorted(os.listdir(built / "shipped" / "_memkernel"))
    assert "manifest.json" in files
    assert len([f for f in files if f.endswith(".x86-64-v2.so")]) == 3


def test_built_kernels_run_where_mlir_cannot_be_imported(built):
    done = _call(built, "no-mlir")
    assert done.returncode == 0, done.stderr
    mlir_loaded, path, shape_error, _ = done.stdout.splitlines()
    assert mlir_loaded == "False"
    assert path == ("checked" if os.environ.get("MEMKERNEL_FAST_PATH") == "0" else "fast")
    assert "a has 5 elements on dim 0 but b has 4 on dim 0" in shape_error


def test_an_artifact_for_a_cpu_the_host_lacks_is_refused(built, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(built), str(copy)], check=True)
    manifest_path = copy / "shipped" / "_memkernel" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for kernel in manifest["kernels"].values():
        for target in kernel["targets"].values():
            target["requires"].append("no_such_flag")
    manifest_path.write_text(json.dumps(manifest))
    done = _call(copy, "no-mlir")
    assert done.returncode != 0
    assert "its built artifacts are for CPUs this host is not: x86-64-v2 (needs no_such_flag)" in done.stderr


def test_an_edited_artifact_is_refused_never_run(built, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(built), str(copy)], check=True)
    for name in os.listdir(copy / "shipped" / "_memkernel"):
        if name.endswith(".so"):
            with open(copy / "shipped" / "_memkernel" / name, "ab") as so:
                so.write(b"\0")
    done = _call(copy, "no-mlir")
    assert done.returncode != 0
    assert "does not match its manifest" in done.stderr


def test_a_kernel_without_artifact_where_mlir_is_missing_names_memkernel_build_and_the_key(tmp_path):
    _package(tmp_path)
    done = _call(tmp_path, "no-mlir")
    assert done.returncode != 0
    assert "MissingDependencyError" in done.stderr
    assert "memkernel build" in done.stderr and "no built artifact has this kernel's key " in done.stderr


@pytest.mark.parametrize("mode", ["no-mlir", "no-llvm"])
def test_built_kernels_run_where_neither_mlir_nor_libllvm_can_be_loaded(built, mode):
    done = _call(built, mode)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "False"


def test_a_kernel_without_artifact_where_libllvm_is_missing_is_a_missing_dependency_error(tmp_path):
    _package(tmp_path)
    done = _call(tmp_path, "no-llvm")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("memkernel.errors.MissingDependencyError: add(): loading compiled code from the compile "
                           "worker or the disk cache needs LLVM's JIT, and libLLVM cannot be loaded here"), last
    assert "memkernel build: no built artifact has this kernel's key " in last


def _copy(built, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(built), str(copy)], check=True)
    return copy, copy / "shipped" / "_memkernel"


def test_a_missing_artifact_is_an_artifact_error_naming_it(built, tmp_path):
    copy, folder = _copy(built, tmp_path)
    for name in os.listdir(folder):
        if name.endswith(".so"):
            os.unlink(folder / name)
    done = _call(copy, "no-llvm")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"memkernel.load.artifacts.ArtifactError: add(): its built artifact {folder}/"), last
    assert last.endswith(".x86-64-v2.so, which the manifest lists, is missing. Reinstall the package, or rebuild "
                         "its kernels with memkernel build."), last


def test_a_fifo_for_an_artifact_is_refused_never_opened_blocking(built, tmp_path):
    copy, folder = _copy(built, tmp_path)
    for name in os.listdir(folder):
        if name.endswith(".so"):
            os.unlink(folder / name)
            os.mkfifo(folder / name)
    done = _call(copy, "no-llvm", timeout=60)  # the old code waited for a writer for good: the timeout fails it
    assert done.returncode != 0
    assert ".x86-64-v2.so, which the manifest lists, cannot be read: it is a FIFO, not a regular file." in done.stderr


def test_a_fifo_for_the_manifest_is_refused_never_opened_blocking(built, tmp_path):
    copy, folder = _copy(built, tmp_path)
    os.unlink(folder / "manifest.json")
    os.mkfifo(folder / "manifest.json")
    done = _call(copy, "no-llvm", timeout=60)
    assert done.returncode != 0
    assert (f"ArtifactError: add(): the artifacts' manifest {folder}/manifest.json cannot be read: it is a FIFO, "
            "not a regular file. Rebuild it with memkernel build, or remove it.") in done.stderr


@pytest.mark.parametrize("arguments", [[], ["build", "shipped"]])
def test_python_m_memkernel_without_the_compiler_is_a_one_line_error(tmp_path, arguments):
    _package(tmp_path)
    program = "import sys, runpy; sys.modules['mlir'] = sys.modules['llvm'] = None; " \
              "sys.argv[0] = 'memkernel'; runpy.run_module('memkernel', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", program, *arguments], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "MEMKERNEL_CACHE_DIR": ""},
                          timeout=300)
    assert done.returncode == 1
    assert done.stderr.startswith("memkernel: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "pip install memkernel" in done.stderr


def test_build_help_names_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    shown = capsys.readouterr().out
    assert "--target-cpu CPU" in shown and "-o DIR" in shown


def test_build_for_an_unknown_cpu_is_a_one_line_error(built, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(built))
    assert main(["build", "shipped", "--target-cpu", "pentium", "-o", str(built / "other")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("memkernel: error: --target-cpu must be one of x86-64, x86-64-v2, x86-64-v3, x86-64-v4")
    assert err.count("\n") == 1


def test_build_into_a_path_that_is_a_file_is_a_one_line_error(built, capsys, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(built))
    taken = tmp_path / "taken"
    taken.write_text("not a folder")
    assert main(["build", "shipped", "-o", str(taken)]) == 1
    assert capsys.readouterr().err == f"memkernel: error: cannot write the artifacts into {taken}: File exists\n"


def test_build_of_a_module_that_does_not_import_is_a_one_line_error(capsys):
    assert main(["build", "no_such_module_here"]) == 1
    assert capsys.readouterr().err == "memkernel: error: cannot import no_such_module_here: No module named " \
                                      "'no_such_module_here'\n"


def test_build_of_a_module_without_kernels_is_a_one_line_error(capsys):
    assert main(["build", "json"]) == 1
    assert capsys.readouterr().err == "memkernel: error: json defines no kernel at its top level (@mlir_kernel).\n"


def test_built_package_runs_in_a_fresh_venv_without_the_mlir_wheels(built, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # The runtime distribution built from a copy of the tree: pip builds in the source folder, and files a build
    # left there (runtime/build/) would be installed too, with a code digest no artifact was built under.
    source = tmp_path / "source"
    shutil.copytree(os.path.join(REPO, "memkernel"), source / "memkernel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (source / "runtime").mkdir()
    shutil.copy(os.path.join(REPO, "runtime", "pyproject.toml"), source / "runtime")
    for target in (str(source / "runtime"), str(built)):
        done = subprocess.run([python, "-m", "pip", "install", "-q", target], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
    listed = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True, check=True).stdout
    assert "xtc-" not in listed and "mlir" not in listed.lower()
    done = subprocess.run([python, "-c", CALLER], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MEMKERNEL_CACHE_DIR": "", "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    mlir_loaded, path, shape_error, milliseconds = done.stdout.splitlines()
    assert mlir_loaded == "False" and path in ("fast", "checked")
    assert "a has 5 elements on dim 0 but b has 4 on dim 0" in shape_error
