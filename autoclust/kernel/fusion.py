"""Fusion: a concrete-shape cluster Graph -> kernel IR Program (a list of thunks).

Every value is either *materialized* (a buffer: graph inputs, constants, graph outputs,
operands of library calls, and values fusion decides to keep) or *inlined*: its
expression is rebuilt, at the right index, inside each kernel that reads it. Each op's
expression comes from its own `lower` in the op table, written against
autoclust.kernel.lowering.LowerCtx; `NodeLowering` below is that context. Kernels are grown from
the materialized values ("roots") in topological order:

1. A root's expression is built over its own shape (an elementwise loop nest). When it
   reaches a reduction (ReduceX, Softmax, LayerNorm, ...) or a scan (CumSum) the kernel
   becomes a row kernel over the reduced tensor's dims (kept dims outer, reduced dims
   inner) and is rebuilt.
2. A reduction can be inlined only when its reduced dims are the kernel's inner dims and
   its row does not move with the inner indices; otherwise its output is materialized
   (a note says why) and fusion restarts. Each restart materializes one more value.
3. A root joins an existing kernel with the same loop shape when everything it loads was
   computed before that kernel (multi-output fusion: LayerNorm's Y and Mean, a chain with
   an intermediate graph output).
4. An inlined value read by several kernels is materialized when recomputing it would
   repeat a reduction or more than RECOMPUTE_LIMIT cost units (its ops, plus LOAD_COST
   per tensor it reads); so is a value one kernel recomputes BROADCAST_RECOMPUTE or more
   times per element when it holds a transcendental op (rotary cos/sin tables). The
   rules and constants live in recompute.py.
A root with no elements needs no kernel. Library ops (MatMul, Conv, ...) become
LibraryCalls; with the backend's `fold_bias` policy a MatMul and its constant bias Add
become one Gemm call.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np

from autoclust import ops, symbolic
from autoclust.errors import CompileError, InvalidInputError
from autoclust.ir import Graph, Node, Value
from autoclust.kernel import inject, recompute, views
from autoclust.kernel import ir as kir
from autoclust.kernel.calls import bias_folds, deferred_operands
from autoclust.kernel.indexing import (
    contiguous_strides,
    flat_index,
    identity_index,
    reduced_index,
    refined_row_domain,
    reshape_index,
    row_domain,
)
from autoclust.kernel.ir import Affine
from autoclust.kernel.lowering import (
    NARROW_FLOATS,
    NARROW_INTS,
    Element,
    Idx,
    LowerCtx,
    NeedRowDomain,
    Refuse,
    cast,
    const,
    elements_of_constant,
    op,
)

MAX_RESTARTS = 200


class KernelBuilder:
    """Builds the expressions of one kernel (a group of roots sharing a loop nest)."""

    def __init__(self, fusion: Fusion, shape: tuple[int, ...], n_inner: int):
        self.fusion = fusion
        self.graph = fusion.graph
        self.shape = shape
        self.n_inner = n_inner
        self.rank = len(shape)
        self.reductions: list[kir.Reduction] = []
        # each phase's position, looked up by hash: `red in self.reductions` compared deep
        # element trees structurally against every phase (0.4 s of BERT-base's lowering)
        self.phases: dict[kir.Reduction, int] = {}
        self.stores: list[kir.Store] = []
        self.checks: list[kir.Check] = []
        self.roots: set[str] = set()
        self.nodes: dict[str, None] = {}
        self.inlined: set[str] = set()   # non-materialized values this kernel recomputes
        self.loads: set[str] = set()     # materialized values it loads
        self.memo: dict[tuple, kir.Expr] = {}
        # (loop dim, lo, hi) clamps for loads built now: set while lowering a Concat piece
        self.clamps: tuple[tuple[int, int, int], ...] = ()
        self.first_row_value: Value | None = None  # whose reduction or scan came first
        # set on a trial joining group `before`: loading a buffer of that group or a later
        # one refuses at once. Fusion made the same decision after lowering the whole root
        # (864 of BERT-base's 866 trials, a third of its lowering time, lowered a
        # LayerNorm into an earlier layer's kernel to refuse it afterwards)
        self.before: int | None = None

    def clone(self) -> KernelBuilder:
        c = KernelBuilder(self.fusion, self.shape, self.n_inner)
        c.reductions = list(self.reductions)
        c.phases = dict(self.phases)
        c.stores = list(self.stores)
        c.checks = list(self.checks)
        c.roots = set(self.roots)
        c.nodes = dict(self.nodes)
        c.inlined = set(self.inlined)
        c.loads = set(self.loads)
        c.memo = dict(self.memo)
        c.clamps = self.clamps
        c.first_row_value = self.first_row_value
        return c

    def scan_conflict(self, out: Value, reason: str) -> Refuse:
        """A Refuse for `out` when a scan and another reduction or scan meet in this kernel:
        the value whose row work came first is materialized (its own kernel) when it is
        inlined here, else `out` is. CumSum -> ReduceSum, ReduceSum -> Add -> CumSum,
        CumSum -> CumSum then each get a kernel instead of failing to compile."""
        occupant = self.first_row_value
        if occupant is not None and occupant.name not in self.roots:
            return Refuse(occupant, reason)
        return Refuse(out, reason)

    @property
    def is_scan(self) -> bool:
        return bool(self.reductions) and bool(self.reductions[0].scan)

    def moves_with_inner(self, a: Affine) -> bool:
        return any(a.coeffs[self.rank - self.n_inner:])

    # ---- expressions ---------------------------------------------------------------------
    def expr(self, v: Value, idx: Idx) -> kir.Expr:
        """The scalar expression of value `v` at logical index `idx`."""
        key = (v.name, idx, self.clamps)  # a clamped load differs outside its piece
        e = self.memo.get(key)
        if e is None:
            e = self._expr(v, idx)
            self.memo[key] = e
        return e

    def _expr(self, v: Value, idx: Idx) -> kir.Expr:
        const = self.graph.constant_value(v)
        if const is not None and const.size == 1:
            return kir.Const(const.reshape(()).item(), v.dtype.name)
        if self.is_buffer(v):
            if self.before is not None and \
                    self.fusion.group_of.get(v.name, self.before) >= self.before:
                raise Refuse(v, "computed after the kernel that would read it")
            self.loads.add(v.name)
            return kir.Load(self.fusion.buffer_of(v), flat_index(idx, v.shape, self.rank),
                            v.dtype.name, self.clamps)
        node = v.producer
        if v.name not in self.roots:
            self.inlined.add(v.name)
        self.nodes[node.name] = None
        return lower_node(self, node, node.outputs.index(v), idx)

    def is_buffer(self, v: Value) -> bool:
        """Whether this kernel reads v from its buffer (not recomputing it)."""
        return v.name in self.fusion.materialized and v.name not in self.roots

    # ---- rows ----------------------------------------------------------------------------
    def inner_index(self, out: Value, sizes: tuple[int, ...]) -> Idx:
        """Indices of reduced dims `sizes` over this kernel's inner loops."""
        inner = self.shape[self.rank - self.n_inner:]
        if sizes == inner:
            return tuple(kir.unit(self.rank - self.n_inner + k, self.rank)
                         for k in range(len(sizes)))
        red_idx = reduced_index(inner, sizes, self.rank)  # a refined nest: merged dims
        if red_idx is None:
            raise Refuse(out, f"reduces dims {list(sizes)} but the kernel's rows are "
                              f"{list(inner)}")
        return red_idx

    def reduce(self, out: Value, kind: str, shape: tuple[int, ...], axes: list[int],
               kept: dict[int, Affine], element: Element, dtype: str,
               from_negative_zero: bool = False) -> kir.Reduced:
        """A reduction phase over `axes` of a tensor of `shape` for the row at `kept`."""
        if self.n_inner == 0:
            raise NeedRowDomain(out, shape, axes)
        if self.is_scan:
            raise self.scan_conflict(out, "a reduction cannot share a scan kernel")
        if any(dim >= self.rank - self.n_inner for dim, _, _ in self.clamps):
            # inside a Concat piece along the reduced loops: the piece's clamp would cut
            # the reduction's own loads (ReduceLogSum -> Concat summed one row of three)
            raise Refuse(out, "a reduction inside a Concat piece along its reduced loops")
        red_idx = self.inner_index(out, tuple(shape[a] for a in axes))
        if any(self.moves_with_inner(a) for a in kept.values()):
            raise Refuse(out, "its row index moves along the consumer's reduced dims")
        it = iter(red_idx)
        idx_x = tuple(kept[d] if d in kept else next(it) for d in range(len(shape)))
        red = kir.Reduction(kind, element(idx_x), dtype, from_negative_zero=from_negative_zero)
        if self.is_scan:  # the element itself made this a scan kernel (CumSum -> ReduceMax)
            raise self.scan_conflict(out, "a reduction cannot share a scan kernel")
        if not self.reductions:
            self.first_row_value = out
        phase = self.phases.setdefault(red, len(self.reductions))
        if phase == len(self.reductions):
            self.reductions.append(red)
        return kir.Reduced(phase, dtype)

    def scan(self, out: Value, idx: Idx, kind: str, shape: tuple[int, ...], axis: int,
             element: Element, dtype: str, exclusive: bool, reverse: bool) -> kir.Reduced:
        """The running `kind` along `axis` at the output's own index (one scan per kernel)."""
        if self.n_inner == 0:
            raise NeedRowDomain(out, shape, [axis], scan=True)
        running = kir.unit(self.rank - 1, self.rank)
        if self.n_inner != 1 or idx[axis] != running or \
                any(self.moves_with_inner(a) for d, a in enumerate(idx) if d != axis):
            raise Refuse(out, "its scan position is not the kernel's running index")
        red = kir.Reduction(kind, element(idx), dtype,
                            "exclusive" if exclusive else "inclusive", reverse)
        if self.reductions and self.reductions != [red]:
            raise self.scan_conflict(out, "a scan needs a kernel of its own")
        self.reductions = [red]
        self.phases = {red: 0}
        self.first_row_value = out
        return kir.Reduced(0, dtype)

    # ---- roots ---------------------------------------------------------------------------
    def add_root(self, v: Value, idx: Idx) -> None:
        """Store root `v` (its expression at `idx`) into its buffer."""
        self.roots.add(v.name)
        self.memo = {k: e for k, e in self.memo.items() if k[0] != v.name}
        e = self.expr(v, idx)
        per_row = self.n_inner > 0 and not any(self.moves_with_inner(a) for a in idx)
        if per_row and self.is_scan:
            raise self.scan_conflict(v, "a per-row result cannot share a scan kernel")
        store = kir.Store(self.fusion.buffer_of(v), flat_index(idx, v.shape, self.rank), e,
                          per_row)
        self.stores.append(store)


