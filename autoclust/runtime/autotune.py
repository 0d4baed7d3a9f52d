"""Measured placement: each compiled cluster timed against onnxruntime on the same subgraph.

A drop-in that makes a model slower is worse than none, and no cost model knows this CPU,
this onnxruntime and this shape. So at the first runs of a new signature a `Trial` serves
the cluster: it returns the compiled outputs, and once the executable has settled (the
CPU backend prepacks GEMM weights and measures each GEMM's library after a compile; the
SETTLE_* limits) it also runs onnxruntime over the same subgraph (the cluster's standalone
ONNX, as dumps write it) on the same inputs, alternating which side goes first, with the
threads the run uses. After a few pairs `decide` keeps the faster:

    pairs (compiled ms, onnxruntime ms): (10.0, 12.1) (10.2, 12.0) (9.9, 12.3)
    -> compiled, faster in every pair: the executable serves from now on
    pairs: (12.0, 10.1) (12.4, 10.0) (11.9, 10.2)
    -> onnxruntime, faster in every pair: handed back (its session serves)

Only clear differences count: every pair beyond MARGIN decides early; otherwise up to
MAX_PAIRS are taken and both the median pair ratio and the ratio of the sides' medians
must be beyond MARGIN; anything closer keeps the compiled code (for the whole model,
anything closer that is not faster in the median goes to onnxruntime). The extra work
(onnxruntime's session, its runs, repeats of short clusters) is charged to a per-session
`Budget` (--autotune_budget_ms); a trial that runs out decides on what it has, and a
signature that finds the budget spent takes the cluster's last decision. The whole plan's
trial against one onnxruntime session over the whole model (`WholePlan`) has a budget of
its own, of the same size. A trial decides on a few pairs in one window of time, so the
winner of a first trial is then timed as it serves (`Watch`, two clock reads a run): if it
runs slower than the loser did in the trial, one second trial decides for good. Every
decision, with both times, goes to `explain` and, with --cache_dir, to a small JSON file
keyed by the cluster, the signature, the flags that change code, the versions and the
CPU, so a second process does not measure again (nor compile a cluster that lost).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

COMPILED = "compiled"
ONNXRUNTIME = "onnxruntime"
MIN_PAIRS = 3      # pairs before an early decision (all pairs agree beyond MARGIN)
MAX_PAIRS = 9      # pairs before the median decides
MARGIN = 0.03      # a ratio within 1 +- MARGIN is noise: the compiled code stays
SAMPLE_S = 2e-4    # one timed sample repeats a short cluster until it takes about this long
MAX_REPEAT = 64
SETTLE_RUNS = 400  # measure anyway after this many runs of an executable still settling,
SETTLE_S = 60.0    # or this many seconds since its first (GPT-2 settles in ~100 runs, 5 s)
FORMAT = 1         # of the --cache_dir entries; bump when their meaning changes
WATCH_RUNS = 12    # runs of a first trial's winner per look at its time as it serves
WATCH_LOOKS = 2    # looks before the decision stands unwatched
WARM_S = 0.05      # a side running longer is timed without an untimed run before it


@dataclasses.dataclass
class Decision:
    """Where one cluster runs for one signature, and the evidence."""

    cluster: str
    signature: str
    winner: str                      # COMPILED or ONNXRUNTIME
    reason: str
    compiled_ms: float | None = None  # medians over the pairs (None: not measured)
    onnxruntime_ms: float | None = None
    pairs: int = 0
    source: str = "measured"         # measured, cache (--cache_dir), inherited

    def text(self) -> str:
        """One line for explain and --log."""
        where = "handed back to onnxruntime" if self.winner == ONNXRUNTIME else "kept compiled"
        times = ""
        if self.compiled_ms is not None and self.onnxruntime_ms is not None:
            times = (f": compiled {self.compiled_ms:.3f} ms, onnxruntime "
                     f"{self.onnxruntime_ms:.3f} ms")
        return f"{self.cluster} ({self.signature}) {where}{times} ({self.reason})"

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def decide(compiled: Sequence[float], ort: Sequence[float], final: bool = False,
           ties: str = COMPILED) -> tuple[str, str] | None:
    """(winner, reason) from paired times, or None while more pairs are wanted.

    `final`: no more pairs will come (budget spent, MAX_PAIRS reached): decide now.
    `ties`: who takes a result within noise. A cluster's doubt keeps the compiled code
    (handing it back adds segment boundaries); the whole model's (WholePlan) goes to
    onnxruntime when the plan is not faster in the median, since onnxruntime over the
    whole model is the baseline itself (Whisper-tiny's plan, "within noise" at 1-2%,
    then read 0.94-0.97x onnxruntime on a noisy host).
    """
    n = min(len(compiled), len(ort))
    if n < MIN_PAIRS and not final:
        return None
    if n == 0:
        return COMPILED, "not measured"
    ratios = [o / c if c > 0 else float("inf") for c, o in zip(compiled, ort)]
    if n >= MIN_PAIRS and all(r < 1 - MARGIN for r in ratios):
        return ONNXRUNTIME, (f"onnxruntime faster in all {n} paired runs, by "
                             f"{_pct(1 / statistics.median(ratios))}")
    if n >= MIN_PAIRS and all(r > 1 + MARGIN for r in ratios):
        return COMPILED, f"faster in all {n} paired runs, by {_pct(statistics.median(ratios))}"
    if n < MAX_PAIRS and not final:
        return None
    med = statistics.median(ratios)
    # both the median pair and the sides' medians must say so: under load the two can
    # disagree, and a doubt keeps the compiled code
    sides = statistics.median(ort) / max(statistics.median(compiled), 1e-12)
    if n >= MIN_PAIRS and med < 1 - MARGIN and sides < 1 - MARGIN:
        return ONNXRUNTIME, f"onnxruntime faster by {_pct(1 / med)} (median of {n} pairs)"
    if med > 1 + MARGIN:
        return COMPILED, f"faster by {_pct(med)} (median of {n} pairs)"
    if n < MIN_PAIRS:
        return COMPILED, f"only {n} of {MIN_PAIRS} pairs measured: kept compiled"
    if ties == ONNXRUNTIME and med < 1 and sides < 1:
        return ONNXRUNTIME, (f"within noise and not faster (median ratio {med:.3f} of {n} "
                             "pairs): onnxruntime, the baseline, serves")
    return COMPILED, (f"within noise (median ratio {med:.3f} of {n} pairs, margin "
                      f"{MARGIN:.0%}): kept compiled")


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:.0f}%" if ratio < 10 else f"{ratio:.0f}x"


class Budget:
    """Milliseconds of extra work the session may spend measuring."""

    def __init__(self, total_ms: float):
        self.total_ms = float(total_ms)
        self.spent_ms = 0.0
        self._lock = threading.Lock()

    def left_ms(self) -> float:
        return self.total_ms - self.spent_ms

    def charge(self, seconds: float) -> None:
        with self._lock:
            self.spent_ms += seconds * 1e3

    def text(self) -> str:
        return f"measuring budget {self.spent_ms:.0f} of {self.total_ms:.0f} ms used"


class Trial:
    """Serves one cluster for one signature while it is measured (see the module doc).

    `exe` and the onnxruntime segment (`segment()` builds it) both have run(inputs);
    `done(decision, winner)` is called once, with the object to serve from then on.
    `min_pairs`: pairs taken whatever the budget says (a first trial: nothing measured
    yet is kept unmeasured; a second look, which decides for good). `clock` and `settled`
    are injectable so tests decide deterministically.
    """

    def __init__(self, name: str, signature: str, exe: Any, segment: Callable[[], Any],
                 budget: Budget, done: Callable[[Decision, Any], None],
                 clock: Callable[[], float] = time.perf_counter,
                 settled: Callable[[], bool] | None = None, ties: str = COMPILED,
                 min_pairs: int = 0):
        self.name, self.signature, self.ties = name, signature, ties
        self.min_pairs = min_pairs
        self.exe, self._segment = exe, segment
        self.ort: Any = None  # onnxruntime's side, built at the first measured run
        self.budget, self._done, self.clock = budget, done, clock
        self.settled = settled or (lambda: True)
        self.compiled_s: list[float] = []
        self.ort_s: list[float] = []
        self.repeat = 1
        self.warm = True  # each timed run after an untimed one (_time); not for long runs
        self.pair_s = 0.0  # what the last pair cost beyond the caller's run
        self.runs = 0
        self.since: float | None = None  # the clock at the first run
        self.unsettled = False  # measured before the executable settled (SETTLE_*)
        self.finished = False
        self._lock = threading.Lock()

    def run(self, inputs: list[np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        """The compiled outputs; measures a pair on the way when it may."""
        if not self._lock.acquire(blocking=False):  # another thread is measuring
            return self.exe.run(inputs)
        try:
            self.runs += 1
            if self.finished or self._settling():
                return self.exe.run(inputs)
            return self._measure(inputs)
        finally:
            self._lock.release()

    def _settling(self) -> bool:
        """Whether to wait for the executable: GEMM measurements slow its first ~100 runs
        (GPT-2: 35-120 ms a run against 18; timed at its 20th run, the old limit, it lost
        44 ms to 27 and was handed back for good in one process of three)."""
        now = self.clock()
        self.since = now if self.since is None else self.since
        if self.settled() or self.unsettled:
            return False
        self.unsettled = self.runs >= SETTLE_RUNS or now - self.since >= SETTLE_S
        return not self.unsettled

    def _measure(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.ort is None:
            return self._start(inputs)
        if len(self.ort_s) >= self.min_pairs and self.budget.left_ms() < self.pair_s * 1e3:
            # the next pair would overdraw it
            outs = self.exe.run(inputs)
            self._finish(note="measuring budget spent")
            return outs
        t0 = self.clock()
        first_ort = len(self.ort_s) % 2 == 1  # alternate which side goes first
        if first_ort:
            t_ort, _ = self._time(self.ort, inputs)
        t_exe, outs = self._time(self.exe, inputs)
        if not first_ort:
            t_ort, _ = self._time(self.ort, inputs)
        self.compiled_s.append(t_exe / self.repeat)
        self.ort_s.append(t_ort / self.repeat)
        # everything beyond the one compiled run the caller needed is the measuring's cost
        self.pair_s = self.clock() - t0 - t_exe / self.repeat
        self.budget.charge(self.pair_s)
        verdict = decide(self.compiled_s, self.ort_s, final=len(self.ort_s) >= MAX_PAIRS,
                         ties=self.ties)
        if verdict is not None:
            self._finish(verdict=verdict)
        return outs

    def _start(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Build onnxruntime's side and warm it up (charged), and size the repeats."""
        t0 = self.clock()
        try:
            self.ort = self._segment()
            self.ort.run(inputs)  # untimed: onnxruntime's first run allocates
        except Exception as exc:  # noqa: BLE001 - a failing side loses, it never breaks a run
            self.budget.charge(self.clock() - t0)
            self._finish(verdict=(COMPILED, (f"onnxruntime cannot run the subgraph: "
                                            f"{type(exc).__name__}: {exc}")))
            return self.exe.run(inputs)
        self.budget.charge(self.clock() - t0)
        t_exe, outs = self._time(self.exe, inputs)  # also the compiled side's warm-up
        self.repeat = max(1, min(MAX_REPEAT, int(SAMPLE_S / max(t_exe, 1e-9))))
        self.warm = t_exe < WARM_S
        return outs

    def _time(self, side: Any, inputs: list[np.ndarray]) -> tuple[float, Any]:
        """Seconds of `repeat` runs of `side`, after one untimed run: the first run after
        the other side pays for waking its thread pools (the compiled side has one per
        prepacked GEMM session) and for caches the other side filled, which a steady run
        does not (timed cold, Qwen2's cluster lost pairs it wins by 6% steady). Not for
        sides running longer than WARM_S: a wake-up is noise there, the caches hold a small
        part of the run's data anyway, and the untimed runs tripled a pair's cost (BERT-base
        at 170 ms a run on a 2-core Zen 3: four pairs in the 3 s budget)."""
        if self.warm:
            side.run(inputs)
        t0 = self.clock()
        for _ in range(self.repeat):
            outs = side.run(inputs)
        return self.clock() - t0, outs

    def _finish(self, verdict: tuple[str, str] | None = None, note: str = "") -> None:
        if verdict is None:
            final = decide(self.compiled_s, self.ort_s, final=True, ties=self.ties)
            assert final is not None  # final=True always decides
            verdict = (final[0], f"{note}; {final[1]}")
        winner, reason = verdict
        if self.unsettled:
            reason = f"measured before the executable settled; {reason}"
        measured = bool(self.compiled_s)
        decision = Decision(
            self.name, self.signature, winner, reason,
            statistics.median(self.compiled_s) * 1e3 if measured else None,
            statistics.median(self.ort_s) * 1e3 if measured else None, len(self.ort_s))
        self.finished = True
        self._done(decision, self.ort if winner == ONNXRUNTIME else self.exe)


