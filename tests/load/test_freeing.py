"""Compiled code is freed when no kernel uses it, and freeing one kernel's code never breaks another's."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memkernel.load.cache import KEEP_RECENT, ProcessCache

REPO = str(Path(__file__).resolve().parents[2])

PRELUDE = textwrap.dedent("""
    import gc, os, sys, uuid
    import numpy as np
    sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
    from kernels import elementwise
    from memkernel import mlir_kernel
    import memkernel.load.cache

    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def source():
        name = f"add_{uuid.uuid4().hex[:12]}"
        return elementwise("arith.addf", "memref<?xf64>", "f64", 1, name=name), name

    def run(source, name, **options):
        kernel = mlir_kernel(source, name=name, **options)(lambda a, b: None)
        a, b = np.arange(7.0), np.full(7, 0.5)
        assert np.array_equal(kernel(a, b), a + b)

    def growth(sources, **options):
        gc.collect()
        before = resident()
        for text, name in sources:
            run(text, name, **options)
        gc.collect()
        return (resident() - before) / 2**20
""")


def run_script(body: str, cache_dir: Path | str, timeout: float = 300, hint: str = "") -> str:
    """Run PRELUDE + ``body`` in a fresh interpreter with the disk cache in ``cache_dir``; its stdout."""
    process = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), REPO], capture_output=True,
                             text=True, timeout=timeout, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": REPO, "MEMKERNEL_CACHE_DIR": str(cache_dir)})
    assert process.returncode == 0, f"exit status {process.returncode}{hint}\n{process.stderr[-3000:]}"
    return process.stdout


class Compiled:
    """Stands for a compiled kernel in the process cache's tests."""


def test_the_process_cache_keeps_the_most_recent_entries():
    cache = ProcessCache(keep_recent=2)
    for digest in "abc":
        cache.setdefault(digest, Compiled())
    gc.collect()
    assert cache.get("a") is None
    assert isinstance(cache.get("b"), Compiled) and isinstance(cache.get("c"), Compiled)


def test_the_process_cache_keeps_an_entry_in_use_and_shares_it():
    cache = ProcessCache(keep_recent=1)
    in_use = cache.setdefault("a", Compiled())
    for digest in "bcd":
        cache.setdefault(digest, Compiled())
    gc.collect()
    assert cache.get("a") is in_use
    assert cache.setdefault("a", Compiled()) is in_use


def test_a_lookup_makes_an_entry_the_most_recent():
    cache = ProcessCache(keep_recent=2)
    cache.setdefault("a", Compiled())
    cache.setdefault("b", Compiled())
    assert cache.get("a") is not None
    cache.setdefault("c", Compiled())
    gc.collect()
    assert cache.get("a") is not None and cache.get("b") is None


def test_the_process_cache_frees_what_nothing_uses_beyond_the_recent():
    cache = ProcessCache(keep_recent=KEEP_RECENT)
    for i in range(3 * KEEP_RECENT):
        cache.setdefault(str(i), Compiled())
    gc.collect()
    assert len(cache) == KEEP_RECENT


def test_dropped_kernels_compiled_with_the_cache_free_their_code(tmp_path):
    out = run_script("""
        for _ in range(memkernel.load.cache.KEEP_RECENT + 2):
            run(*source())  # the recent kernels kept, the allocators' pools
        print(f"{growth([source() for _ in range(20)]):.1f}")
    """, tmp_path / "cache")
    assert float(out) < 5, f"20 dropped kernels kept {out.strip()} MiB (17 MiB when all were kept)"


def test_a_kernel_loaded_from_disk_again_and_again_frees_its_code(tmp_path):
    out = run_script("""
        text, name = source()
        run(text, name)

        def from_disk():
            memkernel.load.cache._memory.clear()
            run(text, name)

        for _ in range(20):
            from_disk()
        import memkernel.compile.build
        memkernel.compile.build.compile_function = None  # from disk only
        gc.collect()
        before = resident()
        for _ in range(200):
            from_disk()
        gc.collect()
        print(f"{(resident() - before) / 2**20:.1f}")
    """, tmp_path / "cache")
    assert float(out) < 5, f"200 loads from disk kept {out.strip()} MiB (27 MiB when never freed)"


