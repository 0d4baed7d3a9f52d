"""Custom calls (autoclust/ops/custom.py): ops registered with autoclust.register_op run as
library calls inside compiled clusters, in autoclust's runtime outside them, and never in
onnxruntime (which cannot load them). onnxruntime cannot run these models, so NumPy
computing the same math is the reference here."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import warnings

import numpy as np
import pytest
from autoclust.backends import ort as ort_backend
from onnx import TensorProto, helper

import autoclust
from autoclust.errors import ModelLoadError, ShapeInferenceError
from autoclust.kernel import ir as kir
from autoclust.ops import custom
from autoclust.report import explain

DOMAIN = "test.custom"
RNG = np.random.default_rng(12)
# The README's kernel: y = x * sigmoid(x) on float32; error code 1 on a bad call.
SWISH_C = r"""
#include <math.h>
#include <stdint.h>

int32_t swish(void **inputs, void **outputs, const int64_t *dims, const int64_t *ranks,
              int32_t n_inputs, int32_t n_outputs) {
    if (n_inputs != 1 || n_outputs != 1) return 1;
    int64_t n = 1;
    for (int64_t k = 0; k < ranks[0]; k++) n *= dims[k];
    const float *x = inputs[0];
    float *y = outputs[0];
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + expf(-x[i]));
    return 0;
}

int32_t fails(void **inputs, void **outputs, const int64_t *dims, const int64_t *ranks,
              int32_t n_inputs, int32_t n_outputs) {
    return 7;
}
"""


@pytest.fixture(autouse=True)
def clean_registry():
    yield
    for domain, op_type in list(custom._REGISTRY):
        custom.unregister_op(domain, op_type)


@pytest.fixture(scope="module")
def swish_lib(tmp_path_factory):
    """The README's C kernel compiled with gcc into a shared library, loaded with ctypes."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc: cannot build the C kernel")
    d = tmp_path_factory.mktemp("swish")
    (d / "swish.c").write_text(SWISH_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(d / "libswish.so"),
                    str(d / "swish.c"), "-lm"], check=True)
    return ctypes.CDLL(str(d / "libswish.so"))


@pytest.fixture
def sessions(monkeypatch):
    """Every onnxruntime session built (the fallback's create_session), as its model."""
    built = []
    real = ort_backend.create_session

    def spy(model, *args, **kw):
        built.append(model)
        return real(model, *args, **kw)

    monkeypatch.setattr(ort_backend, "create_session", spy)
    return built


def same_shape(dtypes, shapes, attrs):
    return [(dtypes[0], shapes[0])]


def swish_np(x):
    return x / (1 + np.exp(-x))


