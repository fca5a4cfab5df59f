"""What decoration reads round-trips through the codec the disk cache and the workers use."""

from __future__ import annotations

import pytest

from memkernel.analysis.analyse import analyse
from memkernel.analysis.source import parse_source
from memkernel.model import codec
from memkernel.model.kernel_spec import KernelIR

from ..kernels import elementwise

MATMUL = """
func.func @k(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %c: memref<?x?xf32>) {
  linalg.matmul ins(%a, %b : memref<?x?xf32>, memref<?x?xf32>) outs(%c : memref<?x?xf32>)
  return
}"""

CONV = """
func.func @k(%i: memref<?x?x?x?xf64>, %f: memref<?x?x?x?xf64>, %o: memref<?x?x?x?xf64>) {
  linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>}
    ins(%i, %f : memref<?x?x?x?xf64>, memref<?x?x?x?xf64>) outs(%o : memref<?x?x?x?xf64>)
  return
}"""

STRIDED_SCALARS = """
func.func @k(%x: memref<?x4xi8, strided<[?, 1], offset: ?>>, %s: index, %y: memref<*xui16>,
             %z: memref<complex<f32>>) -> (f32, i1) {
  %c = arith.constant 1.0 : f32
  %t = arith.constant true
  return %c, %t : f32, i1
}"""

TENSORS = """
func.func @k(%a: tensor<?x3xf32>, %b: tensor<?x3xf32>) -> tensor<?x3xf32> {
  %r = arith.addf %a, %b : tensor<?x3xf32>
  return %r : tensor<?x3xf32>
}"""

WINDOW = """
func.func @k(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %y, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %j = arith.addi %i, %c1 : index
    %v = memref.load %x[%j] : memref<?xf32>
    memref.store %v, %y[%i] : memref<?xf32>
  }
  return
}"""

RESHAPE = """
func.func @k(%x: memref<?x4xf32>, %y: memref<?xf32>) {
  %c = memref.collapse_shape %x [[0, 1]] : memref<?x4xf32> into memref<?xf32>
  memref.copy %c, %y : memref<?xf32> to memref<?xf32>
  return
}"""

SOURCES = {
    "elementwise": elementwise("arith.addf", "memref<?x?xf32>", "f32", 2, name="k"),
    "matmul": MATMUL,
    "convolution": CONV,
    "strided, unranked, 0-d, scalars, results": STRIDED_SCALARS,
    "tensors": TENSORS,
    "loop bounds": WINDOW,
    "reshape views": RESHAPE,
}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_what_decoration_reads_round_trips_through_the_codec(source):
    kernel_ir = analyse(parse_source(source), "k")
    text = codec.dumps(kernel_ir)
    back = codec.loads(text)
    assert isinstance(back, KernelIR)
    assert back.rules.views or "collapse_shape" not in source
    assert back == kernel_ir
    assert codec.dumps(back) == text
    assert codec.digest(back) == codec.digest(kernel_ir)


def test_different_kernels_have_different_digests():
    digests = {codec.digest(analyse(parse_source(source), "k")) for source in SOURCES.values()}
    assert len(digests) == len(SOURCES)


@pytest.mark.parametrize("text", [
    "not json", '{"type": "os.system", "fields": {}}', '{"type": "Dim", "fields": {"arg": 0}}',
    '{"element": "f7"}', '{"dtype": "no-such-dtype"}', '{"a": 1, "b": 2, "c": 3}',
], ids=["not json", "unknown type", "missing field", "unknown element", "unknown dtype", "not a value"])
def test_data_that_is_not_an_encoded_model_value_is_a_codec_error(text):
    with pytest.raises(codec.CodecError):
        codec.loads(text)


def test_a_value_outside_the_model_does_not_encode():
    with pytest.raises(codec.CodecError, match="is not a value of the kernel model"):
        codec.encode(object())
