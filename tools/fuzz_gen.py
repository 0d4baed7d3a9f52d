"""Random valid ONNX graphs for the differential fuzzer, built from per-op emitters.

`generate(rng)` returns a Case: a ModelProto (2-30 nodes, opset 17 or 18) and feeds. Each
emitter picks operands from the values built so far (recent ones first, so chains form),
adds a few nodes and records their concrete output shapes. Operands of ops with a
restricted domain are made safe first (Log on |x|+1, Sqrt on |x|, Div by |b|+0.5, Exp on
Clip(x, -6, 6)) so every reference stays finite. Data-dependent ops (NonZero, TopK with a
runtime k) only feed graph outputs or value-only chains, so shapes stay known here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

F32 = np.dtype("float32")
I64 = np.dtype("int64")
BOOL = np.dtype("bool")
_ELEM = {F32: TensorProto.FLOAT, I64: TensorProto.INT64, BOOL: TensorProto.BOOL,
         np.dtype("float64"): TensorProto.DOUBLE}

UNARY = ("Relu", "Neg", "Abs", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Softsign")
UNARY_ATTR = {"LeakyRelu": ("alpha", (0.01, 0.3)), "Elu": ("alpha", (0.5, 1.5)),
              "HardSigmoid": ("alpha", (0.1, 0.4))}
BINARY = ("Add", "Sub", "Mul", "Max", "Min")
REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax")


@dataclasses.dataclass
class Val:
    """A tensor of the graph being built, with its concrete shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    dynamic: bool = False  # shape depends on data (NonZero): only value-only chains use it
    no_ties: bool = False  # a graph input of random floats: TopK indices are well defined


@dataclasses.dataclass
class Case:
    """One generated graph with its feeds and the seed it came from."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    seed: tuple[int, ...] = ()


class Builder:
    """Accumulates nodes, inputs, initializers and feeds of one random graph."""

    def __init__(self, rng: np.random.Generator, opset: int):
        self.rng = rng
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[Val] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.pool: list[Val] = []
        self.used: set[str] = set()
        self.batch = int(rng.integers(1, 5))
        self.symbolic_batch = bool(rng.random() < 0.3)
        self._count = 0

    # ---- names, values, nodes ---------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def new_input(self, shape: tuple[int, ...], dtype: np.dtype = F32) -> Val:
        """A new graph input fed with random data."""
        v = Val(self.fresh("in"), np.dtype(dtype), tuple(shape), no_ties=True)
        if v.dtype == F32:
            self.feeds[v.name] = self.rng.standard_normal(shape).astype(F32)
        else:
            self.feeds[v.name] = self.rng.integers(0, 3, size=shape).astype(v.dtype)
        self.inputs.append(v)
        self.pool.append(v)
        return v

    def const(self, array: np.ndarray | list | float, dtype: np.dtype | None = None) -> str:
        """A new initializer; returns its name."""
        arr = np.asarray(array, dtype=dtype)
        name = self.fresh("c")
        self.inits.append(onnx.numpy_helper.from_array(arr, name))
        return name

    def weight(self, shape: tuple[int, ...], scale: float = 1.0) -> Val:
        """A random float initializer usable as an operand."""
        arr = (self.rng.standard_normal(shape) * scale).astype(F32)
        return Val(self.const(arr), F32, tuple(shape))

    def node(self, op: str, inputs: list[str], outs: list[tuple[np.dtype, tuple]],
             **attrs: object) -> list[Val]:
        """Append a node; `outs` gives each output's dtype and concrete shape."""
        names = [self.fresh(op.lower() + "_") for _ in outs]
        self.nodes.append(helper.make_node(op, inputs, names, name=self.fresh("n"), **attrs))
        self.used.update(i for i in inputs if i)
        vals = [Val(n, np.dtype(d), tuple(s)) for n, (d, s) in zip(names, outs)]
        self.pool.extend(vals)
        return vals

    # ---- operand choice ---------------------------------------------------------------
    def random_shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(0, 5)) if rank is None else rank
        dims = [int(d) for d in self.rng.integers(1, 6, size=rank)]
        if rank and self.rng.random() < 0.6:
            dims[0] = self.batch
        return tuple(dims)

    def pick(self, ok: Callable[[Val], bool] = lambda v: True, dtype: np.dtype = F32) -> Val:
        """A value from the pool (recent ones likelier), or a new input when none fits."""
        cands = [v for v in self.pool if v.dtype == dtype and not v.dynamic and ok(v)]
        if not cands or self.rng.random() < 0.08:
            for _ in range(20):
                shape = self.random_shape()
                if ok(Val("", dtype, shape)):
                    return self.new_input(shape, dtype)
            return self.new_input((self.batch, 3, 4), dtype)
        weights = np.arange(1, len(cands) + 1, dtype=float) ** 2
        return cands[int(self.rng.choice(len(cands), p=weights / weights.sum()))]

    def partner(self, a: Val) -> Val:
        """A float operand that broadcasts with `a` (same shape, sub-shape, or 1-dims)."""
        r = self.rng.random()
        if r < 0.3:
            same = [v for v in self.pool if v.shape == a.shape and v.dtype == F32
                    and not v.dynamic and v.name != a.name]
            if same:
                return same[int(self.rng.integers(len(same)))]
        shape = list(a.shape)
        if shape and self.rng.random() < 0.5:
            shape = shape[int(self.rng.integers(0, len(shape) + 1)):]
        shape = [1 if self.rng.random() < 0.3 else d for d in shape]
        if len(shape) == len(a.shape) < 4 and self.rng.random() < 0.15:
            shape.insert(0, int(self.rng.integers(1, 3)))
        if self.rng.random() < 0.5:
            return self.weight(tuple(shape))
        return self.new_input(tuple(shape))

    def safe_positive(self, a: Val, offset: float) -> Val:
        """|a| + offset: an operand for Log, Sqrt, Div and Reciprocal."""
        (ab,) = self.node("Abs", [a.name], [(F32, a.shape)])
        if offset == 0.0:
            return ab
        return self.node("Add", [ab.name, self.const(np.float32(offset))], [(F32, a.shape)])[0]


