"""The typed context an op's lowering is written against, and kernel-IR expression helpers.

Every op in the table with a `lower` function is lowered through one `LowerCtx`: the
lowering asks for operands as expressions, for reductions and scans over row domains, and
returns the scalar expression of one output of one node at one logical index:

    def lower_add(ctx):                      # Add: both operands broadcast to the output
        a, b = ctx.operand(0), ctx.operand(1)
        return op("add", a, b)

    def lower_transpose(ctx):                # layout ops rewrite the index, then read
        perm = ctx.attr("perm")
        idx = [None] * len(perm)
        for j, p in enumerate(perm):
            idx[p] = ctx.idx[j]
        return ctx.value(0, tuple(idx))

Operands come in the op's compute dtype (float16 computes in float32); the fusion driver
rounds a node's float16 result back to float16, so every float16 value in a kernel is
rounded exactly where onnxruntime rounds it (after each op). A lowering that cannot build
its expression in the current kernel calls `ctx.refuse(reason)`: the driver then computes
the node's output in a kernel of its own and the reason appears in `.kernels.txt`.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Collection
from typing import Any, NoReturn

import numpy as np

from autoclust import symbolic
from autoclust.ir import Graph, Node, Value
from autoclust.kernel import ir as kir
from autoclust.kernel.ir import Affine, Const, Expr, Op

Idx = tuple[Affine, ...]
Element = Callable[[Idx], Expr]  # the expression reduced at each point of a row


class LowerCtx(abc.ABC):
    """What a lowering sees while building output `out` of `node` at logical index `idx`."""

    node: Node
    out: int        # which output of the node is being built
    idx: Idx        # its logical index, affine in the kernel's loop indices
    rank: int       # the loop nest's rank (the length of every Affine's coeffs)

    # ---- facts about the node -------------------------------------------------------
    @property
    def output(self) -> Value:
        return self.node.outputs[self.out]

    @property
    def dtype(self) -> str:
        """The output's dtype name."""
        return self.output.dtype.name

    @property
    def shape(self) -> tuple[int, ...]:
        """The output's (concrete) shape."""
        return tuple(self.output.shape)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.node.attrs.get(key, default)

    def has(self, i: int) -> bool:
        """Whether optional input i is given."""
        return i < len(self.node.inputs) and self.node.inputs[i] is not None

    def input(self, i: int) -> Value:
        return self.node.inputs[i]

    def in_shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.node.inputs[i].shape)

    def in_dtype(self, i: int) -> str:
        return self.node.inputs[i].dtype.name

    @property
    @abc.abstractmethod
    def extents(self) -> tuple[int, ...]:
        """The loop nest's extents (the kernel's shape)."""

    def zero(self) -> Affine:
        return kir.constant(0, self.rank)

    def at(self, c: int) -> Affine:
        """The constant index c."""
        return kir.constant(c, self.rank)

    def unit(self, k: int) -> Affine:
        return kir.unit(k, self.rank)

    def index(self, a: Affine) -> Expr:
        """The int64 value of an affine index (Trilu's row/column, Concat's piece)."""
        return kir.Index(a)

    @abc.abstractmethod
    def constant(self, i: int) -> np.ndarray | None:
        """The value of input i when it is a constant (shape inputs are, once specialized)."""

    def ints(self, i: int) -> list[int] | None:
        """A constant integer input as a list (None when absent or not constant)."""
        if not self.has(i):
            return None
        v = self.constant(i)
        return None if v is None else symbolic.ints(v)  # symbolic dims stay Syms

    # ---- reading inputs -------------------------------------------------------------
    @abc.abstractmethod
    def value(self, i: int, idx: Idx) -> Expr:
        """Input i at logical index idx (its own dtype: layout ops move values unchanged)."""

    def operand(self, i: int) -> Expr:
        """Input i broadcast (numpy rules) to the output's shape, at idx, in compute dtype."""
        v = self.node.inputs[i]
        lead = len(self.shape) - len(v.shape)
        idx = tuple(self.zero() if size == 1 else self.idx[d + lead]
                    for d, size in enumerate(v.shape))
        e = self.value(i, idx)
        return cast(e, compute_dtype(e.dtype))

    def operands(self) -> list[Expr | None]:
        """Every input as an operand (None for omitted optional inputs)."""
        return [self.operand(i) if self.has(i) else None for i in range(len(self.node.inputs))]

    @abc.abstractmethod
    def view(self, i: int, shape: tuple[int, ...], idx: Idx) -> Expr:
        """Input i read as if reshaped (row-major) to `shape`, at idx (Reshape, GroupNorm)."""

    @abc.abstractmethod
    def gather(self, i: int, idx: Idx, dyn: dict[int, Expr]) -> Expr:
        """Input i at idx, except that dims in `dyn` take data-dependent int64 positions.

        The positions must already lie inside the dims (clamp them, and add a `check`
        for the data that chose them); input i is read from its buffer.
        """

    @abc.abstractmethod
    def clamped(self, dim: int, lo: int, hi: int) -> contextlib.AbstractContextManager:
        """Loads built inside the block clamp loop index `dim` into [lo, hi] (Concat)."""

    @abc.abstractmethod
    def check(self, i: int, kind: str, lo: int = 0, hi: int = 0, message: str = "",
              column: tuple[int, int] | None = None) -> None:
        """Before the kernel runs, check integer input i: every element in [lo, hi]
        ("range") or non-zero ("nonzero"); a failure raises InvalidInputError(message).
        column = (j, k): only every k-th element from j (one coordinate of GatherND's)."""

    # ---- rows ------------------------------------------------------------------------
    @abc.abstractmethod
    def rows(self, shape: tuple[int, ...], axes: list[int]) -> None:
        """Make the kernel iterate rows of a tensor of `shape` reduced over `axes` (a lowering
        that must index that tensor before it reduces it calls this first: GroupNorm)."""

    @abc.abstractmethod
    def reindex(self, idx: Idx, shape: tuple[int, ...], to_shape: tuple[int, ...]) -> Idx:
        """The index into `to_shape` of the element at idx of a row-major `shape` tensor
        holding the same elements (refuses when it is not affine in this kernel)."""

    @abc.abstractmethod
    def reduce(self, kind: str, shape: tuple[int, ...], axes: list[int],
               kept: dict[int, Affine], element: Element, dtype: str,
               from_negative_zero: bool = False) -> Expr:
        """A reduction phase over `axes` of a tensor of `shape` for the row at `kept`
        (dim -> index); element(idx) is the expression reduced at each point of the row.
        from_negative_zero: a float sum starts at -0.0, not +0.0 (ir.sum_start)."""

    @abc.abstractmethod
    def scan(self, kind: str, shape: tuple[int, ...], axis: int, element: Element,
             dtype: str, exclusive: bool = False, reverse: bool = False) -> Expr:
        """The running `kind` ("sum" or "prod") along `axis` of a tensor of `shape`, at the
        output's own index (CumSum): the output must have `shape`."""

    # ---- refusing ----------------------------------------------------------------------
    def refuse(self, reason: str) -> NoReturn:
        """This output cannot be built inside the current kernel: compute it in its own."""
        raise Refuse(self.output, reason)

    def need_buffer(self, i: int, reason: str) -> NoReturn:
        """Input i must be a buffer (materialized) for this lowering."""
        raise Refuse(self.node.inputs[i], reason)

    @property
    @abc.abstractmethod
    def graph(self) -> Graph:
        """The graph being lowered (a cluster's: values read outside it are its outputs)."""

    def only_read_by(self, ops: Collection[str]) -> bool:
        """Whether the output's values reach nothing but `ops` (see read_only_by)."""
        return read_only_by(self.graph, self.output, ops)


