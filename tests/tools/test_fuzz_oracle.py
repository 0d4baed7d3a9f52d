"""The fuzz oracle: tolerances per dtype, the jitter spread, the arbiters, raising feeds."""

import dataclasses
import math

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz import onnx_reference
from autoclust.tools.fuzz import truth as fuzz_truth
from autoclust.tools.fuzz import values as fuzz_values

from autoclust.errors import AutoclustError, ShapeInferenceError

F32, F16 = np.float32, np.float16


def _model(text: str, opset: int = 18) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')


# ---- compare ------------------------------------------------------------------------------

ONES = np.ones((2, 3), F32)
COMPARE = [
    # (got, want, spread, expected substring of the verdict; "" means they match)
    (ONES, ONES.copy(), None, ""),
    (ONES.astype(np.float64), ONES, None, "dtype float64, expected float32"),
    (ONES.reshape(3, 2), ONES, None, "shape (3, 2), expected (2, 3)"),
    (ONES + 1e-3, ONES, None, "6 of 6 elements differ"),
    (ONES + 1e-6, ONES, None, ""),                             # within rtol 1e-4
    (np.array([np.nan, 1], F32), np.array([0, 1], F32), None, "NaN differs at 1"),
    (np.array([np.nan, np.inf], F32), np.array([np.nan, np.inf], F32), None, ""),
    (np.array([3e38], F32), np.array([np.inf], F32), None, "differ"),
    (np.array([-np.inf], F32), np.array([np.inf], F32), None, "differ"),
    # Softplus(-20) = 2.06e-9 must not come back as 0 (issue 8, I): no absolute slack.
    (np.array([0.0], F32), np.array([2.0611537e-09], F32), None, "differ"),
    # A denormal result may flush to zero.
    (np.array([0.0], F32), np.array([1e-40], F32), None, ""),
    # float16: 8 ulps of slack, not 9 (one ulp at 1.0 is 2**-10).
    (np.array([1 + 8 * 2**-10], F16), np.array([1.0], F16), None, ""),
    (np.array([1 + 9 * 2**-10], F16), np.array([1.0], F16), None, "differ"),
    # Integers are exact, unless the element is sensitive to rounding (spread > 0).
    (np.array([-99, 7], np.int32), np.array([-100, 7], np.int32), None, "differ"),
    (np.array([-99, 7], np.int32), np.array([-100, 7], np.int32), np.array([1.0, 0]), ""),
    (np.array([-99, 6], np.int32), np.array([-100, 7], np.int32), np.array([1.0, 0]),
     "first at (1,)"),
    # A cancellation-sensitive element (spread 1e-3) tolerates a rounding difference.
    (np.array([1e-3], F32), np.array([0.0], F32), np.array([2e-4]), ""),
]


@pytest.mark.parametrize("got, want, spread, verdict", COMPARE)
def test_compare(got, want, spread, verdict):
    diff = fuzz_check.compare([got], [want], None if spread is None else [spread])
    if verdict:
        assert verdict in diff, diff
    else:
        assert diff == "", diff


def test_compare_names_the_producing_op():
    diff = fuzz_check.compare([ONES], [ONES + 1], None, ["Tanh 'tanh_3'"])
    assert diff.startswith("output 0 (Tanh 'tanh_3'): 6 of 6 elements differ")


# ---- jitter and spread --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F16, F32, np.float64])
def test_jitter_moves_finite_nonzero_floats_by_one_ulp(dtype):
    info = np.finfo(dtype)
    tiny = np.array([1, 3], {2: np.uint16, 4: np.uint32, 8: np.uint64}[info.bits // 8]).view(
        dtype)  # the smallest denormal, and three times it
    x = np.array([1.0, -2.5, 3e3, 0.0, -0.0, np.inf, -np.inf, np.nan, tiny[0], -tiny[0],
                  tiny[1], info.max, -info.max], dtype)
    ys = np.stack([fuzz_values.jitter(np.random.default_rng(seed), x) for seed in range(40)])
    for a, moved in zip(x[:3].tolist() + [x[10]], ys[:, [0, 1, 2, 10]].T):
        one_ulp = {np.nextafter(dtype(a), dtype(np.inf)), np.nextafter(dtype(a), dtype(-np.inf))}
        assert set(moved.tolist()) == one_ulp  # either way, never farther
    assert (ys[:, 3:5] == 0).all() and (np.signbit(ys[:, 4])).all()  # zeros keep their sign
    assert (ys[:, 5] == np.inf).all() and (ys[:, 6] == -np.inf).all()
    assert np.isnan(ys[:, 7]).all()
    # the smallest denormal never jitters onto 0; the largest value never onto inf, but it
    # moves toward 0 in some runs (fuzz 80/597: +-FLT_MAX cancelling in a sum had no spread)
    assert (ys[:, 8:10] == x[8:10]).all()
    for a, moved in zip(x[11:], ys[:, 11:].T):
        assert set(moved.tolist()) == {a, np.nextafter(a, dtype(0))}
    scalar = fuzz_values.jitter(np.random.default_rng(0), np.array(2.0, dtype))
    assert scalar.shape == () and scalar != 2
    ints = np.array([1, 2], np.int64)
    assert fuzz_values.jitter(np.random.default_rng(0), ints) is ints


def test_spread_leaves_integer_pow_exponents_alone():
    # RMSNorm as the dynamo exporter writes it: Pow(x, 2.0) with the 2.0 an initializer.
    # Jittered to 2.0000002, Pow of a negative x is NaN: the spread was inf everywhere
    # downstream and any answer passed (bisect: "no failure" on a LLaMA export).
    model = _model("g (float[8] x) => (float[8] y) <float two = {2.0}, float half = {0.5}> "
                   "{ p = Pow (x, two) y = Add (p, half) }")
    x = np.linspace(-2, 2, 8).astype(F32)
    sess = fuzz_check.ort_session(model)
    want = sess.run(None, {"x": x})
    spread = fuzz_check.spread_of(model, sess, {"x": x}, want)
    assert np.isfinite(spread[0]).all() and spread[0].max() < 1e-5
    assert "8 of 8 elements differ" in fuzz_check.compare([want[0] + 1], want, spread)
    outs, same = fuzz_check.outputs_and_spread(model, {"x": x})
    np.testing.assert_array_equal(outs[0], want[0])
    assert np.isfinite(same[0]).all() and same[0].max() < 1e-5


def test_spread_allows_fma_contraction_but_not_more():
    # y = a*b + c with c = -(a*b): onnxruntime rounds a*b first and returns exactly 0; a
    # fused multiply-add (legal: LLVM's contract) returns a*b's rounding error instead.
    model = _model("g (float[64] a, float[64] b, float[64] c) => (float[64] y, float[64] z) "
                   "<float two = {2}> { p = Mul (a, b) y = Add (p, c) z = Mul (a, two) }")
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(64).astype(F32) for _ in range(2))
    feeds = {"a": a, "b": b, "c": -(a * b)}
    sess = fuzz_check.ort_session(model)
    want = sess.run(None, feeds)
    spread = fuzz_check.spread_of(model, sess, feeds, want)
    fma = (a.astype(np.float64) * b - a * b).astype(F32)
    assert not want[0].any() and fma.all()
    assert "64 of 64 elements differ" in fuzz_check.compare([fma], [want[0]])
    assert fuzz_check.compare([fma], [want[0]], [spread[0]]) == ""
    # z = 2a is well conditioned: its spread is a few ulps, far below a real error.
    assert (spread[1] <= 4 * np.spacing(np.abs(want[1]))).all()
    assert "differ" in fuzz_check.compare([want[1] * F32(1.001)], [want[1]], [spread[1]])


def test_spread_shows_a_sum_where_clipped_infinities_cancel():
    # fuzz 80/597: Clip without bounds makes +-inf +-FLT_MAX; summed, each order of the
    # additions loses another small term to them (onnxruntime -0.247, exactly 0.0845).
    # Clip's missing bounds are constants the jitter moves; the other row stays strict.
    model = _model("g (float[2,4] x) => (float[2,1] y) { c = Clip (x) ax = Constant <value = "
                   "int64[1] {1}> () y = ReduceMean <keepdims = 1> (c, ax) }")
    x = np.array([[np.inf, 0.27725, -np.inf, -1.2656555], [1e-20, -0.563, 2.465, -0.237]], F32)
    ref = fuzz_check.reference(model, {"x": x})
    sequential = np.array([[(0.27725 - 0.27725 - 1.2656555) / 4], [ref.expected[0][1, 0]]], F32)
    assert "1 of 2 elements differ" in fuzz_check.compare([sequential], ref.expected)
    assert fuzz_check.compare([sequential], ref.expected, ref.spread) == ""
    assert "first at (1, 0)" in fuzz_check.compare([sequential * F32(1.001)], ref.expected,
                                                   ref.spread)
    # the same sum fed FLT_MAX directly (the shrunk repro): the jitter moves it, too
    plain = _model("g (float[2,4] x) => (float[2,1] y) { ax = Constant <value = int64[1] {1}> "
                   "() y = ReduceMean <keepdims = 1> (x, ax) }")
    fed = fuzz_check.reference(plain, {"x": np.nan_to_num(x)})
    assert fuzz_check.compare([sequential], fed.expected, fed.spread) == ""


