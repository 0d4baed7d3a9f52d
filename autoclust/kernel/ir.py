"""Kernel IR: what fusion produces and backends render (LLVM on CPU, CUDA C on GPU).

A Program is a list of buffers and an ordered list of thunks:

- Kernel: a loop nest over `shape`. The last `n_inner` dims are the reduction ("row")
  dims: for each outer point, every Reduction runs over the inner dims in order (a phase
  may read earlier results through Reduced), then the Stores run; a per-row Store runs
  once per outer point, the others once per inner point. With n_inner == 0 a Kernel is a
  plain elementwise loop nest. A *scan* kernel (`Kernel.scan`) has one phase, a running
  sum or product over one inner dim; its element stores run inside that phase's loop and
  read the running value through Reduced (CumSum, float Range).
- LibraryCall: a library op (MatMul, Conv, ...) writing into preallocated buffers.
- Check: a run-time check of an integer buffer (indices in range, divisors non-zero) that
  raises InvalidInputError naming the node; it runs before the kernels that read it.

Scalar expressions form a DAG of frozen dataclasses: Load (buffer + affine index map over
the loop indices, plus optional data-dependent terms for gathers), Const, Index (an affine
index value), Op (a primitive from PRIMITIVES) and Reduced (the result of a reduction
phase). dtypes are numpy dtype names. An expression of dtype float16 holds a value
representable in float16, computed in a float32 register.

    softmax over [R, N]:  kernel k0 [R | N]
      r0 = max(load(x, N*i0 + i1))
      r1 = sum(exp(load(x, N*i0 + i1) - r0))
      store y[N*i0 + i1] = exp(load(x, N*i0 + i1) - r0) / r1
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from autoclust.symbolic import is_sym, same, substitute

# Primitive scalar ops and their arity. Compare ops yield bool; "cast" converts to the
# Op's dtype with ONNX Cast semantics (float -> int32/int64: NaN and out-of-range give the
# type's minimum, as onnxruntime on x86; narrower ints go through int32 and wrap);
# "cast_sat" converts float -> int saturating (integer reductions accumulate in float64);
# "div_exact" is a float division a backend must not turn into a multiplication by the
# reciprocal (QuantizeLinear rounds x / scale: 1 ulp moves a tie); "mul_exact" a float
# multiply a backend must round on its own, never contracted into an FMA with the add
# that consumes it (DequantizeLinear's x * scale: onnxruntime rounds it before the Add); "select" is
# (cond, if_true, if_false); "trap" returns its argument but aborts when run
# (the testing-only fault injector).
PRIMITIVES: dict[str, int] = {
    **{name: 1 for name in (
        "neg", "abs", "sqrt", "exp", "log", "log1p", "tanh", "erf", "sigmoid", "floor",
        "ceil", "round", "sign", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
        "asinh", "acosh", "atanh", "not", "isnan", "bitnot", "cast", "cast_sat", "trap")},
    **{name: 2 for name in (
        "add", "sub", "mul", "mul_exact", "div", "div_exact", "mod", "fmod", "pow", "max", "min", "lt", "le", "gt",
        "ge", "eq", "ne", "and", "or", "xor", "bitand", "bitor", "bitxor", "shl", "shr")},
    "select": 3,
    "trap": 1,  # yields its argument, but aborts when run (--inject_bug=crash only)
}
COMPARE_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "isnan"})
# Primitives that cost far more than a load: fusion recomputes few of them, and a backend
# stores a row kernel's shared ones instead of recomputing them (softmax's exp).
COSTLY = frozenset({"exp", "log", "log1p", "tanh", "erf", "sigmoid", "pow", "sin", "cos",
                    "tan"})
REDUCTION_KINDS = ("sum", "prod", "max", "min", "argmax", "argmin", "argmax_last",
                   "argmin_last")
SCAN_KINDS = ("inclusive", "exclusive")


def reduce_identity(kind: str, dtype: str, bits: int | None = None) -> int | float:
    """Where a reduction of `kind` starts: 0 (sum), 1 (prod), the lowest value (max and
    argmax) or the highest (min and argmin) of `dtype`, integers in the `bits`-wide type
    they are computed in (default: 64 for int64, else 32: narrow ints compute in int32)."""
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    high = kind in ("max", "argmax", "argmax_last")
    if dtype.startswith("float") or dtype == "bfloat16":
        return -math.inf if high else math.inf
    bits = bits or (64 if dtype == "int64" else 32)
    return -(1 << (bits - 1)) if high else (1 << (bits - 1)) - 1


def sum_start(red: Reduction) -> float:
    """Where a float sum phase starts: at -0.0, the exact additive identity (-0.0 + x == x
    for every x), for an inclusive scan (CumSum([-0., -0.]) stays -0.0 and 1/it is -inf,
    as onnxruntime and NumPy's cumsum give) and where `from_negative_zero` asks (a
    ReduceSum over trailing axes, as onnxruntime's); any other sum at +0.0, as
    onnxruntime's sums over leading or middle axes and its exclusive scan (its first
    output is +0.0)."""
    return -0.0 if red.scan == "inclusive" or red.from_negative_zero else 0.0


def _same_field(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is tuple and type(b) is tuple:
        return len(a) == len(b) and all(_same_field(x, y) for x, y in zip(a, b))
    if is_sym(a) or is_sym(b):
        return same(a, b)
    return a == b


def structural(cls: type) -> type:
    """Make a frozen dataclass compare field by field structurally: a symbolic dim equals
    only an identical one (symbolic.same), so comparing or looking up IR records never
    records a guard (symbolic.py). The hash stays the dataclass's (Sym hashes are
    structural too)."""
    names = [f.name for f in dataclasses.fields(cls)]

    def __eq__(self, other: Any) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(_same_field(getattr(self, n), getattr(other, n)) for n in names)

    setattr(cls, "__eq__", __eq__)  # noqa: B010 - mypy refuses assigning to a method
    return cls


def remembers_hash(cls: type) -> type:
    """Make a structural record remember its hash: an expression tree's hash walked the
    whole tree at every lookup (fusion looks reduction phases up by hash). Only the tree
    nodes (Op, Reduction) do: a record hashed once, as most leaves are, paid ~0.3-1 us more
    for the remembering. The hash is dropped when pickled: a str's hash differs between
    processes."""
    field_hash: Callable[[Any], int] = cls.__dict__["__hash__"]  # the dataclass's

    def __hash__(self) -> int:
        d = self.__dict__  # not setattr: the record is frozen
        h = d.get("_hash")
        if h is None:
            h = d["_hash"] = field_hash(self)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    setattr(cls, "__hash__", __hash__)  # noqa: B010 - mypy refuses assigning to a method
    setattr(cls, "__getstate__", __getstate__)  # noqa: B010
    return cls


@structural
@dataclasses.dataclass(frozen=True)
class Affine:
    """const + sum(coeffs[k] * i_k) over the loop indices i_k of a kernel."""

    const: int
    coeffs: tuple[int, ...]

    def __str__(self) -> str:
        terms = [f"{_factor(c)}*i{k}" if not same(c, 1) else f"i{k}"
                 for k, c in enumerate(self.coeffs) if not same(c, 0)]
        if not same(self.const, 0) or not terms:
            terms.append(str(self.const))
        return " + ".join(terms)

    def plus(self, other: Affine, scale: int = 1) -> Affine:
        """self + scale * other."""
        coeffs = tuple(a + scale * b for a, b in zip(self.coeffs, other.coeffs))
        return Affine(self.const + scale * other.const, coeffs)

    def scaled(self, factor: int) -> Affine:
        return Affine(self.const * factor, tuple(c * factor for c in self.coeffs))

    def single(self) -> int | None:
        """The loop dim k when self is exactly i_k + const (coefficient 1), else None."""
        moving = [k for k, c in enumerate(self.coeffs) if not same(c, 0)]
        if len(moving) == 1 and same(self.coeffs[moving[0]], 1):
            return moving[0]
        return None


def _factor(c: Any) -> str:
    """A coefficient as a factor: a symbolic sum in parentheses."""
    text = str(c)
    return f"({text})" if is_sym(c) and len(c.terms) > 1 else text


def unit(k: int, rank: int) -> Affine:
    """The affine form of loop index i_k."""
    return Affine(0, tuple(1 if j == k else 0 for j in range(rank)))


def constant(value: int, rank: int) -> Affine:
    return Affine(value, (0,) * rank)


@structural
@dataclasses.dataclass(frozen=True)
class Load:
    """buf[index + sum(expr * stride for expr, stride in dyn)].

    Each (dim, lo, hi) in clamps first clamps loop index i_dim into [lo, hi]: Concat reads
    each piece at clamped indices so that no lane reads out of bounds (a select keeps only
    the lanes inside the piece). `dyn` holds data-dependent terms (Gather's index times the
    axis stride): their int64 expressions are already clamped into bounds by the lowering,
    and a Check thunk reports out-of-range data before the kernel runs.
    """

    buf: int
    index: Affine
    dtype: str
    clamps: tuple[tuple[int, int, int], ...] = ()
    dyn: tuple[tuple[Any, int], ...] = ()


@structural
@dataclasses.dataclass(frozen=True)
class Const:
    value: Any  # a Python float, int or bool
    dtype: str


@structural
@dataclasses.dataclass(frozen=True)
class Index:
    """The value of an affine index expression, as int64."""

    index: Affine
    dtype: str = "int64"


@remembers_hash
@structural
@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    args: tuple
    dtype: str


@structural
@dataclasses.dataclass(frozen=True)
class Reduced:
    """The result of reduction phase `phase` of the enclosing kernel for this row (in a
    scan kernel: the running value at the current inner point)."""

    phase: int
    dtype: str


Expr = Load | Const | Index | Op | Reduced


@remembers_hash
@structural
@dataclasses.dataclass(frozen=True)
class Reduction:
    """A phase: kind over the inner dims; arg* kinds yield the int64 inner index.

    `scan` ("inclusive" or "exclusive") makes it a running sum/prod over the single inner
    dim, walked backwards when `reverse`; only a kernel's one and only phase may scan.
    """

    kind: str  # one of REDUCTION_KINDS
    expr: Expr
    dtype: str
    scan: str = ""
    reverse: bool = False
    from_negative_zero: bool = False  # a float sum starting at -0.0 (sum_start)


@structural
@dataclasses.dataclass(frozen=True)
class Store:
    buf: int
    index: Affine
    expr: Expr
    per_row: bool = False


@structural
@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    shape: tuple[int, ...]
    n_inner: int
    reductions: tuple[Reduction, ...]
    stores: tuple[Store, ...]
    nodes: tuple[str, ...] = ()  # graph nodes fused into this kernel (for dumps)

    @property
    def work(self) -> int:
        """Loop iterations of one run (a thread-splitting heuristic input)."""
        n = 1
        for d in self.shape:
            n *= d
        return n * (1 + len(self.reductions))

    @property
    def scan(self) -> bool:
        return bool(self.reductions) and bool(self.reductions[0].scan)

    @property
    def empty(self) -> bool:
        """No outer point: nothing to compute. (An empty *inner* extent still runs: the
        reductions give their identities, e.g. ReduceSum over a zero-length axis is 0.)"""
        return any(d == 0 for d in self.shape[:len(self.shape) - self.n_inner])


@structural
@dataclasses.dataclass(frozen=True)
class View:
    """A library operand read or written in place inside a buffer: element (i_0, ...) of
    the operand (of `shape`) lives at buffer element offset + sum(i_k * strides[k]).

    K^T of attention ([B, H, D, S] over the key projection's [B, S, H*D] buffer) is a view,
    so the GEMM reads it where it lies instead of a transposing kernel copying it first.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def __str__(self) -> str:
        return f"view{list(self.shape)} strides {list(self.strides)} + {self.offset}"


@structural
@dataclasses.dataclass(frozen=True)
class LibraryCall:
    """A library op on buffers. `views` (empty, or one entry per input then per output)
    gives the operands read or written in place through strides (None: the buffer itself).

    `epilogue`: an elementwise Kernel applied to the result (a GEMM's bias, activation,
    residual add: kernel/epilogues.py). It reads outputs[0] at its own loop index, nothing
    else reads outputs[0], and its stores are the call's real results; a backend runs it
    as a pass after the library call or inside the call (oneDNN post-ops), when the result
    is still in cache and outputs[0] need not be written at all."""

    op: str
    inputs: tuple[int | None, ...]
    outputs: tuple[int, ...]
    attrs: tuple  # sorted (name, value) pairs
    nodes: tuple[str, ...] = ()
    views: tuple[View | None, ...] = ()
    epilogue: Kernel | None = None

    def view(self, k: int) -> View | None:
        """The view of operand k (inputs first, then outputs), None when it is a buffer."""
        return self.views[k] if k < len(self.views) else None




@structural
@dataclasses.dataclass(frozen=True)
class Check:
    """Every element of integer buffer `buf` lies in [lo, hi] ("range") or is non-zero
    ("nonzero"); otherwise the run raises InvalidInputError with `message`. With
    column = (j, k) only elements j, j + k, j + 2k, ... are checked (GatherND's last dim
    holds k coordinates, each with its own range)."""

    buf: int
    kind: str
    lo: int = 0
    hi: int = 0
    message: str = ""
    nodes: tuple[str, ...] = ()
    column: tuple[int, int] | None = None


Thunk = Kernel | LibraryCall | Check


@structural
@dataclasses.dataclass(frozen=True)
class Buffer:
    id: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str  # "input", "const", "temp", "output"
    slot: int = -1  # memory-plan slot shared by temps with disjoint lifetimes

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclasses.dataclass
class Program:
    buffers: list[Buffer]
    thunks: list[Thunk]
    inputs: list[int]          # buffer id per graph input
    outputs: list[int]         # buffer id per graph output
    notes: list[str] = dataclasses.field(default_factory=list)  # fusion decisions
    constants: dict[int, Any] = dataclasses.field(default_factory=dict)  # const buffer values
    # buffer -> the temp whose memory it views (a Reshape needing no copy)
    aliases: dict[int, int] = dataclasses.field(default_factory=dict)
    # kernel name -> (name of the kernel whose code it runs, its buffers in that code's order)
    sharing: dict[str, tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=dict)
    # decisions lowering made on symbolic dims (symbolic.Guard): where the Program is valid
    guards: tuple = ()


# ---- walking ------------------------------------------------------------------------------

def children(e: Expr) -> tuple:
    """The sub-expressions of e (an Op's args, a Load's data-dependent index terms)."""
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Load) and e.dyn:
        return tuple(x for x, _ in e.dyn)
    return ()


