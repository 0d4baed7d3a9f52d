"""Measured placement (autoclust/runtime/autotune.py): each cluster against onnxruntime.

The decision logic runs on injected times (a fake clock, or Trial._time patched to report
fixed milliseconds per side) so it cannot flake; the runs themselves are real, so the
outputs served after a decision are checked against onnxruntime. One end-to-end test
measures with the real clock and checks only what holds whoever wins.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from autoclust.models import zoo

import autoclust
from autoclust.runtime import autotune
from autoclust.runtime.autotune import COMPILED, ONNXRUNTIME


@pytest.mark.parametrize("compiled, onnx_rt, final, want", [
    ([10, 10, 10], [12, 12.5, 11], False, COMPILED),      # faster in every pair
    ([12, 12.5, 11], [10, 10, 10], False, ONNXRUNTIME),   # slower in every pair
    ([10, 10], [5, 5], False, None),                      # too few pairs to say
    ([10, 10], [5, 5], True, COMPILED),                   # and no more coming: keep
    ([10, 10, 10], [12, 9, 11], False, None),             # mixed: more pairs wanted
    ([10] * 9, [10.1, 9.9, 10.2, 9.8, 10, 10.1, 9.9, 10, 10], False, COMPILED),  # noise
    ([10] * 9, [9, 9.2, 11, 8.9, 9.1, 9.3, 10.5, 9, 9.2], False, ONNXRUNTIME),  # median
    ([10] * 9, [9.8, 9.9, 9.75, 9.9, 9.8, 9.85, 9.9, 9.8, 9.9], False, COMPILED),  # <3%
    # the median pair says onnxruntime, the sides' medians do not (load moved): keep
    ([10, 11, 12, 13, 14, 1, 1, 1, 1], [9.6, 10.6, 11.6, 12.6, 13.5, 20, 20, 20, 20], False,
     COMPILED),
])
def test_decide(compiled, onnx_rt, final, want):
    verdict = autotune.decide(compiled, onnx_rt, final)
    assert (verdict and verdict[0]) == want, verdict


@pytest.mark.parametrize("compiled, onnx_rt, want", [
    ([10] * 9, [9.8, 9.9, 9.75, 9.9, 9.8, 9.85, 9.9, 9.8, 9.9], ONNXRUNTIME),  # 1.5% slower
    ([10] * 9, [10.2, 10.1, 10.25, 10.1, 10.2, 10.15, 10.1, 10.2, 10.1], COMPILED),  # faster
    ([10] * 9, [10] * 9, COMPILED),                        # a dead heat: no reason to move
    ([10, 10], [5, 5], COMPILED),                          # too few pairs: keep, as before
])
def test_whole_model_ties_go_to_onnxruntime(compiled, onnx_rt, want):
    """The whole model's trial: within noise, a plan that is not faster in the median
    hands the model to onnxruntime (the baseline itself); a cluster keeps compiled code."""
    verdict = autotune.decide(compiled, onnx_rt, final=True, ties=ONNXRUNTIME)
    assert verdict[0] == want, verdict
    if want == ONNXRUNTIME:
        assert autotune.decide(compiled, onnx_rt, final=True)[0] == COMPILED


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeSide:
    """run() advances the fake clock by `ms` and returns its name."""

    def __init__(self, clock: FakeClock, ms: float, name: str):
        self.clock, self.ms, self.name, self.runs = clock, ms, name, 0

    def run(self, inputs):
        self.runs += 1
        self.clock.now += self.ms / 1e3
        return [self.name]


def _trial(compiled_ms, ort_ms, budget_ms=10_000, settled=lambda: True, min_pairs=0):
    clock = FakeClock()
    exe, seg = FakeSide(clock, compiled_ms, "compiled"), FakeSide(clock, ort_ms, "ort")
    done = []
    budget = autotune.Budget(budget_ms)
    trial = autotune.Trial("c0", "float32[4]", exe, lambda: seg, budget,
                           lambda d, w: done.append((d, w)), clock, settled,
                           min_pairs=min_pairs)
    return trial, exe, seg, done, budget


def test_trial_hands_back_a_cluster_that_loses():
    trial, _exe, seg, done, _ = _trial(12.0, 10.0)
    for _ in range(10):
        assert trial.run([]) == ["compiled"]  # compiled outputs until the decision
        if done:
            break
    (decision, winner), = done
    assert winner is seg and decision.winner == ONNXRUNTIME
    assert decision.compiled_ms == pytest.approx(12.0) and decision.onnxruntime_ms == \
        pytest.approx(10.0)
    assert decision.pairs == autotune.MIN_PAIRS and "faster in all 3" in decision.reason


def test_trial_keeps_a_cluster_that_wins():
    trial, exe, _seg, done, _ = _trial(8.0, 10.0)
    while not done:
        trial.run([])
    (decision, winner), = done
    assert winner is exe and decision.winner == COMPILED
    assert decision.compiled_ms == pytest.approx(8.0)
    assert "faster in all 3 paired runs, by 25%" in decision.reason


def test_trial_waits_for_the_executable_to_settle():
    ready = [False]
    trial, _exe, seg, done, _ = _trial(12.0, 10.0, settled=lambda: ready[0])
    for _ in range(5):
        trial.run([])
    assert seg.runs == 0 and not done  # background prepacking: nothing timed yet
    ready[0] = True
    while not done:
        trial.run([])
    assert done[0][0].winner == ONNXRUNTIME


def test_trial_waits_for_a_slow_settle_then_measures_and_says_so():
    """GPT-2's executable takes ~100 runs (5 s) to settle; a trial measuring it at its 20th
    run (the old limit) handed it back for good. It waits SETTLE_RUNS runs or SETTLE_S
    seconds, then measures and names the doubt in the reason."""
    trial, exe, seg, done, _ = _trial(8.0, 10.0, settled=lambda: False)
    for _ in range(100):  # 0.8 s of fake time: still waiting
        trial.run([])
    assert seg.runs == 0 and not done
    while not done:
        trial.run([])
    assert exe.runs >= autotune.SETTLE_RUNS or trial.clock() >= autotune.SETTLE_S
    (decision, _), = done
    assert decision.winner == COMPILED
    assert decision.reason.startswith("measured before the executable settled; faster")
    # the time bound: long runs stop waiting after SETTLE_S seconds
    trial, exe, seg, done, _ = _trial(1000.0, 10.0, settled=lambda: False)
    while not done:
        trial.run([])
    assert autotune.SETTLE_S <= 1000 * exe.runs / 1e3 < autotune.SETTLE_S + 10
    assert done[0][0].winner == ONNXRUNTIME


def test_trial_respects_the_budget():
    # onnxruntime's warm-up costs 10 ms; a pair 30 ms beside the caller's compiled run
    # (each side one untimed and one timed run): a 45 ms budget allows one pair
    trial, exe, seg, done, budget = _trial(10.0, 10.0, budget_ms=45)
    for _ in range(20):
        trial.run([])
    (decision, winner), = done
    assert decision.winner == COMPILED and winner is exe
    assert "measuring budget spent" in decision.reason and decision.pairs == 1
    assert budget.spent_ms == pytest.approx(40)
    assert seg.runs == 3  # warm-up, then one untimed and one timed run


def test_long_runs_are_timed_without_an_untimed_run():
    """Sides running longer than WARM_S are timed without an untimed run before each: a
    pair costs onnxruntime's one run (BERT-base at 170 ms a run got four pairs in the 3 s
    budget with them, kept a plan 0.90x onnxruntime on a lucky window)."""
    ms = autotune.WARM_S * 2e3
    trial, exe, seg, done, budget = _trial(ms, ms, budget_ms=ms * 4.5)
    for _ in range(20):
        trial.run([])
    (decision, _), = done
    assert decision.pairs == 3 and "measuring budget spent" in decision.reason
    assert seg.runs == 1 + 3 and exe.runs == 20 + 1  # warm-up, then the timed runs only
    assert budget.spent_ms == pytest.approx(4 * ms)


def test_a_first_trial_takes_its_pairs_whatever_the_budget():
    """min_pairs (a cluster's or a model's first signature): nothing is kept unmeasured,
    even with the budget spent before the first pair."""
    trial, exe, seg, done, _ = _trial(12.0, 10.0, budget_ms=0,
                                           min_pairs=autotune.MIN_PAIRS)
    for _ in range(20):
        trial.run([])
    (decision, winner), = done
    assert winner is seg and decision.pairs == autotune.MIN_PAIRS
    assert "onnxruntime faster in all 3" in decision.reason
    trial, exe, seg, done, _ = _trial(12.0, 10.0, budget_ms=0)  # a later signature
    for _ in range(20):
        trial.run([])
    (decision, winner), = done
    assert winner is exe and decision.pairs == 0 and "not measured" in decision.reason


def test_trial_keeps_compiled_when_onnxruntime_fails():
    clock = FakeClock()
    exe = FakeSide(clock, 1.0, "compiled")
    done = []

    def broken():
        raise RuntimeError("no kernel for op X")

    trial = autotune.Trial("c0", "sig", exe, broken, autotune.Budget(1000),
                           lambda d, w: done.append((d, w)), clock)
    assert trial.run([]) == ["compiled"]
    assert done[0][1] is exe and "onnxruntime cannot run the subgraph" in done[0][0].reason


# ---- in a session: injected times, real runs ---------------------------------------------

def _inject(monkeypatch, compiled_ms: float, ort_ms: float) -> None:
    """Trial._time reports fixed times (the runs still happen: outputs stay real)."""
    def timed(self, side, inputs):
        outs = side.run(inputs)
        ms = compiled_ms if side is self.exe else ort_ms
        return ms * self.repeat / 1e3, outs
    monkeypatch.setattr(autotune.Trial, "_time", timed)


def _session(**flags):
    model = zoo.build("mlp_gelu")
    return model, zoo.feeds(model), autoclust.InferenceSession(model, **flags)


def _run_until_decided(sess, feeds, runs=12):
    """`runs` runs, then on while a trial decides or its winner is watched (Watch)."""
    for _ in range(runs):
        out = sess.run(None, feeds)
    for _ in range(80):
        if not autotune.measuring(sess._runtime):
            break
        out = sess.run(None, feeds)
    return out


def test_session_hands_back_a_losing_cluster(monkeypatch, tmp_path):
    _inject(monkeypatch, compiled_ms=5.0, ort_ms=2.0)
    model, feeds, sess = _session(cache_dir=str(tmp_path))
    got = _run_until_decided(sess, feeds)
    runner = sess._runtime.compiled_clusters()[0]
    (target,) = runner.route.values()
    assert target is runner.onnxruntime_segment()  # onnxruntime serves the cluster now
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    text = sess.explain()
    assert "handed back to onnxruntime: compiled 5.000 ms, onnxruntime 2.000 ms" in text, text
    (entry,) = sess.explain(as_json=True)["placement"]
    assert entry["winner"] == ONNXRUNTIME and entry["compiled_ms"] == pytest.approx(5.0)
    assert "onnxruntime faster in all 3 paired runs, by 150%" in entry["reason"]
    # a second session with the same --cache_dir reads the decision: no compile at all
    monkeypatch.setattr(autotune.Trial, "_time", None)  # measuring again would crash
    again = autoclust.InferenceSession(model, cache_dir=str(tmp_path))
    got2 = _run_until_decided(again, feeds, runs=3)
    np.testing.assert_allclose(got2[0], want[0], rtol=1e-5, atol=1e-6)
    assert again.stats()["clusters"][0]["compiles"] == 0
    (entry2,) = again.explain(as_json=True)["placement"]
    assert entry2["source"] == "cache" and entry2["onnxruntime_ms"] == pytest.approx(2.0)
    assert "[cache]" in again.explain()


def test_session_keeps_a_winning_cluster(monkeypatch, tmp_path):
    _inject(monkeypatch, compiled_ms=1.0, ort_ms=3.0)
    _, feeds, sess = _session(cache_dir=str(tmp_path))
    _run_until_decided(sess, feeds)
    runner = sess._runtime.compiled_clusters()[0]
    (target,) = runner.route.values()
    assert target is next(iter(runner.cache.values()))
    assert "kept compiled: compiled 1.000 ms, onnxruntime 3.000 ms" in sess.explain()
    monkeypatch.setattr(autotune.Trial, "_time", None)
    again = autoclust.InferenceSession(zoo.build("mlp_gelu"), cache_dir=str(tmp_path))
    _run_until_decided(again, feeds, runs=3)
    assert again.stats()["clusters"][0]["compiles"] == 1  # compiled, not measured again
    assert again.explain(as_json=True)["placement"][0]["source"] == "cache"


@pytest.mark.parametrize("flags", [{"must_compile": True}, {"autotune": False}])
def test_flags_keep_everything_compiled(monkeypatch, flags):
    _inject(monkeypatch, compiled_ms=5.0, ort_ms=1.0)
    _, feeds, sess = _session(**flags)
    _run_until_decided(sess, feeds)
    runner = sess._runtime.compiled_clusters()[0]
    assert runner.tuner is None and sess.plan.placement == []
    assert list(runner.route.values()) == list(runner.cache.values())
    assert "Measured placement" not in sess.explain()


def test_budget_spent_inherits_the_last_decision(monkeypatch):
    _inject(monkeypatch, compiled_ms=5.0, ort_ms=2.0)
    model = zoo.build("mlp_gelu")
    # concrete shapes: a new batch size is a compile of its own, not a shape class's
    sess = autoclust.InferenceSession(model, symbolic_dims=False)
    feeds = zoo.feeds(model)
    _run_until_decided(sess, feeds)
    sess._runtime.placement.budget.spent_ms = 1e9  # no budget left for the next signature
    name = sess.get_inputs()[0].name
    other = {name: np.concatenate([feeds[name]] * 2)}  # a new batch size
    sess.run(None, other)
    second = sess.explain(as_json=True)["placement"][1]
    assert second["source"] == "inherited" and second["winner"] == ONNXRUNTIME
    assert "measuring budget spent" in second["reason"]


@pytest.mark.parametrize("compiled_ms, winner", [(5.0, ONNXRUNTIME), (1.0, COMPILED)])
def test_a_new_length_takes_its_shape_class_decision(monkeypatch, compiled_ms, winner):
    """A signature bound to a shape class measured before (a new batch size of the same
    compile) takes that decision without a Trial: no pairs, no onnxruntime session built
    for it; its outputs are onnxruntime's either way."""
    _inject(monkeypatch, compiled_ms=compiled_ms, ort_ms=2.0)
    model, feeds, sess = _session()
    _run_until_decided(sess, feeds)
    runner = sess._runtime.compiled_clusters()[0]
    assert len(runner.classes) == 1 and sess.plan.placement[0].winner == winner
    name = sess.get_inputs()[0].name
    other = {name: np.concatenate([feeds[name]] * 3)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, other)
    got = sess.run(None, other)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    second = sess.explain(as_json=True)["placement"][1]
    assert second["source"] == "inherited" and second["winner"] == winner
    assert "the same shape class" in second["reason"] and second["pairs"] == 0
    target = runner.route[runner.signature(list(other.values()))]
    assert not isinstance(target, autotune.Trial)
    assert (target is runner.onnxruntime_segment()) == (winner == ONNXRUNTIME)


