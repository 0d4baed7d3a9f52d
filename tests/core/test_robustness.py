"""Robustness: malformed models, mutated zoo models, bad feeds, faults, threads, soak."""

import json
import os
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from autoclust.models import zoo
from autoclust.tools.bench import soak
from autoclust.tools.fuzz import command as fuzz
from onnx import TensorProto, helper

import autoclust
from autoclust.errors import AutoclustError, InvalidInputError, ModelLoadError
from autoclust.runtime import interpreter

DEVICE = fuzz.default_device()


def make_model(nodes, inputs=None, outputs=None, inits=()):
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])]
    outputs = outputs or [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def small_model():
    """x[n, 4] -> Relu -> Exp -> Add -> Tanh: one cluster at min_cluster_size 1."""
    return make_model([helper.make_node("Relu", ["x"], ["a"]),
                       helper.make_node("Exp", ["a"], ["b"]),
                       helper.make_node("Add", ["a", "b"], ["c"]),
                       helper.make_node("Tanh", ["c"], ["y"])])


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def session(model, **flags):
    return autoclust.InferenceSession(model, device=flags.pop("device", DEVICE),
                                      min_cluster_size=1, **flags)


# ---- malformed models -----------------------------------------------------------------------

def _malformed():
    good = small_model().SerializeToString()
    huge_init = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10**6, 10**6])
    return {
        "truncated": good[: len(good) // 2],
        "garbage": bytes(range(256)) * 4,
        "empty": b"",
        "wrong_message": helper.make_tensor("t", TensorProto.FLOAT, [2], [1.0, 2.0])
        .SerializeToString(),
        "graph_not_model": small_model().graph.SerializeToString(),
        "missing_initializer": make_model([helper.make_node("Add", ["x", "w"], ["y"])]),
        "dangling_output": make_model([helper.make_node("Relu", ["x"], ["a"])]),
        "cycle": make_model([helper.make_node("Add", ["x", "c"], ["a"]),
                             helper.make_node("Relu", ["a"], ["c"]),
                             helper.make_node("Relu", ["a"], ["y"])]),
        "duplicate_outputs": make_model([helper.make_node("Relu", ["x"], ["y"]),
                                         helper.make_node("Exp", ["x"], ["y"])]),
        "wrong_attribute_type": make_model([helper.make_node("Transpose", ["x"], ["y"],
                                                             perm=1.5)]),
        "string_for_int_attribute": make_model([helper.make_node("Softmax", ["x"], ["y"],
                                                                 axis="one")]),
        "unknown_default_domain_op": make_model([helper.make_node("FooBar", ["x"], ["y"])]),
        "huge_initializer_without_data": make_model([helper.make_node("Add", ["x", "w"], ["y"])],
                                                    inits=[huge_init]),
    }


@pytest.mark.parametrize("name", list(_malformed()))
@pytest.mark.parametrize("auto_jit", [2, 0])
def test_malformed_model_raises_model_load_error(name, auto_jit):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ModelLoadError):
            autoclust.InferenceSession(_malformed()[name], device=DEVICE, auto_jit=auto_jit)


def test_huge_declared_shape_is_an_input_error_not_an_allocation():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])],
                       inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             [10**12, 10**12])])
    sess = session(model)
    with pytest.raises(InvalidInputError, match="dim 0 must be 1000000000000"):
        sess.run(None, {"x": np.ones((2, 4), np.float32)})


# ---- mutated zoo models, in a subprocess --------------------------------------------------

MUTATE_MODELS = ["gelu", "layernorm", "softmax_mask", "mlp_gelu", "rmsnorm_gate"]
MUTATIONS_PER_MODEL = 60


