"""The per-run fast paths (issue 11): session.run skipping validation for feed signatures it
has validated before, one-step plans, the executable's inline binding and output reuse.

Every test runs a warm session first (so the fast path is armed) and then feeds something
else: the answer must still be onnxruntime's and bad feeds must still raise the same
autoclust.errors exceptions.
"""

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.models import zoo
from onnx import TensorProto, helper
from support import stolen

import autoclust
from autoclust.errors import InvalidInputError


def two_output_model():
    """x[batch, 4] float, s[] float -> y1 = tanh(x * s + 1), y2 = relu(x * s + 1) - s (one
    cluster of 5 nodes)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [])
    y1 = helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["batch", 4])
    y2 = helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", 4])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    nodes = [helper.make_node("Mul", ["x", "s"], ["xs"]),
             helper.make_node("Add", ["xs", "one"], ["a"]),
             helper.make_node("Tanh", ["a"], ["y1"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Sub", ["r", "s"], ["y2"])]
    graph = helper.make_graph(nodes, "two_out", [x, s], [y1, y2], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def feeds(batch=2, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, 4)).astype(np.float32),
            "s": np.array(1.5, np.float32)}


def ort_run(model, feed, names=None):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(names, {k: np.asarray(v, np.float32) for k, v in feed.items()})


@pytest.fixture(scope="module")
def model():
    return two_output_model()


@pytest.fixture
def warm(model):
    """A session that has run once (the fast path knows x[2, 4], s[])."""
    sess = autoclust.InferenceSession(model)
    sess.run(None, feeds())
    assert sess.stats()["clusters"][0]["compiles"] == 1
    return sess


def assert_like_ort(model, got, feed, names=None):
    want = ort_run(model, feed, names)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_fast_path_runs_without_validate(model, warm, monkeypatch):
    """A second run with a known signature skips _validate (it would raise here) and
    still gives onnxruntime's answer, in the requested output order too."""
    def boom(_feed):
        raise AssertionError("_validate called on a known signature")
    monkeypatch.setattr(warm, "_validate", boom)
    feed = feeds(seed=1)
    assert warm._fast.known(feed)
    assert_like_ort(model, warm.run(None, feed), feed)
    assert_like_ort(model, warm.run(["y2", "y1"], feed), feed, ["y2", "y1"])
    assert_like_ort(model, warm.run(["y2"], feed), feed, ["y2"])


def _strided(batch):
    wide = feeds(batch)["x"].repeat(2, axis=1)
    return wide[:, ::2]


# second feed of x (after the warm run), and what it must do
GOOD_X = {
    "new_batch": lambda: feeds(5)["x"],
    "zero_batch": lambda: np.zeros((0, 4), np.float32),
    "non_contiguous": lambda: _strided(2),
    "fortran_order": lambda: np.asfortranarray(feeds(3)["x"]),
    "list": lambda: feeds(2)["x"].tolist(),
    "read_only": lambda: _read_only(feeds(2)["x"]),
    "broadcast_view": lambda: np.broadcast_to(np.arange(4, dtype=np.float32), (3, 4)),
}


def _read_only(x):
    x.setflags(write=False)
    return x


@pytest.mark.parametrize("case", sorted(GOOD_X))
def test_second_run_with_other_feed_matches_ort(model, warm, case):
    x = GOOD_X[case]()
    feed = {"x": x, "s": np.array(-0.5, np.float32)}
    assert_like_ort(model, warm.run(None, feed), feed)
    # and the known signature again after it
    again = feeds(2, seed=3)
    assert_like_ort(model, warm.run(None, again), again)


@pytest.mark.parametrize("s", [np.float32(2.0), 2.0, [2.0], np.array(2.0, np.float32)],
                         ids=["numpy_scalar", "python_float", "list_0d", "array_0d"])
