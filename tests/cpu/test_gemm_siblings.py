"""Sibling GEMMs (autoclust/passes/siblings.py): projections that read the same input run as
one GEMM over concatenated weights, their split read in place. Shapes pinned by the
library calls a compiled model makes; outputs checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.models import zoo
from onnx import TensorProto, helper, numpy_helper

import autoclust
from autoclust.kernel import ir as kir
from autoclust.passes import siblings
from autoclust.passes.simplify import simplify

RNG = np.random.default_rng(5)


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _program(sess: autoclust.InferenceSession, signature: int = 0):
    exe = list(sess._runtime.compiled_clusters()[0].cache.values())[signature]
    return exe.program


def _gemms(program) -> list[tuple[str, tuple, tuple]]:
    """(op, A shape, B shape) of every GEMM call, in order."""
    shape = {b.id: b.shape for b in program.buffers}
    return [(t.op, shape[t.inputs[0]], shape[t.inputs[1]]) for t in program.thunks
            if type(t).__name__ == "LibraryCall" and t.op in ("MatMul", "Gemm", "FusedMatMul")]


def _kernels(program) -> list:
    return kir.kernels(program.thunks)  # library calls' epilogues included


def test_bert_base_qkv_is_one_768x2304_gemm():
    model = zoo.build("bert_encoder", hidden=768, heads=12, layers=1, inter=3072)
    feeds = zoo.feeds(model, {"batch": 1, "seq": 32})
    sess = autoclust.InferenceSession(model, must_compile=True)
    got = sess.run(None, feeds)
    np.testing.assert_allclose(got[0], _ort(model, feeds)[0], rtol=1e-4, atol=2e-5)
    program = _program(sess)
    gemms = _gemms(program)
    # QKV with its biases (one Gemm), Q K^T, P V, output projection, FFN in, FFN out
    assert gemms[0] == ("Gemm", (1, 32, 768), (768, 2304))
    assert [b for _, _, b in gemms[3:]] == [(768, 768), (768, 3072), (3072, 768)]
    qk, pv = [t for t in program.thunks if type(t).__name__ == "LibraryCall"][1:3]
    qkv = program.thunks[[id(t) for t in program.thunks].index(id(qk)) - 1].outputs[0]
    # Q, K^T and V are read where they lie in the fused projection's buffer: no copy
    assert qk.inputs[:2] == (qkv, qkv) and pv.inputs[1] == qkv
    assert [v.offset for v in qk.views[:2]] == [0, 768] and pv.views[1].offset == 1536
    # embedding LayerNorm, softmax, 2 LayerNorms, GELU: no kernel copies a projection
    assert len(_kernels(program)) == 5
    ffn_in = [t for t in program.thunks if type(t).__name__ == "LibraryCall"][4]
    assert "Erf" in " ".join(ffn_in.epilogue.nodes)  # GELU rides FFN-in (kernel/epilogues.py)


def _gqa_mlp(hidden: int = 64, kv: int = 16, inter: int = 96, bias: tuple = (1, 0, 1),
             output_k: bool = False) -> onnx.ModelProto:
    """x -> q [hidden], k [kv], v [kv] projections (each with a bias or not: `bias`), a
    SwiGLU MLP on tanh(x) (gate and up), y = down + q, and Concat(k, v, q) as a
    second output."""
    n = helper.make_node
    w = {"wq": (hidden, hidden), "wk": (hidden, kv), "wv": (hidden, kv),
         "wg": (hidden, inter), "wu": (hidden, inter), "wd": (inter, hidden)}
    inits = [numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32) * 0.1, k)
             for k, s in w.items()]
    nodes = []
    outs = {}
    for name, with_bias in zip("qkv", bias):
        y = f"{name}0"
        nodes.append(n("MatMul", ["x", f"w{name}"], [y]))
        if with_bias:
            inits.append(numpy_helper.from_array(
                RNG.standard_normal(w[f"w{name}"][1]).astype(np.float32), f"b{name}"))
            nodes.append(n("Add", [f"b{name}", y], [f"{name}1"]))
            y = f"{name}1"
        outs[name] = y
    nodes += [n("Concat", [outs["k"], outs["v"], outs["q"]], ["kvq"], axis=-1),
              n("Tanh", ["x"], ["m"]),  # the MLP's own input, as after a norm
              n("MatMul", ["m", "wg"], ["g"]), n("Sigmoid", ["g"], ["sg"]),
              n("Mul", ["g", "sg"], ["silu"]), n("MatMul", ["m", "wu"], ["u"]),
              n("Mul", ["silu", "u"], ["h"]), n("MatMul", ["h", "wd"], ["d"]),
              n("Add", ["d", outs["q"]], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", hidden]),
               helper.make_tensor_value_info("kvq", TensorProto.FLOAT,
                                             ["b", "s", 2 * kv + hidden])]
    if output_k:
        outputs.append(helper.make_tensor_value_info(outs["k"], TensorProto.FLOAT,
                                                     ["b", "s", kv]))
    graph = helper.make_graph(nodes, "gqa_mlp", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["b", "s", hidden])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("bias", [(1, 1, 1), (0, 0, 0), (1, 0, 1)])
def test_grouped_query_and_swiglu_siblings(bias):
    model = _gqa_mlp(bias=bias)
    x = RNG.standard_normal((2, 24, 64)).astype(np.float32)
    x[0, 0, 0], x[1, 3, 5] = np.inf, np.nan  # non-finite rows stay where onnxruntime has them
    sess = autoclust.InferenceSession(model, must_compile=True)
    got, want = sess.run(None, {"x": x}), _ort(model, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    shapes = [(op, b) for op, _, b in _gemms(_program(sess))]
    # q|k|v: 64 + 16 + 16 columns (the concatenated bias, zeros where a sibling had none,
    # is added by the kernels reading the projections), gate|up: 2 x 96, down
    assert shapes == [("MatMul", (64, 96)), ("MatMul", (64, 192)), ("MatMul", (96, 64))]


def test_sibling_output_is_a_graph_output():
    model = _gqa_mlp(output_k=True)
    x = RNG.standard_normal((1, 8, 64)).astype(np.float32)
    sess = autoclust.InferenceSession(model, must_compile=True)
    for g, w in zip(sess.run(None, {"x": x}), _ort(model, {"x": x})):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert _gemms(_program(sess))[0][2] == (64, 96)


def test_new_sequence_length_reuses_the_concatenated_weights():
    model = _gqa_mlp()
    sess = autoclust.InferenceSession(model, must_compile=True)
    for seq in (16, 12):
        x = RNG.standard_normal((1, seq, 64)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, {"x": x})[0],
                                   rtol=1e-4, atol=1e-4)
    weights = []
    for k in range(2):
        program = _program(sess, k)
        fused = next(t for t in program.thunks if type(t).__name__ == "LibraryCall")
        weights.append(program.constants[fused.inputs[1]])
    assert weights[0] is weights[1]  # one array: one prepacked copy in the library


def test_no_siblings_without_a_shared_input_or_constant_weights():
    n = helper.make_node
    inits = [numpy_helper.from_array(RNG.standard_normal((8, 8)).astype(np.float32), "w")]
    nodes = [n("MatMul", ["x", "w"], ["a"]), n("MatMul", ["y", "w"], ["b"]),  # other A
             n("MatMul", ["x", "y"], ["c"]), n("MatMul", ["x", "z"], ["d"]),  # B not constant
             n("Sum", ["a", "b", "c", "d"], ["out"])]
    graph = helper.make_graph(nodes, "none", [
        helper.make_tensor_value_info(v, TensorProto.FLOAT, [8, 8]) for v in "xyz"],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    feeds = {v: RNG.standard_normal((8, 8)).astype(np.float32) for v in "xyz"}
    sess = autoclust.InferenceSession(model, must_compile=True)
    np.testing.assert_allclose(sess.run(None, feeds)[0], _ort(model, feeds)[0], rtol=1e-5,
                               atol=1e-5)
    assert len(_gemms(_program(sess))) == 4


def test_concatenated_is_cached_by_identity():
    a, b = np.ones((4, 2), np.float32), np.zeros((4, 3), np.float32)
    first = siblings.concatenated([a, b], 1)
    assert siblings.concatenated([a, b], 1) is first and first.shape == (4, 5)
    assert siblings.concatenated([a.copy(), b], 1) is not first
    assert not first.flags.writeable


def _scaled_q(scale: float, q_bias: bool = False) -> onnx.ModelProto:
    """Whisper/BART's attention inputs: q = q_proj(x) * scale (q_proj without a bias here,
    or with a zero bias, which the simplifier drops: random-weight exports), k = k_proj(x)
    without a bias, v = v_proj(x) + bv; y = Concat(q, k, v)."""
    n = helper.make_node
    d = 32
    inits = [numpy_helper.from_array(RNG.standard_normal((d, d)).astype(np.float32) * 0.2, w)
             for w in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(RNG.standard_normal(d).astype(np.float32), "bv"),
              numpy_helper.from_array(np.zeros(d, np.float32), "bq"),
              numpy_helper.from_array(np.array(scale, np.float32), "scale")]
    nodes = [n("MatMul", ["x", "wq"], ["q0"])]
    if q_bias:
        nodes.append(n("Add", ["q0", "bq"], ["q1"]))
    nodes += [n("Mul", ["q1" if q_bias else "q0", "scale"], ["q"]),
              n("MatMul", ["x", "wk"], ["k"]),
              n("MatMul", ["x", "wv"], ["v0"]), n("Add", ["v0", "bv"], ["v"]),
              n("Concat", ["q", "k", "v"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "scaled_q",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 20, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("scale,q_bias,widths", [
    (0.125, False, [96]),       # Whisper-tiny's 64**-0.5: q joins as alpha * Wq
    (0.125, True, [96]),        # the zero bias goes, then the scaled product joins
    (0.1, False, [32, 64]),     # not a power of two: alpha * Wq would round; q stays apart
])
def test_scaled_projection_joins_its_siblings(scale, q_bias, widths):
    """Before, the simplifier turned q's Mul into FusedMatMul's alpha and left q's MatMul
    dead, and siblings fused the dead one with k and v: 96 columns computed, 32 of them
    for nothing, plus q's own GEMM (the Whisper export: 4 x 1.0 ms a run)."""
    model = _scaled_q(scale, q_bias)
    feeds = {"x": RNG.standard_normal((1, 20, 32)).astype(np.float32)}
    sess = autoclust.InferenceSession(model, must_compile=True)
    got = sess.run(None, feeds)[0]
    np.testing.assert_allclose(got, _ort(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert sorted(b[1] for _, _, b in _gemms(_program(sess))) == widths


def test_unread_matmul_is_no_sibling():
    """After the simplifier, q's MatMul is unread (DCE has not run yet): the group is the
    scaled product, k and v."""
    g = simplify(autoclust.importers.onnx.import_model(_scaled_q(0.125)))
    dead = next(n for n in g.nodes if n.op == "MatMul" and n.inputs[1].name == "wq")
    assert not dead.outputs[0].uses
    [group] = siblings.groups(g)
    assert dead not in group and sorted(n.op for n in group) == ["FusedMatMul", "MatMul",
                                                                  "MatMul"]


def test_scaled_weight_that_would_round_is_refused():
    w = np.array([[1.0, 2.0 ** -126]], np.float32)  # halving the second makes a denormal
    assert siblings._scaled(w, 0.5) is None
    ok = np.array([[1.0, 3.0]], np.float32)
    assert siblings._scaled(ok, 0.5) is siblings._scaled(ok, 0.5)
    np.testing.assert_array_equal(siblings._scaled(ok, 0.5), [[0.5, 1.5]])
