"""The fuzzer's oracle: one model + feeds, checked against onnxruntime and the interpreter.

`check(model, feeds, variants)` runs onnxruntime with graph optimizations off (the
expected outputs), the whole graph through our NumPy references (interpreter), and an
autoclust session per flag variant. Variants after the first are metamorphic: forcing
clusters to fall back (clustering fuel, exclude lists) must not change outputs.

Every result must have onnxruntime's dtype and shape, NaN where it has NaN, the same
infinities, and values within a per-element tolerance:
    |got - want| <= rtol * |want| + SENSITIVITY * spread + atol
  - rtol: 1e-4 for float32, 8 float16 ulps of `want` for float16, 1e-9 for float64
    (`autoclust minify/bisect --rtol` set one rtol for every float dtype);
  - atol: the smallest normal number of the dtype (a denormal result may flush to 0, but
    Softplus(-20) = 2.06e-9 must not come back as 0); `--atol` replaces it;
  - spread: how far onnxruntime's own output moves when every float input and initializer
    moves by one ulp (max over four jittered runs, fuzz_values.jitter). Outputs that
    cancellation, huge magnitudes or a discontinuity make sensitive to rounding get a
    matching tolerance; well-conditioned ones are held to rtol. Integer and bool outputs
    must be equal where the spread is 0 (a Floor or ArgMax whose input sits on a rounding
    edge may differ).
Elements outside the tolerance that the ONNX reference implementation or a float64 run
supports are accepted (onnxruntime is inexact or rounds float16 differently in places:
tools/fuzz/truth.py).
When onnxruntime raises at run time for these feeds (an integer division by zero, an
index out of range), the interpreter must raise too, and every autoclust session must
raise an autoclust error (autoclust.errors, or onnxruntime's own from a fallback
segment) that names an op or node of the model: returning values is a mismatch. An error
of onnxruntime's own (one that a run without buffer reuse does not meet,
truth.run_reference) is no error of the feeds: that run's outputs are expected, and an
autoclust session may only raise the same failure of onnxruntime's, from a fallback segment.
onnxruntime failing to load the model means the generator built an invalid graph.
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback
import warnings
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from autoclust.tools.fuzz import truth as fuzz_truth
from autoclust.tools.fuzz import values as fuzz_values
from autoclust.tools.fuzz.truth import (  # noqa: F401 - check.run_ort
    JITTER_RUNS,
    SENSITIVITY,
    exact_values,
    integral,
    ort_session,
    run_ort,
)

DTYPE_RTOL = {np.dtype("float32"): 1e-4, np.dtype("float64"): 1e-9}
# The defaults of check()'s and the tools' rtol/atol: None means per dtype (above).
RTOL: float | None = None
ATOL: float | None = None
F16_ULPS = 8

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
    cause: str = ""       # what went wrong: values/NaN/shape/dtype, or exception and site
    op: str = ""          # the op that produced the mismatching output

    @property
    def failed(self) -> bool:
        return self.kind in (MISMATCH, ERROR, CRASH)

    def same_failure(self, other: Outcome) -> bool:
        """True when `other` reproduces this failure (kind, place, cause), for the shrinker."""
        return (other.kind, other.where, other.cause) == (self.kind, self.where, self.cause)

    def signature(self) -> str:
        """kind, interpreter or autoclust, op and cause: failures that likely share a bug."""
        side = "interpreter" if self.where == "interpreter" else self.where.split(" ")[0]
        what = " ".join(x for x in (self.op, self.cause) if x)
        return f"{self.kind} in {side}: {what}" if what else f"{self.kind} in {side}"


# ---- running the sides ----------------------------------------------------------------------

def run_interpreter(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The whole graph through the op table's NumPy references (no clustering)."""
    from autoclust.importers.onnx import import_model

    from autoclust.runtime import interpreter
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


