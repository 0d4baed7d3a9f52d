"""torch.compile(backend="autoclust"): ATen graphs -> clusters -> fused kernels; the rest eager.

    import torch
    fast = torch.compile(model, backend="autoclust")      # registered by entry point
    with torch.no_grad():
        y = fast(x)
    from autoclust.importers import torch_fx
    print(torch_fx.explain(fast))                          # clusters, and why the rest is eager

The pipeline, per graph Dynamo captures:

    Dynamo FX graph --aot_autograd, core ATen decompositions--> ATen graph
      --import_aten--> op-table Graph (unmappable nodes become opaque "torch" nodes, each
                       with its reason), symbolic sizes as str dims
      --partition--> autoclust.clustering.partition.cluster, then every ATen node's op-table nodes
                     either all in one cluster or all out (refused and re-clustered)
      --rewrite--> the ATen graph with each cluster replaced by one call; the other nodes
                   stay eager torch; clusters compile per signature at their first run

Flags come from AUTOCLUST_FLAGS and `torch.compile(..., options={"min_cluster_size": 2})`;
--threads=0 (the default) means torch.get_num_threads() at compile time. Graphs needing
gradients compile their forward; their backward runs as eager torch.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import operator
import os
import warnings
from typing import Any

import torch
from autoclust.importers.torch import aten as torch_aten
from autoclust.importers.torch import freeze
from autoclust.importers.torch import lowering as tl
from autoclust.importers.torch import run as torch_run
from torch import fx

from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.clustering.partition import Cluster, Plan, cluster
from autoclust.errors import AutoclustError, NotCompilableError
from autoclust.ir import Graph, Node, Value
from autoclust.registry import Policy

TORCH_DOMAIN = "torch"
MAX_FOLDED_ELEMENTS = 1 << 24   # factory results larger than this stay eager calls
GROWN_ELEMENTS = 1 << 18        # folded results may outgrow their constant inputs up to this
_PARTITION_ROUNDS = 8

_LOG = torch_run.ReportLog()


# ---- public API -----------------------------------------------------------------------------

def autoclust_backend(gm: fx.GraphModule, example_inputs: list[Any],
                      options: dict[str, Any] | None = None, **_: Any) -> Any:
    """The torch.compile backend "autoclust" (entry point group torch_dynamo_backends)."""
    return Backend(**(options or {}))(gm, example_inputs)


def backend(**flags: Any) -> Backend:
    """A backend object with flags: `torch.compile(m, backend=torch_fx.backend(auto_jit=2))`."""
    return Backend(**flags)


def explain(fn: Any = None, as_json: bool = False) -> Any:
    """What autoclust did with the graphs of `fn` (all graphs when None): text or JSON dict."""
    reports = _LOG.select(fn)
    if as_json:
        return {"graphs": [r.explain_json() for r in reports]}
    if not reports:
        return "autoclust: no graph compiled" + ("" if fn is None else " for this function")
    return "\n".join(r.explain_text() for r in reports)


def reports(fn: Any = None) -> list[torch_run.GraphReport]:
    """The GraphReport of every graph compiled (for `fn`, when given), oldest first."""
    return _LOG.select(fn)


def reset() -> None:
    """Forget the reports (torch._dynamo.reset() forgets the compiled code)."""
    _LOG.clear()


class Backend:
    """Dynamo backend: aot_autograd with core ATen decompositions, then `compile_aten`."""

    def __init__(self, **flag_overrides: Any):
        self.flags = flags_mod.parse(**flag_overrides)  # FlagError on a bad flag, right here
        self.__name__ = "autoclust"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any], **_: Any) -> Any:
        from torch._decomp import core_aten_decompositions
        from torch._dynamo.backends.common import aot_autograd
        codes = _dynamo_code()
        compile_fw = functools.partial(self._compile, codes=codes, kind="forward")
        compile_inf = functools.partial(self._compile, codes=codes, kind="inference")
        aot = aot_autograd(fw_compiler=compile_fw, inference_compiler=compile_inf,
                           bw_compiler=_eager_backward,
                           decompositions=core_aten_decompositions())
        return aot(gm, example_inputs)

    def _compile(self, gm: fx.GraphModule, example_inputs: list[Any], codes: tuple,
                 kind: str) -> Any:
        from functorch.compile import make_boxed_func
        flags = self.flags
        if flags.threads == 0:
            flags = flags.replace(threads=torch.get_num_threads())
        if not flags.cache_dir and flags.torch_cache_dir:
            flags = flags.replace(cache_dir=torch_cache_dir(flags.torch_cache_dir))
        report = _LOG.new(kind, codes)
        return make_boxed_func(compile_aten(gm, flags, report))


def torch_cache_dir(setting: str) -> str:
    """The directory --torch_cache_dir names ("auto": $XDG_CACHE_HOME/autoclust/torch).

    torch.compile users get inductor's on-disk caches without asking, so a second process
    finds its kernels compiled; autoclust's torch backend does the same with --cache_dir's
    machinery (entries keyed by the code that made them, the directory refused unless it is
    private: runtime/disk_cache.py). BERT-base's first call: 4.2 s, 2.9 s warm."""
    if setting != "auto":
        return os.path.expanduser(setting)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "autoclust", "torch")