class NodeLowering(LowerCtx):
    """The LowerCtx of one node output at one index inside a KernelBuilder."""

    def __init__(self, builder: KernelBuilder, node: Node, out: int, idx: Idx):
        self.b = builder
        self.node = node
        self.out = out
        self.idx = idx
        self.rank = builder.rank

    @property
    def extents(self) -> tuple[int, ...]:
        return self.b.shape

    @property
    def graph(self) -> Graph:
        return self.b.graph

    def constant(self, i: int) -> np.ndarray | None:
        return self.b.graph.constant_value(self.node.inputs[i]) if self.has(i) else None

    def index(self, a: Affine) -> kir.Expr:
        """The index's value where loads are clamped too: inside a Concat piece or an
        edge/reflect Pad, a loop index clamped for loads is clamped here (Trilu's mask
        under an edge Pad reads the row and column of the element it copies)."""
        clamps = [(d, lo, hi) for d, lo, hi in self.b.clamps if a.coeffs[d]]
        if not clamps:
            return kir.Index(a)
        coeffs = list(a.coeffs)
        dims = {d: coeffs[d] for d, _, _ in clamps}
        for d in dims:
            coeffs[d] = 0
        e: kir.Expr = kir.Index(Affine(a.const, tuple(coeffs)))
        for d, c in dims.items():
            iv: kir.Expr = kir.Index(kir.unit(d, len(coeffs)))
            for dd, lo, hi in clamps:  # nested pieces: outer clamp first
                if dd == d:
                    iv = op("min", op("max", iv, const(lo, "int64")), const(hi, "int64"))
            e = op("add", e, iv if c == 1 else op("mul", iv, const(c, "int64")))
        return e

    def value(self, i: int, idx: Idx) -> kir.Expr:
        return self.b.expr(self.node.inputs[i], idx)

    def view(self, i: int, shape: tuple[int, ...], idx: Idx) -> kir.Expr:
        x, b = self.node.inputs[i], self.b
        if b.is_buffer(x):  # the flat offset is the same in x and in the view
            b.loads.add(x.name)
            return kir.Load(b.fusion.buffer_of(x), flat_index(idx, shape, b.rank),
                            x.dtype.name, b.clamps)
        idx_in = reshape_index(idx, shape, tuple(x.shape), b.shape)
        if idx_in is None and b.n_inner == 0:
            _probe_rows(b, x)
        if idx_in is None:
            raise Refuse(x, f"read as {list(shape)}, {list(x.shape)} regroups dims of a "
                            "computed value")
        return b.expr(x, idx_in)

    def gather(self, i: int, idx: Idx, dyn: dict[int, kir.Expr]) -> kir.Expr:
        x, b = self.node.inputs[i], self.b
        const = b.graph.constant_value(x)
        if const is not None and const.size == 1:
            return kir.Const(const.reshape(()).item(), x.dtype.name)
        if not b.is_buffer(x):
            raise Refuse(x, f"{self.node.op} reads it at data-dependent positions")
        b.loads.add(x.name)
        strides = contiguous_strides(tuple(x.shape))
        terms = tuple((e, strides[d]) for d, e in sorted(dyn.items()))
        return kir.Load(b.fusion.buffer_of(x), flat_index(idx, tuple(x.shape), b.rank),
                        x.dtype.name, b.clamps, terms)

    @contextlib.contextmanager
    def clamped(self, dim: int, lo: int, hi: int) -> Iterator[None]:
        saved = self.b.clamps
        self.b.clamps = saved + ((dim, lo, hi),)
        try:
            yield
        finally:
            self.b.clamps = saved

    def check(self, i: int, kind: str, lo: int = 0, hi: int = 0, message: str = "",
              column: tuple[int, int] | None = None) -> None:
        x, b = self.node.inputs[i], self.b
        const = b.graph.constant_value(x)
        # index ops over a constant sliced to a symbolic length: checked once, here
        source = const if const is not None or b.is_buffer(x) or column is not None \
            else elements_of_constant(b.graph, x)
        if source is not None:
            values = source.reshape(-1)
            if column is not None:
                values = values[column[0]::column[1]]
            bad = (values == 0) if kind == "nonzero" else (values < lo) | (values > hi)
            if np.any(bad) and const is not None:  # every run fails, even an empty one
                raise InvalidInputError(f"{message} (constant, holds {values[bad][0]})")
            if not np.any(bad):
                return
        if not b.is_buffer(x):
            raise Refuse(x, f"{self.node.op} checks it before the kernel runs")
        check = kir.Check(b.fusion.buffer_of(x), kind, lo, hi, message, (self.node.name,),
                          column)
        if check not in b.checks:
            b.checks.append(check)

    def rows(self, shape: tuple[int, ...], axes: list[int]) -> None:
        if self.b.n_inner == 0:
            raise NeedRowDomain(self.output, shape, axes)

    def reindex(self, idx: Idx, shape: tuple[int, ...], to_shape: tuple[int, ...]) -> Idx:
        got = reshape_index(idx, shape, to_shape, self.b.shape)
        if got is None:
            self.refuse(f"{list(shape)} -> {list(to_shape)} is not affine in this kernel")
        return got

    def reduce(self, kind: str, shape: tuple[int, ...], axes: list[int],
               kept: dict[int, Affine], element: Element, dtype: str,
               from_negative_zero: bool = False) -> kir.Expr:
        return self.b.reduce(self.output, kind, shape, axes, kept, element, dtype, from_negative_zero)

    def scan(self, kind: str, shape: tuple[int, ...], axis: int, element: Element,
             dtype: str, exclusive: bool = False, reverse: bool = False) -> kir.Expr:
        return self.b.scan(self.output, self.idx, kind, shape, axis, element, dtype,
                           exclusive, reverse)


