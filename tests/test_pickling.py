"""Kernels pickle like functions: by reference when top-level, by value otherwise, never with compiled code."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from memkernel import Kernel, mlir_kernel
from memkernel.pickling import resolves_by_name

cloudpickle = pytest.importorskip("cloudpickle")

SCALE = """
func.func @scale(%x: memref<?xf64>, %s: f64, %y: memref<?xf64>) {
  linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> ()>, affine_map<(d0) -> (d0)>],
                  iterator_types = ["parallel"]}
      ins(%x, %s : memref<?xf64>, f64) outs(%y : memref<?xf64>) {
  ^bb0(%a: f64, %b: f64, %o: f64):
    %r = arith.mulf %a, %b : f64
    linalg.yield %r : f64
  }
  return
}
"""

LOG = """
func.func private @log(f64) -> f64
func.func @logged(%x: f64) -> f64 {
  %r = func.call @log(%x) : (f64) -> f64
  return %r : f64
}
"""


@mlir_kernel(SCALE)
def scale(x, s):
    pass


class Kernels:
    @mlir_kernel(SCALE)
    def scale(x, s):
        pass


def double(x: float) -> float:
    return 2 * x


def shape_of_scale(x, s):
    return x.shape


scale_of_shape_function = mlir_kernel(SCALE, name="scale")(shape_of_scale)


def make_nested_scale() -> Kernel:
    @mlir_kernel(SCALE)
    def scale(x, s):
        pass

    return scale


X = np.linspace(-3, 3, 11)


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("kernel", [scale, Kernels.scale], ids=["module", "class-body"])
def test_top_level_kernel_pickles_by_reference_to_itself(kernel, protocol):
    assert resolves_by_name(kernel)
    assert pickle.loads(pickle.dumps(kernel, protocol=protocol)) is kernel


def test_by_reference_pickle_names_the_module_and_carries_no_source():
    data = pickle.dumps(scale)
    assert __name__.encode() in data and b"scale" in data
    assert b"linalg.generic" not in data


def test_plain_pickle_carries_a_kernel_by_value_when_it_finds_its_shape_function_by_name():
    assert not resolves_by_name(scale_of_shape_function)
    copy = pickle.loads(pickle.dumps(scale_of_shape_function))
    assert copy is not scale_of_shape_function and copy.function is shape_of_scale
    np.testing.assert_array_equal(copy(X, -2.0), X * -2.0)


def test_nested_kernel_with_plain_pickle_fails_like_a_nested_function():
    nested = make_nested_scale()
    assert not resolves_by_name(nested)
    with pytest.raises((pickle.PicklingError, AttributeError), match="local"):
        pickle.dumps(nested)


@pytest.mark.parametrize("make", [make_nested_scale, lambda: mlir_kernel(SCALE)(lambda x, s: None)],
                         ids=["nested", "lambda"])
def test_kernel_pickled_by_value_rebuilds_from_options_and_computes(make):
    kernel = make()
    copy = cloudpickle.loads(cloudpickle.dumps(kernel))
    assert copy is not kernel and isinstance(copy, Kernel)
    assert copy.options == kernel.options
    assert copy.__signature__ == kernel.__signature__
    np.testing.assert_array_equal(copy(X, 1.5), X * 1.5)


def test_process_unpickling_a_kernel_again_reuses_the_one_it_rebuilt():
    kernel = make_nested_scale()
    data = cloudpickle.dumps(kernel)
    first = pickle.loads(data)
    assert pickle.loads(data) is first
    assert pickle.loads(cloudpickle.dumps(make_nested_scale())) is not first


def test_pickle_never_carries_compiled_code():
    kernel = make_nested_scale()
    before = cloudpickle.dumps(kernel)
    kernel(X, 2.0)
    assert kernel.compiled
    assert cloudpickle.dumps(kernel) == before
    copy = cloudpickle.loads(before)
    assert not copy.compiled
    np.testing.assert_array_equal(copy(X, 2.0), X * 2.0)


def test_callbacks_travel_when_their_callables_pickle():
    kernel = mlir_kernel(LOG, callbacks={"log": double})(lambda x: None)
    copy = pickle.loads(cloudpickle.dumps(kernel))
    assert copy.options.callbacks == {"log": double}
    assert copy(4.25) == 8.5


_POOL_SCRIPT = '''
import concurrent.futures
import json
import multiprocessing
import sys

import numpy as np
from memkernel import mlir_kernel


@mlir_kernel(SOURCE)
def scale(x, s):
    pass


if __name__ == "__main__":
    xs = [np.arange(n, dtype=np.float64) + n for n in range(1, 7)]
    factors = [0.5 * n for n in range(1, 7)]
    found = {}
    for method in ("spawn", "fork"):
        context = multiprocessing.get_context(method)
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as executor:
            found["executor-" + method] = [y.tolist() for y in executor.map(scale, xs, factors)]
        with context.Pool(2) as pool:
            found["pool-" + method] = [y.tolist() for y in pool.starmap(scale, zip(xs, factors))]
    json.dump(found, sys.stdout)
'''


def test_kernel_of_a_scripts_main_runs_in_process_pools(tmp_path: Path):
    script = tmp_path / "pool_script.py"
    script.write_text(textwrap.dedent(_POOL_SCRIPT).replace("SOURCE", repr(SCALE)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    expected = [(np.arange(n, dtype=np.float64) + n) * (0.5 * n) for n in range(1, 7)]
    assert sorted(found) == ["executor-fork", "executor-spawn", "pool-fork", "pool-spawn"]
    for results in found.values():
        assert len(results) == len(expected)
        for got, want in zip(results, expected):
            np.testing.assert_array_equal(np.asarray(got), want)
