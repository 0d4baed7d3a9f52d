"""Graphs that crash onnxruntime itself (a segmentation fault: no exception to catch) are
run without the optimizer that crashes (backends/ort.crashing_optimizers): autoclust makes
onnxruntime sessions over sub-models (measured placement, fallback segments) and over the
whole model, and none of them may take the process down."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from autoclust.backends import ort as ort_backend
from onnx import TensorProto, helper, numpy_helper

RUN = """
import sys, numpy as np, onnx, onnxruntime as ort, autoclust
path, flags = sys.argv[1], eval(sys.argv[2])
x = np.linspace(-2, 2, int(np.prod(eval(sys.argv[3])))).astype(np.float16).reshape(eval(sys.argv[3]))
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
want = ort.InferenceSession(path, so).run(None, {"x": x})[0]
sess = autoclust.InferenceSession(path, **flags)
for _ in range(12):  # measured placement times the cluster against onnxruntime on the way
    got = sess.run(None, {"x": x})[0]
np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)
print("ok", got.shape)
"""


def _model(dtype: int, shape: list[int], perm: list[int], w: tuple[int, int]) -> onnx.ModelProto:
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    weight = numpy_helper.from_array(np.linspace(-1, 1, w[0] * w[1]).reshape(w).astype(np_dtype),
                                     "w")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
         helper.make_node("MatMul", ["t", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, None)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("flags", [{}, {"min_cluster_size": 1}, {"auto_jit": 0},
                                   {"min_cluster_size": 1, "autotune": False}])
@pytest.mark.parametrize("shape,perm,w", [([2, 1, 1], [1, 2, 0], (2, 1)),
                                          ([2, 3, 4], [1, 2, 0], (2, 5))])
def test_float16_transpose_into_matmul_does_not_crash(tmp_path, flags, shape, perm, w):
    """onnxruntime 1.31 segfaults at ORT_ENABLE_ALL on this float16 graph (the shrunk
    fuzz case 77/598, `autoclust fuzz --seed 77 --features values`); autoclust, whole or
    clustered and measured, answers as onnxruntime does without optimizations."""
    path = tmp_path / "model.onnx"
    onnx.save(_model(TensorProto.FLOAT16, shape, perm, w), path)
    proc = subprocess.run([sys.executable, "-c", RUN, str(path), repr(flags), repr(shape)],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.startswith("ok")


def test_crashing_optimizers_only_where_they_crash():
    f16 = _model(TensorProto.FLOAT16, [2, 3, 4], [1, 2, 0], (2, 5))
    assert ort_backend.crashing_optimizers(f16) == ["MatmulTransposeFusion"]
    # float32 is fine, and so is a float16 MatMul with no Transpose before it
    assert ort_backend.crashing_optimizers(
        _model(TensorProto.FLOAT, [2, 3, 4], [1, 2, 0], (2, 5))) == []
    no_transpose = _model(TensorProto.FLOAT16, [2, 3, 4], [1, 2, 0], (2, 5))
    no_transpose.graph.node[1].input[0] = "x"
    assert ort_backend.crashing_optimizers(no_transpose) == []
