"""The cluster optimizer: specialize, fold_constants, simplify, cse, dce and compile.py.

Each rewrite is checked twice: by the ops left in the graph (so a rule that stops firing, or
fires where it must not, fails) and by the numbers: the optimized graph must give exactly
what the specialized graph gives (interpreter), and what onnxruntime gives on the model.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

from autoclust import compile as pipeline
from autoclust import flags as flag_parser
from autoclust import interpreter
from autoclust.compile import compile_cluster, optimize, specialize
from autoclust.errors import CompileError, FlagError, ShapeInferenceError
from autoclust.importers.onnx import import_model
from autoclust.ir import Graph, Node, Value
from autoclust.passes import cse, dce, fold_constants, simplify

FLAGS = flag_parser.parse("", verify_passes=True)
RNG = np.random.default_rng(0)


def _model(inputs: str, outputs: str, body: str) -> onnx.ModelProto:
    text = f'<ir_version: 10, opset_import: ["" : 18]>\ng ({inputs}) => ({outputs}) {{\n{body}\n}}'
    return onnx.parser.parse_model(text)


def _feeds(graph: Graph, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    feeds = []
    for v, shape in zip(graph.inputs, shapes):
        x = RNG.standard_normal(shape) * 3
        if x.size:
            x.flat[0] = -0.0  # signed zeros are where inexact "identities" show
        feeds.append(x.astype(v.dtype))
    return feeds


def _ort(model: onnx.ModelProto, graph: Graph, feeds: list[np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {v.name: x for v, x in zip(graph.inputs, feeds)})


def _ops(graph: Graph) -> list[str]:
    return sorted(n.op for n in graph.nodes)


def _check(model: onnx.ModelProto, shapes: list[tuple[int, ...]],
           flags: flag_parser.Flags = FLAGS) -> tuple[Graph, Graph]:
    """Specialize + optimize `model`; assert outputs equal before/after and vs onnxruntime."""
    graph = import_model(model)
    feeds = _feeds(graph, shapes)
    spec = specialize(graph, [(x.dtype, x.shape) for x in feeds], {})
    opt = optimize(spec, flags)
    before = interpreter.evaluate(spec, feeds)
    after = interpreter.evaluate(opt, feeds)
    expected = _ort(model, graph, feeds)
    for b, a, e in zip(before, after, expected):
        assert a.dtype == b.dtype == e.dtype and a.shape == b.shape == e.shape
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)
    return spec, opt


# (input declaration, concrete shape fed)
X = ("float[N,4] x", (3, 4))
X3 = ("float[N,4,5] x", (3, 4, 5))
Y = "float[N,4] y"
RULES = [
    # (id, inputs, outputs, body, ops left after optimize)
    ("x*1", X, Y, "c = Constant<value = float {1.0}>()\n t = Mul(x, c)\n y = Relu(t)", ["Relu"]),
    ("1*x", X, Y, "c = Constant<value = float {1.0}>()\n t = Mul(c, x)\n y = Relu(t)", ["Relu"]),
    ("x+0", X, Y, "c = Constant<value = float {0.0}>()\n t = Add(x, c)\n y = Relu(t)", ["Relu"]),
    ("0+x", X, Y, "c = Constant<value = float {0.0}>()\n t = Add(c, x)\n y = Relu(t)", ["Relu"]),
    ("x-0", X, Y, "c = Constant<value = float {0.0}>()\n t = Sub(x, c)\n y = Relu(t)", ["Relu"]),
    ("x/1", X, Y, "c = Constant<value = float {1.0}>()\n t = Div(x, c)\n y = Relu(t)", ["Relu"]),
    ("x**1", X, Y, "c = Constant<value = float {1.0}>()\n t = Pow(x, c)\n y = Relu(t)",
     ["Relu"]),
    ("x**2", X, Y, "c = Constant<value = float {2.0}>()\n y = Pow(x, c)", ["Mul"]),
    ("abs**0.5", X, Y, "c = Constant<value = float {0.5}>()\n a = Abs(x)\n y = Pow(a, c)",
     ["Abs", "Sqrt"]),
    ("x**0.5 kept", X, Y, "c = Constant<value = float {0.5}>()\n y = Pow(x, c)", ["Pow"]),
    ("x/4", X, Y, "c = Constant<value = float {4.0}>()\n y = Div(x, c)", ["Mul"]),
    ("x/3 kept", X, Y, "c = Constant<value = float {3.0}>()\n y = Div(x, c)", ["Div"]),
    ("x/powers of two", X, Y,
     "c = Constant<value = float[1,4] {0.125, 2.0, -0.5, 1024.0}>()\n y = Div(x, c)", ["Mul"]),
    ("x/mixed kept", X, Y,
     "c = Constant<value = float[1,4] {0.125, 2.0, 3.0, 1024.0}>()\n y = Div(x, c)", ["Div"]),
    ("transpose pair cancels", X3, "float[N,4,5] y",
     "t = Transpose<perm = [1, 0, 2]>(x)\n y = Transpose<perm = [1, 0, 2]>(t)", []),
    ("transpose pair composes", X3, "float[5,4,N] y",
     "t = Transpose<perm = [1, 2, 0]>(x)\n y = Transpose<perm = [1, 0, 2]>(t)", ["Transpose"]),
    ("transpose default perms", X, Y, "t = Transpose(x)\n u = Transpose(t)\n y = Relu(u)",
     ["Relu"]),
    ("reshape of reshape", X, "float[2,N,2] y",
     "s1 = Constant<value = int64[2] {-1, 2}>()\n s2 = Constant<value = int64[3] {2, -1, 2}>()\n"
     " t = Reshape(x, s1)\n y = Reshape(t, s2)", ["Reshape"]),
    ("reshape to same shape", X, Y,
     "s = Constant<value = int64[2] {-1, 4}>()\n t = Reshape(x, s)\n y = Relu(t)", ["Relu"]),
    ("squeeze/unsqueeze cancel", X, Y,
     "a = Constant<value = int64[1] {1}>()\n t = Unsqueeze(x, a)\n u = Squeeze(t, a)\n"
     " y = Relu(u)", ["Relu"]),
    ("cast same dtype", X, Y, "t = Cast<to = 1>(x)\n y = Relu(t)", ["Relu"]),
    ("cast other dtype kept", X, "double[N,4] y", "y = Cast<to = 11>(x)", ["Cast"]),
    ("identity", X, Y, "t = Identity(x)\n y = Relu(t)", ["Relu"]),
    ("dropout", X, Y, "t = Dropout(x)\n y = Relu(t)", ["Relu"]),
    ("neg neg", X, Y, "t = Neg(x)\n u = Neg(t)\n y = Relu(u)", ["Relu"]),
    ("expand same shape", X, Y,
     "s = Constant<value = int64[2] {1, 4}>()\n t = Expand(x, s)\n y = Relu(t)", ["Relu"]),
    ("expand that broadcasts kept", ("float[4] x", (4,)), "float[3,4] y",
     "s = Constant<value = int64[2] {3, 4}>()\n y = Expand(x, s)", ["Expand"]),
    # x*ones([4,3]) with x [3] broadcasts: it is not x.
    ("broadcasting x*1 kept", ("float[3] x", (3,)), "float[4,3] y",
     "c = Constant<value = float[4,3] {1,1,1,1,1,1,1,1,1,1,1,1}>()\n y = Mul(x, c)", ["Mul"]),
    ("broadcasting x+0 kept", ("float[N,1] x", (3, 1)), "float[N,4] y",
     "s = Constant<value = int64[2] {1, 4}>()\n c = ConstantOfShape<value = float[1] {0.0}>(s)"
     "\n y = Add(x, c)", ["Add"]),
    ("cse nodes", X, Y, "a = Exp(x)\n b = Exp(x)\n y = Add(a, b)", ["Add", "Exp"]),
    ("dce", X, Y, "a = Exp(x)\n b = Sqrt(a)\n y = Relu(x)", ["Relu"]),
    ("fold constants", X, Y, "a = Constant<value = float {2.0}>()\n b = Mul(a, a)\n"
     " c = Sub(b, a)\n t = Mul(x, c)\n y = Div(t, a)", ["Mul", "Mul"]),
]


@pytest.mark.parametrize("x,outputs,body,left", [r[1:] for r in RULES],
                         ids=[r[0] for r in RULES])
def test_rule(x, outputs, body, left):
    decl, shape = x
    _, opt = _check(_model(decl, outputs, body), [shape])
    assert _ops(opt) == sorted(left), str(opt)
