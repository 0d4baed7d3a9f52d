"""The differential fuzzer: fixed-seed budgets, the shrinker, bundles and worker isolation."""

import dataclasses
import json

import numpy as np
import onnx
import onnx.parser
import pytest
from autoclust.tools import cli
from autoclust.tools.debug import shrink
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz import command as fuzz
from autoclust.tools.fuzz import gen as fuzz_gen

from autoclust import ops

CLASSIC = fuzz_gen.CLASSIC


# Failure signatures (Outcome.signature) of bugs that are known and open, each with its
# minimal repro in tests/tools/test_fuzz_repros.py (strict xfail there): none at present.

# Fixed-seed budgets. The classic mix (float32, normal values, no zero-size dims) checks
# clustering, partitioned execution and the metamorphic variants on the interpreter device
# (200 graphs) and compiled code on the CPU backend (25 graphs; an LLVM compile costs
# ~0.3 s per cluster here). One budget per family of edge cases (the presets in
# tools/fuzz/build.py) runs on the CPU backend, under --check_bounds (an access outside a
# buffer raises instead of reading garbage), and one mixes every feature on the
# interpreter device. A budget passes when every failure it finds has a known signature,
# and each known signature it lists is still found: a new bug fails it, and so does a
# fix (drop the signature then). In-process for speed; isolation is tested below.
BUDGET = [
    ("interpreter", 0, 100, "classic", ()),
    ("interpreter", 1, 100, "classic", ()),
    ("cpu", 3, 25, "classic", ()),
    ("interpreter", 4, 100, "all", ()),
    ("cpu", 5, 12, "values", ()),
    ("cpu", 26, 20, "empty", ()),  # found Softmax/Split on zero-length axes until fixed
    ("cpu", 7, 12, "index", ()),
    ("cpu", 8, 12, "int", ()),
    ("cpu", 6, 10, "round", ()),
    # Run on the code before issue 24's fixes, these 40 graphs found each class it names:
    # GatherElements indices longer than data (an out-of-bounds read), Clip without a bound
    # on inf, Gemm reading C at beta 0, CumSum of -0.0, both compile crashes (a scan in a
    # reduction's kernel; an empty Slice of a Concat) and Expand to absurd shapes.
    ("cpu", 103, 40, "optional", ()),
    # the ops group: pools, scatters, Einsum, BatchNorm, ... (its first 30 graphs of seed
    # 141 found LpNormalization's reciprocal of a denormal norm; these are clean)
    ("cpu", 144, 30, "ops", ()),
]


def _failing(summary: fuzz.Summary) -> list[str]:
    return [c for c in summary.causes if c.split(" ")[0] in ("mismatch", "error", "crash")]


@pytest.mark.parametrize("device, seed, cases, preset, known", BUDGET,
                         ids=[f"{d}-{p}-{s}" for d, s, _, p, _ in BUDGET])
def test_fixed_seed_budget_finds_only_known_bugs(device, seed, cases, preset, known):
    if device != "interpreter" and fuzz.default_device() != device:
        pytest.skip(f"device {device} is not available here")
    summary = fuzz.run(seed, cases=cases, device=device, features=fuzz_gen.PRESETS[preset])
    assert summary.graphs == cases
    assert summary.invalid == 0, "the generator must only build valid graphs"
    failing = _failing(summary)
    unknown = [c for c in failing if not any(k in c for k in known)]
    assert not unknown, summary.cause_lines()
    fixed = [k for k in known if not any(k in c for c in failing)]
    assert not fixed, f"no longer found (fixed? drop them from the budget): {fixed}"


@pytest.fixture
def replace_op():
    """ops.replace(opdef) for one test: the registered op comes back afterwards."""
    replaced = []

    def put(opdef):
        replaced.append(ops.replace(opdef))
        return replaced[-1]

    yield put
    for old in reversed(replaced):
        ops.replace(old)


def _broken_tanh(replace_op):
    d = ops.get("Tanh")

    def ref(inputs, attrs):
        return [np.tanh(inputs[0]) + np.float32(0.5)]

    return replace_op(dataclasses.replace(d, ref=ref))