class Watch:
    """The winner of a first trial, timed as it serves (two clock reads a run).

    A trial decides on at most MAX_PAIRS pairs in one window of time, and a decision taken
    in a lucky window stood for the life of the process: SegFormer's plan, kept 4% faster,
    ran 13.3 ms against onnxruntime's 10.5 in 2 of ~60 processes, and LLaMA-like's one
    cluster read 0.97x in one of eight. So for WATCH_LOOKS looks of WATCH_RUNS runs the
    median of the winner's own times is compared with the loser's median in the trial:
    beyond MARGIN slower, `again(ms)` starts a second trial, which decides for good;
    otherwise `stand()` puts the winner in place unwatched (and the session's direct
    paths, which skip the routing, take over)."""

    def __init__(self, side: Any, loser_ms: float, again: Callable[[float], None],
                 stand: Callable[[], None], clock: Callable[[], float]):
        self.side, self.loser_ms, self.clock = side, loser_ms, clock
        self._again, self._stand = again, stand
        self.times: list[float] = []
        self.looks = 0
        self.finished = False
        self.crowded = 0  # timed runs dropped: another thread ran the side meanwhile
        self._lock = threading.Lock()
        self._runs = [0, 0]  # runs in flight, runs started (under _count)
        self._count = threading.Lock()

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.finished:
            return self.side.run(inputs)
        with self._count:
            self._runs[0] += 1
            self._runs[1] += 1
            alone, started = self._runs[0] == 1, self._runs[1]
        try:
            if not self._lock.acquire(blocking=False):  # another thread is being timed
                return self.side.run(inputs)
            try:
                return self._timed(inputs, alone, started)
            finally:
                self._lock.release()
        finally:
            with self._count:
                self._runs[0] -= 1

    def _timed(self, inputs: list[np.ndarray], alone: bool, started: int) -> list[np.ndarray]:
        """One run timed; kept only if no other thread ran the side meanwhile (concurrent
        requests queue on the executable and share the cores: a served plan read 11.9 ms
        against its trial's 2.8 under four threads). WATCH_LOOKS * WATCH_RUNS dropped runs
        let the winner stand: under steady contention there is nothing fair to compare."""
        t0 = self.clock()
        outs = self.side.run(inputs)
        seconds = self.clock() - t0
        with self._count:
            alone = alone and self._runs == [1, started]
        if not alone:
            self.crowded += 1
            if self.crowded >= WATCH_LOOKS * WATCH_RUNS:
                self.finished = True
                self._stand()
            return outs
        self.times.append(seconds)
        if len(self.times) >= WATCH_RUNS:
            ms = statistics.median(self.times) * 1e3
            self.times.clear()
            self.looks += 1
            if ms > self.loser_ms * (1 + MARGIN):
                self.finished = True
                self._again(ms)
            elif self.looks >= WATCH_LOOKS:
                self.finished = True
                self._stand()
        return outs