def spread_of(model: onnx.ModelProto, sess: ort.InferenceSession,
              feeds: dict[str, np.ndarray], expected: list[np.ndarray]) -> list[np.ndarray | None]:
    """Per output, how far onnxruntime's result moves when every float input and
    initializer moves by one ulp (None where the jitter changed its shape)."""
    exact = exact_values(model)
    # Constants too: in (x + 1e8) - 1e8 only the constant's ulp shows the rounding. They
    # are fed to one session (a session per jittered copy of BERT-base took 10 s each).
    free, constants = _constants_as_inputs(model)
    try:  # the same buffer reuse as sess (off where onnxruntime's planner failed)
        reuse = sess.get_session_options().enable_mem_reuse
        run = ort_session(free, reuse) if constants else sess
    except Exception:  # noqa: BLE001 - an op that needs a constant: jitter the feeds only
        run, constants = sess, {}
    return _spread(run, feeds, constants, exact, expected)


def outputs_and_spread(model: onnx.ModelProto, feeds: dict[str, np.ndarray]
                       ) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """onnxruntime's outputs and their spread_of, from one session that takes the float
    initializers as inputs (onnxruntime copies no weights); raises what onnxruntime does."""
    exact = exact_values(model)
    free, constants = _constants_as_inputs(model)
    try:
        sess = ort_session(free)
    except Exception:  # noqa: BLE001 - an op that needs a constant: the model as it is
        sess, expected, _ = fuzz_truth.run_reference(model, feeds)
        return expected, spread_of(model, sess, feeds, expected)
    sess, expected, _ = fuzz_truth.run_reference(free, {**feeds, **constants}, sess)
    return expected, _spread(sess, feeds, constants, exact, expected)


def _spread(sess: ort.InferenceSession, feeds: dict[str, np.ndarray],
            constants: dict[str, np.ndarray], exact: set[str],
            expected: list[np.ndarray]) -> list[np.ndarray | None]:
    rng = np.random.default_rng(0)
    spread: list[np.ndarray | None] = [np.zeros(w.shape, _spread_type(w)) for w in expected]
    for _ in range(JITTER_RUNS):
        moved = {k: v if k in exact and integral(v) else fuzz_values.jitter(rng, v)
                 for k, v in {**feeds, **constants}.items()}
        try:
            outs = sess.run(None, moved)
        except Exception:  # noqa: BLE001 - e.g. a jittered float Range that changed a shape
            outs = []  # no sample from this run
        for i, (w, j) in enumerate(zip(expected, outs)):
            s = spread[i]
            if s is None or j.shape != w.shape or j.dtype != w.dtype:
                spread[i] = None
            elif s.dtype == np.float32:  # 4 float32 passes, not 10 float64 ones
                np.maximum(s, _distance32(j, w), out=s)
            else:
                np.maximum(s, _distance(j, w), out=s)
    return spread


def _spread_type(want: np.ndarray) -> type:
    """float32 distances for float32 and float16 outputs (exact: jitter keeps signs)."""
    return np.float32 if want.dtype in (np.float32, np.float16) else np.float64


def _distance32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """_distance of two float32 or float16 arrays, computed in float32."""
    a32, b32 = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
    d = np.empty(np.shape(a32), np.float32)  # an array even for 0-d outputs
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(a32, b32, out=d)
    np.abs(d, out=d)
    odd = np.isnan(d)  # a NaN on either side, or inf - inf
    if odd.any():
        same = (a32[odd] == b32[odd]) | (np.isnan(a32[odd]) & np.isnan(b32[odd]))
        d[odd] = np.where(same, 0.0, np.inf)
    return d


_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)


def _constants_as_inputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """`model` with its float initializers and Clip's missing bounds
    (truth.explicit_clip_bounds) as graph inputs (but integers the jitter leaves), and
    their values; ({}) when there is none to jitter."""
    return fuzz_truth.lift_initializers(fuzz_truth.explicit_clip_bounds(model), _FLOATS,
                                        outputs=True)


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in float64, elementwise: 0 for equal values (inf == inf, NaN == NaN), inf
    where one is NaN and the other not or the infinities differ."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a64 - b64)
    same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
    d = np.where(same, 0.0, d)
    return np.where(np.isnan(d), np.inf, d)


# ---- comparing ------------------------------------------------------------------------------