def walk(roots: list) -> list:
    """Every distinct expression reachable from `roots` (by identity), parents first."""
    seen: set[int] = set()
    out = []
    stack = list(roots)
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        stack.extend(children(e))
    return out


def kernel_exprs(k: Kernel) -> list:
    """Every expression of kernel k (phases and stores)."""
    return walk([r.expr for r in k.reductions] + [s.expr for s in k.stores])


def loaded_buffers(k: Kernel) -> set[int]:
    return {e.buf for e in kernel_exprs(k) if isinstance(e, Load)}


def thunk_buffers(t: Thunk) -> tuple[set[int], set[int]]:
    """(buffers read, buffers written) by a thunk (a call's epilogue included)."""
    if isinstance(t, Kernel):
        return loaded_buffers(t), {s.buf for s in t.stores}
    if isinstance(t, Check):
        return {t.buf}, set()
    reads, writes = {b for b in t.inputs if b is not None}, set(t.outputs)
    if t.epilogue is not None:
        reads |= loaded_buffers(t.epilogue) - writes
        writes |= {s.buf for s in t.epilogue.stores}
    return reads, writes


def kernels(thunks: list) -> list[Kernel]:
    """Every Kernel among `thunks`, library calls' epilogues included, in order."""
    out = []
    for t in thunks:
        if isinstance(t, Kernel):
            out.append(t)
        elif isinstance(t, LibraryCall) and t.epilogue is not None:
            out.append(t.epilogue)
    return out