def _eager_backward(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    from functorch.compile import make_boxed_func
    return make_boxed_func(gm.forward)


def _dynamo_code() -> tuple[Any, ...]:
    """The code objects Dynamo traced into this graph, the frame's own first (explain(fn)
    finds a module's forward even where Dynamo compiled a wrapper that inlines it)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        from torch._guards import TracingContext
        frame = InstructionTranslator.current_tx().f_code
    except (AttributeError, ImportError):
        return ()
    inlined = TracingContext.get_traced_code() or []
    return (frame, *[c for c in inlined if c is not frame])


def compile_aten(gm: fx.GraphModule, flags: flags_mod.Flags,
                 report: torch_run.GraphReport) -> Any:
    """An ATen GraphModule -> a callable running its clusters compiled and the rest eager.

    An unexpected error while importing or rewriting leaves the whole graph eager, with one
    warning (under --must_compile it raises).
    """
    report.aten_nodes = sum(1 for n in gm.graph.nodes
                            if n.op == "call_function" and n.target is not operator.getitem)
    report.aten_code = gm.code
    if flags.auto_jit == 0:
        report.failure = "auto_jit is 0"
        return gm
    from autoclust import registry
    backend = registry.get_backend(flags.device)
    build = functools.partial(_build_safely, gm, flags, report, backend)
    positions = freeze.static_positions(gm) if flags.freeze_params and \
        report.kind == "inference" else []
    if positions:  # the values are known at the first call: build then
        return freeze.FrozenGraph(positions, build, report)
    return build({})


def _build_safely(gm: fx.GraphModule, flags: flags_mod.Flags, report: torch_run.GraphReport,
                  backend: Any, constants: dict[int, torch.Tensor]) -> Any:
    """_compile_aten; on an unexpected error the whole graph runs eager, with one warning."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    report.clear()
    try:
        with unset_fake_temporarily():  # aot_autograd calls us under fake mode: real tensors
            return _compile_aten(gm, flags, report, backend, constants)
    except AutoclustError:
        raise
    except Exception as exc:  # an importer bug must not break the user's model
        if flags.must_compile:
            raise
        report.failure = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"autoclust: graph {report.index} runs as eager torch "
                      f"({report.failure})", RuntimeWarning, stacklevel=2)
        return gm


def _compile_aten(gm: fx.GraphModule, flags: flags_mod.Flags, report: torch_run.GraphReport,
                  backend: Any, constants: dict[int, torch.Tensor]) -> Any:
    imported = import_aten(gm, constants)
    plan = partition(imported, flags, backend.why_not, eager_policy(backend))
    _fill_report(report, imported, plan)
    if flags.must_compile and report.eager:
        lines = [f"  {n} ({t}): {r}" for n, t, r in report.eager]
        raise NotCompilableError(f"{len(lines)} ATen node(s) could not be compiled "
                                 "(--must_compile):\n" + "\n".join(lines))
    dumper = _dumper(flags, report, plan)
    return rewrite(gm, imported, plan, flags, backend, report, dumper)


def _dumper(flags: flags_mod.Flags, report: torch_run.GraphReport, plan: Plan) -> Any:
    if not flags.dump_to:
        return None
    from autoclust.report.dump import Dumper
    dumper = Dumper.create(os.path.join(flags.dump_to, f"graph_{report.index}"), flags)
    if dumper is not None:
        dumper.write_plan(plan)
        dumper.write("aten_graph.py", report.aten_code)
        dumper.write("explain.txt", report.explain_text() + "\n")
    return dumper


# ---- import: ATen FX graph -> op-table Graph --------------------------------------------------

