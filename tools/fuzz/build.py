"""The graph builder the fuzzer's emitters share: values, nodes, operand choice, a profile.

A `Profile` fixes what one case may contain (opset, main float dtype, value regime,
zero-size dims, feeds that make onnxruntime raise, emitter groups); a `Builder`
accumulates nodes, inputs, initializers and feeds, and tracks every value's concrete
shape and how many roundings separate it from exact data (`Val.rounding`), so that
rounding-sensitive consumers (Floor, Cast to int, comparisons, ArgMax) only read values
whose expected result does not depend on legal last-ulp differences such as FMA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx
from autoclust.tools.fuzz import values as fuzz_values
from onnx import TensorProto, helper

from autoclust import ops

F16 = np.dtype("float16")
F32 = np.dtype("float32")
F64 = np.dtype("float64")
I32 = np.dtype("int32")
I64 = np.dtype("int64")
BOOL = np.dtype("bool")
ELEM = {F16: TensorProto.FLOAT16, F32: TensorProto.FLOAT, F64: TensorProto.DOUBLE,
        I32: TensorProto.INT32, I64: TensorProto.INT64, BOOL: TensorProto.BOOL}

# Profile switches and emitter groups; a case draws its profile within a feature set.
GROUPS = ("core", "reduce", "index", "int", "round", "export", "optional", "ops")
SWITCHES = ("f16", "wide", "special", "empty", "errors")
ALL = frozenset(GROUPS + SWITCHES)
CLASSIC = frozenset({"core"})
# Named feature sets (`autoclust fuzz --features values`), one per family of edge cases.
PRESETS = {
    "all": ALL, "classic": CLASSIC,
    "values": frozenset({"core", "wide", "special", "f16"}),  # 1e20, denormals, inf/NaN
    "empty": frozenset({"core", "reduce", "empty"}),          # zero-size dims
    "index": frozenset({"core", "index", "export"}),          # Gather, Pad, Split, ...
    "int": frozenset({"int", "errors"}),                      # Div/Mod, raising feeds
    "round": frozenset({"round", "f16"}),                     # float16 rounding
    # missing optional inputs, alpha/beta 0, signed zeros, indices longer than data
    "optional": frozenset({"core", "optional", "special", "errors", "empty"}),
    # the op table's ops no other group generates: pools, scatters, Einsum, ...
    "ops": frozenset({"core", "ops", "wide", "special", "f16"}),
}
OPSETS = (13, 17, 21)

# Ops whose result is the correctly rounded value of exact operands (or a copy): a chain
# of them from graph inputs has one legal answer. MatMul, reductions and math functions
# do not (summation order, FMA contraction, libm accuracy).
# (OpDef.exact in the op table.)
ROUNDS_ONCE = frozenset(d.op for d in ops.all_ops() if d.exact == "rounded")
EXACT = frozenset(d.op for d in ops.all_ops() if d.exact == "copy")
INEXACT = 99

# Ops onnxruntime's CPU provider has no float16 kernel for, and the first opset of ops
# newer than 13 (probed against onnxruntime 1.32).
NO_F16 = frozenset({"Celu", "Range", "IsInf"})
FIRST_OPSET = {"Trilu": 14, "HardSwish": 14, "Mish": 18, "Gelu": 20,
               "LayerNormalization": 17, "GroupNormalization": 21, "CumSum16": 14}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one case may contain."""

    opset: int = 17
    float_dtype: np.dtype = F32
    regime: str = "normal"     # fuzz_values regime of float inputs
    empty: bool = False        # zero-size dims in random shapes
    errors: bool = False       # feeds that make onnxruntime raise (zero divisors, bad indices)
    groups: frozenset = CLASSIC


def features_from(text: str) -> frozenset:
    """A preset name or a comma-separated list of groups and switches."""
    out: set[str] = set()
    for word in text.split(","):
        word = word.strip()
        if word not in PRESETS and word not in ALL:
            raise ValueError(f"unknown fuzz feature {word!r}; presets: "
                             f"{', '.join(PRESETS)}; features: {', '.join(sorted(ALL))}")
        out |= PRESETS.get(word, {word})
    return frozenset(out)