def test_a_new_length_takes_the_cached_decision_of_its_shape_class(monkeypatch, tmp_path):
    """A second process (a session on the same --cache_dir) reads its first signature's
    decision from the cache; a new batch size bound to the same shape class then takes
    that decision too, without a Trial or an onnxruntime session built to measure it."""
    _inject(monkeypatch, compiled_ms=1.0, ort_ms=3.0)
    model, feeds, sess = _session(cache_dir=str(tmp_path))
    _run_until_decided(sess, feeds)
    monkeypatch.setattr(autotune.Trial, "_time", None)  # measuring again would crash
    again = autoclust.InferenceSession(model, cache_dir=str(tmp_path))
    again.run(None, feeds)
    name = again.get_inputs()[0].name
    other = {name: np.concatenate([feeds[name]] * 3)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, other)
    np.testing.assert_allclose(again.run(None, other)[0], want[0], rtol=1e-5, atol=1e-6)
    first, second = again.explain(as_json=True)["placement"]
    assert first["source"] == "cache" and first["winner"] == COMPILED
    assert second["source"] == "inherited" and second["winner"] == COMPILED
    assert "the same shape class" in second["reason"] and second["pairs"] == 0
    runner = again._runtime.compiled_clusters()[0]
    assert len(runner.classes) == 1 and runner._stand_in is None  # no onnxruntime built
    assert not any(isinstance(t, autotune.Trial) for t in runner.route.values())