LowerFn = Callable[[LowerCtx], Expr]

_MOVERS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten")


def read_only_by(graph: Graph, v: Value, ops: Collection[str]) -> bool:
    """Whether every reader of v, seen through layout ops and torch's guard of fully masked
    rows (`Where(IsNaN(p), 0, p)`), is one of `ops`, and no value on the way leaves the
    graph. With the GEMM group nobody sees v's elements one by one, only sums of their
    products: a softmax may flush its denormal probabilities (below 2^-126, so under
    float32's rounding of any sum they join), which would otherwise run the GEMM through
    microcode assists at 10-50x the time of its normal-number multiplies."""
    if v in graph.outputs or not v.uses:
        return False
    for node, k in v.uses:
        if node.op in ops:
            continue
        if node.op == "IsNaN":  # a denormal and its zero are both not NaN
            if all(u.op == "Where" and i == 0 for u, i in node.outputs[0].uses) \
                    and node.outputs[0] not in graph.outputs:
                continue
            return False
        passes_on = (node.op in _MOVERS and k == 0) or (node.op == "Where" and k > 0)
        if not (passes_on and read_only_by(graph, node.outputs[0], ops)):
            return False
    return True


class Refuse(Exception):
    """`value` cannot be computed inside the current kernel; it must be a buffer."""

    def __init__(self, value: Value, reason: str):
        node = value.producer
        where = f"{node.op} ({node.name})" if node is not None else value.name
        super().__init__(f"{where}: {reason}")
        self.value = value


