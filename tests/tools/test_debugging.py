"""Debugging a wrong answer: the fault injector, bisect, minify and --check_numerics.

bisect and minify run end to end against --inject_bug on zoo models, as a user drives
them (their trials run in worker processes); the tests assert the node they name, the
size of the repro and, for the BERT-style model, the time (marked speed).
"""

import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import onnx
import onnx.parser
import pytest
from autoclust.tools.debug import bisect, minify, repro, shrink
from autoclust.tools.debug import replay as replay_tool
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz.check import Outcome
from onnx import TensorProto, helper
from support import paths, stolen

import autoclust
from autoclust import flags as flags_mod
from autoclust.errors import FlagError, NotCompilableError
from autoclust.kernel import inject

REPO = paths.REPO
MODELS = os.path.join(REPO, "models")


def model_of(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def two_adds(elem=TensorProto.FLOAT, dtype=np.float32):
    """y = ((x + a) + b) * c: two Adds, the first one in graph order is 'add1'."""
    x = helper.make_tensor_value_info("x", elem, [2, 3])
    y = helper.make_tensor_value_info("y", elem, [2, 3])
    consts = [helper.make_tensor(n, elem, [3], np.asarray(v, dtype).tolist())
              for n, v in (("a", [1, 2, 3]), ("b", [-1, 0, 4]), ("c", [2, 3, -1]))]
    nodes = [helper.make_node("Add", ["x", "a"], ["t"], name="add1"),
             helper.make_node("Add", ["t", "b"], ["u"], name="add2"),
             helper.make_node("Mul", ["u", "c"], ["y"], name="mul")]
    return model_of(nodes, [x], [y], consts)


def run_quiet(sess, feeds):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = sess.run(None, feeds)
    return out, [str(w.message) for w in caught]


# ---- the fault injector -----------------------------------------------------------------

@pytest.mark.parametrize("spec, ok", [
    ("accuracy:Add", True), ("compile_error:Softmax", True), ("crash:Erf", True), ("", True),
    ("accuracy", False), ("wrong:Add", False), ("crash:", False)])
def test_inject_bug_flag_is_checked(spec, ok):
    if ok:
        assert flags_mod.parse("", inject_bug=spec).inject_bug == spec
        return
    with pytest.raises(FlagError, match="expected KIND:OP with KIND one of accuracy, "
                                        "compile_error, crash"):
        flags_mod.parse(f"--inject_bug={spec}")


@pytest.mark.parametrize("elem, dtype", [(TensorProto.FLOAT, np.float32),
                                         (TensorProto.INT64, np.int64)])
def test_accuracy_bug_corrupts_the_first_node_of_the_op_only(elem, dtype):
    model = two_adds(elem, dtype)
    x = np.arange(-3, 3).reshape(2, 3).astype(dtype)
    a, b, c = (np.array(v, dtype) for v in ([1, 2, 3], [-1, 0, 4], [2, 3, -1]))
    sess = autoclust.InferenceSession(model, min_cluster_size=1, inject_bug="accuracy:Add")
    (got,), _ = run_quiet(sess, {"x": x})
    t = x + a
    bad = t + 0.5 * np.abs(t) + 1 if dtype == np.float32 else t + 1
    np.testing.assert_allclose(got, (bad + b) * c, rtol=1e-6)
    (clean,), _ = run_quiet(autoclust.InferenceSession(model, min_cluster_size=1), {"x": x})
    np.testing.assert_array_equal(clean, (t + b) * c)


def test_inject_target_is_the_first_in_graph_order():
    from autoclust.importers.onnx import import_model
    graph = import_model(two_adds())
    assert inject.target(graph, "Add") == "add1"
    assert inject.target(graph, "Mul") == "mul" and inject.target(graph, "Erf") is None


def test_compile_error_bug_falls_back_naming_the_node():
    model, x = two_adds(), np.ones((2, 3), np.float32)
    sess = autoclust.InferenceSession(model, min_cluster_size=1,
                                      inject_bug="compile_error:Add")
    (got,), messages = run_quiet(sess, {"x": x})
    np.testing.assert_allclose(got, (x + [1, 2, 3] + [-1, 0, 4]) * [2, 3, -1])  # onnxruntime
    assert any("compile failed: CompileError: --inject_bug=compile_error:Add: injected "
               "compile error at node 'add1' (Add)" in m for m in messages), messages
    strict = autoclust.InferenceSession(model, min_cluster_size=1, must_compile=True,
                                        inject_bug="compile_error:Add")
    with pytest.raises(NotCompilableError, match="injected compile error at node 'add1'"):
        strict.run(None, {"x": x})


CRASH_SCRIPT = """
import sys, numpy as np, onnx, autoclust
sess = autoclust.InferenceSession(onnx.load(sys.argv[1]), min_cluster_size=1,
                                  inject_bug=sys.argv[2])
print(sess.run(None, {"x": np.ones((2, 3), np.float32)})[0].sum())
"""


def test_crash_bug_aborts_when_the_compiled_code_runs(tmp_path):
    path = str(tmp_path / "m.onnx")
    onnx.save(two_adds(), path)
    crashed = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, path, "crash:Add"],
                             check=False, capture_output=True, text=True, timeout=120)
    assert crashed.returncode < 0, (crashed.returncode, crashed.stderr[-2000:])  # a signal
    other = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, path, "crash:Erf"],
                           check=False, capture_output=True, text=True, timeout=120)
    assert other.returncode == 0 and float(other.stdout) == pytest.approx(6.0)