def bshape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


# ---- emitters: elementwise ----------------------------------------------------------------

def emit_unary(b: Builder) -> None:
    a = b.pick()
    r = b.rng.random()
    if r < 0.55:
        op = str(b.rng.choice(UNARY))
        b.node(op, [a.name], [(F32, a.shape)])
    elif r < 0.7:
        op = str(b.rng.choice(sorted(UNARY_ATTR)))
        key, (lo, hi) = UNARY_ATTR[op]
        b.node(op, [a.name], [(F32, a.shape)], **{key: float(b.rng.uniform(lo, hi))})
    elif r < 0.8:
        clipped = b.node("Clip", [a.name, b.const(np.float32(-6)), b.const(np.float32(6))],
                         [(F32, a.shape)])[0]
        b.node("Exp", [clipped.name], [(F32, a.shape)])
    elif r < 0.88:
        b.node("Log", [b.safe_positive(a, 1.0).name], [(F32, a.shape)])
    elif r < 0.94:
        b.node("Sqrt", [b.safe_positive(a, 0.0).name], [(F32, a.shape)])
    else:
        b.node("Reciprocal", [b.safe_positive(a, 0.5).name], [(F32, a.shape)])


def emit_binary(b: Builder) -> None:
    a = b.pick()
    c = b.partner(a)
    x, y = (a, c) if b.rng.random() < 0.7 else (c, a)
    if b.rng.random() < 0.15:
        y = b.safe_positive(y, 0.5)
        b.node("Div", [x.name, y.name], [(F32, bshape(x.shape, y.shape))])
        return
    op = str(b.rng.choice(BINARY))
    b.node(op, [x.name, y.name], [(F32, bshape(x.shape, y.shape))])