# ---- printing ------------------------------------------------------------------------------

def format_expr(e: Expr, names: dict[int, str] | None = None) -> str:
    """One-line text of an expression."""
    if isinstance(e, Load):
        name = names.get(e.buf, f"b{e.buf}") if names else f"b{e.buf}"
        clamps = "".join(f" | i{d} in [{lo}, {hi}]" for d, lo, hi in e.clamps)
        dyn = "".join(f" + {s}*{format_expr(x, names)}" for x, s in e.dyn)
        return f"{name}[{e.index}{dyn}{clamps}]"
    if isinstance(e, Const):
        return f"{e.value!r}:{e.dtype}"
    if isinstance(e, Index):
        return f"idx({e.index})"
    if isinstance(e, Reduced):
        return f"r{e.phase}"
    args = ", ".join(format_expr(a, names) for a in e.args)
    suffix = f":{e.dtype}" if e.name in ("cast", "cast_sat") else ""
    return f"{e.name}{suffix}({args})"


def format_thunk(t: Thunk, names: dict[int, str] | None = None) -> str:
    """Text of one thunk, several lines for a kernel."""
    def bname(b: int | None) -> str:
        if b is None:
            return "_"
        return names.get(b, f"b{b}") if names else f"b{b}"

    if isinstance(t, LibraryCall):
        ins = ", ".join(bname(b) for b in t.inputs)
        outs = ", ".join(bname(b) for b in t.outputs)
        text = f"library {t.op}({ins}) -> {outs}"
        for k, v in enumerate(t.views):
            if v is not None:
                what = bname(t.inputs[k]) if k < len(t.inputs) else \
                    bname(t.outputs[k - len(t.inputs)])
                text += f" | {what} as {v}"
        text = f"{text}   # nodes: {', '.join(t.nodes)}"
        if t.epilogue is not None:
            text += "\n" + "\n".join("  " + line for line in
                                     format_thunk(t.epilogue, names).splitlines())
            text = text.replace("\n  kernel ", "\n  epilogue kernel ", 1)
        return text
    if isinstance(t, Check):
        what = f"in [{t.lo}, {t.hi}]" if t.kind == "range" else "non-zero"
        return f"check {bname(t.buf)} {what}   # nodes: {', '.join(t.nodes)}"
    outer = list(t.shape[:len(t.shape) - t.n_inner])
    inner = list(t.shape[len(t.shape) - t.n_inner:])
    dom = f"{outer} | {inner}" if t.n_inner else f"{list(t.shape)}"
    lines = [f"kernel {t.name} {dom}   # nodes: {', '.join(t.nodes)}"]
    for k, r in enumerate(t.reductions):
        scan = f" {r.scan} scan{' reversed' if r.reverse else ''}" if r.scan else ""
        lines.append(f"  r{k} = {r.kind}:{r.dtype}({format_expr(r.expr, names)}){scan}")
    for s in t.stores:
        where = "per row " if s.per_row else ""
        lines.append(f"  {where}{bname(s.buf)}[{s.index}] = {format_expr(s.expr, names)}")
    return "\n".join(lines)