def _case_with(op, min_nodes=12):
    """A classic case with an `op` whose output is a graph output (so it can shrink to it)."""
    for i in range(500):
        case = fuzz_gen.case_for(9, i, CLASSIC)
        outputs = {o.name for o in case.model.graph.output}
        ops_ = [n.op_type for n in case.model.graph.node]
        if len(ops_) >= min_nodes and any(n.op_type == op and n.output[0] in outputs
                                          for n in case.model.graph.node):
            return case
    raise AssertionError(f"no generated case with {op}")


def test_shrinker_reduces_injected_bug_and_writes_bundle(replace_op, tmp_path):
    tanh = _broken_tanh(replace_op)
    case = _case_with("Tanh")
    summary = fuzz.run(9, cases=1, first=case.seed[1], device="interpreter",
                       out_dir=str(tmp_path), max_reports=1, features=CLASSIC)
    assert summary.mismatches >= 1
    info = summary.failures[0]
    # A clustered Tanh fails in the autoclust session on the interpreter device first.
    assert info["where"] == "interpreter" or info["where"].startswith("autoclust device=interp")
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
    again = fuzz_check.check(model, feeds, [info["flags"]] if info["flags"] else [])
    assert again.kind == "mismatch" and again.where == info["where"]
    # `autoclust replay BUNDLE` reruns it: a mismatch (exit 1) while the bug is in, none
    # (exit 0) once it is gone.
    assert cli.main(["replay", folder, "--device", "interpreter"]) == 1
    ops.replace(tanh)  # the bug fixed
    assert cli.main(["replay", folder, "--device", "interpreter"]) == 0


def test_prune_drops_dead_nodes_inputs_and_initializers():
    case = fuzz_gen.case_for(5, 3, CLASSIC)
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


TANH = onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 18]> '
                               "g (float[4] x) => (float[4] y) { y = Tanh (x) }")
TANH_FEEDS = {"x": np.array([-2, -0.5, 0.5, 2], np.float32)}
INTERPRETER = [{"device": "interpreter", "min_cluster_size": 1}]


@pytest.mark.parametrize("rtol, atol, kind", [(None, None, "mismatch"), (None, 0.6, "ok"),
                                              (0.3, None, "mismatch"), (0.3, 0.6, "ok")])
def test_rtol_atol_override_the_per_dtype_tolerance(replace_op, rtol, atol, kind):
    # minify/bisect --rtol/--atol reach check() through the worker request; None keeps the
    # per-dtype default (1e-4 relative, no absolute slack for float32). Tanh + 0.5 is 0.5 off.
    _broken_tanh(replace_op)
    assert fuzz_check.check(TANH, TANH_FEEDS, INTERPRETER, rtol, atol).kind == kind
    assert fuzz_check.tolerance(np.array([2.0], np.float32), None, rtol, atol)[0] == \
        pytest.approx(2 * (rtol or 1e-4) + (atol or np.finfo(np.float32).tiny))


def test_error_cause_names_the_raising_op_not_numpy(replace_op):
    # Many references fail inside the same NumPy function; the signature must tell them
    # apart by the innermost frame of this project.
    d = ops.get("Tanh")

    def ref(inputs, attrs):
        return [np.max(inputs[0][:0], axis=0, keepdims=True)]  # zero-size reduction

    replace_op(dataclasses.replace(d, ref=ref))
    outcome = fuzz_check.check(TANH, TANH_FEEDS, INTERPRETER)
    assert outcome.kind == "error", outcome
    assert outcome.cause == "ValueError at test_fuzz.py:ref", outcome.cause
    assert outcome.signature() == "error in autoclust: ValueError at test_fuzz.py:ref"


# ---- isolation (a few cases, in a worker subprocess) ----------------------------------------

def test_worker_checks_cases_like_in_process():
    worker = fuzz.Worker(timeout=120)
    try:
        for i in range(3):
            case = fuzz_gen.case_for(0, i, CLASSIC)
            variants = fuzz.variants_for_case(case, "interpreter")
            assert worker(case.model, case.feeds, variants).kind == "ok"
    finally:
        worker.close()