class NeedRowDomain(Exception):
    """A reduction or scan was reached in a kernel without a fitting row domain: rebuild
    the kernel over `shape` with `axes` inner (a scan: one axis)."""

    def __init__(self, value: Value, shape: tuple[int, ...], axes: list[int],
                 scan: bool = False):
        super().__init__(f"{value.producer.op} needs a row kernel")
        self.value, self.shape, self.axes, self.scan = value, tuple(shape), sorted(axes), scan


# Ops whose every output element is an element of input 0 (index chains of shape ops).
ELEMENT_OF_INPUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
                              "Identity", "Expand", "Slice", "Gather", "GatherElements",
                              "Tile"})


def elements_of_constant(graph: Graph, v: Value) -> np.ndarray | None:
    """The constant every element of v is taken from, when v is a chain of ELEMENT_OF_INPUT
    ops over one: position ids sliced to a symbolic sequence length are checked once,
    at compile time, instead of every run."""
    while graph.constant_value(v) is None:
        node = v.producer
        if node is None or node.op not in ELEMENT_OF_INPUT or node.domain not in ("", "ai.onnx"):
            return None
        v = node.inputs[0]
    return graph.constant_value(v)


# ---- expression helpers -------------------------------------------------------------------

# Storage dtypes whose values compute in float32 (a register holds the rounded value).
NARROW_FLOATS = ("float16", "bfloat16")
# Storage dtypes whose values compute in int32 (a register holds the wrapped value).
NARROW_INTS = ("int8", "uint8", "int16", "uint16")


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic on `dtype` values runs in: float16 and bfloat16 compute in
    float32, int8/uint8/int16/uint16 in int32."""
    if dtype in NARROW_FLOATS:
        return "float32"
    return "int32" if dtype in NARROW_INTS else dtype


def const(value: Any, dtype: str) -> Const:
    """A scalar constant of `dtype` (Python bool, int or float)."""
    if dtype == "bool":
        return Const(bool(value), dtype)
    if np.dtype(dtype).kind in "iu":  # a symbolic dim stays one (its value is read per run)
        return Const(value if symbolic.is_sym(value) else int(value), dtype)
    return Const(float(value), dtype)


def cast(e: Expr, dtype: str) -> Expr:
    """e converted to dtype (ONNX Cast semantics); constants fold."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Const) and symbolic.is_sym(e.value):  # an integer from symbolic dims
        return Const(e.value, dtype) if np.dtype(dtype).kind in "iu" else Op("cast", (e,), dtype)
    if isinstance(e, Const) and not (np.dtype(dtype).kind in "iu" and isinstance(e.value, float)):
        return const(np.array(e.value).astype(dtype).item(), dtype)
    return Op("cast", (e,), dtype)


def op(name: str, *args: Expr, dtype: str | None = None) -> Op:
    """Primitive `name` applied to args; the dtype defaults to bool for comparisons and
    to the last argument's dtype otherwise (select's branches)."""
    if dtype is None:
        dtype = "bool" if name in kir.COMPARE_OPS else args[-1].dtype
    return Op(name, tuple(args), dtype)


def select(cond: Expr, if_true: Expr, if_false: Expr) -> Op:
    return Op("select", (cond, if_true, if_false), if_false.dtype)


def prim(name: str) -> LowerFn:
    """The lowering of an op that is one primitive over all its operands (Add, Exp, ...)."""
    def lower(ctx: LowerCtx) -> Expr:
        return op(name, *[a for a in ctx.operands() if a is not None])
    return lower


def fold(name: str) -> LowerFn:
    """A variadic op folding primitive `name` over its operands (Max, Min, Sum)."""
    def lower(ctx: LowerCtx) -> Expr:
        args = [a for a in ctx.operands() if a is not None]
        acc = args[0]
        for a in args[1:]:
            acc = op(name, acc, a)
        return acc
    return lower
