"""`autoclust bench --profile MODEL`: where one model's run time goes, ours beside onnxruntime's.

    autoclust bench --profile models/mlp_gelu.onnx
    autoclust bench --profile gpt2 --runs 30          # an export of `autoclust bench --exports`
    autoclust bench --profile bert_encoder --dim seq=128 --top 40 --json prof.json

MODEL is an .onnx path, a zoo name (its committed file in models/) or an export name
(gpt2, bert, llama, vit, resnet50; needs the bench extra). Two sessions with the same
SessionOptions (ORT_ENABLE_ALL, `--threads`, spinning off) run in alternating blocks:

- autoclust, instrumented from outside (no change to the runtime): every plan step
  (Runtime.steps) and, inside each compiled cluster, every thunk of its Executable
  (`Executable._ungrouped`: LLVM kernels, generated GEMMs, library calls, checks) is
  wrapped in a timer and called on its own (not through the native driver that
  normally runs consecutive kernels in one ctypes call).
  A step's time minus its thunks' is the cluster's own overhead (signature, binding,
  outputs); the whole run minus the steps is the session and run-loop overhead.
- onnxruntime with `enable_profiling`: its JSON trace is split into runs (model_run events)
  and aggregated per node and per op type.

Both sides are then summed into the same categories (GEMM, conv, attention softmax,
normalization, elementwise, layout, overhead) for a side-by-side table. Timers add ~0.3 us
per wrapped call; the un-instrumented medians are printed too.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from autoclust.tools.bench import timing

from autoclust import ops
from autoclust.kernel import ir as kir

# op type -> category. Ops in autoclust's op table take their category from the table (kind
# and groups: ops/table.py); the names below are onnxruntime's own fused and contrib ops,
# which its profile reports and our table does not hold, so both sides share one vocabulary.
ORT_OWN_OPS = {
    "gemm": ("FusedGemm", "MatMulNBits", "MatMulInteger", "QLinearMatMul",
             "MultiHeadAttention", "GroupQueryAttention"),
    "conv": ("FusedConv", "NchwcConv"),
    "pool": ("NchwcMaxPool", "NchwcAveragePool", "NchwcGlobalAveragePool"),
    "norm": ("EmbedLayerNormalization",),
    "layout": ("ReorderInput", "ReorderOutput"),
}
_BY_KIND = {"reduction": "reduce", "layout": "layout", "shape": "layout"}


@functools.cache
def _op_category(op: str) -> str:
    """The category of one op type: the op table's kind and groups, else ORT_OWN_OPS."""
    for cat, names in ORT_OWN_OPS.items():
        if op in names:
            return cat
    d = ops.get(op) or ops.get(op, "com.microsoft")
    if d is None:
        return "elementwise"
    if op in ops.in_group("GEMM") or op == "Attention":
        return "gemm"
    if op in ops.in_group("WINDOW"):
        return "conv" if op.startswith("Conv") else "pool"
    if d.kind == "normalization":
        return "softmax" if op in ("Softmax", "LogSoftmax") else "norm"
    return _BY_KIND.get(d.kind, "elementwise")


# A fused kernel is filed under the first of these categories among its nodes' ops.
PRIORITY = ("gemm", "conv", "pool", "softmax", "norm", "reduce", "elementwise", "layout")


def category(op_types: list[str]) -> str:
    """The category of a kernel or node running these op types (see PRIORITY)."""
    cats = {_op_category(op) for op in op_types} or {"elementwise"}
    return next(c for c in PRIORITY if c in cats)


# ---- resolving MODEL -------------------------------------------------------------------------

def resolve(model: str, dims: dict[str, int]) -> tuple[str, dict[str, np.ndarray]]:
    """(path of the model file, feeds) for an .onnx path, a zoo name or an export name."""
    from autoclust.tools.bench import exports as bench_exports
    from autoclust.tools.run import generate_inputs, load_model
    if model in bench_exports.SPECS and not os.path.exists(model):
        bench_exports.require()
        path, feeds_path = bench_exports.export(model, bench_exports.default_cache(),
                                                log=lambda m: print(m, file=sys.stderr))
        with np.load(feeds_path) as z:
            return path, {k: z[k] for k in z.files}
    if not os.path.exists(model):
        zoo_file = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "models",
                                f"{model}.onnx")
        if os.path.exists(zoo_file):
            model = zoo_file
    return model, generate_inputs(load_model(model), dims)


