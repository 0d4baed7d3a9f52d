"""bfloat16 models and onnxruntime references (test_bfloat16, test_gpu_types)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from autoclust.backends.ort import values
from onnx import TensorProto, helper

BF = TensorProto.BFLOAT16


F = TensorProto.FLOAT


BF16 = np.dtype(ml_dtypes.bfloat16)


def model(nodes, inputs, outputs, inits=()):
    """A model; inputs/outputs are (name, elem type, shape)."""
    g = helper.make_graph(nodes, "bf16", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs],
                          initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def emulated(m: onnx.ModelProto) -> onnx.ModelProto:
    """m in float32, each bfloat16 result rounded by onnxruntime's Cast pair at its producer."""
    typed = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    elem = {v.name: v.type.tensor_type.elem_type
            for v in list(typed.graph.value_info) + list(typed.graph.input)
            + list(typed.graph.output)}
    g = onnx.GraphProto()
    g.CopyFrom(m.graph)
    del g.node[:]
    for node in m.graph.node:
        node = onnx.NodeProto.FromString(node.SerializeToString())
        renamed = []
        for k, out in enumerate(node.output):
            if elem.get(out) == BF:
                node.output[k] = out + "__wide"
                renamed.append(out)
        for a in node.attribute:
            if a.name == "to" and a.i == BF:
                a.i = F  # the Cast pair below rounds
        g.node.append(node)
        for out in renamed:
            g.node.append(helper.make_node("Cast", [out + "__wide"], [out + "__bf"], to=BF))
            g.node.append(helper.make_node("Cast", [out + "__bf"], [out], to=F))
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == BF:
            v.type.tensor_type.elem_type = F
    for t in g.initializer:
        if t.data_type == BF:
            t.CopyFrom(onnx.numpy_helper.from_array(
                onnx.numpy_helper.to_array(t).astype(np.float32), t.name))
    out = helper.make_model(g, opset_imports=list(m.opset_import))
    out.ir_version = 10
    return out


def ort_reference(m, feeds):
    sess = ort.InferenceSession(emulated(m).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    wide = {k: (v.astype(np.float32) if v.dtype == BF16 else v) for k, v in feeds.items()}
    return sess.run(None, wide)


def ort_plain(m, feeds):
    """onnxruntime on the model itself (Cast is its one CPU bfloat16 kernel); bfloat16 goes
    in and out as OrtValues."""
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return values.run(sess, None, feeds)[0]


EDGE = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20,
                 np.nan, -np.inf, np.inf, 3.4e38, -3.39e38, 1e20, 1e-39, -1e-40, -0.0, 0.0,
                 1e-45, 65504.0, 0.1, -2.5, 7.0, 1e-3], np.float32)


# op -> (attrs, bfloat16 steps allowed: 0 = exact, 1 where float32 math may differ by an ulp)
UNARY = {"Relu": ({}, 0), "Neg": ({}, 0), "Abs": ({}, 0), "Sqrt": ({}, 0), "Floor": ({}, 0),
         "Sigmoid": ({}, 1), "Tanh": ({}, 1), "Exp": ({}, 1), "Log": ({}, 1), "Erf": ({}, 1),
         "Reciprocal": ({}, 0), "Softplus": ({}, 1), "LeakyRelu": ({"alpha": 0.1}, 0),
         "Gelu": ({}, 1), "HardSigmoid": ({}, 0), "Sin": ({}, 1), "Round": ({}, 0)}