def format_program(p: Program) -> str:
    """The `.kernels.txt` dump: buffers, thunks, code sharing and fusion notes."""
    names = {b.id: b.name for b in p.buffers}
    lines = ["buffers:"]
    for b in p.buffers:
        slot = f" slot {b.slot}" if b.slot >= 0 else ""
        lines.append(f"  b{b.id} {b.name}: {b.dtype}{list(b.shape)} {b.role}{slot}")
    lines.append(f"thunks ({len(p.thunks)}):")
    lines += [format_thunk(t, names) for t in p.thunks]
    shared = [f"  {k} runs {fn}'s code" for k, (fn, _) in p.sharing.items() if fn != k]
    if shared:
        lines.append("code sharing:")
        lines += shared
    if p.notes:
        lines.append("fusion decisions:")
        lines += [f"  {n}" for n in p.notes]
    return "\n".join(lines) + "\n"


# ---- loop-nest simplification -------------------------------------------------------------

def _affines(k: Kernel) -> list[Affine]:
    out = [s.index for s in k.stores]
    for e in kernel_exprs(k):
        if isinstance(e, (Load, Index)):
            out.append(e.index)
            # a clamped loop dim must stay its own dim: a unit map keeps collapse off it
            out.extend(unit(d, len(e.index.coeffs)) for d, _, _ in getattr(e, "clamps", ()))
    return out