# ---- instrumenting autoclust from outside ----------------------------------------------------

class Recorder:
    """Per-run samples of wrapped callables, keyed by a label."""

    def __init__(self):
        self.samples: dict[Any, list[float]] = defaultdict(list)

    def wrap(self, key: Any, fn: Callable) -> Callable:
        samples = self.samples[key]
        clock = time.perf_counter

        def timed(*args: Any) -> Any:
            t0 = clock()
            out = fn(*args)
            samples.append(clock() - t0)
            return out

        return timed

    def median_us(self, key: Any) -> float:
        s = self.samples.get(key)
        return float(np.median(s)) * 1e6 if s else 0.0


def _library_impl(step: Callable) -> str:
    """The implementation (mlas, onednn, numpy, ref) a library step's closure calls now, if
    visible: asked through the call's wrappers, since a background measurement may have
    switched it after the wrappers were made."""
    from autoclust.backends.cpu import library
    for cell in getattr(step, "__closure__", None) or ():
        fn = cell.cell_contents
        if isinstance(getattr(fn, "impl", None), str):
            return library.current_impl(fn) or "?"
    return "?"


def _callable(step: Any) -> Callable[[], Any]:
    """A step of Executable._ungrouped as a plain call (a Native step calls its kernel)."""
    from autoclust.backends.cpu import executable
    if isinstance(step, executable.Native):
        return functools.partial(executable.KERNEL_FN(step.fn), step.bufs, step.start,
                                 step.stop)
    return step


def _describe(t: Any, step: Any, exe: Any, shapes: dict[int, list[int]]) -> tuple[str, str]:
    """(kind, what) of one thunk for the tables."""
    from autoclust.backends.cpu import executable

    if isinstance(t, kir.Kernel):
        outer = list(t.shape[:len(t.shape) - t.n_inner])
        dom = f"{outer}|{list(t.shape[len(outer):])}" if t.n_inner else f"{list(t.shape)}"
        split = " split" if t.name in exe.split else ""
        return f"kernel{split}", f"{t.name} {dom}"
    if isinstance(t, kir.Check):
        return f"check {t.kind}", f"check {shapes[t.buf]}".replace(" ", "")
    ins = "x".join(str(shapes[b]) for b in t.inputs if b is not None)
    what = f"{t.op} {ins}".replace(" ", "")
    if isinstance(step, executable.Native):
        return f"generated {t.op}", what
    # library calls that split over threads are closures too: one lambda either way
    return f"library {t.op} [{_library_impl(step)}]", what


def _thunk_rows(exe: Any, step_no: int, op_of: dict[str, str], rec: Recorder
                ) -> list[dict[str, Any]]:
    """Wrap every thunk of `exe` one by one; return one description row per thunk.

    The executable normally runs consecutive native kernels through one driver call;
    instrumented, each is its own ctypes call (Executable._ungrouped, the same steps
    ungrouped), so every kernel is timed and the driver's saving shows as the difference
    between the instrumented and plain medians.
    """
    shapes = {b.id: list(b.shape) for b in exe.program.buffers}
    rows, steps = [], []
    for j, (t, step) in enumerate(exe._ungrouped):
        # a node the graph does not hold (a sibling-GEMM group's made-up name) counts as
        # the thunk's own op: the joined Q/K/V GEMM is a GEMM, not "elementwise"
        ops_ = [op_of.get(n, getattr(t, "op", "?")) for n in t.nodes]
        kind, what = _describe(t, step, exe, shapes)
        key = ("thunk", step_no, j)
        steps.append(rec.wrap(key, _callable(step)))
        rows.append({"key": key, "step": step_no, "kind": kind, "what": what,
                     "category": _thunk_category(t, ops_), "ops": ops_,
                     "nodes": list(t.nodes)})
    exe._steps = steps
    return rows