# ---- arbiters -----------------------------------------------------------------------------

def test_float64_arbiter_excuses_a_more_accurate_sigmoid():
    # onnxruntime's Sigmoid(-20) is 0; the exact value is 2.06e-9.
    model = _model("g (float[2] x) => (float[2] y) { y = Sigmoid (x) }")
    feeds = {"x": np.array([-20, 1], F32)}
    (want,) = fuzz_check.run_ort(model, feeds)
    exact = (1 / (1 + np.exp(-feeds["x"].astype(np.float64)))).astype(F32)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert "differ" in fuzz_check.compare([exact], [want])
    assert fuzz_check.compare([exact], [want], arbiter=arbiter) == ""
    wrong = np.array([5e-9, exact[1]], F32)  # farther from the truth than onnxruntime
    assert "differ" in fuzz_check.compare([wrong], [want], arbiter=arbiter)


def test_float64_arbiter_runs_the_reference_where_onnxruntime_has_no_float64_kernel():
    # fuzz 94/223: Celu near 0, where onnxruntime's float32 exp(x) - 1 cancels: its vector
    # loop gives -3.5563097e-4 for the true -3.5557756e-4, its scalar tail (and the compiled
    # kernel) the nearer -3.55533e-4, which was condemned: onnxruntime has no float64 Celu,
    # so there was no float64 opinion
    model = _model("g (float[4] x) => (float[4] y) { y = Celu <alpha = 1.6432105> (x) }")
    feeds = {"x": np.array([-3.5561604e-4, -0.5, -0.5, -0.5], F32)}
    (want,) = fuzz_check.run_ort(model, feeds)
    x64 = feeds["x"].astype(np.float64)
    with pytest.raises(Exception, match="tensor\\(double\\)"):
        fuzz_check.run_ort(fuzz_truth.to_float64(model), {"x": x64})
    arbiter = fuzz_truth.Arbiter(model, feeds)
    np.testing.assert_allclose(arbiter.truth(0), 1.6432105 * np.expm1(x64 / 1.6432105),
                               rtol=1e-7)
    ours = np.concatenate([np.array([-3.55533e-4], F32), want[1:]])
    assert "differ" in fuzz_check.compare([ours], [want])
    assert fuzz_check.compare([ours], [want], arbiter=arbiter) == ""
    wrong = np.concatenate([np.array([-3.5545e-4], F32), want[1:]])  # farther than ort's
    assert "differ" in fuzz_check.compare([wrong], [want], arbiter=arbiter)


STATISTICS = [
    # (model, opset, feeds, the exact answer, a wrong one): onnxruntime's float32 statistics
    # overflow (NaN, zeros); the spec's function computes them in stash_type float32 too,
    # but the float64 model must not, nor clip inf to DBL_MAX (whose square overflows).
    # Wrong: off by 0.01 where onnxruntime's NaN is no measure of closeness; farther from
    # the truth than onnxruntime's zeros.
    (("g (float[1,1,4] x, float[1] s, float[1] b) => (float[1,1,4] y) "
      "{ y = GroupNormalization <num_groups = 1, epsilon = 0.1> (x, s, b) }"), 21,
     {"x": np.array([[[-896, 1e20, 1.2, 0.47]]], F32), "s": np.ones(1, F32),
      "b": np.zeros(1, F32)}, np.array([[[-0.57735, 1.7320508, -0.57735, -0.57735]]], F32),
     np.array([[[-0.56735, 1.7420508, -0.56735, -0.56735]]], F32)),
    (("g (float[1,3] x, float[3] s) => (float[1,3] y) { c = Clip (x) "
      "y = LayerNormalization <axis = 0, epsilon = 0.1> (c, s) }"), 17,
     {"x": np.array([[-3.5e-35, np.inf, 2.5e-29]], F32), "s": np.array([0.3, 0.15, -0.8], F32)},
     np.array([[-0.21213204, 0.21213204, 0.56568545]], F32),
     np.array([[0.21213204, -0.21213204, -0.56568545]], F32)),
]


@pytest.mark.parametrize("text, opset, feeds, exact, wrong", STATISTICS,
                         ids=["GroupNorm-1e20", "LayerNorm-Clip-inf"])
def test_float64_arbiter_keeps_normalization_statistics_in_float64(text, opset, feeds, exact,
                                                                    wrong):
    # fuzz 80/490, 80/552, 80/593, 80/63: autoclust's exact statistics, the deliberate
    # departure of docs/fuzzing.md, agree with the float64 model, not with onnxruntime
    model = _model(text, opset)
    want = fuzz_check.run_ort(model, feeds)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert "differ" in fuzz_check.compare([exact], want)
    assert fuzz_check.compare([exact], want, arbiter=arbiter) == ""
    assert "differ" in fuzz_check.compare([wrong], want, arbiter=arbiter)


def test_reference_arbiter_accepts_per_op_float16_rounding():
    # onnxruntime runs float16 Add+Log in float32 without rounding between them; the spec
    # and the ONNX reference round Add's result: log(1.0) = 0 for x = 2.166e-4.
    model = _model("g (float16[2] x, float16 c) => (float16[2] y) { a = Add (x, c) "
                   "y = Log (a) }")
    feeds = {"x": np.array([2.166e-4, 0.5], F16), "c": np.array(1, F16)}
    (want,) = fuzz_check.run_ort(model, feeds)
    rounded = np.log(feeds["x"] + feeds["c"]).astype(F16)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert "differ" in fuzz_check.compare([rounded], [want])
    assert fuzz_check.compare([rounded], [want], arbiter=arbiter) == ""


def test_reference_arbiter_log_softmax_does_not_underflow_in_float16():
    # fuzz 79/622: onnx.reference took the log of its float16 Softmax, exp(-7508) = 0, so
    # [-0.32, 0.24, 7508] gave -inf where the spec says -7508, and NaN after a MatMul (no
    # opinion). onnxruntime does not round LogSoftmax's result to float16 before the
    # MatMul (-0.563); the spec (and we) do (0).
    model = _model("g (float16[1,3] x, float16[3,1] w) => (float16[1,3] l, float16[1,1] y) "
                   "{ l = LogSoftmax <axis = 1> (x) y = MatMul (l, w) }")
    feeds = {"x": np.array([[-0.3203, 0.2428, 7508]], F16),
             "w": np.array([[1], [-1], [0]], F16)}
    arbiter = fuzz_truth.Arbiter(model, feeds)
    np.testing.assert_array_equal(arbiter.reference(0), np.array([[-7508, -7508, 0]], F16))
    want = fuzz_check.run_ort(model, feeds)
    got = [want[0], np.zeros((1, 1), F16)]
    assert "differ" in fuzz_check.compare(got, want)
    assert fuzz_check.compare(got, want, arbiter=arbiter) == ""


def test_reference_arbiter_float16_softmax_rounds_once():
    # fuzz 97/7157: ReduceLogSum of a float16 Softmax [0.348, 0.652], whose sum is exactly
    # 0.99976: onnxruntime does not round the Softmax (log(1) = 0), the reference rounded
    # the sum to 1.0 (0) and its Softmax's exponentials ([0.3481, 0.6523]: 4.88e-4), ours
    # rounds each op's result once: -2.44e-4, as the spec's per-op rounding has it
    model = _model("g (float16[1,2] x) => (float16 y) { s = Softmax <axis = -1> (x) "
                   "y = ReduceLogSum <keepdims = 0> (s) }", opset=17)
    feeds = {"x": np.array([[-0.2195, 0.4087]], F16)}
    (want,) = fuzz_check.run_ort(model, feeds)
    assert want == 0
    soft = np.exp(feeds["x"].astype(np.float64))
    exact = np.log((soft / soft.sum()).astype(F16).astype(np.float64).sum()).astype(F16)
    assert exact == np.float16(-2.441e-4)
    np.testing.assert_array_equal(fuzz_truth.Arbiter(model, feeds).reference(0), exact)
    assert "differ" in fuzz_check.compare([exact], [want])
    assert fuzz_check.compare([exact], [want], arbiter=fuzz_truth.Arbiter(model, feeds)) == ""
    variants = [{"device": "interpreter", "min_cluster_size": 1}]
    assert fuzz_check.check(model, feeds, variants).kind == "ok"


