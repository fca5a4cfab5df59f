"""Dask arrays through kernels: chunking read from the IR, checked against numpy, on a cluster of processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memkernel import ArgumentError, Kernel, ShapeError, mlir_kernel

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
memkernel_dask = pytest.importorskip("memkernel.dask")
from memkernel.errors import ChunkingError  # noqa: E402

from ..kernels import MATMUL, axpy  # noqa: E402

AXPY = axpy(rank=2)

ADD = """
func.func @add(%a: memref<?x?xf64>, %b: memref<?x?xf64>, %c: memref<?x?xf64>) {
  linalg.add ins(%a, %b : memref<?x?xf64>, memref<?x?xf64>) outs(%c : memref<?x?xf64>)
  return
}"""

SUB = """
func.func @sub(%a: memref<?x?xf64>, %b: memref<?x?xf64>, %c: memref<?x?xf64>) {
  linalg.sub ins(%a, %b : memref<?x?xf64>, memref<?x?xf64>) outs(%c : memref<?x?xf64>)
  return
}"""

ROW_MAX = """
func.func @row_max(%x: memref<?x?xf32>, %m: memref<?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                  iterator_types = ["parallel", "reduction"]}
      ins(%x : memref<?x?xf32>) outs(%m : memref<?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.maximumf %a, %o : f32
    linalg.yield %r : f32
  }
  return
}"""

ONE_PLUS_MATMUL = """
func.func @one_plus_matmul(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  %one = arith.constant 1.0 : f32
  linalg.fill ins(%one : f32) outs(%c : memref<?x?xf32>)
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  return
}"""

SCALE_ROWS_OF_4 = """
func.func @scale4(%x: memref<4x?xf32>, %y: memref<4x?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<4x?xf32>) outs(%y : memref<4x?xf32>) {
  ^bb0(%a: f32, %o: f32):
    %r = arith.addf %a, %a : f32
    linalg.yield %r : f32
  }
  return
}"""

DOUBLE_BY_LOOP = """
func.func @double(%x: memref<?x?xf64>, %y: memref<?x?xf64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?x?xf64>
  %m = memref.dim %x, %c1 : memref<?x?xf64>
  scf.for %i = %c0 to %n step %c1 {
    scf.for %j = %c0 to %m step %c1 {
      %v = memref.load %x[%i, %j] : memref<?x?xf64>
      %d = arith.addf %v, %v : f64
      memref.store %d, %y[%i, %j] : memref<?x?xf64>
    }
  }
  return
}"""

CONV_1D = """
func.func @conv(%x: memref<?xf32>, %w: memref<?xf32>, %y: memref<?xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, k) -> (i + k)>, affine_map<(i, k) -> (k)>,
                                   affine_map<(i, k) -> (i)>],
                  iterator_types = ["parallel", "reduction"]}
      ins(%x, %w : memref<?xf32>, memref<?xf32>) outs(%y : memref<?xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %o, %p : f32
    linalg.yield %s : f32
  }
  return
}"""


TRANSPOSE = """
func.func @transpose(%x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  linalg.transpose ins(%x : memref<?x?xf32>) outs(%y : memref<?x?xf32>) permutation = [1, 0]
  return
}"""

SUM_AND_PRODUCT = """
func.func @sum_and_product(%a: memref<?xf64>, %b: memref<?xf64>, %s: memref<?xf64>, %p: memref<?xf64>) {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> (i)>, affine_map<(i) -> (i)>,
                                   affine_map<(i) -> (i)>],
                  iterator_types = ["parallel"]}
      ins(%a, %b : memref<?xf64>, memref<?xf64>) outs(%s, %p : memref<?xf64>, memref<?xf64>) {
  ^bb0(%x: f64, %y: f64, %o: f64, %q: f64):
    %u = arith.addf %x, %y : f64
    %v = arith.mulf %x, %y : f64
    linalg.yield %u, %v : f64, f64
  }
  return
}"""

POSITIONS = """
func.func @positions(%x: memref<?x?xf64> {llvm.noalias}, %y: memref<?x?xf64>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]}
      ins(%x : memref<?x?xf64>) outs(%y : memref<?x?xf64>) {
  ^bb0(%a: f64, %o: f64):
    %i = linalg.index 0 : index
    %j = linalg.index 1 : index
    %c100 = arith.constant 100 : index
    %hi = arith.muli %i, %c100 : index
    %ij = arith.addi %hi, %j : index
    %n = arith.index_cast %ij : index to i64
    %f = arith.sitofp %n : i64 to f64
    %s = arith.addf %a, %f : f64
    linalg.yield %s : f64
  }
  return
}"""

WEIGHTED_SUM = """
func.func @weighted_sum(%x: memref<?xf64>, %total: memref<f64>) {
  linalg.generic {indexing_maps = [affine_map<(i) -> (i)>, affine_map<(i) -> ()>],
                  iterator_types = ["reduction"]}
      ins(%x : memref<?xf64>) outs(%total : memref<f64>) {
  ^bb0(%a: f64, %o: f64):
    %i = linalg.index 0 : index
    %n = arith.index_cast %i : index to i64
    %w = arith.sitofp %n : i64 to f64
    %p = arith.mulf %a, %w : f64
    %s = arith.addf %o, %p : f64
    linalg.yield %s : f64
  }
  return
}"""

RANDOM_FILL = """
func.func @random_fill(%lo: f64, %hi: f64, %seed: i32, %o: memref<?x?xf64>) {
  linalg.fill_rng_2d ins(%lo, %hi, %seed : f64, f64, i32) outs(%o : memref<?x?xf64>)
  return
}"""


@mlir_kernel(MATMUL)
def matmul(a, b):
    return (a.shape[0], b.shape[1])


@mlir_kernel(SUB)
def sub(a, b):
    pass


def make_add() -> Kernel:
    """An elementwise kernel made inside a function: it travels by value."""

    @mlir_kernel(ADD)
    def add(a, b):
        pass

    return add


def random(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def compute(array: Any) -> np.ndarray:
    return np.asarray(array.compute(scheduler="sync"))


# -- what the IR says -------------------------------------------------------------------


def test_matmul_indices_and_its_add_reduction_are_read_from_the_ir():
    chunking = memkernel_dask.analyse(matmul)
    assert chunking.indices == ("ab", "bc", "ac")
    assert chunking.reductions == {"b"}
    assert chunking.summable


def test_elementwise_kernel_has_one_index_per_dim_and_no_reduction():
    chunking = memkernel_dask.analyse(mlir_kernel(AXPY)(lambda alpha, x, y: None))
    assert chunking.indices == (None, "ab", "ab", "ab")
    assert chunking.reductions == frozenset()


def test_matmul_chunked_along_every_dim_sums_partial_products():
    a, b = random((37, 29), np.float32), random((29, 23), np.float32, seed=1)
    c = memkernel_dask.apply(matmul, da.from_array(a, chunks=(10, 8)), da.from_array(b, chunks=(7, 6)))
    assert c.shape == (37, 23) and c.dtype == np.float32
    np.testing.assert_allclose(compute(c), a @ b, rtol=1e-5, atol=1e-4)


def test_transposing_map_swaps_the_chunks_of_the_output():
    transpose = mlir_kernel(TRANSPOSE)(lambda x: (x.shape[1], x.shape[0]))
    assert memkernel_dask.analyse(transpose).indices == ("ab", "ba")
    x = random((5, 7), np.float32)
    out = memkernel_dask.apply(transpose, da.from_array(x, chunks=(2, 3)))
    assert out.chunks == ((3, 3, 1), (2, 2, 1))
    np.testing.assert_array_equal(compute(out), x.T)


def test_kernel_with_two_outputs_gives_two_arrays():
    both = mlir_kernel(SUM_AND_PRODUCT)(lambda a, b: None)
    a, b = random((11,), np.float64), random((11,), np.float64, seed=1)
    total, product = memkernel_dask.apply(both, da.from_array(a, chunks=3), da.from_array(b, chunks=4))
    np.testing.assert_array_equal(compute(total), a + b)
    np.testing.assert_array_equal(compute(product), a * b)


def test_scalar_argument_passes_through_to_every_block():
    axpy = mlir_kernel(AXPY)(lambda alpha, x, y: None)
    x, y = random((9, 7), np.float64), random((9, 7), np.float64, seed=1)
    out = memkernel_dask.apply(axpy, 2.5, da.from_array(x, chunks=(4, 3)), da.from_array(y, chunks=(2, 5)))
    np.testing.assert_array_equal(compute(out), 2.5 * x + y)


def test_numpy_input_is_taken_as_one_chunk_and_aligned():
    x, y = random((9, 7), np.float64), random((9, 7), np.float64, seed=1)
    out = memkernel_dask.apply(make_add(), da.from_array(x, chunks=(4, 3)), y)
    np.testing.assert_array_equal(compute(out), x + y)


def test_reduction_without_an_add_combiner_is_kept_whole():
    row_max = mlir_kernel(ROW_MAX)(lambda x: None)
    assert not memkernel_dask.analyse(row_max).summable
    x = np.abs(random((6, 20), np.float32))  # outputs start at zero: max(0, row) is the row's max
    out = memkernel_dask.apply(row_max, da.from_array(x, chunks=(2, 5)))
    np.testing.assert_array_equal(compute(out), x.max(axis=1))


def test_reduction_of_a_kernel_that_initializes_its_output_is_kept_whole():
    one_plus = mlir_kernel(ONE_PLUS_MATMUL)(lambda a, b: (a.shape[0], b.shape[1]))
    assert not memkernel_dask.analyse(one_plus).summable
    a, b = random((8, 12), np.float32), random((12, 5), np.float32, seed=1)
    out = memkernel_dask.apply(one_plus, da.from_array(a, chunks=(3, 4)), da.from_array(b, chunks=(4, 2)))
    np.testing.assert_allclose(compute(out), 1 + a @ b, rtol=1e-5, atol=1e-5)


def test_static_dim_is_kept_whole():
    scale4 = mlir_kernel(SCALE_ROWS_OF_4)(lambda x: None)
    x = random((4, 10), np.float32)
    out = memkernel_dask.apply(scale4, da.from_array(x, chunks=(2, 3)))
    assert out.chunks[0] == (4,)
    np.testing.assert_array_equal(compute(out), 2 * x)


def test_kernel_without_linalg_is_refused_unless_all_parallel():
    double = mlir_kernel(DOUBLE_BY_LOOP)(lambda x: None)
    x = da.from_array(random((6, 5), np.float64), chunks=(4, 2))
    with pytest.raises(ChunkingError, match=r"apply\(@double\).*memref.dim.*all_parallel=True") as caught:
        memkernel_dask.apply(double, x)
    assert isinstance(caught.value, TypeError)
    np.testing.assert_array_equal(compute(memkernel_dask.apply(double, x, all_parallel=True)), 2 * compute(x))


def test_window_indexing_map_is_refused():
    conv = mlir_kernel(CONV_1D)(lambda x, w: (x.shape[0] - w.shape[0] + 1,))
    with pytest.raises(ChunkingError, match="not a plain loop dim"):
        memkernel_dask.apply(conv, da.ones(10, dtype=np.float32), da.ones(3, dtype=np.float32))


def test_loop_indices_of_each_block_count_from_its_offset():
    positions = mlir_kernel(POSITIONS)(lambda x: None)
    x = random((7, 9), np.float64)
    out = memkernel_dask.apply(positions, da.from_array(x, chunks=(3, 4)))
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(compute(out), x + 100 * i + j)


def test_loop_index_of_a_reduction_split_into_partial_sums_counts_from_each_chunk():
    weighted_sum = mlir_kernel(WEIGHTED_SUM)(lambda x: None)
    assert memkernel_dask.analyse(weighted_sum).summable
    x = np.arange(1, 9, dtype=np.float64)
    out = memkernel_dask.apply(weighted_sum, da.from_array(x, chunks=3))
    assert compute(out)[()] == np.dot(x, np.arange(8))


def test_input_named_like_an_offset_does_not_collide_with_it():
    positions = mlir_kernel(POSITIONS)(lambda offset_a: None)
    x = random((5, 6), np.float64)
    out = memkernel_dask.apply(positions, da.from_array(x, chunks=(2, 4)))
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(compute(out), x + 100 * i + j)


def test_named_op_that_reads_loop_indices_is_refused():
    random_fill = mlir_kernel(RANDOM_FILL)(lambda lo, hi, seed: None)
    with pytest.raises(ChunkingError, match=r"apply\(@random_fill\): its linalg.fill_rng_2d reads its loop "
                                            r"indices.*only in a linalg.generic"):
        memkernel_dask.apply(random_fill, 0.0, 1.0, 7)


def test_all_parallel_refuses_a_kernel_that_reads_loop_indices():
    positions = mlir_kernel(POSITIONS)(lambda x: None)
    with pytest.raises(ChunkingError, match=r"apply\(@positions, all_parallel=True\): the kernel reads its loop "
                                            r"indices \(linalg.index\).*Drop all_parallel=True"):
        memkernel_dask.apply(positions, da.ones((4, 4), chunks=2), all_parallel=True)


def test_wrong_dtype_names_the_argument_and_the_fix():
    with pytest.raises(ArgumentError, match=r"apply\(@matmul\): argument 'b' expects memref<\?x\?xf32>.*float64.*"
                                            r"b\.astype\(np\.float32\)"):
        memkernel_dask.apply(matmul, da.ones((3, 3), dtype=np.float32), da.ones((3, 3), dtype=np.float64))


def test_mismatched_inner_dims_are_a_shape_error_before_computing():
    with pytest.raises(ShapeError, match=r"matmul\(\): a has 3 elements on dim 1 but b has 5 on dim 0"):
        memkernel_dask.apply(matmul, da.ones((4, 3), dtype=np.float32), da.ones((5, 2), dtype=np.float32))


# -- on a cluster of worker processes ----------------------------------------------------------


@pytest.fixture(scope="module")
def worker_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("worker-cache")
    folder.chmod(0o700)
    return folder


@pytest.fixture(scope="module")
def client(worker_cache: Path) -> Iterator[Any]:
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                       env={"MEMKERNEL_CACHE_DIR": str(worker_cache)})
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def test_elementwise_kernel_on_worker_processes_matches_numpy(client):
    x, y = random((40, 30), np.float64), random((40, 30), np.float64, seed=1)
    out = memkernel_dask.apply(make_add(), da.from_array(x, chunks=(20, 15)), da.from_array(y, chunks=(20, 10)))
    np.testing.assert_array_equal(client.compute(out).result(), x + y)


def test_matmul_on_worker_processes_matches_numpy(client):
    a, b = random((40, 30), np.float32), random((30, 20), np.float32, seed=1)
    c = memkernel_dask.apply(matmul, da.from_array(a, chunks=(20, 15)), da.from_array(b, chunks=(15, 10)))
    np.testing.assert_allclose(client.compute(c).result(), a @ b, rtol=1e-5, atol=1e-4)


def test_loop_indices_on_worker_processes_count_from_each_blocks_offset(client):
    positions = mlir_kernel(POSITIONS)(lambda x: None)
    x = random((12, 10), np.float64)
    out = memkernel_dask.apply(positions, da.from_array(x, chunks=(5, 4)))
    i, j = np.indices(x.shape)
    np.testing.assert_array_equal(client.compute(out).result(), x + 100 * i + j)


_counts: dict[str, int] = {}


def count_compiles() -> None:
    """In a worker: count the kernels it compiles and the ones it loads from the disk cache."""
    import memkernel.compile.build as building
    import memkernel.kernel as module

    compile_function, load_function = building.compile_function, module.load_function

    def counted(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            _counts[name] = _counts.get(name, 0) + 1
            return function(*args, **kwargs)

        return call

    _counts.clear()
    building.compile_function = counted("compiled", compile_function)  # type: ignore[assignment]
    module.load_function = counted("loaded", load_function)  # type: ignore[assignment]


def compile_counts() -> dict[str, int]:
    return dict(_counts)


def test_each_worker_compiles_once_and_the_next_loads_the_disk_cache(client, worker_cache: Path):
    client.run(count_compiles)
    first, second = sorted(client.scheduler_info()["workers"])
    entries = set(worker_cache.glob("*.mkc"))
    x, y = random((30, 20), np.float64), random((30, 20), np.float64, seed=1)
    np.testing.assert_array_equal(client.submit(sub, x, y, workers=[first]).result(), x - y)
    np.testing.assert_array_equal(client.submit(sub, y, x, workers=[second]).result(), y - x)
    out = memkernel_dask.apply(sub, da.from_array(x, chunks=(15, 10)), da.from_array(y, chunks=(15, 10)))
    np.testing.assert_array_equal(client.compute(out).result(), x - y)
    counts = client.run(compile_counts)
    assert counts[first] == {"compiled": 1}
    assert counts[second] == {"loaded": 1}
    assert len(set(worker_cache.glob("*.mkc")) - entries) == 1


_NOTEBOOK_LIKE = '''
import json

import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import memkernel.dask
from memkernel import mlir_kernel


@mlir_kernel(SOURCE)
def matmul(a, b):
    return (a.shape[0], b.shape[1])


with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
    with Client(cluster) as client:
        a = np.arange(30 * 20, dtype=np.float32).reshape(30, 20) / 100
        b = np.arange(20 * 10, dtype=np.float32).reshape(20, 10) / 100
        c = memkernel.dask.apply(matmul, da.from_array(a, chunks=(10, 7)), da.from_array(b, chunks=(7, 4)))
        print(json.dumps(client.compute(c).result().tolist()))
'''


@pytest.mark.slow
def test_kernel_of_a_main_module_without_a_file_travels_by_value():
    """Code run with ``python -c``, as a notebook's: workers cannot import its ``__main__``."""
    script = textwrap.dedent(_NOTEBOOK_LIKE).replace("SOURCE", repr(MATMUL))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    a = np.arange(30 * 20, dtype=np.float32).reshape(30, 20) / 100
    b = np.arange(20 * 10, dtype=np.float32).reshape(20, 10) / 100
    np.testing.assert_allclose(np.asarray(json.loads(done.stdout.strip().splitlines()[-1])), a @ b, rtol=1e-5)
