"""autoclust.Builder: programs of the kinds the XLA-in-Python notebook builds, against NumPy.

A Newton iteration in a while loop, a Householder QR in a fori loop, a convolution, an
if/else, nested loops reading outer values; each runs compiled through
autoclust.InferenceSession and in plain onnxruntime, and matches NumPy. Then op methods
(generated from the op table), shape inference while building, errors, and clustering
around loops.
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.importers.builder.ops import OPSET

import autoclust
from autoclust import ops
from autoclust.errors import BuildError, ShapeInferenceError, UnsupportedOpError

RNG = np.random.default_rng(7)


def run_ort(model: onnx.ModelProto, *args: np.ndarray) -> list[np.ndarray]:
    """The model in plain onnxruntime (after the full ONNX checker)."""
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), args)})


# ---- a while loop: Newton's iteration for sqrt ------------------------------------------

def newton_sqrt(tol: float = 1e-6, max_iter: int = 50) -> autoclust.Builder:
    b = autoclust.Builder("newton_sqrt")
    a = b.parameter("a", np.float32, ["N"])

    def cond(s, x, i):  # iterate while some |x*x - a| > tol * a, at most max_iter times
        err = s.ReduceMax(s.Abs(x * x - a) - tol * a, keepdims=0)
        return s.And(err > 0.0, i < max_iter)

    def body(s, x, i):
        return 0.5 * (x + a / x), i + 1

    x, steps = b.while_loop(cond, body, [b.Max(a, 1.0), 0])
    b.build({"root": x, "steps": steps})
    return b


def newton_numpy(a: np.ndarray, tol: float = 1e-6, max_iter: int = 50) -> tuple:
    x, i = np.maximum(a, np.float32(1)), 0
    while (np.abs(x * x - a) - np.float32(tol) * a).max() > 0 and i < max_iter:
        x, i = np.float32(0.5) * (x + a / x), i + 1
    return x, i


def test_newton_sqrt_while_loop():
    b = newton_sqrt()
    run = b.compile()
    for n in (1, 7, 1000):  # one model, symbolic N
        a = RNG.uniform(0.01, 1e4, n).astype(np.float32)
        root, steps = run(a)
        want_root, want_steps = newton_numpy(a)
        assert steps.dtype == np.int64 and int(steps) == want_steps > 3
        np.testing.assert_allclose(root, np.sqrt(a), rtol=2e-6)
        np.testing.assert_allclose(root, want_root, rtol=1e-6)
        ort_root, ort_steps = run_ort(b.to_onnx(), a)
        np.testing.assert_array_equal(ort_root, root)
        assert int(ort_steps) == want_steps
    assert "Loop_" in b.as_text() and ".body:\n  graph newton_sqrt_while" in b.as_text()


def test_while_loop_max_trip_count():
    b = autoclust.Builder("count")
    n = b.parameter("n", np.int64, [])
    (i,) = b.while_loop(lambda s, i: i < n, lambda s, i: [i + 1], [0], max_trip_count=5)
    run = b.compile(outputs=i)
    assert int(run(np.int64(3))) == 3
    assert int(run(np.int64(100))) == 5  # capped
    assert int(run(np.int64(-1))) == 0   # the condition is checked before the first step


# ---- a fori loop: QR by Householder reflections ------------------------------------------

def householder_qr(m: int, n: int) -> autoclust.Builder:
    b = autoclust.Builder("qr")
    a = b.parameter("A", np.float64, [m, n])
    rows = b.constant(np.arange(m))

    def outer(s, u, v):
        return s.Unsqueeze(u, [1]) * s.Unsqueeze(v, [0])

    def step(s, k, q, r):
        below = s.Cast(s.GreaterOrEqual(rows, k), to=np.float64)
        x = s.Gather(r, k, axis=1) * below              # column k, rows >= k
        xk = s.Gather(x, k)
        norm_x = s.Sqrt(s.ReduceSum(x * x, keepdims=0))
        alpha = s.Where(xk >= 0.0, -norm_x, norm_x)     # the sign that avoids cancellation
        v = x - alpha * s.Cast(s.Equal(rows, k), to=np.float64)
        norm = s.Sqrt(s.ReduceSum(v * v, keepdims=0))
        v = v / s.Where(norm > 0.0, norm, 1.0)
        r = r - 2.0 * outer(s, v, s.MatMul(v, r))       # H r
        q = q - 2.0 * outer(s, s.MatMul(q, v), v)       # q H
        return q, r

    q, r = b.fori_loop(n, step, [np.eye(m), a])
    b.build([q, r])
    return b


@pytest.mark.parametrize("m,n", [(5, 3), (4, 4), (8, 2)])
def test_householder_qr_fori_loop(m, n):
    a = RNG.standard_normal((m, n))
    b = householder_qr(m, n)
    q, r = b.compile()(a)
    np.testing.assert_allclose(q @ r, a, atol=1e-12)
    np.testing.assert_allclose(q.T @ q, np.eye(m), atol=1e-12)
    np.testing.assert_allclose(np.tril(r, -1), 0, atol=1e-12)
    qn, rn = np.linalg.qr(a, mode="complete")  # equal up to the signs of R's rows
    sign = np.sign(np.diag(r)[:n]) * np.sign(np.diag(rn)[:n])
    np.testing.assert_allclose(r[:n] * sign[:, None], rn[:n], atol=1e-12)
    np.testing.assert_allclose(q[:, :n] * sign, qn[:, :n], atol=1e-12)
    q2, r2 = run_ort(b.to_onnx(), a)
    np.testing.assert_allclose(q2, q, atol=1e-13)
    np.testing.assert_allclose(r2, r, atol=1e-13)


# ---- a convolution ---------------------------------------------------------------------------

def conv_numpy(x, w, bias, stride, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    return np.einsum("nchwij,ocij->nohw", win, w) + bias[None, :, None, None]


def test_conv_bias_relu():
    b = autoclust.Builder("conv")
    x = b.parameter("x", np.float32, ["B", 3, 9, 9])
    w = b.constant(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32))
    bias = b.constant(RNG.standard_normal(4).astype(np.float32))
    y = b.Conv(x, w, bias, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    assert y.shape == ("B", 4, 5, 5) and y.dtype == np.float32
    z = b.Relu(y) * 0.5 + b.Sigmoid(y)
    b.build(z)
    xs = RNG.standard_normal((2, 3, 9, 9)).astype(np.float32)
    conv = conv_numpy(xs, b.graph.initializers[w.name], b.graph.initializers[bias.name], 2, 1)
    want = np.maximum(conv, 0) * 0.5 + 1 / (1 + np.exp(-conv))
    run = b.compile(min_cluster_size=1)
    np.testing.assert_allclose(run(xs), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_ort(b.to_onnx(), xs)[0], want, rtol=1e-5, atol=1e-5)
    lines = run.explain().splitlines()  # Conv stays in onnxruntime on the CPU, on purpose
    assert lines[:2] == ["Built 1 cluster covering 4/5 nodes (80.0%)",
                         "  cluster_0000: 4 nodes  Add, Mul, Relu, Sigmoid"]
    assert "(Conv): kept in onnxruntime" in lines[-1]


# ---- if/else and nested loops ----------------------------------------------------------------

def test_if_branches_and_outer_values():
    b = autoclust.Builder("branch")
    x = b.parameter("x", np.float32, [3])
    k = b.constant(np.float32(10))
    pos, total = b.if_(b.ReduceSum(x, keepdims=0) > 0.0,
                       lambda s: (x * k, s.ReduceSum(x, keepdims=0)),
                       lambda s: (-x, s.constant(np.float32(-1))))
    run = b.compile(outputs=[pos, total])
    for xs in (np.array([1, 2, -1], np.float32), np.array([-1, -2, 1], np.float32)):
        want = (xs * 10, xs.sum()) if xs.sum() > 0 else (-xs, np.float32(-1))
        got = run(xs)
        np.testing.assert_array_equal(got[0], want[0])
        assert got[1] == want[1] and got[1].dtype == np.float32
        assert all(np.array_equal(g, o) for g, o in zip(got, run_ort(b.to_onnx(), xs)))


def test_operators_in_a_branch_stay_in_the_branch():
    b = autoclust.Builder("safe_div")
    n, d = b.parameter("n", np.int64, []), b.parameter("d", np.int64, [])
    q = b.if_(b.Not(b.Equal(d, 0)), lambda s: n / d, lambda s: s.constant(np.int64(-1)))
    assert [node.op for node in b.graph.nodes] == ["Equal", "Not", "If"]  # no Div out here
    run = b.compile(outputs=q)
    assert int(run(np.int64(7), np.int64(2))) == 3
    assert int(run(np.int64(7), np.int64(0))) == -1  # the division never runs


def test_nested_loops_read_outer_values():
    b = autoclust.Builder("nested")
    x = b.parameter("x", np.float32, [2, 2])

    def outer_step(s, i, acc):
        scale = s.Cast(i + 1, to=np.float32)

        def inner_step(t, j, acc):
            return acc + x * scale + t.Cast(j, to=np.float32)
        return s.fori_loop(4, inner_step, acc)

    acc = b.fori_loop(3, outer_step, np.zeros((2, 2), np.float32))
    xs = RNG.standard_normal((2, 2)).astype(np.float32)
    want = np.zeros((2, 2), np.float32)
    for i in range(3):
        for j in range(4):
            want = want + xs * np.float32(i + 1) + np.float32(j)
    np.testing.assert_allclose(b.compile(outputs=acc)(xs), want, rtol=1e-6)
    np.testing.assert_allclose(run_ort(b.to_onnx(), xs)[0], want, rtol=1e-6)
    outer_loop = b.graph.nodes[-1]
    assert outer_loop.op == "Loop" and [v.name for v in outer_loop.implicit_inputs] == ["x"]


def test_loop_leaves_the_rest_to_clusters():
    b = autoclust.Builder("pre_loop_post")
    x = b.parameter("x", np.float32, [64])
    pre = b.Tanh(b.Exp(x * 0.5 - 1.0) + 2.0)  # 5 elementwise ops
    (y,) = b.fori_loop(3, lambda s, i, v: [s.Sqrt(v * v + 1.0)], [pre])
    post = b.Sigmoid(b.Abs(y) * 3.0 - 1.0) / 2.0
    run = b.compile(outputs=post)
    xs = RNG.standard_normal(64).astype(np.float32)
    v = np.tanh(np.exp(xs * 0.5 - 1) + 2)
    for _ in range(3):
        v = np.sqrt(v * v + 1)
    np.testing.assert_allclose(run(xs), 1 / (1 + np.exp(-(np.abs(v) * 3 - 1))) / 2, rtol=1e-6)
    text = run.explain()  # the constant-trip elementwise loop is unrolled: one kernel
    assert text.splitlines()[0] == "Built 1 cluster covering 20/20 nodes (100.0%)"
    assert "(Loop): unrolled: 3 iterations of an elementwise body of 3 nodes" in text
    assert [c["kernels"] for c in run.session.stats()["clusters"]] == [[1]]


# ---- op methods ---------------------------------------------------------------------------------

def test_every_table_op_is_a_method():
    at_opset = [d for d in ops.all_ops() if d.domain == "" and onnx.defs.has(d.op, OPSET)]
    assert len(at_opset) > 120
    for d in at_opset:
        method = getattr(autoclust.Builder, d.op)
        assert callable(method) and d.op in method.__doc__
    sig = inspect.signature(autoclust.Builder.Softmax)
    assert sig.parameters["axis"].default == -1
    assert list(inspect.signature(autoclust.Builder.Concat).parameters)[:2] == ["self",
                                                                               "inputs"]


def test_op_methods_with_onnx_names():
    b = autoclust.Builder("ops")
    x = b.parameter("x", np.float32, [4, 6])
    sm = b.Softmax(x, axis=0)
    values, indices = b.TopK(x, [2], axis=1)
    p1, p2, p3 = b.Split(x, axis=1, num_outputs=3)
    s = b.constant(np.linspace(0.5, 1.5, 6).astype(np.float32))
    y, mean, inv_std = b.LayerNormalization(x, s, n_outputs=3)
    rs = b.ReduceSum(x, axes=[1], keepdims=0)
    half = b.Cast(x, to=np.float16)
    clipped = b.Clip(x, None, 0.5)
    gemm = b.Gemm(x, x, transB=1, alpha=2)
    cat = b.Concat(p1, p3, p2, axis=1)
    where = b.Where(x > 0.0, x, 0.0)
    assert (values.shape, indices.dtype, p2.shape, rs.shape, half.dtype, gemm.shape,
            cat.shape, mean.shape) == ((4, 2), np.int64, (4, 2), (4,), np.float16, (4, 4),
                                       (4, 6), (4, 1))
    run = b.compile(outputs=[sm, values, indices, y, inv_std, rs, half, clipped, gemm, cat,
                             where])
    xs = RNG.standard_normal((4, 6)).astype(np.float32)
    got = run(xs)
    e = np.exp(xs - xs.max(axis=0))
    order = np.argsort(-xs, axis=1, kind="stable")[:, :2]
    mu, var = xs.mean(axis=1, keepdims=True), xs.var(axis=1, keepdims=True)
    want = [e / e.sum(axis=0), np.take_along_axis(xs, order, 1), order,
            (xs - mu) / np.sqrt(var + 1e-5) * np.linspace(0.5, 1.5, 6), 1 / np.sqrt(var + 1e-5),
            xs.sum(axis=1), xs.astype(np.float16), np.minimum(xs, 0.5), 2 * xs @ xs.T,
            np.concatenate([xs[:, :2], xs[:, 4:], xs[:, 2:4]], axis=1), np.maximum(xs, 0)]
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.asarray(w).dtype or k == 3, k
        np.testing.assert_allclose(g.astype(np.float64), np.asarray(w, np.float64),
                                   rtol=2e-3 if g.dtype == np.float16 else 1e-5, atol=1e-6,
                                   err_msg=f"output {k}")


# ---- errors -------------------------------------------------------------------------------------

def _builder():
    b = autoclust.Builder("bad")
    return b, b.parameter("x", np.float32, [3, 4])


def _wrong_carried(b, x):
    return b.while_loop(lambda s, v: s.ReduceSum(v, keepdims=0) < 1.0,
                        lambda s, v: s.Concat(v, v, axis=0), x)


def _other_builder(b, x):
    other = autoclust.Builder("other")
    return b.Add(x, other.parameter("y", np.float32, [3, 4]))


ERRORS = [
    (lambda b, x: b.MatMul(x, x), ShapeInferenceError,
     r"builder 'bad': MatMul\(%x: float32\[3,4\], %x: float32\[3,4\]\)"),
    (lambda b, x: b.Softmax(x, axes=1), BuildError, (r"Softmax has no attribute or input "
     r"'axes'; attributes: axis; inputs: input")),
    (lambda b, x: b.Add(x), BuildError, r"Add: missing required input 1 \('B'\)"),
    (lambda b, x: b.Add(x, b.Cast(x, to=np.int32)), ShapeInferenceError,
     r"Add\(%x: float32\[3,4\], %cast_\d+: int32\[3,4\]\).*must match"),
    (lambda b, x: b.Cast(x, to="complex64"), ShapeInferenceError, r"Cast.*complex64"),
    (lambda b, x: b.Cast(x, to="no such type"), BuildError, r"Cast: attribute to="),
    (_wrong_carried, BuildError, (r"while_loop: carried value 0 enters as float32\[3,4\] but "
     r"the body returns another type: float32\[3,4\] vs float32\[6,4\] \(dtype and shape")),
    (lambda b, x: b.while_loop(lambda s, v: s.ReduceSum(v), lambda s, v: v, x), BuildError,
     r"while_loop cond_fn must be a bool scalar, got float32\[1,1\]"),
    (lambda b, x: b.if_(x, lambda s: x, lambda s: x), BuildError,
     r"if_ condition must be a bool scalar, got float32\[3,4\]"),
    (lambda b, x: b.if_(b.constant(True), lambda s: x, lambda s: s.Cast(x, to=np.int64)),
     BuildError, r"if_: output 0 differs between the branches: float32\[3,4\] vs int64"),
    (_other_builder, BuildError, r"belongs to another builder \('other'\)"),
    (lambda b, x: bool(x > 0.0), BuildError, r"has no truth value while building"),
    (lambda b, x: b.op("Loop", x), UnsupportedOpError, r"Loop is not in autoclust's op table"),
    (lambda b, x: b.parameter("x", np.float32, [1]), BuildError, r"must be a new"),
    (lambda b, x: b.parameter("z", np.complex64, [1]), BuildError, r"complex64 has no ONNX"),
    (lambda b, x: b.fori_loop(-1, lambda s, i, v: v, x), BuildError, r"trip count"),
    (lambda b, x: b.to_onnx(), BuildError, r"call build\(outputs=...\) first"),
]


@pytest.mark.parametrize("make,error,match", ERRORS)
def test_build_errors_name_op_and_operands(make, error, match):
    b, x = _builder()
    with pytest.raises(error, match=match):
        make(b, x)


def test_rebuild_replaces_outputs():
    b = autoclust.Builder("twice")
    x = b.parameter("x", np.float32, [2])
    b.build({"y": x + 1.0})
    g = b.build({"y": x * 2.0, "x_again": x})
    assert [v.name for v in g.outputs] == ["y", "x_again"]
    assert [n.op for n in g.nodes] == ["Add", "Mul", "Identity", "Identity"]
    y, same = b.compile()(np.array([1, 2], np.float32))
    np.testing.assert_array_equal(y, [2, 4])
    np.testing.assert_array_equal(same, [1, 2])
