"""The cluster optimizer: specialize, fold_constants, fold_batchnorm, simplify, cse, dce and compile.py.

Each rewrite is checked twice: by the ops left in the graph (so a rule that stops firing, or
fires where it must not, fails) and by the numbers: the optimized graph must give exactly
what the specialized graph gives (interpreter), and what onnxruntime gives on the model.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.importers.onnx import import_model

from autoclust import flags as flag_parser
from autoclust.compile import compile_cluster
from autoclust.errors import CompileError, FlagError, ShapeInferenceError
from autoclust.ir import Graph, Node, Value
from autoclust.passes import copy_graph, cse, dce, fold_constants, simplify
from autoclust.passes import optimize as pipeline
from autoclust.passes.optimize import optimize
from autoclust.passes.specialize import specialize
from autoclust.runtime import interpreter

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
    # Pow by a constant stays: its lowering reduces it (x*x, sqrt, ...), written once there
    ("x**2 kept", X, Y, "c = Constant<value = float {2.0}>()\n y = Pow(x, c)", ["Pow"]),
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
     ("s1 = Constant<value = int64[2] {-1, 2}>()\n s2 = Constant<value = int64[3] {2, -1, 2}>()\n"
     " t = Reshape(x, s1)\n y = Reshape(t, s2)"), ["Reshape"]),
    ("reshape to same shape", X, Y,
     "s = Constant<value = int64[2] {-1, 4}>()\n t = Reshape(x, s)\n y = Relu(t)", ["Relu"]),
    ("squeeze/unsqueeze cancel", X, Y,
     ("a = Constant<value = int64[1] {1}>()\n t = Unsqueeze(x, a)\n u = Squeeze(t, a)\n"
     " y = Relu(u)"), ["Relu"]),
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
     ("s = Constant<value = int64[2] {1, 4}>()\n c = ConstantOfShape<value = float[1] {0.0}>(s)"
     "\n y = Add(x, c)"), ["Add"]),
    ("cse nodes", X, Y, "a = Exp(x)\n b = Exp(x)\n y = Add(a, b)", ["Add", "Exp"]),
    ("dce", X, Y, "a = Exp(x)\n b = Sqrt(a)\n y = Relu(x)", ["Relu"]),
    ("fold constants", X, Y, ("a = Constant<value = float {2.0}>()\n b = Mul(a, a)\n"
     " c = Sub(b, a)\n t = Mul(x, c)\n y = Div(t, a)"), ["Mul", "Mul"]),
]


@pytest.mark.parametrize("x,outputs,body,left", [r[1:] for r in RULES],
                         ids=[r[0] for r in RULES])
def test_rule(x, outputs, body, left):
    decl, shape = x
    _, opt = _check(_model(decl, outputs, body), [shape])
    assert _ops(opt) == sorted(left), str(opt)


SHAPE_CHAIN = """
    s = Shape(x)
    i = Constant<value = int64[1] {0}>()
    n = Gather<axis = 0>(s, i)
    m = Constant<value = int64[2] {2, 2}>()
    c = Concat<axis = 0>(n, m)
    y = Reshape(x, c)
"""

# The form exporters write: a scalar Gather, then Unsqueeze.
SHAPE_CHAIN_SCALAR = """
    s = Shape(x)
    i = Constant<value = int64 {0}>()
    n = Gather<axis = 0>(s, i)
    a = Constant<value = int64[1] {0}>()
    u = Unsqueeze(n, a)
    m = Constant<value = int64[2] {2, 2}>()
    c = Concat<axis = 0>(u, m)
    y = Reshape(x, c)
