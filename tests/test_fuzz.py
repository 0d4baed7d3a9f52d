"""The differential fuzzer: a fixed-seed budget, the shrinker, bundles and worker isolation."""

import dataclasses
import json

import numpy as np
import onnx
import pytest
from autoclust.tools import fuzz, fuzz_check, fuzz_gen, shrink

from autoclust import ops

# A fixed budget of 300 graphs (3 x 100) checks clustering, partitioned execution and the
# metamorphic variants on the interpreter device; compiled code (LLVM compiles cost ~0.5 s
# per cluster here) gets a smaller budget. In-process for speed; isolation is tested below.
BUDGET = [("interpreter", 0, 100), ("interpreter", 1, 100), ("interpreter", 2, 100),
          ("cpu", 3, 25)]


@pytest.mark.parametrize("device, seed, cases", BUDGET)
def test_fixed_seed_budget_has_no_mismatch(device, seed, cases):
    if device != "interpreter" and fuzz.default_device() != device:
        pytest.skip(f"device {device} is not available here")
    summary = fuzz.run(seed, cases=cases, device=device)
    assert summary.graphs == cases
    assert summary.invalid == 0, "the generator must only build valid graphs"
    assert summary.failed == 0, summary.failures


def test_generator_covers_the_op_mix():
    seen = set()
    sizes = []
    for i in range(150):
        case = fuzz_gen.case_for(3, i)
        sizes.append(len(case.model.graph.node))
        seen.update(n.op_type for n in case.model.graph.node)
    assert min(sizes) >= 2 and max(sizes) <= 40
    wanted = {"Add", "MatMul", "Softmax", "LayerNormalization", "ReduceSum", "ReduceMean",
              "ReduceMax", "Transpose", "Reshape", "Slice", "Concat", "Unsqueeze", "Squeeze",
              "Expand", "Shape", "Gather", "Where", "Cast", "Clip", "NonZero", "TopK", "Log",
              "Sqrt", "Div"}
    assert wanted <= seen, wanted - seen


def test_generator_is_deterministic():
    a, b = fuzz_gen.case_for(4, 17), fuzz_gen.case_for(4, 17)
    assert a.model.SerializeToString() == b.model.SerializeToString()
    assert a.feeds.keys() == b.feeds.keys()
    for k in a.feeds:
        np.testing.assert_array_equal(a.feeds[k], b.feeds[k])


def test_compare_reports_dtype_shape_and_value_differences():
    x = np.ones((2, 3), np.float32)
    assert fuzz_check.compare([x], [x.copy()]) == ""
    assert "dtype" in fuzz_check.compare([x.astype(np.float64)], [x])
    assert "shape" in fuzz_check.compare([x.reshape(3, 2)], [x])
    assert "differ" in fuzz_check.compare([x + 1e-3], [x])
    assert fuzz_check.compare([x + 1e-6], [x]) == ""  # inside atol 1e-5
    nan = np.array([np.nan, np.inf], np.float32)
    assert fuzz_check.compare([nan.copy()], [nan]) == ""


def _broken_tanh(monkeypatch):
    d = ops.get("Tanh")

    def ref(inputs, attrs):
        return [np.tanh(inputs[0]) + np.float32(0.5)]

    monkeypatch.setitem(ops._TABLE, ("", "Tanh"), dataclasses.replace(d, ref=ref))


def _case_with(op, min_nodes=12):
    for i in range(500):
        case = fuzz_gen.case_for(9, i)
        ops_ = [n.op_type for n in case.model.graph.node]
        if op in ops_ and len(ops_) >= min_nodes:
            return case
    raise AssertionError(f"no generated case with {op}")