class Imported:
    """The op-table Graph of an ATen graph, and how its nodes and values map back."""

    def __init__(self, gm: fx.GraphModule):
        self.gm = gm
        self.graph = Graph("aten_graph")
        self.graph.opset = {"": 21}
        self.values: dict[fx.Node, Any] = {}        # FX node -> Value or list of Value|None
        self.groups: dict[fx.Node, list[Node]] = {}  # FX node -> its op-table nodes
        self.reasons: dict[fx.Node, str] = {}        # FX node -> why it runs as eager torch
        self.source: dict[str, fx.Node] = {}         # value name -> FX node holding it at run time
        self.owner: dict[str, fx.Node] = {}          # op-table node name -> its FX node
        self.folded: dict[fx.Node, torch.Tensor] = {}  # nodes evaluated once, at import
        self.consts: dict[fx.Node, torch.Tensor] = {}  # every node with a constant value
        self.tensor_sizes: set[fx.Node] = set()      # symbolic ints computed from tensors


def import_aten(gm: fx.GraphModule, constants: dict[int, torch.Tensor] | None = None
                ) -> Imported:
    """Map every node of an ATen graph onto the op table or an opaque torch node.

    `constants` maps placeholder positions to their values (frozen parameters): those
    become initializers, and nodes computed from constants alone are evaluated here.
    """
    imp = Imported(gm)
    constants = constants or {}
    position = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if position in constants:
                _import_frozen(imp, node, constants[position])
            else:
                _import_placeholder(imp, node)
            position += 1
        elif node.op == "get_attr":
            _import_constant(imp, node, getattr(gm, node.target))
        elif node.op == "output":
            imp.graph.outputs = _output_values(imp, node)
        elif node.op == "call_function" and node.target is operator.getitem:
            _import_getitem(imp, node)
        elif node.op == "call_function":
            _import_call(imp, node)
        else:
            _import_opaque(imp, node, f"{node.op} nodes are not lowered")
    return imp


def _output_values(imp: Imported, node: fx.Node) -> list[Value]:
    flat: list[Any] = []
    fx.node.map_arg(node.args[0], flat.append)
    return [imp.values[a] for a in flat if isinstance(imp.values.get(a), Value)]


def _import_placeholder(imp: Imported, node: fx.Node) -> None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        dt, shape = tl.ir_type(val)
        v = imp.graph.add_input(node.name, dt, shape)
        imp.values[node] = v
        imp.source[v.name] = node


def _import_frozen(imp: Imported, node: fx.Node, value: torch.Tensor) -> None:
    """A frozen parameter: an initializer viewing its memory (the guard sees changes)."""
    v = imp.graph.add_initializer(node.name, freeze.as_constant(value))
    imp.values[node] = v
    imp.source[v.name] = node
    imp.consts[node] = value


def _import_constant(imp: Imported, node: fx.Node, value: Any, copy: bool = True) -> None:
    if not isinstance(value, torch.Tensor) or tl.np_dtype(value.dtype) is None or \
            value.device.type != "cpu":
        return  # consumers find no IR value and run eager, saying why
    imp.consts[node] = value
    array = value.detach().numpy().copy() if copy else freeze.as_constant(value)
    v = imp.graph.add_initializer(node.name, array)
    imp.values[node] = v
    imp.source[v.name] = node


def _import_getitem(imp: Imported, node: fx.Node) -> None:
    parent, index = node.args
    if _is_size(node.meta.get("val")) and (parent in imp.tensor_sizes or parent in imp.reasons):
        imp.tensor_sizes.add(node)  # a size an eager node computed: known only at run time
    items = imp.values.get(parent)
    if isinstance(items, list) and index < len(items) and items[index] is not None:
        imp.values[node] = items[index]
        imp.source[items[index].name] = node


def _import_call(imp: Imported, node: fx.Node) -> None:
    val = node.meta.get("val")
    if _is_size(val):
        if _reads_tensors(imp, node):
            imp.tensor_sizes.add(node)
            _import_opaque(imp, node, "size computed from a tensor (runs in Python)")
        return  # sizes from the graph's own symbolic inputs need no node
    if _fold(imp, node):
        return
    reason = _why_not_lowered(imp, node)
    if reason is None:
        reason = _lower(imp, node)
    if reason is not None:
        _import_opaque(imp, node, reason)


def _is_size(val: Any) -> bool:
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _reads_tensors(imp: Imported, node: fx.Node) -> bool:
    """True when a size depends on a tensor computed in the graph (sizes of graph inputs
    are known before anything runs)."""
    return any(a in imp.tensor_sizes or (isinstance(a.meta.get("val"), torch.Tensor) and
                                         a.op != "placeholder")
               for a in node.all_input_nodes)