def _thunk_category(t: Any, ops_: list[str]) -> str:
    """A thunk's category. A loop kernel is never GEMM time, whatever its nodes: they name
    the GEMM whose epilogue it runs (LLaMA's SwiGLU product) or a product so small it was
    inlined as a loop (RoPE's inv_freq x positions); filed under GEMM, they made
    autoclust's floor ratio read 1.05 for 1.15 (LLaMA-like, 1.75 ms of 20.8)."""
    if isinstance(t, kir.Kernel):
        rest = [op for op in ops_ if _op_category(op) != "gemm"]
        return category(rest) if rest else "elementwise"
    return category(ops_ or [getattr(t, "op", "")])


def instrument(sess: Any, rec: Recorder) -> tuple[list[dict], list[dict]]:
    """Wrap the plan steps and every compiled thunk of `sess` (after its first run)."""
    from autoclust.runtime.runner import ClusterRunner
    rt = sess._runtime
    if rt is None:  # nothing clustered: the session passes the whole model to onnxruntime
        ops_ = [n.op_type for n in sess._model.graph.node]
        return [{"key": "session", "name": "whole model", "kind": "onnxruntime pass-through",
                 "nodes": [n.name for n in sess._model.graph.node], "ops": ops_}], []
    # measured placement may have handed the whole model to onnxruntime: profile the
    # plan's steps as they run without it (profile() reports the decision)
    rt.whole = None
    sess._direct.clear()  # and the session's direct calls for signatures it handed back
    op_of = {n.name: n.op for n in rt.graph.nodes}
    steps, thunks = [], []
    for i, (runner, (run, ins, outs, frees)) in enumerate(zip(rt.runners, rt.steps)):
        rt.steps[i] = (rec.wrap(("step", i), run), ins, outs, frees)
        row = {"key": ("step", i), "name": runner.name, "nodes": []}
        exe = next(iter(runner.route.values()), None) if isinstance(runner, ClusterRunner) \
            and runner.fallback is None else None
        exe = getattr(exe, "side", exe)  # a winner still watched (autotune.Watch)
        if hasattr(exe, "_ungrouped"):  # an executable serves it (not onnxruntime)
            row["kind"] = "cluster"
            row["nodes"] = [n.name for n in runner.graph.nodes]
            row["thunks"], row["calls"] = len(exe._ungrouped), len(exe._steps)
            thunks += _thunk_rows(exe, i, op_of, rec)
        else:
            row["kind"] = "onnxruntime segment" if not isinstance(runner, ClusterRunner) \
                else "cluster (onnxruntime serves it: fallback or measured placement)"
            graph = getattr(runner, "graph", None)
            names = [n.name for n in graph.nodes] if graph is not None else \
                _segment_nodes(sess, runner.name)
            row["nodes"] = names
        row["ops"] = [op_of.get(n, "?") for n in row["nodes"]]
        steps.append(row)
    sess._runtime.run = rec.wrap("run", rt.run)
    return steps, thunks


def _segment_nodes(sess: Any, name: str) -> list[str]:
    for step in sess.plan.steps:
        if step.name == name:
            return [n.name for n in step.nodes]
    return []


# ---- onnxruntime's own profile --------------------------------------------------------------

def ort_profile(path: str) -> dict[str, Any]:
    """Per-run medians (us) from an onnxruntime profile: per node, per op type, whole run."""
    with open(path) as f:
        events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    per_node: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(runs))
    op_of: dict[str, str] = {}
    starts = [a for a, _ in runs]
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if i < 0 or e["ts"] > runs[i][1]:
            continue  # a kernel outside any run (session initialization)
        node = name[:-len("_kernel_time")]
        op_of[node] = e.get("args", {}).get("op_name", "?")
        per_node[node][i] += e["dur"]
    nodes = [{"node": n, "op": op_of[n], "category": category([op_of[n]]),
              "us": float(np.median(v))} for n, v in per_node.items()]
    by_op: dict[str, float] = defaultdict(float)
    for row in nodes:
        by_op[row["op"]] += row["us"]
    sums = [sum(v[i] for v in per_node.values()) for i in range(len(runs))]
    run_list = [float(b - a) for a, b in runs]
    return {"runs": len(runs), "run_us": float(np.median(run_list)) if runs else 0.0,
            "kernels_us": float(np.median(sums)) if sums else 0.0,
            "nodes": sorted(nodes, key=lambda r: -r["us"]),
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
            "per_run": {"run": run_list, "nodes": dict(per_node)}}