def test_shrinker_reduces_injected_bug_and_writes_bundle(monkeypatch, tmp_path):
    _broken_tanh(monkeypatch)
    case = _case_with("Tanh")
    summary = fuzz.run(9, cases=case.seed[1] + 1, device="interpreter", out_dir=str(tmp_path),
                       max_reports=1)
    assert summary.mismatches >= 1
    info = summary.failures[0]
    assert info["where"] == "interpreter"
    folder = info["bundle"]
    model = onnx.load(f"{folder}/model.onnx")
    kinds = [n.op_type for n in model.graph.node]
    assert "Tanh" in kinds and len(kinds) <= 2, kinds
    assert len(kinds) < info["original_nodes"]
    with np.load(f"{folder}/inputs.npz") as z:
        feeds = {k: z[k] for k in z.files}
    with np.load(f"{folder}/expected.npz") as z:
        expected = [z[o.name] for o in model.graph.output]
    want = fuzz_check.run_ort(model, feeds)
    for e, w in zip(expected, want):
        np.testing.assert_array_equal(e, w)
    with open(f"{folder}/meta.json") as f:
        meta = json.load(f)
    assert meta["seed"] == 9 and meta["kind"] == "mismatch"
    assert {"onnx", "onnxruntime", "autoclust"} <= set(meta["versions"])
    # The shrunk repro still fails, and onnxruntime runs it.
    again = fuzz_check.check(model, feeds, [])
    assert again.kind == "mismatch" and again.where == "interpreter"


def test_prune_drops_dead_nodes_inputs_and_initializers():
    case = fuzz_gen.case_for(5, 3)
    model = shrink._copy(case.model)
    keep = model.graph.output[0]
    del model.graph.output[:]
    model.graph.output.append(keep)
    small, feeds = shrink.prune(model, case.feeds)
    assert len(small.graph.node) <= len(case.model.graph.node)
    used = {i for n in small.graph.node for i in n.input} | {keep.name}
    assert all(v.name in used for v in small.graph.input)
    assert all(t.name in used for t in small.graph.initializer)
    assert set(feeds) == {v.name for v in small.graph.input}
    want = fuzz_check.run_ort(case.model, case.feeds)[0]
    np.testing.assert_array_equal(fuzz_check.run_ort(small, feeds)[0], want)


# ---- isolation (a few cases, in a worker subprocess) ----------------------------------------

def test_worker_checks_cases_like_in_process():
    worker = fuzz.Worker(timeout=120)
    try:
        for i in range(3):
            case = fuzz_gen.case_for(0, i)
            variants = fuzz.variants_for_case(case, "interpreter")
            assert worker(case.model, case.feeds, variants).kind == "ok"
    finally:
        worker.close()


def test_worker_crash_is_caught_reported_and_shrunk(monkeypatch, tmp_path):
    monkeypatch.setenv(fuzz.INJECT_ENV, "crash:Tanh")
    case = _case_with("Tanh")
    no_tanh = next(fuzz_gen.case_for(9, i) for i in range(100)
                   if "Tanh" not in {n.op_type for n in fuzz_gen.case_for(9, i).model.graph.node})
    worker = fuzz.Worker(timeout=120)
    try:
        variants = fuzz.variants_for_case(case, "interpreter")
        outcome = worker(case.model, case.feeds, variants)
        assert outcome.kind == "crash" and "signal 11" in outcome.message
        # The worker restarts: the next case runs normally.
        ok = worker(no_tanh.model, no_tanh.feeds, fuzz.variants_for_case(no_tanh, "interpreter"))
        assert ok.kind == "ok"
        model, _ = fuzz.shrink_failure(case, variants, outcome, worker)
    finally:
        worker.close()
    kinds = [n.op_type for n in model.graph.node]
    assert kinds == ["Tanh"], kinds


def test_worker_hang_times_out(monkeypatch):
    monkeypatch.setenv(fuzz.INJECT_ENV, "hang:Tanh")
    case = _case_with("Tanh")
    worker = fuzz.Worker(timeout=5)
    try:
        outcome = worker(case.model, case.feeds, [])
    finally:
        worker.close()
    assert outcome.kind == "crash" and "timed out" in outcome.message


def test_cli_prints_summary_and_exit_status(capsys):
    assert fuzz.main(["--cases", "3", "--seed", "0", "--device", "interpreter"]) == 0
    out = capsys.readouterr().out
    assert "graphs 3, mismatches 0, crashes 0" in out


def test_onnxruntime_empty_reduce_shape_is_why_the_generator_avoids_it():
    # onnxruntime 1.31 keeps reduced empty axes with keepdims=0; the spec (and our ref) drop
    # them. The generator therefore never reduces empty tensors (see fuzz_gen.emit_reduce).
    x = np.zeros((3, 0, 3, 2), np.float32)
    (got,) = ops.get("ReduceMean").ref([x, np.array([0, 2, 3])], {"keepdims": 0})
    assert got.shape == (0,)