def _fold(imp: Imported, node: fx.Node) -> bool:
    """Evaluate a node whose inputs are all constants once, with torch; its result becomes a
    constant. A factory (no inputs: a causal mask, arange) folds up to MAX_FOLDED_ELEMENTS;
    work on constants (a weight's transpose, rotary tables from a buffer) folds unless its
    result outgrows its inputs by more than GROWN_ELEMENTS (a broadcast is cheaper to compute
    than to read)."""
    if not tl.is_deterministic(node) or any(a not in imp.consts for a in node.all_input_nodes):
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or tl.np_dtype(val.dtype) is None:
        return False
    inputs = sum(imp.consts[a].numel() for a in node.all_input_nodes)
    limit = max(inputs, GROWN_ELEMENTS) if node.all_input_nodes else MAX_FOLDED_ELEMENTS
    if not isinstance(val.numel(), int) or val.numel() > limit:
        return False
    try:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: imp.consts[a])
        value = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - then it is lowered or runs eager like any node
        return False
    if not isinstance(value, torch.Tensor) or value.shape != val.shape or \
            value.dtype != val.dtype:
        return False
    imp.folded[node] = value
    _import_constant(imp, node, value, copy=False)
    return True


def _why_not_lowered(imp: Imported, node: fx.Node) -> str | None:
    if torch_aten.lowering_for(node.target) is None:
        return f"no lowering for {_target_name(node)}"
    for a in [*node.all_input_nodes, node]:
        vals = a.meta.get("val")
        for val in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(val, torch.Tensor) and val.device.type != "cpu":
                return f"tensor {a.name} is on {val.device} (autoclust compiles for the CPU)"
    for a in node.all_input_nodes:
        if a in imp.tensor_sizes:
            return f"size argument {a.name} is computed from a tensor at run time"
    return None


def _lower(imp: Imported, node: fx.Node) -> str | None:
    """Run the node's lowering; on Unmapped undo what it emitted and return the reason."""
    lo = tl.Lowering(imp.graph, node, imp.values, imp.graph.inputs)
    before = set(imp.graph.initializers)
    try:
        result = torch_aten.lowering_for(node.target)(lo, *node.args, **node.kwargs)
        outs = result if isinstance(result, list) else [result]
        outs = [_own(lo, v) for v in outs]
        lo.settle(outs)
    except tl.Unmapped as exc:
        for n in reversed(lo.emitted):
            for v in n.outputs:
                v.uses = []
            imp.graph.remove_node(n)
        for name in set(imp.graph.initializers) - before:
            del imp.graph.initializers[name]
            imp.graph.values.pop(name, None)
        return str(exc)
    imp.values[node] = outs if isinstance(node.meta.get("val"), (list, tuple)) else outs[0]
    imp.groups[node] = lo.emitted
    for n in lo.emitted:
        imp.owner[n.name] = node
    if not isinstance(node.meta.get("val"), (list, tuple)):
        imp.source[outs[0].name] = node
    return None


def _own(lo: tl.Lowering, v: Value | None) -> Value | None:
    """Outputs must come from nodes the lowering emitted (an alias gets an Identity)."""
    if v is None or v.producer in lo.emitted:
        return v
    return lo.one("Identity", v)


def _import_opaque(imp: Imported, node: fx.Node, reason: str) -> None:
    """A node that runs as eager torch: an opaque op-table node keeps the dependencies."""
    inputs = [v for a in node.all_input_nodes for v in _as_list(imp.values.get(a))]
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    outs: list[Value | None] = []
    for i, x in enumerate(vals):
        name = node.name if len(vals) == 1 else f"{node.name}.{i}"
        if isinstance(x, torch.Tensor):
            dt, shape = tl.ir_type(x)
            outs.append(Value(name, dt, shape))
        elif node in imp.tensor_sizes:
            outs.append(Value(name, None, ()))
        else:
            outs.append(None)
    op_node = Node(_target_name(node), inputs, [o for o in outs if o is not None], {},
                   node.name, TORCH_DOMAIN)
    imp.graph.add_node(op_node)
    imp.groups[node] = [op_node]
    imp.owner[op_node.name] = node
    imp.reasons[node] = reason
    imp.values[node] = outs if isinstance(val, (list, tuple)) else outs[0]
    if len(vals) == 1 and outs[0] is not None:
        imp.source[outs[0].name] = node