def test_log_shows_decision_and_budget(monkeypatch, capsys):
    _inject(monkeypatch, compiled_ms=1.0, ort_ms=3.0)
    _, feeds, sess = _session(log=True, autotune_budget_ms=500)
    _run_until_decided(sess, feeds)
    err = capsys.readouterr().err
    assert "autoclust: placement: cluster_0000" in err and "kept compiled" in err
    assert "of 500 ms used" in err


def test_end_to_end_real_clock():
    model, feeds, sess = _session()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for _ in range(autotune.MAX_PAIRS + autotune.SETTLE_RUNS + 2):
        got = sess.run(None, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        if sess.plan.placement:
            break
    _run_until_decided(sess, feeds, runs=0)  # its winner watched, then standing
    d = sess.plan.placement[-1]  # a second look's, if the winner ran slower as it served
    assert len(sess.plan.placement) <= 2
    assert d.source == "measured" and d.pairs >= autotune.MIN_PAIRS
    assert d.compiled_ms > 0 and d.onnxruntime_ms > 0
    runner = sess._runtime.compiled_clusters()[0]
    (target,) = runner.route.values()
    winner = runner.onnxruntime_segment() if d.winner == ONNXRUNTIME else \
        next(iter(runner.cache.values()))
    assert target is winner


# ---- the whole plan against onnxruntime over the whole model ----------------------------

def _inject_whole(monkeypatch, plan_ms: float, whole_ort_ms: float) -> None:
    """Clusters win their own trials (1 ms against 2); the whole plan takes plan_ms against
    onnxruntime's whole_ort_ms."""
    def timed(self, side, inputs):
        outs = side.run(inputs)
        if isinstance(side, autotune._PlanSide):
            ms = plan_ms
        elif isinstance(side, autotune._OrtSide):
            ms = whole_ort_ms
        else:
            ms = 1.0 if side is self.exe else 2.0
        return ms * self.repeat / 1e3, outs
    monkeypatch.setattr(autotune.Trial, "_time", timed)


def test_whole_plan_handed_back_when_boundaries_lose(monkeypatch, tmp_path):
    # mixed_dynamic: 4 small clusters around an onnxruntime segment (NonZero, TopK)
    _inject_whole(monkeypatch, plan_ms=5.0, whole_ort_ms=2.0)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, cache_dir=str(tmp_path))
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for _ in range(15 + autotune.WATCH_LOOKS * autotune.WATCH_RUNS):
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.shape, w.shape)
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    decisions = sess.explain(as_json=True)["placement"]
    assert [d["winner"] for d in decisions] == [COMPILED] * 4 + [ONNXRUNTIME], decisions
    assert decisions[-1]["cluster"] == autotune.WHOLE
    assert "whole model" in sess.explain() and "onnxruntime 2.000 ms" in sess.explain()
    assert isinstance(next(iter(sess._runtime.whole.route.values())), autotune._OrtSide)
    # a second session reads all five decisions and measures nothing
    monkeypatch.setattr(autotune.Trial, "_time", None)
    again = autoclust.InferenceSession(model, cache_dir=str(tmp_path))
    _run_until_decided(again, feeds, runs=4)  # the cached winner watched, then standing
    assert [d["source"] for d in again.explain(as_json=True)["placement"]] == ["cache"] * 5
    assert not autotune.measuring(again._runtime)


