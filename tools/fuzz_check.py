"""The fuzzer's oracle: one model + feeds, checked against onnxruntime and the interpreter.

`check(model, feeds, variants)` runs onnxruntime with graph optimizations off (the
expected outputs), the whole graph through our NumPy references (interpreter), and an
autoclust session per flag variant; every result must match onnxruntime within
rtol 1e-4 / atol 1e-5 (float32), with the same dtype and shape. Variants after the first
are metamorphic: forcing clusters to fall back (clustering fuel, exclude lists) must not
change outputs.
"""

from __future__ import annotations

import dataclasses
import traceback
import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

RTOL = 1e-4
ATOL = 1e-5

OK, MISMATCH, ERROR, CRASH, INVALID = "ok", "mismatch", "error", "crash", "invalid"
# Outputs were right, but a cluster's compile failed and it fell back to onnxruntime: a
# backend bug (its why_not should have refused the node), reported but not a failure.
FALLBACK = "compile_fallback"


@dataclasses.dataclass
class Outcome:
    """What one check found: kind (ok/mismatch/error/crash/invalid), where, and why."""

    kind: str
    where: str = ""       # "interpreter", or the flags of the failing autoclust variant
    message: str = ""
    flags: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.kind in (MISMATCH, ERROR, CRASH)

    def same_failure(self, other: Outcome) -> bool:
        """True when `other` reproduces this failure (kind and place), for the shrinker."""
        return other.kind == self.kind and other.where == self.where


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime with every graph optimization off: the reference outputs."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_interpreter(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The whole graph through the op table's NumPy references (no clustering)."""
    from autoclust.importers.onnx import import_model

    from autoclust import interpreter
    graph = import_model(model)
    inputs = [feeds[v.name] for v in graph.inputs if v.name in feeds]
    with np.errstate(all="ignore"):
        return interpreter.evaluate(graph, inputs)


def run_autoclust(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                  flags: dict[str, Any]) -> tuple[list[np.ndarray], list[str]]:
    """An autoclust session with `flags`, run once: outputs and compile-failure reasons."""
    import autoclust
    sess = autoclust.InferenceSession(model, **flags)
    outs = sess.run(None, feeds)
    failed = [f"{c['name']}: {c['fallback']}" for c in sess.stats()["clusters"]
              if c["fallback"] and str(c["fallback"]).startswith("compile failed")]
    return outs, failed


def compare(got: list[np.ndarray], want: list[np.ndarray], rtol: float = RTOL,
            atol: float = ATOL) -> str:
    """'' when outputs match (dtype, shape, values within tolerance), else what differs."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.dtype != w.dtype:
            return f"output {i}: dtype {g.dtype}, expected {w.dtype}"
        if g.shape != w.shape:
            return f"output {i}: shape {g.shape}, expected {w.shape}"
        if w.dtype.kind in "fc":
            close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = g == w
        if not close.all():
            bad = np.argwhere(~close)
            at = tuple(int(j) for j in bad[0])
            diff = np.max(np.abs(g.astype(float) - w.astype(float))[~close]) \
                if w.dtype.kind in "fiub" else float("nan")
            return (f"output {i}: {len(bad)} of {w.size} elements differ; first at {at}: "
                    f"got {g[at]!s}, expected {w[at]!s}; max abs diff {diff:.3g}")
    return ""


def _error(where: str, flags: dict, exc: BaseException) -> Outcome:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    last = "".join(tb[-3:])
    return Outcome(ERROR, where, f"{type(exc).__name__}: {exc}\n{last}", flags)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
          variants: list[dict[str, Any]], rtol: float = RTOL, atol: float = ATOL) -> Outcome:
    """Run every oracle and variant; the first failure found, or Outcome('ok')."""
    try:
        expected = run_ort(model, feeds)
    except Exception as exc:  # noqa: BLE001 - an invalid graph (generator or shrink step)
        return Outcome(INVALID, "onnxruntime", f"{type(exc).__name__}: {exc}")
    try:
        diff = compare(run_interpreter(model, feeds), expected, rtol, atol)
    except Exception as exc:  # noqa: BLE001 - any exception is a finding
        return _error("interpreter", {}, exc)
    if diff:
        return Outcome(MISMATCH, "interpreter", diff)
    fallback = None
    for flags in variants:
        where = "autoclust " + " ".join(f"{k}={v}" for k, v in sorted(flags.items()))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got, compile_failures = run_autoclust(model, feeds, flags)
        except Exception as exc:  # noqa: BLE001 - any exception is a finding
            return _error(where, flags, exc)
        diff = compare(got, expected, rtol, atol)
        if diff:
            return Outcome(MISMATCH, where, diff, flags)
        if compile_failures and fallback is None:
            fallback = Outcome(FALLBACK, where, "\n".join(compile_failures), flags)
    return fallback or Outcome(OK)


def ops_of(model: onnx.ModelProto) -> list[str]:
    """The distinct op types of a model, sorted."""
    return sorted({n.op_type for n in model.graph.node})


def variants_for(model: onnx.ModelProto, device: str, rng: np.random.Generator,
                 metamorphic: int = 2) -> list[dict[str, Any]]:
    """The base autoclust flags plus `metamorphic` random fallback-forcing variants."""
    base = {"device": device, "min_cluster_size": int(rng.choice([1, 1, 2, 4]))}
    out = [base]
    n_nodes = len(model.graph.node)
    op_types = ops_of(model)
    for _ in range(metamorphic):
        v = dict(base)
        if rng.random() < 0.5 or not op_types:
            v["clustering_fuel"] = int(rng.integers(0, n_nodes + 1))
        else:
            k = int(rng.integers(1, len(op_types) + 1))
            v["cluster_exclude_ops"] = sorted(str(o) for o in
                                              rng.choice(op_types, size=k, replace=False))
        out.append(v)
    return out