def _as_list(x: Any) -> list[Value]:
    if isinstance(x, Value):
        return [x]
    if isinstance(x, list):
        return [v for v in x if isinstance(v, Value)]
    return []


def _target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._opname}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


# ---- partition ------------------------------------------------------------------------------

def eager_policy(backend: Any) -> Policy:
    """The backend's Policy with nothing left out for onnxruntime's sake: here the fallback is
    eager torch, which fuses nothing into its convolutions. A CPU Conv is a library call
    inside the cluster, so BatchNorm, ReLU and pooling fuse around it (convnet block: 2.3x
    eager with the convolutions clustered, 1.0x with them left out)."""
    return dataclasses.replace(registry.policy(backend), leave_to_onnxruntime=frozenset(),
                               onnxruntime_epilogues=frozenset())


def partition(imp: Imported, flags: flags_mod.Flags, why_not: Any,
              policy: Policy | None = None) -> Plan:
    """Cluster the op-table graph so every ATen node is wholly inside one cluster or outside."""
    refused: dict[str, str] = {}

    def why_not_here(node: Node, graph: Graph) -> str | None:
        return refused.get(node.name) or why_not(node, graph)

    for _ in range(_PARTITION_ROUNDS):
        plan = cluster(imp.graph, flags, why_not_here, policy)
        split = _split_nodes(imp, plan)
        if not split:
            return plan
        for fx_node in split:
            # said here: clustering would prefix a why_not reason with the device
            imp.reasons[fx_node] = (f"{_target_name(fx_node)} lowers to "
                                    f"{len(imp.groups[fx_node])} ops that did not all join "
                                    "one cluster")
            for n in imp.groups[fx_node]:
                refused[n.name] = imp.reasons[fx_node]
    raise RuntimeError(f"partition did not settle in {_PARTITION_ROUNDS} rounds")


def _split_nodes(imp: Imported, plan: Plan) -> list[fx.Node]:
    split = []
    for fx_node, group in imp.groups.items():
        homes = {id(plan.cluster_of(n.name)) for n in group}
        if len(homes) > 1:
            split.append(fx_node)
    return split


def _fill_report(report: torch_run.GraphReport, imp: Imported, plan: Plan) -> None:
    report.plan = plan
    report.folded = [n.name for n in imp.folded]
    for c in plan.clusters:
        fx_nodes = _cluster_fx_nodes(imp, c)
        report.clusters.append(torch_run.ClusterReport(
            c.name, [n.name for n in fx_nodes],
            torch_run.histogram([_short(n) for n in fx_nodes]),
            torch_run.histogram([n.op for n in c.nodes])))
    for fx_node, group in imp.groups.items():  # every group holds at least one node
        if plan.cluster_of(group[0].name) is not None:
            continue
        reason = imp.reasons.get(fx_node) or plan.reasons.get(group[0].name, "?")
        report.eager.append((fx_node.name, _target_name(fx_node), reason))


def _short(node: fx.Node) -> str:
    t = node.target
    return t._opname if isinstance(t, torch._ops.OpOverload) else _target_name(node)


def _cluster_fx_nodes(imp: Imported, c: Cluster) -> list[fx.Node]:
    owners = {id(imp.owner[n.name]): imp.owner[n.name] for n in c.nodes}
    return [n for n in imp.gm.graph.nodes if id(n) in owners]


# ---- rewrite: one call per cluster, the rest as it was ------------------------------------------

class _Unit:
    """A cluster's FX nodes (emitted as one call) or one FX node kept as it is."""

    def __init__(self, nodes: list[fx.Node], first: int, cluster: Cluster | None = None):
        self.nodes = nodes
        self.first = first  # position of its first node in the ATen graph
        self.cluster = cluster


def rewrite(gm: fx.GraphModule, imp: Imported, plan: Plan, flags: flags_mod.Flags,
            backend: Any, report: torch_run.GraphReport, dumper: Any) -> fx.GraphModule:
    """The ATen graph with each cluster's nodes replaced by one call to its runner."""
    new = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    attrs: dict[str, Any] = {}  # get_attr targets of the new graph
    by_name = {c.name: c for c in report.clusters}
    for unit in _ordered(_units(gm, imp, plan)):
        if unit.cluster is None:
            _emit_node(new, env, unit.nodes[0], imp, attrs)
        else:
            _emit_cluster(new, env, unit, imp, flags, backend, by_name[unit.cluster.name],
                          dumper)
    new.lint()
    return fx.GraphModule(attrs, new)