def _whole_session(monkeypatch, plan_ms: float, whole_ort_ms: float, **flags):
    """(model, feeds, session) of mixed_dynamic (4 clusters, onnxruntime segments) run until
    its whole plan's first trial has decided; its winner is then watched (a Watch)."""
    _inject_whole(monkeypatch, plan_ms=plan_ms, whole_ort_ms=whole_ort_ms)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, **flags)
    for _ in range(30):
        sess.run(None, feeds)
        if any(isinstance(t, autotune.Watch) for t in sess._runtime.whole.route.values()):
            return model, feeds, sess
    pytest.fail(f"the whole plan did not decide: {sess.explain()}")


def _whole_decided(monkeypatch, plan_ms: float, whole_ort_ms: float):
    """(model, feeds, session) after enough runs to decide the whole plan's placement, its
    winner watched and standing."""
    model, feeds, sess = _whole_session(monkeypatch, plan_ms, whole_ort_ms)
    _run_until_decided(sess, feeds, runs=0)
    return model, feeds, sess


def test_whole_plan_kept_when_it_wins(monkeypatch):
    _, _, sess = _whole_decided(monkeypatch, plan_ms=1.0, whole_ort_ms=2.0)
    whole = sess.explain(as_json=True)["placement"][-1]
    assert whole["cluster"] == autotune.WHOLE and whole["winner"] == COMPILED
    assert isinstance(next(iter(sess._runtime.whole.route.values())), autotune._PlanSide)