def test_zero_d_feeds(model, warm, s):
    """0-d inputs fed as NumPy scalars, Python floats, arrays (and a 1-element list, which
    onnxruntime also rejects for a rank-0 input)."""
    feed = {"x": feeds(2)["x"], "s": s}
    if isinstance(s, list):
        with pytest.raises(InvalidInputError, match="'s'.*rank 0"):
            warm.run(None, feed)
        return
    if isinstance(s, float):  # not an array: onnxruntime rejects it too
        with pytest.raises((InvalidInputError, RuntimeError, TypeError)):
            warm.run(None, feed)
        return
    assert_like_ort(model, warm.run(None, feed), feed)


ONE = np.array(1.0, np.float32)  # an ndarray: these feeds reach the fast path's checks
BAD = {
    "float64_x": ({"x": np.zeros((2, 4)), "s": ONE}, "'x'.*dtype float32"),
    "int32_x": ({"x": np.zeros((2, 4), np.int32), "s": ONE}, "'x'.*dtype float32"),
    "fixed_dim": ({"x": np.zeros((2, 5), np.float32), "s": ONE}, "'x'.*dim 1 must be 4"),
    "rank": ({"x": np.zeros(4, np.float32), "s": ONE}, "'x'.*rank 2"),
    "zero_d_x": ({"x": np.array(1, np.float32), "s": ONE}, "'x'.*rank 2"),
    "rank_s": ({"x": np.zeros((2, 4), np.float32), "s": np.zeros(1, np.float32)}, "'s'.*rank 0"),
    "float16_s": ({"x": np.zeros((2, 4), np.float32), "s": np.array(1, np.float16)}, "'s'.*dtype"),
    "missing": ({"x": np.zeros((2, 4), np.float32)}, "missing input.*s"),
    "unknown": ({"x": np.zeros((2, 4), np.float32), "s": ONE,
                 "z": ONE}, "unknown input 'z'"),
    "wrong_name": ({"x": np.zeros((2, 4), np.float32), "t": ONE}, "unknown input 't'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_feeds_after_warm_run_still_raise(warm, case):
    """Every check of the slow path still runs for a feed the fast path does not know,
    and the failed feed does not arm the fast path."""
    feed, message = BAD[case]
    for _ in range(2):
        with pytest.raises(InvalidInputError, match=message) as info:
            warm.run(None, feed)
        assert isinstance(info.value, ort.capi.onnxruntime_pybind11_state.InvalidArgument) \
            or case == "missing"
        assert not warm._fast.known(feed)


def test_unknown_output_name_on_fast_path(warm):
    with pytest.raises(InvalidInputError, match="unknown output 'nope'"):
        warm.run(["y1", "nope"], feeds())


def test_bad_dtype_after_known_shape(warm):
    """Same shape as the warm run, other dtype: the shape cache must not let it through."""
    feed = {"x": np.zeros((2, 4), np.float64), "s": np.array(1.5, np.float64)}
    with pytest.raises(InvalidInputError, match="dtype float32"):
        warm.run(None, feed)


def test_outputs_not_overwritten_by_later_runs(model, warm):
    """Outputs (and views of them) kept by the caller survive later runs unchanged; outputs
    the caller dropped are reused without changing what a later result holds."""
    first = warm.run(None, feeds(seed=4))
    kept = [o.copy() for o in first]
    row = warm.run(None, feeds(seed=5))[1][0]  # a view of y2; its base is otherwise dropped
    row_copy = row.copy()
    for seed in range(6, 10):
        feed = feeds(seed=seed)
        out = warm.run(None, feed)
        assert_like_ort(model, out, feed)
    for got, want in zip(first, kept):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(row, row_copy)
    a = warm.run(None, feeds(seed=11))
    b = warm.run(None, feeds(seed=12))
    assert not np.shares_memory(a[0], b[0]) and not np.shares_memory(a[1], b[1])


def test_input_mutated_in_place_between_runs(model, warm):
    """The same input object fed again (its address is cached) with new contents."""
    feed = feeds(seed=13)
    warm.run(None, feed)
    feed["x"][...] = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    feed["s"][...] = 0.25
    assert_like_ort(model, warm.run(None, feed), feed)


def test_same_input_object_reshaped_in_place(model, warm):
    """An input whose shape attribute is changed in place is a new signature."""
    x = feeds(4, seed=14)["x"]
    feed = {"x": x, "s": np.array(1.0, np.float32)}
    warm.run(None, feed)
    x.shape = (2, 8)
    with pytest.raises(InvalidInputError, match="dim 1 must be 4"):
        warm.run(None, feed)
    x.shape = (8, 2)
    with pytest.raises(InvalidInputError, match="dim 1 must be 4"):
        warm.run(None, feed)
    x.shape = (4, 4)
    assert_like_ort(model, warm.run(None, feed), feed)


def test_one_step_plan_calls_its_settled_executable_directly(model):
    """Once a one-cluster plan's executable serves a signature for good, run() calls it
    directly (Runtime.direct): answers stay onnxruntime's for every output order, the
    cluster's run count still grows (the megamorphic guard reads it), and a cluster that
    falls back afterwards is served by onnxruntime, not by the executable it dropped."""
    sess = autoclust.InferenceSession(model, autotune=False)
    runner = sess._runtime.runners[0]
    feed = feeds(seed=30)
    sess.run(None, feed)  # validated, compiled
    assert not sess._direct
    sess.run(None, feed)  # the fast path settles the signature
    assert list(sess._direct) == [((2, 4), ())]
    runs = runner.runs
    for names in (None, ["y2", "y1"], ["y2"]):
        feed = feeds(seed=31)
        assert_like_ort(model, sess.run(names, feed), feed, names)
    assert runner.runs == runs + 3
    with pytest.warns(RuntimeWarning, match="falls back"):
        runner._fall_back("a test")
    calls = []
    run = runner.fallback.run
    runner.fallback.run = lambda inputs, options=None: calls.append(1) or run(inputs, options)
    assert_like_ort(model, sess.run(None, feed), feed)
    assert calls == [1] and runner.runs == runs + 3


def test_direct_calls_wait_for_measured_placement(model):
    """With measured placement on, a signature is called directly only once its Trial has
    decided for the executable; onnxruntime's wins never take that path."""
    sess = autoclust.InferenceSession(model)
    runner = sess._runtime.runners[0]
    feed = feeds(seed=32)
    for _ in range(60):
        assert_like_ort(model, sess.run(None, feed), feed)
        key = runner.signature([feed["x"], feed["s"]])
        if runner.route.get(key) is runner.cache.get(key):
            break
        assert not sess._direct  # a Trial (or onnxruntime) serves it: no direct call
    if runner.route.get(key) is runner.cache.get(key):
        sess.run(None, feed)
        assert len(sess._direct) == 1
    else:
        assert not sess._direct


def test_multi_step_plan_second_shape():
    """mixed_dynamic (clusters around an onnxruntime segment): other batch sizes and the
    committed one again, through the fast path, equal onnxruntime."""
    model = zoo.build("mixed_dynamic")
    sess = autoclust.InferenceSession(model)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    base = zoo.feeds(model)
    rng = np.random.default_rng(0)
    for batch in (2, 3, 2, 1, 2):
        feed = dict(base, x=rng.standard_normal((batch, base["x"].shape[1])).astype(np.float32))
        got, want = sess.run(None, feed), ref.run(None, feed)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_overridable_initializer_takes_slow_path():
    """A feed overriding an initializer (an optional input) is validated every time."""
    model = two_output_model()
    model.graph.input.append(helper.make_tensor_value_info("one", TensorProto.FLOAT, []))
    sess = autoclust.InferenceSession(model)
    feed = dict(feeds(), one=np.array(3.0, np.float32))
    want = ort_run(model, feed)
    for _ in range(2):
        got = sess.run(None, feed)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert not sess._fast.known(feed)
    with pytest.raises(InvalidInputError, match="'one'.*dtype"):
        sess.run(None, dict(feeds(), one=np.array(3.0)))


@pytest.mark.speed
def test_session_overhead_over_executable_is_small():
    """session.run on a known signature costs at most ~3.5 us more than the compiled
    cluster's own Executable.run (validation, plan and output list together), where the
    validating path costs 6-10 us more."""
    import time
    model = zoo.build("mlp_gelu")
    sess = autoclust.InferenceSession(model, autotune=False)  # the executable serves
    feed = zoo.feeds(model)
    sess.run(None, feed)
    exe = next(iter(sess._runtime.runners[0].cache.values()))
    args = list(feed.values())

    def per_run(fn, n=500):
        # this thread's CPU time, not the wall clock: a block during which another process
        # (or the hypervisor) held the core is not counted as our overhead
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        return (time.thread_time() - t0) / n * 1e6

    ours, exes = [], []
    with stolen.Meter() as meter:
        for _ in range(40):  # alternating; the fastest of each resists other jobs' load
            ours.append(per_run(lambda: sess.run(None, feed)))
            exes.append(per_run(lambda: exe.run(args)))
    overhead = min(ours) - min(exes)
    # Some processes on the CI machine run everything ~1.4x slower than others (the same
    # script, one after the other, quiet host: Executable.run 6.0 or 8.6 us, the overhead
    # 1.6 or 2.9 us), so the budget stretches by how much slower than 6.0 us this process
    # runs the executable itself. Measured: 1.35-1.8 us in a fast process; the validating
    # path (what this test guards against) 2.6-3.0 us there. On the Emerald Rapids VM
    # (2026-11-28): 1.6-2.9 us, the code of a day before alike (CI failed it at 2.67 us
    # against 2.66), and the validating path (the fast path's key refused) 6.3-10.0 us:
    # the budget sits between.
    slow = max(1.0, min(exes) / 6.0)
    print(f"session.run over Executable.run: {overhead:.2f} us, the executable "
          f"{min(exes):.2f} us ({meter})")
    assert overhead < meter.budget(3.5) * slow, (overhead, min(exes), str(meter))


def test_pass_through_fast_path_and_set_providers(model):
    """--auto_jit=0 (one onnxruntime session): known feeds skip _validate and go straight
    to onnxruntime's C entry point; bad feeds still raise ours; set_providers re-binds it."""
    sess = autoclust.InferenceSession(model, auto_jit=0)
    assert sess._runtime is None and sess._ort_run is not None
    feed = feeds(seed=20)
    assert_like_ort(model, sess.run(None, feed), feed)
    assert sess._fast.known(feed)
    assert_like_ort(model, sess.run(["y2"], feeds(seed=21)), feeds(seed=21), ["y2"])
    with pytest.raises(InvalidInputError, match="'x'.*dim 1 must be 4"):
        sess.run(None, {"x": np.zeros((2, 3), np.float32), "s": ONE})
    with pytest.raises(InvalidInputError, match="unknown output"):
        sess.run(["nope"], feed)
    old = sess._ort._sess
    sess.set_providers(["CPUExecutionProvider"])
    assert sess._ort._sess is not old and sess._ort_run.__self__ is sess._ort._sess
    assert_like_ort(model, sess.run(None, feed), feed)


def test_stolen_meter_stretches_budgets_by_the_stolen_share(tmp_path, monkeypatch):
    """The speed tests' budgets (support/stolen.py) grow by busy / (busy - stolen) ticks
    of /proc/stat's cpu line, capped, and stay put where there is no such file."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(stolen, "_STAT", str(stat))

    def ticks(user, system, idle, steal):
        stat.write_text(f"cpu  {user} 0 {system} {idle} 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")

    ticks(100, 20, 500, 30)
    with stolen.Meter() as meter:
        ticks(400, 40, 900, 130)  # busy +420 ticks, 100 of them stolen
    assert (meter.busy, meter.stolen) == (420, 100)
    assert meter.slowdown == pytest.approx(420 / 320)
    assert meter.budget(2.0) == pytest.approx(2.0 * 420 / 320)
    ticks(0, 0, 0, 0)
    with stolen.Meter() as meter:
        ticks(10, 0, 0, 990)  # starved: the cap keeps a slower code path failing
    assert meter.slowdown == stolen.MAX_SLOWDOWN
    stat.unlink()
    with stolen.Meter() as meter:
        pass
    assert meter.slowdown == 1.0 and meter.budget(3.0) == 3.0