def inherited(cluster: str, signature: str, earlier: Decision, why: str) -> Decision:
    """`earlier`'s decision taken for another signature, unmeasured (explain says whose)."""
    return Decision(cluster, signature, earlier.winner,
                    f"as measured for {earlier.signature} ({why})", source="inherited")


def deciding(target: Any) -> bool:
    """Whether a route's target is still a measurement: a Trial deciding, or a Watch."""
    return isinstance(target, (Trial, Watch)) and not target.finished


def watched(decision: Decision) -> bool:
    """Whether a decision carries both times (a Watch has something to compare with)."""
    return decision.compiled_ms is not None and decision.onnxruntime_ms is not None


def loser_ms(decision: Decision) -> float:
    """The median time of the side a measured decision did not pick."""
    ms = decision.onnxruntime_ms if decision.winner == COMPILED else decision.compiled_ms
    assert ms is not None, decision  # watched(decision)
    return ms


def second_look(decision: Decision, winner_ms: float) -> str:
    """Why a second trial: the first winner's time as it served against the loser's."""
    won, lost = ("compiled", ONNXRUNTIME) if decision.winner == COMPILED else \
        (ONNXRUNTIME, "compiled")
    return (f"second look: {won} ran {winner_ms:.3f} ms as it served, {lost} "
            f"{loser_ms(decision):.3f} ms in the first trial")


