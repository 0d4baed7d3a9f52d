"""The op table itself: OpDef, the kinds and dtype sets, registration and lookup.

See the package docstring (autoclust/ops/__init__.py) for what an OpDef holds and the
contracts of its rules; the op modules beside this one register into it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from autoclust.errors import InvalidInputError, InvalidShapeError, ShapeInferenceError
from autoclust.ir import Dim, Graph, Node, Shape
from autoclust.symbolic import is_dim

# Op kinds.
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"        # ReduceX, ArgMax/Min, CumSum
NORMALIZATION = "normalization"  # Softmax, LayerNorm, BatchNorm, ... (row reductions + math)
LAYOUT = "layout"              # Reshape, Transpose, Slice, Concat, Gather, Pad, ...
SHAPE = "shape"                # Shape, Size, ConstantOfShape, Range (shape computations)
LIBRARY = "library"            # MatMul, Gemm, Conv, pooling, Einsum
DATA_DEPENDENT = "data_dependent"  # NonZero, Unique, TopK: never compiled
KINDS = (ELEMENTWISE, REDUCTION, NORMALIZATION, LAYOUT, SHAPE, LIBRARY, DATA_DEPENDENT)

# Op groups for --ops_to_cluster / --cluster_exclude_ops. Each op is in the group of its
# kind (MATMUL for library calls) plus any listed in OpDef.groups; FUSIBLE is every kind
# that can fuse into a loop nest.
GROUP_OF_KIND = {ELEMENTWISE: "ELEMENTWISE", REDUCTION: "REDUCTION",
                 NORMALIZATION: "NORMALIZATION", LAYOUT: "LAYOUT", SHAPE: "SHAPE",
                 LIBRARY: "MATMUL", DATA_DEPENDENT: "DATA_DEPENDENT"}
FUSIBLE_KINDS = (ELEMENTWISE, REDUCTION, NORMALIZATION, LAYOUT, SHAPE)

FLOAT_TYPES = (np.dtype("float16"), np.dtype("float32"), np.dtype("float64"))
INT_TYPES = tuple(np.dtype(t) for t in ("int8", "int16", "int32", "int64",
                                        "uint8", "uint16", "uint32", "uint64"))
BOOL = np.dtype("bool")
INT64 = np.dtype("int64")
NUMERIC_TYPES = FLOAT_TYPES + INT_TYPES
ALL_TYPES = NUMERIC_TYPES + (BOOL,)
# dtypes the compiled backends support (float16 computes in float32).
COMPILABLE_TYPES = frozenset(np.dtype(t) for t in
                             ("float16", "float32", "float64", "int32", "int64", "bool"))
# bfloat16 (an ml_dtypes type, numpy kind 'V'): stored as 16 bits, computed in float32 and
# rounded to nearest even after every op, like float16. Compiled wherever an op compiles
# float16, except library calls (MatMul, Conv: no bfloat16 kernels to call).
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype("float16")
I32 = np.dtype("int32")
# Stored narrow, computed in int32 and wrapped back after every op (as onnxruntime's int8
# kernels do in C++): layout ops, casts, the quantize ops and every elementwise op that
# compiles int32 take them; reductions do not.
NARROW_INT_TYPES = frozenset(np.dtype(t) for t in ("int8", "uint8", "int16", "uint16"))

TypeShape = tuple[np.dtype, Shape]
Arrays = list[np.ndarray | None]  # a ref's inputs (None for an omitted optional input)
Attrs = dict[str, Any]


class InferContext:
    """What an op's infer rule sees: input types, known constant input values, attrs."""

    def __init__(self, op: str, dtypes: Sequence[np.dtype | None], shapes: Sequence[Shape],
                 values: Sequence[np.ndarray | None], attrs: dict[str, Any],
                 present: Sequence[bool], node_name: str = ""):
        self.op = op
        self.dtypes = list(dtypes)
        self.shapes = list(shapes)
        self.values = list(values)
        self.attrs = attrs
        self.present = list(present)
        self.node_name = node_name

    @property
    def n_inputs(self) -> int:
        return len(self.dtypes)

    def has(self, i: int) -> bool:
        """True when optional input i is given."""
        return i < len(self.present) and self.present[i]

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def value(self, i: int) -> np.ndarray | None:
        """The constant value of input i when known (constants, folded shape chains)."""
        return self.values[i] if self.has(i) else None

    def rank(self, i: int) -> int | None:
        s = self.shapes[i] if self.has(i) else None
        return None if s is None else len(s)

    def fail(self, message: str) -> ShapeInferenceError:
        where = f"node {self.node_name!r} " if self.node_name else ""
        return ShapeInferenceError(f"{where}({self.op}): {message}")

    def invalid(self, message: str, fail: bool = False) -> InvalidInputError:
        """Inputs whose concrete shapes the op rejects at run time, as onnxruntime does
        (GatherElements' indices larger than data off the axis): InvalidInputError, or
        InvalidShapeError where onnxruntime raises Fail rather than InvalidArgument."""
        where = f"node {self.node_name!r} " if self.node_name else ""
        kind = InvalidShapeError if fail else InvalidInputError
        return kind(f"{where}({self.op}): {message}")