def lower_node(b: KernelBuilder, node: Node, k: int, idx: Idx) -> kir.Expr:
    """Output k of `node` at idx, from the op's own lowering; float16 results are rounded
    to float16 here, after every op, where onnxruntime rounds them."""
    opdef = ops.get(node.op, node.domain)
    if opdef is None or opdef.lower is None:
        raise CompileError(f"node {node.name!r}: {node.qualified_op} has no lowering")
    e = inject.apply(node, opdef.lower(NodeLowering(b, node, k, idx)), b.graph)
    want = node.outputs[k].dtype.name
    if e.dtype != want:
        if (want in NARROW_FLOATS and e.dtype == "float32") or \
                (want in NARROW_INTS and e.dtype == "int32"):
            e = cast(e, want)  # rounded (floats) or wrapped (ints) after every op
        else:
            raise CompileError(f"node {node.name!r} ({node.op}): lowering gave {e.dtype} for "
                               f"output {k} of dtype {want}")
    return e


def _probe_rows(b: KernelBuilder, x: Value) -> None:
    """Re-raise NeedRowDomain if x (in its own loop nest) needs a row kernel: a refined
    row nest may then make a merging Reshape affine (GroupNorm: see refined_row_domain)."""
    probe = KernelBuilder(b.fusion, tuple(x.shape), 0)
    try:
        probe.expr(x, identity_index(tuple(x.shape)))
    except NeedRowDomain:
        raise
    except (Refuse, CompileError):
        pass