def _sum_model(op: str, opset: int, t: str) -> onnx.ModelProto:
    head = f"g ({t}[3,40] x) => ({t}[?] y) {{ "
    if op == "Softmax":
        return _model(head + "y = Softmax <axis = 1> (x) }", opset)
    if opset >= 18 or op == "ReduceSum":  # axes an input
        return _model(head + f"a = Constant <value = int64[1] {{1}}> () "
                      f"y = {op} <keepdims = 0> (x, a) }}", opset)
    return _model(head + f"y = {op} <axes = [1], keepdims = 0> (x) }}", opset)


@pytest.mark.parametrize("op", onnx_reference.ROUNDED_INTERMEDIATES)
@pytest.mark.parametrize("opset", [13, 18])
def test_reference_float16_intermediates_are_not_rounded(op, opset):
    from onnx.reference import ReferenceEvaluator
    x = np.random.default_rng(0).uniform(0, 2, (3, 40))
    (got,) = onnx_reference.evaluate(_sum_model(op, opset, "float16"), {"x": x.astype(F16)})
    (wide,) = onnx_reference.evaluate(_sum_model(op, opset, "double"),
                                  {"x": x.astype(F16).astype(np.float64)})
    assert got.dtype == F16
    np.testing.assert_array_equal(got, wide.astype(F16))
    f32 = _sum_model(op, opset, "float")  # float32 stays onnx.reference's own, but LSE's
    want = ReferenceEvaluator(f32).run(None, {"x": x.astype(F32)})[0]
    if op == "ReduceLogSumExp":
        want = onnx_reference.evaluate(_sum_model(op, opset, "double"),
                                   {"x": x.astype(F32).astype(np.float64)})[0].astype(F32)
    np.testing.assert_array_equal(onnx_reference.evaluate(f32, {"x": x.astype(F32)})[0], want)


def test_reference_log_sum_exp_of_infinite_rows_is_the_spec_s():
    # fuzz 102/633: ReduceSum of [-0.] is -0 in onnxruntime (its last-axis sum keeps it)
    # and ours (since 121/2925), +0 in NumPy, so 1 / it is -inf or inf; ReduceLogSumExp of
    # [inf] is inf (log(sum(exp(x)))), where the reference shifted by a finite max there
    # was none of: inf - inf, NaN, no opinion for NumPy's
    model = _model("g (float[1] z) => (float y) { a = Constant <value = int64[1] {0}> () "
                   "s = ReduceSum <keepdims = 1> (z, a) r = Reciprocal (s) "
                   "y = ReduceLogSumExp <axes = [0], keepdims = 0> (r) }", opset=17)
    feeds = {"z": np.array([-0.0], F32)}
    assert fuzz_check.run_ort(model, feeds)[0] == -np.inf
    np.testing.assert_array_equal(fuzz_truth.Arbiter(model, feeds).reference(0), np.inf)
    variants = [{"device": "interpreter", "min_cluster_size": 1},
                {"device": "cpu", "min_cluster_size": 1}]
    assert fuzz_check.run_autoclust(model, feeds, variants[0])[0][0] == -np.inf
    assert fuzz_check.check(model, feeds, variants).kind == "ok"
    lse = _model("g (float[?] x) => (float y) { y = ReduceLogSumExp <keepdims = 0> (x) }")
    for row, want in (([np.inf], np.inf), ([-np.inf, -np.inf], -np.inf),
                      ([np.inf, -np.inf], np.inf), ([np.nan, 1], np.nan), ([-np.inf, 1], 1)):
        np.testing.assert_array_equal(onnx_reference.evaluate(lse, {"x": np.array(row, F32)})[0],
                                      np.array(want, F32))


def test_reference_arbiter_pad_crops_as_onnxruntime_does():
    # fuzz 80/347: onnx.reference's Pad refused negative pads, so a ReduceMin's NaN (the
    # reference's, and ours; onnxruntime skips it) before a cropping Pad had no opinion.
    model = _model("g (float[2,3] x) => (float[?] y) { ax = Constant <value = int64[1] {1}> () "
                   "m = ReduceMin <keepdims = 0> (x, ax) p = Constant <value = int64[2] "
                   "{-1, 0}> () y = Pad (m, p) }")
    feeds = {"x": np.array([[1, 2, 3], [-2.5, 4, np.nan]], F32)}
    want = fuzz_check.run_ort(model, feeds)
    assert "NaN differs" in fuzz_check.compare([np.array([np.nan], F32)], want)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert fuzz_check.compare([np.array([np.nan], F32)], want, arbiter=arbiter) == ""


def test_reference_arbiter_takes_either_top_k_order_of_nan():
    # fuzz 93/915: a ReduceMax's NaN (the reference's, and ours; onnxruntime skips it) fed a
    # TopK; onnx.reference's TopK sorted the NaN first. autoclust's TopK is onnxruntime's
    # kernel on the cpu device ([nan, 4]: its heap keeps the NaN) and the op table's on the
    # interpreter and in constant folding ([4, 3]: NaN last); both order the NaN as the
    # spec leaves them free to, the rest of the row as it says.
    model = _model("g (float[3,3] x) => (float[2] y) { ax = Constant <value = int64[1] {1}> () "
                   "m = ReduceMax <keepdims = 0> (x, ax) k = Constant <value = int64[1] {2}> "
                   "() y, i = TopK <axis = 0> (m, k) }")
    feeds = {"x": np.array([[1, 5, np.nan], [2, 3, 0], [4, -1, 0]], F32)}
    want = fuzz_check.run_ort(model, feeds)
    np.testing.assert_array_equal(want[0], [5, 4])  # onnxruntime: [5, 3, 4] reduced
    arbiter = fuzz_truth.Arbiter(model, feeds)
    for ours in ([np.nan, 4], [4, 3]):  # [nan, 3, 4] reduced
        assert "differ" in fuzz_check.compare([np.array(ours, F32)], want)
        assert fuzz_check.compare([np.array(ours, F32)], want, arbiter=arbiter) == ""
    for wrong in ([4, np.nan], [3, 4], [np.nan, 3], [5, 4.001]):
        verdict = fuzz_check.compare([np.array(wrong, F32)], want, arbiter=arbiter)
        assert "differ" in verdict, wrong


def test_reference_arbiter_takes_onnxruntime_reduce_min_of_nan_left_to_it():
    # fuzz 96/1396: ReduceMin of [0.50, nan] is NaN in the reference and in ours, 0.50 in
    # onnxruntime (NaN not first); an answer of inf (our ReduceSum of [-0.] was NumPy's +0
    # before 121/2925; onnxruntime's last-axis sum keeps -0, as ours now), Max(1 / s,
    # s / (|min| + 0.5)), neither opinion gave alone (-0 and NaN); the arbiter takes it
    model = _model("g (float[1,2] x, float[1] z) => (float[?] y) { a1 = Constant <value = "
                   "int64[1] {1}> () m = ReduceMin <keepdims = 0> (x, a1) a0 = Constant "
                   "<value = int64[1] {0}> () s = ReduceSum <keepdims = 1> (z, a0) "
                   "r = Reciprocal (s) h = Constant <value = float {0.5}> () b = Abs (m) "
                   "c = Add (b, h) d = Div (s, c) y = Max (r, d) }")
    feeds = {"x": np.array([[0.5025611, np.nan]], F32), "z": np.array([-0.0], F32)}
    want = fuzz_check.run_ort(model, feeds)
    np.testing.assert_array_equal(want[0], [-0.0])
    assert np.signbit(want[0][0])
    arbiter = fuzz_truth.Arbiter(model, feeds)
    for ours in ([np.nan], [np.inf]):  # all compiled; ReduceMin left to onnxruntime
        assert "differ" in fuzz_check.compare([np.array(ours, F32)], want)
        assert fuzz_check.compare([np.array(ours, F32)], want, arbiter=arbiter) == ""
    for wrong in ([-np.inf], [1.0]):
        assert "differ" in fuzz_check.compare([np.array(wrong, F32)], want, arbiter=arbiter)
    variants = [{"device": "interpreter", "min_cluster_size": 1},
                {"device": "interpreter", "min_cluster_size": 1,
                 "cluster_exclude_ops": ["ReduceMin"]}]
    (got,), _ = fuzz_check.run_autoclust(model, feeds, variants[1])
    assert got[0] == 0 and np.signbit(got[0])  # onnxruntime's -0 (ReduceMin left to it)
    assert fuzz_check.check(model, feeds, variants).kind == "ok"


