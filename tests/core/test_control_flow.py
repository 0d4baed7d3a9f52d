"""If, Loop and Scan with clustered bodies (autoclust/runtime/control_flow.py), against onnxruntime.

Each model runs through autoclust.InferenceSession and plain onnxruntime; the outputs must
match, and the bodies' cluster counts, compile counts (one compile serves every iteration)
and run counts are asserted, as is the `explain` text.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest

import autoclust
from autoclust.errors import NotCompilableError
from autoclust.runtime.control_flow import runtime_stats

RNG = np.random.default_rng(12)


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 17]>\n' + text)
    onnx.checker.check_model(model, full_check=True)
    return model


def run_both(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **flags) -> tuple:
    """(autoclust outputs, onnxruntime outputs, the session)."""
    sess = autoclust.InferenceSession(model, **flags)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    return sess.run(None, feeds), want, sess


def assert_same(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-6) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-7)


def flow_stats(sess: autoclust.InferenceSession) -> list[dict]:
    return runtime_stats(sess._runtime)["control_flow"]


def body_clusters(stats: dict, attr: str = "body") -> list[dict]:
    return stats["bodies"][attr]["clusters"]


# ---- Loop -------------------------------------------------------------------------------

# x_out = Tanh(x_in * x_in + w) * 0.5 + x_in: one 5-node elementwise cluster in the body;
# the condition i < k reads the outer value k; s is a scan output.
def loop_model(trip: str, cond: str) -> onnx.ModelProto:
    return parse(f"""
    g (int64 M, bool c0, int64 k, float[4] x0, float[4] w) => (float[4] x, float[N,4] ss) {{
      half = Constant <value = float {{0.5}}> ()
      x, ss = Loop ({trip}, {cond}, x0) <body = body (int64 i, bool c, float[4] x_in)
                                        => (bool c_out, float[4] x_out, float[4] s) {{
        a = Mul (x_in, x_in)
        b = Add (a, w)
        t = Tanh (b)
        h = Mul (t, half)
        x_out = Add (h, x_in)
        s = Sigmoid (x_out)
        c_out = Less (i, k)
      }}>
    }}""")


@pytest.mark.parametrize("trip,cond,m,c0,k,iterations", [
    ("M", "", 5, True, 9, 5),        # M alone
    ("M", "", 5, True, 1, 2),        # M alone: the body's cond still ends it (onnxruntime)
    ("M", "", 0, True, 9, 0),        # zero trips
    ("", "c0", 0, True, 3, 4),       # cond alone: runs until i < k fails (after i = k)
    ("", "c0", 0, False, 3, 0),      # cond false on entry: zero trips
    ("M", "c0", 2, True, 9, 2),      # both: M bounds it
    ("M", "c0", 9, True, 2, 3),      # both: cond ends it
])
def test_loop_matches_onnxruntime(trip, cond, m, c0, k, iterations):
    model = loop_model(trip, cond)
    base = {"M": np.array(m), "c0": np.array(c0), "k": np.array(k),
            "w": RNG.standard_normal(4).astype(np.float32)}
    sess = None
    for run in range(3):  # the same shapes again: nothing compiles a second time
        feeds = {**base, "x0": RNG.standard_normal(4).astype(np.float32)}
        if sess is None:
            got, want, sess = run_both(model, feeds)
        else:
            got = sess.run(None, feeds)
            want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        assert_same(got, want)
        assert got[1].shape[0] == iterations
    [stats] = flow_stats(sess)
    assert stats["runs"] == 3 and stats["iterations"] == 3 * iterations
    [cluster] = body_clusters(stats)
    assert cluster["runs"] == 3 * iterations
    assert cluster["compiles"] == (1 if iterations else 0)
    assert cluster["kernels"] == ([1] if iterations else [])


def test_loop_explain():
    sess = autoclust.InferenceSession(loop_model("M", ""))
    lines = sess.explain().splitlines()
    assert lines[:4] == [
        "Built 0 clusters covering 0/1 nodes (0.0%); 1 control-flow node with clustered bodies",
        "Control flow run by autoclust:",
        "  Loop_1 (Loop): Loop runs in autoclust; body: 1 cluster of 6/7 nodes",
        "    body: Built 1 cluster covering 6/7 nodes (85.7%)"]
    assert lines[4].split() == ["cluster_0000:", "6", "nodes", "Add", "x2,", "Mul", "x2,",
                                "Sigmoid,", "Tanh"]
    assert "Less_6 (Less): cluster too small" in sess.explain()
    flow = sess.explain(as_json=True)["control_flow"]
    assert [(f["node"], f["op"]) for f in flow] == [("Loop_1", "Loop")]
    assert len(flow[0]["bodies"]["body"]["clusters"]) == 1


@pytest.mark.parametrize("symbolic", [True, False])
def test_loop_carried_shape_changes_compile_per_shape(symbolic):
    """A carried value that grows (Concat) meets a new signature each iteration: one shape
    class (its length symbolic) serves them all; with concrete shapes each compiles."""
    model = parse("""
    g (int64 M, float[2] x0) => (float[N] x) {
      x = Loop (M, , x0) <body = body (int64 i, bool c, float[K] x_in) => (bool c, float[L] x_out) {
        a = Mul (x_in, x_in)
        b = Tanh (a)
        d = Sigmoid (b)
        e = Neg (d)
        x_out = Concat <axis = 0> (x_in, e)
      }>
    }""")
    feeds = {"M": np.array(3), "x0": np.array([0.5, -1.0], np.float32)}
    got, want, sess = run_both(model, feeds, symbolic_dims=symbolic)
    assert_same(got, want)
    assert got[0].shape == (16,)
    [cluster] = body_clusters(flow_stats(sess)[0])
    compiles = 1 if symbolic else 3
    assert cluster["compiles"] == compiles and cluster["runs"] == 3
    assert_same(sess.run(None, feeds), want)  # the second run compiles nothing more
    assert body_clusters(flow_stats(sess)[0])[0]["compiles"] == compiles


# ---- If ---------------------------------------------------------------------------------

IF_MODEL = """
g (bool c, float[3,4] x, float[4] w) => (float[3,4] y) {
  y = If (c) <then_branch = then () => (float[3,4] y_then) {
      a = Mul (x, w)
      b = Tanh (a)
      d = Sigmoid (b)
      e = Add (d, x)
      y_then = Exp (e)
    }, else_branch = else () => (float[3,4] y_else) {
      y_else = Sub (x, w)
    }>
}"""


def test_if_takes_both_branches_reading_outer_values():
    model = parse(IF_MODEL)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    w = RNG.standard_normal(4).astype(np.float32)
    sess = autoclust.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString())
    for c in (True, False, True):
        feeds = {"c": np.array(c), "x": x, "w": w}
        assert_same(sess.run(None, feeds), ref.run(None, feeds))
    [stats] = flow_stats(sess)
    assert stats["runs"] == 3 and stats["iterations"] == 3
    [then] = body_clusters(stats, "then_branch")
    assert then["compiles"] == 1 and then["runs"] == 2 and then["kernels"] == [1]
    assert body_clusters(stats, "else_branch") == []  # one Sub: onnxruntime runs it
    assert ("  If_0 (If): If runs in autoclust; then_branch: 1 cluster of 5/5 nodes, "
            "else_branch: 0 clusters of 0/1 nodes") in sess.explain().splitlines()


def test_nested_loop_in_if():
    model = parse("""
    g (bool c, int64 M, float[4] x, float[4] w) => (float[4] y) {
      y = If (c) <then_branch = then () => (float[4] y_then) {
          y_then = Loop (M, , x) <body = body (int64 i, bool cc, float[4] v) => (bool cc, float[4] v_out) {
            a = Mul (v, w)
            b = Tanh (a)
            d = Add (b, x)
            e = Sigmoid (d)
            v_out = Add (e, v)
          }>
        }, else_branch = else () => (float[4] y_else) {
          y_else = Neg (x)
        }>
    }""")
    x = RNG.standard_normal(4).astype(np.float32)
    w = RNG.standard_normal(4).astype(np.float32)
    sess = autoclust.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString())
    for c, m in ((True, 4), (False, 4), (True, 7)):
        feeds = {"c": np.array(c), "M": np.array(m), "x": x, "w": w}
        assert_same(sess.run(None, feeds), ref.run(None, feeds))
    [outer] = flow_stats(sess)
    assert body_clusters(outer, "then_branch") == []
    [inner] = outer["bodies"]["then_branch"]["control_flow"]
    assert inner["op"] == "Loop" and inner["runs"] == 2 and inner["iterations"] == 11
    [cluster] = body_clusters(inner)
    assert cluster["compiles"] == 1 and cluster["runs"] == 11
    text = sess.explain()
    assert ("  If_0 (If): If runs in autoclust; then_branch: 0 clusters of 0/1 nodes and "
            "1 control-flow node, else_branch: 0 clusters of 0/1 nodes") in text
    assert "Loop runs in autoclust; body: 1 cluster of 5/5 nodes" in text


# ---- Scan -------------------------------------------------------------------------------

def scan_model(x_shape: str, attrs: str, y_shape: str) -> onnx.ModelProto:
    return parse(f"""
    g (float[3] s0, float[{x_shape}] xs) => (float[3] s, float[{y_shape}] ys) {{
      s, ys = Scan (s0, xs) <body = body (float[3] s_in, float[3] x) => (float[3] s_out,
                                                                       float[3] y) {{
        two = Constant <value = float {{2.0}}> ()
        a = Mul (x, two)
        b = Tanh (a)
        s_out = Add (s_in, b)
        d = Sigmoid (s_out)
        y = Mul (d, x)
      }}, num_scan_inputs = 1{attrs}>
    }}""")


@pytest.mark.parametrize("x_shape,attrs,y_shape", [
    ("5,3", "", "5,3"),                                                   # forward, axis 0
    ("5,3", ", scan_input_directions = [1]", "5,3"),                      # reversed input
    ("3,5", ", scan_input_axes = [1]", "5,3"),                            # axis 1
    ("3,5", ", scan_input_axes = [-1], scan_output_axes = [1]", "3,5"),   # out along axis 1
    ("5,3", ", scan_output_directions = [1]", "5,3"),                     # reversed output
])
def test_scan_matches_onnxruntime(x_shape, attrs, y_shape):
    model = scan_model(x_shape, attrs, y_shape)
    shape = tuple(int(d) for d in x_shape.split(","))
    feeds = {"s0": RNG.standard_normal(3).astype(np.float32),
             "xs": RNG.standard_normal(shape).astype(np.float32)}
    got, want, sess = run_both(model, feeds)
    assert_same(got, want, rtol=1e-5)  # the state sums 5 tanh values in float32
    [stats] = flow_stats(sess)
    assert stats["iterations"] == 5
    [cluster] = body_clusters(stats)
    assert cluster["runs"] == 5 and cluster["compiles"] == 1


# ---- Builder programs -------------------------------------------------------------------

def newton_sqrt() -> autoclust.Builder:
    """Newton's iteration for sqrt in a while loop (as in test_builder)."""
    b = autoclust.Builder("newton_sqrt")
    a = b.parameter("a", np.float32, ["N"])

    def cond(s, x, i):
        err = s.ReduceMax(s.Abs(x * x - a) - 1e-6 * a, keepdims=0)
        return s.And(err > 0.0, i < 50)

    def body(s, x, i):
        return 0.5 * (x + a / x), i + 1

    x, steps = b.while_loop(cond, body, [b.Max(a, 1.0), 0])
    b.build({"root": x, "steps": steps})
    return b


