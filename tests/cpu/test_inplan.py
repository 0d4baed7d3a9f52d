"""GEMM implementations timed in the plan (backends/cpu/inplan.py): the trial's verdict,
a call alternating under it, and the library's trial after its isolated measurement."""

from __future__ import annotations

import json

import numpy as np
import pytest
from autoclust.backends.cpu import choice, inplan, library, onednn
from autoclust.backends.cpu.executable import Executable

RNG = np.random.default_rng(11)
needs_dnnl = pytest.mark.skipif(bool(onednn.unavailable()), reason=f"oneDNN: {onednn.unavailable()}")


def timed(trial: inplan.Trial, first_ms: float, other_ms: float, calls: int) -> list[str]:
    """Feed `calls` calls to `trial`, each side taking its fixed time; the sides run."""
    ran = []
    for _ in range(calls):
        side = trial.side()
        ran.append(side)
        trial.record(side, (first_ms if side == trial.sides[0] else other_ms) / 1e3)
    return ran


def _measured(monkeypatch, answer: str, note: str) -> None:
    """Earlier tests' background work done; every signature's isolated measurement answers
    (answer, note) at once, and nothing is read from a --cache_dir."""
    assert library.wait_background(60)
    monkeypatch.setattr(choice, "measure", lambda key, builders, *a, **k: (answer, note))
    monkeypatch.setattr(choice, "known", lambda key, builders: None)


@pytest.mark.parametrize("first_ms, other_ms, winner", [
    (2.0, 1.0, "onednn"),     # the other side is faster in the plan: it takes over
    (1.0, 2.0, "mlas"),       # the measured answer holds
    (1.0, 0.98, "mlas"),      # 2% is within MARGIN: the measured answer holds
])
def test_trial_alternates_and_decides_once(first_ms, other_ms, winner):
    verdicts = []
    trial = inplan.Trial("mlas", "onednn", lambda w, note: verdicts.append((w, note)))
    ran = timed(trial, first_ms, other_ms, 2 * inplan.MIN_SAMPLES + 4)
    assert ran[:4] == ["mlas", "onednn", "mlas", "onednn"]
    assert len(verdicts) == 1 and verdicts[0][0] == winner
    assert f"mlas {first_ms:.3f} ms, onednn {other_ms:.3f} ms" in verdicts[0][1]
    assert f"medians of {inplan.MIN_SAMPLES} calls each" in verdicts[0][1]


def test_call_in_a_trial_runs_both_then_the_winner():
    """A LibraryFn under a trial alternates its two run functions (both right), timed by
    the trial's clock; not ready, it runs the first untimed; decided, the winner alone."""
    now = [0.0]
    ran: list[str] = []

    def run_of(name: str, cost: float):
        def run(inputs, outputs):
            ran.append(name)
            now[0] += cost
            np.matmul(inputs[0], inputs[1], out=outputs[0])
        return run

    runs = {"mlas": run_of("mlas", 2.0), "onednn": run_of("onednn", 1.0)}
    fn = library.LibraryFn("MatMul", "mlas", runs["mlas"], "measured")
    ready = [False]
    trial = inplan.Trial("mlas", "onednn", lambda w, note: fn.switch(w, runs[w], note),
                         ready=lambda: ready[0], clock=lambda: now[0])
    fn.try_both(trial, runs)
    a, b = RNG.standard_normal((4, 5)).astype(np.float32), RNG.standard_normal((5, 3)).astype(np.float32)
    out = np.empty((4, 3), np.float32)
    fn([a, b], [out])
    assert ran == ["mlas"] and trial.times == {"mlas": [], "onednn": []}  # not ready: untimed
    ready[0] = True
    while library.in_trial(fn):
        out[:] = 0
        fn([a, b], [out])
        np.testing.assert_allclose(out, a @ b, rtol=1e-6)
    assert len(ran) == 1 + 2 * inplan.MIN_SAMPLES
    assert fn.impl == "onednn" and "in the plan: mlas 2000.000 ms" in fn.note
    ran.clear()
    fn([a, b], [out])
    assert ran == ["onednn"]