def draw_profile(rng: np.random.Generator, features: frozenset = ALL) -> Profile:
    """A random profile allowed by `features` (groups and switches, see ALL)."""
    regimes = ["normal"] + [r for r in ("wide", "special") if r in features]
    regime = regimes[0] if rng.random() < 0.45 else str(rng.choice(regimes))
    groups = frozenset(g for g in GROUPS if g in features) or CLASSIC
    return Profile(opset=int(rng.choice(OPSETS)),
                   float_dtype=F16 if "f16" in features and rng.random() < 0.3 else F32,
                   regime=regime, empty="empty" in features and rng.random() < 0.35,
                   errors="errors" in features and rng.random() < 0.2, groups=groups)


@dataclasses.dataclass
class Val:
    """A tensor of the graph being built, with its concrete shape."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    dynamic: bool = False  # shape depends on data (NonZero): only value-only chains use it
    no_ties: bool = False  # a graph input of random floats: TopK indices are well defined
    rounding: int = 0      # roundings since exact data (INEXACT: not a correctly rounded op)


@dataclasses.dataclass
class Case:
    """One generated graph with its feeds and the seed it came from."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    seed: tuple[int, ...] = ()
    profile: Profile | None = None
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # outputs'


def bshape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast shape of `shapes`."""
    return tuple(np.broadcast_shapes(*shapes))


def size(shape: tuple[int, ...]) -> int:
    """Number of elements of `shape`."""
    return int(np.prod(shape, dtype=np.int64))


class Builder:
    """Accumulates nodes, inputs, initializers and feeds of one random graph."""

    def __init__(self, rng: np.random.Generator, profile: Profile | int = 17):
        self.rng = rng
        self.profile = profile if isinstance(profile, Profile) else Profile(opset=profile)
        self.opset = self.profile.opset
        self.fdt = np.dtype(self.profile.float_dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[Val] = []
        self.inits: list[onnx.TensorProto] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.pool: list[Val] = []
        self.vals: dict[str, Val] = {}
        self.used: set[str] = set()
        self.batch = int(rng.integers(1, 5))
        self.symbolic_batch = bool(rng.random() < 0.3)
        self._count = 0

    # ---- what this case may use -------------------------------------------------------
    def has(self, op: str, dtype: np.dtype | None = None) -> bool:
        """True when onnxruntime runs `op` at this opset (and for `dtype`)."""
        f16 = dtype is not None and np.dtype(dtype) == F16
        if f16 and (op in NO_F16 or (op == "CumSum" and self.opset < 14)):
            return False
        return self.opset >= FIRST_OPSET.get(op, 0)

    # ---- names, values, nodes ---------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def new_input(self, shape: tuple[int, ...], dtype: np.dtype | None = None,
                  values: np.ndarray | None = None) -> Val:
        """A new graph input fed with `values`, else random data of the case's regime."""
        dtype = np.dtype(dtype or self.fdt)
        if values is None:
            if dtype.kind == "f":
                values = fuzz_values.floats(self.rng, shape, dtype, self.profile.regime)
            elif dtype == BOOL:
                values = self.rng.random(shape) < 0.5
            else:
                values = fuzz_values.integers(self.rng, shape, dtype, -20, 21)
        v = Val(self.fresh("in"), dtype, tuple(shape),
                no_ties=dtype.kind == "f" and self.profile.regime == "normal")
        self.feeds[v.name] = np.asarray(values, dtype)
        self.inputs.append(v)
        self._add(v)
        return v

    def const(self, array: np.ndarray | list | float, dtype: np.dtype | None = None) -> str:
        """A new initializer; returns its name."""
        arr = np.asarray(array, dtype=dtype)
        name = self.fresh("c")
        self.inits.append(onnx.numpy_helper.from_array(arr, name))
        return name

    def const_val(self, array: np.ndarray | list | float, dtype: np.dtype | None = None) -> Val:
        """A new initializer as an operand (not added to the pool)."""
        arr = np.asarray(array, dtype=dtype)
        return Val(self.const(arr), arr.dtype, arr.shape)

    def weight(self, shape: tuple[int, ...], scale: float = 1.0,
               dtype: np.dtype | None = None) -> Val:
        """A random float initializer usable as an operand."""
        arr = (self.rng.standard_normal(shape) * scale).astype(dtype or self.fdt)
        return Val(self.const(arr), arr.dtype, tuple(shape))

    def node(self, op: str, inputs: list[str], outs: list[tuple[np.dtype, tuple]],
             **attrs: object) -> list[Val]:
        """Append a node; `outs` gives each output's dtype and concrete shape."""
        names = [self.fresh(op.lower() + "_") for _ in outs]
        self.nodes.append(helper.make_node(op, inputs, names, name=self.fresh("n"), **attrs))
        self.used.update(i for i in inputs if i)
        rounding = self._rounding(op, inputs)
        vals = [Val(n, np.dtype(d), tuple(s), rounding=rounding)
                for n, (d, s) in zip(names, outs)]
        for v in vals:
            self._add(v)
        return vals

    def _add(self, v: Val) -> None:
        self.pool.append(v)
        self.vals[v.name] = v

    def _rounding(self, op: str, inputs: list[str]) -> int:
        # Initializers and graph inputs are exact; index and shape inputs do not count.
        ins = [self.vals[i].rounding for i in inputs if i in self.vals
               and self.vals[i].dtype.kind == "f"]
        base = max(ins, default=0)
        if op in EXACT or op == "Cast":
            return base
        return base + 1 if op in ROUNDS_ONCE else INEXACT

    # ---- operand choice ---------------------------------------------------------------
    def dim(self, lo: int = 1, hi: int = 6) -> int:
        """A random dim; 0 now and then when the profile allows zero-size tensors."""
        if self.profile.empty and self.rng.random() < 0.12:
            return 0
        return int(self.rng.integers(lo, hi))

    def random_shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = int(self.rng.integers(0, 5)) if rank is None else rank
        dims = [self.dim() for _ in range(rank)]
        if rank and self.rng.random() < 0.6:
            dims[0] = self.batch
        return tuple(dims)

    def pick(self, ok: Callable[[Val], bool] = lambda v: True,
             dtype: np.dtype | None = None) -> Val:
        """A value from the pool (recent ones likelier), or a new input when none fits."""
        dtype = np.dtype(dtype or self.fdt)
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
        """An operand of a's dtype that broadcasts with `a` (same shape, sub-shape, 1-dims)."""
        r = self.rng.random()
        if r < 0.3:
            same = [v for v in self.pool if v.shape == a.shape and v.dtype == a.dtype
                    and not v.dynamic and v.name != a.name]
            if same:
                return same[int(self.rng.integers(len(same)))]
        shape = list(a.shape)
        if shape and self.rng.random() < 0.5:
            shape = shape[int(self.rng.integers(0, len(shape) + 1)):]
        shape = [1 if self.rng.random() < 0.3 else d for d in shape]
        if len(shape) == len(a.shape) < 4 and self.rng.random() < 0.15:
            shape.insert(0, int(self.rng.integers(1, 3)))
        if self.rng.random() < 0.5 and a.dtype.kind == "f":
            return self.weight(tuple(shape), dtype=a.dtype)
        return self.new_input(tuple(shape), a.dtype)

    def safe_positive(self, a: Val, offset: float) -> Val:
        """|a| + offset: an operand for Log, Sqrt, Div and Reciprocal."""
        (ab,) = self.node("Abs", [a.name], [(a.dtype, a.shape)])
        if offset == 0.0:
            return ab
        c = self.const(np.array(offset, a.dtype))
        return self.node("Add", [ab.name, c], [(a.dtype, a.shape)])[0]


def value_info(b: Builder, v: Val, output: bool) -> onnx.ValueInfoProto:
    """A graph input (with a symbolic batch dim now and then) or output declaration."""
    if output:
        dims: list = [None] * len(v.shape)
    else:
        dims = ["batch" if b.symbolic_batch and i == 0 and d == b.batch else d
                for i, d in enumerate(v.shape)]
    return helper.make_tensor_value_info(v.name, ELEM[v.dtype], dims)


def outputs(b: Builder) -> list[Val]:
    """The graph outputs: every produced value nothing uses."""
    inputs = {v.name for v in b.inputs}
    return [v for v in b.pool if v.name not in inputs and v.name not in b.used]


def assemble(b: Builder) -> onnx.ModelProto:
    """The ModelProto of everything built: unused produced values become outputs."""
    outs = outputs(b)
    graph = helper.make_graph(b.nodes, "fuzz", [value_info(b, v, False) for v in b.inputs],
                              [value_info(b, v, True) for v in outs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)],
                              producer_name="autoclust-fuzz")
    model.ir_version = 10
    return model
