"""Fusion: a concrete-shape cluster Graph -> kernel IR Program (a list of thunks).

Every value is either *materialized* (a buffer: graph inputs, constants, graph outputs,
operands of library and reference calls, and values fusion decides to keep) or *inlined*:
its expression is rebuilt, at the right index, inside each kernel that reads it.
Kernels are grown from the materialized values ("roots") in topological order:

1. A root's expression is built over its own shape (an elementwise loop nest). When it
   reaches a reduction (ReduceX, Softmax, LayerNorm, ...) the kernel becomes a row kernel
   over the reduced input's dims (kept dims outer, reduced dims inner) and is rebuilt.
2. A reduction can be inlined only when its reduced dims are the kernel's inner dims and
   its row does not move with the inner indices; otherwise its output is materialized
   (a note says why) and fusion restarts. Each restart materializes one more value.
3. A root joins an existing kernel with the same loop shape when everything it loads was
   computed before that kernel (multi-output fusion: LayerNorm's Y and Mean, a chain with
   an intermediate graph output).
4. An inlined value read by several kernels is materialized when recomputing it would
   repeat a reduction or more than RECOMPUTE_LIMIT ops.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autoclust import inject, ops
from autoclust import kernel_ir as kir
from autoclust.errors import CompileError
from autoclust.fusion_lower import NeedRowDomain, Refuse, broadcast_index
from autoclust.fusion_rows import LOWERINGS, reduced_index, refined_row_domain, why_not_lower
from autoclust.ir import Graph, Node, Value
from autoclust.kernel_ir import Affine

RECOMPUTE_LIMIT = 12       # inlined ops a second kernel may recompute instead of a load
EXPENSIVE_OPS = frozenset({"exp", "log", "tanh", "erf", "sigmoid", "pow", "sin", "cos"})
MAX_RESTARTS = 200
# MatMul + constant bias Add -> one Gemm call: "alone" only when the Add's result is a graph
# output or feeds library/reference calls only (its own loop kernel disappears); "always"
# also when a kernel reads it (measured slower: bert_encoder 51.5 vs 49.2 ms, the bias is
# free in a fused epilogue but an extra pass inside the Gemm); "" never.
FOLD_BIAS = "alone"


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a C-contiguous array."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def flat_index(idx: tuple[Affine, ...], shape: tuple[int, ...], rank: int) -> Affine:
    """The flat element offset of logical index `idx` in a contiguous array of `shape`."""
    out = kir.constant(0, rank)
    for a, s, d in zip(idx, contiguous_strides(shape), shape):
        if d != 1:
            out = out.plus(a, s)
    return out


class KernelBuilder:
    """Builds the expressions of one kernel (a group of roots sharing a loop nest)."""

    def __init__(self, fusion: Fusion, shape: tuple[int, ...], n_inner: int):
        self.fusion = fusion
        self.graph = fusion.graph
        self.shape = shape
        self.n_inner = n_inner
        self.rank = len(shape)
        self.reductions: list[kir.Reduction] = []
        self.stores: list[kir.Store] = []
        self.roots: set[str] = set()
        self.nodes: dict[str, None] = {}
        self.inlined: set[str] = set()   # non-materialized values this kernel recomputes
        self.loads: set[str] = set()     # materialized values it loads
        self.memo: dict[tuple, kir.Expr] = {}
        # (loop dim, lo, hi) clamps for loads built now: set while lowering a Concat piece
        self.clamps: tuple[tuple[int, int, int], ...] = ()

    def clone(self) -> KernelBuilder:
        c = KernelBuilder(self.fusion, self.shape, self.n_inner)
        c.reductions = list(self.reductions)
        c.stores = list(self.stores)
        c.roots = set(self.roots)
        c.nodes = dict(self.nodes)
        c.inlined = set(self.inlined)
        c.loads = set(self.loads)
        c.memo = dict(self.memo)
        c.clamps = self.clamps
        return c

    # ---- expressions ---------------------------------------------------------------------
    def expr(self, v: Value, idx: tuple[Affine, ...]) -> kir.Expr:
        """The scalar expression of value `v` at logical index `idx`."""
        key = (v.name, idx, self.clamps)  # a clamped load differs outside its piece
        e = self.memo.get(key)
        if e is None:
            e = self._expr(v, idx)
            self.memo[key] = e
        return e

    def _expr(self, v: Value, idx: tuple[Affine, ...]) -> kir.Expr:
        f = self.fusion
        const = self.graph.constant_value(v)
        if const is not None and const.size == 1:
            return kir.Const(const.reshape(()).item(), v.dtype.name)
        if v.name in f.materialized and v.name not in self.roots:
            self.loads.add(v.name)
            buf = f.buffer_of(v)
            return kir.Load(buf, flat_index(idx, v.shape, self.rank), v.dtype.name,
                            self.clamps)
        node = v.producer
        if v.name not in self.roots:
            self.inlined.add(v.name)
        self.nodes[node.name] = None
        lower = LOWERINGS[node.op]
        return inject.apply(node, lower(self, node, node.outputs.index(v), idx), self.graph)

    def operand(self, node: Node, i: int, idx: tuple[Affine, ...],
                out_shape: tuple[int, ...]) -> kir.Expr:
        """Input i of `node` at the output index `idx`, with numpy broadcasting."""
        v = node.inputs[i]
        return self.expr(v, broadcast_index(idx, out_shape, v.shape))

    def operand_to(self, v: Value, idx: tuple[Affine, ...],
                   out_shape: tuple[int, ...]) -> kir.Expr:
        """Value `v` broadcast (numpy rules) to `out_shape`, at `idx`."""
        return self.expr(v, broadcast_index(idx, out_shape, v.shape))

    def inner_unit(self, k: int) -> Affine:
        """The affine form of inner loop index k."""
        return kir.unit(self.rank - self.n_inner + k, self.rank)

    def moves_with_inner(self, a: Affine) -> bool:
        return any(a.coeffs[self.rank - self.n_inner:])

    # ---- reductions ----------------------------------------------------------------------
    def reduce(self, out: Value, kind: str, x: Value, axes: list[int],
               kept: dict[int, Affine], element, dtype: str) -> kir.Reduced:
        """A reduction phase over `axes` of `x` for the row at `kept` (dim -> index).

        `element(builder, idx_x)` builds the expression reduced at each point of the row.
        """
        sizes = tuple(x.shape[a] for a in axes)
        if self.n_inner == 0:
            raise NeedRowDomain(out, x, axes)
        inner = self.shape[self.rank - self.n_inner:]
        red_idx = tuple(self.inner_unit(k) for k in range(len(sizes)))
        if sizes != inner:  # a refined row nest ([8, 32, 32] for 8192) reads x's dims merged
            red_idx = reduced_index(inner, sizes, self.rank)
            if red_idx is None:
                raise Refuse(out, f"reduces dims {list(sizes)} but the kernel's rows are "
                                   f"{list(inner)}")
        if any(self.moves_with_inner(a) for a in kept.values()):
            raise Refuse(out, "its row index moves along the consumer's reduced dims")
        idx_x, k = [], 0
        for d in range(len(x.shape)):
            if d in kept:
                idx_x.append(kept[d])
            else:
                idx_x.append(red_idx[k])
                k += 1
        e = element(self, tuple(idx_x))
        red = kir.Reduction(kind, e, dtype)
        if red in self.reductions:
            return kir.Reduced(self.reductions.index(red), dtype)
        self.reductions.append(red)
        return kir.Reduced(len(self.reductions) - 1, dtype)

    # ---- roots ---------------------------------------------------------------------------
    def add_root(self, v: Value, idx: tuple[Affine, ...]) -> None:
        """Store root `v` (its expression at `idx`) into its buffer."""
        self.roots.add(v.name)
        self.memo = {k: e for k, e in self.memo.items() if k[0] != v.name}
        e = self.expr(v, idx)
        per_row = self.n_inner > 0 and not any(self.moves_with_inner(a) for a in idx)
        store = kir.Store(self.fusion.buffer_of(v), flat_index(idx, v.shape, self.rank), e,
                          per_row)
        self.stores.append(store)


def identity_index(shape: tuple[int, ...]) -> tuple[Affine, ...]:
    return tuple(kir.unit(k, len(shape)) for k in range(len(shape)))


def row_domain(v: Value, need: NeedRowDomain) -> tuple[tuple[int, ...], tuple[Affine, ...]]:
    """Loop shape (kept dims, then reduced dims) and root index for the reduction in `need`.

    The root must have the reduced input's shape (stored per element, like Softmax) or
    the reduction's output shape (stored per row, like ReduceMean).
    """
    x, axes = need.x, need.axes
    kept = [d for d in range(len(x.shape)) if d not in axes]
    order = kept + list(axes)
    shape = tuple(x.shape[d] for d in order)
    rank = len(shape)
    pos = {d: order.index(d) for d in order}
    if tuple(v.shape) == tuple(x.shape):
        return shape, tuple(kir.unit(pos[d], rank) for d in range(len(x.shape)))
    keep_shape = tuple(1 if d in axes else x.shape[d] for d in range(len(x.shape)))
    drop_shape = tuple(x.shape[d] for d in kept)
    if tuple(v.shape) == keep_shape:
        return shape, tuple(kir.constant(0, rank) if d in axes else kir.unit(pos[d], rank)
                            for d in range(len(x.shape)))
    if tuple(v.shape) == drop_shape:
        return shape, tuple(kir.unit(pos[d], rank) for d in kept)
    raise Refuse(need.value, f"consumer {v.name} of shape {list(v.shape)} is neither the "
                            "reduced input's nor the reduction's shape")


class Group:
    """A kernel being formed, or a library/reference thunk (builder None)."""

    def __init__(self, index: int, builder: KernelBuilder | None, thunk: kir.Thunk | None):
        self.index = index
        self.builder = builder
        self.thunk = thunk


class Fusion:
    """One fusion attempt over a graph with a given set of materialized values."""

    def __init__(self, graph: Graph, materialized: set[str], thunk_nodes: set[str],
                 folds: dict[str, Node] | None = None):
        self.graph = graph
        self.materialized = materialized
        self.thunk_nodes = thunk_nodes
        self.folds = folds or {}  # MatMul name -> the bias Add folded into its Gemm call
        self.folded = {a.name for a in self.folds.values()}
        self.buffers: dict[str, int] = {}
        self.groups: list[Group] = []
        self.group_of: dict[str, int] = {}  # materialized value -> group index
        self.aliases: dict[str, str] = {}  # reshaped value -> the value whose buffer it shares
        self.live = {v.name for v in graph.outputs}
        for v in graph.values.values():
            if v.uses:
                self.live.add(v.name)
        for v in list(graph.inputs) + [graph.values[n] for n in graph.initializers
                                       if n in graph.values]:
            self.group_of[v.name] = -1

    def buffer_of(self, v: Value) -> int:
        if v.name not in self.buffers:
            self.buffers[v.name] = len(self.buffers)
        return self.buffers[v.name]

    def run(self) -> None:
        for node in self.graph.nodes:
            if node.name in self.folded:
                continue  # computed by its MatMul's Gemm call
            if node.name in self.thunk_nodes:
                self._add_thunk(node)
                continue
            for v in node.outputs:
                if (v.name in self.materialized and v.name in self.live
                        and not self._alias(v)):
                    self._add_root(v)

    def _alias(self, v: Value) -> bool:
        """Whether `v`, a Reshape of a temp buffer, shares that buffer instead of a copy."""
        node = v.producer
        if node is None or node.op not in ALIAS_OPS or node.domain not in ("", "ai.onnx"):
            return False
        x = node.inputs[0]
        root = self.aliases.get(x.name, x.name)
        g = self.graph
        outputs = {w.name for w in g.outputs} | {w.name for w in g.inputs}
        if (x.name not in self.materialized or root in outputs or v.name in outputs
                or g.is_constant(g.values[root]) or x.name not in self.group_of
                or x.dtype != v.dtype):
            return False
        self.aliases[v.name] = root
        self.group_of[v.name] = self.group_of[x.name]
        return True

    def _add_thunk(self, node: Node) -> None:
        add = self.folds.get(node.name)
        if add is not None:
            bias = next(v for v in add.inputs if v is not node.outputs[0])
            ins = (self.buffer_of(node.inputs[0]), self.buffer_of(node.inputs[1]),
                   self.buffer_of(bias))
            out = add.outputs[0]
            thunk = kir.LibraryCall("Gemm", ins, (self.buffer_of(out),), (),
                                    (node.name, add.name))
            self.groups.append(Group(len(self.groups), None, thunk))
            self.group_of[out.name] = len(self.groups) - 1
            return
        ins = tuple(None if v is None else self.buffer_of(v) for v in node.inputs)
        outs = tuple(self.buffer_of(v) for v in node.outputs)
        attrs = tuple(sorted(node.attrs.items()))
        cls = kir.LibraryCall if ops.get(node.op, node.domain).kind == ops.LIBRARY \
            else kir.RefCall
        if cls is kir.LibraryCall:
            thunk = kir.LibraryCall(node.op, ins, outs, attrs, (node.name,))
        else:
            thunk = kir.RefCall(node.op, node.domain, ins, outs, attrs, (node.name,))
        g = Group(len(self.groups), None, thunk)
        self.groups.append(g)
        for v in node.outputs:
            self.group_of[v.name] = g.index

    def _add_root(self, v: Value) -> None:
        for g in reversed(self.groups):
            if g.builder is None or g.builder.shape != self._loop_shape_hint(v, g):
                continue
            trial = g.builder.clone()
            try:
                trial.add_root(v, self._root_index(v, trial))
            except (NeedRowDomain, Refuse):
                continue
            if all(self.group_of[m] < g.index for m in trial.loads - trial.roots):
                g.builder = trial
                self.group_of[v.name] = g.index
                return
        builder = KernelBuilder(self, tuple(v.shape), 0)
        trial = builder.clone()
        try:
            trial.add_root(v, identity_index(v.shape))
        except NeedRowDomain as need:
            try:
                shape, idx = row_domain(v, need)
                n_inner = len(need.axes)
            except Refuse as refuse:
                refined = refined_row_domain(tuple(v.shape), tuple(need.x.shape), need.axes)
                if refined is None:
                    raise Materialize(need.value, str(refuse)) from None
                shape, n_inner, idx = refined
            trial = KernelBuilder(self, shape, n_inner)
            try:
                trial.add_root(v, idx)
            except (NeedRowDomain, Refuse) as exc:
                raise Materialize(exc.value, str(exc)) from None
        except Refuse as exc:
            raise Materialize(exc.value, str(exc)) from None
        g = Group(len(self.groups), trial, None)
        self.groups.append(g)
        self.group_of[v.name] = g.index

    def _loop_shape_hint(self, v: Value, g: Group) -> tuple[int, ...] | None:
        # A root joins a kernel whose loop nest is its own shape (or, for a row kernel,
        # whose outer dims are its shape: a per-row store).
        b = g.builder
        if tuple(v.shape) == b.shape:
            return b.shape
        if b.n_inner and tuple(v.shape) in (b.shape[:b.rank - b.n_inner],
                                            b.shape[:b.rank - b.n_inner] + (1,) * b.n_inner):
            return b.shape
        return None

    def _root_index(self, v: Value, b: KernelBuilder) -> tuple[Affine, ...]:
        if tuple(v.shape) == b.shape:
            return identity_index(b.shape)
        n_outer = b.rank - b.n_inner
        idx = [kir.unit(k, b.rank) for k in range(n_outer)]
        if len(v.shape) == b.rank:
            idx += [kir.constant(0, b.rank)] * b.n_inner
        return tuple(idx)


ALIAS_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


class Materialize(Exception):
    """Fusion must keep `value` in a buffer and start again."""

    def __init__(self, value: Value, reason: str):
        super().__init__(reason)
        self.value = value
        self.reason = reason




def bias_folds(graph: Graph, thunk_nodes: set[str]) -> dict[str, Node]:
    """MatMul name -> its only consumer, an Add of a constant bias [N], to run as one Gemm.

    A is [..., K] (batch dims flattened into Gemm's M), B a constant [K, N]; onnxruntime
    fuses the same pattern. The Add's output stands in for the MatMul's. See FOLD_BIAS.
    """
    outputs = {v.name for v in graph.outputs}
    folds: dict[str, Node] = {}
    if not FOLD_BIAS:
        return folds
    for node in graph.nodes:
        if node.name not in thunk_nodes or node.op != "MatMul" or node.domain not in ("",
                                                                                   "ai.onnx"):
            continue
        a, b = node.inputs[0], node.inputs[1]
        y = node.outputs[0]
        if (a is None or b is None or len(a.shape) < 2 or len(b.shape) != 2
                or not graph.is_constant(b) or y.name in outputs
                or y.dtype.name not in ("float32", "float64")):
            continue
        users = graph.consumers(y)
        if len(users) != 1 or len(y.uses) != 1:
            continue
        add = users[0]
        if add.op != "Add" or add.domain not in ("", "ai.onnx") or add.name in thunk_nodes:
            continue
        bias = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
        if (bias is y or not graph.is_constant(bias) or tuple(bias.shape) != (b.shape[1],)
                or bias.dtype != y.dtype or tuple(add.outputs[0].shape) != tuple(y.shape)):
            continue
        out = add.outputs[0]
        if FOLD_BIAS == "alone" and out.name not in outputs and not all(
                c.name in thunk_nodes for c in graph.consumers(out)):
            continue
        folds[node.name] = add
    return folds


def _initial_materialized(graph: Graph, thunk_nodes: set[str],
                          notes: list[str], folds: dict[str, Node] | None = None) -> set[str]:
    keep = {v.name for v in graph.inputs} | set(graph.initializers)
    for add in (folds or {}).values():
        keep.add(add.outputs[0].name)
        notes.append(f"{add.outputs[0].name}: bias Add ({add.name}) folded into a Gemm call")
    for v in graph.outputs:
        if v.name not in keep:
            keep.add(v.name)
            notes.append(f"{v.name} materialized: graph output")
    for node in graph.nodes:
        if node.name not in thunk_nodes:
            continue
        for v in node.all_inputs():
            if v.name not in keep:
                keep.add(v.name)
                notes.append(f"{v.name} materialized: feeds {node.op} ({node.name})")
        if node.name not in (folds or {}):  # a folded MatMul's result is never stored
            keep.update(v.name for v in node.outputs)
    return keep


def _cost(v: Value, materialized: set[str]) -> int:
    """Ops recomputed when `v` is inlined (a reduction counts as unbounded)."""
    total, stack, seen = 0, [v], set()
    while stack:
        w = stack.pop()
        if w.name in seen or w.name in materialized or w.producer is None:
            continue
        seen.add(w.name)
        node = w.producer
        if ops.get(node.op, node.domain).kind in (ops.REDUCTION, ops.NORMALIZATION):
            return RECOMPUTE_LIMIT + 1
        total += 4 if node.op.lower() in EXPENSIVE_OPS or node.op in ("Gelu", "Softplus",
                                                                       "Mish", "Pow") else 1
        stack += node.all_inputs()
    return total


def _shared_expensive(f: Fusion) -> Value | None:
    """The latest inlined value that several kernels recompute at a high cost."""
    readers: dict[str, int] = {}
    for g in f.groups:
        if g.builder is not None:
            for name in g.builder.inlined:
                readers[name] = readers.get(name, 0) + 1
    order = {v.name: i for i, n in enumerate(f.graph.nodes) for v in n.outputs}
    shared = sorted((n for n, c in readers.items() if c > 1), key=lambda n: -order[n])
    for name in shared:
        v = f.graph.values[name]
        if _cost(v, f.materialized) > RECOMPUTE_LIMIT:
            return v
    return None


def fuse(graph: Graph) -> kir.Program:
    """Group `graph` (concrete shapes) into kernels and calls; see the module docstring."""
    notes: list[str] = []
    thunk_nodes = {n.name for n in graph.nodes if why_not_lower(n, graph) is not None}
    folds = bias_folds(graph, thunk_nodes)
    materialized = _initial_materialized(graph, thunk_nodes, notes, folds)
    for _ in range(MAX_RESTARTS):
        f = Fusion(graph, materialized, thunk_nodes, folds)
        try:
            f.run()
        except Materialize as m:
            if m.value.name in materialized:
                raise CompileError(f"fusion of {graph.name}: cannot place {m.value.name}: "
                                   f"{m.reason}") from None
            materialized.add(m.value.name)
            notes.append(f"{m.value.name} materialized: {m.reason}")
            continue
        v = _shared_expensive(f)
        if v is None:
            return _program(f, notes)
        materialized.add(v.name)
        notes.append(f"{v.name} materialized: read by several kernels and too costly to "
                     "recompute")
    raise CompileError(f"fusion of {graph.name} did not settle after {MAX_RESTARTS} rounds")


def _program(f: Fusion, notes: list[str]) -> kir.Program:
    graph = f.graph
    for v in graph.inputs + graph.outputs:
        f.buffer_of(v)
    thunks: list[kir.Thunk] = []
    for g in f.groups:
        if g.builder is None:
            thunks.append(g.thunk)
            continue
        b = g.builder
        thunks.append(kir.Kernel(f"k{len(thunks)}", b.shape, b.n_inner, tuple(b.reductions),
                                 tuple(b.stores), tuple(b.nodes)))
    inputs = {v.name for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    buffers = []
    for name, bid in sorted(f.buffers.items(), key=lambda kv: kv[1]):
        v = graph.values[name]
        role = ("input" if name in inputs else "const" if graph.is_constant(v)
                else "output" if name in outputs else "temp")
        buffers.append(kir.Buffer(bid, name, v.dtype.name, tuple(v.shape), role))
    aliases = {f.buffers[v]: f.buffers[x] for v, x in f.aliases.items() if v in f.buffers}
    notes = notes + [f"{v} shares {x}'s buffer: a reshape, no copy" for v, x in f.aliases.items()]
    buffers = plan_memory(buffers, thunks, aliases)
    return kir.Program(buffers, thunks, [f.buffers[v.name] for v in graph.inputs],
                       [f.buffers[v.name] for v in graph.outputs], notes)


def _thunk_buffers(t: kir.Thunk) -> tuple[set[int], set[int]]:
    """(buffers read, buffers written) by a thunk."""
    if isinstance(t, kir.Kernel):
        reads: set[int] = set()
        stack: list = [r.expr for r in t.reductions] + [s.expr for s in t.stores]
        while stack:
            e = stack.pop()
            if isinstance(e, kir.Load):
                reads.add(e.buf)
            elif isinstance(e, kir.Op):
                stack += e.args
        return reads, {s.buf for s in t.stores}
    return {b for b in t.inputs if b is not None}, set(t.outputs)


def plan_memory(buffers: list[kir.Buffer], thunks: list[kir.Thunk],
                aliases: dict[int, int] | None = None) -> list[kir.Buffer]:
    """Give temps slots; two temps share a slot when their lifetimes do not overlap.

    `aliases` maps a buffer to the temp whose memory it views (a Reshape needing no copy):
    it gets that temp's slot, and its reads keep the temp alive.
    """
    aliases = aliases or {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, t in enumerate(thunks):
        reads, writes = _thunk_buffers(t)
        reads = {aliases.get(b, b) for b in reads}
        for b in writes:
            first.setdefault(b, i)
            last[b] = max(last.get(b, i), i)
        for b in reads:
            last[b] = i
    slot_free_after: list[int] = []  # per slot: the last thunk reading its current tenant
    out = []
    temps = sorted((b for b in buffers if b.role == "temp" and b.id not in aliases),
                   key=lambda b: first.get(b.id, 0))
    slots: dict[int, int] = {}
    for b in temps:
        start = first.get(b.id, 0)
        for s, free_after in enumerate(slot_free_after):
            if free_after < start:
                slot_free_after[s] = last.get(b.id, start)
                slots[b.id] = s
                break
        else:
            slots[b.id] = len(slot_free_after)
            slot_free_after.append(last.get(b.id, start))
    for b in buffers:
        out.append(dataclasses.replace(b, slot=slots.get(aliases.get(b.id, b.id), -1)))
    return out


def scalar_value(x: np.ndarray):
    """A size-1 array as a Python scalar."""
    return x.reshape(()).item()