def test_worker_crash_is_caught_reported_and_shrunk(monkeypatch, tmp_path):
    monkeypatch.setenv(fuzz.INJECT_ENV, "crash:Tanh")
    case = _case_with("Tanh")
    no_tanh = next(fuzz_gen.case_for(9, i, CLASSIC) for i in range(100) if "Tanh" not in
                   {n.op_type for n in fuzz_gen.case_for(9, i, CLASSIC).model.graph.node})
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


def test_onnxruntime_crash_is_its_own_and_never_runs_in_process(monkeypatch, tmp_path):
    # fuzz 81/371: onnxruntime's int32 Div of INT_MIN by -1 dies of SIGFPE. The crash is
    # onnxruntime's (its reference alone kills the worker), and shrinking and the bundle
    # must not run onnxruntime over the model here: that ended the whole fuzz run.
    div = onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 18]>\n'
                                  "g (int32[2] a, int32 b, float[2] x) => (int32[2] y, "
                                  "float[2] z) { y = Div (a, b) z = Neg (x) }")
    feeds = {"a": np.array([-2 ** 31, 7], np.int32), "b": np.array(-1, np.int32),
             "x": np.ones(2, np.float32)}
    case = fuzz_gen.Case(div, feeds, (81, 371))

    ran = []

    def in_process(*args):  # (a raise alone: shrink_nodes takes it for a refusal)
        ran.append(args)
        raise AssertionError("onnxruntime ran over the model in the fuzzer's process")

    monkeypatch.setattr(shrink, "intermediate_values", in_process)
    monkeypatch.setattr(fuzz.repro, "run_ort", in_process)
    worker = fuzz.Worker(timeout=120)
    try:
        variants = [{"device": "interpreter", "min_cluster_size": 1}]
        outcome = worker(div, feeds, variants)
        assert outcome.kind == "crash" and outcome.where == "onnxruntime", outcome
        assert outcome.signature() == "crash in onnxruntime"
        info = fuzz._report(case, variants, outcome, worker, str(tmp_path), "interpreter",
                            lambda line: None)
    finally:
        worker.close()
    assert not ran
    assert [n.op_type for n in onnx.load(info["bundle"] + "/model.onnx").graph.node] == ["Div"]
    meta = json.loads((tmp_path / "case_81_371_crash" / "meta.json").read_text())
    assert "onnxruntime crashes" in meta["expected_error"]


def _injected_outcome(monkeypatch, spec: str, timeout: float) -> fuzz.Outcome:
    """A worker's outcome on a Tanh case with the fault `spec` injected."""
    monkeypatch.setenv(fuzz.INJECT_ENV, spec)
    case = _case_with("Tanh")
    worker = fuzz.Worker(timeout=timeout)
    try:
        return worker(case.model, case.feeds, [])
    finally:
        worker.close()


def test_worker_exit_reports_its_status_not_our_kill(monkeypatch):
    # an exception escaping the oracle ends the worker with a status; it was killed while
    # exiting and reported as "killed by signal 9" (seen triaging fuzz 94/1877)
    outcome = _injected_outcome(monkeypatch, "exit:Tanh", 120)
    assert outcome.kind == "crash" and outcome.message == "worker exited with status 3"


def test_worker_hang_times_out(monkeypatch):
    outcome = _injected_outcome(monkeypatch, "hang:Tanh", 5)
    assert outcome.kind == "crash" and "timed out" in outcome.message


def test_cli_prints_summary_and_exit_status(capsys):
    assert fuzz.main(["--cases", "3", "--seed", "0", "--device", "interpreter",
                      "--features", "classic"]) == 0
    out = capsys.readouterr().out
    assert "graphs 3, mismatches 0, crashes 0" in out


def test_cli_counts_failures_per_cause(monkeypatch, replace_op, capsys):
    _broken_tanh(replace_op)
    status = fuzz.main(["--cases", "30", "--seed", "9", "--device", "interpreter",
                        "--features", "classic", "--in-process"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 1
    causes = lines[lines.index(next(x for x in lines if x.startswith("graphs "))) + 1:]
    assert causes and all(c.split()[0].isdigit() for c in causes), causes
    assert any("Tanh values" in c for c in causes), causes


def test_cli_rejects_unknown_features():
    with pytest.raises(ValueError, match="unknown fuzz feature 'bogus'"):
        fuzz.main(["--cases", "1", "--features", "core,bogus"])