def test_builder_newton_sqrt_body_clusters():
    b = newton_sqrt()
    run = b.compile()
    model = b.to_onnx()
    ref = ort.InferenceSession(model.SerializeToString())
    a = RNG.uniform(0.01, 1e4, 1000).astype(np.float32)
    root, steps = run(a)
    want_root, want_steps = ref.run(None, {"a": a})
    np.testing.assert_array_equal(root, want_root)
    assert int(steps) == int(want_steps) > 5
    np.testing.assert_allclose(root, np.sqrt(a), rtol=2e-6)
    [stats] = flow_stats(run.session)
    clusters = body_clusters(stats)
    assert len(clusters) == 1 and clusters[0]["compiles"] == 1
    assert clusters[0]["runs"] == int(steps)
    assert "Loop runs in autoclust; body: 1 cluster of" in run.explain()


def test_builder_fori_loop_in_if_with_outer_reads():
    b = autoclust.Builder("poly")
    x = b.parameter("x", np.float32, [8])
    n = b.parameter("n", np.int64, [])

    def step(s, i, acc):
        return [s.Tanh(acc * x + 0.25) * 0.5 + s.Sigmoid(acc)]

    y = b.if_(n > 0, lambda s: s.fori_loop(n, step, [x])[0], lambda s: -x)
    run = b.compile(outputs=y)
    ref = ort.InferenceSession(b.to_onnx(outputs=y).SerializeToString())
    xs = RNG.standard_normal(8).astype(np.float32)
    for count in (6, 0, 3):
        got = run(xs, np.array(count))
        np.testing.assert_allclose(got, ref.run(None, {"x": xs, "n": np.array(count)})[0],
                                   rtol=1e-6)
    [outer] = flow_stats(run.session)
    [inner] = outer["bodies"]["then_branch"]["control_flow"]
    [cluster] = body_clusters(inner)
    assert inner["iterations"] == 9 and cluster["runs"] == 9 and cluster["compiles"] == 1