"""


@pytest.mark.parametrize("body", [SHAPE_CHAIN, SHAPE_CHAIN_SCALAR])
def test_specialize_then_fold_shape_chain(body):
    spec, opt = _check(_model("float[N,4] x", "float[N,2,2] y", body), [(3, 4)])
    assert all(v.is_static() for n in spec.nodes for v in n.outputs)
    assert spec.nodes[-1].outputs[0].shape == (3, 2, 2)
    assert _ops(opt) == ["Reshape"]
    target = opt.constant_value(opt.nodes[0].inputs[1])
    np.testing.assert_array_equal(target, [3, 2, 2])


def test_shape_values_become_constants_and_inputs_stay():
    model = _model("float[N,4] x, int64[3] s", "float[A,B,C] y", "y = Reshape(x, s)")
    graph = import_model(model)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    s = np.array([2, 3, 2], np.int64)
    types = [(x.dtype, x.shape), (s.dtype, s.shape)]
    spec = specialize(graph, types, {"s": s})
    assert [v.name for v in spec.inputs] == ["x", "s"] and not spec.inputs[1].uses
    assert spec.outputs[0].shape == (2, 3, 2)
    exe = compile_cluster(graph, types, {"s": s}, FLAGS, interpreter)
    (out,) = exe.run([x, s])
    np.testing.assert_array_equal(out, _ort(model, graph, [x, s])[0])
    assert graph.outputs[0].shape is not None and not graph.outputs[0].is_static()  # untouched


@pytest.mark.parametrize("types,shape_values,message", [
    ([(np.float32, (3, 5))], {}, "input 'x': declared shape [N,4], got [3,5]"),
    ([(np.float64, (3, 4))], {}, "input 'x': declared dtype float32"),
    ([], {}, "has 1 inputs, got 0"),
    ([(np.float32, (3, 4))], {"zz": np.zeros(1)}, "['zz']"),
])
def test_specialize_rejects_bad_types(types, shape_values, message):
    graph = import_model(_model("float[N,4] x", Y, "y = Relu(x)"))
    with pytest.raises(ShapeInferenceError) as info:
        specialize(graph, types, shape_values)
    assert message in str(info.value)


def test_specialize_names_node_without_shape_value():
    graph = import_model(_model("float[N,4] x, int64[3] s", "float[A,B,C] y",
                                "y = Reshape(x, s)"))
    with pytest.raises(ShapeInferenceError, match="Reshape"):
        specialize(graph, [(np.float32, (3, 4)), (np.int64, (3,))], {})


def test_specialize_names_node_on_broadcast_mismatch():
    graph = import_model(_model("float[N,4] x, float[M,4] z", Y, "y = Add(x, z)"))
    with pytest.raises(ShapeInferenceError, match="Add"):
        specialize(graph, [(np.float32, (3, 4)), (np.float32, (2, 4))], {})


def test_constant_and_input_outputs():
    model = _model("float[N,4] x", "float[2] y, float[N,4] z",
                   "a = Constant<value = float[2] {1.5, 2.0}>()\n y = Mul(a, a)\n z = Identity(x)")
    graph = import_model(model)
    _spec, opt = _check(model, [(3, 4)])
    assert opt.nodes == []
    assert opt.outputs[0].name in opt.initializers and opt.outputs[1] is opt.inputs[0]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    y, z = compile_cluster(graph, [(x.dtype, x.shape)], {}, FLAGS, interpreter).run([x])
    np.testing.assert_array_equal(y, [2.25, 4.0])
    np.testing.assert_array_equal(z, x)
    assert z is not x


def test_disable_passes():
    model = _model("float[N,4] x", Y, "c = Constant<value = float {1.0}>()\n y = Mul(x, c)")
    _, opt = _check(model, [(3, 4)], FLAGS.replace(disable_passes="simplify"))
    assert _ops(opt) == ["Mul"]
    _, opt = _check(model, [(3, 4)], FLAGS.replace(disable_passes="fold_constants,cse,dce"))
    assert _ops(opt) == []
    with pytest.raises(FlagError, match="fold_constants, fold_batchnorm, simplify, cse, patchify, siblings, dce, fuse_attention"):
        optimize(import_model(model), FLAGS.replace(disable_passes="simplfy"))


def _break_ssa(graph: Graph) -> Graph:
    """A buggy pass: a second producer of an existing value."""
    node = graph.nodes[0]
    graph.add_node(Node("Relu", [graph.inputs[0]], [node.outputs[0]], name="dup"))
    return graph


def _forget_shape(graph: Graph) -> Graph:
    graph.nodes[0].outputs[0].shape = ("N", 4)
    return graph


@pytest.mark.parametrize("bad,message", [(_break_ssa, "wrong producer|not SSA"),
                                         (_forget_shape, "without a concrete dtype")])
def test_verify_passes_names_the_bad_pass(monkeypatch, bad, message):
    graph = import_model(_model("float[N,4] x", Y, "a = Exp(x)\n y = Relu(a)"))
    spec = specialize(graph, [(np.float32, (3, 4))], {})
    monkeypatch.setattr(pipeline, "PASSES", [*pipeline.PASSES, ("bad_pass", bad)])
    with pytest.raises(CompileError, match=f"after pass bad_pass.*({message})"):
        optimize(spec, FLAGS)


def test_compile_cluster_dumps_both_graphs():
    model = _model("float[N,4] x", Y, "c = Constant<value = float {1.0}>()\n t = Mul(x, c)\n"
                   " y = Exp(t)")
    graph = import_model(model)
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    exe = compile_cluster(graph, [(x.dtype, x.shape)], {}, FLAGS, interpreter)
    assert "Mul(" in exe.dumps[".before_optimizations.txt"]
    assert "float32[5,4]" in exe.dumps[".before_optimizations.txt"]
    assert "Mul(" not in exe.dumps[".after_optimizations.txt"]
    assert exe.num_kernels == 1
    np.testing.assert_allclose(exe.run([x])[0], _ort(model, graph, [x])[0], rtol=1e-6)


def test_fixed_point():
    model = _model("float[N,4] x", Y, """
        one = Constant<value = float {1.0}>()
        two = Constant<value = float {2.0}>()
        k = Sub(two, one)
        a = Identity(x)
        b = Identity(x)
        ea = Exp(a)
        eb = Exp(b)
        s = Mul(ea, k)
        t = Add(s, eb)
        y = Pow(t, two)""")
    _spec, opt = _check(model, [(3, 4)])
    assert _ops(opt) == ["Add", "Exp", "Pow"]
    assert str(optimize(opt, FLAGS)) == str(opt)


@pytest.mark.parametrize("case", ["to_matmul", "transpose_read_twice", "not_to_matmul"])
def test_unary_op_moves_before_the_layout_ops_feeding_a_matmul(case):
    """Sigmoid(Transpose(Reshape(x))) @ w -> FusedMatMul(Sigmoid(Reshape(x)), w, transA):
    the elementwise op runs in x's own order and the transpose becomes the GEMM's flag
    (simplify._unary_before_transpose); nothing moves when the transposed value has another
    reader or the result does not reach a MatMul. Same outputs to the bit either way."""
    outputs, tail = {
        "to_matmul": ("float[2,6,6] y", "y = MatMul(s, w)"),
        "transpose_read_twice": ("float[2,6,6] y, float[2,6,4] t", "y = MatMul(s, w)"),
        "not_to_matmul": ("float[2,6,4] y", "y = Relu(s)")}[case]
    model = _model("float[2,4,3,2] x, float[4,6] w", outputs, f"""
        shape = Constant<value = int64[3] {{2, 4, 6}}>()
        r = Reshape(x, shape)
        t = Transpose<perm = [0, 2, 1]>(r)
        s = Sigmoid(t)
        {tail}""")
    _spec, opt = _check(model, [(2, 4, 3, 2), (4, 6)])
    sigmoid = next(n for n in opt.nodes if n.op == "Sigmoid")
    assert (sigmoid.inputs[0].shape != (2, 6, 4)) == (case == "to_matmul")  # x's order
    if case == "to_matmul":
        assert _ops(opt) == ["FusedMatMul", "Reshape", "Sigmoid"]


# Attention's K^T as the dynamo exporter writes it: heads folded into the batch around the
# transpose ([1, S, H, D] -> [1, H, S, D] -> [H, S, D] -> [H, D, S] -> [1, H, D, S]).
KEY_CHAIN = """
    hs = Constant<value = int64[3] {4, 6, 8}>()
    bs = Constant<value = int64[4] {1, 4, 8, 6}>()
    t1 = Transpose<perm = [0, 2, 1, 3]>(k)
    r1 = Reshape(t1, hs)
    t2 = Transpose<perm = [0, 2, 1]>(r1)
    kt = Reshape(t2, bs)