def test_reference_arbiter_takes_onnxruntime_float16_sign_of_nan_left_to_it():
    # fuzz 94/1877: onnxruntime's float16 Sign maps NaN to 0, its float32 one (and NumPy,
    # the reference, ours) to NaN; next to a Reciprocal, which has no float16 kernel there,
    # the whole model runs Sign in float32: Pow(a, Sign(1 / nan)) is NaN, and 1 where a
    # fallback segment runs Sign (and Pow) on our compiled Reciprocal's float16 NaN
    model = _model("g (float16[3] x, float16[3] a) => (float16[3] y) { r = Reciprocal (x) "
                   "s = Sign (r) y = Pow (a, s) }", opset=13)
    feeds = {"x": np.array([0.7, -2, np.nan], F16), "a": np.array([0.655, 0.5, 0.875], F16)}
    sign = _model("g (float16[3] r) => (float16[3] s) { s = Sign (r) }", opset=13)
    (alone,) = fuzz_check.run_ort(sign, {"r": feeds["x"]})
    np.testing.assert_array_equal(alone, [1, -1, 0])  # fixed in onnxruntime? see above
    (want,) = fuzz_check.run_ort(model, feeds)
    np.testing.assert_array_equal(want, np.array([0.655, 2, np.nan], F16))
    arbiter = fuzz_truth.Arbiter(model, feeds)
    ours = np.array([0.655, 2, 1], F16)  # Sign and Pow left to onnxruntime
    assert "differ" in fuzz_check.compare([ours], [want])
    assert fuzz_check.compare([ours], [want], arbiter=arbiter) == ""
    assert "differ" in fuzz_check.compare([np.array([0.655, 2, 0.5], F16)], [want],
                                          arbiter=arbiter)
    variants = [{"device": "interpreter", "min_cluster_size": 1},
                {"device": "interpreter", "min_cluster_size": 1,
                 "cluster_exclude_ops": ["Sign", "Pow"]}]
    np.testing.assert_array_equal(fuzz_check.run_autoclust(model, feeds, variants[1])[0][0],
                                  ours)
    assert fuzz_check.check(model, feeds, variants).kind == "ok"


def test_reference_arbiter_takes_onnxruntime_arg_min_of_nan():
    # fuzz 102/502: our ReduceMax keeps the NaN of rows 0 and 3 (onnxruntime skips it),
    # and ArgMin (select_last_index) of [nan, 0.58, -0.06, nan] is 0 by onnxruntime's rule,
    # which ours copy; the reference's NumPy rule gave 3, and onnxruntime's ReduceMax 3 too
    model = _model("g (float[1,4,4] x) => (int64[1,1] y) { a = Constant <value = int64[1] "
                   "{2}> () r = ReduceMax <keepdims = 1> (x, a) y = ArgMin <axis = -2, "
                   "keepdims = 0, select_last_index = 1> (r) }", opset=18)
    feeds = {"x": np.array([[[-1.86, np.nan, -1.5e-16, -1.1e13], [-1.86, -1.37, 0.578, -0.2],
                             [-1.86, -1.37, -0.0557, -0.572],
                             [-1.86, -1.37, -9.5e18, np.nan]]], F32)}
    (want,) = fuzz_check.run_ort(model, feeds)
    assert want.tolist() == [[3]]
    variants = [{"device": "interpreter", "min_cluster_size": 1}]
    assert fuzz_check.run_autoclust(model, feeds, variants[0])[0][0].tolist() == [[0]]
    assert fuzz_check.check(model, feeds, variants).kind == "ok"
    assert "differ" in fuzz_check.compare([np.array([[1]])], [want],
                                          arbiter=fuzz_truth.Arbiter(model, feeds))


def test_reference_arbiter_takes_onnxruntime_cum_sum_of_negative_zero():
    # fuzz 103/68: 1 / ReduceSum([[0], [-0], [-0]], axis 1) times 1 / an exclusive reverse
    # CumSum of [-0, -0, -0]: onnxruntime's last-axis sum keeps -0 (NumPy's: +0, ours too
    # before 121/2925), and its exclusive scan starts at +0, as ours (the reference: -0 for
    # -0 + -0), so neither opinion had our answer then, [inf, inf, inf]
    model = _model("g (float[3,1] a, float[3,1] b) => (float[?,?] y) { z = Constant <value "
                   "= int64 {0}> () c = CumSum <exclusive = 1, reverse = 1> (a, z) "
                   "r = Reciprocal (c) o = Constant <value = int64[1] {1}> () "
                   "s = ReduceSum <keepdims = 1> (b, o) t = Reciprocal (s) y = Mul (t, r) }",
                   opset=17)
    feeds = {"a": np.full((3, 1), -0.0, F32), "b": np.array([[0], [-0.0], [-0.0]], F32)}
    (want,) = fuzz_check.run_ort(model, feeds)
    np.testing.assert_array_equal(want, [[np.inf], [-np.inf], [-np.inf]])
    variants = [{"device": "interpreter", "min_cluster_size": 1}]
    np.testing.assert_array_equal(fuzz_check.run_autoclust(model, feeds, variants[0])[0][0],
                                  want)
    assert fuzz_check.check(model, feeds, variants).kind == "ok"
    assert fuzz_check.compare([np.full((3, 1), np.inf, F32)], [want],
                              arbiter=fuzz_truth.Arbiter(model, feeds)) == ""
    assert "differ" in fuzz_check.compare([np.full((3, 1), -np.inf, F32)], [want],
                                          arbiter=fuzz_truth.Arbiter(model, feeds))


def test_reference_opinion_lends_its_own_spread():
    # fuzz 103/1696: 1 / ReduceSum([[-0.]]) is -inf in onnxruntime (its last-axis sum
    # keeps -0), inf in NumPy and ours; clipped to +-6, Cos(Exp(6)) moves 2e-4 when 6 moves
    # one ulp, and our Exp's 403.4288 (the reference's 403.42877, one ulp off) gives
    # 0.26273 for 0.26276: beyond the reference's tolerance, within its own spread, where
    # onnxruntime's Cos(Exp(-6)) has none to lend
    model = _model("g (float[1,1] x) => (float[?,?] y) <float lo = {-6}, float hi = {6}> "
                   "{ a = Constant <value = int64[1] {1}> () s = ReduceSum <keepdims = 1> "
                   "(x, a) r = Reciprocal (s) c = Clip (r, lo, hi) e = Exp (c) y = Cos (e) }",
                   opset=17)  # the bounds initializers, as the fuzzer's: the jitter moves them
    feeds = {"x": np.array([[-0.0]], F32)}
    (want,) = fuzz_check.run_ort(model, feeds)
    np.testing.assert_allclose(want, [[np.cos(np.exp(-6))]], rtol=1e-6)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    (ref,) = arbiter.references(0)
    ours = np.array([[0.26273286]], F32)
    assert ref[0, 0] == np.float32(0.2627623)
    assert "differ" in fuzz_check.compare([ours], [ref])
    assert fuzz_check.compare([ours], [want], arbiter=arbiter) == ""
    assert "differ" in fuzz_check.compare([np.array([[0.27]], F32)], [want], arbiter=arbiter)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_reference_gelu_is_the_op_rounded_once(approximate):
    # onnx.reference runs Gelu's function body, whose Erf is its float32 one even in a
    # float64 model: the float64 truth of a Gelu (no float64 kernel in onnxruntime) was
    # float32's, 3e-9 off
    model = _model(f'g (double[4] x) => (double[4] y) {{ y = Gelu <approximate = "{approximate}"> '
                   "(x) }", opset=20)
    x = np.array([0.1, -0.7, 1.3, 3.0])
    (got,) = onnx_reference.evaluate(model, {"x": x})
    if approximate == "none":
        want = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]
    else:
        want = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
                for v in x]
    np.testing.assert_allclose(got, want, rtol=1e-15)


@pytest.mark.parametrize("name", ["float", "float16"])
def test_reference_mean_of_empty_rows_is_onnxruntimes_zero(name):
    # the spec leaves a mean over an empty set undefined; NumPy's is NaN, onnxruntime's and
    # ours 0. Behind onnxruntime's own MatMul error the reference's outputs are expected
    # (fuzz 115/1735): its NaN condemned our 0
    model = _model(f"g ({name}[2,0] x) => ({name}[2,1] y) "
                   "{ a = Constant <value = int64[1] {1}> () y = ReduceMean (x, a) }")
    x = np.zeros((2, 0), F32 if name == "float" else F16)
    (got,) = onnx_reference.evaluate(model, {"x": x})
    (want,) = fuzz_check.run_ort(model, {"x": x})
    np.testing.assert_array_equal(want, np.zeros((2, 1)))
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)


