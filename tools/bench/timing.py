"""Shared measurement helpers of the benchmarks: sessions, alternating timing, tables.

Every benchmark here times its sides (onnxruntime, autoclust, and whatever else it
compares) the same way: `alternate(sides, rounds, block)` runs, round after round, each
side for one untimed run and then `block` timed runs, and returns each side's median.
Short blocks alternating over rounds let load from other processes on a shared machine
hit every side alike; the untimed run keeps one side's cache and thread wake-up state
from being charged to the next.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def ort_options(threads: int) -> Any:
    """The baseline SessionOptions: ORT_ENABLE_ALL, `threads` intra-op threads, no spinning.

    Spinning is off because the runs alternate with other sides': onnxruntime's default
    spin-waiting threads would keep both cores busy during their runs (and spinning off is
    measured faster for onnxruntime itself on the shared 2-core machines).
    """
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def ort_session(model: Any, threads: int, profile_prefix: str = "") -> Any:
    """An onnxruntime CPU session over `model` (ModelProto, bytes or path) with ort_options.
    onnxruntime's own class even under AUTOCLUST_FLAGS: the hook (autoclust/hook.py) then
    swaps onnxruntime.InferenceSession for one that runs autoclust, and a benchmark given
    its flags that way compared autoclust with itself ("onnxruntime's profile: 0 nodes")."""
    import onnx
    from autoclust.backends.ort import ORIGINAL_SESSION
    so = ort_options(threads)
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    return ORIGINAL_SESSION(model, so, providers=["CPUExecutionProvider"])


def autoclust_session(model: Any, threads: int, flags: str = "") -> Any:
    """An autoclust session with the baseline's SessionOptions and `--threads=threads`."""
    import autoclust
    from autoclust import flags as flags_mod
    overrides = flags_mod.parse_string(flags)
    overrides.setdefault("threads", threads)
    return autoclust.InferenceSession(model, ort_options(threads), **overrides)


def settle(sess: Any, feeds: dict[str, Any], max_runs: int = 600) -> int:
    """Run `sess` until its steady state: prepacked GEMM weights built in the background
    and measured placement decided for this signature (its trials, and the looks at their
    winners as they serve: autotune.Watch). Returns the runs it took."""
    from autoclust.backends.cpu import library

    from autoclust.runtime import autotune
    runtime = getattr(sess, "_runtime", None)
    library.wait_background(timeout=60)
    runs = 0
    while runs < max_runs and (runs == 0 or autotune.measuring(runtime)):
        sess.run(None, feeds)
        runs += 1
    library.wait_background(timeout=60)  # a new session's weights prepack after its runs
    return runs


def placement(sess: Any) -> list[dict[str, Any]]:
    """The session's measured placement decisions (autoclust/runtime/autotune.py)."""
    plan = getattr(sess, "plan", None)
    return [d.as_json() for d in getattr(plan, "placement", [])]


def alternate(sides: Mapping[str, Callable[[], Any]], rounds: int, block: int
              ) -> dict[str, list[float]]:
    """Seconds per timed run of each side, timed in alternating blocks over `rounds`."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            fn()  # untimed: wakes threads, warms caches after the other side ran
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return times


def round_ratios(times: Mapping[str, Sequence[float]], num: str, den: str, block: int
                 ) -> list[float]:
    """median(num block) / median(den block) of each round (alternate's order)."""
    a, b = times[num], times[den]
    rounds = min(len(a), len(b)) // max(block, 1)
    return [float(np.median(a[r * block:(r + 1) * block]) /
                  np.median(b[r * block:(r + 1) * block])) for r in range(rounds)]


def round_ratio(times: Mapping[str, Sequence[float]], num: str, den: str, block: int) -> float:
    """The median over rounds of each round's ratio (see round_ratios; NaN without rounds).

    Each round's blocks run back to back and see one load state of the machine; a ratio
    of the two sides' medians over all rounds mixes states instead. On a host whose load
    moves by 2x within minutes (onnxruntime's Qwen2-like 16.7 ms in one process, 37.4 ms
    in the next) the round's ratio is the steadier estimate of the same quantity."""
    ratios = round_ratios(times, num, den, block)
    return float(np.median(ratios)) if ratios else float("nan")


def ratio_spread(times: Mapping[str, Sequence[float]], num: str, den: str, block: int
                 ) -> tuple[float, float]:
    """(25th, 75th percentile) over rounds of median(num block) / median(den block).

    Each round's blocks ran back to back, so a round's ratio sees one load state; the
    spread over rounds says how far the machine's load moved the figure.
    """
    ratios = round_ratios(times, num, den, block)
    if not ratios:
        return float("nan"), float("nan")
    return float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75))


def median_ms(samples: Sequence[float]) -> float:
    return float(np.median(samples)) * 1e3 if len(samples) else float("nan")


def timed_ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), its wall time in ms)."""
    t0 = time.perf_counter()
    out = fn()
    return out, (time.perf_counter() - t0) * 1e3


def max_abs_err(got: Sequence[Any], want: Sequence[Any]) -> float:
    """The largest |got - want| over all outputs (NaN where they disagree on shape)."""
    worst = 0.0
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return float("nan")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    return worst


def geomean(values: Sequence[float]) -> float:
    good = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else float("nan")


def load_note() -> str:
    """The 1-minute load average and core count, to print beside figures from a shared box."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    return f"load average {load:.2f} on {os.cpu_count()} cores"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A Markdown table; `align` has one character per column, 'l' or 'r' (default 'r')."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return ""
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"