class _Steps:
    """A clock whose every read is `step_ms` after the last: a watched run (two reads) then
    takes exactly step_ms."""

    def __init__(self, step_ms: float):
        self.now, self.step = 0.0, step_ms / 1e3

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _watched_runs(sess, feeds, route: dict, ms: float, runs: int) -> None:
    """`runs` runs of a session whose first trial's winner is watched in `route`, each
    timed by the watch at `ms`."""
    (watch,) = route.values()
    assert isinstance(watch, autotune.Watch), watch
    watch.clock = _Steps(ms)
    watch.times.clear()  # runs before this one were timed by the real clock
    for _ in range(runs):
        sess.run(None, feeds)


def test_a_kept_plan_slower_as_it_serves_gets_a_second_look(monkeypatch, tmp_path):
    """The whole plan wins its trial (1 ms against onnxruntime's 2), then runs at 3 ms as it
    serves: the first look (WATCH_RUNS runs) starts a second trial, which hands it back,
    says why in explain and replaces the --cache_dir entry."""
    model, feeds, sess = _whole_session(monkeypatch, 1.0, 2.0, cache_dir=str(tmp_path))
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert sess.explain(as_json=True)["placement"][-1]["winner"] == COMPILED
    assert autotune.measuring(sess._runtime)  # watched: not the steady state yet
    route = sess._runtime.whole.route
    _watched_runs(sess, feeds, route, ms=3.0, runs=autotune.WATCH_RUNS)
    assert isinstance(next(iter(route.values())), autotune.Trial)
    _inject_whole(monkeypatch, plan_ms=3.0, whole_ort_ms=2.0)  # the second trial sees it
    for _ in range(6):
        sess.run(None, feeds)
    decisions = sess.explain(as_json=True)["placement"]
    last = decisions[-1]
    assert last["cluster"] == autotune.WHOLE and last["winner"] == ONNXRUNTIME, last
    assert last["reason"].startswith("second look: compiled ran 3.000 ms as it served, "
                                     "onnxruntime 2.000 ms in the first trial: "), last
    assert [d["winner"] for d in decisions].count(ONNXRUNTIME) == 1
    assert isinstance(next(iter(route.values())), autotune._OrtSide)
    assert not autotune.measuring(sess._runtime) and len(sess._direct) == 1
    for g, w in zip(sess.run(None, feeds), want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # the next process reads the second decision, and looks at it as it serves
    monkeypatch.setattr(autotune.Trial, "_time", None)
    again = autoclust.InferenceSession(model, cache_dir=str(tmp_path))
    for _ in range(4):
        again.run(None, feeds)
    whole = again.explain(as_json=True)["placement"][-1]
    assert whole["source"] == "cache" and whole["winner"] == ONNXRUNTIME, whole
    (watch,) = again._runtime.whole.route.values()
    assert isinstance(watch, autotune.Watch) and watch.loser_ms == pytest.approx(3.0)


def test_a_handed_back_plan_slower_as_it_serves_gets_a_second_look(monkeypatch):
    """onnxruntime wins the first trial (2 ms against the plan's 5) and runs at 6 ms as it
    serves: the second trial keeps the plan. The session's direct onnxruntime call waits
    for the decision to stand."""
    _, feeds, sess = _whole_session(monkeypatch, 5.0, 2.0)
    assert sess.explain(as_json=True)["placement"][-1]["winner"] == ONNXRUNTIME
    assert not sess._direct  # watched: still routed
    route = sess._runtime.whole.route
    _inject_whole(monkeypatch, plan_ms=1.0, whole_ort_ms=2.0)
    _watched_runs(sess, feeds, route, ms=6.0, runs=autotune.WATCH_RUNS + 6)
    last = sess.explain(as_json=True)["placement"][-1]
    assert last["winner"] == COMPILED and last["reason"].startswith(
        "second look: onnxruntime ran 6.000 ms as it served, compiled 5.000 ms"), last
    assert isinstance(next(iter(route.values())), autotune._PlanSide)
    assert not sess._direct


def test_a_second_look_takes_its_pairs_with_the_budget_nearly_spent(monkeypatch):
    """A second look decides for good, so it takes its MIN_PAIRS pairs once started: with
    less budget left than a pair costs it had decided on no pair ("not measured") and
    handed a plan onnxruntime had beaten to the compiled side."""
    _, feeds, sess = _whole_session(monkeypatch, 5.0, 2.0)
    budget = sess._runtime.whole.budget
    budget.spent_ms = budget.total_ms - 1e-3  # budget left, less than any pair costs
    _watched_runs(sess, feeds, sess._runtime.whole.route, ms=6.0, runs=autotune.WATCH_RUNS + 6)
    last = sess.explain(as_json=True)["placement"][-1]
    assert last["reason"].startswith("second look: onnxruntime ran 6.000 ms"), last
    assert last["winner"] == ONNXRUNTIME and last["pairs"] == autotune.MIN_PAIRS, last
    assert isinstance(next(iter(sess._runtime.whole.route.values())), autotune._OrtSide)


@pytest.mark.parametrize("plan_ms, ort_ms, served_ms, side", [
    (1.0, 2.0, 2.05, autotune._PlanSide),  # within MARGIN of onnxruntime's 2 ms
    (5.0, 2.0, 5.1, autotune._OrtSide)])   # within MARGIN of the plan's 5 ms
def test_a_winner_as_fast_as_its_trial_stands(monkeypatch, plan_ms, ort_ms, served_ms, side):
    _, feeds, sess = _whole_session(monkeypatch, plan_ms, ort_ms)
    n = len(sess.explain(as_json=True)["placement"])
    route = sess._runtime.whole.route
    _watched_runs(sess, feeds, route, ms=served_ms,
                  runs=autotune.WATCH_LOOKS * autotune.WATCH_RUNS)
    assert isinstance(next(iter(route.values())), side)
    assert not autotune.measuring(sess._runtime)
    assert len(sess.explain(as_json=True)["placement"]) == n
    assert len(sess._direct) == (side is autotune._OrtSide)


def test_a_second_look_decides_for_good(monkeypatch):
    _, feeds, sess = _whole_session(monkeypatch, 1.0, 2.0)
    _watched_runs(sess, feeds, sess._runtime.whole.route, ms=3.0, runs=autotune.WATCH_RUNS)
    for _ in range(6):  # the second trial reads the plan faster again (1 ms against 2)
        sess.run(None, feeds)
    last = sess.explain(as_json=True)["placement"][-1]
    assert last["winner"] == COMPILED and last["reason"].startswith("second look"), last
    (kept,) = sess._runtime.whole.route.values()
    assert isinstance(kept, autotune._PlanSide)  # no third trial, however it runs


def test_a_second_look_needs_budget(monkeypatch):
    _, feeds, sess = _whole_session(monkeypatch, 1.0, 2.0)
    n = len(sess.explain(as_json=True)["placement"])
    sess._runtime.whole.budget.spent_ms = 1e9
    _watched_runs(sess, feeds, sess._runtime.whole.route, ms=3.0, runs=autotune.WATCH_RUNS)
    (kept,) = sess._runtime.whole.route.values()
    assert isinstance(kept, autotune._PlanSide)
    assert len(sess.explain(as_json=True)["placement"]) == n


def test_a_one_cluster_plans_cluster_is_watched(monkeypatch):
    """A plan that is one cluster has no whole-plan trial: its cluster's winner is watched.
    Kept compiled (1 ms against onnxruntime's 3), it runs at 4 ms: the second trial hands
    it back. Among several clusters (mixed_dynamic) a cluster's decision is not watched
    (the whole plan's is)."""
    _inject(monkeypatch, compiled_ms=1.0, ort_ms=3.0)
    model, feeds, sess = _session()
    runner = sess._runtime.compiled_clusters()[0]
    for _ in range(12):
        sess.run(None, feeds)
    _inject(monkeypatch, compiled_ms=5.0, ort_ms=3.0)
    _watched_runs(sess, feeds, runner.route, ms=4.0, runs=autotune.WATCH_RUNS + 6)
    last = sess.explain(as_json=True)["placement"][-1]
    assert last["winner"] == ONNXRUNTIME and last["reason"].startswith(
        "second look: compiled ran 4.000 ms as it served, onnxruntime 3.000 ms"), last
    assert next(iter(runner.route.values())) is runner.onnxruntime_segment()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-6)
    _, _, several = _whole_decided(monkeypatch, plan_ms=1.0, whole_ort_ms=2.0)
    assert not any(isinstance(t, autotune.Watch) for r in several._runtime.compiled_clusters()
                   for t in r.route.values())