@needs_dnnl
def test_library_tries_both_in_the_plan_and_remembers(monkeypatch, tmp_path):
    """After the isolated measurement, the calls of one signature (two layers' weights)
    share one in-plan trial; its answer serves both, goes to explain's note and to
    --cache_dir, and a new process takes it without a trial."""
    _measured(monkeypatch, "mlas", "measured mlas 1.000 ms, onednn 1.100 ms (best of 7)")
    choice.use_cache_dir(str(tmp_path))
    in_types = [(np.dtype("float32"), (64, 96)), (np.dtype("float32"), (96, 80))]
    out_types = [(np.dtype("float32"), (64, 80))]
    weights = [RNG.standard_normal((96, 80)).astype(np.float32) for _ in range(2)]
    x = RNG.standard_normal((64, 96)).astype(np.float32)
    try:
        library._DECISIONS.clear()
        fns = [library.make_call("MatMul", {}, in_types, out_types, 2, {1: w}) for w in weights]
        assert library.wait_background(60)
        assert all(library.in_trial(fn) for fn in fns)
        for _ in range(2 * inplan.MIN_SAMPLES):  # a run: each layer's call once
            for fn, w in zip(fns, weights):
                out = np.empty((64, 80), np.float32)
                fn([x, None], [out])
                np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)
        assert not any(library.in_trial(fn) for fn in fns)
        assert len({fn.impl for fn in fns}) == 1 and "; in the plan: mlas" in fns[0].note
        (impl, note), = library.decisions().values()
        assert impl == fns[0].impl and note == fns[0].note
        entries = json.loads((tmp_path / "gemm_choices.json").read_text())
        assert [v for v in entries.values()] == [[impl, note]]
        library._DECISIONS.clear()
        monkeypatch.undo()  # choice.known reads the file again
        choice.use_cache_dir(str(tmp_path))  # a new process
        again = library.make_call("MatMul", {}, in_types, out_types, 2, {1: weights[0]})
        assert library.wait_background(60)
        assert again.impl == impl and not library.in_trial(again)
    finally:
        choice.use_cache_dir(None)
        library._DECISIONS.clear()


def _trial_disagreeing_with_measurement(monkeypatch, layers: int) -> tuple:
    """(in_types, out_types, weights of `layers` layers, x) of a [48, 96] x [96, 72]
    MatMul whose measurement answers MLAS and whose in-plan trial answers oneDNN."""
    _measured(monkeypatch, "mlas", "measured mlas 1.000 ms, onednn 1.100 ms (best of 7)")
    monkeypatch.setattr(inplan.Trial, "verdict",  # the plan disagrees with the measurement
                        lambda self: ("onednn", "in the plan: mlas 2.000 ms, onednn 1.000 ms"))
    in_types = [(np.dtype("float32"), (48, 96)), (np.dtype("float32"), (96, 72))]
    out_types = [(np.dtype("float32"), (48, 72))]
    weights = [RNG.standard_normal((96, 72)).astype(np.float32) for _ in range(layers)]
    return in_types, out_types, weights, RNG.standard_normal((48, 96)).astype(np.float32)


def _run_until_decided(fns: list, weights: list, x: np.ndarray) -> None:
    """Call each layer's fn in turn, as runs of a plan do, until none is in a trial; every
    output equal to x @ its weights."""
    while any(library.in_trial(fn) for fn in fns):
        for fn, w in zip(fns, weights):
            out = np.empty((x.shape[0], w.shape[1]), np.float32)
            fn([x, None], [out])
            np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)


@needs_dnnl
def test_a_call_built_during_the_trial_joins_it(monkeypatch):
    """A call of a signature built after its measurement answered (its in-plan trial
    running: another layer compiled later, a loaded machine) joins the trial and serves
    its winner; one built after the trial decided takes the decision. Left out, it kept
    the measured answer while the trial switched its siblings to the other library (a
    flaky test_library_tries_both_in_the_plan_and_remembers showed it)."""
    in_types, out_types, weights, x = _trial_disagreeing_with_measurement(monkeypatch, 3)
    try:
        library._DECISIONS.clear()
        first = library.make_call("MatMul", {}, in_types, out_types, 2, {1: weights[0]})
        assert library.wait_background(60) and library.in_trial(first)
        late = library.make_call("MatMul", {}, in_types, out_types, 2, {1: weights[1]})
        assert library.in_trial(late) and late.key == first.key
        fns = [first, late]
        _run_until_decided(fns, weights, x)
        assert [fn.impl for fn in fns] == ["onednn", "onednn"]
        after = library.make_call("MatMul", {}, in_types, out_types, 2, {1: weights[2]})
        assert after.impl == "onednn" and not library.in_trial(after)
        assert "in the plan: mlas 2.000 ms" in after.note
    finally:
        library._DECISIONS.clear()