# ---- profiling ------------------------------------------------------------------------------

def profile(path: str, feeds: dict[str, np.ndarray], threads: int = 2, rounds: int = 5,
            block: int = 4, flags: str = "") -> dict[str, Any]:
    """Profile `path` on `feeds`: autoclust steps and thunks, onnxruntime nodes, categories."""
    plain_ort = timing.ort_session(path, threads)
    sess = timing.autoclust_session(path, threads, flags)
    got, first_ms = timing.timed_ms(lambda: sess.run(None, feeds))
    err = timing.max_abs_err(got, plain_ort.run(None, feeds))
    settle_runs = timing.settle(sess, feeds)
    plain = timing.alternate({"ort": lambda: plain_ort.run(None, feeds),
                              "autoclust": lambda: sess.run(None, feeds)}, rounds, block)
    rec = Recorder()
    steps, thunks = instrument(sess, rec)
    with tempfile.TemporaryDirectory() as tmp:
        prof_ort = timing.ort_session(path, threads, os.path.join(tmp, "ort"))
        whole = rec.wrap("session", lambda: sess.run(None, feeds))
        # onnxruntime's plain runs again, in the rounds its profiled runs and our
        # instrumented ones take: the floor's two terms come from the same moments
        profiled = timing.alternate({"ort": lambda: plain_ort.run(None, feeds),
                                     "ort_profiled": lambda: prof_ort.run(None, feeds),
                                     "autoclust_instrumented": whole}, rounds, block)
        ort_prof = ort_profile(prof_ort.end_profiling())
    for row in steps + thunks:
        row["us"] = rec.median_us(row["key"])
    cats = categories(steps, thunks, rec, ort_prof)
    return {"model": path, "threads": threads, "first_run_ms": first_ms, "max_abs_err": err,
            "settle_runs": settle_runs, "placement": timing.placement(sess),
            "ort_ms": timing.median_ms(plain["ort"]),
            "autoclust_ms": timing.median_ms(plain["autoclust"]),
            "ort_profiled_ms": timing.median_ms(profiled["ort_profiled"]),
            "autoclust_instrumented_ms": timing.median_ms(profiled["autoclust_instrumented"]),
            "runtime_us": rec.median_us("session"), "steps": steps, "thunks": thunks,
            "ort": ort_prof, "categories": cats,
            "floor": floor(rec.median_us("session") / 1e3, timing.median_ms(profiled["ort"]),
                           cats),
            "load": timing.load_note()}


def floor(autoclust_ms: float, ort_ms: float, cats: dict[str, tuple[float, float]]
          ) -> dict[str, dict[str, float]]:
    """Per side: GEMM ms (GEMMs and convolutions, from the instrumented runs; ours counts
    those inside onnxruntime segments too, see `_split_segments`), the rest of the run,
    and the floor ratio (run / GEMM time; 1.0 is the limit of a GEMM-bound
    model; NaN where the side's GEMMs are not visible: a pass-through session).

    The whole-run times come from the runs the GEMM times come from (`profile`): ours
    is the instrumented run itself, every one the thunks' medians count, the untimed first
    run of each block included (its timers, ~1 us a call, count as rest); onnxruntime's
    its plain runs between its profiled ones, since its profiler slows its own runs (a
    19.1 ms run reads 22.3 ms profiled) while each GEMM kernel's own time is what the
    profiler reports. Taken from separate rounds, the two terms read LLaMA-like's floor
    ratio 1.11 and 0.66 in two processes on a host whose speed moved between rounds.
    """
    out = {}
    for side, whole, k in (("autoclust", autoclust_ms, 0), ("onnxruntime", ort_ms, 1)):
        # convolutions are a CNN's GEMMs (im2col or direct, MLAS either way)
        gemm = sum(cats.get(c, (0.0, 0.0))[k] for c in ("gemm", "conv", SEGMENT_GEMM)) / 1e3
        out[side] = {"run_ms": whole, "gemm_ms": gemm, "rest_ms": whole - gemm,
                     "floor_ratio": whole / gemm if gemm > 0 else float("nan")}
    return out


