"""Partitioned execution: walk a Plan of compiled clusters and onnxruntime segments.

Each cluster compiles lazily per signature (input dtypes and shapes, plus the values of
inputs that decide shapes) and caches the executable. A cluster that keeps meeting new
signatures is megamorphic and falls back to onnxruntime; so does one whose compile fails
(one warning each), unless --must_compile turns that into NotCompilableError.
The run loop is kept flat: per step it gathers inputs from an environment dict, runs,
stores outputs and drops values past their last use.
"""

from __future__ import annotations

import collections
import concurrent.futures
import sys
import threading
import time
import warnings
from typing import Any

import numpy as np

from autoclust import registry
from autoclust.errors import (
    AutoclustError,
    CompileError,
    InvalidInputError,
    NotCompilableError,
    ShapeInferenceError,
)
from autoclust.flags import Flags
from autoclust.ir import Graph
from autoclust.runtime import rescue
from autoclust.runtime.numerics import first_nonfinite, nonfinite, value_ranges
from autoclust.runtime.shape_class import ShapeClass, symbolic_types

# Megamorphic: compiled more than --megamorphic_compiles times, run fewer times per compile.
RUNS_PER_COMPILE = 50
# Signatures bound from shape classes kept per cluster (the oldest goes: binding again is
# cheap, and each binding holds its outputs).
MAX_BINDINGS = 64
# --async_compile: one background compiler thread per process (LLVM serializes compiles
# behind its lock anyway, and fusion holds the GIL).
_COMPILER = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="autoclust-compile")