def model(op_type: str = "Swish", n: int = 8, attrs: dict | None = None) -> bytes:
    """x -> Mul(2) -> Add(b) -> custom -> Tanh -> Mul(x) -> y."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"], name="mul"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node(op_type, ["c"], ["d"], name="custom", domain=DOMAIN,
                              **(attrs or {})),
             helper.make_node("Tanh", ["d"], ["e"], name="tanh"),
             helper.make_node("Mul", ["e", "x"], ["y"], name="out")]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("b", TensorProto.FLOAT, [n], np.linspace(-1, 1, n).tolist())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def expected(x: np.ndarray, fn=swish_np) -> np.ndarray:
    c = x * np.float32(2) + np.linspace(-1, 1, x.shape[-1]).astype(np.float32)
    return np.tanh(fn(c)) * x


def feeds(batch: int = 4, n: int = 8) -> dict:
    x = RNG.standard_normal((batch, n)).astype(np.float32) * 3
    if batch:
        x[0, :3] = [0.0, 40.0, -40.0]  # sigmoid's saturated ends
    return {"x": x}


def thunk_kinds(sess) -> list[str]:
    (runner,) = sess._runtime.compiled_clusters()
    exe = next(iter(runner.cache.values()))  # the first signature's
    return [t.op if isinstance(t, kir.LibraryCall) else type(t).__name__
            for t in exe.program.thunks]


# ---- inside compiled clusters -------------------------------------------------------------

def test_c_kernel_runs_inside_a_cluster_between_fused_kernels(swish_lib, sessions):
    autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=swish_lib.swish)
    sess = autoclust.InferenceSession(model())
    for batch in (4, 1, 0):
        f = feeds(batch)
        (y,) = sess.run(None, f)
        np.testing.assert_allclose(y, expected(f["x"]), rtol=1e-6, atol=1e-6)
    assert len(sess.plan.clusters) == 1 and len(sess.plan.steps) == 1
    assert [n.name for n in sess.plan.clusters[0].nodes] == ["mul", "add", "custom", "tanh",
                                                             "out"]
    assert thunk_kinds(sess) == ["Kernel", "Swish", "Kernel"]
    assert sessions == []  # no onnxruntime session, no fallback


def test_numpy_kernel_with_attributes_and_two_outputs(sessions):
    def infer(dtypes, shapes, attrs):
        x = shapes[0]
        return [(dtypes[0], x), (np.int64, None if x is None else x[:-1])]

    def kernel(inputs, attrs):
        x = inputs[0]
        return [x * np.float32(attrs["alpha"]), np.argmax(x, axis=-1)]

    autoclust.register_op(DOMAIN, "ScaleArg", infer=infer, kernel=kernel)
    nodes = [helper.make_node("Exp", ["x"], ["ex"]),
             helper.make_node("ScaleArg", ["ex"], ["s", "i"], domain=DOMAIN, alpha=0.5),
             helper.make_node("Sqrt", ["s"], ["y"]),
             helper.make_node("Add", ["i", "i"], ["j"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [3, 5])],
                          [helper.make_tensor_value_info("y", 1, [3, 5]),
                           helper.make_tensor_value_info("j", 7, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 10
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    sess = autoclust.InferenceSession(m.SerializeToString())
    y, j = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.sqrt(np.exp(x) * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(j, 2 * np.argmax(x, axis=-1))
    assert j.dtype == np.int64
    # Exp | ScaleArg | Sqrt over [3, 5], then Add over [3]: a loop of its own
    assert thunk_kinds(sess) == ["Kernel", "ScaleArg", "Kernel", "Kernel"]
    assert sessions == []


def test_explain_and_dumps_show_the_custom_call(swish_lib, tmp_path):
    autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=swish_lib.swish)
    sess = autoclust.InferenceSession(model(), dump_to=str(tmp_path))
    sess.run(None, feeds())
    text = explain.explain_text(sess.plan)
    assert "cluster_0000: 5 nodes" in text and "Swish" in text
    kernels = (tmp_path / "cluster_0000.kernels.txt").read_text()
    assert "library Swish(c) -> d   # nodes: custom" in kernels
    assert f"{DOMAIN}::Swish" in (tmp_path / "cluster_0000.after_optimizations.txt").read_text()


def random_neighbours(rng: np.random.Generator) -> bytes:
    """2-6 nodes over x [3, 5]: Add/Mul/Relu/Exp and custom ops (registered with a kernel,
    a ref only, an int64 or unknown-shape result, float16 only; or not registered)."""
    nodes, values = [], ["x"]
    for k in range(int(rng.integers(2, 7))):
        op = str(rng.choice(["Add", "Mul", "Relu", "Exp", "K", "R", "I", "N", "H", "Unknown"]))
        args = [str(rng.choice(values)) for _ in range(2 if op in ("Add", "Mul") else 1)]
        domain = {} if op in ("Add", "Mul", "Relu", "Exp") else {"domain": DOMAIN}
        nodes.append(helper.make_node(op, args, [f"v{k}"], **domain))
        values.append(f"v{k}")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [3, 5])],
                          [helper.make_tensor_value_info(values[-1], 1, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


def test_every_node_beside_a_custom_op_is_explained():
    # Issue 24: explain once printed `Add_2 (Add): ` for a node next to a custom op.
    from autoclust.importers.onnx import import_model

    from autoclust import flags as flags_mod
    from autoclust import registry
    from autoclust.clustering.partition import cluster

    def ints(dtypes, shapes, attrs):
        return [(np.int64, shapes[0])]

    def unknown(dtypes, shapes, attrs):
        return [(dtypes[0], None)]

    for op, infer, extra in [("K", same_shape, {}), ("I", ints, {}), ("N", unknown, {}),
                             ("H", same_shape, {"dtypes": [np.float16]})]:
        autoclust.register_op(DOMAIN, op, infer=infer, kernel=lambda xs, a: [xs[0]], **extra)
    autoclust.register_op(DOMAIN, "R", infer=same_shape, ref=lambda xs, a: [xs[0]])
    rng = np.random.default_rng(24)
    for flags in [{}, {"min_cluster_size": 1}, {"auto_jit": 1}, {"max_cluster_size": 2},
                  {"cluster_exclude_ops": "Add"}, {"device": "gpu"}] * 25:
        model = import_model(random_neighbours(rng))
        f = flags_mod.parse(**flags)
        plan = cluster(model, f, registry.get_backend(f.device).why_not)
        empty = {n: r for n, r in plan.reasons.items() if not r.strip()}
        assert not empty, (flags, [(n.op, n.name) for n in model.nodes], empty)
    plan.reasons[plan.graph.nodes[0].name] = ""  # whoever records one: explain says so
    assert "no reason recorded (a clustering bug" in explain.explain_text(plan)


# ---- outside clusters: our runtime, never onnxruntime --------------------------------------

@pytest.mark.parametrize("flags", [{"auto_jit": 0}, {"min_cluster_size": 100},
                                   {"cluster_exclude_ops": "Swish"}])
def test_custom_node_outside_clusters_runs_in_our_runtime(swish_lib, sessions, flags):
    calls = []

    def kernel(inputs, attrs):
        calls.append(inputs[0].shape)
        return [swish_np(inputs[0])]

    autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=kernel)
    sess = autoclust.InferenceSession(model(), **flags)
    f = feeds()
    (y,) = sess.run(None, f)
    np.testing.assert_allclose(y, expected(f["x"]), rtol=1e-6, atol=1e-6)
    assert calls == [(4, 8)]  # the kernel, not an onnxruntime segment, ran the node
    host = [s for s in sess.plan.steps if getattr(s, "host", False)]
    assert [[n.name for n in s.nodes] for s in host] == [["custom"]]
    assert "runs in autoclust's runtime" in sess.plan.reasons["custom"]
    assert sessions and all(n.domain != DOMAIN for m in sessions for n in m.graph.node)


def test_failed_compile_falls_back_to_our_runtime_not_onnxruntime(monkeypatch, sessions):
    from autoclust import compile as compile_mod

    def broken(*args, **kw):
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(compile_mod, "compile_cluster", broken)
    autoclust.register_op(DOMAIN, "Swish", infer=same_shape,
                          kernel=lambda xs, attrs: [swish_np(xs[0])])
    sess = autoclust.InferenceSession(model())
    f = feeds()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (y,) = sess.run(None, f)
    assert any("injected compile failure" in str(w.message) for w in caught)
    np.testing.assert_allclose(y, expected(f["x"]), rtol=1e-6, atol=1e-6)
    (runner,) = sess._runtime.compiled_clusters()
    assert isinstance(runner.fallback, custom.HostRunner)
    assert sessions == []


def test_async_compile_stand_in_is_our_runtime(swish_lib, sessions):
    autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=swish_lib.swish)
    sess = autoclust.InferenceSession(model(), async_compile=True)
    f = feeds()
    (y,) = sess.run(None, f)
    sess._runtime.wait_compiles()
    (y2,) = sess.run(None, f)
    for got in (y, y2):
        np.testing.assert_allclose(got, expected(f["x"]), rtol=1e-6, atol=1e-6)
    assert sessions == []


def test_interpreter_device_uses_the_reference():
    autoclust.register_op(DOMAIN, "Swish", infer=same_shape,
                          kernel=lambda xs, attrs: [swish_np(xs[0])],
                          ref=lambda xs, attrs: [xs[0] * np.float32(0.5)])  # differs on purpose
    f = feeds()
    (y,) = autoclust.InferenceSession(model(), device="interpreter").run(None, f)
    np.testing.assert_allclose(y, expected(f["x"], lambda c: c * 0.5), rtol=1e-6, atol=1e-6)


# ---- errors ----------------------------------------------------------------------------------

def _swish(xs, attrs):
    return [swish_np(xs[0])]


@pytest.mark.parametrize("kwargs,message", [
    ({"domain": "", "op_type": "Swish"}, "custom ops need their own domain"),
    ({"op_type": "MatMul"}, "already names the library op MatMul"),
    ({"infer": "same"}, "infer must be callable"),
    ({"infer": lambda dtypes: dtypes}, "infer must take 3 positional arguments"),
    ({"kernel": lambda x: x}, "kernel must take 2 positional arguments"),
    ({"kernel": None}, "give a kernel, a ref or both"),
    ({"kernel": 0}, "NULL function pointer"),
])
def test_bad_registrations_name_the_op(kwargs, message):
    args = {"domain": DOMAIN, "op_type": "Swish", "infer": same_shape, "kernel": _swish}
    args.update(kwargs)
    domain, op_type = args.pop("domain"), args.pop("op_type")
    with pytest.raises(custom.RegistrationError, match=message) as info:
        autoclust.register_op(domain, op_type, **args)
    assert f"{domain}::{op_type}" in str(info.value)
    assert custom.get(domain, op_type) is None


def test_registering_twice_and_c_signature_mismatch(swish_lib):
    autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=_swish)
    with pytest.raises(custom.RegistrationError, match=f"{DOMAIN}::Swish is already registered"):
        autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=_swish)
    fn = swish_lib["fails"]  # a fresh function object: argtypes stay off the shared one
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
    with pytest.raises(custom.RegistrationError, match="signature must be int32_t fn"):
        autoclust.register_op(DOMAIN, "Other", infer=same_shape, kernel=fn)


def _run(kernel=_swish, infer=same_shape, **flags):
    autoclust.register_op(DOMAIN, "Swish", infer=infer, kernel=kernel)
    return autoclust.InferenceSession(model(), **flags).run(None, feeds())


@pytest.mark.parametrize("flags", [{}, {"auto_jit": 0}])
def test_kernel_that_raises_names_op_and_node(flags):
    def kernel(xs, attrs):
        raise ZeroDivisionError("boom")

    with pytest.raises(custom.KernelError,
                       match=rf"custom op {DOMAIN}::Swish \(node 'custom'\): kernel raised "
                             "ZeroDivisionError: boom"):
        _run(kernel, **flags)


@pytest.mark.parametrize("flags", [{}, {"auto_jit": 0}])
def test_wrong_output_shape_from_the_kernel(flags):
    with pytest.raises(custom.KernelError, match=r"kernel output 0 is float32\[4, 7\], infer "
                                                 r"says float32\[4, 8\]"):
        _run(lambda xs, attrs: [xs[0][:, :7]], **flags)


def test_c_kernel_error_code(swish_lib):
    with pytest.raises(custom.KernelError, match=rf"{DOMAIN}::Swish \(node 'custom'\): C "
                                                 "kernel returned error code 7"):
        _run(swish_lib.fails)


@pytest.mark.parametrize("flags", [{}, {"auto_jit": 0}])
def test_infer_rejecting_inputs_is_a_shape_error(flags):
    def infer(dtypes, shapes, attrs):
        if isinstance(shapes[0][0], int) and shapes[0][0] > 2:
            raise ValueError("at most 2 rows")
        return [(dtypes[0], shapes[0])]

    with pytest.raises(ShapeInferenceError, match=rf"custom op {DOMAIN}::Swish .*infer "
                                                  r"rejected inputs float32\[4, 8\]: "
                                                  "ValueError: at most 2 rows"):
        _run(infer=infer, **flags)


@pytest.mark.parametrize("result,message", [
    ("float32", "infer must return a list of"),
    ([("float32", (4, -1))], "infer output 0 is not a"),
    ([("no-such-type", (4, 8))], "infer output 0 is not a"),
])
def test_bad_infer_results_stop_the_load(result, message):
    with pytest.raises(ModelLoadError, match=rf"ShapeInferenceError: custom op {DOMAIN}::Swish "
                                             rf"\(node 'custom'\): {message}") as info:
        _run(infer=lambda dtypes, shapes, attrs: result, auto_jit=0)
    assert "onnxruntime" not in str(info.value)


# ---- the GPU backend's hook (on the stand-in CuPy: tests/support/fake_cupy.py) ----------------------

@pytest.fixture
def fake_gpu(monkeypatch):
    from support import fake_cupy
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        pytest.skip("no C compiler for the stand-in CuPy's kernels")
    yield from fake_cupy.installed(monkeypatch)


@pytest.mark.parametrize("hook", ["c", "python", "none"])
def test_gpu_kernel_hook(fake_gpu, swish_lib, sessions, hook):
    seen = []

    def py_gpu(inputs, outputs, attrs):
        seen.append(type(inputs[0]).__name__)
        outputs[0][...] = swish_np(inputs[0])

    gpu_kernel = {"c": swish_lib.swish, "python": py_gpu, "none": None}[hook]
    host_calls = []

    def host(xs, attrs):
        host_calls.append(1)
        return [swish_np(xs[0])]

    autoclust.register_op(DOMAIN, "Swish", infer=same_shape, kernel=host, gpu_kernel=gpu_kernel)
    sess = autoclust.InferenceSession(model(), device="gpu")
    f = feeds()
    (y,) = sess.run(None, f)
    np.testing.assert_allclose(y, expected(f["x"]), rtol=1e-5, atol=1e-6)
    assert len(sess.plan.clusters) == 1
    assert host_calls == ([1] if hook == "none" else [])
    assert seen == (["FakeArray"] if hook == "python" else [])
    assert sessions == []


# ---- inside If / Loop bodies ---------------------------------------------------------------

def control_flow_model() -> bytes:
    """y = If(sum(x) > 0, then: Relu(Twice(x)), else: Neg(x)); then z = a 3-trip Loop whose
    body adds Twice(x) to its carried value (the custom op inside both bodies)."""
    f = TensorProto.FLOAT
    then_g = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["t"], domain=DOMAIN),
         helper.make_node("Relu", ["t"], ["o"])],
        "then", [], [helper.make_tensor_value_info("o", f, [None])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["o2"])], "else", [],
                               [helper.make_tensor_value_info("o2", f, [None])])
    body = helper.make_graph(
        [helper.make_node("Twice", ["x"], ["tw"], domain=DOMAIN),
         helper.make_node("Add", ["acc", "tw"], ["acc_out"]),
         helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", f, [None])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", f, [None])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Loop", ["trips", "true", "y"], ["z"], body=body)]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f, [None])],
        [helper.make_tensor_value_info("y", f, [None]), helper.make_tensor_value_info("z", f,
                                                                                      [None])],
        [helper.make_tensor("zero", f, [], [0.0]),
         helper.make_tensor("trips", TensorProto.INT64, [], [3]),
         helper.make_tensor("true", TensorProto.BOOL, [], [True])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                            helper.make_opsetid(DOMAIN, 1)])
    m.ir_version = 10
    return m.SerializeToString()


@pytest.mark.parametrize("flags", [{}, {"min_cluster_size": 1}, {"auto_jit": 0},
                                   {"device": "interpreter"}])
def test_custom_op_inside_if_and_loop_bodies(sessions, flags):
    # onnxruntime cannot load a body holding a custom op: our runtime runs those nodes
    autoclust.register_op(DOMAIN, "Twice", infer=same_shape, kernel=lambda ins, a: ins[0] * 2)
    sess = autoclust.InferenceSession(control_flow_model(), **flags)
    assert {s.nodes[0].op for s in sess.plan.control_flow} == {"If", "Loop"}
    for x in (np.array([1, -2, 3], np.float32), np.array([-1, -2, 3], np.float32),
              np.zeros(0, np.float32)):
        y, z = sess.run(None, {"x": x})
        want = np.maximum(2 * x, 0) if x.sum() > 0 else -x
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(z, want + 3 * (2 * x))
    assert all(n.domain != DOMAIN for m in sessions for n in m.graph.node)
    assert not any("Twice" in str(m) for m in sessions)  # no body with it reached onnxruntime