@needs_dnnl
def test_a_call_built_while_the_trial_is_set_up_joins_it(monkeypatch):
    """The window between the measurement's answer and the trial's start: a call built
    then reads the measured answer, finds no trial yet, and must still join the one
    being set up (the background thread is held inside that set-up here). Left out, it
    kept the measured library while the trial could move its sibling to the other (1
    run in 30 of test_library_tries_both_in_the_plan_and_remembers under load)."""
    import threading
    in_types, out_types, weights, x = _trial_disagreeing_with_measurement(monkeypatch, 2)
    inside, go = threading.Event(), threading.Event()
    real_start = library._start_trials

    def held(*args, **kwargs):
        inside.set()
        assert go.wait(30)
        return real_start(*args, **kwargs)
    monkeypatch.setattr(library, "_start_trials", held)
    try:
        library._DECISIONS.clear()
        first = library.make_call("MatMul", {}, in_types, out_types, 2, {1: weights[0]})
        assert inside.wait(30)  # measured; the trial not registered yet
        assert [note[:8] for _, note in library._DECISIONS.values()] == ["measured"]
        second = library.make_call("MatMul", {}, in_types, out_types, 2, {1: weights[1]})
        go.set()
        assert library.wait_background(60)
        fns = [first, second]
        assert all(library.in_trial(fn) for fn in fns)
        _run_until_decided(fns, weights, x)
        assert [fn.impl for fn in fns] == ["onednn", "onednn"]
        assert fns[0].note == fns[1].note
    finally:
        go.set()
        library._DECISIONS.clear()


@needs_dnnl
def test_a_trial_left_undecided_goes_with_its_calls(monkeypatch):
    """The running trials a late call may join are held weakly: calls dropped before
    their trial decided (a cluster handed back to onnxruntime) are freed, their packed
    weights with them, and their trial leaves the table."""
    import gc
    import weakref
    _measured(monkeypatch, "mlas", "measured mlas 1.000 ms, onednn 1.100 ms (best of 7)")
    in_types = [(np.dtype("float32"), (80, 96)), (np.dtype("float32"), (96, 56))]
    out_types = [(np.dtype("float32"), (80, 56))]
    w = RNG.standard_normal((96, 56)).astype(np.float32)
    try:
        library._DECISIONS.clear()
        fn = library.make_call("MatMul", {}, in_types, out_types, 2, {1: w})
        assert library.wait_background(60) and library.in_trial(fn)
        key, gone = fn.key, weakref.ref(fn)
        assert key in library._TRYING
        del fn
        gc.collect()
        assert gone() is None and key not in library._TRYING
    finally:
        library._DECISIONS.clear()


def test_executable_in_a_trial_has_not_settled():
    """Measured placement times an executable only once it has settled: no call of it in
    an in-plan trial."""
    run = lambda inputs, outputs: None
    fn = library.LibraryFn("MatMul", "mlas", run)
    trial = inplan.Trial("mlas", "onednn", lambda w, note: fn.switch(w, run, note))
    holder = type("Exe", (), {"_library": library, "library_fns": {0: fn},
                              "_plan_trial": None,
                              "_calls_settled": Executable._calls_settled})()
    assert library.wait_background(60)
    assert Executable.settled(holder)
    fn.try_both(trial, {"mlas": run, "onednn": run})
    assert not Executable.settled(holder)
    timed(trial, 1.0, 1.0, 2 * inplan.MIN_SAMPLES)
    assert Executable.settled(holder)
    from autoclust.backends.cpu import executable  # the whole plan's trial: pending, running
    for plan_trial in (executable._PENDING, inplan.PlanTrial([], lambda w, note: None)):
        holder._plan_trial = plan_trial
        assert not Executable.settled(holder)