def tolerance(want: np.ndarray, spread: np.ndarray | None, rtol: float | None = RTOL,
              atol: float | None = ATOL) -> np.ndarray:
    """The per-element tolerance for `want` (see the module docstring); rtol/atol None:
    the dtype's own."""
    extra = 0.0 if spread is None else SENSITIVITY * spread
    if want.dtype.kind != "f":
        return np.zeros(want.shape) + extra
    w64 = np.nan_to_num(np.abs(want.astype(np.float64)), posinf=0.0)
    if rtol is not None:
        rel = rtol * w64
    elif want.dtype == np.float16:
        rel = F16_ULPS * np.nan_to_num(fuzz_values.ulp(want), posinf=0.0)
    else:
        rel = DTYPE_RTOL.get(want.dtype, 1e-4) * w64
    return rel + extra + (float(np.finfo(want.dtype).tiny) if atol is None else atol)


def compare(got: list[np.ndarray], want: list[np.ndarray],
            spread: list[np.ndarray | None] | None = None, names: list[str] | None = None,
            arbiter: fuzz_truth.Arbiter | None = None, rtol: float | None = RTOL,
            atol: float | None = ATOL) -> str:
    """'' when outputs match (dtype, shape, NaN/inf, values within tolerance), else what
    differs; names[i] says which node produced output i. The arbiter excuses elements the
    ONNX reference or a float64 run supports, and whole outputs of another shape that the
    ONNX reference gives (tools/fuzz/truth.py)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        label = f"output {i}" + (f" ({names[i]})" if names else "")
        if g.dtype != w.dtype:
            return f"{label}: dtype {g.dtype}, expected {w.dtype}"
        if g.shape != w.shape:
            if arbiter is not None and arbiter.agrees(
                    i, g, lambda x: tolerance(x, None, rtol, atol), _distance):
                continue
            return f"{label}: shape {g.shape}, expected {w.shape}"
        spread_i = spread[i] if spread else None
        tol = tolerance(w, spread_i, rtol, atol)
        if w.dtype.kind in "fc":
            bad = ~(_distance(g, w) <= tol)
        else:  # exact unless the spread allows, and no float64 rounding of int64
            bad = (g != w) & ~((tol > 0) & (_distance(g, w) <= tol))
        if bad.any() and arbiter is not None:
            bad = arbiter.excuse(i, g, w, bad,
                                 lambda x, s=spread_i: tolerance(x, s, rtol, atol), _distance)
        if bad.any():
            return _describe(label, g, w, tol, bad)
    return ""


def _describe(label: str, g: np.ndarray, w: np.ndarray, tol: np.ndarray,
              bad: np.ndarray) -> str:
    where = np.argwhere(bad)
    at = tuple(int(j) for j in where[0])
    nan = int((np.isnan(g) != np.isnan(w)).sum()) if w.dtype.kind == "f" else 0
    what = f"; NaN differs at {nan}" if nan else ""
    return (f"{label}: {len(where)} of {w.size} elements differ{what}; first at {at}: "
            f"got {g[at]!s}, expected {w[at]!s} (tolerance {tol[at]:.3g})")


# ---- the check ------------------------------------------------------------------------------

def _producers(model: onnx.ModelProto) -> list[str]:
    by_output = {o: n for n in model.graph.node for o in n.output}
    names = []
    for o in model.graph.output:
        node = by_output.get(o.name)
        names.append(f"{node.op_type} {o.name!r}" if node is not None else o.name)
    return names


_OURS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cause(exc: BaseException) -> str:
    """The exception type and the innermost frame of this project (not NumPy's, which
    many ops share): one key per raising site."""
    tb = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in tb if os.path.abspath(f.filename).startswith(_OURS + os.sep)
            and "site-packages" not in f.filename[len(_OURS):]]
    last = (ours or tb)[-1:]
    frame = f" at {os.path.basename(last[0].filename)}:{last[0].name}" if last else ""
    return f"{type(exc).__name__}{frame}"


def _error(where: str, flags: dict, exc: BaseException, note: str = "") -> Outcome:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    last = "".join(tb[-3:])
    return Outcome(ERROR, where, f"{note}{type(exc).__name__}: {exc}\n{last}", flags,
                   ("raised where onnxruntime raised: " if note else "") + _cause(exc))


def _names_the_model(exc: BaseException, model: onnx.ModelProto) -> bool:
    text = str(exc)
    names = {n.op_type for n in model.graph.node} | {n.name for n in model.graph.node if n.name}
    return any(n in text for n in names)


BOUNDS_PROOF_FAILED = "a shape check is missing"  # autoclust.kernel.bounds' CompileError


def _crash_in_compiler(reason: str) -> bool:
    """Whether a compile failure ("cluster_0001: compile failed: IndexError: ...") was a
    Python error in the compiler itself (IndexError, AttributeError, ...) rather than one
    of autoclust's own refusals (CompileError, UnsupportedOpError, ...)."""
    import builtins
    found = re.search(r"compile failed: (\w+):", reason)
    kind = getattr(builtins, found.group(1), None) if found else None
    return isinstance(kind, type) and issubclass(kind, Exception) and kind is not MemoryError