def test_whole_plan_within_noise_but_slower_goes_back(monkeypatch):
    """2% slower than onnxruntime over the whole model: within the margin, so a cluster
    would stay compiled, but the whole model goes to onnxruntime."""
    _, _, sess = _whole_decided(monkeypatch, plan_ms=2.04, whole_ort_ms=2.0)
    whole = sess.explain(as_json=True)["placement"][-1]
    assert whole["cluster"] == autotune.WHOLE and whole["winner"] == ONNXRUNTIME, whole
    assert "within noise and not faster" in whole["reason"]
    assert isinstance(next(iter(sess._runtime.whole.route.values())), autotune._OrtSide)


@pytest.mark.parametrize("compiled_ms, winner", [(2.04, ONNXRUNTIME), (1.98, COMPILED)])
def test_a_one_cluster_plans_tie_goes_as_the_whole_models(monkeypatch, compiled_ms, winner):
    """A plan that is one cluster: its trial is the whole model's, so a tie not faster in
    the median goes to onnxruntime (DeiT's one cluster, kept "within noise (median ratio
    0.970)", read 0.96x); a tie faster in the median stays compiled."""
    _inject(monkeypatch, compiled_ms=compiled_ms, ort_ms=2.0)
    model, feeds, sess = _session()
    assert sess._runtime.placement.one_cluster
    _run_until_decided(sess, feeds)
    (decision,) = [d for d in sess.explain(as_json=True)["placement"]
                   if not d["reason"].startswith("second look")][:1]
    assert decision["winner"] == winner and "within noise" in decision["reason"], decision
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-6)


