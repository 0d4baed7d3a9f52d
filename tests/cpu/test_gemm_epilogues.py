"""GEMM epilogues (kernel/epilogues.py, backends/cpu/epilogue.py): the elementwise kernel
after a library GEMM rides the call, and runs inside it as oneDNN post-ops where measured
faster; outputs against onnxruntime, with NaN and inf in the bias."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.backends.cpu import choice, epilogue, library, onednn
from onnx import TensorProto, helper, numpy_helper

import autoclust
from autoclust.kernel import ir as kir

RNG = np.random.default_rng(20)
S, H, F = 64, 128, 512  # sequence, hidden, FFN: library-sized GEMMs (not generated)
C = helper.make_node
SQRT_2_PI = float(np.sqrt(2 / np.pi))

# activation -> nodes computing "act" from "h" (the GEMM result plus its bias)
ACTS = {
    "gelu_tanh": [C("Mul", ["h", "h"], ["h2"]), C("Mul", ["h2", "h"], ["h3"]),
                  C("Mul", ["h3", "k044"], ["h4"]), C("Add", ["h", "h4"], ["h5"]),
                  C("Mul", ["h5", "ks2p"], ["h6"]), C("Tanh", ["h6"], ["h7"]),
                  C("Add", ["h7", "one"], ["h8"]), C("Mul", ["h", "h8"], ["h9"]),
                  C("Mul", ["h9", "half"], ["act"])],
    "silu": [C("Sigmoid", ["h"], ["sg"]), C("Mul", ["h", "sg"], ["act"])],
    "gelu_erf": [C("Div", ["h", "sq2"], ["r"]), C("Erf", ["r"], ["e"]),
                 C("Add", ["e", "one"], ["e1"]), C("Mul", ["h", "e1"], ["m"]),
                 C("Mul", ["m", "half"], ["act"])],
    "relu": [C("Relu", ["h"], ["act"])],
}


def mlp(act: str, b1: np.ndarray | None = None, seq: int | str = S) -> onnx.ModelProto:
    """x -> MatMul + bias -> act -> MatMul + bias -> + x (a transformer's FFN block);
    `seq`: the sequence dim (a name makes it symbolic)."""
    w1 = (RNG.standard_normal((H, F)) / np.sqrt(H)).astype(np.float32)
    w2 = (RNG.standard_normal((F, H)) / np.sqrt(F)).astype(np.float32)
    b1 = RNG.standard_normal(F).astype(np.float32) if b1 is None else b1
    b2 = RNG.standard_normal(H).astype(np.float32)
    consts = {"w1": w1, "w2": w2, "b1": b1, "b2": b2, "k044": np.float32(0.044715),
              "ks2p": np.float32(SQRT_2_PI), "one": np.float32(1), "half": np.float32(0.5),
              "sq2": np.float32(np.sqrt(2))}
    nodes = [C("MatMul", ["x", "w1"], ["t"]), C("Add", ["t", "b1"], ["h"]), *ACTS[act],
             C("MatMul", ["act", "w2"], ["u"]), C("Add", ["u", "b2"], ["v"]),
             C("Add", ["v", "x"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, H])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _run(model: onnx.ModelProto, x: np.ndarray):
    sess = autoclust.InferenceSession(model, must_compile=True, threads=2)
    got = sess.run(None, {"x": x})[0]
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    return got, exe


@pytest.fixture
def fresh(monkeypatch):
    """No GEMM or epilogue decision of an earlier test, nor background work, lands here."""
    library.wait_background(30)
    monkeypatch.setattr(library, "_DECISIONS", {})
    monkeypatch.setattr(choice, "_disk_get", lambda key: None)


@pytest.fixture
def fused(fresh, monkeypatch):
    """Every epilogue that oneDNN post-ops can express runs inside its call (the
    measurement says so); other GEMM choices measured as usual."""
    if onednn.unavailable():
        pytest.skip(f"oneDNN: {onednn.unavailable()}")
    real = choice.measure

    def measure(key, builders, *args):
        if key[0] == "epilogue":
            return "onednn post-ops", "forced by the test"
        return real(key, builders, *args)

    monkeypatch.setattr(choice, "measure", measure)


def _calls(exe) -> list:
    return [t for t in exe.program.thunks if isinstance(t, kir.LibraryCall)]


@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "gelu_erf", "relu"])
def test_activation_and_residual_ride_their_gemms(act, fresh):
    model = mlp(act)
    x = RNG.standard_normal((1, S, H)).astype(np.float32)
    got, exe = _run(model, x)
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    calls = _calls(exe)
    # two GEMM calls; the bias + activation and the residual add are their epilogues: the
    # program has no kernel of its own
    assert len(calls) == 2 and len(exe.program.thunks) == 2
    assert all(c.epilogue is not None for c in calls), exe.dumps[".kernels.txt"]
    assert len(kir.kernels(exe.program.thunks)) == 2


# activation -> the post-op kinds of the first GEMM's epilogue (None: not post-ops: oneDNN's
# gelu_erf gives NaN at +inf, its relu 0 for NaN, where onnxruntime does not)
POST_OPS = {"gelu_tanh": ["add", "gelu_tanh"], "silu": ["add", "silu"],
            "gelu_erf": None, "relu": None}


@pytest.mark.parametrize("act", sorted(POST_OPS))
def test_post_ops_read_from_the_epilogue(act, fresh):
    model = mlp(act)
    _, exe = _run(model, RNG.standard_normal((1, S, H)).astype(np.float32))
    buffers = {b.id: b for b in exe.program.buffers}
    first, second = _calls(exe)
    found = epilogue.post_ops(first, buffers)
    kinds = None if found is None else [s.kind for s in found[0] if s.kind != "linear"]
    assert kinds == POST_OPS[act]
    # the second GEMM's bias and residual: two binary adds, a row [H] and a [1, S, H] operand
    steps = epilogue.post_ops(second, buffers)[0]
    assert sorted((s.kind, s.shape) for s in steps) == [("add", (1, S, H)), ("add", (H,))]


# bias values: +inf gives +-inf outputs (signs checked), NaN and -inf (GELU: NaN) NaN ones
SPECIALS = {"finite": [], "nan": [np.nan], "inf": [np.inf], "-inf": [-np.inf],
            "huge": [1e20, -1e20, 1e-40]}


@pytest.mark.parametrize("act", ["gelu_tanh", "silu"])
@pytest.mark.parametrize("special", sorted(SPECIALS))
def test_post_ops_inside_the_call_match_onnxruntime(act, special, fused):
    b1 = RNG.standard_normal(F).astype(np.float32)
    b1[:len(SPECIALS[special])] = SPECIALS[special]
    model = mlp(act, b1)
    x = RNG.standard_normal((1, S, H)).astype(np.float32)
    x[0, 3, :4] = [np.inf, -np.inf, np.nan, 1e20]
    got, exe = _run(model, x)
    want = _ort(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True)
    # both epilogues run inside their oneDNN calls: two library calls, nothing after them
    assert exe.num_kernels == 2, exe.dumps[".kernels.txt"]
    assert [f.impl for f in _library_fns(exe)] == ["onednn+post-ops"] * 2


def _library_fns(exe) -> list:
    """The LibraryFns behind the executable's library steps (in place or not)."""
    found = []
    for _, step in exe._ungrouped:
        for cell in getattr(step, "__closure__", None) or ():
            fn = cell.cell_contents
            if isinstance(fn, library.LibraryFn) or hasattr(fn, "impl"):
                found.append(fn)
    return found


def test_unfused_epilogue_runs_after_the_call(fresh, monkeypatch):
    # measured slower inside the call: the kernel runs right after it, same numbers
    real = choice.measure

    def measure(key, builders, *args):
        if key[0] == "epilogue":
            return next(n for n in builders if n != "onednn post-ops"), "forced by the test"
        return real(key, builders, *args)

    monkeypatch.setattr(choice, "measure", measure)
    model = mlp("gelu_tanh")
    x = RNG.standard_normal((1, S, H)).astype(np.float32)
    got, exe = _run(model, x)
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-4, atol=1e-4)
    assert exe.num_kernels == 4  # two calls, each with its epilogue kernel after it