class Group:
    """A kernel being formed, or a library thunk (builder None)."""

    def __init__(self, index: int, builder: KernelBuilder | None, thunk: kir.Thunk | None):
        self.index = index
        self.builder = builder
        self.thunk = thunk


class Materialize(Exception):
    """Fusion must keep `value` in a buffer and start again."""

    def __init__(self, value: Value, reason: str):
        super().__init__(reason)
        self.value = value
        self.reason = reason


class Fusion:
    """One fusion attempt over a graph with a given set of materialized values."""

    def __init__(self, graph: Graph, materialized: set[str], library: set[str],
                 folds: dict[str, Node], notes: list[str],
                 deferred: set[tuple[str, str]] | None = None):
        self.graph = graph
        self.deferred = deferred or set()  # (library node, value): decided at the call
        self.written: set[str] = set()  # values a library call writes through a view
        self.materialized = materialized
        self.notes = notes
        self.library = library
        self.folds = folds  # MatMul name -> the bias Add folded into its Gemm call
        self.folded = {a.name for a in folds.values()}
        self.buffers: dict[str, int] = {}
        self.probe_names: dict[int, str] = {}  # buffer ids the last _probe named
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
            if node.name in self.library:
                self._add_library_call(node)
                continue
            for v in node.outputs:
                if v.name in self.materialized and v.name in self.live and \
                        v.name not in self.written:
                    self._place(v)
        self._place_unread_checks()

    def _place_unread_checks(self) -> None:
        """A node of an op that checks its inputs (`OpDef.checks`: an index in range, an
        integer divisor) but that no kernel lowered, its readers having skipped it (a Pad
        of only fill, a Concat piece no reader reaches), is computed as a root so that it
        raises where onnxruntime does (fuzz 135/4731 answered past an index out of range)."""
        skip = self.library.union(*(g.builder.nodes for g in self.groups if g.builder))
        for node in self.graph.nodes:
            v, opdef = node.outputs[0], ops.get(node.op, node.domain)
            if opdef and opdef.checks and node.name not in skip and \
                    v.name not in self.group_of and v.uses:
                self.materialized.add(v.name)
                self.notes.append(f"{v.name} materialized: no kernel reads it, its checks run")
                self._place(v)

    def _place(self, v: Value) -> None:
        """Add root v; a value it cannot inline is materialized on the spot (its own root
        first, so it is computed before v's kernel reads it), then v is tried again.

        Kernels formed earlier may still recompute that value inline: correct, and for a
        model's repeated layers far cheaper than restarting fusion once per layer (BERT-base
        materialized the same merge-heads Transpose in each of its 12 layers)."""
        while True:
            if self._alias(v):  # a view of a buffer: shares it, no kernel
                return
            try:
                self._add_root(v)
                return
            except Materialize as m:
                if m.value.name in self.materialized:
                    raise CompileError(f"fusion of {self.graph.name}: cannot place "
                                       f"{m.value.name}: {m.reason}") from None
                self.materialized.add(m.value.name)
                self.notes.append(f"{m.value.name} materialized: {m.reason}")
                self._place(m.value)

    def _alias(self, v: Value) -> bool:
        """Whether `v`, a view (Reshape, ...) of a temp buffer, shares that buffer."""
        node = v.producer
        opdef = None if node is None else ops.get(node.op, node.domain)
        if opdef is None or not opdef.view or v is not node.outputs[0]:
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

    def _add_library_call(self, node: Node) -> None:
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
        ins, in_views = self._operands(node)
        outs, out_views = self._results(node)
        op, attrs, ins, found = views.transposed_result(node, ins, in_views + out_views)
        g = Group(len(self.groups), None, kir.LibraryCall(
            op, ins, outs, attrs, (node.name,),
            found if any(v is not None for v in found) else ()))
        self.groups.append(g)
        for v in node.outputs:
            self.group_of[v.name] = g.index
        for v in self.written:
            self.group_of.setdefault(v, g.index)

    def _operands(self, node: Node) -> tuple[tuple, tuple]:
        """(buffer per input, view per input): a deferred operand is read in place when it
        is a strided view of one buffer, else it is computed into its own buffer now."""
        ins, found = [], []
        for v in node.inputs:
            view = None
            if v is not None and (node.name, v.name) in self.deferred and \
                    v.name not in self.materialized:
                hit = views.input_view(v, self._probe)
                if hit is not None:  # the probe's buffer id, given back: name it for real
                    hit = (self.buffer_of(self.graph.values[self.probe_names[hit[0]]]), hit[1])
                if hit is None:
                    self.materialized.add(v.name)
                    self.notes.append(f"{v.name} materialized: feeds {node.op} "
                                      f"({node.name}), no strided view of one buffer")
                    self._place(v)
                else:
                    ins.append(hit[0])
                    found.append(hit[1])
                    continue
            ins.append(None if v is None else self.buffer_of(v))
            found.append(view)
        return tuple(ins), tuple(found)

    def _results(self, node: Node) -> tuple[tuple, tuple]:
        """(buffer per output, view per output): a deferred result is written straight
        into the buffer at the end of its reshape/transpose chain when it can be."""
        y = node.outputs[0]
        if (node.name, y.name) not in self.deferred or y.name in self.materialized:
            return tuple(self.buffer_of(v) for v in node.outputs), (None,) * len(node.outputs)
        w = views.chain_end(self.graph, y)
        view = None if w is None else views.output_view(y, w, self._probe)
        if view is None:
            self.materialized.add(y.name)
            return (self.buffer_of(y),), (None,)
        self.materialized.add(w.name)
        self.written.add(w.name)
        self.notes.append(f"{y.name} written into {w.name}'s buffer by {node.op} "
                          f"({node.name}): no layout kernel")
        return (self.buffer_of(w),), (view,)

    def _probe(self, v: Value, as_buffer: Value | None) -> kir.Expr | None:
        """v's expression at its identity index in a loop nest of its own shape (with
        `as_buffer` read from a buffer), or None when it cannot be built alone."""
        saved, saved_buffers = set(self.materialized), dict(self.buffers)
        if as_buffer is not None:
            self.materialized.add(as_buffer.name)
            self.materialized.discard(v.name)  # v over as_buffer, though v is an output
        probe = KernelBuilder(self, tuple(v.shape), 0)
        try:
            e = probe.expr(v, identity_index(tuple(v.shape)))
        except (NeedRowDomain, Refuse, CompileError, Materialize):
            return None
        finally:  # ids the probe named are given back: executables index buffers densely
            self.probe_names = {i: name for name, i in self.buffers.items()}
            self.materialized.clear()
            self.materialized.update(saved)
            self.buffers = saved_buffers
        known = set(self.group_of) | ({as_buffer.name} if as_buffer is not None else set())
        return e if probe.loads <= known and not probe.checks else None

    def _add_root(self, v: Value) -> None:
        if 0 in v.shape:  # nothing to compute: the buffer is empty
            self.buffer_of(v)
            self.group_of[v.name] = -1
            # ... but the checks computing it needs still run: onnxruntime rejects an
            # integer divisor holding a zero even when the dividend is empty
            for check in self._empty_root_checks(v):
                self.groups.append(Group(len(self.groups), None, check))
            return
        for g in reversed(self.groups):
            if g.builder is None or g.builder.shape != self._loop_shape_hint(v, g):
                continue
            trial = g.builder.clone()
            trial.before = g.index
            try:
                trial.add_root(v, self._root_index(v, trial))
            except (NeedRowDomain, Refuse):
                continue
            if all(self.group_of[m] < g.index for m in trial.loads - trial.roots):
                trial.before = None
                g.builder = trial
                self.group_of[v.name] = g.index
                return
        g = Group(len(self.groups), self._new_kernel(v), None)
        self.groups.append(g)
        self.group_of[v.name] = g.index

    def _empty_root_checks(self, v: Value) -> list[kir.Check]:
        """The Checks computing empty value v would run (_probe_checks). Only a probe: the
        buffers it named are given back (executables index buffers densely), except those
        its checks read. A value it must read from a buffer (a Gather's data) is computed
        first, as any root, so the index check behind it runs (fuzz 93/2324)."""
        before, saved = dict(self.buffers), set(self.materialized)
        try:
            checks = self._probe_checks(v)
        except Materialize:
            self.buffers = before
            raise
        finally:
            self.materialized.clear()
            self.materialized.update(saved)
        name_of = {bid: name for name, bid in self.buffers.items()}
        self.buffers = before
        return [dataclasses.replace(c, buf=self.buffer_of(self.graph.values[name_of[c.buf]]))
                for c in checks]

    def _probe_checks(self, v: Value) -> list[kir.Check]:
        """_new_kernel(v).checks, the empty values it reads counted as buffers (no thunk
        may touch them: 95/199, 95/79) and their own checks added; Materialize for a
        non-empty one. v not lowered on its empty domain: the checks of the empty values
        its producer reads (a Pad reflecting a Gather's out-of-range index: 122/1699)."""
        found: list[kir.Check] = []
        while True:
            try:
                return list(dict.fromkeys(self._new_kernel(v).checks + found))
            except Materialize as m:
                if m.value is not v and m.value.name not in self.materialized:
                    if 0 not in m.value.shape:
                        raise
                    self.materialized.add(m.value.name)
                    found += self._probe_checks(m.value)
                    continue
                if m.value is not v:
                    return found
            except (CompileError, Refuse):
                pass
            ins = [x for x in v.producer.inputs if x is not None and x.producer is not None
                   and 0 in x.shape] if v.producer is not None else []
            return list(dict.fromkeys(found + [c for x in ins for c in self._probe_checks(x)]))

    def _new_kernel(self, v: Value) -> KernelBuilder:
        """A kernel for root v: its own elementwise nest, or the row nest it needs."""
        trial = KernelBuilder(self, tuple(v.shape), 0)
        try:
            trial.add_root(v, identity_index(tuple(v.shape)))
            return trial
        except NeedRowDomain as need:
            domain = row_domain(tuple(v.shape), need.shape, need.axes)
            if domain is not None:
                shape, idx = domain
                n_inner = len(need.axes)
            else:
                refined = refined_row_domain(tuple(v.shape), need.shape, need.axes)
                if refined is None:
                    raise Materialize(need.value, f"consumer {v.name} of shape "
                                                  f"{list(v.shape)} fits no row nest of "
                                                  f"{list(need.shape)}") from None
                shape, n_inner, idx = refined
            trial = KernelBuilder(self, shape, n_inner)
            try:
                trial.add_root(v, idx)
            except (NeedRowDomain, Refuse) as exc:
                # v itself does not fit the row nest its reduction needs (a Concat of a
                # ReduceMean along a kept axis): the reduction gets a kernel of its own
                blocked = need.value if exc.value is v and need.value is not v else exc.value
                raise Materialize(blocked, str(exc)) from None
            return trial
        except Refuse as exc:
            raise Materialize(exc.value, str(exc)) from None

    def _loop_shape_hint(self, v: Value, g: Group) -> tuple[int, ...] | None:
        # A root joins a kernel whose loop nest is its own shape (or a row kernel's outer
        # dims: a per-row store); symbolic dims compare structurally (no guard).
        b, shape = g.builder, tuple(v.shape)
        outer = b.shape[:b.rank - b.n_inner]
        if symbolic.same(shape, b.shape) or b.n_inner and (
                symbolic.same(shape, outer) or symbolic.same(shape, outer + (1,) * b.n_inner)):
            return b.shape
        return None

    def _root_index(self, v: Value, b: KernelBuilder) -> Idx:
        if symbolic.same(tuple(v.shape), b.shape):
            return identity_index(b.shape)
        n_outer = b.rank - b.n_inner
        idx = [kir.unit(k, b.rank) for k in range(n_outer)]
        if len(v.shape) == b.rank:
            idx += [kir.constant(0, b.rank)] * b.n_inner
        return tuple(idx)


