"""fold_batchnorm (autoclust/passes/batchnorm.py): an inference BatchNormalization after a
MatMul with constant weights goes into the weights, and only where that is the same
function; outputs against onnxruntime, compiled and through the optimizer alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.importers.onnx import import_model
from onnx import TensorProto, helper, numpy_helper

import autoclust
from autoclust import flags as flag_parser
from autoclust.passes.optimize import optimize
from autoclust.passes.specialize import specialize
from autoclust.runtime import interpreter

RNG = np.random.default_rng(7)
K, C = 16, 24


def _model(case: str) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """x @ W, flattened to [M, C'] (or not), BatchNormalization over C', reshaped back."""
    flat = {"flatten": [14, C], "2d": None, "wrong_columns": [7, 2 * C],
            "result_read_twice": [14, C], "flattened_read_twice": [14, C],
            "overflow": [14, C]}[case]
    x_shape = (14, K) if case == "2d" else (2, 7, K)
    w = RNG.standard_normal((K, C)).astype(np.float32)
    if case == "overflow":
        w[3, 5] = 3e38  # scaled by ~10: a finite weight that would overflow
    channels = C if flat is None else flat[1]
    scale = RNG.uniform(0.5, 10.0, channels).astype(np.float32)
    mean = RNG.standard_normal(channels).astype(np.float32)
    var = RNG.uniform(0.01, 2.0, channels).astype(np.float32)
    bias = RNG.standard_normal(channels).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w, "w"), (scale, "g"), (bias, "b"), (mean, "m"), (var, "v")]]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    bn_in = "y"
    if flat is not None:
        inits += [numpy_helper.from_array(np.array(flat, np.int64), "flat"),
                  numpy_helper.from_array(np.array([2, 7, C], np.int64), "back")]
        nodes.append(helper.make_node("Reshape", ["y", "flat"], ["f"]))
        bn_in = "f"
    nodes.append(helper.make_node("BatchNormalization", [bn_in, "g", "b", "m", "v"], ["z"],
                                  epsilon=1e-3))
    out = "z"
    if flat is not None:
        nodes.append(helper.make_node("Reshape", ["z", "back"], ["out"]))
        out = "out"
    outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]
    if case.endswith("read_twice"):
        read = "y" if case == "result_read_twice" else "f"
        outputs.append(helper.make_tensor_value_info(read, TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, case, [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(x_shape))], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model, x_shape


@pytest.mark.parametrize("case,folds", [("flatten", True), ("2d", True),
                                        ("wrong_columns", False),
                                        ("result_read_twice", False),
                                        ("flattened_read_twice", False), ("overflow", False)])
def test_batchnorm_after_a_matmul_folds_into_its_weights(case, folds):
    model, x_shape = _model(case)
    x = (RNG.standard_normal(x_shape) * 3).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x})
    graph = import_model(model)
    spec = specialize(graph, [(x.dtype, x.shape)], {})
    opt = optimize(spec, flag_parser.parse("", verify_passes=True))
    assert sum(n.op == "BatchNormalization" for n in opt.nodes) == (0 if folds else 1)
    compiled = autoclust.InferenceSession(model.SerializeToString(), must_compile=True,
                                          autotune=False, min_cluster_size=1)
    for got in (interpreter.evaluate(opt, [x]), compiled.run(None, {"x": x})):
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            finite = np.abs(e[np.isfinite(e)]).max()
            np.testing.assert_allclose(g, e, rtol=2e-5, atol=2e-5 * float(finite))