"""


@pytest.mark.parametrize("case", ["key", "key_read_twice", "a_side", "unsqueeze"])
def test_transposes_around_unit_dims_become_the_gemm_flag(case):
    """A view adding or dropping dims of 1 after a Transpose moves before it
    (simplify._unit_dims_after_transpose), the transposes compose, and a Transpose that
    moves batch dims but keeps the rows' dim next to last splits into a row-keeping
    transpose and the GEMM's trans flag (_rows_kept): K^T above becomes FusedMatMul(q,
    Transpose(k, [0, 2, 1, 3]), transB=1). A transposed value read twice stays."""
    inputs, outputs, body, shapes = {
        "key": ("float[1,6,4,8] k, float[1,4,6,8] q", "float[1,4,6,6] y",
                KEY_CHAIN + "y = MatMul(q, kt)", [(1, 6, 4, 8), (1, 4, 6, 8)]),
        "key_read_twice": ("float[1,6,4,8] k, float[1,4,6,8] q", ("float[1,4,6,6] y, "
                           "float[1,4,8,6] kt"), KEY_CHAIN + "y = MatMul(q, kt)",
                           [(1, 6, 4, 8), (1, 4, 6, 8)]),
        "a_side": ("float[1,8,4,6] x, float[1,4,8,5] b", "float[1,4,6,5] y",
                   "a = Transpose<perm = [0, 2, 3, 1]>(x)\n y = MatMul(a, b)",
                   [(1, 8, 4, 6), (1, 4, 8, 5)]),
        "unsqueeze": ("float[2,4,5] x", "float[1,2,4,5] y",
                      ("ax = Constant<value = int64[1] {0}>()\n t = Transpose<perm = [1, 0, 2]>(x)"
                      "\n u = Unsqueeze(t, ax)\n v = Transpose<perm = [0, 2, 1, 3]>(u)"
                      "\n y = Relu(v)"), [(2, 4, 5)]),
    }[case]
    _spec, opt = _check(_model(inputs, outputs, body), shapes)
    transposes = [n.attr("perm") for n in opt.nodes if n.op == "Transpose"]
    gemm = next((n for n in opt.nodes if n.op in ("MatMul", "FusedMatMul")), None)
    if case == "key":
        assert _ops(opt) == ["FusedMatMul", "Transpose"] and transposes == [[0, 2, 1, 3]]
        assert (gemm.attr("transA"), gemm.attr("transB")) == (0, 1)
        assert gemm.inputs[1].producer.inputs[0] is opt.inputs[0]  # k itself, transposed
    elif case == "key_read_twice":
        assert gemm.op == "MatMul"  # the K^T copy is an output anyway
    elif case == "a_side":
        assert _ops(opt) == ["FusedMatMul", "Transpose"] and transposes == [[0, 2, 1, 3]]
        assert (gemm.attr("transA"), gemm.attr("transB")) == (1, 0)
    else:
        assert _ops(opt) == ["Relu", "Reshape"]  # the two transposes cancel


def _typed(graph: Graph) -> Graph:
    """Give every node output its inferred type (what specialize does), for IR-built graphs."""
    return specialize(graph, [(v.dtype, v.shape) for v in graph.inputs], {})


def test_fold_size_limits():
    g = Graph("limits")
    x = g.add_input("x", np.float32, (4,))
    big = g.add_initializer("big", np.array([2048, 1024], np.int64))
    small = g.add_initializer("small", np.array([2, 3], np.int64))
    g.make_node("ConstantOfShape", [big])  # 2M elements: over MAX_FOLD_ELEMENTS
    g.make_node("ConstantOfShape", [small])  # 6 elements: folds
    scalar = g.add_initializer("s", np.array(1.5, np.float32))
    wide = g.add_initializer("wide", np.array([4096], np.int64))
    g.make_node("Expand", [scalar, wide])  # grows 1 -> 4096: cheaper to compute than load
    g.make_node("Shape", [x])  # x is not constant, but its shape is
    table = g.add_initializer("table", np.arange(8, dtype=np.float32).reshape(2, 4))
    idx = g.add_initializer("idx", np.arange(2048, dtype=np.int64).reshape(64, 32) % 4)
    g.make_node("Gather", [table, idx], attrs={"axis": 1})  # grows 2056 -> 4096: folds
    g.outputs = [n.outputs[0] for n in g.nodes]
    g = fold_constants(_typed(g))
    assert _ops(g) == ["ConstantOfShape", "Expand"]
    np.testing.assert_array_equal(g.initializers[g.outputs[1].name], np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(g.initializers[g.outputs[3].name], [4])
    np.testing.assert_array_equal(g.initializers[g.outputs[4].name],
                                  np.arange(8, dtype=np.float32).reshape(2, 4)[:, np.arange(2048).reshape(64, 32) % 4])
    g.verify()


def test_fold_leaves_ops_outside_the_table():
    g = Graph("custom")
    c = g.add_initializer("c", np.ones(3, np.float32))
    out = Value("r", np.float32, (3,))
    g.add_node(Node("RandomUniformLike", [c], [out]))
    g.add_node(Node("Noise", [c], [Value("n", np.float32, (3,))], domain="com.example"))
    g.outputs = [n.outputs[0] for n in g.nodes]
    assert _ops(fold_constants(g)) == ["Noise", "RandomUniformLike"]


def test_cse_compares_attrs_by_value_and_merges_constants():
    g = Graph("cse")
    x = g.add_input("x", np.float32, (2, 3, 4))
    t1 = g.make_node("Transpose", [x], attrs={"perm": [2, 0, 1]}).outputs[0]
    t2 = g.make_node("Transpose", [x], attrs={"perm": (2, 0, 1)}).outputs[0]
    t3 = g.make_node("Transpose", [x], attrs={"perm": [1, 2, 0]}).outputs[0]
    c1 = g.add_initializer("c1", np.full((3,), 2.0, np.float32))
    c2 = g.add_initializer("c2", np.full((3,), 2.0, np.float32))
    c3 = g.add_initializer("c3", np.full((3,), -2.0, np.float32))
    a1 = g.make_node("Add", [t1, c1]).outputs[0]
    a2 = g.make_node("Add", [t2, c2]).outputs[0]
    a3 = g.make_node("Add", [t1, c3]).outputs[0]
    g.outputs = [a1, a2, a3, t3]
    spec = _typed(g)
    feeds = _feeds(spec, [(2, 3, 4)])
    before = interpreter.evaluate(spec, feeds)
    out = dce(cse(copy_graph(spec)))
    assert _ops(out) == ["Add", "Add", "Transpose", "Transpose"]
    assert out.outputs[0] is out.outputs[1] and sorted(out.initializers) == ["c1", "c3"]
    for b, a in zip(before, interpreter.evaluate(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_dce_keeps_inputs_and_drops_unused_constants():
    g = Graph("dce")
    x = g.add_input("x", np.float32, (3,))
    unused_in = g.add_input("unused", np.float32, (3,))
    c = g.add_initializer("c", np.ones(3, np.float32))
    g.add_initializer("dead", np.ones(3, np.float32))
    e = g.make_node("Exp", [x]).outputs[0]
    g.make_node("Add", [e, c])  # dead; Exp stays as it is a graph output
    g.outputs = [e]
    out = dce(_typed(g))
    assert _ops(out) == ["Exp"] and [v.name for v in out.inputs] == [x.name, unused_in.name]
    assert list(out.initializers) == []
    out.verify()


def test_dropout_with_used_mask_stays():
    model = _model("float[N,4] x", "float[N,4] y, bool[N,4] m", "y, m = Dropout(x)")
    _, opt = _check(model, [(3, 4)])
    assert _ops(opt) == ["Dropout"]


def test_rule_forwarding_to_a_graph_output():
    model = _model("float[N,4] x", Y, "c = Constant<value = float {1.0}>()\n y = Mul(x, c)")
    graph = import_model(model)
    _, opt = _check(model, [(3, 4)])
    assert opt.nodes == [] and opt.outputs[0] is opt.inputs[0]
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    (y,) = compile_cluster(graph, [(x.dtype, x.shape)], {}, FLAGS, interpreter).run([x])
    np.testing.assert_array_equal(y, x)


def test_simplify_alone_is_one_sweep():
    # Without fold/cse/dce, simplify still rewrites in place and keeps the graph valid.
    g = import_model(_model("float[N,4] x", Y, "t = Neg(x)\n u = Neg(t)\n y = Identity(u)"))
    out = simplify(specialize(g, [(np.float32, (3, 4))], {}))
    out.verify()
    assert _ops(out) == ["Neg"] and out.outputs[0] is out.inputs[0]