@needs_dnnl
@pytest.mark.parametrize("answer", ["mlas", "onednn"])
def test_an_answer_from_cache_dir_serves_without_a_trial(monkeypatch, answer):
    """A measurement that found another process's answer in --cache_dir (written after
    this call was built) takes it at once: no trial, and no oneDNN packing for MLAS."""
    assert library.wait_background(60)
    cached = "measured mlas 1.000 ms, onednn 0.900 ms (best of 7) (--cache_dir)"
    monkeypatch.setattr(choice, "measure", lambda key, builders, *a, **k: (answer, cached))
    monkeypatch.setattr(choice, "known", lambda key, builders: None)
    built = []
    real = choice.onednn_builder

    def counting(*args, **kwargs):
        build = real(*args, **kwargs)
        return None if build is None else (lambda *a, **k: built.append(1) or build(*a, **k))

    monkeypatch.setattr(choice, "onednn_builder", counting)
    in_types = [(np.dtype("float32"), (64, 96)), (np.dtype("float32"), (96, 80))]
    out_types = [(np.dtype("float32"), (64, 80))]
    w, x = RNG.standard_normal((96, 80)).astype(np.float32), RNG.standard_normal((64, 96)).astype(np.float32)
    try:
        library._DECISIONS.clear()
        fn = library.make_call("MatMul", {}, in_types, out_types, 2, {1: w})
        assert library.wait_background(60)
        assert fn.impl == answer and not library.in_trial(fn), fn.note
        assert built == ([] if answer == "mlas" else [1])
        assert library.plan_trial([fn]) is None  # nor a whole-plan trial
        out = np.empty((64, 80), np.float32)
        fn([x, None], [out])
        np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)
    finally:
        library._DECISIONS.clear()


# ---- the whole plan: its calls as decided, on MLAS alone, on oneDNN alone ----------------

def _noop():
    """A run function of its own (identity tells the implementations apart)."""
    return lambda inputs, outputs: None


def _decided_calls(impls: list[str]) -> tuple[list[library.LibraryFn], dict[str, list]]:
    """LibraryFns decided as `impls`, each with both implementations (as after their
    in-plan trials), and the run functions by variant name."""
    fns, want = [], {"mlas": [], "onednn": [], inplan.DECIDED: []}
    for impl in impls:
        runs = {lib: _noop() for lib in ("mlas", "onednn")}
        fn = library.LibraryFn("MatMul", impl, runs[impl], "measured")
        fn.alternatives = runs
        fns.append(fn)
        for name in ("mlas", "onednn"):
            want[name].append(runs[name])
        want[inplan.DECIDED].append(runs[impl])
    return fns, want


@pytest.mark.parametrize("ms, winner", [
    ({inplan.DECIDED: 2.0, "mlas": 1.0, "onednn": 2.1}, "mlas"),
    ({inplan.DECIDED: 2.0, "mlas": 1.9, "onednn": 1.0}, "onednn"),
    ({inplan.DECIDED: 1.0, "mlas": 0.98, "onednn": 1.5}, inplan.DECIDED),  # within MARGIN
])
def test_plan_trial_times_each_variant_after_an_untimed_run(ms, winner):
    fns, want = _decided_calls(["mlas", "onednn"])
    verdicts: list[tuple[str, str]] = []
    trial = inplan.PlanTrial(fns, lambda w, note: verdicts.append((w, note)))
    seen = []
    while not trial.done:
        name, is_timed = trial.variant()
        seen.append((name, is_timed))
        assert [fn._current[0] for fn in fns] == want[name]  # the calls run the variant
        if is_timed:
            trial.record(name, ms[name] / 1e3)
    names = [inplan.DECIDED, "mlas", "onednn"]
    assert seen[:6] == [(n, t) for n in names for t in (False, True)]
    assert len(seen) == 2 * len(names) * inplan.PLAN_SAMPLES
    assert [fn._current[0] for fn in fns] == want[winner]
    (got, note), = verdicts
    assert got == winner and note == (
        f"whole plan: as decided {ms[inplan.DECIDED]:.3f} ms, mlas {ms['mlas']:.3f} ms, "
        f"onednn {ms['onednn']:.3f} ms (medians of {inplan.PLAN_SAMPLES} runs each)")