def test_arbiter_reads_the_weights_once(monkeypatch):
    # a failing output asks for every opinion: the reference, its four jittered runs, the
    # float64 truth and its four; each copied the weights into a new proto (BERT-base's
    # bisect: 11 s of a 21 s trial). They are lifted to inputs and fed, read once.
    model = _model("g (float[2,4] x) => (float[2,3] y) <float[4,3] w = {1,2,3,4,5,6,7,8,9,"
                   "10,11,12}> { m = MatMul (x, w) y = Erf (m) }")
    feeds = {"x": np.array([[0.1, -0.2, 0.05, 0.01], [0.3, 0.0, -0.1, 0.02]], F32)}
    (want,) = fuzz_check.run_ort(model, feeds)
    reads, jittered = [], []
    to_array, jitter = onnx.numpy_helper.to_array, fuzz_values.jitter
    monkeypatch.setattr(onnx.numpy_helper, "to_array",
                        lambda t, *a, **k: reads.append(t.name) or to_array(t, *a, **k))
    monkeypatch.setattr(fuzz_values, "jitter",
                        lambda rng, x: jittered.append(x.shape) or jitter(rng, x))
    arbiter = fuzz_truth.Arbiter(model, feeds)
    verdict = fuzz_check.compare([want + 0.01], [want], arbiter=arbiter)
    assert "6 of 6 elements differ" in verdict
    assert reads.count("w") == 1
    # the reference's spread and the float64 truth's draw the same jitter: drawn once
    assert jittered.count((4, 3)) == fuzz_truth.JITTER_RUNS
    (ref,) = arbiter.references(0)  # the weights as they are, fed
    np.testing.assert_allclose(ref, want, rtol=1e-6)


@pytest.mark.parametrize("dtype, name", [(np.float64, "double"), (F32, "float"),
                                         (F16, "float16")])
def test_reference_erf_rounds_once(dtype, name):
    # onnx.reference maps math.erf into float32: a float64 model's Erf (onnxruntime has no
    # float64 kernel) was 1e-9 from math.erf, and with it the float64 truth of every GELU
    model = _model(f"g ({name}[5] x) => ({name}[5] y) "
                   "{ y = Erf (x) }")
    x = np.array([0.1, 0.5, -1.3, 3.0, np.nan], dtype)
    (got,) = onnx_reference.evaluate(model, {"x": x})
    want = np.array([math.erf(v) for v in x.astype(np.float64)]).astype(dtype)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("order", ["last", "onnxruntime", "no NaN"])
def test_reference_top_k_fix_orders_nan_rows(largest, order):
    # onnxruntime leaves a NaN where its heap or sort does (smallest 4 of row 0: [-1, 2,
    # nan, 2]); without NaN the reference's own TopK (ties by lower index) stands
    from onnx.reference import ReferenceEvaluator
    model = _model(f"g (float[2,5] x) => (float[2,4] y, int64[2,4] i) {{ k = Constant <value = "
                   f"int64[1] {{4}}> () y, i = TopK <axis = -1, largest = {largest}> (x, k) }}")
    x = np.array([[np.nan, 2, -1, 2, 7], [3, -np.inf, np.nan, 0, np.inf]], F32)
    feeds = {"x": np.nan_to_num(x, nan=5) if order == "no NaN" else x}
    fixes = onnx_reference.spec_fixes("last" if order == "no NaN" else order)
    got = ReferenceEvaluator(model, new_ops=fixes).run(None, feeds)
    if order == "onnxruntime":
        want = fuzz_check.run_ort(model, feeds)
    elif order == "last":
        want = [np.array([[-1, 2, 2, 7], [-np.inf, 0, 3, np.inf]], F32),
                np.array([[2, 1, 3, 4], [1, 3, 0, 4]])]
        if largest:
            want = [np.array([[7, 2, 2, -1], [np.inf, 3, 0, -np.inf]], F32),
                    np.array([[4, 1, 3, 2], [4, 0, 3, 1]])]
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_reference_arbiter_settles_a_shape_onnxruntime_gets_wrong():
    # fuzz 81/558: onnxruntime's ReduceMax over an empty last axis keeps its length, 0;
    # the spec (and ONNX's shape inference) keep 1, holding the empty max -inf (times -0.5)
    model = _model("g (float[1,4,0] x, float c) => (float[?,?,?] y) { ax = Constant <value = "
                   "int64[1] {-1}> () r = ReduceMax <keepdims = 1> (x, ax) y = Mul (r, c) }",
                   opset=21)
    feeds = {"x": np.zeros((1, 4, 0), F32), "c": np.array(-0.5, F32)}
    want = fuzz_check.run_ort(model, feeds)
    spec = np.full((1, 4, 1), np.inf, F32)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert "shape (1, 4, 1), expected (1, 4, 0)" in fuzz_check.compare([spec], want)
    assert fuzz_check.compare([spec], want, arbiter=arbiter) == ""
    assert "shape" in fuzz_check.compare([np.zeros((1, 4, 1), F32)], want, arbiter=arbiter)


NORMALIZED_BEHIND = [
    # (model, feeds, autoclust's answer from exact statistics, a wrong one): onnxruntime's
    # float32 squares of 1e20 overflow (zeros); the consumer has no float64 kernel in
    # onnxruntime (HardSigmoid: the float64 model runs in the reference, which accepts what
    # is nearer its answer than onnxruntime's) or is a comparison (the reference alone).
    (("g (float[1,3] x, float[3] s) => (float[1,3] y) { n = LayerNormalization <axis = -1, "
      "epsilon = 0.1> (x, s) y = HardSigmoid <alpha = 0.14632666> (n) }"),
     {"x": np.array([[1e20, -5.7e-25, 0.6556429]], F32),
      "s": np.array([0.15520617, 0.1292062, -1.1166873], F32)},
     np.array([[0.5321179, 0.4866312, 0.61554205]], F32),
     np.array([[0.5721179, 0.4866312, 0.61554205]], F32)),  # farther than onnxruntime's 0.5
    (("g (float[1,4] x, float[4] s) => (bool[1,4] y) { n = LayerNormalization <axis = -1, "
      "epsilon = 0.1> (x, s) z = Constant <value = float {0}> () y = Greater (n, z) }"),
     {"x": np.array([[1e20, 6.9e12, 6.9e12, 6.9e12]], F32),
      "s": np.array([1, -0.5, 0.25, -1], F32)},
     np.array([[True, True, False, True]]), np.array([[True, True, True, True]])),
]


@pytest.mark.parametrize("text, feeds, exact, wrong", NORMALIZED_BEHIND,
                         ids=["HardSigmoid", "Greater"])
def test_reference_arbiter_layer_norm_statistics_are_exact(text, feeds, exact, wrong):
    # fuzz 83/1, 83/41, 83/64, 83/322: the LayerNorm departure of docs/fuzzing.md behind an
    # op onnxruntime has no float64 kernel for (the float64 model runs in the reference,
    # fuzz 94/223) or the float64 arbiter must not judge (a comparison)
    model = _model(text, opset=17)
    want = fuzz_check.run_ort(model, feeds)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert (arbiter.truth(0) is None) == (want[0].dtype == bool)
    assert "differ" in fuzz_check.compare([exact], want)
    assert fuzz_check.compare([exact], want, arbiter=arbiter) == ""
    assert "differ" in fuzz_check.compare([wrong], want, arbiter=arbiter)


def test_reference_layer_norm_fix_honours_stash_type_and_matches_the_plain_case():
    text = ("g (float[2,3] x, float[3] s, float[3] b) => (float[2,3] y) "
            "{{ y = LayerNormalization <axis = -1{stash}> (x, s, b) }}")
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(shape).astype(F32)
             for k, shape in (("x", (2, 3)), ("s", 3), ("b", 3))}
    want = fuzz_check.run_ort(_model(text.format(stash="")), feeds)[0]
    for stash in ("", ", stash_type = 11"):
        arbiter = fuzz_truth.Arbiter(_model(text.format(stash=stash)), feeds)
        np.testing.assert_allclose(arbiter.reference(0), want, rtol=1e-5, atol=1e-6)


def test_reference_arbiter_group_norm_statistics_are_exact():
    # fuzz 79/216 (and 80/63 through HardSwish): the GroupNorm departure of docs/fuzzing.md
    # behind a comparison, which only the reference can arbitrate; onnxruntime's float32
    # squares of 1e20 overflow (NaN)
    model = _model("g (float[1,4,1] x, float[2] s, float[2] b) => (bool[1,4,1] y) { "
                   "n = GroupNormalization <num_groups = 2, epsilon = 0.1> (x, s, b) "
                   "z = Constant <value = float {0}> () y = Less (n, z) }", opset=18)
    feeds = {"x": np.array([[[1e20], [-2], [3], [4]]], F32), "s": np.array([1, -1], F32),
             "b": np.array([0.25, 0.5], F32)}
    # [1, -1] * 1 + 0.25 and [-0.85, 0.85] * -1 + 0.5 (onnxruntime: NaN, NaN, 1.35, -0.35)
    exact = np.array([[[False], [True], [False], [True]]])
    want = fuzz_check.run_ort(model, feeds)
    arbiter = fuzz_truth.Arbiter(model, feeds)
    assert arbiter.truth(0) is None  # a comparison: the reference decides
    assert "differ" in fuzz_check.compare([exact], want)
    assert fuzz_check.compare([exact], want, arbiter=arbiter) == ""
    assert "differ" in fuzz_check.compare([~exact], want, arbiter=arbiter)