@pytest.mark.slow
def test_three_hundred_dropped_kernels_grow_resident_memory_less_than_15_mb(tmp_path):
    out = run_script("""
        for _ in range(memkernel.load.cache.KEEP_RECENT + 2):
            run(*source())
        print(f"{growth([source() for _ in range(300)]):.1f}")
    """, tmp_path / "cache", timeout=900)
    assert float(out) < 15, f"300 dropped kernels kept {out.strip()} MiB (about 255 MiB when all were kept)"


PARALLEL = textwrap.dedent("""
    def parallel(**options):
        name = f"exp_{uuid.uuid4().hex[:12]}"
        text = elementwise("math.exp", "memref<?x?xf64>", "f64", 2, n_inputs=1, name=name)
        kernel = mlir_kernel(text, name=name, parallel=True, **options)(lambda x: None)
        x = np.linspace(-1, 1, 3000 * 7).reshape(3000, 7)
        assert np.allclose(kernel(x), np.exp(x), rtol=1e-14)
        return text, name
""")


@pytest.mark.parametrize("kept", ["cache=False", "dropped past the recent", "loaded from disk, dropped"])
def test_freeing_a_parallel_kernel_leaves_the_next_one_working(kept, tmp_path):
    """A freed ExecutionEngine used to run the async runtime's destroy hook, resetting the thread
    pool every parallel kernel shares: the next parallel call crashed (SIGSEGV)."""
    steps = {
        "cache=False": "parallel(cache=False)",
        "dropped past the recent": "for _ in range(memkernel.load.cache.KEEP_RECENT + 2): parallel()",
        "loaded from disk, dropped": """
            made = [parallel() for _ in range(3)]
            memkernel.load.cache._memory.clear()
            for text, name in made:
                mlir_kernel(text, name=name, parallel=True)(lambda x: None)(np.ones((3, 2)))
        """,
    }
    out = run_script(PARALLEL + textwrap.dedent(steps[kept]) + textwrap.dedent("""
        memkernel.load.cache._memory.clear()
        gc.collect()
        parallel(cache=False)
        parallel()
        print("alive")
    """), tmp_path / "cache", hint=" (an ExecutionEngine must not be given libmlir_async_runtime: "
                               "engine.py passes shared_libs=objects.engine_libraries(libs))")
    assert out.strip() == "alive"


def test_a_parallel_kernels_code_outlives_the_tasks_it_left_running(tmp_path):
    """A call returns while a task it started still runs in the kernel's code (a pool thread returns there
    after marking its token ready, or here, a task nothing awaits): freeing the code at once crashed that
    thread (SIGSEGV). The code is freed after the task comes back, at the next load."""
    out = run_script("""
        import time
        import memkernel.load.objects
        spawn = mlir_kernel('''
            func.func @spawn(%x: memref<1xf64>, %n: index) {
              %t = async.execute {
                %c0 = arith.constant 0 : index
                %c1 = arith.constant 1 : index
                %one = arith.constant 1.0 : f64
                scf.for %i = %c0 to %n step %c1 {
                  %v = memref.load %x[%c0] : memref<1xf64>
                  %w = arith.addf %v, %one : f64
                  memref.store %w, %x[%c0] : memref<1xf64>
                }
                async.yield
              }
              return
            }''', parallel=True, cache=False)(lambda x, n: None)
        x = np.zeros(1)
        spawn(x, 10**8)
        del spawn
        gc.collect()
        parked = len(memkernel.load.objects._parked)
        while x[0] < 10**8:
            time.sleep(0.01)
        time.sleep(0.1)
        run(*source())
        print(parked, len(memkernel.load.objects._parked), x[0])
    """, tmp_path / "cache")
    assert out.split() == ["1", "0", str(float(10**8))]