def _mutate(model, rng):
    """One random mutation: bit flips, truncation, or a field edit. Returns bytes."""
    kind = int(rng.integers(0, 6))
    if kind <= 1:
        data = bytearray(model.SerializeToString())
        for _ in range(int(rng.integers(1, 5))):
            pos = int(rng.integers(0, len(data)))
            data[pos] ^= 1 << int(rng.integers(0, 8))
        return bytes(data)
    if kind == 2:
        data = model.SerializeToString()
        return data[: int(rng.integers(0, len(data)))]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    node = g.node[int(rng.integers(0, len(g.node)))]
    if kind == 3:
        node.op_type = str(rng.choice(["Relu", "Add", "MatMul", "Softmax", "Transpose",
                                       "Reshape", "Concat", "NotAnOp"]))
    elif kind == 4 and node.input:
        j = int(rng.integers(0, len(node.input)))
        names = [o for n in g.node for o in n.output] + [i.name for i in g.input] + ["zz"]
        node.input[j] = str(rng.choice(names))
    elif g.initializer:
        t = g.initializer[int(rng.integers(0, len(g.initializer)))]
        if rng.random() < 0.5:
            g.initializer.remove(t)
        else:
            t.dims[0] = int(t.dims[0]) + int(rng.integers(1, 3))
    return m.SerializeToString()


def _outcome(data, feeds):
    """'clean' (our error), 'equal' (same as onnxruntime) or 'UNCLEAN: ...'."""
    try:
        want = ort_run(onnx.load_model_from_string(data), feeds)
    except Exception:  # noqa: BLE001 - onnxruntime also rejects it
        want = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = autoclust.InferenceSession(data, device="interpreter",
                                             min_cluster_size=1).run(None, feeds)
    except AutoclustError:
        return "clean"
    except Exception as exc:  # noqa: BLE001 - the finding, unless onnxruntime fails alike
        if want is None and type(exc).__module__.startswith("onnxruntime"):
            return "ort_error"  # a fallback segment raised what onnxruntime itself raises
        return f"UNCLEAN: {type(exc).__name__}: {str(exc)[:200]}"
    if want is None:
        return "ort_failed"
    for g, w in zip(got, want):
        if g.shape != w.shape or not np.allclose(g, w, rtol=1e-4, atol=1e-5, equal_nan=True):
            return "UNCLEAN: result differs from onnxruntime"
    return "equal"


def mutation_batch(names, per_model, seed):
    """Mutate each zoo model per_model times; a JSON summary of the outcomes."""
    rng = np.random.default_rng(seed)
    counts, bad = {}, []
    for name in names:
        model = zoo.build(name)
        feeds = zoo.feeds(model)
        for i in range(per_model):
            result = _outcome(_mutate(model, rng), feeds)
            key = result.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
            if key == "UNCLEAN":
                bad.append(f"{name}#{i}: {result}")
    return {"counts": counts, "bad": bad}


def test_mutated_zoo_models_fail_cleanly_or_match_onnxruntime():
    cmd = [sys.executable, __file__, "mutate", str(MUTATIONS_PER_MODEL)]
    env = dict(os.environ, ORT_LOGGING_LEVEL="3")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    assert proc.returncode == 0, f"the mutation subprocess died ({proc.returncode}): " \
        f"{proc.stderr[-2000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bad"] == [], result
    assert sum(result["counts"].values()) == MUTATIONS_PER_MODEL * len(MUTATE_MODELS)
    assert result["counts"].get("clean", 0) > 0


# ---- bad feeds --------------------------------------------------------------------------------

def test_bad_feeds_raise_invalid_input_error_naming_the_input():
    sess = session(small_model())
    x = np.ones((2, 4), np.float32)
    bad = [({"z": x}, "unknown input 'z'"), ({}, "missing input"),
           ({"x": x.astype(np.float64)}, "dtype"), ({"x": x[None]}, "rank"),
           ({"x": np.ones((2, 5), np.float32)}, "dim 1 must be 4"),
           # a list of numbers feeds a float input, as in onnxruntime; strings cannot
           ({"x": [["a", "b", "c", "d"]]}, r"cannot make a tensor\(float\) from the list")]
    for feeds, match in bad:
        with pytest.raises(InvalidInputError, match=match):
            sess.run(None, feeds)


@pytest.mark.parametrize("kind", ["non_contiguous", "transposed", "read_only", "nan_inf",
                                  "empty_batch", "fortran"])
def test_unusual_feeds_give_onnxruntime_results(kind):
    model = small_model()
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 8)).astype(np.float32)
    x = {"non_contiguous": base[::2, ::2], "transposed": base[:4, :6].T[:, :4],
         "read_only": base[:3, :4].copy(), "nan_inf": base[:3, :4].copy(),
         "empty_batch": np.zeros((0, 4), np.float32),
         "fortran": np.asfortranarray(base[:5, :4])}[kind]
    if kind == "read_only":
        x.flags.writeable = False
    if kind == "nan_inf":
        x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    want = ort_run(model, {"x": np.ascontiguousarray(x)})
    sess = session(model)
    for _ in range(2):  # the second run takes the cached executable
        got = sess.run(None, {"x": x})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6, equal_nan=True)
        assert got[0].shape == want[0].shape and got[0].dtype == want[0].dtype


