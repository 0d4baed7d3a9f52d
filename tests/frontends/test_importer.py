"""ONNX importer and exporter: forms, round trips, subgraphs, malformed models.

Every model here runs in onnxruntime three ways and must agree: as written, after
import -> export (original protos), and exported from the normalized newest forms only
(protos dropped), which checks the rewrites of older opset forms.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.importers import export_model, import_model, load_model_proto
from autoclust.importers.onnx.export import ExportError
from autoclust.importers.onnx.forms import LEGACY
from onnx import TensorProto, helper, numpy_helper

from autoclust import ops
from autoclust.errors import ModelLoadError

RNG = np.random.default_rng(0)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    model.ir_version = 10
    return model


def model_text(opset: int, signature: str, body: str) -> str:
    return f'<ir_version: 10, opset_import: ["" : {opset}]>\nm {signature} {{\n{body}\n}}'


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def strip_protos(graph) -> None:
    """Forget original NodeProtos (legacy nodes need theirs): exports the newest forms."""
    for node in graph.nodes:
        if node.domain != LEGACY:
            node.proto = None


def check_three_ways(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """Original, round-tripped and newest-form models give identical outputs."""
    expected = run(model, feeds)
    graph = import_model(model)
    graph.verify()
    assert_same(run(export_model(graph), feeds), expected)
    strip_protos(graph)
    newest = export_model(graph)
    assert newest.ir_version <= 10
    assert LEGACY not in {o.domain for o in newest.opset_import}
    assert_same(run(newest, feeds), expected)
    return import_model(model), expected


def only_node(graph, op: str):
    nodes = [n for n in graph.nodes if n.op == op]
    assert len(nodes) == 1, graph
    return nodes[0]


def const_input(graph, node, i: int) -> list:
    value = graph.constant_value(node.inputs[i])
    assert value is not None, f"input {i} of {node} is not a constant"
    return value.tolist()


X234 = {"X": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
SIG = "(float[2, 3, 4] X) => (float[] Y)"

# (opset, body, check(graph, node) on the normalized node)
FORMS = [
    (11, "Y = ReduceSum<axes=[1], keepdims=0>(X)", "ReduceSum",
     lambda g, n: const_input(g, n, 1) == [1] and n.attrs == {"keepdims": 0}),
    (13, "Y = ReduceMean<axes=[0, 2]>(X)", "ReduceMean",
     lambda g, n: const_input(g, n, 1) == [0, 2] and "axes" not in n.attrs),
    (18, "a = Constant<value=int64[1] {-1}>()\nY = ReduceMax(X, a)", "ReduceMax",
     lambda g, n: const_input(g, n, 1) == [-1]),
    (17, "Y = ReduceSum(X)", "ReduceSum", lambda g, n: len(n.inputs) == 1),
    (9, "Y = ReduceProd<axes=[2]>(X)", "ReduceProd", lambda g, n: const_input(g, n, 1) == [2]),
    (11, "u = Unsqueeze<axes=[0, 4]>(X)\nY = Squeeze<axes=[0]>(u)", "Squeeze",
     lambda g, n: const_input(g, n, 1) == [0]
     and const_input(g, only_node(g, "Unsqueeze"), 1) == [0, 4]),
    (7, "Y = Unsqueeze<axes=[1]>(X)", "Unsqueeze", lambda g, n: const_input(g, n, 1) == [1]),
    (13, "a = Constant<value=int64[1] {1}>()\nu = Unsqueeze(X, a)\nY = Squeeze(u, a)",
     "Squeeze", lambda g, n: const_input(g, n, 1) == [1]),
    (11, "p, q = Split<axis=2, split=[1, 3]>(X)\nY = Mul(q, q)", "Split",
     lambda g, n: const_input(g, n, 1) == [1, 3] and "split" not in n.attrs),
    (13, "p, q = Split<axis=2>(X)\nY = Sub(p, q)", "Split",
     lambda g, n: n.attrs["num_outputs"] == 2 and len(n.inputs) == 1),
    (18, "p, q, r = Split<axis=1, num_outputs=3>(X)\nY = Add(p, r)", "Split",
     lambda g, n: n.attrs["num_outputs"] == 3),
    (9, "Y = Slice<starts=[1, 0], ends=[3, -1], axes=[1, 2]>(X)", "Slice",
     lambda g, n: [const_input(g, n, i) for i in (1, 2, 3)] == [[1, 0], [3, -1], [1, 2]]),
    (7, "Y = Slice<starts=[0], ends=[2]>(X)", "Slice",
     lambda g, n: len(n.inputs) == 3 and const_input(g, n, 2) == [2]),
    (9, "Y = Clip<min=-0.5, max=0.25>(X)", "Clip",
     lambda g, n: const_input(g, n, 1) == -0.5 and g.constant_value(n.inputs[2]).dtype
     == np.float32),
    (7, "Y = Clip<max=0.1>(X)", "Clip", lambda g, n: n.inputs[1] is None),
    (12, "Y = Clip(X)", "Clip", lambda g, n: len(n.inputs) == 1),
    (9, 'Y = Pad<pads=[0, 1, 0, 0, 0, 2], value=1.5>(X)', "Pad",
     lambda g, n: const_input(g, n, 1) == [0, 1, 0, 0, 0, 2] and const_input(g, n, 2) == 1.5),
    (9, 'Y = Pad<pads=[0, 0, 1, 0, 0, 1], mode="reflect">(X)', "Pad",
     lambda g, n: n.attrs == {"mode": "reflect"} and len(n.inputs) == 2),
    (7, "Y = Dropout<ratio=0.3>(X)", "Dropout", lambda g, n: n.attrs == {}),
    (12, "Y, mask = Dropout(X)", "Dropout", lambda g, n: len(n.outputs) == 2),
    (9, "Y, i = TopK<k=2, axis=1>(X)", "TopK", lambda g, n: const_input(g, n, 1) == [2]),
    (11, "k = Constant<value=int64[1] {3}>()\nY, i = TopK<largest=0>(X, k)", "TopK",
     lambda g, n: n.attrs == {"largest": 0}),
    (11, "f = Flatten<axis=2>(X)\nY = Softmax<axis=1>(f)", "Softmax",
     lambda g, n: n.domain == "" and n.attrs["axis"] == -1),
    (11, "Y = LogSoftmax<axis=2>(X)", "LogSoftmax", lambda g, n: n.attrs["axis"] == -1),
    (11, "Y = Softmax<axis=1>(X)", "Softmax", lambda g, n: n.domain == LEGACY),
    (12, "Y = Hardmax(X)", "Hardmax", lambda g, n: n.domain == LEGACY),
    (13, "Y = Softmax<axis=1>(X)", "Softmax", lambda g, n: n.domain == ""),
    (17, "s = Constant<value=float[4] {1, 2, 3, 4}>()\nY = LayerNormalization(X, s)",
     "LayerNormalization", lambda g, n: n.attrs == {}),
    (9, "Y = Reshape(X, s)\ns = Constant<value=int64[2] {4, -1}>()", "Reshape",
     lambda g, n: const_input(g, n, 1) == [4, -1]),
]


@pytest.mark.parametrize("opset, body, op, check", FORMS,
                         ids=[f"{op}-{opset}-{i}" for i, (opset, _, op, _) in enumerate(FORMS)])
def test_older_forms_normalize_and_round_trip(opset, body, op, check):
    model = parse(model_text(opset, SIG, body))
    graph, _ = check_three_ways(model, X234)
    node = only_node(graph, op)
    assert check(graph, node), str(graph)
    assert node.proto is not None and node.proto.op_type == op


def test_normalized_reduce_matches_numpy():
    model = parse(model_text(11, SIG, "Y = ReduceSum<axes=[0, 2], keepdims=1>(X)"))
    graph, (y,) = check_three_ways(model, X234)
    np.testing.assert_allclose(y, X234["X"].sum(axis=(0, 2), keepdims=True), rtol=1e-5)
    node = only_node(graph, "ReduceSum")
    assert node.inputs[1].dtype == np.int64 and node.inputs[1].shape == (2,)
    assert node.inputs[1].name in graph.doc["synthetic_initializers"]


def test_clip_old_form_matches_numpy():
    model = parse(model_text(6, SIG, "Y = Clip<min=-0.5, max=0.25>(X)"))
    _, (y,) = check_three_ways(model, X234)
    np.testing.assert_array_equal(y, np.clip(X234["X"], -0.5, 0.25))


def test_batchnorm_forms():
    sig = "(float[2, 3, 4] X) => (float[] Y)"
    params = "\n".join(f"{n} = Constant<value=float[3] {{{v}}}>()" for n, v in
                       (("s", "1, 2, 3"), ("b", "0, 1, 2"), ("m", "0.5, 0, 1"),
                        ("v", "1, 2, 0.5")))
    model = parse(model_text(9, sig, params + "\nY = BatchNormalization<epsilon=0.01>"
                             "(X, s, b, m, v)"))
    graph, (y,) = check_three_ways(model, X234)
    node = only_node(graph, "BatchNormalization")
    assert node.domain == "" and node.attrs == {"epsilon": pytest.approx(0.01)}

    def c(a):
        return np.array(a, np.float32).reshape(1, 3, 1)
    want = (X234["X"] - c([0.5, 0, 1])) / np.sqrt(c([1, 2, 0.5]) + 0.01) * c([1, 2, 3]) \
        + c([0, 1, 2])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_group_normalization_18_expands_to_per_channel():
    sig = "(float[2, 4, 3] X) => (float[] Y)"
    body = ("s = Constant<value=float[2] {1.0, 2.0}>()\nb = Constant<value=float[2] {0.5, -1}>()"
            "\nY = GroupNormalization<num_groups=2, epsilon=0.001>(X, s, b)")
    x = {"X": RNG.standard_normal((2, 4, 3)).astype(np.float32)}
    graph, (y,) = check_three_ways(parse(model_text(18, sig, body)), x)
    node = only_node(graph, "GroupNormalization")
    assert const_input(graph, node, 1) == [1, 1, 2, 2]
    assert const_input(graph, node, 2) == [0.5, 0.5, -1, -1]
    groups = x["X"].reshape(2, 2, 6)
    norm = (groups - groups.mean(-1, keepdims=True)) / np.sqrt(groups.var(-1, keepdims=True)
                                                               + 0.001)
    want = norm.reshape(2, 4, 3) * np.array([1, 1, 2, 2], np.float32).reshape(1, 4, 1)
    want += np.array([0.5, 0.5, -1, -1], np.float32).reshape(1, 4, 1)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_group_normalization_18_with_graph_input_scale_is_legacy():
    sig = "(float[2, 4, 3] X, float[2] s, float[2] b) => (float[] Y)"
    model = parse(model_text(18, sig, "Y = GroupNormalization<num_groups=2>(X, s, b)"))
    graph = import_model(model)
    assert only_node(graph, "GroupNormalization").domain == LEGACY
    assert ops.get("GroupNormalization", LEGACY) is None
    feeds = {"X": RNG.standard_normal((2, 4, 3)).astype(np.float32),
             "s": np.array([1, 2], np.float32), "b": np.array([0, 1], np.float32)}
    assert_same(run(export_model(graph), feeds), run(model, feeds))


def test_batchnorm_training_outputs_are_legacy():
    sig = "(float[2, 3, 4] X, float[3] s, float[3] b, float[3] m, float[3] v) => (float[] Y)"
    model = parse(model_text(14, sig, "Y, rm, rv = BatchNormalization<training_mode=1>"
                             "(X, s, b, m, v)"))
    assert only_node(import_model(model), "BatchNormalization").domain == LEGACY


def test_symbolic_and_unknown_dims():
    model = parse(model_text(17, "(float[N, ?, 4] X) => (float[N, ?, 4] Y)", "Y = Relu(X)"))
    graph = import_model(model)
    assert graph.inputs[0].shape == ("N", None, 4)
    assert graph.outputs[0].dtype == np.float32
    out = export_model(graph)
    dims = out.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N" and not dims[1].HasField("dim_value") and dims[2].dim_value == 4
    x = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    assert_same(run(out, {"X": x}), [np.maximum(x, 0)])


def test_intermediate_types_from_shape_inference():
    body = "a = Transpose<perm=[2, 0, 1]>(X)\nb = Cast<to=7>(a)\nY = ReduceSum(b)"
    graph = import_model(parse(model_text(17, "(float[N, 3, 4] X) => (int64[] Y)", body)))
    assert graph.values["a"].shape == (4, "N", 3) and graph.values["a"].dtype == np.float32
    assert graph.values["b"].dtype == np.int64
    names = {vi.name for vi in export_model(graph).graph.value_info}
    assert {"a", "b"} <= names


# ---- Constant nodes, subgraphs, domains, non-tensor values ---------------------------

def test_constant_nodes_become_initializers():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5.0, -2.0], np.float32), "sv"),
        numpy_helper.from_array(np.array([1, 6], np.int64), "si"), [2, 4])
    nodes = [
        helper.make_node("Constant", [], ["cf"], value_float=2.5),
        helper.make_node("Constant", [], ["ci"], value_ints=[4, 2]),
        helper.make_node("Constant", [], ["ct"], value=numpy_helper.from_array(
            np.arange(8, dtype=np.float32).reshape(2, 4))),
        helper.make_node("Constant", [], ["cs"], sparse_value=sparse),
        helper.make_node("Add", ["X", "ct"], ["a"]),
        helper.make_node("Mul", ["a", "cf"], ["b"]),
        helper.make_node("Sub", ["b", "cs"], ["c"]),
        helper.make_node("Reshape", ["c", "ci"], ["Y"]),
    ]
    graph_proto = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ct", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    graph, (y, ct) = check_three_ways(model, {"X": x})
    assert [n.op for n in graph.nodes] == ["Add", "Mul", "Sub", "Reshape"]
    assert graph.doc["constant_nodes"] == ["cf", "ci", "ct", "cs"]
    assert graph.initializers["cf"].dtype == np.float32 and graph.initializers["cf"] == 2.5
    assert graph.initializers["ci"].tolist() == [4, 2]
    dense = np.zeros((2, 4), np.float32)
    dense[0, 1], dense[1, 2] = 5.0, -2.0
    np.testing.assert_array_equal(graph.initializers["cs"], dense)
    np.testing.assert_array_equal(y, (((x + ct) * 2.5) - dense).reshape(4, 2))


def if_model() -> onnx.ModelProto:
    """Y = If(C, then: A + B, else: A - B) with A a node output and B an initializer."""
    def branch(op: str, out: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, ["A", "B"], [out])], op, [],
                                 [helper.make_tensor_value_info(out, TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("Relu", ["X"], ["A"]),
             helper.make_node("If", ["C"], ["T"], then_branch=branch("Add", "t"),
                              else_branch=branch("Sub", "e")),
             helper.make_node("Neg", ["T"], ["Y"])]
    graph_proto = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2]),
                     helper.make_tensor_value_info("C", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "B"),
         numpy_helper.from_array(np.array([9.0], np.float32), "unused")])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("cond", [True, False])
def test_if_node_outer_scope_reads(cond):
    x = np.array([-1.0, 3.0], np.float32)
    feeds = {"X": x, "C": np.array(cond)}
    graph, (y,) = check_three_ways(if_model(), feeds)
    node = only_node(graph, "If")
    assert [v.name for v in node.implicit_inputs] == ["A", "B"]
    assert ("If_1" in [n.name for n, _ in graph.values["A"].uses])
    relu = np.maximum(x, 0)
    np.testing.assert_array_equal(y, -(relu + [1, 2] if cond else relu - [1, 2]))
    # The If node alone: its outer reads become inputs (A) and initializers (B).
    sub = graph.extract([node])
    assert [v.name for v in sub.inputs] == ["C", "A"] and "B" in sub.initializers
    (t,) = run(export_model(sub), {"C": feeds["C"], "A": relu})
    np.testing.assert_array_equal(t, -y)


def test_unused_initializers_are_not_exported():
    out = export_model(import_model(if_model()))
    assert [t.name for t in out.graph.initializer] == ["B"]


def test_unknown_domain_imports_as_opaque_node():
    sig = "(float[2, 3] X) => (float[] Y)"
    text = ('<ir_version: 10, opset_import: ["" : 17, "com.example" : 1]>\n'
            f"m {sig} {{\na = Relu(X)\nb = com.example.Frobnicate<level=3>(a)\nY = Neg(b)\n}}")
    graph = import_model(parse(text))
    node = only_node(graph, "Frobnicate")
    assert node.domain == "com.example" and node.attrs == {"level": 3}
    assert ops.get(node.op, node.domain) is None
    graph.verify()
    out = export_model(graph)
    assert {o.domain: o.version for o in out.opset_import}["com.example"] == 1
    # The known part still exports and runs on its own.
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (a,) = run(export_model(graph.extract([graph.nodes[0]])), {"X": x})
    np.testing.assert_array_equal(a, np.maximum(x, 0))


def test_contrib_domain_op_round_trips():
    text = ('<ir_version: 10, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
            "m (float[2, 3] X) => (float[2, 3] Y) {\nY = com.microsoft.Gelu(X)\n}")
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    model = parse(text)
    assert_same(run(export_model(import_model(model)), {"X": x}), run(model, {"X": x}))


def test_sequence_values_keep_their_type_proto():
    body = "s = SequenceConstruct(X, X)\nn = SequenceLength(s)\nY = Cast<to=1>(n)"
    model = parse(model_text(17, "(float[2] X) => (float[] Y)", body))
    graph, (y,) = check_three_ways(model, {"X": np.ones(2, np.float32)})
    s = graph.values["s"]
    assert s.dtype is None and s.type_proto.HasField("sequence_type")
    assert y == 2.0


def test_string_and_bool_dtypes():
    model = parse(model_text(17, "(string[2] S, bool[2] B) => (string[2] Y, bool[2] Z)",
                             "Y = Identity(S)\nZ = Not(B)"))
    graph = import_model(model)
    assert graph.inputs[0].dtype == np.dtype(object) and graph.inputs[1].dtype == np.bool_
    feeds = {"S": np.array(["a", "bc"], dtype=object), "B": np.array([True, False])}
    ys, zs = run(export_model(graph), feeds)
    assert ys.tolist() == ["a", "bc"] and zs.tolist() == [False, True]


def test_empty_and_duplicate_node_names_are_made_unique():
    nodes = [helper.make_node("Relu", ["X"], ["a"]),
             helper.make_node("Neg", ["a"], ["b"], name="n"),
             helper.make_node("Abs", ["b"], ["Y"], name="n")]
    graph_proto = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_model(model)
    assert [n.name for n in graph.nodes] == ["Relu_0", "n", "n_1"]


def test_unsorted_nodes_are_sorted():
    nodes = [helper.make_node("Neg", ["a"], ["Y"]), helper.make_node("Relu", ["X"], ["a"])]
    graph_proto = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)])
    graph = import_model(model)
    assert [n.op for n in graph.nodes] == ["Relu", "Neg"]
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    assert_same(run(export_model(graph), {"X": x}), [-np.maximum(x, 0)])


def test_metadata_and_ir_version():
    model = parse(model_text(17, "(float[2] X) => (float[2] Y)", "Y = Relu(X)"))
    model.producer_name, model.model_version = "maker", 7
    helper.set_model_props(model, {"author": "me"})
    graph = import_model(model)
    assert graph.opset == {"": 17} and graph.doc["ir_version"] == 10
    out = export_model(graph)
    assert out.producer_name == "maker" and out.model_version == 7
    assert {p.key: p.value for p in out.metadata_props} == {"author": "me"}
    graph.doc["ir_version"] = 14
    assert export_model(graph).ir_version == 10
    assert export_model(graph, ir_version=8).ir_version == 8


# ---- external data ---------------------------------------------------------------------

def external_model(tmp_path):
    w = RNG.standard_normal((64, 32)).astype(np.float32)
    model = parse(model_text(17, "(float[N, 64] X) => (float[N, 32] Y)", "Y = MatMul(X, W)"))
    model.graph.initializer.append(numpy_helper.from_array(w, "W"))
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    return path, w


@pytest.mark.parametrize("load_external", [True, False])
def test_external_data(tmp_path, load_external):
    path, w = external_model(tmp_path)
    assert (tmp_path / "weights.bin").stat().st_size == w.nbytes
    graph = import_model(path, load_external=load_external)
    np.testing.assert_array_equal(graph.initializers["W"], w)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    (y,) = run(export_model(graph), {"X": x})
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)


def test_missing_external_data_file(tmp_path):
    path, _ = external_model(tmp_path)
    (tmp_path / "weights.bin").unlink()
    for load_external in (True, False):
        with pytest.raises(ModelLoadError, match="m.onnx"):
            import_model(path, load_external=load_external)


# ---- subgraph extraction ------------------------------------------------------------

def test_split_model_chains_to_the_same_outputs():
    body = ("a = MatMul(X, W)\nb = Add(a, X)\nc = Tanh(b)\nd = ReduceSum<axes=[1]>(c)\n"
            "e = Mul(c, d)\nY = Sub(e, b)\nZ = Sigmoid(d)")
    model = parse(model_text(11, "(float[N, 4] X, float[4, 4] W) => (float[N, 4] Y, "
                                 "float[N, 1] Z)", body))
    feeds = {"X": RNG.standard_normal((3, 4)).astype(np.float32),
             "W": RNG.standard_normal((4, 4)).astype(np.float32)}
    expected = run(model, feeds)
    graph = import_model(model)
    first, second = graph.extract(graph.nodes[:4], "first"), graph.extract(graph.nodes[4:])
    assert {v.name for v in first.outputs} == {"b", "c", "d"}
    values = dict(feeds)
    for part in (first, second):
        out = export_model(part)
        names = [o.name for o in out.graph.output]
        values.update(zip(names, run(out, {v.name: values[v.name] for v in part.inputs})))
    assert_same([values["Y"], values["Z"]], expected)


# ---- malformed models ----------------------------------------------------------------

def small_model() -> onnx.ModelProto:
    return parse(model_text(17, "(float[2] X) => (float[2] Y)", "a = Relu(X)\nY = Neg(a)"))


def edited(edit) -> onnx.ModelProto:
    model = small_model()
    edit(model.graph)
    return model


def _set_input(i: int, name: str):
    def edit(g):
        g.node[i].input[0] = name
    return edit


def _bad_initializer(g):
    t = numpy_helper.from_array(np.zeros((4, 4), np.float32), "W")
    t.raw_data = t.raw_data[:10]
    g.initializer.append(t)
    g.node[1].input.append("W")


def _huge_initializer(g):
    g.initializer.append(TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[1 << 40],
                                     raw_data=b"\0" * 8))
    g.node[1].input.append("W")


def _float_perm(g):
    g.node[1].CopyFrom(helper.make_node("Transpose", ["a"], ["Y"], perm=1.5))


def _bad_body(g):
    body = helper.make_graph([helper.make_node("Neg", ["ghost"], ["o"])], "b", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    g.node.append(helper.make_node("If", ["c"], ["Z"], then_branch=body, else_branch=body))
    g.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))


MALFORMED = [
    ("dangling", _set_input(1, "nope"), r"node 'Neg_1' \(Neg\) input 0 'nope' is not defined"),
    ("duplicate", lambda g: g.node[1].output.__setitem__(0, "a"), r"'a' is defined twice"),
    ("shadows input", lambda g: g.node[0].output.__setitem__(0, "X"), r"'X' is defined twice"),
    ("cycle", _set_input(0, "Y"), r"cycle"),
    ("no output", lambda g: g.output[0].__setattr__("name", "zzz"), r"'zzz' is never defined"),
    ("float perm", _float_perm, r"node 'Transpose_1' \(Transpose\): attribute 'perm' is FLOAT"),
    ("raw size", _bad_initializer, r"initializer 'W': cannot read tensor .*10 raw bytes"),
    ("huge size", _huge_initializer, r"initializer 'W': cannot read tensor"),
    ("subgraph read", _bad_body, r"subgraph reads 'ghost'"),
]


@pytest.mark.parametrize("edit, message", [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
def test_malformed_graphs(edit, message):
    model = edited(edit)
    with pytest.raises(ModelLoadError, match=message):
        import_model(model)
    with pytest.raises(ModelLoadError, match=message):  # the same from bytes
        import_model(model.SerializeToString())


def test_unreadable_sources(tmp_path):
    data = small_model().SerializeToString()
    with pytest.raises(ModelLoadError, match=r"model bytes \(13 bytes\): cannot parse"):
        import_model(b"\xff\xfe garbage \x00\x01")
    with pytest.raises(ModelLoadError, match="cannot parse: DecodeError"):
        import_model(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"missing\.onnx'?: no such file"):
        import_model(tmp_path / "missing.onnx")
    (tmp_path / "bad.onnx").write_bytes(data[:-7])
    with pytest.raises(ModelLoadError, match=r"bad\.onnx'?: cannot load"):
        import_model(str(tmp_path / "bad.onnx"))
    with pytest.raises(ModelLoadError, match="has no graph"):
        import_model(onnx.ModelProto(ir_version=10))
    with pytest.raises(ModelLoadError, match="has no graph"):  # another message's bytes
        load_model_proto(helper.make_node("Relu", ["x"], ["y"]).SerializeToString())
    with pytest.raises(ModelLoadError, match="from a int"):
        import_model(42)
    (tmp_path / "ok.onnx").write_bytes(data)
    assert [n.op for n in import_model(tmp_path / "ok.onnx").nodes] == ["Relu", "Neg"]


# ---- exporting edited graphs -----------------------------------------------------------

def test_rewired_proto_node_exports_current_names():
    model = parse(model_text(17, "(float[3] X) => (float[3] Y)",
                             "a = Relu(X)\nb = Neg(a)\nY = Abs(b)"))
    graph = import_model(model)
    relu = graph.nodes[0]
    sig = graph.make_node("Sigmoid", [graph.inputs[0]], name="sig")
    sig.outputs[0].dtype, sig.outputs[0].shape = np.dtype(np.float32), (3,)
    graph.replace_all_uses(relu.outputs[0], sig.outputs[0])
    graph.remove_node(relu)
    graph.topo_sort()
    graph.verify()
    x = np.array([-2.0, 0.0, 3.0], np.float32)
    (y,) = run(export_model(graph), {"X": x})
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-6)


def _add_reduce_sum(graph) -> None:
    """A pass-made node in the newest form: ReduceSum(Y, axes=[1]) -> output R."""
    axes = graph.add_initializer("new_axes", np.array([1], np.int64))
    node = graph.make_node("ReduceSum", [graph.outputs[0], axes], name="new_sum")
    out = node.outputs[0]
    out.dtype, out.shape = np.dtype(np.float32), (2, 1)
    graph.outputs.append(out)


def test_new_node_raises_opset_and_rewrites_changed_originals():
    body = "a = Relu(X)\nY = Softmax<axis=1>(a)"
    model = parse(model_text(11, "(float[2, 3] X) => (float[2, 3] Y)", body))
    graph = import_model(model)
    _add_reduce_sum(graph)
    out = export_model(graph)
    assert {o.domain: o.version for o in out.opset_import}[""] == 13
    assert [n.op_type for n in out.graph.node] == ["Relu", "Softmax", "ReduceSum"]
    assert [t.name for t in out.graph.initializer] == ["new_axes"]
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    y, r = run(out, {"X": x})
    assert_same([y], run(model, {"X": x}))
    np.testing.assert_allclose(r, y.sum(1, keepdims=True), rtol=1e-6)


def test_legacy_node_keeps_the_graph_opset():
    model = parse(model_text(11, "(float[2, 3, 1] X) => (float[2, 3, 1] Y)",
                             "Y = Softmax<axis=1>(X)"))
    graph = import_model(model)
    assert graph.nodes[0].domain == LEGACY
    _add_reduce_sum(graph)
    out = export_model(graph)
    # Softmax-13 would mean something else: the legacy node decides, opset 11 stays.
    assert {o.domain: o.version for o in out.opset_import}[""] == 11
    assert out.graph.node[0] == model.graph.node[0]


def test_initializer_with_graph_input_stays_overridable():
    model = parse(model_text(17, "(float[2] X, float[2] W) => (float[2] Y)", "Y = Add(X, W)"))
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, 2], np.float32), "W"))
    graph = import_model(model)
    w = graph.values["W"]
    assert w in graph.inputs and not graph.is_constant(w)
    out = export_model(graph)
    x = np.array([10, 20], np.float32)
    assert run(out, {"X": x})[0].tolist() == [11, 22]
    assert run(out, {"X": x, "W": np.array([5, 5], np.float32)})[0].tolist() == [15, 25]


def test_ir3_initializers_listed_as_inputs_are_constants():
    graph_proto = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("X", "W")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.array([3, 4], np.float32), "W")])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 8)])
    model.ir_version = 3
    graph = import_model(model)
    assert [v.name for v in graph.inputs] == ["X"] and graph.is_constant(graph.values["W"])
    out = export_model(graph)
    assert out.ir_version == 4
    assert run(out, {"X": np.array([1, 2], np.float32)})[0].tolist() == [3, 8]


def test_omitted_middle_output_round_trips():
    hidden = 2
    w = RNG.standard_normal((1, 3 * hidden, 3)).astype(np.float32)
    r = RNG.standard_normal((1, 3 * hidden, hidden)).astype(np.float32)
    graph_proto = helper.make_graph(
        [helper.make_node("GRU", ["X", "W", "R"], ["", "Yh"], hidden_size=hidden)], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 1, 3])],
        [helper.make_tensor_value_info("Yh", TensorProto.FLOAT, [1, 1, hidden])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 10
    graph, _ = check_three_ways(model, {"X": RNG.standard_normal((2, 1, 3)).astype(np.float32)})
    node = only_node(graph, "GRU")
    assert len(node.outputs) == 2 and not node.outputs[0].uses
    assert node.outputs[0].name not in {"", "Yh", "X", "W", "R"}


def test_output_of_unknown_type_and_input_without_type():
    model = small_model()
    del model.graph.output[0].type.tensor_type.shape.dim[:]
    graph = import_model(model)
    graph.outputs[0].dtype = None
    x = np.array([1.0, -1.0], np.float32)
    assert run(export_model(graph), {"X": x})[0].tolist() == [-1.0, 0.0]
    graph.inputs[0].dtype = None
    with pytest.raises(ExportError, match="input 'X' has no known type"):
        export_model(graph)


def test_model_local_function_round_trips():
    text = '''<ir_version: 10, opset_import: ["" : 17, "local" : 1]>
    m (float[3] X) => (float[3] Y) {
        a = local.twice(X)
        Y = Relu(a)
    }
    <domain: "local", opset_import: ["" : 17]>
    twice (x) => (y) {
        two = Constant<value_float = 2.0>()
        y = Mul(x, two)
    }'''
    model = parse(text)
    graph = import_model(model)
    assert graph.nodes[0].domain == "local" and len(graph.doc["functions"]) == 1
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    (y,) = run(export_model(graph), {"X": x})
    np.testing.assert_array_equal(y, np.maximum(2 * x, 0))


def test_node_changed_in_place_is_written_from_its_fields():
    model = parse(model_text(17, "(float[3] X) => (float[3] Y)", "a = Relu(X)\nY = Neg(a)"))
    graph = import_model(model)
    graph.nodes[0].op = "Sigmoid"  # a pass rewrote the op but forgot the proto
    x = np.array([-2.0, 0.0, 3.0], np.float32)
    np.testing.assert_allclose(run(export_model(graph), {"X": x})[0], -1 / (1 + np.exp(-x)),
                               rtol=1e-6)


@pytest.mark.parametrize("declared", [False, True])
def test_ceil_mode_pool_shapes_follow_onnxruntime(declared):
    """A ceil_mode pool whose last window would start in the right pad: ONNX shape
    inference keeps that window ([1, 2, 3, 3]), onnxruntime drops it ([1, 2, 2, 2]). The
    importer types the pool and what follows by our rules, which agree with onnxruntime, so
    the model compiles; a shape the model declares itself is kept (and conflicts)."""
    import autoclust
    from autoclust.errors import NotCompilableError

    y = "float[1,2,3,3] y" if declared else "float[1,2,?,?] y"
    model = parse(f"""<ir_version: 10, opset_import: ["" : 18]>
        g (float[1,2,4,4] x) => ({y}) {{
            e = Exp (x)
            p = AveragePool <kernel_shape = [2, 2], strides = [2, 2], pads = [0, 0, 1, 1],
                             ceil_mode = 1> (e)
            y = Relu (p)
        }}""")
    graph = import_model(model)
    shapes = {v.name: v.shape for n in graph.nodes for v in n.outputs}
    assert shapes["p"] == (1, 2, 2, 2)
    assert shapes["y"] == ((1, 2, 3, 3) if declared else (1, 2, 2, 2))
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    sess = autoclust.InferenceSession(model, must_compile=True, min_cluster_size=1)
    if declared:
        with pytest.raises(NotCompilableError, match="declared shape"):
            sess.run(None, {"x": x})
        return
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), so).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6)