def test_plan_trial_skips_a_library_every_call_already_runs():
    fns, _ = _decided_calls(["onednn", "onednn"])
    trial = inplan.PlanTrial(fns, lambda w, note: None)
    assert list(trial.times) == [inplan.DECIDED, "mlas"]


def _chain(n: int = 4):
    """x [1, 64, 256] through n MatMuls (256x1024, 1024x256, ...: library calls, not
    generated code), each with its own weights."""
    from onnx import TensorProto, helper, numpy_helper
    nodes, inits, cur, dims = [], [], "x", [256, 1024]
    for i in range(n):
        k, m = dims[i % 2], dims[(i + 1) % 2]
        inits.append(numpy_helper.from_array(RNG.standard_normal((k, m)).astype(np.float32) / 10,
                                             f"w{i}"))
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"y{i}"]))
        cur = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 64, 256])], [helper.make_tensor_value_info(
            cur, TensorProto.FLOAT, [1, 64, dims[n % 2]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@needs_dnnl
def test_an_executable_runs_its_plan_trial_and_its_calls_take_the_winner(monkeypatch, tmp_path):
    """A chain of GEMMs whose calls' own trials keep oneDNN: the executable's plan trial
    (times injected: the plan on MLAS alone fastest) switches every call to MLAS, says so
    in their notes and in --cache_dir, and the outputs stay onnxruntime's."""
    import onnxruntime as ort

    import autoclust
    _measured(monkeypatch, "onednn", "measured mlas 1.100 ms, onednn 1.000 ms (best of 7)")
    monkeypatch.setattr(inplan.Trial, "verdict",  # the calls' own trials keep oneDNN
                        lambda self: (self.sides[0], "in the plan: kept"))
    real_record = inplan.PlanTrial.record
    fake = {inplan.DECIDED: 2e-3, "mlas": 1e-3, "onednn": 2e-3}
    monkeypatch.setattr(inplan.PlanTrial, "record",
                        lambda self, name, seconds: real_record(self, name, fake[name]))
    model = _chain()
    x = {"x": RNG.standard_normal((1, 64, 256)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    library._DECISIONS.clear()
    try:
        sess = autoclust.InferenceSession(model, min_cluster_size=1, autotune=False,
                                          cache_dir=str(tmp_path), cpu_packed_gemm=False)
        exe = None
        for _ in range(80):
            np.testing.assert_allclose(sess.run(None, x)[0], want, rtol=1e-4, atol=1e-4)
            (exe,) = sess._runtime.compiled_clusters()[0].cache.values()
            if exe.settled():
                break
        assert exe is not None and exe.settled() and exe._plan_trial is None
        fns = list(exe.library_fns.values())
        assert len(fns) == 4 and all(fn.impl == "mlas" for fn in fns), [fn.note for fn in fns]
        assert all("; whole plan: as decided 2.000 ms, mlas 1.000 ms" in fn.note for fn in fns)
        assert all(not fn.alternatives for fn in fns)
        entries = json.loads((tmp_path / "gemm_choices.json").read_text())
        assert sorted(v[0] for v in entries.values()) == ["mlas", "mlas"]
    finally:
        choice.use_cache_dir(None)
        library._DECISIONS.clear()


def test_a_plan_trial_that_only_meets_other_lengths_ends_as_decided():
    """A shape class serving a stream of other lengths times none of them: after
    PLAN_ELSEWHERE such runs the trial ends with its calls as decided, and the executable
    settles."""
    from autoclust.backends.cpu import executable
    fns, want = _decided_calls(["onednn", "mlas"])
    trial = library.plan_trial(fns)
    assert trial is not None
    trial.shapes = [(1, 64, 256)]
    trial.variant()
    trial.variant()
    trial.variant()  # an untimed run of the MLAS variant applied
    holder = type("Exe", (), {"_plan_trial": trial, "_run": lambda self, inputs: inputs,
                              "_calls_settled": lambda self: True})()
    other = [np.zeros((1, 32, 256), np.float32)]
    for _ in range(executable.PLAN_ELSEWHERE + 1):
        assert Executable._trial_step(holder, other) is other
    assert holder._plan_trial is None and trial.done
    assert [fn._current[0] for fn in fns] == want[inplan.DECIDED]
    assert all(not fn.alternatives for fn in fns)
