"""Partitioned execution end to end: zoo models through clusters and onnxruntime segments."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.models import zoo
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from support import stolen

import autoclust
from autoclust.errors import NotCompilableError
from autoclust.runtime import interpreter

# Clusters formed per zoo model at the default min_cluster_size, on the interpreter (the
# clustering does not depend on the device for these ops). A change here is a clustering
# change: look at `autoclust explain` before updating the table.
EXPECTED_CLUSTERS = {
    "mlp_gelu": 1, "bert_encoder": 1, "llama_block": 1, "resnet_block": 1,
    "diffusion_block": 1, "elementwise_chain": 1, "gelu": 1, "layernorm": 1,
    "softmax_mask": 1, "rmsnorm_gate": 1, "mixed_dynamic": 4,
}


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_close(got, want, rtol=1e-4, atol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("auto_jit", [1, 2])
@pytest.mark.parametrize("name", sorted(EXPECTED_CLUSTERS))
def test_zoo_on_interpreter_matches_onnxruntime(name, auto_jit):
    model = zoo.build(name)
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, auto_jit=auto_jit, device="interpreter")
    assert len(sess.plan.clusters) == EXPECTED_CLUSTERS[name], sess.explain()
    assert_close(sess.run(None, feeds), ort_run(model, feeds))
    # every cluster actually ran compiled (no silent fallback)
    for c in sess.stats()["clusters"]:
        assert c["compiles"] == 1 and c["fallback"] is None, c


def test_mixed_model_data_dependent_nodes_stay_out():
    sess = autoclust.InferenceSession(zoo.build("mixed_dynamic"), device="interpreter")
    reasons = {sess.plan.graph.nodes[i].op: r for i, r in enumerate(
        sess.plan.reasons.get(n.name) for n in sess.plan.graph.nodes) if r}
    for op in ("NonZero", "Unique", "TopK"):
        assert op in reasons and "data-dependent" in reasons[op], reasons
    clustered = sum(len(c.nodes) for c in sess.plan.clusters)
    assert clustered >= len(sess.plan.graph.nodes) - 3


def chain_model(n_ops=6):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])
    nodes, prev = [], "x"
    for i in range(n_ops):
        op = ("Relu", "Exp", "Neg", "Abs", "Sigmoid", "Tanh")[i % 6]
        out = "y" if i == n_ops - 1 else f"t{i}"
        nodes.append(helper.make_node(op, [prev], [out]))
        prev = out
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_signature_cache_and_megamorphic_fallback():
    sess = autoclust.InferenceSession(chain_model(), device="interpreter",
                                      megamorphic_compiles=3)
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    assert sess.stats()["clusters"][0]["compiles"] == 1
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        shapes = [sess.run(None, {"x": np.ones(n, np.float32)})[0].shape for n in range(9, 16)]
    assert shapes == [(n,) for n in range(9, 16)]
    messages = [str(r.message) for r in record if "megamorphic" in str(r.message)]
    assert len(messages) == 1 and "x[0]" in messages[0]
    stats = sess.stats()["clusters"][0]
    assert stats["compiles"] == 3 and "megamorphic" in stats["fallback"]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0],
                               ort_run(chain_model(), {"x": x})[0], rtol=1e-6)


def test_compile_failure_falls_back_with_one_warning(monkeypatch):
    def broken(graph, flags):
        raise RuntimeError("injected compile failure")
    monkeypatch.setattr(interpreter, "compile", broken)
    sess = autoclust.InferenceSession(chain_model(), device="interpreter")
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(3):
            out = sess.run(None, {"x": x})
    messages = [str(r.message) for r in record if "falls back" in str(r.message)]
    assert len(messages) == 1 and "injected compile failure" in messages[0]
    np.testing.assert_allclose(out[0], ort_run(chain_model(), {"x": x})[0], rtol=1e-6)


def test_must_compile_raises_on_compile_failure(monkeypatch):
    def broken(graph, flags):
        raise RuntimeError("injected compile failure")
    monkeypatch.setattr(interpreter, "compile", broken)
    sess = autoclust.InferenceSession(chain_model(), device="interpreter", must_compile=True)
    with pytest.raises(NotCompilableError, match="cluster_0000 failed to compile"):
        sess.run(None, {"x": np.ones(4, np.float32)})


def test_must_compile_lists_every_unclusterable_node():
    with pytest.raises(NotCompilableError) as info:
        autoclust.InferenceSession(zoo.build("mixed_dynamic"), device="interpreter",
                                   must_compile=True)
    message = str(info.value)
    assert "3 node(s) could not be compiled" in message
    for op in ("NonZero", "Unique", "TopK"):
        assert op in message


def test_values_are_freed_after_last_use():
    sess = autoclust.InferenceSession(zoo.build("mixed_dynamic"), device="interpreter")
    feeds = zoo.feeds(sess._model)
    env = sess._runtime.run(feeds)
    outputs = {o.name for o in sess.get_outputs()}
    assert set(env) - set(feeds) == outputs


def test_auto_jit_zero_builds_no_plan():
    sess = autoclust.InferenceSession(zoo.build("gelu"), auto_jit=0)
    assert sess.plan is None and sess.explain().startswith("No clustering")


def test_check_numerics_warns(monkeypatch):
    sess = autoclust.InferenceSession(chain_model(), device="interpreter",
                                      check_numerics=True)
    with pytest.warns(RuntimeWarning, match="cluster_0000 output 'y' has NaN"):
        sess.run(None, {"x": np.array([np.nan, 1], np.float32)})


def test_threads_and_sessions_share_results():
    """One session run from several threads gives the same results as one thread."""
    from concurrent.futures import ThreadPoolExecutor
    model = zoo.build("mixed_dynamic")
    sess = autoclust.InferenceSession(model, device="interpreter")
    feeds = zoo.feeds(model)
    want = ort_run(model, feeds)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: sess.run(None, feeds), range(40)))
    for got in results:
        assert_close(got, want)
    assert all(c["compiles"] == 1 for c in sess.stats()["clusters"])


@pytest.mark.speed
def test_plan_overhead_per_step_is_small():
    """The run loop's own cost per step (runners stubbed out) stays under 10 us."""
    import time
    sess = autoclust.InferenceSession(zoo.build("mixed_dynamic"), device="interpreter")
    rt = sess._runtime
    feeds = zoo.feeds(sess._model)
    env = rt.run(feeds)
    cached = {}
    for i, (run, ins, outs, frees) in enumerate(rt.steps):
        cached[i] = [np.zeros(1, np.float32) for _ in outs]
    rt.steps = [(lambda inputs, r=cached[i]: r, ins, outs, frees)
                for i, (_, ins, outs, frees) in enumerate(rt.steps)]
    n = 2000
    times = []
    with stolen.Meter() as meter:
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                rt.run(feeds)
            times.append((time.perf_counter() - t0) / n / len(rt.steps) * 1e6)
    per_step = float(np.median(times))
    print(f"plan overhead: {per_step:.2f} us per step ({len(rt.steps)} steps)")
    assert env and per_step < meter.budget(10.0), meter