def test_float64_arbiter_lends_its_spread_where_onnxruntime_has_none():
    # fuzz 89/290: the LayerNorm departure where 1e20 and -1e20 cancel in the mean. The
    # exact mean is -1.6e10, a float32 sum in order gives 9.6e8 (-8.7e10 and 4.8e9 vanish
    # beside 1e20, whose ulp is 8.8e12), so the small elements (about 1e-10) have no one
    # float32 answer; onnxruntime's overflowing squares give zeros, which do not move when
    # the inputs do, so only the float64 result's own spread (5.6e-8 there) can tell.
    model = _model("g (float[1,5] x, float[5] s) => (float[1,5] y) "
                   "{ y = LayerNormalization <axis = -1, epsilon = 0.01> (x, s) }", opset=17)
    x = np.array([[1e20, -8.7e10, -0.67, -1e20, 4.8e9]], F32)
    feeds = {"x": x, "s": np.ones(5, F32)}
    want = fuzz_check.run_ort(model, feeds)
    assert not want[0].any()
    summed = F32(0)
    for v in x[0]:
        summed = F32(summed + v)
    std = np.sqrt(np.mean((x.astype(np.float64) + 1.644e10) ** 2))
    got = ((x - summed / F32(5)) / F32(std)).astype(F32)  # [1.58, -1.4e-9, -1.5e-11, ...]
    arbiter = fuzz_truth.Arbiter(model, feeds)
    truth = arbiter.truth(0)
    assert truth[0, 2] > 0 > got[0, 2]  # farther from the truth than onnxruntime's 0
    assert fuzz_check.compare([got], want, arbiter=arbiter) == ""
    wrong = got.copy()
    wrong[0, 2] = 1e-6  # beyond 8 times what one ulp of the inputs moves it
    assert "first at (0, 2)" in fuzz_check.compare([wrong], want, arbiter=arbiter)
    spread = arbiter.truth_spread(0, truth, fuzz_check._distance)
    assert 1e-8 < spread[0, 2] < 1e-7


@pytest.mark.parametrize("opset, params, dtype", [(18, 3, F32), (18, 3, np.float16),
                                                  (21, 6, F32), (21, 6, np.float16)])
def test_reference_group_norm_fix_matches_onnxruntime_on_plain_inputs(opset, params, dtype):
    # opset 18: scale and bias per group; 21: per channel
    dt = "float" if dtype == F32 else "float16"
    model = _model(f"g ({dt}[2,6,2,3] x, {dt}[{params}] s, {dt}[{params}] b) => "
                   f"({dt}[2,6,2,3] y) {{ y = GroupNormalization <num_groups = 3> (x, s, b) }}",
                   opset)
    rng = np.random.default_rng(opset)
    feeds = {k: (rng.standard_normal(shape) * 3 + 1).astype(dtype)
             for k, shape in (("x", (2, 6, 2, 3)), ("s", params), ("b", params))}
    want = fuzz_check.run_ort(model, feeds)[0]
    got = fuzz_truth.Arbiter(model, feeds).reference(0)
    assert got.dtype == want.dtype
    tol = 1e-5 if dtype == F32 else 4e-3
    np.testing.assert_allclose(got.astype(F32), want.astype(F32), rtol=tol, atol=tol)


PADS = [("constant", [2, -2]), ("constant", [-2, 2]), ("constant", [2, -4]),
        ("edge", [2, -2]), ("edge", [1, -3]), ("wrap", [-2, 2]), ("wrap", [1, -3]),
        ("reflect", [1, -1]), ("reflect", [-1, 1])]


@pytest.mark.parametrize("mode, pads", PADS, ids=[f"{m}{p}" for m, p in PADS])
def test_reference_pad_fix_crops_then_pads_like_onnxruntime(mode, pads):
    from onnx.reference import ReferenceEvaluator
    model = _model(f"g (float[4] x) => (float[?] y) {{ p = Constant <value = int64[2] "
                   f'{{{pads[0]}, {pads[1]}}}> () y = Pad <mode = "{mode}"> (x, p) }}')
    feeds = {"x": np.array([1, 2, 3, 4], F32)}
    (got,) = ReferenceEvaluator(model, new_ops=onnx_reference.spec_fixes()).run(None, feeds)
    np.testing.assert_array_equal(got, fuzz_check.run_ort(model, feeds)[0])


def test_no_float64_arbiter_behind_rounding_sensitive_ops():
    model = _model("g (float[2] x) => (float[2] y, float[2] z) { y = Sigmoid (x) "
                   "z = Floor (y) }")
    assert fuzz_truth.continuous_outputs(model) == [True, False]
    half = _model("g (float16[2] x) => (float16[2] y) { y = Sigmoid (x) }")
    assert fuzz_truth.continuous_outputs(half) == [False]
    wide = fuzz_truth.to_float64(model)
    assert {v.type.tensor_type.elem_type for v in wide.graph.input} == {onnx.TensorProto.DOUBLE}


# ---- check(): raising feeds, invalid graphs, signatures ------------------------------------

DIV = _model("g (int32[3] a, int32[3] b) => (int32[3] y) { y = Div (a, b) }")
DIV_BY_ZERO = {"a": np.array([7, -7, 5], np.int32), "b": np.array([2, 2, 0], np.int32)}
AUTOCLUST = [{"device": "interpreter", "min_cluster_size": 1}]


def _sides(monkeypatch, autoclust, interpreter=None):
    def run_autoclust(model, feeds, flags):
        if isinstance(autoclust, Exception):
            raise autoclust
        return autoclust, []

    def run_interpreter(model, feeds):
        raise interpreter or ZeroDivisionError("integer division by zero")

    monkeypatch.setattr(fuzz_check, "run_autoclust", run_autoclust)
    monkeypatch.setattr(fuzz_check, "run_interpreter", run_interpreter)


RAISING = [
    # what autoclust does when onnxruntime raises -> (kind, cause)
    (AutoclustError("node 'n0' (Div): integer division by zero"), ("ok", "")),
    ([np.array([3, -3, 5], np.int32)], ("mismatch", "returned values where onnxruntime raised")),
    (ZeroDivisionError("integer division by zero"),
     ("error", "raised where onnxruntime raised: ZeroDivisionError")),
    (ShapeInferenceError("something went wrong"), ("error", "raised where onnxruntime raised")),
]


@pytest.mark.parametrize("autoclust, verdict", RAISING)
def test_raising_feeds_need_a_clear_autoclust_error(monkeypatch, autoclust, verdict):
    _sides(monkeypatch, autoclust)
    outcome = fuzz_check.check(DIV, DIV_BY_ZERO, AUTOCLUST)
    assert outcome.kind == verdict[0], outcome
    assert outcome.cause.startswith(verdict[1]), outcome
    if outcome.kind == "mismatch":  # onnxruntime's message names the op that raised
        assert outcome.op == "Div" and "Div returned values" in outcome.signature()


def test_an_error_on_valid_feeds_is_an_error(monkeypatch):
    _sides(monkeypatch, AutoclustError("node 'n0' (Div): integer division by zero"))
    feeds = {"a": DIV_BY_ZERO["a"], "b": np.array([2, 2, 1], np.int32)}
    outcome = fuzz_check.check(DIV, feeds, AUTOCLUST)
    assert outcome.kind == "error" and outcome.cause == "AutoclustError at test_fuzz_oracle.py:" \
        "run_autoclust", outcome


# onnxruntime 1.31 fails here on its own (fuzz 80/163, 80/591): its planner hands the
# float16 Softmax's [2, 0] buffer to the Cast it inserts for the Mul ("Shape mismatch
# attempting to re-use buffer. {2,0} != {2,1}"); without buffer reuse it answers.
PLANNER = _model("g (float16[2,0] a, bool[2,0] k, float16 c, float16[2,1] b, float16 d) => "
                 "(float16[?,?] s, int64[?] i) { w = Where (k, a, c) s = Softmax <axis = -1> (w) "
                 "m = Mul (b, d) i = ArgMax <axis = 0, keepdims = 0> (m) }", opset=21)
PLANNER_FEEDS = {"a": np.zeros((2, 0), F16), "k": np.zeros((2, 0), bool),
                 "c": np.array(-1, F16), "b": np.array([[1], [2]], F16), "d": np.array(0.5, F16)}
PLANNER_WANT = [np.zeros((2, 0), F16), np.array([1])]
ORT_FAIL = ort.capi.onnxruntime_pybind11_state.Fail