def _rewrite(k: Kernel, leaf: Callable[[Any, tuple], Any],
             store: Callable[[Store, Any], Store]) -> Kernel:
    """Kernel k with every Load and Index e replaced by leaf(e, e's rewritten dyn terms)
    and every Store s by store(s, its rewritten expression); shared subtrees stay shared."""
    memo: dict[int, Any] = {}

    def expr(e):
        key = id(e)
        if key not in memo:
            if isinstance(e, Load):
                memo[key] = leaf(e, tuple((expr(x), s) for x, s in e.dyn))
            elif isinstance(e, Index):
                memo[key] = leaf(e, ())
            elif isinstance(e, Op):
                memo[key] = dataclasses.replace(e, args=tuple(expr(a) for a in e.args))
            else:
                memo[key] = e
        return memo[key]

    reds = tuple(dataclasses.replace(r, expr=expr(r.expr)) for r in k.reductions)
    return dataclasses.replace(k, reductions=reds,
                               stores=tuple(store(s, expr(s.expr)) for s in k.stores))


def remap(k: Kernel, fn, dim_fn=None) -> Kernel:
    """Apply fn(Affine) -> Affine to every index of kernel k, dim_fn(dim) to clamped dims."""

    def leaf(e, dyn):
        if isinstance(e, Index):
            return dataclasses.replace(e, index=fn(e.index))
        clamps, index = e.clamps, fn(e.index)
        if clamps and dim_fn is not None:
            moved = [(dim_fn(d), lo, hi) for d, lo, hi in e.clamps]
            clamps = tuple(c for c in moved if c[0] is not None)
            # a dropped dim (size 1: its index is 0) keeps its clamp as a constant: an
            # edge Pad's column read through a one-column slice is clamp(0)
            shift = sum(e.index.coeffs[d] * min(max(0, lo), hi)
                        for (d, lo, hi), (m, _, _) in zip(e.clamps, moved) if m is None)
            index = Affine(index.const + shift, index.coeffs)
        return dataclasses.replace(e, index=index, clamps=clamps, dyn=dyn)

    return _rewrite(k, leaf, lambda s, e: dataclasses.replace(s, index=fn(s.index), expr=e))