# ---- faults -----------------------------------------------------------------------------------

def test_compile_exception_falls_back_and_warns_once(monkeypatch):
    def broken(graph, flags):
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(interpreter, "compile", broken)
    sess = session(small_model(), device="interpreter")
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [sess.run(None, {"x": x})[0] for _ in range(3)]
    falls = [w for w in caught if "falls back" in str(w.message)]
    assert len(falls) == 1 and "injected compile failure" in str(falls[0].message)
    want = ort_run(small_model(), {"x": x})[0]
    for got in outs:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sess.stats()["clusters"][0]["fallback"].startswith("compile failed")


def _mask_model():
    """ids[1, s], mask[1, s] -> tanh(ids * mask) + ids: both inputs must have one length."""
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, "s"]) for n in ("ids", "mask")]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "s"])
    return make_model([helper.make_node("Mul", ["ids", "mask"], ["a"]),
                       helper.make_node("Tanh", ["a"], ["b"]),
                       helper.make_node("Add", ["b", "ids"], ["y"])], vi, [y])


def test_inputs_whose_dims_disagree_raise_and_keep_the_cluster():
    """A mask one token shorter than its ids: onnxruntime rejects the feed, so the run raises
    InvalidInputError naming the cluster, both shapes and the node, with no fallback
    warning; the cluster stays compiled and serves the next good feed."""
    model = _mask_model()
    sess = session(model, device="cpu")
    ones = np.ones((1, 9), np.float32)
    sess.run(None, {"ids": ones, "mask": ones})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback warning would fail here
        with pytest.raises(InvalidInputError,
                           match=r"disagree \(ids \[1, 9\], mask \[1, 8\]\).*Mul"):
            sess.run(None, {"ids": ones, "mask": ones[:, :8]})
    runner = sess._runtime.runners[0]
    assert runner.fallback is None
    feed = {"ids": np.arange(7, dtype=np.float32)[None], "mask": np.full((1, 7), 0.5, np.float32)}
    np.testing.assert_allclose(sess.run(None, feed)[0], ort_run(model, feed)[0], rtol=1e-6)
    assert runner.fallback is None and runner.signature(list(feed.values())) in runner.cache


def test_a_shape_rule_onnxruntime_disagrees_with_falls_back(monkeypatch):
    """A shape rule that rejects inputs onnxruntime runs is our bug, not bad input: the
    cluster falls back with one warning and onnxruntime's answer."""
    from autoclust import compile as compile_module
    from autoclust.errors import ShapeInferenceError

    def wrong_rule(*args, **kwargs):
        raise ShapeInferenceError("injected: a wrong shape rule")

    monkeypatch.setattr(compile_module, "compile_cluster", wrong_rule)
    monkeypatch.setattr(compile_module, "compile_class", wrong_rule)
    model = _mask_model()
    sess = session(model, device="cpu")
    feed = {"ids": np.ones((1, 5), np.float32), "mask": np.full((1, 5), 2.0, np.float32)}
    with pytest.warns(RuntimeWarning, match="falls back.*injected"):
        got = sess.run(None, feed)
    np.testing.assert_allclose(got[0], ort_run(model, feed)[0], rtol=1e-6)