def test_onnxruntime_failing_on_its_own_is_no_expected_error():
    with pytest.raises(Exception, match="re-use buffer"):  # fixed in onnxruntime? see above
        onnx_reference.ort_session(PLANNER).run(None, PLANNER_FEEDS)
    ref = fuzz_check.reference(PLANNER, PLANNER_FEEDS)
    assert ref.raised == ("", "") and ref.ort_bug == "op_kernel.cc:87"
    assert fuzz_check.compare(ref.expected, PLANNER_WANT) == ""
    # the whole check: compiled (the answer), all in onnxruntime (its failure again, excused)
    variants = [{"device": "interpreter", "min_cluster_size": 1},
                {"device": "interpreter", "clustering_fuel": 0}]
    assert fuzz_check.check(PLANNER, PLANNER_FEEDS, variants).kind == "ok"


MATMUL_EMPTY = _model("g (float[3,5,0,1] a, float[1] b) => (float[?,?,?] y) "
                      "{ y = MatMul (a, b) }")
MATMUL_EMPTY_FEEDS = {"a": np.zeros((3, 5, 0, 1), F32), "b": np.ones(1, F32)}


def test_onnxruntime_matmul_error_on_valid_shapes_is_its_own():
    # fuzz 82/407 (and 81/158, 81/185): onnxruntime raises "left operand cannot broadcast"
    # for [3, 5, 0, 1] @ [1]; NumPy's and the spec's answer is [3, 5, 0]
    with pytest.raises(ORT_FAIL, match="cannot broadcast"):  # fixed in onnxruntime? see above
        onnx_reference.ort_session(MATMUL_EMPTY).run(None, MATMUL_EMPTY_FEEDS)
    ref = fuzz_check.reference(MATMUL_EMPTY, MATMUL_EMPTY_FEEDS)
    assert ref.raised == ("", "") and ref.ort_bug == "matmul_helper.h:142"
    assert ref.expected[0].shape == (3, 5, 0) and ref.expected[0].dtype == F32
    variants = [{"device": "interpreter", "min_cluster_size": 1},
                {"device": "interpreter", "clustering_fuel": 0}]  # onnxruntime's error again
    assert fuzz_check.check(MATMUL_EMPTY, MATMUL_EMPTY_FEEDS, variants).kind == "ok"
    assert "shape" in fuzz_check.compare([np.zeros((3, 5, 1), F32)], ref.expected)


def test_onnxruntime_matmul_error_behind_an_empty_flatten_is_its_own():
    """fuzz 138/1816: Flatten of an empty [0, 3], then MatMul by a 1-D [3]: onnxruntime's
    MatMul raises "cannot broadcast", and onnx.reference's Flatten could not reshape the
    empty tensor, so there was no second opinion and our [0] was reported. With
    spec_fixes' Flatten the reference answers [0], and ours passes."""
    model = _model("g (float[0,3] a, float[3] b) => (float[?] y) "
                   "{ f = Flatten <axis = -1> (a) y = MatMul (f, b) }")
    feeds = {"a": np.zeros((0, 3), F32), "b": np.ones(3, F32)}
    ref = fuzz_check.reference(model, feeds)
    assert ref.raised == ("", "") and ref.ort_bug == "matmul_helper.h:142"
    assert ref.expected[0].shape == (0,)
    variants = [{"device": "cpu", "min_cluster_size": 1}]
    assert fuzz_check.check(model, feeds, variants).kind == "ok"


def test_onnxruntime_own_error_leaves_its_other_outputs_to_onnxruntime():
    # fuzz 97/3101, 97/2198: beside a MatMul onnxruntime refuses, the reference's exclusive
    # CumSum keeps -0 for -0 + -0 (onnxruntime, and ours, start at +0: inf, not -inf), and
    # its Flatten of [5, 5, 0] at axis 3 failed (no opinion: the MatMul error was expected;
    # spec_fixes' Flatten gives the spec's [0, 1] since fuzz 138/1816)
    model = _model("g (float[3,5,0,1] a, float[1] b, float[2,3] c, float[5,5,0] f) => "
                   "(float[?,?,?] y, float[2,3] r, float[?,?] z) { y = MatMul (a, b) "
                   "ax = Constant <value = int64 {1}> () s = CumSum <exclusive = 1, reverse = 1> "
                   "(c, ax) r = Reciprocal (s) z = Flatten <axis = 3> (f) }", opset=17)
    feeds = {**MATMUL_EMPTY_FEEDS, "c": np.array([[-0.0, -0.0, -0.0], [1, 2, 3]], F32),
             "f": np.zeros((5, 5, 0), F32)}
    assert onnx_reference.evaluate(model, feeds)[2].shape == (0, 1)  # its Flatten, fixed
    ref = fuzz_check.reference(model, feeds)
    assert ref.raised == ("", "") and ref.ort_bug == "matmul_helper.h:142"
    assert ref.expected[0].shape == (3, 5, 0) and ref.expected[2].shape == (0, 1)
    np.testing.assert_array_equal(ref.expected[1][0], [np.inf] * 3)
    from onnx.reference import ReferenceEvaluator
    (alone,) = ReferenceEvaluator(fuzz_truth.only_output(model, 1)).run(None, {"c": feeds["c"]})
    assert alone[0, 0] == -np.inf  # onnx.reference's own -0 (the arbiter's: onnxruntime's)
    variants = [{"device": "interpreter", "min_cluster_size": 1}]
    assert fuzz_check.check(model, feeds, variants).kind == "ok"


def test_a_feeds_error_behind_onnxruntimes_own_error_is_expected():
    # fuzz 121/1036: onnxruntime's MatMul error came first; the other output's
    # LayerNormalization over an empty row is an error of the feeds (onnxruntime's and ours),
    # so the model raises it, and an autoclust error naming that node passes
    model = _model("g (float[3,5,0,1] a, float[1] b, float[4,0,1] x, float[4,0,1] s) => "
                   "(float[?,?,?] z, float[?,?,?] y) { z = LayerNormalization <axis = 0> (x, s, s) "
                   "y = MatMul (a, b) }", opset=17)
    feeds = {**MATMUL_EMPTY_FEEDS, "x": np.zeros((4, 0, 1), F32), "s": np.ones((4, 0, 1), F32)}
    ref = fuzz_check.reference(model, feeds)
    assert ref.raised[0] == "LayerNormalization" and ref.expected is None
    variants = [{"device": "interpreter", "min_cluster_size": 1}]
    assert fuzz_check.check(model, feeds, variants).kind == "ok"


SQUEEZE_EMPTY_MAX = ("g (float[{dims}] x) => (float[?,?] y) {{ ax = Constant <value = int64[1] "
                     "{{-1}}> () r = ReduceMax <keepdims = 1> (x, ax) a = Constant <value = "
                     "int64[1] {{{axis}}}> () y = Squeeze (r, a) }}")


def test_onnxruntime_squeeze_error_after_its_empty_reduce_max_is_its_own():
    # fuzz 92/2192: onnxruntime's ReduceMax over an empty axis keeps its 0 (the spec: 1, the
    # empty max -inf), so squeezing that axis raises "must be 1 instead of 0"; the reference
    # runs the model, and its [3, 4] of -inf is expected
    model = _model(SQUEEZE_EMPTY_MAX.format(dims="3,4,0", axis=2), opset=21)
    feeds = {"x": np.zeros((3, 4, 0), F32)}
    with pytest.raises(ORT_FAIL, match="must be 1 instead of 0"):
        onnx_reference.ort_session(model).run(None, feeds)
    ref = fuzz_check.reference(model, feeds)
    assert ref.raised == ("", "") and ref.ort_bug == "squeeze.h:53"
    assert fuzz_check.compare(ref.expected, [np.full((3, 4), -np.inf, F32)]) == ""
    variants = [{"device": "interpreter", "min_cluster_size": 1},
                {"device": "interpreter", "clustering_fuel": 0}]  # onnxruntime's error again
    assert fuzz_check.check(model, feeds, variants).kind == "ok"
    # a Squeeze of an axis 4 long (dims open: no load-time error) raises in the reference too
    bad = _model(SQUEEZE_EMPTY_MAX.format(dims="?,?,?", axis=1), opset=21)
    ref = fuzz_check.reference(bad, feeds)
    assert ref.raised[0] == "Squeeze" and ref.expected is None


TOP_K_EMPTY_MAX = _model("g (float[?,?,?] x, int64[1] k) => (float[?,?,?] y) { a = Constant "
                         "<value = int64[1] {-1}> () r = ReduceMax <keepdims = 1> (x, a) "
                         "y, i = TopK <axis = 2> (r, k) }")