def test_strided_gemm_with_an_epilogue_matches_the_node_case(fused):
    """An attention score GEMM on strided Q and K^T views followed by a softcap (x / c,
    tanh, * c): with post-ops forced it must still match (it was 0.14 off: such calls now
    run their epilogue after the call)."""
    from autoclust.tools import conformance
    name = "test_attention_3d_with_past_and_present_qk_matmul_softcap_expanded"
    (case,) = [c for c in conformance.node_cases() if c.name == name]
    ins, outs = case.data_sets[0]
    feeds = {i.name: x for i, x in zip(case.model.graph.input, ins)}
    sess = autoclust.InferenceSession(case.model.SerializeToString(), min_cluster_size=1,
                                      autotune=False)
    for got, want in zip(sess.run(None, feeds), outs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("inside", [True, False])
def test_a_new_length_takes_the_epilogue_choice_of_the_first(inside, fresh, monkeypatch):
    """With a symbolic sequence length, the first length measures where each epilogue runs;
    a new length's binding takes that choice instead of measuring again (a new length's
    first run paid ~0.1-0.25 s per call for it), and its outputs match onnxruntime."""
    if onednn.unavailable():
        pytest.skip(f"oneDNN: {onednn.unavailable()}")
    real, measured = choice.measure, []

    def measure(key, builders, *args):
        if key[0] != "epilogue":
            return real(key, builders, *args)
        measured.append(key[3][0][1])  # the first operand's shape
        return next(n for n in builders if (n == "onednn post-ops") == inside), "forced"

    monkeypatch.setattr(choice, "measure", measure)
    model = mlp("gelu_tanh", seq="s")
    sess = autoclust.InferenceSession(model, must_compile=True, threads=2, autotune=False)
    runner = sess._runtime.compiled_clusters()[0]
    for seq in (S, 96, 80):
        x = RNG.standard_normal((1, seq, H)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, {"x": x}),
                                   rtol=1e-4, atol=1e-4)
        exe = runner.cache[runner.signature([x])]
        impls = [f.impl for f in _library_fns(exe)]
        assert all((i == library.FUSED) == inside for i in impls), (seq, impls)
    assert runner.compiles == 1 and measured == [(1, S, H), (1, S, F)]