# ---- what is materialized up front ---------------------------------------------------------

def _initial_materialized(graph: Graph, library: set[str], notes: list[str],
                          folds: dict[str, Node], deferred: set[tuple[str, str]]) -> set[str]:
    keep = {v.name for v in graph.inputs} | set(graph.initializers)
    for add in folds.values():
        keep.add(add.outputs[0].name)
        notes.append(f"{add.outputs[0].name}: bias Add ({add.name}) folded into a Gemm call")
    for v in graph.outputs:
        if v.name not in keep:
            keep.add(v.name)
            notes.append(f"{v.name} materialized: graph output")
    for node in graph.nodes:
        if node.name not in library:
            continue
        for v in node.all_inputs():
            if v.name not in keep and (node.name, v.name) not in deferred:
                keep.add(v.name)
                notes.append(f"{v.name} materialized: feeds {node.op} ({node.name})")
        if node.name not in folds:  # a folded MatMul's result is never stored
            keep.update(v.name for v in node.outputs if (node.name, v.name) not in deferred)
    return keep


def fuse(graph: Graph, fold_bias: str = "", library_views: frozenset = frozenset()
         ) -> kir.Program:
    """Group `graph` (concrete shapes) into kernels and calls; see the module docstring.
    `library_views`: the library ops whose operands may be strided views (views.py)."""
    notes: list[str] = []
    library = {n.name for n in graph.nodes if ops.get(n.op, n.domain).kind == ops.LIBRARY}
    folds = bias_folds(graph, library, fold_bias, library_views)
    deferred = deferred_operands(graph, library, folds, library_views)
    materialized = _initial_materialized(graph, library, notes, folds, deferred)
    for _ in range(MAX_RESTARTS):
        f = Fusion(graph, materialized, library, folds, notes, deferred)
        f.run()
        costly = recompute.too_costly(f.groups, f.graph, f.materialized)
        if not costly:
            return _program(f, notes)
        for v in costly:
            materialized.add(v.name)
            notes.append(f"{v.name} materialized: recomputed by several kernels or for many "
                         "elements each, too costly to recompute")
    raise CompileError(f"fusion of {graph.name} did not settle after {MAX_RESTARTS} rounds")