# ---- one session's placement ------------------------------------------------------------

def skip_reason(flags: Any, backend: Any) -> str | None:
    """Why a session does not measure placement (None: it does)."""
    from autoclust import registry
    pol = registry.policy(backend)
    if not flags.autotune:
        return "--autotune=false"
    if flags.must_compile:
        return "--must_compile keeps every cluster compiled"
    if pol.device_memory or not pol.lowers:  # copies would dominate / a debugging device
        return f"not measured on --device={flags.device}"
    return None


class Placement:
    """A session's measured placement: its budget, its decisions, its cache entries.

    `place(runner, key, inputs)` gives what serves a cluster's new signature: the
    onnxruntime segment or the executable when --cache_dir already holds a decision,
    else a Trial (or, with the budget spent, the cluster's last decision).
    """

    def __init__(self, flags: Any, clock: Callable[[], float] = time.perf_counter):
        self.flags = flags
        self.budget = Budget(flags.autotune_budget_ms)
        self.decisions: list[Decision] = []
        self.latest: dict[str, Decision] = {}  # cluster name -> its last decision
        self.by_class: dict[int, Decision] = {}  # id(ShapeClass) -> its measured decision
        self.clock = clock
        # set by the runtime for a plan that is one cluster: that cluster's trial is the
        # whole model's, so its winner is watched as it serves (Watch; a cluster among
        # others runs colder in the plan than in its trial's repeats, and the whole plan's
        # Watch covers those) and a tie not faster in the median goes to onnxruntime, the
        # baseline, as the whole plan's does (a cluster among others keeps its compiled
        # code on a doubt: handing it back adds segment boundaries). DeiT's one cluster,
        # kept "within noise (median ratio 0.970 of 9 pairs)", read 0.96x.
        self.one_cluster = False
        self._lock = threading.Lock()

    def place(self, runner: Any, key: tuple, inputs: list[np.ndarray]) -> Any:
        """The object that serves `runner` for signature `key` (None: it fell back)."""
        sig = signature_text(inputs, runner.shape_value_index)
        entry = self._entry(runner, key)
        stored = load(self.flags.cache_dir, entry) if entry else None
        if stored is not None:
            stored.cluster, stored.signature, stored.source = runner.name, sig, "cache"
            target = runner.onnxruntime_segment(quiet=True) \
                if stored.winner == ONNXRUNTIME else runner.compiled(key, inputs)
            if target is not None:
                self._record(stored)
                # and stands for its shape class, as a measured one does: a warm
                # process's first new length otherwise built the cluster's onnxruntime
                # session to measure it (BERT-base: 1.1-1.4 s against 0.2 s cold)
                cls = getattr(target, "shape_class", None)
                if cls is not None:
                    self.by_class.setdefault(id(cls), stored)
                if stored.winner == COMPILED and self.one_cluster and watched(stored):
                    # another process's decision on this machine: looked at here too
                    target = self._watch(runner, key, sig, target, entry, cls, stored,
                                         target)
                return target
        exe = runner.compiled(key, inputs)
        if exe is None:
            return None
        reason = runner.unmeasurable()
        # a signature bound to a shape class that has been measured (another sequence
        # length of the same compile) takes that decision: measuring it again would cost a
        # new length's first run ~0.5 s (an onnxruntime session, then the pairs)
        cls = getattr(exe, "shape_class", None)
        same_class = self.by_class.get(id(cls)) if cls is not None else None
        if reason is None and same_class is not None:
            return self._inherit(runner, sig, same_class, exe, "the same shape class")
        last = self.latest.get(runner.name)
        if reason is None and self.budget.left_ms() <= 0 and last is not None:
            return self._inherit(runner, sig, last, exe, "measuring budget spent")
        if reason is not None:
            self._record(Decision(runner.name, sig, COMPILED, f"not measured: {reason}"))
            return exe
        # a cluster's first signature is measured whatever the budget: kept unmeasured,
        # BERT-base's one cluster (170 ms a run on a 2-core Zen 3, its onnxruntime session
        # built in ~1 s) served 0.90x onnxruntime for the process
        return self._trial(runner, key, sig, exe, entry, cls, first=last is None)

    def _trial(self, runner: Any, key: tuple, sig: str, exe: Any, entry: str, cls: Any,
               why: str = "", first: bool = False) -> Trial:
        """A cluster's trial for one signature; `why`: a second look's reason (that trial
        decides for good, a first one's winner is watched where self.one_cluster says so);
        `first`: the cluster's first. Both take MIN_PAIRS pairs whatever the budget."""
        def done(decision: Decision, winner: Any) -> None:
            if why:
                decision.reason = f"{why}: {decision.reason}"
            served = winner
            if not why and self.one_cluster and watched(decision):
                served = self._watch(runner, key, sig, exe, entry, cls, decision, winner)
            runner.route[key] = served
            self._record(decision)
            if cls is not None:
                self.by_class[id(cls)] = decision  # classes live as long as their runner
            if entry:
                store(self.flags.cache_dir, entry, decision)

        return Trial(runner.name, sig, exe, runner.onnxruntime_segment, self.budget, done,
                     self.clock, getattr(exe, "settled", None),
                     ties=ONNXRUNTIME if self.one_cluster else COMPILED,
                     min_pairs=MIN_PAIRS if first or why else 0)

    def _watch(self, runner: Any, key: tuple, sig: str, exe: Any, entry: str, cls: Any,
               decision: Decision, winner: Any) -> Watch:
        """`winner` serving `key`, watched; a second trial if it runs slower than the
        loser did (with budget left; else it stays)."""
        def again(ms: float) -> None:
            runner.route[key] = winner if self.budget.left_ms() <= 0 else \
                self._trial(runner, key, sig, exe, entry, cls, second_look(decision, ms))

        return Watch(winner, loser_ms(decision), again,
                     lambda: runner.route.__setitem__(key, winner), self.clock)

    def _inherit(self, runner: Any, sig: str, earlier: Decision, exe: Any, why: str) -> Any:
        """What serves `sig` as `earlier` decided for another signature (recorded)."""
        self._record(inherited(runner.name, sig, earlier, why))
        if earlier.winner == ONNXRUNTIME:
            return runner.onnxruntime_segment(quiet=True) or exe
        return exe

    def _entry(self, runner: Any, key: tuple) -> str:
        if not self.flags.cache_dir:
            return ""
        return entry_key(runner.fingerprint(), key, self.flags.threads)

    def _record(self, decision: Decision, budget: Budget | None = None) -> None:
        with self._lock:
            self.decisions.append(decision)
            self.latest[decision.cluster] = decision
        if self.flags.log:
            log(decision, budget or self.budget)