def test_the_whole_model_side_is_the_users_own_graph(monkeypatch):
    """onnxruntime over the whole model (the side the whole plan is measured against, and
    what a handed-back signature runs) is built from the user's model with the weights the
    session read, not from our re-export of the imported graph: onnxruntime's own fusions
    then see what plain onnxruntime sees."""
    from autoclust.backends import ort as ort_backend
    built = []
    real = ort_backend.Segment.__init__

    def spy(self, model, *args, **kwargs):
        built.append((kwargs.get("name"), model))
        real(self, model, *args, **kwargs)
    monkeypatch.setattr(ort_backend.Segment, "__init__", spy)
    model, feeds, sess = _whole_decided(monkeypatch, plan_ms=5.0, whole_ort_ms=2.0)
    (whole,) = [m for name, m in built if name == autotune.WHOLE]
    assert whole is sess._model
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want):
        np.testing.assert_array_equal(g, w)  # the same graph: the same bits


def test_handed_back_plan_runs_onnxruntime_directly(monkeypatch):
    # Once the whole plan goes back to onnxruntime for a signature, run() calls the whole
    # model's session as --auto_jit=0 does: no plan, no routing (counted, not timed).
    model, feeds, sess = _whole_decided(monkeypatch, plan_ms=5.0, whole_ort_ms=2.0)
    assert sess.explain(as_json=True)["placement"][-1]["winner"] == ONNXRUNTIME
    routed = []
    real_run = sess._runtime.run
    monkeypatch.setattr(sess._runtime, "run", lambda *a, **k: routed.append(1) or
                        real_run(*a, **k))
    monkeypatch.setattr(sess._runtime, "run_outputs", lambda *a, **k: routed.append(1) or
                        pytest.fail("the runtime routed a handed-back signature"))
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for _ in range(3):
        got = sess.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    (y,) = sess.run([sess.get_outputs()[-1].name], feeds)
    np.testing.assert_allclose(y, want[-1], rtol=1e-5, atol=1e-6)
    assert routed == [] and len(sess._direct) == 1
    # another signature (batch 3) has not been decided: it goes through the plan
    bigger = {"x": np.concatenate([feeds["x"], feeds["x"][:1]]), "k": feeds["k"]}
    sess.run(None, bigger)
    assert routed == [1]


