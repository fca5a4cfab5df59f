"""Compile caches: once per process, and across processes through the disk cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

import memkernel.compile.cache
import memkernel.kernel
from memkernel import mlir_kernel

from ..kernels import elementwise

REPO = str(Path(__file__).resolve().parents[2])


def unique_source() -> tuple[str, str]:
    """A kernel source no other test compiles, and its function name."""
    name = f"add_{uuid.uuid4().hex[:12]}"
    return elementwise("arith.addf", "memref<?xf64>", "f64", 1, name=name), name


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def compilations(monkeypatch):
    """Counts the kernels that run the MLIR pipeline and LLVM codegen."""
    calls = []
    real = memkernel.kernel.compile_function

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(memkernel.kernel, "compile_function", counting)
    return calls


@pytest.fixture
def fresh_process_memory(monkeypatch):
    """Forget this process's compiled kernels, as a new process would."""
    monkeypatch.setattr(memkernel.compile.cache, "_memory", {})


def decorate(source: str, name: str, **options):
    return mlir_kernel(source, name=name, **options)(lambda a, b: None)


def check(kernel) -> None:
    a, b = np.arange(5.0), np.full(5, 0.5)
    np.testing.assert_array_equal(kernel(a, b), a + b)


def entries(folder) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_redecorating_the_same_kernel_compiles_once(cache_dir, compilations):
    source, name = unique_source()
    check(decorate(source, name))
    check(decorate(source, name))
    assert compilations == [name]


def test_a_new_process_loads_the_kernel_from_disk(cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    memkernel.compile.cache._memory.clear()
    check(decorate(source, name))
    assert compilations == [name]
    assert len(entries(cache_dir)) == 1


@pytest.mark.parametrize("change", [
    {"opt_level": 2},
    {"pipeline": "func.func(convert-linalg-to-loops),expand-strided-metadata,lower-affine,convert-scf-to-cf,"
                 "convert-arith-to-llvm,finalize-memref-to-llvm,convert-func-to-llvm,convert-cf-to-llvm,"
                 "reconcile-unrealized-casts"},
    {"shared_libs": ["mlir_c_runner_utils"]},
])
def test_any_option_change_is_a_miss(change, cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    check(decorate(source, name, **change))
    assert compilations == [name, name]


def test_another_host_or_version_is_a_miss(cache_dir, compilations, fresh_process_memory, monkeypatch):
    source, name = unique_source()
    check(decorate(source, name))
    memkernel.compile.cache._memory.clear()
    environment = memkernel.compile.cache._environment()
    monkeypatch.setattr(memkernel.compile.cache, "_environment", lambda: {**environment, "host": "other-cpu;+avx"})
    check(decorate(source, name))
    assert compilations == [name, name]
    assert len(entries(cache_dir)) == 2


def test_a_changed_source_is_a_miss(cache_dir, compilations):
    source, name = unique_source()
    check(decorate(source, name))
    changed = decorate(source.replace("arith.addf", "arith.mulf"), name)
    a, b = np.arange(5.0), np.full(5, 0.5)
    np.testing.assert_array_equal(changed(a, b), a * b)
    assert compilations == [name, name]


def corrupt_truncated(path):
    path.write_bytes(path.read_bytes()[:100])


def corrupt_flipped_code_byte(path):
    data = bytearray(path.read_bytes())
    data[-200] ^= 0xFF
    path.write_bytes(bytes(data))


def corrupt_garbage(path):
    path.write_bytes(os.urandom(4096))


@pytest.mark.parametrize("corrupt", [corrupt_truncated, corrupt_flipped_code_byte, corrupt_garbage])
def test_a_corrupt_entry_is_ignored_and_rebuilt(corrupt, cache_dir, compilations, fresh_process_memory):
    source, name = unique_source()
    check(decorate(source, name))
    (entry,) = entries(cache_dir)
    corrupt(cache_dir / entry)
    memkernel.compile.cache._memory.clear()
    check(decorate(source, name))
    assert compilations == [name, name]
    memkernel.compile.cache._memory.clear()
    check(decorate(source, name))  # the rebuilt entry loads
    assert compilations == [name, name]


def test_a_foreign_entry_under_the_kernels_name_is_ignored(cache_dir, compilations, fresh_process_memory):
    source_a, name_a = unique_source()
    source_b, name_b = unique_source()
    check(decorate(source_a, name_a))
    (entry_a,) = entries(cache_dir)
    check(decorate(source_b, name_b))
    (entry_b,) = [e for e in entries(cache_dir) if e != entry_a]
    os.replace(cache_dir / entry_a, cache_dir / entry_b)
    memkernel.compile.cache._memory.clear()
    check(decorate(source_b, name_b))
    assert compilations == [name_a, name_b, name_b]


def test_cache_false_compiles_every_time_and_writes_nothing(cache_dir, compilations):
    source, name = unique_source()
    check(decorate(source, name, cache=False))
    check(decorate(source, name, cache=False))
    assert compilations == [name, name]
    assert entries(cache_dir) == []


def test_empty_cache_dir_switches_the_disk_cache_off(monkeypatch, tmp_path, compilations, fresh_process_memory):
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    source, name = unique_source()
    check(decorate(source, name))
    memkernel.compile.cache._memory.clear()
    check(decorate(source, name))
    assert compilations == [name, name]
    assert os.listdir(tmp_path) == []


def test_unwritable_cache_dir_warns_and_still_runs(tmp_path, monkeypatch, compilations):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MEMKERNEL_CACHE_DIR", str(blocker / "cache"))
    source, name = unique_source()
    with pytest.warns(RuntimeWarning, match="could not write its disk cache"):
        check(decorate(source, name))


RUN_KERNEL = textwrap.dedent("""
    import sys
    import numpy as np
    import memkernel.kernel
    from memkernel import mlir_kernel
    if sys.argv[2] == "forbid-compiling":
        def refuse(*args, **kwargs):
            raise AssertionError("compiled instead of loading from the disk cache")
        memkernel.kernel.compile_function = refuse
    kernel = mlir_kernel(open(sys.argv[1]).read(), name=sys.argv[3])(lambda a, b: None)
    a, b = np.arange(1000.0), np.full(1000, 0.25)
    assert np.array_equal(kernel(a, b), a + b)
    print("ok")
""")


def run_kernel_process(source_file, name: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUN_KERNEL, str(source_file), mode, name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO})


def test_a_fresh_process_runs_the_kernel_without_compiling(cache_dir, tmp_path):
    source, name = unique_source()
    source_file = tmp_path / "kernel.mlir"
    source_file.write_text(source)
    for mode in ("may-compile", "forbid-compiling"):
        out, err = run_kernel_process(source_file, name, mode).communicate(timeout=120)
        assert out.strip() == "ok", err


def test_concurrent_writers_leave_one_valid_entry(cache_dir, tmp_path):
    source, name = unique_source()
    source_file = tmp_path / "kernel.mlir"
    source_file.write_text(source)
    processes = [run_kernel_process(source_file, name, "may-compile") for _ in range(4)]
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert out.strip() == "ok", err
    assert len(entries(cache_dir)) == 1 and entries(cache_dir)[0].endswith(".mkc")
    out, err = run_kernel_process(source_file, name, "forbid-compiling").communicate(timeout=120)
    assert out.strip() == "ok", err