TARGET_SCRIPT = """
import sys, numpy as np, onnx, autoclust
from autoclust.tools.run import generate_inputs
model = onnx.load(sys.argv[1])
sess = autoclust.InferenceSession(model, inject_bug="accuracy:Add")
np.save(sys.argv[2], sess.run(None, generate_inputs(model))[0])
"""


def test_inject_target_is_the_same_in_every_process(tmp_path):
    path = os.path.join(MODELS, "bert_encoder.onnx")
    outs = []
    for seed in ("1", "2"):  # a target chosen by hashing would move between processes
        out = str(tmp_path / f"y{seed}.npy")
        subprocess.run([sys.executable, "-c", TARGET_SCRIPT, path, out], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed}, timeout=300)
        outs.append(np.load(out))
    np.testing.assert_array_equal(outs[0], outs[1])
    from autoclust.tools.run import generate_inputs
    want = fuzz_check.run_ort(onnx.load(path), generate_inputs(onnx.load(path)))[0]
    assert np.abs(outs[0] - want).max() > 0.01  # the fault is there


# ---- the shrinker -------------------------------------------------------------------------

@pytest.mark.parametrize("needed, most", [({13}, 8), ({3, 17}, 30), ({0, 1, 19}, 30)])
def test_ddmin_finds_a_one_minimal_subset(needed, most):
    calls = []

    def test(sub):
        calls.append(sub)
        return needed <= set(sub)

    assert shrink.ddmin(list(range(20)), test) == sorted(needed)
    assert len(calls) <= most  # removing one at a time to a fixpoint takes ~190


