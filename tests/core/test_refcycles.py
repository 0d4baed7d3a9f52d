"""Outputs are freed by reference counting alone, in every front end (issue 24 item 13).

autoclust.jit kept each call's output in a reference cycle (a recursive closure holding
the result leaves), so with the cycle collector idle every call allocated a new 64 MB
array and RSS grew by that much per call. Each test runs 50 calls with gc disabled,
dropping every result, and holds a weak reference to each: at most one distinct result
object may still be alive (the executable keeps its output buffer and hands the same array
out again once the caller has dropped it), where a cycle keeps all 50 alive. No timing, no
RSS threshold: the count is exact.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import autoclust

N = 1 << 20  # 4 MB of float32 per call: 50 leaked calls would hold 200 MB
CALLS = 50


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(0.79788456 * (x + 0.044715 * x ** 3)))


def _live_after_calls(call, make_input) -> int:
    refs = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(CALLS):
            out = call(make_input())
            refs.append(weakref.ref(out))
            del out
        return len({id(r()) for r in refs if r() is not None})
    finally:
        gc.enable()


def _relu_model() -> onnx.ModelProto:
    nodes = [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


X = np.linspace(-3, 3, N, dtype=np.float32)


def test_jit_outputs_are_not_held_by_cycles():
    f = autoclust.jit(gelu_tanh)
    np.testing.assert_allclose(f(X), gelu_tanh(X), rtol=1e-5, atol=1e-6)
    assert _live_after_calls(f, lambda: X) <= 1


def test_jit_structured_outputs_are_not_held_by_cycles():
    f = autoclust.jit(lambda x: {"a": (x * 2, x + 1)})
    assert _live_after_calls(lambda x: f(x)["a"][0], lambda: X) <= 1


def test_session_run_outputs_are_not_held_by_cycles():
    sess = autoclust.InferenceSession(_relu_model(), min_cluster_size=1)
    assert _live_after_calls(lambda x: sess.run(None, {"x": x})[0], lambda: X) <= 1


def test_builder_outputs_are_not_held_by_cycles():
    b = autoclust.Builder("f")
    x = b.parameter("x", np.float32, ["n"])
    f = b.compile(b.Relu(x) * 2.0)
    assert _live_after_calls(f, lambda: X) <= 1


def test_torch_backend_outputs_are_not_held_by_cycles():
    torch = pytest.importorskip("torch")
    fn = torch.compile(lambda t: torch.relu(torch.tanh(t)) * 2, backend="autoclust")
    xt = torch.from_numpy(X)
    with torch.no_grad():
        assert _live_after_calls(fn, lambda: xt) <= 1