def test_onnxruntime_top_k_error_after_its_empty_reduce_max_is_its_own():
    # fuzz 98/1805: onnxruntime's ReduceMax over an empty last axis keeps its 0, so a TopK
    # of k = 1 there raises ("should not be greater than specified axis dim value [0]");
    # the spec's [4, 3, 1] of -inf has one element there: the reference's answer
    feeds = {"x": np.zeros((4, 3, 0), F32), "k": np.array([1])}
    with pytest.raises(Exception, match="should not be greater"):
        onnx_reference.ort_session(TOP_K_EMPTY_MAX).run(None, feeds)
    ref = fuzz_check.reference(TOP_K_EMPTY_MAX, feeds)
    assert ref.raised == ("", "") and "should not be greater" in ref.ort_bug
    assert fuzz_check.compare(ref.expected, [np.full((4, 3, 1), -np.inf, F32)]) == ""
    variants = [{"device": "interpreter", "min_cluster_size": 1}]
    assert fuzz_check.check(TOP_K_EMPTY_MAX, feeds, variants).kind == "ok"
    # a k longer than the axis the spec gives is an error: the reference refuses it too
    ref = fuzz_check.reference(TOP_K_EMPTY_MAX, {**feeds, "k": np.array([2])})
    assert ref.raised[0] == "TopK" and ref.expected is None


def test_onnxruntime_matmul_error_on_invalid_shapes_is_expected():
    model = _model("g (float[?,?] a, float[?,?] b) => (float[?,?] y) { y = MatMul (a, b) }")
    feeds = {"a": np.ones((2, 3), F32), "b": np.ones((4, 5), F32)}
    ref = fuzz_check.reference(model, feeds)
    assert ref.raised[0] == "MatMul" and ref.expected is None


def test_gather_elements_longer_than_empty_data_after_onnxruntime_matmul_error_is_expected():
    # fuzz 96/2584: onnxruntime refuses [0, 0, 2] @ [2] (its own error), and the reference's
    # GatherElements answered an empty [2, 0] for [2, 0] indices into the [0, 0] product,
    # where onnxruntime's GatherElements (and ours) refuse indices longer than the data
    # off the axis: the error is expected, not the reference's empty answer
    model = _model("g (float[0,0,2] a, float[2] b, int64[2,0] i) => (float[?,?] y) "
                   "{ m = MatMul (a, b) y = GatherElements <axis = 1> (m, i) }", opset=13)
    feeds = {"a": np.zeros((0, 0, 2), F32), "b": np.ones(2, F32),
             "i": np.zeros((2, 0), np.int64)}
    gather = _model("g (float[?,?] m, int64[?,?] i) => (float[?,?] y) "
                    "{ y = GatherElements <axis = 1> (m, i) }", opset=13)
    with pytest.raises(Exception, match="within bounds"):  # fixed in onnxruntime? see above
        onnx_reference.ort_session(gather).run(None, {"m": np.zeros((0, 0), F32), "i": feeds["i"]})
    assert onnx_reference.evaluate(model, feeds) is None
    ref = fuzz_check.reference(model, feeds)
    assert ref.raised[0] == "MatMul" and ref.expected is None
    assert fuzz_check.check(model, feeds, [{"device": "interpreter",
                                             "min_cluster_size": 1}]).kind == "ok"
    # indices shorter than the data off the axis stay the reference's to answer
    (short,) = onnx_reference.evaluate(gather, {"m": np.ones((3, 2), F32),
                                            "i": np.zeros((2, 1), np.int64)})
    np.testing.assert_array_equal(short, np.ones((2, 1), F32))


PLANNER_SIDES = [
    # what autoclust does where onnxruntime failed on its own -> kind
    (PLANNER_WANT, "ok"),
    ([PLANNER_WANT[0], np.array([0])], "mismatch"),
    (ORT_FAIL("op_kernel.cc:87 OutputMLValue Shape mismatch attempting to re-use buffer"), "ok"),
    (ORT_FAIL("node 'n3' (Mul): another failure"), "error"),
    (AutoclustError("node 'n3' (Mul): op_kernel.cc:87"), "error"),  # not onnxruntime's
]


@pytest.mark.parametrize("autoclust, kind", PLANNER_SIDES, ids=[
    "answer", "wrong-answer", "same-ort-failure", "other-ort-failure", "not-onnxruntime"])
def test_only_onnxruntime_own_failure_is_excused(monkeypatch, autoclust, kind):
    _sides(monkeypatch, autoclust)
    monkeypatch.setattr(fuzz_check, "run_interpreter", lambda model, feeds: PLANNER_WANT)
    outcome = fuzz_check.check(PLANNER, PLANNER_FEEDS, AUTOCLUST)
    assert outcome.kind == kind, outcome


def test_unloadable_graph_is_invalid_not_agreement():
    bad = _model("g (float[2] x) => (float[2] y) { y = NoSuchOp (x) }")
    assert fuzz_check.check(bad, {"x": np.ones(2, F32)}, AUTOCLUST).kind == "invalid"


def test_real_mismatch_signature_and_shrink_identity():
    tanh = _model("g (float[3] x) => (float[3] y) { y = Tanh (x) }")
    outcome = fuzz_check._mismatch("autoclust device=cpu", "output 0 (Tanh 'y'): 1 of 3 "
                                   "elements differ; NaN differs at 1", {}, ["Tanh 'y'"])
    assert outcome.signature() == "mismatch in autoclust: Tanh NaN"
    other_op = fuzz_check.Outcome("mismatch", "autoclust device=cpu", "", {}, "NaN", "Relu")
    assert outcome.same_failure(other_op)  # the shrinker may remove the op, not the cause
    assert not outcome.same_failure(dataclasses.replace(other_op, cause="values"))
    assert fuzz_check.check(tanh, {"x": np.ones(3, F32)}, []).kind == "ok"


def test_compile_fallbacks_of_one_cause_share_a_signature():
    # Node, value and cluster names differ from graph to graph; the cause does not.
    a, b = (fuzz_check._generic(f"compile failed: CompileError: fusion of cluster_000{i}: "
                                f"cannot place cumsum_{i}3: CumSum (n{i}4): a scan needs a "
                                "kernel of its own") for i in (1, 2))
    assert a == b == ("compile failed: CompileError: fusion of _: cannot place _: CumSum (_): "
                      "a scan needs a kernel of its own")


def test_reference_conv_reads_only_its_taps():
    """fuzz 140/352: onnx.reference's Conv multiplies positions a dilated kernel skips by
    zero, so an inf there made NaN (inf * 0) of a window onnxruntime computes as 4; behind
    a LayerNormalization whose float32 variance overflows in onnxruntime, that NaN was the
    float64 opinion and our right answer was reported. spec_fixes' Conv reads the taps."""
    model = _model("g (float[1,1,3,4] x, float[1,1,2,3] w) => (float[?,?,?,?] y) { y = Conv "
                   "<dilations = [1, 2], kernel_shape = [2, 3], pads = [1, 0, 1, 1], "
                   "strides = [2, 1]> (x, w) }", opset=17)
    x = np.ones((1, 1, 3, 4), F32)
    x[0, 0, 1, 1] = np.inf  # between the taps of the second window's middle row
    feeds = {"x": x, "w": np.ones((1, 1, 2, 3), F32)}
    np.testing.assert_array_equal(onnx_reference.evaluate(model, feeds)[0].ravel(), [2, 4])


def test_reference_quantizes_before_opset_19():
    """fuzz 149/2441: onnxruntime's Gemm of an empty inner dim returns C unscaled (the spec,
    and ours: beta * C); behind QuantizeLinear/DequantizeLinear at opset 13 onnx.reference
    raised (it has those ops from opset 19 only), so no second opinion excused our answer.
    spec_fixes gives the older forms the opset-19 kernels."""
    model = _model("g (float[3,0] a, float[0,4] b, float[1,1] c) => (float[?,?] y) { "
                   "g = Gemm <alpha = 2.0, beta = 0.5> (a, b, c) "
                   "s = Constant <value = float {0.3}> () z = Constant <value = uint8 {2}> () "
                   "q = QuantizeLinear (g, s, z) y = DequantizeLinear (q, s, z) }", opset=13)
    feeds = {"a": np.zeros((3, 0), F32), "b": np.zeros((0, 4), F32),
             "c": np.array([[-0.5266046]], F32)}
    (ref,) = onnx_reference.evaluate(model, feeds)
    np.testing.assert_allclose(ref, np.full((3, 4), -0.3, F32), rtol=1e-6)
    (want,) = fuzz_check.ort_session(model).run(None, feeds)
    assert np.allclose(want, -0.6)  # onnxruntime's: C unscaled, -0.53 / 0.3 rounds to -2
    variants = [{"device": "cpu", "min_cluster_size": 1}]
    assert fuzz_check.check(model, feeds, variants).kind == "ok"
