"""GEMM implementations timed where the plan calls them: the second half of choosing one.

choice.measure times MLAS against oneDNN on a call alone, in a loop on probe arrays: warm
caches, the same output buffer each time, no kernel before or after. A plan's call follows
other kernels and writes a buffer the next one reads, and its time there can differ from
its time alone by more than the two implementations differ. BERT-base (2 threads, one
process, every call timed where it ran): the attention's P.V MatMul measured 0.19 ms on
MLAS and 0.20 ms on oneDNN alone, and took 0.41-0.52 ms on MLAS and 0.25 ms on oneDNN in
the plan. A [4500, 64] x [64, 750] GEMM into a Softmax (Whisper-tiny's six heads' scores
stacked), oneDNN 7% faster alone, took 5.5 ms on oneDNN and 3.5 ms on MLAS in the plan
(one thread).

So once choice.measure has answered for a signature, its calls enter a `Trial`: they
take the implementations in turn (MLAS, oneDNN and, for constant weights, packed.py's
GEMM; call by call over every call of the signature, so a layer's neighbours see each),
each call timed where it runs, until each side has MIN_SAMPLES. The fastest median then
serves every call of the signature, the measured answer unless another is faster by more
than MARGIN; `explain` and --cache_dir keep
both medians, so a second process takes the answer without a trial. An executable whose
calls are in a trial is not settled (measured placement waits for it: autotune.py).

Then the whole plan (`PlanTrial`): a call's trial times it next to calls on either library,
but a decided plan runs its calls back to back, and each switch between the libraries
wakes the other's thread pool. A chain of sixteen 64x256x1024 GEMMs: the calls' trials
chose oneDNN (0.15 ms a call against MLAS's 0.18 in the alternation); the plan ran 2.05 ms
on oneDNN alone and 1.65 ms on MLAS alone. BART (the sweep's) ran 2.40 ms on MLAS alone
against 2.62 as decided, ELECTRA 1.11 against 1.20, T5 13.5 on oneDNN alone against 13.8.
So once the calls have decided, the executable's runs alternate between its calls as
decided, all on MLAS, all on oneDNN and all on packed.py's GEMM (each variant moving the
calls that have it), whole runs timed after
an untimed run of the same variant; a variant faster than as-decided by more than MARGIN
in the median serves, and its calls' decisions are remembered as theirs (--cache_dir).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

MIN_SAMPLES = 6   # timed calls of each implementation before the trial decides
PLAN_SAMPLES = 6  # timed runs of each variant of the whole plan (PlanTrial)
DECIDED = "as decided"
# bumped whenever a call's `impl` changes (library.LibraryFn.switch, PlanTrial.apply): a
# plan caches what it derives from its calls' impls (Executable._polling_pool) until then
SWITCHES = [0]
MARGIN = 0.03     # the other implementation must be faster than this to take over


class Trial:
    """The calls of one signature alternating between `first` (choice.measure's answer)
    and `other`; `decided(winner, note)` is called once, by the call that completes the
    samples. While `ready()` is false (the background thread still packs weights or
    measures another signature, on the same cores) calls run `first`, untimed. `clock` is
    injectable for tests."""

    def __init__(self, first: str, other: str | tuple[str, ...],
                 decided: Callable[[str, str], None],
                 ready: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.perf_counter):
        self.sides = (first,) + ((other,) if isinstance(other, str) else tuple(other))
        self.times: dict[str, list[float]] = {side: [] for side in self.sides}
        self.ready = ready
        self.clock = clock
        self.done = False
        self.calls: list = []  # what alternates under it (library.py: (LibraryFn, runs))
        self._decided = decided
        self._count = 0
        self._lock = threading.Lock()

    def side(self) -> str:
        """The implementation the next call runs: each call the next one, in turn."""
        with self._lock:
            self._count += 1
            return self.sides[(self._count - 1) % len(self.sides)]

    def record(self, impl: str, seconds: float) -> None:
        """One call's time; decides when both sides have MIN_SAMPLES."""
        with self._lock:
            if self.done:
                return
            self.times[impl].append(seconds)
            if min(len(t) for t in self.times.values()) < MIN_SAMPLES:
                return
            self.done = True
        self._decided(*self.verdict())

    def verdict(self) -> tuple[str, str]:
        """(winner, note): the fastest of the others where its median call is more than
        MARGIN faster than `first`'s, else `first`."""
        medians = {s: statistics.median(self.times[s]) for s in self.sides}
        first = self.sides[0]
        best = min(self.sides[1:], key=medians.__getitem__)
        winner = best if medians[best] < medians[first] * (1 - MARGIN) else first
        n = min(len(t) for t in self.times.values())
        shown = ", ".join(f"{s} {medians[s] * 1e3:.3f} ms" for s in self.sides)
        return winner, f"in the plan: {shown} (medians of {n} calls each)"


class PlanTrial:
    """The runs of one executable alternating between variants of its library calls (see
    the module doc): `variant()` names the next run's (applied to the calls) and whether
    it is timed, `record` a timed run's seconds (the executable times them).
    `decided(winner, note)` is called once, with DECIDED or a library that every call then
    runs on."""

    def __init__(self, fns: list, decided: Callable[[str, str], None]):
        self.fns = fns  # library.LibraryFn with implementations to try (alternatives)
        self.as_decided = [(fn.impl, fn._current) for fn in fns]
        libs = dict.fromkeys(lib for fn in fns for lib in fn.alternatives)
        # a library's variant runs every call that has it on it, the others as decided
        variants = [DECIDED] + [lib for lib in libs if any(
            fn.impl != lib and lib in fn.alternatives for fn in fns)]
        self.times: dict[str, list[float]] = {v: [] for v in variants}
        self.done = False
        self.shapes: list = []  # the input shapes its runs are timed at (the executable's)
        self.elsewhere = 0  # runs at other shapes meanwhile (a shape class's other lengths)
        self._decided = decided
        self._runs = 0

    def variant(self) -> tuple[str, bool]:
        """(the next run's variant, whether that run is timed): each variant runs twice
        in a row, the second run timed (the first wakes its library's threads)."""
        names = list(self.times)
        name = names[(self._runs // 2) % len(names)]
        timed = self._runs % 2 == 1
        self._runs += 1
        self.apply(name)
        return name, timed

    def apply(self, name: str) -> None:
        for fn, (impl, current) in zip(self.fns, self.as_decided):
            if name == DECIDED or name not in fn.alternatives:
                fn.impl, fn._current = impl, current
                SWITCHES[0] += 1
            else:
                fn._current = (fn.alternatives[name], name == "onednn", None)

    def abandon(self) -> None:
        """Give up (the runs came at other shapes): the calls stay as decided."""
        self.done = True
        self.apply(DECIDED)
        for fn in self.fns:
            fn.alternatives = {}

    def record(self, name: str, seconds: float) -> None:
        """One timed run; decides once every variant has PLAN_SAMPLES."""
        self.times[name].append(seconds)
        if self.done or min(len(t) for t in self.times.values()) < PLAN_SAMPLES:
            return
        self.done = True
        medians = {v: statistics.median(t) for v, t in self.times.items()}
        best = min(medians, key=medians.__getitem__)
        if medians[best] > medians[DECIDED] * (1 - MARGIN):
            best = DECIDED
        self.apply(best)
        note = "whole plan: " + ", ".join(f"{v} {ms * 1e3:.3f} ms"
                                          for v, ms in medians.items())
        self._decided(best, f"{note} (medians of {PLAN_SAMPLES} runs each)")
