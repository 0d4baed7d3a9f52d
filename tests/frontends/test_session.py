"""autoclust.InferenceSession as a drop-in for onnxruntime: outputs, metadata, errors."""

import os
import pickle
import threading
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.models import zoo
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import (
    Fail,
    InvalidArgument,
    InvalidProtobuf,
    NoSuchFile,
)
from support import stolen

import autoclust
from autoclust.errors import FlagError, InvalidInputError, ModelLoadError, RunTerminatedError

ZOO = ["mlp_gelu", "bert_encoder", "llama_block", "resnet_block", "diffusion_block",
       "elementwise_chain", "gelu", "layernorm", "softmax_mask", "rmsnorm_gate",
       "mixed_dynamic"]


def ort_outputs(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def tiny_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    node = helper.make_node("Relu", ["x"], ["y"])
    model = helper.make_model(helper.make_graph([node], "tiny", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("name", ZOO)
def test_zoo_pass_through_identical_to_onnxruntime(name):
    model = zoo.build(name)
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, auto_jit=0)
    got = sess.run(None, feeds)
    want = ort_outputs(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_metadata_matches_onnxruntime():
    model = zoo.build("bert_encoder")
    sess = autoclust.InferenceSession(model, auto_jit=0)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for mine, theirs in ((sess.get_inputs(), ref.get_inputs()),
                         (sess.get_outputs(), ref.get_outputs())):
        assert [(a.name, a.shape, a.type) for a in mine] == \
            [(b.name, b.shape, b.type) for b in theirs]
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_modelmeta().graph_name == ref.get_modelmeta().graph_name


def test_run_with_output_subset_and_path(tmp_path):
    model = zoo.build("mixed_dynamic")
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(str(path), auto_jit=0)
    names = [o.name for o in sess.get_outputs()]
    last = sess.run([names[-1]], feeds)
    assert len(last) == 1
    np.testing.assert_array_equal(last[0], ort_outputs(model, feeds)[-1])


# (output names, feeds, our message fragment, what onnxruntime raises for the same mistake)
BAD_FEEDS = [
    (None, {"x": np.zeros((2, 3), np.float32), "z": np.zeros(1)}, "unknown input 'z'",
     InvalidArgument),
    (None, {}, "missing input(s): x", ValueError),
    (None, {"x": np.zeros((2, 3), np.float64)}, "input 'x': expected dtype float32",
     InvalidArgument),
    (None, {"x": np.zeros((2, 3, 1), np.float32)}, "expected rank 2", InvalidArgument),
    (None, {"x": np.zeros((2, 4), np.float32)}, "dim 1 must be 3", InvalidArgument),
    # onnxruntime makes lists into the input's type, then checks the dims
    (None, {"x": np.zeros((2, 4), np.float32).tolist()}, "dim 1 must be 3", InvalidArgument),
    (["nope"], {"x": np.zeros((2, 3), np.float32)}, "unknown output 'nope'", InvalidArgument),
]


@pytest.mark.parametrize("names, feeds, fragment, ort_type", BAD_FEEDS)
@pytest.mark.parametrize("auto_jit", [0, 2])
def test_bad_feeds_raise_ours_and_onnxruntimes_type(names, feeds, fragment, ort_type, auto_jit):
    ref = ort.InferenceSession(tiny_model().SerializeToString(),
                               providers=["CPUExecutionProvider"])
    with pytest.raises(ort_type):  # the table says what onnxruntime really raises
        ref.run(names, feeds)
    sess = autoclust.InferenceSession(tiny_model(), auto_jit=auto_jit, min_cluster_size=1)
    assert (sess.plan is not None and bool(sess.plan.clusters)) == (auto_jit == 2)
    with pytest.raises(InvalidInputError) as info:
        sess.run(names, feeds)
    assert isinstance(info.value, ort_type)
    assert fragment in str(info.value)


def test_errors_keep_their_name_and_pickle():
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    with pytest.raises(InvalidArgument) as info:
        sess.run(None, {"x": np.zeros((2, 3), np.int32)})
    exc = info.value
    assert type(exc).__module__ == "autoclust.errors" and type(exc).__name__ == \
        "InvalidInputError"
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is type(exc) and str(again) == str(exc)


def test_list_feeds_take_the_inputs_type_as_in_onnxruntime():
    feeds = {"x": [[1, -2, 3]]}
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    (got,) = sess.run(None, feeds)
    (want,) = ort_outputs(tiny_model(), feeds)
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_feed_must_be_a_dict():
    sess = autoclust.InferenceSession(tiny_model(), auto_jit=0)
    with pytest.raises(InvalidInputError, match="input_feed must be a dict"):
        sess.run(None, [np.zeros((2, 3), np.float32)])


def test_non_contiguous_and_readonly_feeds():
    sess = autoclust.InferenceSession(tiny_model(), auto_jit=0)
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)[:, ::2]
    x.flags.writeable = False
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))