# ---- the whole plan against one onnxruntime session ------------------------------------------

WHOLE = "whole model"


class WholePlan:
    """A plan of several steps against onnxruntime over the whole model, per feed signature.

    Clusters handed back one by one still leave a segment boundary on each side of them
    (and onnxruntime cannot fuse across it): a model of many small clusters between
    onnxruntime Convs can lose although every cluster wins or goes back. Once every
    cluster has decided for a signature, the plan as it now runs is timed against one
    onnxruntime session over the whole model, like a cluster against its subgraph.
    """

    def __init__(self, runtime: Any, placement: Placement):
        self.runtime, self.placement = runtime, placement
        # A budget of its own, as large as the clusters' (so measuring costs at most twice
        # --autotune_budget_ms): this trial is the guarantee that a plan slower than
        # onnxruntime is not kept, and with one shared budget the clusters' trials spent it
        # first (Whisper-tiny kept a plan after one pair, 110 ms against onnxruntime's 100:
        # "measuring budget spent; only 1 of 3 pairs measured: kept compiled").
        self.budget = Budget(placement.budget.total_ms)
        self.route: dict[tuple, Any] = {}
        self.seen: set[tuple] = set()  # signatures run once through the steps
        # (signature key, the whole model's onnxruntime Segment) when a signature is handed
        # back: the session then calls onnxruntime for it directly (no routing at all)
        self.on_handed_back: Callable[[tuple, Any], None] | None = None
        self._fingerprint = ""
        self._lock = threading.Lock()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The graph outputs by name, or None: run the plan's steps as usual."""
        names = tuple(feeds)
        try:
            key = (names, *[(x.dtype, x.shape) for x in feeds.values()])
        except AttributeError:  # a sequence or map input: the plan's steps run it
            return None
        target = self.route.get(key)
        if target is None:
            target = self._start(key, names, feeds)
            if target is None:
                return None
        run_feeds = getattr(target, "run_feeds", None)  # a decided onnxruntime: by name
        outs = run_feeds(feeds) if run_feeds is not None else target.run(list(feeds.values()))
        return dict(zip(self.runtime.output_names, outs))

    def _start(self, key: tuple, names: tuple, feeds: dict[str, np.ndarray]) -> Any:
        """A Trial of the plan against the whole model once its clusters have decided."""
        rt = self.runtime
        if key not in self.seen or any(deciding(t) for r in rt.compiled_clusters()
                                       for t in r.route.values()):
            self.seen.add(key)
            return None  # its clusters first meet it, or still measure: not yet
        with self._lock:
            if key in self.route:
                return self.route[key]
            sig = signature_text(list(feeds.values()))
            plan_side = _PlanSide(rt, names)
            entry = entry_key(self.fingerprint(), key, self.placement.flags.threads) \
                if self.placement.flags.cache_dir else ""
            stored = load(self.placement.flags.cache_dir, entry) if entry else None
            if stored is not None:
                stored.cluster, stored.signature, stored.source = WHOLE, sig, "cache"
                self.placement._record(stored, self.budget)
                target = self._ort_side(names) if stored.winner == ONNXRUNTIME else plan_side
                if watched(stored):  # another process's decision: looked at here too
                    target = self._watch(key, sig, names, plan_side, entry, stored, target)
                else:
                    self._handed(key, target)
            elif _nothing_compiled(rt):
                self.placement._record(Decision(
                    WHOLE, sig, ONNXRUNTIME, "not measured: every cluster is onnxruntime's, "
                    "so one session runs what its pieces ran, without their boundaries"),
                    self.budget)
                target = self._ort_side(names)
                self._handed(key, target)
            elif self.budget.left_ms() <= 0 and WHOLE in self.placement.latest:
                earlier = self.placement.latest[WHOLE]
                self.placement._record(inherited(WHOLE, sig, earlier, "measuring budget spent"),
                                       self.budget)
                target = self._ort_side(names) if earlier.winner == ONNXRUNTIME else plan_side
                self._handed(key, target)
            else:  # the first signature is measured whatever the budget (MIN_PAIRS pairs)
                target = self._trial(key, sig, names, plan_side, entry,
                                     first=WHOLE not in self.placement.latest)
            self.route[key] = target
            return target

    def _trial(self, key: tuple, sig: str, names: tuple, plan_side: Any, entry: str,
               why: str = "", first: bool = False) -> Trial:
        """The plan against onnxruntime over the whole model for one signature; `why`: a
        second look's reason (that trial decides for good; a first one's winner is
        watched); `first`: the model's first. Both take MIN_PAIRS pairs whatever the
        budget."""
        def done(decision: Decision, winner: Any) -> None:
            if why:
                decision.reason = f"{why}: {decision.reason}"
            served = winner
            if not why and watched(decision):
                served = self._watch(key, sig, names, plan_side, entry, decision, winner)
            self.route[key] = served
            self.placement._record(decision, self.budget)
            if entry:
                store(self.placement.flags.cache_dir, entry, decision)
            if served is winner:
                self._handed(key, winner)

        return Trial(WHOLE, sig, plan_side, lambda: self._ort_side(names), self.budget,
                     done, self.placement.clock, ties=ONNXRUNTIME,
                     min_pairs=MIN_PAIRS if first or why else 0)

    def _watch(self, key: tuple, sig: str, names: tuple, plan_side: Any, entry: str,
               decision: Decision, winner: Any) -> Watch:
        """`winner` serving `key`, watched (handed back to the session's direct call only
        once it stands); a second trial if it runs slower than the loser did."""
        def again(ms: float) -> None:
            if self.budget.left_ms() <= 0:  # nothing left to measure with: it stands
                stand()
            else:
                self.route[key] = self._trial(key, sig, names, plan_side, entry,
                                              second_look(decision, ms))

        def stand() -> None:
            self.route[key] = winner
            self._handed(key, winner)

        return Watch(winner, loser_ms(decision), again, stand, self.placement.clock)

    def _handed(self, key: tuple, target: Any) -> None:
        if isinstance(target, _OrtSide) and self.on_handed_back is not None:
            self.on_handed_back(key, target.segment)

    def _ort_side(self, names: tuple) -> Any:
        return _OrtSide(self.runtime.whole_model_segment(), names, self.runtime.output_names)

    def fingerprint(self) -> str:
        """A hash of the whole graph (structure, weights' names and types, code flags)."""
        if not self._fingerprint:
            from autoclust.runtime.program_cache import program_key
            rt = self.runtime
            self._fingerprint = WHOLE + program_key(rt.graph, rt.flags, rt.backend)
        return self._fingerprint