def floor_table(fl: dict[str, dict[str, float]]) -> str:
    """The floor report as a Markdown table."""
    return timing.table(
        ["side", "run ms", "GEMM+Conv ms (instrumented)", "rest ms", "floor ratio"],
        [[side, f"{f['run_ms']:.3f}", f"{f['gemm_ms']:.3f}", f"{f['rest_ms']:.3f}",
          f"{f['floor_ratio']:.2f}"] for side, f in fl.items()])


def _median_sum(vectors: list[list[float]], n: int) -> float:
    """Median over runs of the per-run sum of `vectors` (each one sample per run)."""
    if not vectors:
        return 0.0
    return float(np.median(np.sum([v[:n] for v in vectors], axis=0)))


def categories(steps: list[dict], thunks: list[dict], rec: Recorder, ort_prof: dict
               ) -> dict[str, tuple[float, float]]:
    """category -> (autoclust us per run, onnxruntime us per run), medians of per-run sums.

    Every wrapped callable runs once per run, so sample k of each belongs to run k: the
    overheads are per-run differences (a step minus its thunks), not differences of
    medians, which a loaded machine's long tails would skew.
    """
    ours = _our_categories(steps, thunks, rec)
    per_node, m = ort_prof["per_run"]["nodes"], ort_prof["runs"]
    cat_of = {r["node"]: r["category"] for r in ort_prof["nodes"]}
    _split_segments(ours, steps, rec, ort_prof)
    theirs: dict[str, float] = {}
    for cat in PRIORITY:
        vecs = [v for node, v in per_node.items() if cat_of[node] == cat]
        if vecs:
            theirs[cat] = _median_sum(vecs, m)
    theirs["overhead: onnxruntime executor"] = float(np.median(
        [ort_prof["per_run"]["run"][k] - sum(v[k] for v in per_node.values())
         for k in range(m)])) if m else 0.0
    names = [c for c in PRIORITY if c in ours or c in theirs]
    names += [c for c in list(ours) + list(theirs) if c not in names]
    return {c: (ours.get(c, 0.0), theirs.get(c, 0.0)) for c in dict.fromkeys(names)}


SEGMENT_GEMM, SEGMENT_REST = "onnxruntime segments: GEMM, Conv", "onnxruntime segments: rest"


def _split_segments(ours: dict[str, float], steps: list[dict], rec: Recorder,
                    ort_prof: dict) -> None:
    """Split "onnxruntime segments" into its GEMM/Conv share and the rest, in place.

    A segment is timed whole (onnxruntime runs it); its share of GEMM and convolution time
    is the share those nodes have in onnxruntime's own profile of the whole model, where a
    node keeps its name or gets a suffix (`node_MatMul_65/MatMulAddFusion`). Without the
    split, a model whose convolutions stay in onnxruntime (Whisper's front end) counts
    them as our non-GEMM time and its floor ratio reads 1.16-1.21 for ~1.10.
    """
    if "onnxruntime segments" not in ours:
        return
    med = {r["node"].split("/")[0]: (r["us"], r["category"] in ("gemm", "conv"))
           for r in ort_prof["nodes"]}
    runs = []
    for s in steps:
        if s["kind"] == "cluster":
            continue
        seen = [med[n] for n in s["nodes"] if n in med]
        total = sum(us for us, _ in seen)
        share = sum(us for us, gemm in seen if gemm) / total if total > 0 else 0.0
        runs.append([x * 1e6 * share for x in rec.samples[s["key"]]])
    whole = ours.pop("onnxruntime segments")
    gemm = min(whole, _median_sum(runs, min(len(r) for r in runs)))
    ours[SEGMENT_GEMM], ours[SEGMENT_REST] = gemm, whole - gemm