# ---- what stays in onnxruntime ----------------------------------------------------------

def test_sequence_carried_loop_stays_in_onnxruntime():
    model = parse("""
    g (int64 M, float[2] x) => (float[N,2] y) {
      seq0 = SequenceEmpty <dtype = 1> ()
      seq = Loop (M, , seq0) <body = body (int64 i, bool c, seq(float[2]) s_in) => (bool c, seq(float[2]) s_out) {
        a = Mul (x, x)
        b = Tanh (a)
        d = Sigmoid (b)
        e = Exp (d)
        f = Neg (e)
        s_out = SequenceInsert (s_in, f)
      }>
      y = ConcatFromSequence <axis = 0, new_axis = 1> (seq)
    }""")
    feeds = {"M": np.array(3), "x": np.array([0.5, -2.0], np.float32)}
    got, want, sess = run_both(model, feeds)
    assert_same(got, want)
    reason = sess.plan.reasons["Loop_1"]
    assert reason.startswith("has a subgraph; onnxruntime runs it: Loop 'Loop_1' has a "
                             "non-tensor value") and "sequences and optionals" in reason


def test_body_with_nothing_to_cluster_stays_in_onnxruntime():
    model = parse("""
    g (int64 M, float[4] x0) => (float[4] x) {
      x = Loop (M, , x0) <body = body (int64 i, bool c, float[4] x_in) => (bool c, float[4] x_out) {
        x_out = Neg (x_in)
      }>
    }""")
    feeds = {"M": np.array(3), "x0": np.arange(4, dtype=np.float32)}
    got, want, sess = run_both(model, feeds)
    assert_same(got, want)
    assert sess.plan.reasons["Loop_0"] == ("has a subgraph; nothing in it clusters (Neg_0: "
                                           "cluster too small (1 < min_cluster_size=4))")
    assert sess.plan.control_flow == []


