"""Compile latency work (issue 11): cheap cluster fingerprints, background prepacked library
sessions, and a warm --cache_dir that skips lowering and LLVM. Every result is checked
against onnxruntime; cache soundness is checked on weights, shapes and flags."""

from __future__ import annotations

import textwrap

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
from onnx import numpy_helper

import autoclust
from autoclust import clustering

RNG = np.random.default_rng(5)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(textwrap.dedent(text))
    model.ir_version = 10
    return model


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def mlp(w: np.ndarray, scale: float = 0.5) -> onnx.ModelProto:
    """x[batch, seq, 64] @ w[64, 96] (a library call) then a fused elementwise tail whose
    scalar constant is inlined into kernel code."""
    model = parse(f"""
        <ir_version: 10, opset_import: ["" : 18]>
        g (float[1, seq, 64] x) => (float[1, seq, 96] y) {{
            m = MatMul(x, w)
            s = Constant <value = float {{{scale}}}> ()
            a = Mul(m, s)
            t = Tanh(a)
            y = Add(t, m)
        }}
    """)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    return model


def weights() -> np.ndarray:
    return RNG.standard_normal((64, 96)).astype(np.float32)


def plan_of(model: onnx.ModelProto) -> clustering.Plan:
    sess = autoclust.InferenceSession(model, threads=1, min_cluster_size=1)
    return sess.plan


# ---- fingerprints ------------------------------------------------------------------------------

def test_fingerprint_differs_in_one_weight_value_and_is_lazy(monkeypatch):
    calls = []
    digest = clustering._array_digest
    monkeypatch.setattr(clustering, "_array_digest", lambda v: calls.append(v) or digest(v))
    w = weights()
    w2 = w.copy()
    w2[17, 3] += 1e-3  # one value
    p1, p1_again, p2 = plan_of(mlp(w)), plan_of(mlp(w.copy())), plan_of(mlp(w2))
    assert calls == []  # building the plans hashed no weight
    f1, f1_again, f2 = (p.clusters[0].fingerprint for p in (p1, p1_again, p2))
    assert f1 == f1_again and hash(f1) == hash(f1_again) and f1 != f2
    assert len(str(f1)) == 40 and str(f1) == repr(f1).strip("'")
    assert len(calls) >= 3  # computed when read, each weight hashed


def test_array_digest_memoized_per_array_and_reads_strided_arrays():
    a = RNG.standard_normal((32, 16)).astype(np.float32)
    first = clustering._array_digest(a)
    assert clustering._DIGESTS[id(a)][1] == first and clustering._array_digest(a) is first
    b = a.copy()
    b[0, 0] = np.nextafter(b[0, 0], np.float32(np.inf))
    assert clustering._array_digest(b) != first
    assert clustering._array_digest(a.T) == clustering._array_digest(a.T.copy())
    assert clustering._array_digest(a[:0]) == clustering._array_digest(a[:0].copy())
    key = id(b)
    del b  # a freed array's memo goes with it (its id may be reused)
    assert key not in clustering._DIGESTS