def _our_categories(steps: list[dict], thunks: list[dict], rec: Recorder) -> dict[str, float]:
    session = [x * 1e6 for x in rec.samples["session"]]
    if steps and steps[0]["key"] == "session":  # pass-through: nothing to split
        return {"onnxruntime pass-through (nothing clustered)": float(np.median(session))}
    runs = [x * 1e6 for x in rec.samples["run"]]
    n = min([len(runs), len(session)] + [len(rec.samples[r["key"]]) for r in steps + thunks])
    us = {r["key"]: [x * 1e6 for x in rec.samples[r["key"]]] for r in steps + thunks}
    ours: dict[str, float] = {}
    for cat in PRIORITY:
        vecs = [us[t["key"]] for t in thunks if t["category"] == cat]
        if vecs:
            ours[cat] = _median_sum(vecs, n)
    segments = [us[s["key"]] for s in steps if s["kind"] != "cluster"]
    if segments:
        ours["onnxruntime segments"] = _median_sum(segments, n)
    cluster_over = []
    for i, s in enumerate(steps):
        if s["kind"] == "cluster":
            inner = [us[t["key"]] for t in thunks if t["step"] == i]
            cluster_over.append([us[s["key"]][k] - sum(v[k] for v in inner) for k in range(n)])
    ours["overhead: cluster (binding, outputs)"] = _median_sum(cluster_over, n)
    ours["overhead: run loop"] = float(np.median(
        [runs[k] - sum(us[s["key"]][k] for s in steps) for k in range(n)]))
    ours["overhead: session.run (feed checks)"] = float(np.median(
        [session[k] - runs[k] for k in range(n)]))
    return ours


# ---- tables ---------------------------------------------------------------------------------

def _ops_summary(ops_: list[str], limit: int = 6) -> str:
    counts: dict[str, int] = defaultdict(int)
    for op in ops_:
        counts[op] += 1
    parts = [f"{op} x{n}" if n > 1 else op for op, n in
             sorted(counts.items(), key=lambda kv: -kv[1])]
    more = f", +{len(parts) - limit} more" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def _pct(us: float, total_us: float) -> str:
    return f"{100 * us / total_us:.1f}%" if total_us > 0 else ""