def _units(gm: fx.GraphModule, imp: Imported, plan: Plan) -> list[_Unit]:
    home: dict[fx.Node, Cluster] = {}
    for fx_node, group in imp.groups.items():
        c = plan.cluster_of(group[0].name)
        if c is not None:
            home[fx_node] = c
    members: dict[str, tuple[int, list[fx.Node]]] = {}
    units: list[_Unit] = []
    for i, n in enumerate(gm.graph.nodes):
        c = home.get(n)
        if c is None and n.target is operator.getitem and n.args[0] in home:
            c = home[n.args[0]]  # a getitem of a clustered node reads the cluster's output
            home[n] = c
        if c is None:
            units.append(_Unit([n], i))
        else:
            members.setdefault(c.name, (i, []))[1].append(n)
    by_name = {c.name: c for c in plan.clusters}
    units += [_Unit(nodes, first, by_name[name]) for name, (first, nodes) in members.items()]
    return units


def _ordered(units: list[_Unit]) -> list[_Unit]:
    """Units in a topological order, keeping the original order where possible."""
    unit_of = {n: u for u in units for n in u.nodes}
    preds: dict[int, set[int]] = {id(u): set() for u in units}
    succs: dict[int, list[_Unit]] = {id(u): [] for u in units}
    for u in units:
        for n in u.nodes:
            for a in n.all_input_nodes:
                p = unit_of[a]
                if p is not u and id(p) not in preds[id(u)]:
                    preds[id(u)].add(id(p))
                    succs[id(p)].append(u)
    ready = [(u.first, id(u), u) for u in units if not preds[id(u)]]
    heapq.heapify(ready)
    order: list[_Unit] = []
    while ready:
        _, _, u = heapq.heappop(ready)
        order.append(u)
        for s in succs[id(u)]:
            preds[id(s)].discard(id(u))
            if not preds[id(s)]:
                heapq.heappush(ready, (s.first, id(s), s))
    if len(order) != len(units):
        raise RuntimeError("clusters and eager nodes form a cycle")
    return order


def _emit_node(new: fx.Graph, env: dict[fx.Node, fx.Node], node: fx.Node, imp: Imported,
               attrs: dict[str, Any]) -> None:
    if node in imp.folded:  # a constant now: read it instead of building it on every call
        name = f"_autoclust_const_{node.name}"
        attrs[name] = imp.folded[node]
        env[node] = new.get_attr(name)
        env[node].meta = dict(node.meta)
        return
    if node.op == "get_attr":
        attrs[node.target] = _attr(imp.gm, node.target)
    env[node] = new.node_copy(node, lambda a: env[a])


def _attr(module: Any, target: str) -> Any:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _emit_cluster(new: fx.Graph, env: dict[fx.Node, fx.Node], unit: _Unit, imp: Imported,
                  flags: flags_mod.Flags, backend: Any, creport: torch_run.ClusterReport,
                  dumper: Any) -> None:
    c = unit.cluster
    sub = imp.graph.extract(c.nodes, name=c.name)
    inside = set(unit.nodes)
    external: list[fx.Node] = []
    for n in unit.nodes:
        for a in n.all_input_nodes:
            if a not in inside and a not in external:
                external.append(a)
    for v in sub.inputs:
        if imp.source[v.name] not in external:
            external.append(imp.source[v.name])
    array_args = [external.index(imp.source[v.name]) for v in sub.inputs]
    outputs = [imp.source[v.name] for v in sub.outputs]
    if not outputs:
        return  # nothing outside reads it
    runner = torch_run.TorchClusterRunner(c, sub, flags, backend, None, dumper)
    creport.runner = runner
    eager = functools.partial(_eager_module, unit.nodes, external, outputs)
    call = torch_run.make_cluster_call(c.name, runner, array_args, eager)
    result = new.call_function(call, tuple(env[a] for a in external))
    for k, out in enumerate(outputs):
        env[out] = new.call_function(operator.getitem, (result, k))
        env[out].meta = dict(out.meta)


def _eager_module(nodes: list[fx.Node], external: list[fx.Node],
                  outputs: list[fx.Node]) -> fx.GraphModule:
    """The cluster's ATen nodes as a module of their own: its eager torch fallback."""
    g = fx.Graph()
    env = {a: g.placeholder(a.name) for a in external}
    for n in nodes:
        env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] for o in outputs))
    return fx.GraphModule({}, g)  # constants (get_attr nodes) come in as arguments


__all__ = ["Backend", "autoclust_backend", "backend", "compile_aten", "explain",
           "import_aten", "partition", "reports", "reset", "rewrite"]
