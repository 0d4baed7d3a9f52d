"""patchify (autoclust/passes/patchify.py): a Conv whose windows tile its input becomes a
MatMul over its patches.

Checked by the ops left after the optimizer (no Conv where it applies, the Conv untouched
where it does not), by the numbers against onnxruntime (compiled, with NaN, inf and -0.0
in the input), by the weight array shared between signatures, and by the clustering: a
patch embedding joins the cluster behind it instead of running as an onnxruntime segment.
"""

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

F32 = TensorProto.FLOAT
FLAGS = flag_parser.parse("", verify_passes=True)


def conv_model(n: int | str, c: int, h: int, w: int, m: int, k: tuple[int, int],
               bias: bool = True, weights_input: bool = False, **attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(c * 31 + m)
    wt = (rng.standard_normal((m, c // attrs.get("group", 1), *k)) * 0.2).astype(np.float32)
    inits = [] if weights_input else [numpy_helper.from_array(wt, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
    inputs = [helper.make_tensor_value_info("x", F32, [n, c, h, w])]
    if weights_input:
        inputs.append(helper.make_tensor_value_info("w", F32, list(wt.shape)))
    attrs.setdefault("strides", list(k))
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"],
                            kernel_shape=list(k), **attrs)
    g = helper.make_graph([node], "patch", inputs,
                          [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def optimized_ops(model: onnx.ModelProto) -> list[str]:
    graph = import_model(model)
    types = [(np.dtype(np.float32), tuple(d.dim_value for d in vi.type.tensor_type.shape.dim))
             for vi in model.graph.input]
    return sorted(n.op for n in optimize(specialize(graph, types, {}), FLAGS).nodes)


def special(shape: tuple) -> np.ndarray:
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    for j, v in enumerate((np.nan, np.inf, -np.inf, -0.0)):
        flat[(j * 613 + 3) % flat.size] = v
    return x


def check(model: onnx.ModelProto, feeds: dict) -> None:
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = autoclust.InferenceSession(model, must_compile=True, min_cluster_size=1,
                                      autotune=False)
    got = sess.run(None, feeds)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)


TILING = [  # (n, c, h, w, m, kernel)
    (1, 3, 8, 8, 5, (4, 4)),        # Swin's and ConvNeXt's stems, small
    (1, 3, 32, 32, 16, (16, 16)),   # ViT's patch embedding
    (2, 6, 6, 10, 12, (2, 2)),      # ConvNeXt's downsampling, a batch
    (1, 4, 6, 9, 7, (2, 3)),        # non-square
    (1, 2, 4, 4, 3, (1, 2)),
]


@pytest.mark.parametrize("n,c,h,w,m,k", TILING)
@pytest.mark.parametrize("bias", [True, False])
def test_tiling_convs_become_matmuls(n, c, h, w, m, k, bias):
    model = conv_model(n, c, h, w, m, k, bias=bias)
    ops = optimized_ops(model)
    assert "Conv" not in ops and ops.count("MatMul") == 1, ops
    check(model, {"x": special((n, c, h, w))})


@pytest.mark.parametrize("why,model", [
    ("pads", conv_model(1, 3, 8, 8, 4, (2, 2), pads=[1, 1, 1, 1])),
    ("overlapping windows", conv_model(1, 3, 8, 8, 4, (3, 3), strides=[2, 2])),
    ("dilation", conv_model(1, 3, 8, 8, 4, (2, 2), dilations=[2, 2])),
    ("two groups", conv_model(1, 4, 8, 8, 4, (2, 2), group=2)),
    ("a row left over", conv_model(1, 3, 9, 8, 4, (2, 2))),
    ("1x1 (onnxruntime fuses it with its neighbours)", conv_model(1, 3, 8, 8, 4, (1, 1))),
    ("weights fed at run time", conv_model(1, 3, 8, 8, 4, (2, 2), weights_input=True)),
])
def test_other_convs_stay_convs(why, model):
    ops = optimized_ops(model)
    assert ops.count("Conv") == 1, (why, ops)
    w = model.graph.input[1] if len(model.graph.input) > 1 else None
    feeds = {"x": special(tuple(d.dim_value for d in model.graph.input[0].type.tensor_type
                                .shape.dim))}
    if w is not None:
        feeds["w"] = np.random.default_rng(0).standard_normal(
            [d.dim_value for d in w.type.tensor_type.shape.dim]).astype(np.float32)
    check(model, feeds)


def test_signatures_share_one_weight_array():
    """A new signature (another batch size) gets the same transposed weight: the library
    keeps one prepacked copy."""
    model = conv_model("N", 3, 8, 8, 5, (4, 4))
    graph = import_model(model)
    weights = []
    for n in (1, 2):
        opt = optimize(specialize(graph, [(np.dtype(np.float32), (n, 3, 8, 8))], {}), FLAGS)
        (mm,) = [x for x in opt.nodes if x.op == "MatMul"]
        weights.append(opt.constant_value(mm.inputs[1]))
    assert weights[0] is weights[1] and weights[0].shape == (48, 5)


def test_a_patch_embedding_joins_the_cluster_behind_it():
    """ViT's opening: Conv 4x4/4 -> Reshape -> Transpose -> LayerNorm: one cluster, no
    onnxruntime segment (the Conv was one before)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 4, 4)) * 0.2)
                                     .astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([1, 8, 16], np.int64), "flat"),
             numpy_helper.from_array(np.ones(8, np.float32), "g"),
             numpy_helper.from_array(np.zeros(8, np.float32), "be")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["p"], kernel_shape=[4, 4],
                              strides=[4, 4]),
             helper.make_node("Reshape", ["p", "flat"], ["f"]),
             helper.make_node("Transpose", ["f"], ["t"], perm=[0, 2, 1]),
             helper.make_node("LayerNormalization", ["t", "g", "be"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "vit", [helper.make_tensor_value_info("x", F32, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", F32, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    sess = autoclust.InferenceSession(model, autotune=False)
    assert len(sess.plan.clusters) == len(sess.plan.steps) == 1, sess.explain()
    x = special((1, 3, 16, 16))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4,
                               equal_nan=True)