def _empty_reduce_max_model():
    """ReduceMax over an empty axis, left to onnxruntime, feeding a cluster: onnxruntime
    keeps the axis's 0 ([1, 4, 0]) where the spec and our inference say [1, 4, 1]."""
    nodes = [helper.make_node("ReduceMax", ["x", "ax"], ["r"], keepdims=1),
             helper.make_node("Mul", ["r", "c"], ["m"]), helper.make_node("Add", ["m", "c"], ["y"])]
    inits = [helper.make_tensor("ax", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("c", TensorProto.FLOAT, [1, 1, 1], [0.5])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("with_options", [False, True])
def test_a_value_onnxruntime_shaped_its_own_way_gets_onnxruntimes_answer(with_options):
    """Fuzz 81/558: a cluster rejected the [1, 4, 0] an onnxruntime segment computed
    (InvalidInputError) for a feed plain onnxruntime runs. Now onnxruntime runs that run
    whole, warning once; good feeds still run the cluster (a cluster fed by the user's
    feeds alone still raises: test_inputs_whose_dims_disagree_raise_and_keep_the_cluster)."""
    model = _empty_reduce_max_model()
    flags = {"min_cluster_size": 1, "cluster_exclude_ops": ["ReduceMax"], "device": "cpu"}
    sess = autoclust.InferenceSession(model, **flags)
    args = (ort.RunOptions(),) if with_options else ()
    empty = {"x": np.zeros((1, 4, 0), np.float32)}
    want = ort_run(model, empty)[0]
    assert want.shape == (1, 4, 0)
    with pytest.warns(RuntimeWarning, match="onnxruntime ran the whole model") as record:
        got = sess.run(None, empty, *args)
    assert len([w for w in record if "whole model" in str(w.message)]) == 1
    assert got[0].shape == want.shape
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per session
        assert sess.run(None, empty, *args)[0].shape == (1, 4, 0)
    feed = {"x": np.arange(12, dtype=np.float32).reshape(1, 4, 3)}
    np.testing.assert_allclose(sess.run(None, feed, *args)[0], ort_run(model, feed)[0])
    runner = sess._runtime.runners[1]
    assert runner.fallback is None and runner.compiles == 1


def _unwritable(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    return str(blocker / "sub")  # unwritable even for root: a path through a regular file


@pytest.mark.parametrize("flag", ["dump_to", "cache_dir"])
def test_unwritable_dump_and_cache_dirs_warn_and_carry_on(tmp_path, flag):
    device = DEVICE if flag == "dump_to" else "cpu"
    if device == "cpu" and DEVICE != "cpu":
        pytest.skip("--cache_dir is used by the cpu backend, which is not available")
    x = np.ones((2, 4), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = session(small_model(), device=device, **{flag: _unwritable(tmp_path)})
        got = sess.run(None, {"x": x})
    assert any(issubclass(w.category, RuntimeWarning) and "cannot write" in str(w.message)
               for w in caught)
    np.testing.assert_allclose(got[0], ort_run(small_model(), {"x": x})[0], rtol=1e-5)


# ---- concurrency ------------------------------------------------------------------------------

def test_one_session_from_eight_threads():
    model = small_model()
    sess = session(model)
    rng = np.random.default_rng(2)
    feeds = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(8)]
    wants = [ort_run(model, {"x": f})[0] for f in feeds]
    errors = []

    def work(t):
        try:
            for _ in range(1000):
                got = sess.run(None, {"x": feeds[t]})[0]
                if not np.allclose(got, wants[t], rtol=1e-5, atol=1e-6):
                    errors.append(f"thread {t}: wrong output")
                    return
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    assert time.perf_counter() - start < 30
    assert sess.stats()["clusters"][0]["runs"] >= 8000


def test_same_cluster_from_threads_compiles_once(monkeypatch):
    calls = []
    real = interpreter.compile

    def slow_compile(graph, flags):
        calls.append(threading.get_ident())
        time.sleep(0.2)  # widen the race window
        return real(graph, flags)

    monkeypatch.setattr(interpreter, "compile", slow_compile)
    sess = session(small_model(), device="interpreter")
    x = np.ones((2, 4), np.float32)
    barrier = threading.Barrier(8)
    outs = []

    def work():
        barrier.wait()
        outs.append(sess.run(None, {"x": x})[0])

    threads = [threading.Thread(target=work) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(calls) == 1 and len(outs) == 8
    assert sess.stats()["clusters"][0]["compiles"] == 1


# ---- soak -------------------------------------------------------------------------------------

def test_soak_short_rss_growth_under_five_percent():
    result = soak.soak(5000, model="gelu", device=DEVICE, warmup=500, dims={"n": 64})
    assert result["growth"] < 0.05, result


if __name__ == "__main__":
    if sys.argv[1:2] == ["mutate"]:
        summary = mutation_batch(MUTATE_MODELS, int(sys.argv[2]), seed=0)
        print(json.dumps(summary))