def _nothing_compiled(runtime: Any) -> bool:
    """Whether no cluster runs compiled code for any signature it has met: each fell back or
    handed every signature to onnxruntime (the Whisper export: its one cluster lost, and
    the plan was onnxruntime in two pieces, measured against one session only when the
    budget allowed)."""
    runners = runtime.compiled_clusters()
    return bool(runners) and all(
        r.fallback is not None or (r.route and all(
            not isinstance(t, Trial) and all(getattr(t, "side", t) is not e
                                             for e in r.cache.values())
            for t in r.route.values()))
        for r in runners)


def measuring(runtime: Any) -> bool:
    """Whether a Trial of `runtime` (a cluster's or the whole plan's) is still deciding, or
    a first trial's winner is still watched (Watch)."""
    if runtime is None or getattr(runtime, "placement", None) is None:
        return False
    sides = [t for r in runtime.compiled_clusters() for t in r.route.values()]
    if runtime.whole is not None:
        if not runtime.whole.route:
            return True
        sides += list(runtime.whole.route.values())
    return any(deciding(t) for t in sides)


class _PlanSide:
    """The plan's steps as one side of a Trial (inputs in the feeds' order)."""

    def __init__(self, runtime: Any, names: tuple):
        self.runtime, self.names = runtime, names

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        env = self.runtime.run_steps(dict(zip(self.names, inputs)))
        return [env[n] for n in self.runtime.output_names]