def test_whole_model_goes_to_onnxruntime_unmeasured_when_every_cluster_did(monkeypatch):
    """Every cluster loses its own trial: the plan is onnxruntime in pieces, and one session
    over the whole model replaces it without a trial (the plan's injected 1 ms, which a
    trial would keep, is never measured)."""
    def timed(self, side, inputs):
        outs = side.run(inputs)
        measured.append(type(side).__name__)
        return (5.0 if side is self.exe else 2.0) * self.repeat / 1e3, outs
    measured: list[str] = []
    monkeypatch.setattr(autotune.Trial, "_time", timed)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for _ in range(15):
        got = sess.run(None, feeds)
    assert "_PlanSide" not in measured and "_OrtSide" not in measured, measured
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    decisions = sess.explain(as_json=True)["placement"]
    assert [d["winner"] for d in decisions] == [ONNXRUNTIME] * 5, decisions
    assert decisions[-1]["cluster"] == autotune.WHOLE
    assert "every cluster is onnxruntime's" in decisions[-1]["reason"]
    assert isinstance(next(iter(sess._runtime.whole.route.values())), autotune._OrtSide)


def test_a_first_signature_is_measured_with_the_budget_spent(monkeypatch):
    """A cluster's first signature and the whole model's first are measured whatever the
    budget; a later one takes the last decision (inherited)."""
    _inject_whole(monkeypatch, plan_ms=5.0, whole_ort_ms=2.0)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, autotune_budget_ms=0)
    _run_until_decided(sess, feeds, runs=20)
    decisions = sess.explain(as_json=True)["placement"]
    assert [(d["winner"], d["pairs"]) for d in decisions] == \
        [(COMPILED, autotune.MIN_PAIRS)] * 4 + [(ONNXRUNTIME, autotune.MIN_PAIRS)], decisions
    assert decisions[-1]["cluster"] == autotune.WHOLE
    rt = sess._runtime
    for budget in (rt.placement.budget, rt.whole.budget):  # injected times charge nothing
        budget.spent_ms = 1e9
    other = {"x": np.concatenate([feeds["x"]] * 3), "k": feeds["k"]}  # a new batch size
    want = ort.InferenceSession(model.SerializeToString()).run(None, other)
    for _ in range(6):
        got = sess.run(None, other)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    later = sess.explain(as_json=True)["placement"][5:]
    assert later and all(d["source"] == "inherited" and d["pairs"] == 0 for d in later)
    assert later[-1]["cluster"] == autotune.WHOLE and later[-1]["winner"] == ONNXRUNTIME
    assert "(measuring budget spent)" in later[-1]["reason"], later


def test_whole_plan_trial_has_a_budget_of_its_own(monkeypatch):
    """The clusters' trials spending the session's budget leave the whole plan's trial its
    own: before, it kept a plan slower than onnxruntime after one pair (Whisper-tiny)."""
    _inject_whole(monkeypatch, plan_ms=5.0, whole_ort_ms=2.0)
    model = zoo.build("mixed_dynamic")
    feeds = zoo.feeds(model)
    sess = autoclust.InferenceSession(model, autotune_budget_ms=1000)
    rt = sess._runtime
    for _ in range(15):
        sess.run(None, feeds)
        if len(rt.placement.decisions) == 4:  # every cluster has decided: spend the rest
            break
    assert [d.cluster for d in rt.placement.decisions] == [
        r.name for r in rt.compiled_clusters()]
    rt.placement.budget.spent_ms = 1e9
    for _ in range(10):
        sess.run(None, feeds)
    whole = sess.explain(as_json=True)["placement"][-1]
    assert whole["cluster"] == autotune.WHOLE
    assert whole["winner"] == ONNXRUNTIME and whole["pairs"] == autotune.MIN_PAIRS, whole
    assert rt.whole.budget is not rt.placement.budget and rt.whole.budget.total_ms == 1000


def test_a_watch_drops_runs_that_another_thread_shared():
    """A run timed while another ran the same side (concurrent requests: they queue on the
    executable) is not a sample: four threads made a served plan read 11.9 ms against its
    trial's 2.8. Crowded for WATCH_LOOKS * WATCH_RUNS runs, the winner stands."""
    events: list[str] = []

    class Side:
        nested = True

        def run(self, inputs):
            if self.nested:  # another request arrives while this one runs
                self.nested = False
                watch.run(inputs)
                self.nested = True
            return ["out"]

    watch = autotune.Watch(Side(), 1.0, lambda ms: events.append(f"again {ms}"),
                           lambda: events.append("stand"), _Steps(5.0))
    for _ in range(autotune.WATCH_LOOKS * autotune.WATCH_RUNS - 1):
        assert watch.run([]) == ["out"]
    assert watch.times == [] and not watch.finished and events == []
    watch.run([])
    assert watch.finished and events == ["stand"]
    assert watch.crowded == autotune.WATCH_LOOKS * autotune.WATCH_RUNS