def chain_model():
    """x -> Tanh -> Exp -> Add(w) -> Sigmoid -> Neg -> y, plus a side output from Exp."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 6]) for n in ("y", "side")]
    w = helper.make_tensor("w", TensorProto.FLOAT, [6], np.linspace(-1, 1, 6).tolist())
    nodes = [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Add", ["b", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["d"]),
             helper.make_node("Neg", ["d"], ["y"]), helper.make_node("Abs", ["b"], ["side"])]
    return model_of(nodes, [x], outs, [w])


def test_shrink_keeps_what_the_failure_needs_and_cuts_the_rest():
    model = chain_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)}
    seen = []

    def still_fails(m, f):  # "the bug" needs Exp and Sigmoid in one model, any shapes
        seen.append(len(m.graph.node))
        fuzz_check.run_ort(m, f)  # every candidate is a valid standalone model
        return {"Exp", "Sigmoid"} <= {n.op_type for n in m.graph.node}

    small, small_feeds = shrink.shrink(model, feeds, still_fails)
    assert [n.op_type for n in small.graph.node] == ["Exp", "Sigmoid"]  # Add cut out
    assert not small_feeds and not small.graph.input  # inputs became constants
    sizes = {t.name: numpy_shape(t) for t in small.graph.initializer}
    assert sizes == {"a": (1, 1), "c": (1, 1)}, sizes  # shapes cut to 1
    assert len(seen) < 40


def numpy_shape(t):
    return onnx.numpy_helper.to_array(t).shape


def test_subset_feeds_cut_values_from_onnxruntime():
    model = shrink.normalize(chain_model())
    feeds = {"x": np.linspace(-2, 2, 24, dtype=np.float32).reshape(4, 6)}
    values = {**feeds, **shrink.intermediate_values(model, feeds)}
    sub, sub_feeds = shrink.subset(model, [3], values)  # the Sigmoid alone
    assert [v.name for v in sub.graph.input] == ["c"] and [o.name for o in sub.graph.output] \
        == ["d"]
    np.testing.assert_array_equal(sub_feeds["c"], values["c"])
    np.testing.assert_allclose(fuzz_check.run_ort(sub, sub_feeds)[0], values["d"], rtol=1e-6)
    assert shrink.subset(model, [], values) is None


@pytest.mark.parametrize("a, b, same", [
    (Outcome("mismatch", "autoclust x"), Outcome("mismatch", "autoclust x", "other"), True),
    (Outcome("mismatch", "autoclust x"), Outcome("crash", "process"), False),
    (Outcome("compile_fallback", "w", "c: compile failed: CompileError: one"),
     Outcome("compile_fallback", "w", "c: compile failed: CompileError: two"), True),
    (Outcome("compile_fallback", "w", "c: compile failed: CompileError: x"),
     Outcome("compile_fallback", "w", "c: compile failed: KeyError: x"), False),
    (Outcome("crash", "process", "worker killed by signal 4"),
     Outcome("crash", "process", "timed out after 60 s"), False),
])
def test_minify_keeps_the_same_failure(a, b, same):
    assert (minify.signature(a) == minify.signature(b)) is same


def test_arrays_round_trip_by_name_and_old_dump_format(tmp_path):
    arrays = {"/a/b:0": np.arange(3), "file": np.ones((2, 2), np.float32)}
    repro.save_arrays(str(tmp_path / "x.npz"), arrays)
    back = repro.load_arrays(str(tmp_path / "x.npz"))
    assert set(back) == set(arrays) and (back["/a/b:0"] == arrays["/a/b:0"]).all()
    np.savez(tmp_path / "old.npz", __names__=np.array(["u", "v"]), input_0=np.zeros(1),
             input_1=np.ones(2))
    assert {k: v.shape for k, v in repro.load_arrays(str(tmp_path / "old.npz")).items()} \
        == {"u": (1,), "v": (2,)}


# ---- --check_numerics ---------------------------------------------------------------------

def log_chain():
    """y = exp(log(|x| - 1)) * x: Log makes the first NaN/inf for |x| <= 1."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Abs", ["x"], ["a"], name="abs"),
             helper.make_node("Sub", ["a", "one"], ["b"], name="sub"),
             helper.make_node("Log", ["b"], ["c"], name="log"),
             helper.make_node("Exp", ["c"], ["d"], name="exp"),
             helper.make_node("Mul", ["d", "x"], ["y"], name="mul")]
    return model_of(nodes, [x], [y], [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])


@pytest.mark.parametrize("x, fragment", [
    ([0.5, 3, -2, 4], ("first made by node 'log' (Log) output 'c' from finite inputs; "
                       "inputs: x float32[4] min -2 max 4 NaN 0 inf 0")),
    ([np.nan, 3, 2, np.inf], ("first made by node 'abs' (Abs) output 'a' from NaN/inf "
                              "inputs; inputs: x float32[4] min 2 max 3 NaN 1 inf 1")),
])
def test_check_numerics_names_the_node_and_the_input_ranges(x, fragment):
    sess = autoclust.InferenceSession(log_chain(), min_cluster_size=1, check_numerics=True)
    _, messages = run_quiet(sess, {"x": np.array(x, np.float32)})
    assert len(messages) == 1 and "cluster_0000 output 'y' has NaN or inf" in messages[0]
    assert fragment in messages[0], messages[0]
    _, quiet = run_quiet(sess, {"x": np.array([2, 3, -2, 4], np.float32)})
    assert quiet == []