@pytest.mark.parametrize("source, fragment, ort_type", [
    (b"this is not an onnx model", "cannot parse", InvalidProtobuf),
    ("/no/such/model.onnx", "/no/such/model.onnx", NoSuchFile),
    (12345, "cannot load a model from a int", TypeError),
])
def test_bad_model_files(source, fragment, ort_type):
    with pytest.raises(ort_type):
        ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    with pytest.raises(ModelLoadError) as info:
        autoclust.InferenceSession(source)
    assert fragment in str(info.value)
    assert isinstance(info.value, ort_type)


def test_truncated_model_bytes():
    data = zoo.build("mlp_gelu").SerializeToString()
    with pytest.raises(ModelLoadError):
        autoclust.InferenceSession(data[: len(data) // 2])


def test_bad_flag_keyword():
    with pytest.raises(FlagError, match="unknown flag --auto_jitt"):
        autoclust.InferenceSession(tiny_model(), auto_jitt=1)


def test_env_flags_are_read(monkeypatch):
    monkeypatch.setenv("AUTOCLUST_FLAGS", "--auto_jit=0")
    sess = autoclust.InferenceSession(tiny_model())
    assert sess.flags.auto_jit == 0
    monkeypatch.setenv("AUTOCLUST_FLAGS", "--auto_jit=7")
    with pytest.raises(FlagError, match="not one of: 0, 1, 2"):
        autoclust.InferenceSession(tiny_model())


def test_delegates_other_onnxruntime_methods():
    sess = autoclust.InferenceSession(tiny_model(), auto_jit=0)
    binding = sess.io_binding()
    assert binding is not None


def _overhead_us(sess, ref, feeds, n=2000):
    def median(fn):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times.append((time.perf_counter() - t0) / n * 1e6)
        return float(np.median(times))
    ours = median(lambda: sess.run(None, feeds))
    theirs = median(lambda: ref.run(None, feeds))
    return ours - theirs


@pytest.mark.speed
def test_pass_through_overhead_is_small():
    """auto_jit=0 adds input validation only: < 10 us per run (asserted with slack for
    noisy shared CI machines; the README quotes the measured figure)."""
    model = tiny_model()
    feeds = {"x": np.ones((2, 3), np.float32)}
    sess = autoclust.InferenceSession(model, auto_jit=0)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with stolen.Meter() as meter:
        overhead = min(_overhead_us(sess, ref, feeds) for _ in range(2))
    print(f"pass-through overhead: {overhead:.2f} us per run")
    assert overhead < meter.budget(25.0), meter


@pytest.mark.parametrize("name", ZOO)
def test_zoo_imports_and_round_trips_through_exporter(name):
    from autoclust.importers.onnx import export_model, import_model
    model = zoo.build(name)
    graph = import_model(model)
    graph.verify()
    exported = export_model(graph)
    assert exported.ir_version <= 10
    feeds = zoo.feeds(model)
    # Bit-identical with onnxruntime's optimizer off; with it on, its fusions may differ
    # (e.g. Constant nodes became initializers, which some fusion patterns prefer).
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = [ort.InferenceSession(m.SerializeToString(), so,
                                  providers=["CPUExecutionProvider"]).run(None, feeds)
             for m in (exported, model)]
    for got, want in zip(*plain):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(ort_outputs(exported, feeds), ort_outputs(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- tensors NumPy has no type for: ml_dtypes arrays in and out --------------------------

EXOTIC = [  # ONNX type, values exactly representable in it
    (TensorProto.BFLOAT16, [0.0, -1.5, 3.0, 256.0, -0.25, 7.0]),
    (TensorProto.FLOAT8E4M3FN, [0.0, -1.5, 3.0, 256.0, -0.25, 7.0]),
    (TensorProto.FLOAT8E4M3FNUZ, [0.0, -1.5, 3.0, 128.0, -0.25, 7.0]),
    (TensorProto.FLOAT8E5M2, [0.0, -1.5, 3.0, 256.0, -0.25, 7.0]),
    (TensorProto.FLOAT8E5M2FNUZ, [0.0, -1.5, 3.0, 256.0, -0.25, 7.0]),
    (TensorProto.INT4, [0, -8, 7, 3, -1, 5]),
    (TensorProto.UINT4, [0, 15, 7, 3, 1, 9]),
    (TensorProto.INT2, [0, -2, 1, -1, 1, 0]),
    (TensorProto.UINT2, [0, 3, 1, 2, 3, 0]),
]


def exotic_model(elem: int) -> onnx.ModelProto:
    """x (float) -> Relu -> Cast(T) -> t (T output) and w (T input) -> Cast(float) -> Add."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Cast", ["x"], ["t"], to=elem),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["r", "wf"], ["s"]),
             helper.make_node("Mul", ["s", "s"], ["y"])]
    graph = helper.make_graph(
        nodes, "exotic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                          helper.make_tensor_value_info("w", elem, [2, 3])],
        [helper.make_tensor_value_info("t", elem, [2, 3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    model.ir_version = 11  # int2/uint2 need IR 11; onnxruntime 1.31 reads up to 13
    return model


@pytest.mark.parametrize("elem, data", EXOTIC,
                         ids=[TensorProto.DataType.Name(e) for e, _ in EXOTIC])
@pytest.mark.parametrize("flags", [{"auto_jit": 0}, {"min_cluster_size": 1}])
def test_dtypes_numpy_lacks_round_trip(elem, data, flags):
    from autoclust.backends.ort import values
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    x = np.array(data, np.float32).reshape(2, 3)
    w = x[::-1].astype(dtype)
    model = exotic_model(elem)
    sess = autoclust.InferenceSession(model, **flags)
    t, y = sess.run(None, {"x": x, "w": w})
    assert t.dtype == dtype and t.shape == (2, 3)
    np.testing.assert_array_equal(t.astype(np.float32), x)
    np.testing.assert_array_equal(y, (np.maximum(x, 0) + w.astype(np.float32)) ** 2)
    # onnxruntime itself, fed through OrtValues, computes the same
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want_t, want_y = values.run(ref, None, {"x": x, "w": w})
    np.testing.assert_array_equal(t.view(np.uint8), want_t.view(np.uint8))
    np.testing.assert_array_equal(y, want_y)
    if "min_cluster_size" in flags:  # Relu/Add/Mul compiled, the casts in onnxruntime
        assert sess.plan.clusters
        # bfloat16 compiles (tests/ops/test_bfloat16.py): its casts join the cluster
        assert bool(sess.plan.reasons) == (elem != TensorProto.BFLOAT16)
    assert sess.get_inputs()[1].type == ref.get_inputs()[1].type


# ---- RunOptions, SessionOptions, IOBinding, OrtValues: through the compiled plan ----------

def mixed_session(**flags):
    model = zoo.build("mixed_dynamic")  # 4 clusters around an onnxruntime segment
    sess = autoclust.InferenceSession(model, **flags)
    kinds = [type(r).__name__ for r in sess._runtime.runners]
    assert "SegmentRunner" in kinds and kinds.count("ClusterRunner") >= 2
    return model, sess


def test_run_options_terminate_raises_as_onnxruntime_does():
    model, sess = mixed_session()
    feeds = zoo.feeds(model)
    options = ort.RunOptions()
    options.terminate = True
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Fail, match="Exiting due to terminate flag"):
        ref.run(None, feeds, options)
    with pytest.raises(Fail, match="Exiting due to terminate flag") as info:
        sess.run(None, feeds, options)
    assert isinstance(info.value, RunTerminatedError)
    assert all(r.runs == 0 for r in sess._runtime.compiled_clusters())
    options.terminate = False
    for got, want in zip(sess.run(None, feeds, options), ref.run(None, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_run_options_terminate_is_checked_between_steps(monkeypatch):
    model, sess = mixed_session()
    options = ort.RunOptions()
    first = sess._runtime.runners[0]
    run_first = first.run

    def run_then_terminate(inputs, run_options=None):
        run_options.terminate = True  # as another thread would, while step 0 runs
        return run_first(inputs, run_options)
    monkeypatch.setattr(first, "run", run_then_terminate)
    with pytest.raises(RunTerminatedError, match=f"stopped before {sess._runtime.runners[1].name}"):
        sess.run(None, zoo.feeds(model), options)
    assert first.runs == 1
    assert all(r.runs == 0 for r in sess._runtime.compiled_clusters()[1:])


class _RecordingSession:
    """Wraps an onnxruntime session and records the RunOptions each run gets."""

    def __init__(self, inner):
        self.inner = inner
        self.seen = []

    def run(self, names, feeds, run_options=None):
        self.seen.append(run_options)
        return self.inner.run(names, feeds, run_options)


def test_run_options_reach_onnxruntime_segments():
    model, sess = mixed_session()
    segment = next(r for r in sess._runtime.runners if type(r).__name__ == "SegmentRunner")
    spy = segment.segment.session = _RecordingSession(segment.segment.session)
    options = ort.RunOptions()
    options.logid = "my-run"
    options.log_severity_level = 3
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    sess.run(None, zoo.feeds(model), options)
    sess.run(None, zoo.feeds(model))
    assert spy.seen[0] is options and spy.seen[1] is None
    assert spy.seen[0].logid == "my-run"
    assert spy.seen[0].get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"


def big_elementwise_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [512, 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [512, 1024])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "r"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "big", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _split_kernels(sess):
    x = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, -(np.maximum(x, 0) ** 2 + x), rtol=1e-6)
    (runner,) = sess._runtime.compiled_clusters()
    (exe,) = runner.cache.values()
    return exe.split


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="kernels split over threads only on "
                    "machines with more than one core")
def test_intra_op_num_threads_bounds_compiled_kernels(monkeypatch):
    monkeypatch.delenv("AUTOCLUST_FLAGS", raising=False)
    model = big_elementwise_model()
    assert _split_kernels(autoclust.InferenceSession(model, device="cpu"))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    one = autoclust.InferenceSession(model, so, device="cpu")
    assert one.flags.threads == 1
    assert _split_kernels(one) == set()
    # --threads set by the user wins over the session option
    two = autoclust.InferenceSession(model, so, device="cpu", threads=2)
    assert two.flags.threads == 2 and _split_kernels(two)


def _runs(sess):
    return sum(c["runs"] for c in sess.stats()["clusters"])


def test_io_binding_runs_through_the_compiled_plan():
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    x = np.array([[1, -2, 3], [-4, 5, -6]], np.float32)
    binding = sess.io_binding()
    assert isinstance(binding, ort.IOBinding)
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    sess.run_with_iobinding(binding)
    assert _runs(sess) == 1
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], np.maximum(x, 0))
    x[0, 0] = -7  # as in onnxruntime, the bound array is read at each run
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), np.maximum(x, 0))
    # outputs into a bound OrtValue, inputs by address
    out = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    binding.bind_ortvalue_output("y", out)
    x2 = -x
    binding.bind_input("x", "cpu", 0, np.float32, list(x2.shape), x2.ctypes.data)
    sess.run_with_iobinding(binding)
    assert _runs(sess) == 3
    np.testing.assert_array_equal(out.numpy(), np.maximum(x2, 0))
    assert len(binding.get_outputs_as_ortvaluevector()) == 1


@pytest.mark.parametrize("mistake, fragment", [
    (lambda b: b.bind_cpu_input("nope", np.zeros((2, 3), np.float32)), "Failed to find NodeArg"),
    (lambda b: b.bind_output("y", "cuda"), "CPU memory only"),
])
def test_io_binding_mistakes_raise_like_onnxruntime(mistake, fragment):
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    with pytest.raises(RuntimeError, match=fragment) as info:
        mistake(sess.io_binding())
    assert isinstance(info.value, InvalidInputError)


def test_io_binding_run_errors():
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", np.zeros((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="At least one output"):
        sess.run_with_iobinding(binding)
    binding.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_shape_and_type([5], np.float32))
    with pytest.raises(RuntimeError, match="bound to a buffer of shape"):
        sess.run_with_iobinding(binding)
    other = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    with pytest.raises(ValueError, match="session that created it"):
        other.run_with_iobinding(binding)


def test_run_with_ort_values_and_run_async_use_the_plan():
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1)
    x = np.array([[1, -2, 3]], np.float32)
    (out,) = sess.run_with_ort_values(None, {"x": ort.OrtValue.ortvalue_from_numpy(x)})
    assert isinstance(out, ort.OrtValue)
    np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))
    done = threading.Event()
    got = {}

    def callback(outs, user_data, err):
        got.update(outs=outs, user_data=user_data, err=err)
        done.set()
    sess.run_async(None, {"x": x}, callback, "data")
    assert done.wait(60)
    assert got["err"] == "" and got["user_data"] == "data"
    np.testing.assert_array_equal(got["outs"][0], np.maximum(x, 0))
    assert _runs(sess) == 2


def test_is_an_onnxruntime_session():
    for flags in ({"auto_jit": 0}, {"min_cluster_size": 1}):
        sess = autoclust.InferenceSession(tiny_model(), **flags)
        assert isinstance(sess, ort.InferenceSession)
        assert sess.end_profiling() == ""  # onnxruntime's own method, on a whole-model session


def test_log_says_once_that_autoclust_is_active(capsys):
    sess = autoclust.InferenceSession(tiny_model(), min_cluster_size=1, log=True)
    for _ in range(3):
        sess.run(None, {"x": np.ones((2, 3), np.float32)})
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("autoclust: active")]
    assert len(lines) == 1, err
    assert lines[0].startswith("autoclust: active on 'tiny' (auto_jit=2, device=cpu): Built 1 ")
    assert lines[0].endswith("covering 1/1 nodes (100.0%)")
    autoclust.InferenceSession(tiny_model(), auto_jit=0, log=True)
    assert "auto_jit is 0; onnxruntime runs it all" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, fragment", [
    ("ops_to_cluster", "ELEMENTWISE,Rellu", "unknown op or group 'Rellu' (did you mean 'Relu'?)"),
    ("cluster_exclude_ops", "REDUCE",
     "groups: CONV_EPILOGUE, DATA_DEPENDENT, ELEMENTWISE, FUSIBLE, GEMM, LAYOUT"),
    ("disable_passes", "cse,dce,fold", "unknown pass 'fold'; passes: fold_constants, fold_batchnorm, simplify"),
])
def test_unknown_op_group_and_pass_names_are_flag_errors(flag, value, fragment):
    with pytest.raises(FlagError) as info:
        autoclust.InferenceSession(tiny_model(), **{flag: value})
    assert fragment in str(info.value)
    assert "ops: Abs, " in str(info.value) or flag == "disable_passes"
    ok = {"ops_to_cluster": "Relu,fusible", "cluster_exclude_ops": "MATMUL,Softmax",
          "disable_passes": "cse,simplify"}[flag]
    assert autoclust.InferenceSession(tiny_model(), **{flag: ok}).flags.as_dict()[flag]
