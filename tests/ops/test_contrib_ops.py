"""onnxruntime contrib ops (autoclust/ops/contrib.py): compiled vs onnxruntime's own kernels.

Every case runs the same model in onnxruntime (which implements these ops) and compiled by
autoclust with every node in one cluster; outputs must match in dtype, shape and value,
including NaN/+-inf/1e20 rows. A model with Attention checks that the nodes after it
cluster (its types come from the op table: ONNX shape inference knows no contrib op).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import autoclust

MS = "com.microsoft"
RNG = np.random.default_rng(3)
SPECIAL = np.array([np.inf, -np.inf, np.nan, 1e20, -1e20, 0.0, -0.0, 3.0], np.float32)


def _model(nodes: list, inputs: list, outputs: list) -> bytes:
    g = helper.make_graph(
        nodes, "contrib", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def _compare(model: bytes, feeds: dict, rtol: float = 1e-5, atol: float = 1e-6,
             clusters: int = 1, must_compile: bool = True) -> autoclust.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = autoclust.InferenceSession(model, min_cluster_size=1, must_compile=must_compile)
    got = sess.run(None, feeds)
    assert len(sess.plan.clusters) == clusters, sess.explain()
    assert all(c["fallback"] is None for c in sess.stats()["clusters"])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True)
    return sess


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op,bias,attrs", [
    ("Gelu", False, {}), ("BiasGelu", True, {}), ("FastGelu", True, {}),
    ("FastGelu", False, {}), ("QuickGelu", False, {}), ("QuickGelu", False, {"alpha": 1.5})])
@pytest.mark.parametrize("special", [False, True])
def test_gelu_family_matches_onnxruntime(op, bias, attrs, special):
    x = np.tile(SPECIAL, (3, 1)) if special else _f32(3, 8) * 4
    ins = [("x", TensorProto.FLOAT, [3, 8])] + ([("b", TensorProto.FLOAT, [8])] if bias else [])
    nodes = [helper.make_node(op, [n for n, _, _ in ins], ["g"], domain=MS, **attrs),
             helper.make_node("Mul", ["g", "x"], ["y"])]  # a standard op after it, fused
    feeds = {"x": x} | ({"b": _f32(8)} if bias else {})
    # erf-Gelu's tail (1 + erf(x) for x << 0) cancels: onnxruntime's erf and ours differ by
    # ~1e-7 absolute there
    sess = _compare(_model(nodes, ins, [("y", TensorProto.FLOAT)]), feeds, atol=1e-5)
    assert [c["kernels"] for c in sess.stats()["clusters"]] == [[1]]


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("optional", [(), ("beta",), ("beta", "bias")])
@pytest.mark.parametrize("skip_shape", [[2, 5, 16], [5, 16]])
def test_skip_norms_match_onnxruntime_on_every_output(op, optional, skip_shape):
    simplified = op.startswith("SkipSimplified")
    if simplified and optional == ("beta",):
        pytest.skip("the simplified form has no beta")
    names = ["x", "skip", "gamma"] + [n for n in optional if not (simplified and n == "beta")]
    shapes = {"x": [2, 5, 16], "skip": skip_shape, "gamma": [16], "beta": [16], "bias": [16]}
    ins = [(n, TensorProto.FLOAT, shapes[n]) for n in names]
    outs = ["y", "mean", "inv_std", "sum"]
    nodes = [helper.make_node(op, names, outs, domain=MS, epsilon=1e-5)]
    feeds = {n: _f32(*shapes[n]) for n in names}
    feeds["x"][1, 2] += 3  # an offset row (a large one separates onnxruntime's one-pass
    # variance from the exact one: see autoclust/ops/contrib.py)
    _compare(_model(nodes, ins, [(o, TensorProto.FLOAT) for o in outs]), feeds, rtol=2e-5,
             atol=1e-5)


def test_skip_layer_norm_default_epsilon_is_1e_12():
    ins = [("x", TensorProto.FLOAT, [1, 2, 8]), ("s", TensorProto.FLOAT, [1, 2, 8]),
           ("g", TensorProto.FLOAT, [8])]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "s", "g"], ["y", "m", "inv"],
                              domain=MS)]
    feeds = {"x": np.ones((1, 2, 8), np.float32), "s": np.zeros((1, 2, 8), np.float32),
             "g": np.ones(8, np.float32)}
    sess = _compare(_model(nodes, ins, [("y", 1), ("m", 1), ("inv", 1)]), feeds, rtol=1e-6)
    assert sess.run(["inv"], feeds)[0].ravel()[0] == pytest.approx(1e6, rel=1e-5)


@pytest.mark.parametrize("with_inv", [False, True])
def test_simplified_layer_norm_matches_onnxruntime(with_inv):
    ins = [("x", TensorProto.FLOAT, [4, 32]), ("g", TensorProto.FLOAT, [32])]
    outs = ["y", "inv"] if with_inv else ["y"]
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], outs, epsilon=1e-6)]
    feeds = {"x": _f32(4, 32), "g": _f32(32)}
    _compare(_model(nodes, ins, [(o, TensorProto.FLOAT) for o in outs]), feeds)


def test_float16_skip_layer_norm_keeps_float32_statistics():
    ins = [("x", TensorProto.FLOAT16, [2, 3, 8]), ("s", TensorProto.FLOAT16, [2, 3, 8]),
           ("g", TensorProto.FLOAT16, [8])]
    outs = [("y", TensorProto.FLOAT16), ("m", TensorProto.FLOAT), ("inv", TensorProto.FLOAT)]
    nodes = [helper.make_node("SkipLayerNormalization", ["x", "s", "g"], [o for o, _ in outs],
                              domain=MS)]
    feeds = {n: _f32(*s).astype(np.float16) for n, _, s in ins}
    _compare(_model(nodes, ins, outs), feeds, rtol=2e-3, atol=2e-3)


def test_nodes_after_attention_get_types_and_cluster():
    hidden, heads = 16, 2
    ins = [("x", TensorProto.FLOAT, [1, 6, hidden]), ("w", TensorProto.FLOAT, [hidden, 48]),
           ("b", TensorProto.FLOAT, [48]), ("g", TensorProto.FLOAT, [hidden])]
    nodes = [helper.make_node("Attention", ["x", "w", "b"], ["att"], domain=MS,
                              num_heads=heads),
             helper.make_node("SkipLayerNormalization", ["att", "x", "g"], ["n"], domain=MS),
             helper.make_node("Gelu", ["n"], ["y"], domain=MS)]
    feeds = {"x": _f32(1, 6, hidden), "w": _f32(hidden, 48) * 0.3, "b": _f32(48),
             "g": _f32(hidden)}
    model = _model(nodes, ins, [("y", TensorProto.FLOAT)])
    sess = _compare(model, feeds, must_compile=False)
    (cluster,) = sess.plan.clusters
    assert sorted(n.op for n in cluster.nodes) == ["Gelu", "SkipLayerNormalization"]
    assert "Attention keeps onnxruntime's fused kernel" in sess.explain()
    # the NumPy reference of the plain form agrees with onnxruntime's kernel
    from autoclust import ops
    ref = ops.get("Attention", MS).ref([feeds["x"], feeds["w"], feeds["b"]], {"num_heads": 2})
    want = ort.InferenceSession(_model(nodes[:1], ins[:3], [("att", 1)]),
                                providers=["CPUExecutionProvider"]).run(
        None, {n: feeds[n] for n in ("x", "w", "b")})
    np.testing.assert_allclose(ref[0], want[0], rtol=1e-4, atol=1e-5)


def test_bias_of_the_wrong_length_names_the_node():
    ins = [("x", TensorProto.FLOAT, [3, 8]), ("b", TensorProto.FLOAT, [7])]
    nodes = [helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=MS, name="bg")]
    sess = autoclust.InferenceSession(_model(nodes, ins, [("y", 1)]), must_compile=True,
                                      min_cluster_size=1)
    feeds = {"x": _f32(3, 8), "b": _f32(7)}
    # onnxruntime rejects these inputs too: bad input (also its InvalidArgument), not a
    # compile failure, even under must_compile
    with pytest.raises(autoclust.errors.InvalidInputError, match=r"'bg'.*bias shape \[7\]"):
        sess.run(None, feeds)