def markdown(p: dict[str, Any], top: int = 25) -> str:
    """The profile as Markdown: summary, categories, plan steps, top thunks, onnxruntime."""
    run_us = p["runtime_us"]
    ort_us = p["ort"]["run_us"]
    out = [(f"## Profile of {os.path.basename(p['model'])} ({p['threads']} threads; "
           f"{p['load']})\n"),
           (f"onnxruntime {p['ort_ms']:.3f} ms, autoclust {p['autoclust_ms']:.3f} ms: ratio "
           f"**{p['ort_ms'] / p['autoclust_ms']:.2f}x** (uninstrumented medians). Profiled: "
           f"onnxruntime {p['ort_profiled_ms']:.3f} ms, autoclust instrumented "
           f"{p['autoclust_instrumented_ms']:.3f} ms. autoclust first run "
           f"{p['first_run_ms']:.0f} ms; max abs err vs onnxruntime {p['max_abs_err']:.1e}.\n")]
    if p.get("placement"):
        out.append(f"Measured placement (after {p.get('settle_runs', 0)} settling runs; the "
                   "plain autoclust median runs as it decided, the instrumented run profiles "
                   "the compiled plan):\n")
        out += [f"- {d['cluster']}: {d['winner']} ({d['reason']})" for d in p["placement"]]
        out.append("")
    out.append("### GEMM floor (floor ratio = run / GEMM time)\n")
    out.append(floor_table(p["floor"]))
    out.append("GEMM+Conv ms: the GEMM and Conv kernels' own time in the instrumented runs "
               "(onnxruntime's profiler, our timers; our onnxruntime segments' share by its "
               "profile); run ms, from the same rounds: our instrumented run (the compiled "
               "plan), onnxruntime's plain runs between its profiled ones.\n")
    rows = [[c, f"{a:.1f}", _pct(a, run_us), f"{b:.1f}", _pct(b, ort_us), f"{a - b:+.1f}"]
            for c, (a, b) in p["categories"].items()]
    rows.append(["total (one run)", f"{run_us:.1f}", "", f"{ort_us:.1f}", "",
                 f"{run_us - ort_us:+.1f}"])
    out.append("\n### Time per run by category (us; instrumented runs)\n")
    out.append(timing.table(["category", "autoclust us", "%", "onnxruntime us", "%",
                             "autoclust - onnxruntime"], rows))
    out.append("\n### autoclust plan steps\n")
    out.append(timing.table(
        ["#", "step", "kind", "nodes", "ops", "us/run", "% of run"],
        [[i, s["name"], s["kind"] + (f" ({s['thunks']} thunks in {s['calls']} "
                                          f"call{'s' * (s['calls'] != 1)})"
                                      if "thunks" in s else ""),
          len(s["nodes"]), _ops_summary(s["ops"]), f"{s['us']:.1f}", _pct(s["us"], run_us)]
         for i, s in enumerate(p["steps"])]))
    thunks = sorted(p["thunks"], key=lambda t: -t["us"])
    out.append(f"\n### autoclust thunks, slowest {min(top, len(thunks))} of {len(thunks)}\n")
    out.append(timing.table(
        ["step", "thunk", "kind", "category", "us/run", "% of run", "fused ops", "first node"],
        [[t["step"], t["what"], t["kind"], t["category"], f"{t['us']:.1f}",
          _pct(t["us"], run_us), _ops_summary(t["ops"]), (t["nodes"] or [""])[0]]
         for t in thunks[:top]]))
    by_op = p["ort"]["by_op"]
    count: dict[str, int] = defaultdict(int)
    for n in p["ort"]["nodes"]:
        count[n["op"]] += 1
    out.append(f"\n### onnxruntime's profile by op type ({p['ort']['runs']} runs, "
               f"{len(p['ort']['nodes'])} nodes after its optimizations)\n")
    out.append(timing.table(["op", "nodes", "us/run", "% of run"],
                            [[op, count[op], f"{us:.1f}", _pct(us, ort_us)]
                             for op, us in by_op.items()]))
    nodes = p["ort"]["nodes"][:top]
    out.append(f"\n### onnxruntime nodes, slowest {len(nodes)}\n")
    out.append(timing.table(["node", "op", "us/run", "% of run"],
                            [[n["node"], n["op"], f"{n['us']:.1f}", _pct(n["us"], ort_us)]
                             for n in nodes]))
    return "\n".join(out)


def _jsonable(p: dict[str, Any]) -> dict[str, Any]:
    def clean(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "key"} for r in rows]
    ort = {k: v for k, v in p["ort"].items() if k != "per_run"}
    return dict(p, steps=clean(p["steps"]), thunks=clean(p["thunks"]), ort=ort)


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="autoclust bench --profile",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an .onnx path, a zoo name or an export name")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--top", type=int, default=25, help="rows of the thunk and node tables")
    ap.add_argument("--flags", default="", help="AUTOCLUST_FLAGS for the autoclust side")
    ap.add_argument("--json", default="", help="also write the whole profile here")
    ap.add_argument("--feeds", default="", help="an .npz of the feeds (else made up from "
                    "the model's inputs and --dim)")
    args = ap.parse_args(argv)
    # an export name loads torch (tools/bench/exports.py); its OpenMP threads must not spin,
    # or oneDNN refuses to load (backends/cpu/onednn.py) and every GEMM profiles as MLAS
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from autoclust.tools.run import parse_assignments
    dims = {k: int(v) for k, v in parse_assignments(args.dim, "--dim").items()}
    path, feeds = resolve(args.model, dims) if not args.feeds else (args.model, None)
    if args.feeds:
        with np.load(args.feeds) as z:
            feeds = {k: z[k] for k in z.files}
    p = profile(path, feeds, args.threads, args.rounds, args.block, args.flags)
    print(markdown(p, args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_jsonable(p), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