# ---- property: random DAGs through clusters and fallback segments equal onnxruntime -----


_UNARY = ["Relu", "Tanh", "Sigmoid", "Neg", "Abs"]
_BINARY = ["Add", "Mul", "Sub", "Max"]


@st.composite
def random_onnx_dags(draw):
    values = ["x0", "x1"]
    nodes = []
    for k in range(draw(st.integers(1, 16))):
        if draw(st.booleans()):
            op = draw(st.sampled_from(_UNARY))
            args = [draw(st.sampled_from(values))]
        else:
            op = draw(st.sampled_from(_BINARY))
            args = [draw(st.sampled_from(values)), draw(st.sampled_from(values))]
        out = f"v{k}"
        nodes.append(helper.make_node(op, args, [out], name=f"n{k}"))
        values.append(out)
    used = {i for n in nodes for i in n.input}
    outs = [v for v in values[2:] if v not in used]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", 5]) for n in ("x0", "x1")]
    graph = helper.make_graph(nodes, "dag", ins, [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    exclude = draw(st.lists(st.sampled_from(_UNARY + _BINARY), max_size=3, unique=True))
    fuel = draw(st.integers(-1, 12))
    return model, exclude, fuel


@settings(max_examples=60, deadline=None)
@given(random_onnx_dags())
def test_random_dags_run_like_onnxruntime(case):
    model, exclude, fuel = case
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((3, 5)).astype(np.float32) for n in ("x0", "x1")}
    sess = autoclust.InferenceSession(model, device="interpreter", min_cluster_size=1,
                                      cluster_exclude_ops=exclude, clustering_fuel=fuel)
    plan = sess.plan
    assert sorted(n.name for s in plan.steps for n in s.nodes) == \
        sorted(n.name for n in plan.graph.nodes)
    assert_close(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_zero_d_input_passes_through_as_zero_d(device):
    """Regression (fuzzer seed 11): Expand(x[], shape=[]) folds to the input itself, and
    the CPU executable used np.ascontiguousarray, which turns 0-d arrays into shape (1,)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor("s", TensorProto.INT64, [0], [])
    nodes = [helper.make_node("Expand", ["x", "s"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [shape]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    sess = autoclust.InferenceSession(model, device=device, min_cluster_size=1)
    out = sess.run(None, {"x": np.array(2.5, np.float32)})[0]
    assert out.shape == () and out == np.float32(2.5)


def test_cpu_outputs_the_caller_keeps_are_never_overwritten():
    """The CPU executable refills last run's output array only once the caller dropped it."""
    sess = autoclust.InferenceSession(chain_model(), device="cpu")
    x1 = np.linspace(-2, 2, 4096, dtype=np.float32)
    x2 = np.linspace(3, 5, 4096, dtype=np.float32)
    first = sess.run(None, {"x": x1})[0]
    snapshot = first.copy()
    view = sess.run(None, {"x": x2})[0][:10]  # only a view of the second output is kept
    third = sess.run(None, {"x": x1})[0]
    np.testing.assert_array_equal(first, snapshot)
    assert not np.shares_memory(first, third) and not np.shares_memory(view, third)
    want2 = ort_run(chain_model(), {"x": x2})[0][:10]
    np.testing.assert_allclose(view, want2, rtol=1e-5)
    del first
    fourth = sess.run(None, {"x": x2})[0]
    np.testing.assert_allclose(fourth, ort_run(chain_model(), {"x": x2})[0], rtol=1e-5)
