"""The CPU backend's one background thread, and the gates that keep it off a run's cores.

Prepacking weights (MLAS sessions, oneDNN primitives) and measuring GEMM implementations
run here, in order, in one thread (`submit`), so a process's first runs never wait for
them. Two gates: a first run in progress (`foreground()`, held by Executable's first run)
holds tasks back between them, and a measurement times on quiet cores (`quiet_cores()`:
every compiled executable's run lock, registered with `gate`). `wait_background` waits for
what is queued (benchmarks call it before timing the steady state). library.py is the user.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_POOL: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
_PENDING: list[concurrent.futures.Future] = []
# First runs in progress (foreground()): background tasks start only when none is. A first
# run feeds the GEMMs unpacked weights anyway (MLAS packs them per call), so prepacking
# beside it is the same work done twice on the core the run's second thread needs: BERT-
# base's warm first run took 2x its GEMM time beside the background builds, ~1.4x alone.
_FOREGROUND = threading.Condition()
_HOLDS = [0]
MAX_HOLD_S = 30.0  # a background task waits at most this long for first runs to end


def submit(fn: Callable, *args: Any) -> concurrent.futures.Future:
    """fn(*args) in the one background thread (prepacking, GEMM measurements), in order,
    each task after the first runs in progress (foreground())."""
    with _LOCK:
        if _POOL.get("pool") is None:
            _POOL["pool"] = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="autoclust-prepack")
        future = _POOL["pool"].submit(_after_foreground, fn, *args)
        _PENDING[:] = [f for f in _PENDING if not f.done()] + [future]
    return future


def _after_foreground(fn: Callable, *args: Any) -> Any:
    with _FOREGROUND:
        _FOREGROUND.wait_for(lambda: not _HOLDS[0], timeout=MAX_HOLD_S)
    return fn(*args)


@contextlib.contextmanager
def foreground():
    """Hold background tasks back (between tasks) while a first run is in progress."""
    with _FOREGROUND:
        _HOLDS[0] += 1
    try:
        yield
    finally:
        with _FOREGROUND:
            _HOLDS[0] -= 1
            if not _HOLDS[0]:
                _FOREGROUND.notify_all()


# A GEMM measurement (choice.measure, in the background thread) times on quiet cores: it
# takes every compiled executable's run lock (Arena.lock, held for a whole run), so it
# waits for the runs in progress to end and new ones wait for it, at run boundaries (a run
# is never paused), at no cost to a run. Timed beside the foreground's runs, both
# implementations shared two cores with a run's two threads, and BERT-base's decisions
# flipped between processes (docs/performance.md). A lock not taken within
# MAX_QUIET_WAIT_S (a run inside a run, which holds one lock and waits for another) gives
# the others back and the measurement times anyway.
_RUN_LOCKS: weakref.WeakSet = weakref.WeakSet()  # objects with a `lock` (executable.Arena)
MAX_QUIET_WAIT_S = 2.0


def gate(holder: Any) -> None:
    """Register `holder.lock`, which a compiled run holds while it runs (Executable)."""
    with _LOCK:
        _RUN_LOCKS.add(holder)


@contextlib.contextmanager
def quiet_cores():
    """No compiled run in progress or starting (all run locks held) while this lasts."""
    with _LOCK:
        holders = list(_RUN_LOCKS)
    taken = []
    for h in holders:
        if not h.lock.acquire(timeout=MAX_QUIET_WAIT_S):
            for lock in reversed(taken):  # not given up in time: the others go back too,
                lock.release()            # and the timing goes on as it comes
            taken = []
            break
        taken.append(h.lock)
    try:
        yield
    finally:
        for lock in reversed(taken):
            lock.release()


def wait_background(timeout: float | None = None) -> bool:
    """Wait for the prepacked sessions being built and the GEMM measurements being made in
    the background; True when none is left (benchmarks call it before timing the steady
    state)."""
    with _LOCK:
        pending = [f for f in _PENDING if not f.done()]
    not_done = concurrent.futures.wait(pending, timeout=timeout).not_done
    return not not_done


def until_ready(future: concurrent.futures.Future, stand_in: Callable,
                ready: Callable[[Any], Callable]) -> Callable:
    """Calls run `stand_in` until `future` (background work) is done, then
    ready(its result); a failed future leaves the stand-in in place for good."""
    current: list[Callable | None] = [None]

    def run(inputs: Any, outputs: Any) -> None:
        fast = current[0]
        if fast is None:
            if not future.done():
                stand_in(inputs, outputs)
                return
            fast = current[0] = stand_in if future.exception() is not None else \
                ready(future.result())
        fast(inputs, outputs)

    return run