InferFn = Callable[[InferContext], list[TypeShape]]
RefFn = Callable[[Arrays, Attrs], list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class OpDef:
    op: str
    kind: str
    infer: InferFn
    ref: RefFn
    domain: str = ""
    lower: Callable[..., Any] | None = None   # kernel-IR lowering (autoclust.kernel.lowering)
    refuse: str = ""                    # why the op is never lowered (when lower is None)
    # why this node is never clustered (its attributes, or inputs the graph gives it:
    # training-mode Dropout, blocked quantization), whatever the device
    refuses: Callable[[Node, Graph], str | None] | None = None
    dtypes: frozenset | None = None     # dtypes compiled code supports; None = COMPILABLE_TYPES
    shape_inputs: tuple[int, ...] = ()  # inputs whose values decide output shapes
    const_inputs: tuple[int, ...] = ()  # further inputs the lowering needs as constants
    data_dependent: bool = False        # output shape depends on input data
    weight: int | None = None           # toward --min_cluster_size; None: by kind (below)
    view: bool = False                  # output 0 = input 0's elements, same order (Reshape)
    cost: int = 1                       # relative compute cost (4: transcendental math)
    shape_of: bool = False              # output depends only on input 0's shape (Shape)
    shape_like: bool = False            # a shape computation when fed by shape values
    groups: tuple[str, ...] = ()        # extra --ops_to_cluster groups (GEMM, WINDOW, ...)
    # "copy": each output element is an input element or an exact function of one (Neg,
    # Max, Transpose, Floor): a chain of them from exact data has one right answer.
    # "rounded": the correctly rounded result of exact operands (IEEE +, -, *, /, sqrt).
    # "": neither (libm math, reductions that sum, MatMul: order and accuracy vary).
    exact: str = ""
    discrete: bool = False              # outputs jump: a one-ulp input change may flip them
    # the lowering checks inputs at run time (an index in range, an integer divisor not
    # zero): a node no kernel reads is still computed, so that it raises (kernel/fusion.py)
    checks: bool = False
    # Library ops: work estimate flops(attrs, in_types, out_types), 2 x multiply-adds
    # (window reads for pools), behind library-call choices and benchmarks' GEMM shares.
    flops: Callable[[Attrs, list, list], float] | None = None
    doc: str = ""

    def group_names(self) -> set[str]:
        names = {GROUP_OF_KIND[self.kind], *self.groups}
        if self.kind in FUSIBLE_KINDS:
            names.add("FUSIBLE")
        return names

    @property
    def cluster_weight(self) -> int:
        """What one node of this op counts toward --min_cluster_size.

        A normalization is a reduction plus elementwise work in one op (Softmax = max, exp,
        sum, divide): it weighs 2, so that scale + mask + softmax (3 ops, two full tensor
        round trips saved) is worth a cluster. Identity and Dropout weigh 0.
        """
        if self.weight is not None:
            return self.weight
        return 2 if self.kind == NORMALIZATION else 1

    @property
    def compiled_dtypes(self) -> frozenset:
        """dtypes compiled code supports; layout ops move any stored value unchanged."""
        allowed = self.dtypes
        if allowed is None:
            allowed = COMPILABLE_TYPES | NARROW_INT_TYPES if self.kind == LAYOUT \
                else COMPILABLE_TYPES
        if F16 in allowed and self.kind != LIBRARY:
            allowed = allowed | {BFLOAT16}
        if I32 in allowed and self.kind == ELEMENTWISE:
            allowed = allowed | NARROW_INT_TYPES  # computed in int32, wrapped after each op
        return allowed

    @property
    def needs_constant(self) -> tuple[int, ...]:
        """Inputs that must be constants when the node is lowered."""
        return tuple(sorted(set(self.shape_inputs) | set(self.const_inputs)))


_TABLE: dict[tuple[str, str], OpDef] = {}


def register(op: str, kind: str, infer: InferFn, ref: RefFn, **kw: Any) -> OpDef:
    """Add an op to the table (once: a second registration is a bug)."""
    domain = kw.get("domain", "")
    key = (domain, op)
    if key in _TABLE:
        raise RuntimeError(f"op {op} registered twice")
    d = OpDef(op, kind, infer, ref, **kw)
    _TABLE[key] = d
    return d


def replace(opdef: OpDef) -> OpDef:
    """Put `opdef` in place of the registered op of its name; returns the one it replaced.
    For fault injection (`autoclust fuzz --self-test` and tests), never for real ops."""
    key = (opdef.domain, opdef.op)
    old = _TABLE[key]
    _TABLE[key] = opdef
    return old


def get(op: str, domain: str = "") -> OpDef | None:
    """The OpDef for (domain, op), or None when the op is not in the table."""
    if domain == "ai.onnx":
        domain = ""
    return _TABLE.get((domain, op))


def in_group(name: str) -> frozenset[str]:
    """Names of the ops in op group `name` (GEMM, WINDOW, CONV_EPILOGUE, ELEMENTWISE, ...)."""
    return frozenset(d.op for d in _TABLE.values() if name in d.group_names())


def all_ops() -> list[OpDef]:
    return sorted(_TABLE.values(), key=lambda d: (d.domain, d.op))


# ---- shared shape helpers ---------------------------------------------------------------

def broadcast_dims(a: Dim, b: Dim) -> Dim:
    """Multidirectional broadcasting of two dims (symbolic-aware)."""
    if a == 1:
        return b
    if b == 1:
        return a
    if a == b:
        return a
    if is_dim(a) and is_dim(b):
        raise ShapeInferenceError(f"cannot broadcast dims {a} and {b}")
    if is_dim(a):  # a is known and != 1: b must be a or 1 -> result a
        return a
    if is_dim(b):
        return b
    return None  # two different symbols (or unknowns): either could be 1


def broadcast_shapes(*shapes: Shape) -> Shape:
    """numpy-style broadcasting of several shapes; None if any rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        out = [broadcast_dims(x, y) for x, y in zip(out, padded)]
    return tuple(out)


def normalize_axis(axis: int, rank: int, ctx: InferContext | None = None) -> int:
    """Map a possibly negative axis into [0, rank); raise on out of range."""
    if not -rank <= axis < max(rank, 1):
        msg = f"axis {axis} is out of range for rank {rank}"
        raise ctx.fail(msg) if ctx else ShapeInferenceError(msg)
    return axis + rank if axis < 0 else axis


def dim_product(dims: Sequence[Dim]) -> Dim:
    """Product of dims, None when any is not a known int."""
    out = 1
    for d in dims:
        if not is_dim(d):
            return None
        out *= d
    return out


def dense(a: np.ndarray) -> np.ndarray:
    """`a` as a C-contiguous array (np.ascontiguousarray would turn 0-d into 1-d)."""
    if not isinstance(a, np.ndarray):  # an element taken from an object array of Syms
        return np.asarray(a)
    return a if a.flags.c_contiguous else a.copy(order="C")


def same_as_input(i: int = 0) -> InferFn:
    """infer rule: one output with input i's dtype and shape."""
    def infer(ctx: InferContext) -> list[TypeShape]:
        return [(ctx.dtypes[i], ctx.shapes[i])]
    return infer


# ---- running rules on graph nodes ---------------------------------------------------------

def context_for(node: Node, graph: Graph | None = None,
                known: dict[str, np.ndarray] | None = None) -> InferContext:
    """Build the InferContext of `node`: constant values come from `graph` initializers
    and from `known` (values folded elsewhere, e.g. shape chains)."""
    dtypes, shapes, values, present = [], [], [], []
    for v in node.inputs:
        if v is None:
            dtypes.append(None)
            shapes.append(None)
            values.append(None)
            present.append(False)
            continue
        dtypes.append(v.dtype)
        shapes.append(v.shape)
        val = None
        if known is not None and v.name in known:
            val = known[v.name]
        elif graph is not None:
            val = graph.constant_value(v)
        values.append(val)
        present.append(True)
    return InferContext(node.op, dtypes, shapes, values, node.attrs, present, node.name)


def infer_node(node: Node, graph: Graph | None = None,
               known: dict[str, np.ndarray] | None = None) -> list[TypeShape]:
    """Run the op's infer rule on `node` and return [(dtype, shape)] per output."""
    d = get(node.op, node.domain)
    if d is None:
        raise ShapeInferenceError(f"node {node.name!r}: op {node.qualified_op} is not in the "
                                  "op table")
    return d.infer(context_for(node, graph, known))


def run_ref(node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run the op's NumPy reference on concrete inputs."""
    d = get(node.op, node.domain)
    if d is None:
        raise ShapeInferenceError(f"op {node.qualified_op} has no reference implementation")
    try:
        return d.ref(inputs, node.attrs)
    except InvalidInputError as exc:  # bad values (an integer zero divisor): name the node
        raise type(exc)(f"node {node.name!r} ({node.op}): {exc}") from None  # keeps its kind


# ---- ops defined outside the table ---------------------------------------------------------
# autoclust.ops.custom.register_op adds user ops (custom calls) at run time; unlike the built-in
# ops they can be removed again, and onnxruntime cannot run them (the runtime asks
# `is_external` to keep them out of onnxruntime segments).
_EXTERNAL: set[tuple[str, str]] = set()


def register_external(op: str, domain: str, kind: str, infer: InferFn, ref: RefFn,
                      **kw: Any) -> OpDef:
    """Add an op defined outside autoclust (a custom call) to the table."""
    d = register(op, kind, infer, ref, domain=domain, **kw)
    _EXTERNAL.add((domain, op))
    return d


def unregister_external(op: str, domain: str) -> None:
    """Remove an op added by register_external (built-in ops cannot be removed)."""
    if (domain, op) not in _EXTERNAL:
        raise KeyError(f"{domain}::{op} was not registered from outside the op table")
    _EXTERNAL.discard((domain, op))
    del _TABLE[(domain, op)]


def is_external(op: str, domain: str = "") -> bool:
    """Whether (domain, op) was added by register_external: onnxruntime cannot run it."""
    return (domain, op) in _EXTERNAL