def rename_buffers(t: Thunk, new: dict[int, int]) -> Thunk:
    """Thunk t with every buffer id b replaced by new[b] (a call's epilogue included)."""
    if isinstance(t, Check):
        return dataclasses.replace(t, buf=new[t.buf])
    if isinstance(t, LibraryCall):
        epi = None if t.epilogue is None else _renamed_kernel(t.epilogue, new)
        return dataclasses.replace(t, inputs=tuple(None if b is None else new[b]
                                                   for b in t.inputs),
                                   outputs=tuple(new[b] for b in t.outputs), epilogue=epi)
    return _renamed_kernel(t, new)


def _renamed_kernel(k: Kernel, new: dict[int, int]) -> Kernel:
    return _rewrite(k, lambda e, dyn: e if isinstance(e, Index) else
                    dataclasses.replace(e, buf=new[e.buf], dyn=dyn),
                    lambda s, e: dataclasses.replace(s, buf=new[s.buf], expr=e))


def dense(p: Program) -> Program:
    """p with buffer ids 0..n-1 in its buffers' order (executables index buffers densely;
    fusion leaves an id out where it named a buffer no thunk uses: fuzz 114/2750)."""
    new = {b.id: i for i, b in enumerate(p.buffers)}
    if all(old == i for old, i in new.items()):
        return p
    return dataclasses.replace(
        p, buffers=[dataclasses.replace(b, id=new[b.id]) for b in p.buffers],
        thunks=[rename_buffers(t, new) for t in p.thunks], inputs=[new[b] for b in p.inputs],
        outputs=[new[b] for b in p.outputs],
        constants={new[b]: v for b, v in p.constants.items()},
        aliases={new[a]: new[b] for a, b in p.aliases.items()},
        sharing={k: (c, tuple(new[b] for b in ids)) for k, (c, ids) in p.sharing.items()})