def test_must_compile_looks_inside_bodies():
    model = loop_model("M", "")
    sess = autoclust.InferenceSession(model, must_compile=True)  # every body node compiles
    feeds = {"M": np.array(2), "c0": np.array(True), "k": np.array(0),
             "x0": np.ones(4, np.float32), "w": np.ones(4, np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert_same(sess.run(None, feeds), want)
    bad = parse("""
    g (int64 M, float[4] x0) => (float[4] x) {
      x = Loop (M, , x0) <body = body (int64 i, bool c, float[4] x_in) => (bool c, float[4] x_out) {
        nz = NonZero (x_in)
        x_out = Neg (x_in)
      }>
    }""")
    with pytest.raises(NotCompilableError, match=r"Loop_0\.body/NonZero_0: data-dependent"):
        autoclust.InferenceSession(bad, must_compile=True)


def test_loop_bad_trip_count_names_the_node():
    model = parse("""
    g (int64[2] M, float[4] x0, float[4] w) => (float[4] x) {
      x = Loop (M, , x0) <body = body (int64 i, bool c, float[4] x_in) => (bool c, float[4] x_out) {
        a = Mul (x_in, w)
        b = Tanh (a)
        d = Sigmoid (b)
        x_out = Add (d, x_in)
      }>
    }""")
    sess = autoclust.InferenceSession(model, min_cluster_size=1)
    with pytest.raises(autoclust.InvalidInputError, match=r"Loop 'Loop_0': M must have one "
                                                          r"element, got shape \(2,\)"):
        sess.run(None, {"M": np.array([1, 2]), "x0": np.ones(4, np.float32),
                        "w": np.ones(4, np.float32)})


# ---- unrolling a constant-trip elementwise Loop -----------------------------------------

def static_loop_model(trip: int, extra: str = "") -> onnx.ModelProto:
    return parse(f"""
    g (float[64] x0, float[64] w) => (float[64] x, float[64] y) {{
      M = Constant <value = int64 {{{trip}}}> ()
      x, y = Loop (M, , x0, w) <body = body (int64 i, bool c, float[64] x_in, float[64] y_in)
                                => (bool c_out, float[64] x_out, float[64] y_out) {{
        fi = Cast <to = 1> (i)
        a = Mul (x_in, w)
        b = Tanh (a)
        x_out = Add (b, fi)
        s = Add (y_in, x_out)
        y_out = Sigmoid (s)
        {extra}
        c_out = Identity (c)
      }}>
    }}""")


def test_static_elementwise_loop_becomes_one_kernel():
    model = static_loop_model(8)
    feeds = {"x0": RNG.standard_normal(64).astype(np.float32),
             "w": RNG.standard_normal(64).astype(np.float32)}
    got, want, sess = run_both(model, feeds)
    assert_same(got, want)
    assert sess.plan.unrolled == {"Loop_1": "unrolled: 8 iterations of an elementwise body "
                                            "of 6 nodes (constant trip count)"}
    assert sess.explain().splitlines()[0] == "Built 1 cluster covering 50/50 nodes (100.0%)"
    assert sess.stats()["clusters"] == [{"name": "cluster_0000", "compiles": 1, "runs": 1,
                                         "kernels": [1], "fallback": None}]


@pytest.mark.parametrize("trip,extra,why", [
    (100, "", "more than UNROLL_MAX_NODES nodes"),
    (8, "nz = NonZero (x_in)", "a body node is not elementwise"),
])
def test_loops_not_unrolled_run_in_our_runtime(trip, extra, why):
    model = static_loop_model(trip, extra)
    feeds = {"x0": RNG.standard_normal(64).astype(np.float32),
             "w": RNG.standard_normal(64).astype(np.float32)}
    got, want, sess = run_both(model, feeds)
    assert_same(got, want, rtol=1e-5)
    assert sess.plan.unrolled == {}, why
    [stats] = flow_stats(sess)
    assert stats["iterations"] == trip
    assert [c["compiles"] for c in body_clusters(stats)] == [1]