def test_fast_math_runs_gelu_erf_inside_the_gemm(fresh):
    """--fast_math: the erf GELU (not post-ops by default: POST_OPS) runs inside its GEMM as
    oneDNN's gelu_erf, taken without timing; its approximation keeps the FFN block within
    1e-5 of onnxruntime."""
    if onednn.unavailable():
        pytest.skip(f"oneDNN: {onednn.unavailable()}")
    model = mlp("gelu_erf")
    x = RNG.standard_normal((1, S, H)).astype(np.float32)
    sess = autoclust.InferenceSession(model, must_compile=True, threads=2, fast_math=True)
    got = sess.run(None, {"x": x})[0]
    exe = next(iter(sess._runtime.compiled_clusters()[0].cache.values()))
    buffers = {b.id: b for b in exe.program.buffers}
    first, _ = _calls(exe)
    assert epilogue.post_ops(first, buffers) is None
    steps = epilogue.post_ops(first, buffers, fast_math=True)[0]
    assert [s.kind for s in steps if s.kind != "linear"] == ["add", "gelu_erf"]
    fns = _library_fns(exe)
    assert fns[0].impl == "onednn+post-ops" and "untimed" in fns[0].note, fns[0].note
    assert fns[0].fused  # no GELU kernel after the call
    np.testing.assert_allclose(got, _ort(model, {"x": x}), rtol=1e-5, atol=1e-5)