def _clear_error(exc: BaseException, model: onnx.ModelProto) -> bool:
    """An autoclust error (or onnxruntime's, from a fallback) naming an op or node."""
    from autoclust.errors import AutoclustError
    ours = isinstance(exc, AutoclustError) or type(exc).__module__.startswith("onnxruntime")
    return ours and _names_the_model(exc, model)


def _mismatch(where: str, diff: str, flags: dict, names: list[str]) -> Outcome:
    op = next((n.split(" ")[0] for i, n in enumerate(names) if diff.startswith(f"output {i} ")),
              "")
    kind = next((k for k in ("dtype", "shape", "NaN") if f" {k} " in diff or f"{k} differs"
                 in diff), "values")
    return Outcome(MISMATCH, where, diff, flags, kind, op)


def _generic(message: str) -> str:
    """A message without the names of clusters, nodes and values (one key per cause)."""
    return re.sub(r"\b(cluster_\d+|[a-z]+_\d+|n\d+)\b", "_", message)


def _ort_failure(exc: BaseException) -> tuple[str, str]:
    """(op type, message) of onnxruntime's run-time error."""
    text = str(exc)
    found = re.search(r"while running (\w+) node", text)
    message = text.split("Status Message:")[-1].strip()[:200] or type(exc).__name__
    return (found.group(1) if found else ""), message


def _inherited(exc: BaseException, ort_bug: str) -> bool:
    """Whether `exc` is onnxruntime's own failure `ort_bug` (truth.failure_site), met again
    in a fallback segment's session, which keeps buffer reuse on (the user's options)."""
    onnxruntime = type(exc).__module__.startswith("onnxruntime")
    return bool(ort_bug) and onnxruntime and ort_bug in str(exc)


def _check_side(where: str, flags: dict, run: Any, ref: Reference,
                tol: tuple[float | None, float | None]) -> tuple[Outcome | None, list[str]]:
    """Run one side; (a failure or None, compile-failure reasons)."""
    raised_op, raised = ref.raised
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, compile_failures = run()
    except Exception as exc:  # noqa: BLE001 - any exception is a finding
        if not raised:
            if _inherited(exc, ref.ort_bug):
                return None, []
            return _error(where, flags, exc), []
        if where == "interpreter" or _clear_error(exc, ref.model):
            return None, []
        return _error(where, flags, exc, f"onnxruntime raised ({raised}); this is not a "
                      "clear autoclust error naming the op: "), []
    if raised:
        return Outcome(MISMATCH, where, f"returned values where onnxruntime raised: {raised}",
                       flags, "returned values where onnxruntime raised", raised_op), []
    unproven = [c for c in compile_failures if BOUNDS_PROOF_FAILED in c]
    if unproven:  # kernel/bounds.py: this kernel would have read outside a buffer
        return Outcome(ERROR, where, "\n".join(unproven), flags,
                       "a kernel access not proven inside its buffer"), []
    crashed = [c for c in compile_failures if _crash_in_compiler(c)]
    if crashed:  # an IndexError inside the compiler is a bug, not a refusal: no fallback
        return Outcome(ERROR, where, "\n".join(crashed), flags,
                       "compile crashed: " + _generic(crashed[0].split(": ", 2)[-1])[:80]), []
    diff = compare(got, ref.expected, ref.spread, ref.names, ref.arbiter, *tol)
    return (_mismatch(where, diff, flags, ref.names) if diff else None), compile_failures