class _OrtSide:
    """onnxruntime's session over the whole model as one side of a Trial."""

    def __init__(self, segment: Any, names: tuple, output_names: list[str]):
        self.segment, self.names, self.output_names = segment, names, output_names

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return self.segment.run_feeds(dict(zip(self.names, inputs)))

    def run_feeds(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.segment.run_feeds(feeds)


# ---- --cache_dir entries ---------------------------------------------------------------------

def signature_text(inputs: Sequence[Any], shape_value_index: Sequence[int] = ()) -> str:
    """`float32[1,128], int64[2]=[1 128]`: a signature as people read it."""
    parts = []
    for i, x in enumerate(inputs):
        text = f"{x.dtype}[{','.join(str(d) for d in x.shape)}]"
        if i in shape_value_index:
            text += "=" + np.array2string(np.asarray(x).ravel(), threshold=16)
        parts.append(text)
    return ", ".join(parts)


def entry_key(fingerprint: str, signature: tuple, threads: int) -> str:
    """Cache key of one decision: cluster, exact signature, threads, versions and CPU."""
    h = hashlib.sha256(f"{FORMAT}|{fingerprint}|{threads}|{_versions()}|{_cpu()}\n".encode())
    for item in signature:
        h.update(repr(item).encode() if not isinstance(item, bytes) else item)
        h.update(b"\0")
    return h.hexdigest()


def load(cache_dir: str, key: str) -> Decision | None:
    """The decision stored under `key`, or None (missing, unreadable or malformed)."""
    try:
        with open(os.path.join(cache_dir, f"{key}.place.json")) as f:
            data = json.load(f)
        decision = Decision(**data)
    except (OSError, ValueError, TypeError):
        return None
    if decision.winner not in (COMPILED, ONNXRUNTIME):
        return None
    return decision


def store(cache_dir: str, key: str, decision: Decision) -> None:
    """Write the decision atomically; an unwritable directory only loses the entry (the
    compile cache warns about the same directory)."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(decision.as_json(), f)
        os.replace(tmp, os.path.join(cache_dir, f"{key}.place.json"))
    except OSError:
        pass


def _versions() -> str:
    from importlib import metadata

    from autoclust.version import __version__
    try:
        ort = metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        ort = "?"
    return f"autoclust {__version__} onnxruntime {ort} numpy {np.__version__}"


_CPU: list[str] = []


def _cpu() -> str:
    """The CPU model and core count (a decision holds for this machine only)."""
    if not _CPU:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                name = next((line.split(":", 1)[1].strip() for line in f
                             if line.startswith("model name")), name)
        except OSError:
            pass
        _CPU.append(f"{name} x{os.cpu_count()}")
    return _CPU[0]


def log(decision: Decision, budget: Budget) -> None:
    """The --log line of a decision."""
    print(f"autoclust: placement: {decision.text()}; {budget.text()}", file=sys.stderr)