def emit_where_cast_clip(b: Builder) -> None:
    a = b.pick()
    r = b.rng.random()
    if r < 0.4:
        c = b.partner(a)
        op = str(b.rng.choice(["Greater", "Less", "GreaterOrEqual"]))
        (cond,) = b.node(op, [a.name, c.name], [(BOOL, bshape(a.shape, c.shape))])
        other = b.partner(a) if b.rng.random() < 0.5 else Val(b.const(np.float32(0)), F32, ())
        b.node("Where", [cond.name, a.name, other.name],
               [(F32, bshape(cond.shape, a.shape, other.shape))])
    elif r < 0.6:
        (d,) = b.node("Cast", [a.name], [(np.float64, a.shape)], to=TensorProto.DOUBLE)
        op = str(b.rng.choice(["Neg", "Abs", "Relu", "Tanh"]))
        (e,) = b.node(op, [d.name], [(np.float64, a.shape)])
        b.node("Cast", [e.name], [(F32, a.shape)], to=TensorProto.FLOAT)
    elif r < 0.75:
        (g,) = b.node("Greater", [a.name, b.const(np.float32(0))], [(BOOL, a.shape)])
        b.node("Cast", [g.name], [(F32, a.shape)], to=TensorProto.FLOAT)
    else:
        lo = np.float32(b.rng.uniform(-2, 0))
        hi = b.const(np.float32(b.rng.uniform(0, 2)))
        args = [a.name, b.const(lo), hi] if b.rng.random() < 0.7 else [a.name, "", hi]
        b.node("Clip", args, [(F32, a.shape)])


# ---- emitters: reductions, normalization, MatMul ----------------------------------------