class ClusterRunner:
    """Runs one cluster: compiled executables per signature, or its onnxruntime fallback."""

    def __init__(self, cluster: Any, graph: Graph, flags: Flags, backend: Any,
                 ort_options: Any, dumper: Any = None):
        self.cluster = cluster
        self.name = cluster.name
        self.graph = graph
        self.flags = flags
        self.check_numerics = flags.check_numerics  # read on every run
        self.backend = backend
        self.ort_options = ort_options
        self.dumper = dumper
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        shape_names = {v.name for v in cluster.shape_value_inputs}
        self.shape_value_index = [i for i, n in enumerate(self.input_names) if n in shape_names]
        self.cache: dict[tuple, Any] = {}  # signature -> executable
        # signature -> what serves it: the executable, a measuring Trial or the onnxruntime
        # segment that beat it (autoclust/runtime/autotune.py)
        self.route: dict[tuple, Any] = {}
        self.tuner: Any = None  # the session's autotune.Placement (None: not measured)
        self._fingerprint = ""
        self._route_lock = threading.Lock()
        self.compiles = 0
        self.runs = 0
        self.fallback: Any = None  # an onnxruntime Segment once the cluster falls back
        self.fallback_reason = ""
        self.signatures: list[tuple] = []
        # shape classes (runtime/shape_class.py): one compile serves many signatures
        self.classes: list[ShapeClass] = []
        self.symbolic = flags.symbolic_dims and registry.policy(backend).symbolic_dims
        self.symbolic_note = ""  # why this cluster compiles concrete shapes only
        self.bindings = 0
        self._bound: collections.deque = collections.deque()  # signatures bound, oldest first
        self._lock = threading.Lock()
        self._dumped_inputs = False
        self.pending: dict[tuple, concurrent.futures.Future] = {}  # --async_compile
        self.stand_in_runs = 0
        self._stand_in: Any = None
        self._async_lock = threading.Lock()  # not _lock: a compile holds that throughout
        # a node onnxruntime may crash the process on (backends/ort.crashing_node): neither
        # measured placement nor --async_compile's stand-in runs onnxruntime on it
        self.ort_crash = registry.fallback().crashing_node(graph)
        self.progress: Any = None  # () -> Progress of the run's compiles, set by Runtime
        # a device backend's values are copied to the host for onnxruntime
        self._to_host = backend.to_host if registry.policy(backend).device_memory else None

    def signature(self, inputs: list[np.ndarray]) -> tuple:
        key: tuple = tuple([(x.dtype, x.shape) for x in inputs])  # list: faster than genexpr
        if self.shape_value_index:
            key += tuple(inputs[i].tobytes() for i in self.shape_value_index)
        return key

    def run(self, inputs: list[np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        if self.fallback is not None:
            return self.fallback.run(inputs, run_options)
        key: tuple = tuple([(x.dtype, x.shape) for x in inputs])  # self.signature, inlined
        if self.shape_value_index:
            key += tuple(inputs[i].tobytes() for i in self.shape_value_index)
        exe = self.route.get(key)
        if exe is None:
            if (self.flags.async_compile and not self.flags.must_compile and not self.ort_crash
                    and key not in self.cache and not self._class_serves(inputs)):
                return self._run_while_compiling(key, inputs)
            exe = self._place(key, inputs)
            if exe is None:  # _place handed the signature back to onnxruntime
                assert self.fallback is not None
                return self.fallback.run(self._host(inputs), run_options)
        self.runs += 1
        outs = exe.run(inputs)
        if self.check_numerics:
            self._check_numerics(inputs, outs)
        return outs

    def settled(self, inputs: list[np.ndarray]) -> Any:
        """The executable serving these inputs' signature for good, or None: not placed
        yet, still measured (a Trial), onnxruntime's, fallen back, or run with checks that
        run() adds (--check_numerics) or a key that input values decide."""
        if self.fallback is not None or self.check_numerics or self.shape_value_index:
            return None
        key = self.signature(inputs)
        exe = self.route.get(key)
        return exe if exe is not None and exe is self.cache.get(key) else None

    # ---- placing and compiling -------------------------------------------------------
    def _place(self, key: tuple, inputs: list[np.ndarray]) -> Any:
        """What serves signature `key` from now on (None: the cluster fell back)."""
        with self._route_lock:
            target = self.route.get(key)
            if target is None:
                target = self.compiled(key, inputs) if self.tuner is None else \
                    self.tuner.place(self, key, inputs)
                if target is not None:
                    self.route[key] = target
            return target

    def compiled(self, key: tuple, inputs: list[np.ndarray]) -> Any:
        """The executable for signature `key`, compiled now if needed (None: fell back)."""
        exe = self.cache.get(key)
        if exe is None and self.classes:
            exe = self._bind(key, inputs)  # a compiled shape class serves it: no compile
        return exe if exe is not None else self._compile(key, inputs)

    def onnxruntime_segment(self, quiet: bool = False) -> Any:
        """onnxruntime over the cluster's subgraph (built once; shared by --async_compile's
        stand-in and measured placement); `quiet`: None when onnxruntime refuses it."""
        if self._stand_in is None:
            try:
                self._stand_in = self._fallback_segment()
            except Exception:
                if quiet:
                    return None
                raise
        return self._stand_in

    def unmeasurable(self) -> str | None:
        """Why this cluster cannot be timed against onnxruntime (None: it can): a custom
        op onnxruntime cannot load, or a division onnxruntime may crash the process on
        (measured placement runs onnxruntime on the same inputs)."""
        from autoclust.ops import custom
        if custom.in_graph(self.graph):
            return "a custom op onnxruntime cannot load"
        return self.ort_crash

    def fingerprint(self) -> str:
        """A hash of the cluster's graph, weights' names and types, and code flags."""
        if not self._fingerprint:
            from autoclust.runtime.program_cache import program_key
            self._fingerprint = program_key(self.graph, self.flags, self.backend)
        return self._fingerprint

    def _bind(self, key: tuple, inputs: list[np.ndarray]) -> Any:
        """The executable of the first shape class whose dims and guards accept these
        inputs, bound to their dims (cached by signature); None when no class does."""
        with self._lock:
            exe = self.cache.get(key)
            if exe is not None:
                return exe
            for cls in self.classes:
                env = cls.match(inputs)
                if isinstance(env, dict):
                    t0 = time.perf_counter()
                    try:
                        exe = cls.exe.bind(env)
                    except CompileError:  # these sizes fail the bounds proof: compile
                        continue  # them concretely (the same error falls back, warned)
                    exe.shape_class = cls  # measured placement decides per class
                    self._keep_binding(key, exe)
                    if self.flags.log:
                        dims = ", ".join(f"{k} = {v}" for k, v in sorted(env.items()))
                        print(f"autoclust: {self.name} runs the code compiled for "
                              f"{cls.describe()} with {dims} (bound in "
                              f"{(time.perf_counter() - t0) * 1e3:.1f} ms)", file=sys.stderr)
                    return exe
        return None

    def _keep_binding(self, key: tuple, exe: Any) -> None:
        self.bindings += 1
        self.cache[key] = exe
        self._bound.append(key)
        if len(self._bound) > MAX_BINDINGS:
            old = self._bound.popleft()
            self.cache.pop(old, None)
            self.route.pop(old, None)  # placed again (cheaply: bound again) if it returns

    def _class_serves(self, inputs: list[np.ndarray]) -> bool:
        return any(isinstance(c.match(inputs), dict) for c in self.classes)

    def _compile(self, key: tuple, inputs: list[np.ndarray]) -> Any:
        with self._lock:  # several threads meeting a new signature compile it once
            exe = self.cache.get(key)
            if exe is not None or self.fallback is not None:
                return exe
            if self.dumper is not None and self.flags.dump_inputs and not self._dumped_inputs:
                self._dumped_inputs = True
                self.dumper.write_inputs(self.name, self.input_names, self._host(inputs))
            self.signatures.append(key)
            if self._is_megamorphic():
                self._fall_back(f"megamorphic: compiled {self.compiles} times in "
                                f"{self.runs} runs; varying dims: {self._varying_dims()}")
                return None
            try:
                exe = self._compile_now(inputs)
            except InvalidInputError:  # these inputs are bad (onnxruntime raises too): say so
                self.signatures.pop()  # and keep compiling the cluster for good ones
                raise
            except Exception as exc:  # a compile failure must never break the run
                if isinstance(exc, ShapeInferenceError):
                    self._check_with_onnxruntime(inputs, exc)  # raises for bad inputs
                if self.flags.must_compile:
                    raise NotCompilableError(f"{self.name} failed to compile: "
                                             f"{type(exc).__name__}: {exc}") from exc
                self._fall_back(f"compile failed: {type(exc).__name__}: {exc}")
                return None
            self.compiles += 1
            if getattr(exe, "shape_class", None) is not None:
                self._keep_binding(key, exe)
            else:
                self.cache[key] = exe
            return exe

    def _check_with_onnxruntime(self, inputs: list[np.ndarray], exc: Exception) -> None:
        """A shape rule rejected these inputs (dims that disagree with each other, as a
        mask one token shorter than its ids): when onnxruntime rejects them too, they are
        bad input, not a compile failure; raise InvalidInputError naming the cluster and
        the rule, and keep the cluster compiled for good inputs. Returns when onnxruntime
        runs them (our rule is wrong: the caller falls back, warned)."""
        from autoclust.ops import custom
        if custom.in_graph(self.graph):
            return  # no onnxruntime to ask (its host runtime has our rules)
        segment = self.onnxruntime_segment(quiet=True)
        if segment is None:
            return
        try:
            segment.run(self._host(inputs))
        except Exception as ort_exc:  # onnxruntime's own error, quoted
            self.signatures.pop()
            shapes = ", ".join(f"{n} {list(x.shape)}{self._origin(n)}"
                               for n, x in zip(self.input_names, inputs))
            raise InvalidInputError(
                f"{self.name}: the inputs' shapes disagree ({shapes}): {exc}; onnxruntime: "
                f"{str(ort_exc).strip()[:300]}") from ort_exc

    def _origin(self, name: str) -> str:
        """' from OP 'node'' for a cluster input another step computes (an onnxruntime
        segment's shape can differ from the one inferred: its ReduceMax over an empty axis
        keeps the 0, fuzz 114/1053), '' for a model input."""
        for v in getattr(self.cluster, "inputs", ()):
            if v.name == name and v.producer is not None:
                return f" from {v.producer.op} {v.producer.name!r}"
        return ""

    def _host(self, inputs: list[Any]) -> list[Any]:
        """inputs as host arrays (device values copied back) for onnxruntime and dumps."""
        return inputs if self._to_host is None else [self._to_host(x) for x in inputs]

    def on_device(self) -> bool:
        """Whether run() takes device values: a device backend's cluster not falling back
        (--async_compile runs onnxruntime stand-ins, so it takes host values)."""
        return (self._to_host is not None and self.fallback is None
                and not self.flags.async_compile)

    def _run_while_compiling(self, key: tuple, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """--async_compile: start compiling this signature in the background (once) and
        run the cluster with onnxruntime now."""
        with self._async_lock:
            if key not in self.pending:
                copies = [np.array(x, copy=True) for x in inputs]  # the caller may reuse them
                self.pending[key] = _COMPILER.submit(self._compile, key, copies)
            stand_in = self.onnxruntime_segment()
        self.stand_in_runs += 1
        return stand_in.run(inputs)

    def wait(self, timeout: float | None = None) -> None:
        """Block until every background compile started so far has finished."""
        concurrent.futures.wait(list(self.pending.values()), timeout=timeout)

    def _compile_now(self, inputs: list[np.ndarray]) -> Any:
        from autoclust.compile import compile_cluster
        types = [(x.dtype, x.shape) for x in inputs]
        shape_values = {self.input_names[i]: np.array(inputs[i]) for i in self.shape_value_index}
        bar = self.progress() if self.progress is not None else None
        if bar is not None:
            bar.start(self.name)
        t0 = time.perf_counter()
        exe, failed = self._compile_class(inputs, shape_values) if self.symbolic else (None, "")
        if exe is None:
            exe = compile_cluster(self.graph, types, shape_values, self.flags, self.backend)
            if failed:  # concrete shapes compile where symbolic ones failed: stay concrete
                self.symbolic = False
                self.symbolic_note = f"symbolic dims failed, compiling concrete shapes: {failed}"
                if self.flags.log:
                    print(f"autoclust: {self.name}: {self.symbolic_note}", file=sys.stderr)
        if self.flags.log:
            message = compile_message(self.name, self.backend, exe, inputs,
                                      time.perf_counter() - t0)
            if bar is not None:
                bar.write(message)
            else:
                print(message, file=sys.stderr)
        if bar is not None:
            bar.update()
        if self.dumper is not None:
            self.dumper.write_compile(self.name, getattr(exe, "dumps", {}))
        return exe

    def _compile_class(self, inputs: list[np.ndarray], shape_values: dict[str, np.ndarray]
                       ) -> tuple[Any, str]:
        """(the executable of these inputs' shape class, their open dims symbolic, bound
        to them; None when there is no open dim or the compile fails, and why it failed)."""
        from autoclust.compile import compile_class
        found = symbolic_types(self.graph, inputs, self.shape_value_index)
        if found is None:
            return None, ""
        if self.flags.log and self.classes:
            why = "; ".join(str(c.match(inputs)) for c in self.classes)
            print(f"autoclust: {self.name}: no compiled shape class serves "
                  f"{_signature_text(inputs)}: {why}", file=sys.stderr)
        types, pattern = found
        try:
            exe, guards = compile_class(self.graph, types, shape_values, self.flags,
                                        self.backend)
            if not hasattr(exe, "bind"):  # every symbolic dim was pinned: one shape
                exe = _Fixed(exe)
            cls = ShapeClass(tuple(x.dtype for x in inputs), pattern,
                             tuple((i, inputs[i].tobytes()) for i in self.shape_value_index),
                             tuple(guards), exe)
            env = cls.match(inputs)
            if not isinstance(env, dict):
                return None, f"the class does not serve the inputs it was compiled for: {env}"
            self.classes.append(cls)
            bound = exe.bind(env)
            bound.shape_class = cls
            return bound, ""
        except (InvalidInputError, NotCompilableError):
            raise
        except Exception as exc:  # noqa: BLE001 - the concrete compile comes next
            return None, f"{type(exc).__name__}: {exc}"

    def _is_megamorphic(self) -> bool:
        limit = self.flags.megamorphic_compiles
        return self.compiles >= limit and self.runs < RUNS_PER_COMPILE * self.compiles

    def _varying_dims(self) -> str:
        parts = []
        for i, name in enumerate(self.input_names):
            shapes = {sig[i][1] for sig in self.signatures if i < len(sig)}
            ranks = {len(s) for s in shapes}
            if len(ranks) != 1:
                parts.append(f"{name}: rank")
                continue
            for d in range(ranks.pop()):
                if len({s[d] for s in shapes}) > 1:
                    parts.append(f"{name}[{d}]")
        return ", ".join(parts) or "shape-deciding input values"

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self.fallback = self.onnxruntime_segment()
        where = "onnxruntime" if hasattr(self.fallback, "session") else \
            "autoclust's runtime (custom ops onnxruntime cannot load)"
        warnings.warn(f"autoclust: {self.name} falls back to {where} ({reason})",
                      RuntimeWarning, stacklevel=4)
        if self.dumper is not None:
            self.dumper.write_failure(self.name, reason)

    def _fallback_segment(self) -> Any:
        """onnxruntime over the cluster's graph; with a custom op (which onnxruntime cannot
        load) our runtime instead: custom kernels plus the other ops' references."""
        from autoclust.ops import custom
        if custom.in_graph(self.graph):
            return custom.HostRunner(self.graph, self.name)
        model, external = _onnx(self.graph)
        return registry.fallback().Segment(
            model, self.ort_options, name=self.name, input_names=self.input_names,
            output_names=self.output_names, external=external)

    def _check_numerics(self, inputs: list[np.ndarray], outs: list[np.ndarray]) -> None:
        bad = [name for name, x in zip(self.output_names, outs) if nonfinite(x)]
        if bad:  # only now pay for locating the node and summarizing the inputs
            inputs = self._host(inputs)
            what = f"output {bad[0]!r} has" if len(bad) == 1 else \
                f"outputs {', '.join(repr(b) for b in bad)} have"
            warnings.warn(f"autoclust: {self.name} {what} NaN or inf (--check_numerics); "
                          f"{first_nonfinite(self.graph, inputs)}; inputs: "
                          f"{value_ranges(self.input_names, inputs)}", RuntimeWarning,
                          stacklevel=4)


class _Fixed:
    """A shape class's executable whose every symbolic dim was pinned: it serves one shape."""

    def __init__(self, exe: Any):
        self.exe = exe
        self.num_kernels = getattr(exe, "num_kernels", 0)
        self.dumps = getattr(exe, "dumps", {})

    def bind(self, env: dict[str, int]) -> Any:
        return self.exe


def _signature_text(inputs: list[np.ndarray]) -> str:
    return ", ".join(f"{x.dtype}{list(x.shape)}" for x in inputs)


def compile_message(name: str, backend: Any, exe: Any, inputs: list[np.ndarray],
                    seconds: float) -> str:
    """The --log line of one compile (the interpreter interprets nodes, it has no kernels)."""
    from autoclust.text import plural
    sig = _signature_text(inputs)
    count = getattr(exe, "num_kernels", 0)
    cls = getattr(exe, "shape_class", None)
    if cls is not None:
        sig += f"; {cls.describe()}"
    if getattr(backend, "NAME", "") == "interpreter":
        return (f"autoclust: {name} ({sig}) will be interpreted: {plural(count, 'node')}, "
                f"optimized in {seconds * 1e3:.0f} ms")
    return (f"autoclust: compiled {name} ({sig}): {plural(count, 'kernel')} in "
            f"{seconds * 1e3:.0f} ms")


class SegmentRunner:
    """A fallback segment: an onnxruntime session over the segment's sub-model."""

    def __init__(self, step: Any, graph: Graph, ort_options: Any, providers: Any,
                 provider_options: Any):
        self.name = step.name
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        model, external = _onnx(graph)
        self.segment = registry.fallback().Segment(
            model, ort_options, providers, provider_options, name=step.name,
            input_names=self.input_names, output_names=self.output_names, external=external)

    def run(self, inputs: list[np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        return self.segment.run(inputs, run_options)


class Runtime:
    """Executes a Plan: a list of (runner, input names, output names, names to free)."""

    def __init__(self, plan: Any, flags: Flags, backend: Any, sess_options: Any = None,
                 providers: Any = None, provider_options: Any = None, dumper: Any = None,
                 whole_plan: bool = True):
        from autoclust.clustering.partition import Cluster, ControlFlow
        self.plan = plan
        self.graph = plan.graph
        self.backend = backend
        options = registry.fallback().sub_session_options(sess_options, flags.threads)
        self._ort = (options, providers, provider_options)  # for whole_model_segment
        # (ONNX model, its stubbed initializers' arrays) of the user's own file, where the
        # front end has one: the whole-model side of measured placement runs that, as
        # plain onnxruntime would, not our re-export of the imported graph
        self.whole_source: tuple[Any, dict[str, np.ndarray]] | None = None
        self.runners: list[Any] = []

        def make_runtime(body: Any) -> Runtime:  # a control-flow body's own Runtime
            return Runtime(body, flags, backend, sess_options, providers, provider_options,
                           whole_plan=False)  # a body is no model of its own

        for step in plan.steps:
            sub = self.graph.extract(step.nodes, name=step.name)
            if not sub.outputs:
                continue  # dead nodes (e.g. a Shape nobody reads): nothing to compute
            runner: Any  # ClusterRunner, ControlFlowRunner, HostRunner or SegmentRunner
            if isinstance(step, Cluster):
                runner = ClusterRunner(step, sub, flags, backend, options, dumper)
            elif isinstance(step, ControlFlow):  # an If/Loop/Scan with clustered bodies
                from autoclust.runtime.control_flow import ControlFlowRunner
                runner = ControlFlowRunner(step, sub, make_runtime)
            elif getattr(step, "host", False):  # a custom op: onnxruntime cannot load it
                from autoclust.ops.custom import HostRunner
                runner = HostRunner(sub, step.name)
            else:
                runner = SegmentRunner(step, sub, options, providers, provider_options)
            self.runners.append(runner)
        self.flags = flags
        self.placement = self._placement(plan, flags, backend)
        self._progress: Any = None  # the compiles of the run in progress (a Progress)
        self._progress_lock = threading.Lock()
        if not flags.async_compile or flags.must_compile:  # background compiles block nothing
            for r in self.compiled_clusters():
                r.progress = self._compile_progress
        self.output_names = [v.name for v in self.graph.outputs]
        # Overridable initializers (also graph inputs) and constant graph outputs start in
        # the environment.
        seed = {v.name for v in self.graph.inputs} | set(self.output_names)
        self.defaults = {name: arr for name, arr in self.graph.initializers.items()
                         if name in seed}
        self._plan_frees()
        self.device = DeviceRun(self) if registry.policy(backend).device_memory else None
        self._single = self._single_step()
        self.is_body = not whole_plan  # a control-flow body: no model onnxruntime runs whole
        self._whole_segment: Any = None  # whole_model_segment's, built at its first call
        self.rescued = False  # rescue.py has warned
        self.whole = self._whole_plan() if whole_plan else None
        if self.placement is not None:  # a one-cluster plan: its cluster's trial is the model's
            self.placement.one_cluster = whole_plan and len(self.runners) == 1

    def _placement(self, plan: Any, flags: Flags, backend: Any) -> Any:
        """The session's measured placement (autotune.py), or None (flags, device)."""
        from autoclust.runtime import autotune
        if autotune.skip_reason(flags, backend) is not None:
            return None
        placement = autotune.Placement(flags)
        plan.placement = placement.decisions
        for r in self.compiled_clusters():
            r.tuner = placement
        return placement

    def _whole_plan(self) -> Any:
        """The plan against onnxruntime over the whole model (autotune.WholePlan), for a
        plan of several steps that clusters and onnxruntime segments alone make up."""
        from autoclust.runtime import autotune
        if self.placement is None or len(self.runners) < 2 or not self.compiled_clusters():
            return None
        if any(not isinstance(r, (ClusterRunner, SegmentRunner)) or
               (isinstance(r, ClusterRunner) and r.unmeasurable()) for r in self.runners):
            # control flow, custom ops: onnxruntime cannot run the whole model; a division
            # it may crash on: it must not run what the compiled code answers
            return None
        return autotune.WholePlan(self, self.placement)

    def whole_model_segment(self) -> Any:
        """onnxruntime over the whole model, with the plan's sub-session options: the
        user's own graph where the session has it (onnxruntime's fusions see what they
        would see without us: Whisper's whole model ran 1.5% slower re-exported), else the
        imported graph exported back. One session, shared by autotune.WholePlan and
        rescue.py."""
        if self._whole_segment is None:
            options, providers, provider_options = self._ort
            model, external = self.whole_source or _onnx(self.graph)
            self._whole_segment = registry.fallback().Segment(
                model, options, providers, provider_options, name="whole model",
                input_names=[v.name for v in self.graph.inputs],
                output_names=self.output_names, external=external)
        return self._whole_segment

    def _plan_frees(self) -> None:
        last: dict[str, int] = {}
        for i, r in enumerate(self.runners):
            for name in r.input_names:
                last[name] = i
        keep = set(self.output_names)
        self.frees: list[list[str]] = [[] for _ in self.runners]
        for name, i in last.items():
            if name not in keep:
                self.frees[i].append(name)
        self.steps = [(r.run, r.input_names, r.output_names, f)
                      for r, f in zip(self.runners, self.frees)]

    def _single_step(self) -> tuple | None:
        """(run, input names, {graph output: index in the step's outputs}) when the plan is
        one step reading only required graph inputs and making every graph output."""
        if len(self.steps) != 1 or self.device is not None:
            return None
        run, in_names, out_names, _ = self.steps[0]
        graph_inputs = {v.name for v in self.graph.inputs}
        if any(n not in graph_inputs or n in self.defaults for n in in_names):
            return None
        if any(n not in out_names for n in self.output_names):
            return None
        return run, tuple(in_names), {n: out_names.index(n) for n in self.output_names}

    def run_outputs(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[Any]:
        """The graph outputs `names` of a run on validated host feeds (no RunOptions): the
        session's hot path. A one-step plan skips the environment dict."""
        single = self._single
        if single is None or self.steps[0][0] is not single[0]:  # steps wrapped (profiler)
            env = self.run(feeds)
            return [env[n] for n in names]
        run, in_names, index = single
        try:
            outs = run([feeds[n] for n in in_names])
        finally:
            if self._progress is not None:
                self._end_progress()
        return [outs[index[n]] for n in names]

    def direct(self, feeds: dict[str, np.ndarray]) -> Any:
        """For a one-step plan whose cluster's executable now serves these feeds' signature
        for good (compiled, placement decided): a call (output names, feeds, None) ->
        outputs that runs that executable alone. None otherwise (not yet, or never)."""
        single = self._single
        runner = self.runners[0]
        if single is None or self.steps[0][0] is not single[0] or \
                not isinstance(runner, ClusterRunner):  # steps wrapped (profiler)
            return None
        _, in_names, index = single
        exe = runner.settled([feeds[n] for n in in_names])
        if exe is None:
            return None
        exe_run = exe.run
        all_outputs = self.output_names
        in_order = list(index.values()) == list(range(len(index)))
        name = in_names[0] if len(in_names) == 1 else None

        def call(output_names: list[str], feed: dict[str, np.ndarray], _: Any) -> list[Any]:
            # the session's hot path: a list comprehension costs ~0.2 us, hence the cases
            if runner.fallback is not None:  # fell back since (a later signature)
                return self.run_outputs(feed, output_names)
            runner.runs += 1  # counted as ClusterRunner.run does (megamorphic guard)
            outs = exe_run([feed[name]] if name is not None else [feed[n] for n in in_names])
            if in_order and output_names == all_outputs and len(outs) == len(all_outputs):
                return outs  # a new list each run
            return [outs[index[n]] for n in output_names]
        return call

    def run(self, feeds: dict[str, np.ndarray], run_options: Any = None) -> dict[str, np.ndarray]:
        """Run the plan on validated feeds; returns every graph output by name (a device
        backend's outputs may be device arrays: see DeviceRun).

        With onnxruntime RunOptions, its segments get them (log severity and tag, config
        entries) and `terminate` is checked before every step, as onnxruntime does between
        its nodes (on a device plan: before the run).
        """
        if self.device is not None:
            if run_options is not None and run_options.terminate:
                raise registry.fallback().terminated_error(self.runners[0].name)
            return self.device.run(feeds)
        if run_options is not None:
            return self._run_with_options(feeds, run_options)
        if self.whole is not None:  # measured placement of the whole plan
            outs = self.whole.run(feeds)
            if outs is not None:
                return outs
        return self.run_steps(feeds)

    def run_steps(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the plan's steps on validated host feeds; the environment at the end."""
        env = dict(self.defaults)
        env.update(feeds)
        try:
            for k, (run, in_names, out_names, frees) in enumerate(self.steps):
                outs = run([env[n] for n in in_names])
                for name, value in zip(out_names, outs):
                    env[name] = value
                for name in frees:
                    del env[name]
        except InvalidInputError as exc:  # of a value an onnxruntime segment made?
            return rescue.whole_model_answer(self, feeds, k, exc)
        finally:  # costs nothing without an exception (zero-cost try since Python 3.11)
            if self._progress is not None:
                self._end_progress()
        return env

    def _run_with_options(self, feeds: dict[str, np.ndarray], options: Any) -> dict[str, Any]:
        env = dict(self.defaults)
        env.update(feeds)
        try:
            for k, (runner, frees) in enumerate(zip(self.runners, self.frees)):
                if options.terminate:
                    raise registry.fallback().terminated_error(runner.name)
                outs = runner.run([env[n] for n in runner.input_names], options)
                for name, value in zip(runner.output_names, outs):
                    env[name] = value
                for name in frees:
                    del env[name]
        except InvalidInputError as exc:
            return rescue.whole_model_answer(self, feeds, k, exc)
        finally:
            if self._progress is not None:
                self._end_progress()
        return env

    def _compile_progress(self) -> Any:
        """The progress of this run's compiles, made at its first compile (cold path)."""
        from autoclust.report.progress import Progress
        with self._progress_lock:
            if self._progress is None:
                # A first run compiles every cluster; a later one those meeting a new signature.
                todo = sum(1 for r in self.compiled_clusters()
                           if not r.cache and r.fallback is None)
                verb = ("autoclust: optimizing for the interpreter"
                        if getattr(self.backend, "NAME", "") == "interpreter"
                        else "autoclust: compiling")
                self._progress = Progress(verb, total=todo or None, unit="cluster",
                                          log=self.flags.log, leave=False)
            return self._progress

    def _end_progress(self) -> None:
        with self._progress_lock:
            progress, self._progress = self._progress, None
        if progress is not None:
            progress.close()

    def compiled_clusters(self) -> list[ClusterRunner]:
        return [r for r in self.runners if isinstance(r, ClusterRunner)]

    def wait_compiles(self, timeout: float | None = None) -> None:
        """Block until every cluster's background compiles (--async_compile) are done."""
        for r in self.compiled_clusters():
            r.wait(timeout)
        for r in self.runners:
            if not isinstance(r, ClusterRunner) and hasattr(r, "wait"):
                r.wait(timeout)  # control flow: its bodies' compiles


class DeviceRun:
    """Runs a plan whose clusters keep values in device memory (Policy.device_memory).

    Each value is copied to the side that reads it at most once per run (a cluster on the
    device, an onnxruntime segment or a shape-deciding input on the host) and the bytes are
    counted (`last_copies`, `autoclust.runtime.transfers`). With --cuda_graphs the backend's
    capture(runtime) may replay the whole run as one graph.
    """

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        backend = runtime.backend
        self.to_device, self.to_host = backend.to_device, backend.to_host
        self.graphs = backend.capture(runtime) if hasattr(backend, "capture") else None
        self.last_copies: Any = None

    def run(self, feeds: dict[str, Any], names: list[str] | None = None,
            on_device: bool = False) -> Any:
        """The env of a run (names None), or the outputs `names`, moved to the device
        (on_device) or the host; the copies of the run are counted in last_copies."""
        from autoclust.runtime import transfers
        with transfers.measure() as copied:
            env = self.graphs.run(feeds) if self.graphs is not None else None
            if env is None:
                env = self._run_steps(feeds)
            if names is not None:
                move = self.to_device if on_device else self.to_host
                env = [move(env[n]) for n in names]
        self.last_copies = copied
        return env

    def _run_steps(self, feeds: dict[str, Any]) -> dict[str, Any]:
        rt = self.runtime
        env = dict(rt.defaults)
        env.update(feeds)
        other: dict[str, Any] = {}  # name -> the value's copy on the other side
        for runner, (run, in_names, out_names, frees) in zip(rt.runners, rt.steps):
            device = isinstance(runner, ClusterRunner) and runner.on_device()
            host_only = set(runner.shape_value_index) if device else set()
            args = [self._place(env, other, n, device and i not in host_only)
                    for i, n in enumerate(in_names)]
            for name, value in zip(out_names, run(args)):
                env[name] = value
                other.pop(name, None)
            for name in frees:
                del env[name]
                other.pop(name, None)
        return env

    def _place(self, env: dict[str, Any], other: dict[str, Any], name: str,
               device: bool) -> Any:
        value = env[name]
        if self.runtime.backend.is_device(value) == device:
            return value
        if name not in other:
            other[name] = self.to_device(value) if device else self.to_host(value)
        return other[name]


# Initializers from this size on reach onnxruntime as OrtValues over our arrays, not copied
# into the serialized sub-model (GPT-2's cluster: 0.5 s to a session instead of 5 s).
EXTERNAL_BYTES = 1 << 12


def _onnx(graph: Graph) -> tuple[Any, dict[str, np.ndarray]]:
    """A sub-graph as an ONNX model for onnxruntime, and the large initializers it stubs."""
    onnx_importer = registry.importer("onnx")
    model = onnx_importer.export_model(graph, external_min_bytes=EXTERNAL_BYTES)
    return model, {n: graph.initializers[n] for n in onnx_importer.external_stubs(model)}


__all__ = ["AutoclustError", "ClusterRunner", "DeviceRun", "Runtime", "SegmentRunner"]