def test_check_numerics_blames_compiled_code_the_references_disagree_with():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    nodes = [helper.make_node("Greater", ["x", "zero"], ["pos"]),
             helper.make_node("Log", ["x"], ["l"]),
             helper.make_node("Where", ["pos", "l", "zero"], ["y"])]
    model = model_of(nodes, [x], [y], [zero])
    sess = autoclust.InferenceSession(model, min_cluster_size=1, check_numerics=True,
                                      inject_bug="accuracy:Greater")  # select the wrong side
    _, messages = run_quiet(sess, {"x": np.array([-1, 0, 2, 3], np.float32)})
    assert len(messages) == 1
    assert "the op references give finite outputs from these inputs: the compiled code made " \
        "the NaN/inf" in messages[0], messages[0]


# ---- bisect and minify end to end ---------------------------------------------------------

def bisect_cli(capsys, *args):
    code = bisect.main(list(args))
    out = capsys.readouterr().out
    return code, out


def check_repro(result, flags):
    """The dumped repro: a standalone model with its inputs by name, ending at the named
    node, failing on replay with the flags and passing without them."""
    path = result["repro"]
    model = onnx.load(path + ".onnx")
    feeds = repro.load_arrays(path + ".inputs.npz")
    assert set(feeds) == {v.name for v in model.graph.input}
    assert len(model.graph.node) == result["repro_nodes"]
    assert result["node"] == model.graph.node[-1].name
    args = {"cluster": path, "device": None, "rtol": 1e-4, "atol": 1e-5, "repeat": 1}
    assert replay_tool.main(replay_ns(flags=flags, **args)) == 1
    assert replay_tool.main(replay_ns(flags=None, **args)) == 0


def replay_ns(**kw):
    import argparse
    return argparse.Namespace(**kw)


