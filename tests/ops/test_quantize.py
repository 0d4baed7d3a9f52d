"""QuantizeLinear / DequantizeLinear and narrow-integer storage, compiled vs onnxruntime.

Each model runs in onnxruntime and compiled by autoclust (every node in a cluster, nothing
falling back); outputs must be equal (integers) or within float32 rounding. Special values
(NaN, +-inf, 1e20, halves for round-half-even) go through QuantizeLinear, whose clamping of
NaN follows onnxruntime's MLAS kernel.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import autoclust

RNG = np.random.default_rng(11)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 1e20, -1e20, 0.5, 1.5, 2.5, -0.5, -1.5, 3.7,
                    -3.7, 127.5, -128.5, 254.5, 0.0, -0.0, 1e-40], np.float32)
ONNX = {np.dtype(k): v for k, v in (("int8", TensorProto.INT8), ("uint8", TensorProto.UINT8),
                                    ("int16", TensorProto.INT16),
                                    ("uint16", TensorProto.UINT16),
                                    ("float32", TensorProto.FLOAT),
                                    ("float16", TensorProto.FLOAT16))}


def _model(nodes, inputs, outputs, inits=()) -> bytes:
    g = helper.make_graph(nodes, "q", [helper.make_tensor_value_info(n, t, s)
                                       for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m.SerializeToString()


def _compare(model: bytes, feeds: dict, clusters: int = 1, kernels: list | None = None,
             steps: int = 0):
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = autoclust.InferenceSession(model, min_cluster_size=1, must_compile=True)
    got = sess.run(None, feeds)
    assert len(sess.plan.clusters) == clusters, sess.explain()
    stats = sess.stats()["clusters"]
    assert all(c["fallback"] is None for c in stats)
    if kernels is not None:
        assert [c["kernels"] for c in stats] == [kernels]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=0, equal_nan=True)
        else:
            np.testing.assert_allclose(g.astype(np.int64), w.astype(np.int64), rtol=0,
                                       atol=steps)
    return sess


@pytest.mark.parametrize("qtype", ["uint8", "int8", "uint16", "int16"])
@pytest.mark.parametrize("scale,zp", [(1.0, 0), (0.5, 3), (0.02, 7)])
def test_quantize_per_tensor_special_values(qtype, scale, zp):
    x = np.concatenate([SPECIAL, RNG.standard_normal(30).astype(np.float32) * 5])
    dt = np.dtype(qtype)
    nodes = [helper.make_node("Mul", ["x", "one"], ["m"]),  # a float op before it, fused
             helper.make_node("QuantizeLinear", ["m", "s", "z"], ["q"])]
    inits = [("s", np.float32(scale)), ("z", np.array(zp, dt)), ("one", np.float32(1))]
    model = _model(nodes, [("x", TensorProto.FLOAT, [x.size])], [("q", ONNX[dt])], inits)
    _compare(model, {"x": x}, kernels=[1])


@pytest.mark.parametrize("qtype", ["uint8", "int8"])
def test_dequantize_add_relu_quantize_is_one_kernel(qtype):
    dt = np.dtype(qtype)
    info = np.iinfo(dt)
    # every (a, b) pair: 1-2% of them are ties of round(s / 0.1) that an FMA of the
    # dequantizing multiply into the Add moves (0.25000018 instead of 0.25)
    a, b = (g.astype(dt) for g in np.meshgrid(np.arange(info.min, info.max + 1),
                                               np.arange(info.min, info.max + 1)))
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["fa"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["fb"]),
             helper.make_node("Add", ["fa", "fb"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    inits = [("sa", np.float32(0.05)), ("za", np.array(3, dt)), ("sb", np.float32(0.07)),
             ("zb", np.array(-2 if dt.kind == "i" else 200, dt)), ("so", np.float32(0.1)),
             ("zo", np.array(5, dt))]
    model = _model(nodes, [("a", ONNX[dt], [256, 256]), ("b", ONNX[dt], [256, 256])],
                   [("y", ONNX[dt])], inits)
    _compare(model, {"a": a, "b": b}, kernels=[1])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_per_axis_scales_and_zero_points(axis):
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32) * 3
    c = x.shape[axis]
    scale = RNG.uniform(0.01, 0.1, c).astype(np.float32)
    zp = RNG.integers(-20, 20, c).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=axis),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [3, 4, 5])],
                   [("q", TensorProto.INT8), ("y", TensorProto.FLOAT)],
                   [("s", scale), ("z", zp)])
    _compare(model, {"x": x})


def test_int8_layout_ops_and_wrapping_casts_compile():
    x = np.array([[300.0, -129.5, 1e20, np.nan, 127.9, -0.7]], np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["i8"], to=TensorProto.INT8),
             helper.make_node("Cast", ["x"], ["u8"], to=TensorProto.UINT8),
             helper.make_node("Transpose", ["i8"], ["t"], perm=[1, 0]),
             helper.make_node("Reshape", ["u8", "shape"], ["r"]),
             helper.make_node("Cast", ["t"], ["back"], to=TensorProto.FLOAT)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [1, 6])],
                   [("t", TensorProto.INT8), ("r", TensorProto.UINT8),
                    ("back", TensorProto.FLOAT)], [("shape", np.array([2, 3], np.int64))])
    _compare(model, {"x": x}, clusters=2)  # two chains from x: siblings never merge


def test_float16_dequantize_rounds_to_float16():
    x = np.arange(-128, 128, dtype=np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"])]
    model = _model(nodes, [("x", TensorProto.INT8, [256])], [("y", TensorProto.FLOAT16)],
                   [("s", np.float16(0.0137)), ("z", np.int8(-3))])
    _compare(model, {"x": x})


def test_blocked_quantization_stays_in_onnxruntime_with_a_reason():
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], axis=1, block_size=4),
             helper.make_node("DequantizeLinear", ["q", "s"], ["y"], axis=1, block_size=4)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 8])], [("y", TensorProto.FLOAT)],
                   [("s", np.full((2, 2), 0.1, np.float32))])
    sess = autoclust.InferenceSession(model, min_cluster_size=1)
    assert not sess.plan.clusters
    assert "blocked quantization" in sess.explain()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want[0])