@dataclasses.dataclass
class Reference:
    """onnxruntime's side of a check: the same for every variant of one model and feeds,
    so a caller checking many variants one at a time (bisect's worker) computes it once."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    expected: list[np.ndarray] | None
    raised: tuple[str, str]  # onnxruntime's run-time error (op, message), or ("", "")
    spread: list[np.ndarray | None]
    names: list[str]
    arbiter: fuzz_truth.Arbiter
    # Where onnxruntime failed on its own (truth.run_reference), or "": `expected` then
    # comes from a session without buffer reuse.
    ort_bug: str = ""
    interpreter: dict[tuple, Outcome | None] = dataclasses.field(default_factory=dict)


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> Reference | Outcome:
    """onnxruntime's outputs (or run-time error) and their spread; Outcome('invalid') when
    onnxruntime cannot load the model."""
    try:
        sess = ort_session(model)
    except Exception as exc:  # noqa: BLE001 - an invalid graph (generator or shrink step)
        return Outcome(INVALID, "onnxruntime", f"{type(exc).__name__}: {exc}")
    expected, raised, ort_bug, spread = None, ("", ""), "", []
    try:
        sess, expected, ort_bug = fuzz_truth.run_reference(model, feeds, sess)
    except Exception as exc:  # noqa: BLE001 - a run-time error both sides must agree on
        raised = _ort_failure(exc)
    if expected is not None:
        spread = spread_of(model, sess, feeds, expected)
    return Reference(model, feeds, expected, raised, spread, _producers(model),
                     fuzz_truth.Arbiter(model, feeds), ort_bug)


def given(model: onnx.ModelProto, feeds: dict[str, np.ndarray], expected: list[np.ndarray],
          spread: list[np.ndarray | None]) -> Reference:
    """A Reference from outputs and spreads computed elsewhere (bisect runs onnxruntime on
    a whole model once, then checks pieces of it against those values)."""
    return Reference(model, feeds, expected, ("", ""), spread, _producers(model),
                     fuzz_truth.Arbiter(model, feeds))


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
          variants: list[dict[str, Any]], rtol: float | None = RTOL,
          atol: float | None = ATOL, ref: Reference | None = None,
          interpreter: bool = True) -> Outcome:
    """Run every oracle and variant; the first failure found, or Outcome('ok').

    rtol/atol None: the per-dtype tolerances of the module docstring. `ref`: reference(model,
    feeds) from an earlier check (its interpreter verdict is kept in it too), or given().
    interpreter=False: autoclust's sides only (bisect asks about compiled code alone)."""
    ref = reference(model, feeds) if ref is None else ref
    if isinstance(ref, Outcome):
        return ref
    tol, fallback = (rtol, atol), None
    # autoclust first: a reference bug must not hide what the product returns.
    for flags in variants:
        where = "autoclust " + " ".join(f"{k}={v}" for k, v in sorted(flags.items()))
        failure, compile_failures = _check_side(
            where, flags, lambda f=flags: run_autoclust(ref.model, ref.feeds, f), ref, tol)
        if failure is not None:
            return failure
        if compile_failures and fallback is None:
            fallback = Outcome(FALLBACK, where, "\n".join(compile_failures), flags,
                               _generic(compile_failures[0].split(": ", 1)[-1])[:100])
    if not interpreter:
        return fallback or Outcome(OK)
    if tol not in ref.interpreter:
        ref.interpreter[tol] = _check_side(
            "interpreter", {}, lambda: (run_interpreter(ref.model, ref.feeds), []), ref, tol)[0]
    return ref.interpreter[tol] or fallback or Outcome(OK)


def ops_of(model: onnx.ModelProto) -> list[str]:
    """The distinct op types of a model, sorted."""
    return sorted({n.op_type for n in model.graph.node})


def variants_for(model: onnx.ModelProto, device: str, rng: np.random.Generator,
                 metamorphic: int = 2, check_bounds: bool = True) -> list[dict[str, Any]]:
    """The base autoclust flags plus `metamorphic` random fallback-forcing variants; on
    the CPU backend every variant checks its kernels' accesses (--check_bounds) unless
    check_bounds is False, so a read outside a buffer fails instead of giving garbage."""
    base = {"device": device, "min_cluster_size": int(rng.choice([1, 1, 2, 4]))}
    if check_bounds and device == "cpu":
        base["check_bounds"] = True
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