def collapse(k: Kernel) -> Kernel:
    """Merge adjacent loop dims that every index map walks contiguously, drop size-1 dims.

    [64, 1024] with all maps 1024*i0 + i1 -> [65536] with i0. Outer and inner dims are
    merged separately; at least one outer dim is kept (threads split it).
    """
    shape, n_inner = list(k.shape), k.n_inner
    affs = _affines(k)
    dims = list(range(len(shape)))  # surviving dims, as positions in the original nest
    groups: list[list[int]] = []
    for d in dims:
        inner = d >= len(shape) - n_inner
        if groups:
            prev = groups[-1][-1]
            same_part = (prev >= len(shape) - n_inner) == inner
            # structural (no guard on symbolic dims): not merging is always correct
            if same_part and all(same(a.coeffs[prev], a.coeffs[d] * shape[d]) for a in affs):
                groups[-1].append(d)
                continue
        groups.append([d])
    n_outer_groups = sum(1 for g in groups if g[0] < len(shape) - n_inner)
    new_shape = [_prod(shape[d] for d in g) for g in groups]
    keep = [i for i in range(len(groups)) if new_shape[i] != 1]
    new_inner = sum(1 for i in keep if i >= n_outer_groups)

    def fn(a: Affine) -> Affine:
        return Affine(a.const, tuple(a.coeffs[groups[i][-1]] for i in keep))

    def dim_fn(d: int) -> int | None:  # a clamped dim is a group of its own (see _affines)
        g = next(i for i, grp in enumerate(groups) if d in grp)
        # a dropped size-1 dim: remap folds its clamp into the index constant
        return keep.index(g) if g in keep else None

    out = remap(k, fn, dim_fn)
    final_shape = tuple(new_shape[i] for i in keep)
    if len(final_shape) == new_inner:  # no outer dim: add one of size 1
        out = remap(out, lambda a: Affine(a.const, (0,) + a.coeffs), lambda d: d + 1)
        final_shape = (1,) + final_shape
    return dataclasses.replace(out, shape=final_shape, n_inner=new_inner)


def _prod(it) -> int:
    n = 1
    for x in it:
        n *= x
    return n


# ---- symbolic dims ---------------------------------------------------------------------------

def instantiate(program: Program, env: dict[str, int]) -> Program:
    """`program` at concrete values of its symbolic dims, for running it: buffers, checks,
    library calls and constants get ints; kernels only their loop extents (their code
    reads the dims at run time, so their expressions stay symbolic)."""
    memo: dict[int, Any] = {}
    thunks = [dataclasses.replace(t, shape=substitute(t.shape, env, memo))
              if isinstance(t, Kernel) else substitute(t, env, memo) for t in program.thunks]
    return dataclasses.replace(program, buffers=substitute(program.buffers, env, memo),
                               thunks=thunks,
                               constants=substitute(program.constants, env, memo))


def add_check(thunks: list[Thunk], checked: dict[tuple, int], c: Check) -> None:
    """Append Check c unless the same check of the same buffer ran already.

    A buffer is written once, before its first check, and stays live until its last
    reader, so a second identical check cannot fail where the first passed (a Gather
    recomputed in several kernels, e.g. GPT-2's embedding in each layer's LayerNorm, was
    checked once per kernel). The first check keeps its message; it names every node.
    """
    key = (c.buf, c.kind, c.lo, c.hi, c.column)
    at = checked.get(key)
    if at is None:
        checked[key] = len(thunks)
        thunks.append(c)
        return
    first = thunks[at]
    new_nodes = tuple(n for n in c.nodes if n not in first.nodes)
    if new_nodes:
        thunks[at] = dataclasses.replace(first, nodes=first.nodes + new_nodes)