def emit_reduce(b: Builder) -> None:
    # Not on empty tensors: onnxruntime 1.31 returns wrong shapes there (keepdims=0 keeps
    # the reduced empty axes), so it cannot be the oracle.
    a = b.pick(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    rank = len(a.shape)
    n_axes = int(b.rng.integers(1, rank + 1))
    axes = sorted(int(x) for x in b.rng.choice(rank, size=n_axes, replace=False))
    axes = [x - rank if b.rng.random() < 0.3 else x for x in axes]
    keep = int(b.rng.random() < 0.5)
    norm = {x % rank for x in axes}
    shape = tuple(1 if i in norm else d for i, d in enumerate(a.shape) if keep or i not in norm)
    op = str(b.rng.choice(REDUCE))
    if op == "ReduceSum" or b.opset >= 18:
        b.node(op, [a.name, b.const(np.array(axes, I64))], [(F32, shape)], keepdims=keep)
    else:
        b.node(op, [a.name], [(F32, shape)], axes=axes, keepdims=keep)


def emit_normalization(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    rank = len(a.shape)
    axis = int(b.rng.integers(-rank, rank))
    if b.rng.random() < 0.5:
        b.node("Softmax", [a.name], [(F32, a.shape)], axis=axis)
        return
    norm_shape = a.shape[axis % rank:]
    scale = b.weight(norm_shape, 0.5).name
    args = [a.name, scale] + ([b.weight(norm_shape, 0.5).name] if b.rng.random() < 0.6 else [])
    # Not 1e-5: a constant row (after Expand) turns rounding noise into 3e-5 errors.
    eps = float(b.rng.choice([1e-2, 0.1]))
    b.node("LayerNormalization", args, [(F32, a.shape)], axis=axis, epsilon=eps)


def emit_matmul(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    k = a.shape[-1]
    n = int(b.rng.integers(1, 7))
    if len(a.shape) >= 2 and b.rng.random() < 0.3:
        w = b.new_input(a.shape[:-2] + (k, n))  # batched: both operands are runtime tensors
        b.node("MatMul", [a.name, w.name], [(F32, a.shape[:-1] + (n,))])
        return
    w = b.weight((k, n), 1.0 / np.sqrt(max(k, 1)))
    b.node("MatMul", [a.name, w.name], [(F32, a.shape[:-1] + (n,))])


# ---- emitters: layout -------------------------------------------------------------------

def emit_transpose(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 2)
    perm = [int(p) for p in b.rng.permutation(len(a.shape))]
    b.node("Transpose", [a.name], [(F32, tuple(a.shape[p] for p in perm))], perm=perm)


def emit_reshape(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    shape = list(a.shape)
    if len(shape) >= 2 and b.rng.random() < 0.5:  # merge two adjacent dims
        i = int(b.rng.integers(0, len(shape) - 1))
        shape[i:i + 2] = [shape[i] * shape[i + 1]]
    else:  # split a dim into two factors, or add a 1
        i = int(b.rng.integers(0, len(shape)))
        d = shape[i]
        f = [x for x in range(1, d + 1) if d % x == 0]
        q = int(b.rng.choice(f)) if f else 1
        shape[i:i + 1] = [q, d // q]
    target = list(shape)
    j = int(b.rng.integers(0, len(target)))
    if b.rng.random() < 0.5:
        target[j] = -1
    elif j < len(a.shape) and a.shape[j] == target[j] and b.rng.random() < 0.5:
        target[j] = 0  # copy the input dim
    b.node("Reshape", [a.name, b.const(np.array(target, I64))], [(F32, tuple(shape))])


def emit_slice(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    rank = len(a.shape)
    axes = sorted(int(x) for x in b.rng.choice(rank, size=int(b.rng.integers(1, rank + 1)),
                                               replace=False))
    starts, ends, steps, slices = [], [], [], [slice(None)] * rank
    for ax in axes:
        d = a.shape[ax]
        step = int(b.rng.choice([1, 1, 2, -1]))
        if step > 0:
            s = int(b.rng.integers(-d, d))
            e = int(b.rng.choice([int(b.rng.integers(-d, d + 1)), d + 5]))
        else:
            s = int(b.rng.integers(0, d))
            e = int(b.rng.choice([int(b.rng.integers(0, s + 1)), -d - 1]))
        starts.append(s)
        ends.append(e)
        steps.append(step)
        slices[ax] = slice(s, e, step)
    shape = np.empty(a.shape)[tuple(slices)].shape
    if 0 in shape and 0 not in a.shape and b.rng.random() < 0.85:
        return  # empty tensors are worth testing, but not in most graphs
    axes = [x - rank if b.rng.random() < 0.3 else x for x in axes]
    args = [a.name, b.const(np.array(starts, I64)), b.const(np.array(ends, I64)),
            b.const(np.array(axes, I64)), b.const(np.array(steps, I64))]
    b.node("Slice", args, [(F32, shape)])


def emit_concat(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    axis = int(b.rng.integers(0, len(a.shape)))
    r = b.rng.random()
    if r < 0.3:
        other = a
    else:
        shape = list(a.shape)
        shape[axis] = int(b.rng.integers(1, 4))
        other = b.new_input(tuple(shape)) if r < 0.6 else b.weight(tuple(shape))
    out = list(a.shape)
    out[axis] += other.shape[axis]
    neg = axis - len(a.shape) if b.rng.random() < 0.3 else axis
    b.node("Concat", [a.name, other.name], [(F32, tuple(out))], axis=neg)


def emit_unsqueeze_squeeze(b: Builder) -> None:
    ones = [v for v in b.pool if 1 in v.shape and v.dtype == F32 and not v.dynamic]
    if ones and b.rng.random() < 0.5:
        a = ones[-1]
        axes = [i for i, d in enumerate(a.shape) if d == 1]
        axes = axes[:int(b.rng.integers(1, len(axes) + 1))]
        shape = tuple(d for i, d in enumerate(a.shape) if i not in axes)
        b.node("Squeeze", [a.name, b.const(np.array(axes, I64))], [(F32, shape)])
        return
    a = b.pick(lambda v: len(v.shape) <= 3)
    ax = int(b.rng.integers(0, len(a.shape) + 1))
    shape = a.shape[:ax] + (1,) + a.shape[ax:]
    neg = ax - len(shape) if b.rng.random() < 0.3 else ax
    b.node("Unsqueeze", [a.name, b.const(np.array([neg], I64))], [(F32, shape)])


def emit_expand(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) <= 3)
    target = [int(b.rng.integers(2, 4)) if d == 1 and b.rng.random() < 0.7 else d
              for d in a.shape]
    if b.rng.random() < 0.3:
        target.insert(0, int(b.rng.integers(1, 3)))
    ask = [1 if (i >= len(target) - len(a.shape) and b.rng.random() < 0.3) else t
           for i, t in enumerate(target)]  # Expand also broadcasts a 1 in the shape input
    out = bshape(a.shape, tuple(ask))
    b.node("Expand", [a.name, b.const(np.array(ask, I64))], [(F32, out)])


def emit_shape_chain(b: Builder) -> None:
    """Shape -> Gather (or Shape(start, end)) -> Concat -> Reshape: keep a prefix of dims."""
    a = b.pick(lambda v: len(v.shape) >= 2 and 0 not in v.shape)
    rank = len(a.shape)
    j = int(b.rng.integers(1, rank))
    kept = a.shape[:j]
    if b.rng.random() < 0.5:
        (s,) = b.node("Shape", [a.name], [(I64, (rank,))])
        (g,) = b.node("Gather", [s.name, b.const(np.arange(j, dtype=I64))], [(I64, (j,))],
                      axis=0)
    else:
        (g,) = b.node("Shape", [a.name], [(I64, (j,))], start=0, end=j)
    (t,) = b.node("Concat", [g.name, b.const(np.array([-1], I64))], [(I64, (j + 1,))], axis=0)
    rest = int(np.prod(a.shape[j:]))
    b.node("Reshape", [a.name, t.name], [(F32, kept + (rest,))])


# ---- emitters: data-dependent (must fall back) ----------------------------------------------

def emit_nonzero(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1)
    (g,) = b.node("Greater", [a.name, b.const(np.float32(0))], [(BOOL, a.shape)])
    (nz,) = b.node("NonZero", [g.name], [(I64, (len(a.shape), -1))])
    nz.dynamic = True
    if b.rng.random() < 0.5:
        (c,) = b.node("Cast", [nz.name], [(F32, nz.shape)], to=TensorProto.FLOAT)
        c.dynamic = True


def emit_topk(b: Builder) -> None:
    a = b.pick(lambda v: len(v.shape) >= 1 and 0 not in v.shape)
    axis = int(b.rng.integers(0, len(a.shape)))
    k_in = Val(b.fresh("k"), I64, (1,))
    k = int(b.rng.integers(1, a.shape[axis] + 1))
    b.inputs.append(k_in)
    b.feeds[k_in.name] = np.array([k], I64)
    shape = a.shape[:axis] + (k,) + a.shape[axis + 1:]
    _, idx = b.node("TopK", [a.name, k_in.name], [(F32, shape), (I64, shape)], axis=axis,
                       largest=int(b.rng.random() < 0.7))
    if not a.no_ties:
        idx.dynamic = True  # tie order may legally differ: never an output, never used
        b.used.add(idx.name)


EMITTERS: list[tuple[Callable[[Builder], None], float]] = [
    (emit_unary, 4), (emit_binary, 4), (emit_where_cast_clip, 1.5), (emit_reduce, 1.5),
    (emit_normalization, 1.2), (emit_matmul, 1), (emit_transpose, 1), (emit_reshape, 1),
    (emit_slice, 1), (emit_concat, 0.8), (emit_unsqueeze_squeeze, 0.8), (emit_expand, 0.6),
    (emit_shape_chain, 0.6), (emit_nonzero, 0.25), (emit_topk, 0.3),
]


def _value_info(b: Builder, v: Val, output: bool) -> onnx.ValueInfoProto:
    if output:
        dims: list = [None] * len(v.shape)
    else:
        dims = ["batch" if b.symbolic_batch and i == 0 and d == b.batch else d
                for i, d in enumerate(v.shape)]
    return helper.make_tensor_value_info(v.name, _ELEM[v.dtype], dims)


def _assemble(b: Builder) -> onnx.ModelProto:
    produced = [v for v in b.pool if v not in b.inputs]
    outs = [v for v in produced if v.name not in b.used]
    graph = helper.make_graph(b.nodes, "fuzz", [_value_info(b, v, False) for v in b.inputs],
                              [_value_info(b, v, True) for v in outs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)],
                              producer_name="autoclust-fuzz")
    model.ir_version = 10
    return model


def generate(rng: np.random.Generator, min_nodes: int = 2, max_nodes: int = 30) -> Case:
    """One random valid graph of min_nodes..max_nodes nodes (a little more at most) + feeds."""
    b = Builder(rng, opset=int(rng.choice([17, 18])))
    target = int(rng.integers(min_nodes, max_nodes + 1))
    fns = [f for f, _ in EMITTERS]
    weights = np.array([w for _, w in EMITTERS])
    while len(b.nodes) < target:
        fn = fns[int(rng.choice(len(fns), p=weights / weights.sum()))]
        fn(b)
    return Case(_assemble(b), b.feeds)


def case_for(seed: int, index: int) -> Case:
    """The index-th case of a run with `seed` (deterministic, independent of other cases)."""
    case = generate(np.random.default_rng([seed, index]))
    case.seed = (seed, index)
    return case