def _program(f: Fusion, notes: list[str]) -> kir.Program:
    graph = f.graph
    for v in graph.inputs + graph.outputs:
        f.buffer_of(v)
    thunks: list[kir.Thunk] = []
    checked: dict[tuple, int] = {}  # (buffer, kind, bounds, column) -> its Check's position
    n_kernels = 0
    for g in f.groups:
        if isinstance(g.thunk, kir.Check):
            kir.add_check(thunks, checked, g.thunk)
            continue
        if g.builder is None:
            thunks.append(g.thunk)
            continue
        b = g.builder
        for c in b.checks:
            kir.add_check(thunks, checked, c)
        thunks.append(kir.Kernel(f"k{n_kernels}", b.shape, b.n_inner, tuple(b.reductions),
                                 tuple(b.stores), tuple(b.nodes)))
        n_kernels += 1
    inputs = {v.name for v in graph.inputs}
    outputs = {v.name for v in graph.outputs}
    used = set().union(*(set().union(*kir.thunk_buffers(t)) for t in thunks)) if thunks \
        else set()
    used |= {f.buffers[v.name] for v in graph.inputs + graph.outputs}
    used |= {f.buffers[v] for v in f.aliases if v in f.buffers}
    buffers = []
    constants = {}
    for name, bid in sorted(f.buffers.items(), key=lambda kv: kv[1]):
        if bid not in used:  # taken by a trial that failed: no thunk reads or writes it
            continue
        v = graph.values[name]
        role = ("input" if name in inputs else "const" if graph.is_constant(v)
                else "output" if name in outputs else "temp")
        if role == "const":
            constants[bid] = graph.initializers[name]
        buffers.append(kir.Buffer(bid, name, v.dtype.name, tuple(v.shape), role))
    notes = notes + [f"{v} shares {x}'s buffer: a view, no copy" for v, x in f.aliases.items()]
    aliases = {f.buffers[v]: f.buffers[x] for v, x in f.aliases.items() if v in f.buffers}
    program = kir.Program(buffers, thunks, [f.buffers[v.name] for v in graph.inputs],
                          [f.buffers[v.name] for v in graph.outputs], notes, constants,
                          aliases=aliases)
    return kir.dense(program)  # ids named but never used (an empty root no thunk reads)