def check_bundle(folder, op, flags):
    model = onnx.load(os.path.join(folder, "model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert op in ops and len(ops) <= 5, ops
    feeds = repro.load_arrays(os.path.join(folder, "inputs.npz"))
    expected = repro.load_arrays(os.path.join(folder, "expected.npz"))
    want = fuzz_check.run_ort(model, feeds)
    for o, w in zip(model.graph.output, want):
        np.testing.assert_array_equal(expected[o.name], w)
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    assert flags in meta["flags"] and {"onnxruntime", "llvm", "autoclust"} <= set(
        meta["versions"])
    return model, feeds, meta


def bert_to_repro(tmp_path, capsys):
    flags = "--inject_bug=accuracy:Add"
    start = time.perf_counter()
    with stolen.Meter() as meter:
        code, out = bisect_cli(capsys, os.path.join(MODELS, "bert_encoder.onnx"),
                               f"--flags={flags}", "--out", str(tmp_path / "b"))
        with open(tmp_path / "b" / "bisect.json") as f:
            result = json.load(f)
        assert minify.main([result["repro"], f"--flags={flags}", "--out",
                            str(tmp_path / "m")]) == 1
    return code, out, result, (time.perf_counter() - start) / meter.slowdown


def test_bisect_and_minify_find_the_injected_accuracy_bug_in_bert(tmp_path, capsys):
    code, out, result, _ = bert_to_repro(tmp_path, capsys)
    assert code == 1, out
    # the first Add that compiles: embeddings (word + position) before their LayerNorm
    assert (result["node"], result["op"]) == ("/bert/embeddings/Add", "Add"), out
    assert "autoclust replay " in out and "bad_nodes --flags=" in out
    assert result["repro_nodes"] == 1 and not result["needs_flags"]  # the Add alone fails
    check_repro(result, "--inject_bug=accuracy:Add")
    model, _, meta = check_bundle(str(tmp_path / "m"), "Add", "--inject_bug=accuracy:Add")
    assert meta["kind"] == "mismatch" and [n.name for n in model.graph.node] == [
        "/bert/embeddings/Add"]
    assert replay_tool.main(replay_ns(cluster=str(tmp_path / "m"), device=None, rtol=1e-4,
                                      atol=1e-5, repeat=1,
                                      flags="--inject_bug=accuracy:Add")) == 1


@pytest.mark.speed
def test_bert_injected_bug_to_minimal_repro_in_under_a_minute(tmp_path, capsys):
    _, _, result, seconds = bert_to_repro(tmp_path, capsys)
    assert result["node"] == "/bert/embeddings/Add"
    # seconds are the wall time over the host's slowdown (support/stolen.py)
    assert seconds < 60, f"bisect + minify took {seconds:.1f} s of an unshared host"


def test_bisect_and_minify_a_crash(tmp_path, capsys):
    flags = "--inject_bug=crash:Erf"
    code, out = bisect_cli(capsys, os.path.join(MODELS, "mlp_gelu.onnx"), f"--flags={flags}",
                           "--out", str(tmp_path / "b"))
    with open(tmp_path / "b" / "bisect.json") as f:
        result = json.load(f)
    assert code == 1 and result["node"] == "/act/Erf", out
    assert result["node_failure"].startswith("crash: worker killed by signal"), result
    assert minify.main([os.path.join(MODELS, "mlp_gelu.onnx"), f"--flags={flags}", "--out",
                        str(tmp_path / "m")]) == 1
    model, _, meta = check_bundle(str(tmp_path / "m"), "Erf", flags)
    assert meta["kind"] == "crash" and len(model.graph.node) == 1


def test_bisect_a_dumped_cluster_with_a_compile_error(tmp_path, capsys):
    model = os.path.join(MODELS, "llama_block.onnx")
    sess = autoclust.InferenceSession(model, dump_to=str(tmp_path / "d"), dump_inputs=True)
    from autoclust.tools.run import generate_inputs
    sess.run(None, generate_inputs(onnx.load(model)))
    flags = "--inject_bug=compile_error:Sigmoid"
    code, out = bisect_cli(capsys, str(tmp_path / "d" / "cluster_0000"), f"--flags={flags}",
                           "--out", str(tmp_path / "b"))
    assert "saved inputs" in out
    with open(tmp_path / "b" / "bisect.json") as f:
        result = json.load(f)
    assert code == 1 and result["node"] == "/model/layers.0/mlp/Sigmoid", out
    assert "CompileError: --inject_bug=compile_error:Sigmoid" in result["node_failure"]


def test_bisect_and_minify_say_when_nothing_fails(tmp_path, capsys):
    model = os.path.join(MODELS, "mlp_gelu.onnx")
    code, out = bisect_cli(capsys, model, "--out", str(tmp_path / "b"))
    assert code == 0 and "no failure: autoclust matches onnxruntime" in out
    assert minify.main([model, "--out", str(tmp_path / "m")]) == 0
    assert "no failure" in capsys.readouterr().out and not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("given, source", [
    (("input_ids", "attention_mask"), "inputs from --input"),
    (("input_ids",), "generated inputs (attention_mask; input_ids from --input)"),
])
def test_bisect_says_where_its_inputs_came_from(tmp_path, capsys, given, source):
    path = os.path.join(MODELS, "bert_encoder.onnx")
    feeds = {"input_ids": np.arange(8).reshape(1, 8) % 100, "attention_mask": np.ones((1, 8))}
    args = []
    for name in given:
        np.save(tmp_path / f"{name}.npy", feeds[name].astype(np.int64))
        args += ["--input", f"{name}={tmp_path / name}.npy"]
    code, out = bisect_cli(capsys, path, *args, "--out", str(tmp_path / "b"))
    assert code == 0 and f"{path}: {source}; flags (none)" in out, out
    _, loaded, _ = repro.load_target(path, {n: f"{tmp_path / n}.npy" for n in given})
    assert {k: v.shape for k, v in loaded.items()} == {"input_ids": (1, 8),
                                                        "attention_mask": (1, 8)}


def test_worker_writes_a_model_once_and_checks_against_given_outputs():
    from autoclust.tools.fuzz import command as fuzz
    model, x = two_adds(), np.ones((2, 3), np.float32)
    feeds = {"x": x}
    want = fuzz_check.run_ort(model, feeds)[0]
    worker = fuzz.Worker(timeout=120)
    try:
        bad = worker(model, feeds, [{"min_cluster_size": 1, "inject_bug": "accuracy:Add"}])
        good = worker(model, feeds, [{"min_cluster_size": 1}], interpreter=False)
        assert (bad.kind, good.kind, worker.written) == ("mismatch", "ok", 1)
        # outputs the caller computed are what the worker compares with: here the wrong ones
        wrong = {"min_cluster_size": 1, "inject_bug": "accuracy:Add"}
        (got,), _ = run_quiet(autoclust.InferenceSession(model, **wrong), feeds)
        assert np.abs(got - want).max() > 1
        assert worker(model, feeds, [wrong], {"y": (got, None)}).kind == "ok"
        assert worker(model, feeds, [wrong], {"y": (want, np.zeros_like(want))}).kind \
            == "mismatch"
        feeds["x"][0, 0] = 5  # changed in place: sent again
        assert worker(model, feeds, [{}]).kind == "ok" and worker.written == 4
    finally:
        worker.close()


def test_a_trial_verdict_is_one_short_line():
    diff = fuzz_check.compare([np.full(4, 2.5, np.float32)], [np.ones(4, np.float32)], None,
                              ["Softmax '/model/layers.0/self_attn/Softmax_output_0'"])
    line = bisect.verdict(Outcome("mismatch", "autoclust", diff))
    assert line == ("mismatch: 4 of 4 elements of '....0/self_attn/Softmax_output_0' (Softmax) "
                    "differ, first got 2.5 for 1.0"), line
    assert bisect.verdict(Outcome("ok")) == "ok"
    crash = Outcome("crash", "process", "worker killed by signal 4")
    assert bisect.verdict(crash) == "crash: worker killed by signal 4"


def _bundle(folder, text: str, feeds: dict) -> str:
    """A repro bundle (model.onnx, inputs.npz) of the ONNX text `text`."""
    model = onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : 21]> {text}')
    os.makedirs(folder, exist_ok=True)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    np.savez(os.path.join(folder, "inputs.npz"), **feeds)
    return str(folder)


def test_replay_reports_sides_that_raise_instead_of_a_traceback(tmp_path, capsys):
    """Integer division by zero: onnxruntime and the compiled code both raise (agreement,
    exit 0); onnxruntime's Squeeze refusing its own empty ReduceMax's kept 0 (fuzz
    92/2192) is its failure: the reference answers and the compiled outputs match it."""
    args = {"device": None, "rtol": 1e-4, "atol": 1e-5, "repeat": 1, "flags": None}
    zero = _bundle(tmp_path / "div", "g (int32[3] a, int32[3] b) => (int32[3] y) "
                   "{ y = Div (a, b) }", {"a": np.array([7, -7, 5], np.int32),
                                          "b": np.array([2, 2, 0], np.int32)})
    assert replay_tool.main(replay_ns(cluster=zero, **args)) == 0
    out = capsys.readouterr().out
    assert "both raise: agreed" in out and "onnxruntime: Fail" in out, out
    own = _bundle(tmp_path / "squeeze", "g (float[3,4,0] x) => (float[3,4] y) { "
                  "a = Constant <value = int64[1] {-1}> () r = ReduceMax <keepdims = 1> "
                  "(x, a) s = Constant <value = int64[1] {2}> () y = Squeeze (r, s) }",
                  {"x": np.zeros((3, 4, 0), np.float32)})
    assert replay_tool.main(replay_ns(cluster=own, **args)) == 0
    out = capsys.readouterr().out
    assert "onnxruntime failed on its own" in out and "ok" in out, out
