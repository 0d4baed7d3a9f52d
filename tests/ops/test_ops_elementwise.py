"""Elementwise ops of the table: NumPy reference and infer rule against onnxruntime.

One table of specs; every spec expands into cases (random, broadcast, 0-d, size-1, empty,
NaN/inf, extra dtypes), each run through check_op. Semantics that onnxruntime defines in
its own way (integer Div/Mod, Pow with mixed dtypes, Cast truncation, Clip with lo > hi)
have their own tests below.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from support.op_harness import check_op

from autoclust import ops
from autoclust.errors import ShapeInferenceError
from autoclust.ops import InferContext

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, 30.0, -30.0, 100.0, -100.0])


@dataclasses.dataclass(frozen=True)
class Spec:
    op: str
    arity: int = 1
    lo: float = -3.0
    hi: float = 3.0
    dtypes: tuple[str, ...] = ()      # tested besides `base`
    base: str = "float32"
    attrs: tuple[tuple[str, object], ...] = ()
    opset: int = 18
    special: bool = True              # run the NaN/inf case
    nonzero: bool = False             # integer divisors: no zeros
    hi1: float | None = None          # range of input 1 when it differs (Pow exponents)
    lo1: float | None = None


F = ("float64", "float16")
INTS = ("int32", "int64")
SPECS = [
    Spec("Neg", dtypes=F + INTS),
    Spec("Abs", dtypes=F + INTS + ("int8",)),
    Spec("Sign", dtypes=F + INTS),
    Spec("Reciprocal", dtypes=F),
    Spec("Sqrt", lo=0, hi=9, dtypes=F),
    Spec("Exp", dtypes=F),
    Spec("Log", lo=0.01, hi=9, dtypes=F),
    Spec("Floor", dtypes=F),
    Spec("Ceil", dtypes=F),
    Spec("Round", dtypes=F),
    Spec("Erf", dtypes=("float16",)),
    Spec("Tanh", dtypes=F),
    Spec("Sin", dtypes=F),
    Spec("Cos", dtypes=F),
    Spec("Tan", lo=-1.2, hi=1.2, dtypes=("float16",)),
    Spec("Asin", lo=-1, hi=1, dtypes=("float16",)),
    Spec("Acos", lo=-1, hi=1),
    Spec("Atan"),
    Spec("Sinh"),
    Spec("Cosh"),
    Spec("Asinh"),
    Spec("Acosh", lo=1, hi=5, dtypes=("float16",)),
    Spec("Atanh", lo=-0.95, hi=0.95),
    Spec("IsNaN", dtypes=F),
    Spec("IsInf", dtypes=("float64",)),
    Spec("Not", base="bool", special=False),
    Spec("BitwiseNot", base="int32", dtypes=("int64", "uint8"), special=False),
    # activations
    Spec("Relu", dtypes=F + INTS + ("int8",)),
    Spec("LeakyRelu", dtypes=F, attrs=(("alpha", 0.1),)),
    Spec("Elu", dtypes=F),
    Spec("Selu", dtypes=F),
    Spec("Celu", attrs=(("alpha", 1.5),)),
    Spec("Gelu", dtypes=("float16",), opset=20),
    Spec("Sigmoid", dtypes=F),
    Spec("HardSigmoid", dtypes=F, attrs=(("alpha", 0.3), ("beta", 0.4))),
    Spec("HardSwish", dtypes=F),
    Spec("Softplus", dtypes=F),
    Spec("Softsign", dtypes=F),
    Spec("Mish", dtypes=F),
    Spec("ThresholdedRelu", dtypes=F, attrs=(("alpha", 0.5),)),
    Spec("Shrink", dtypes=F + INTS, attrs=(("bias", 1.5), ("lambd", 0.5))),
    # binary
    Spec("Add", 2, dtypes=F + INTS + ("uint8",)),
    Spec("Sub", 2, dtypes=F + INTS),
    Spec("Mul", 2, dtypes=F + INTS),
    Spec("Div", 2, dtypes=F + INTS, nonzero=True),
    Spec("Pow", 2, lo=0.1, hi=3, lo1=-2, hi1=3, dtypes=("float64",) + INTS),
    Spec("Mod", 2, dtypes=F + INTS, attrs=(("fmod", 1),), nonzero=True),
    Spec("Max", 2, dtypes=F + INTS + ("uint8",)),
    Spec("Min", 2, dtypes=F + INTS + ("uint8",)),
    Spec("Sum", 2, dtypes=F),
    Spec("Mean", 2, dtypes=("float16",)),
    Spec("Equal", 2, dtypes=F + INTS + ("bool",)),
    Spec("Less", 2, dtypes=F + INTS),
    Spec("Greater", 2, dtypes=F + INTS),
    Spec("LessOrEqual", 2, dtypes=F + INTS),
    Spec("GreaterOrEqual", 2, dtypes=F + INTS),
    Spec("And", 2, base="bool", special=False),
    Spec("Or", 2, base="bool", special=False),
    Spec("Xor", 2, base="bool", special=False),
    Spec("BitwiseAnd", 2, base="int32", dtypes=("int64", "uint8"), special=False),
    Spec("BitwiseOr", 2, base="int32", dtypes=("int64", "uint8"), special=False),
    Spec("BitwiseXor", 2, base="int32", dtypes=("int64", "int8"), special=False),
    Spec("PRelu", 2, dtypes=F + INTS),
]

# shapes per case and arity; PRelu's slope must broadcast *to* X, so it keeps its own.
SHAPES = {
    "random": {1: [(2, 3, 4)], 2: [(2, 3, 4), (2, 3, 4)]},
    "broadcast": {2: [(3, 1, 5), (4, 5)]},
    "scalar": {1: [()], 2: [(), ()]},
    "scalar_tensor": {2: [(), (2, 3)]},
    "size1": {1: [(1,)], 2: [(1,), (1, 1)]},
    "empty": {1: [(0, 3)], 2: [(0, 3), (3,)]},
}
PRELU_SHAPES = {"broadcast": [(3, 4, 5), (4, 5)], "scalar_tensor": [(2, 3), ()],
                "size1": [(1,), (1,)], "empty": [(0, 3), (3,)]}


def rng_for(*key: object) -> np.random.Generator:
    """A generator seeded by the test case, so every case is reproducible on its own."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def rand(rng: np.random.Generator, shape: tuple, dtype: str, lo: float, hi: float) -> np.ndarray:
    """Random values of `dtype` in [lo, hi] (integers: rounded bounds, unsigned from 0)."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if dt.kind in "iu":
        lo = max(int(np.floor(lo)), 0) if dt.kind == "u" else int(np.floor(lo))
        return rng.integers(lo, int(np.ceil(hi)) + 1, shape).astype(dt)
    return rng.uniform(lo, hi, shape).astype(dt)


def spec_inputs(spec: Spec, case: str, dtype: str) -> list[np.ndarray]:
    """The inputs of one case of `spec`."""
    rng = rng_for(spec.op, case, dtype)
    if case == "special":
        if spec.arity == 1:
            return [SPECIAL.astype(dtype)]
        if spec.op == "PRelu":
            return [SPECIAL.astype(dtype), SPECIAL[::-1].astype(dtype)]
        return [SPECIAL[:, None].astype(dtype), SPECIAL[None, :].astype(dtype)]
    key = "random" if case.startswith("dtype") else case
    shapes = (PRELU_SHAPES.get(key) if spec.op == "PRelu" else None) or SHAPES[key][spec.arity]
    xs = [rand(rng, shapes[0], dtype, spec.lo, spec.hi)]
    if spec.arity == 2:
        lo = spec.lo if spec.lo1 is None else spec.lo1
        hi = spec.hi if spec.hi1 is None else spec.hi1
        if np.dtype(dtype).kind in "iu" and spec.op == "Pow":
            lo = 0  # a negative integer exponent truncates to 0 or 1; tested on its own
        b = rand(rng, shapes[1], dtype, lo, hi)
        if spec.nonzero and b.dtype.kind in "iu":
            b[b == 0] = 1
        xs.append(b)
    return xs


def tolerance(dtype: str) -> dict:
    """check_op tolerances: float16 results may differ from onnxruntime by an ulp or two."""
    return {"rtol": 2e-3, "atol": 2e-3} if dtype == "float16" else {"rtol": 1e-5, "atol": 1e-6}


def expand(specs: list[Spec]) -> list:
    """Cases of every spec as pytest params."""
    params = []
    for s in specs:
        cases = [c for c in SHAPES if s.arity in SHAPES[c]
                 or (s.op == "PRelu" and c in PRELU_SHAPES)]
        cases += ["special"] if s.special else []
        for case in cases:
            params.append(pytest.param(s, case, s.base, id=f"{s.op}-{case}"))
        for dt in s.dtypes:
            params.append(pytest.param(s, f"dtype_{dt}", dt, id=f"{s.op}-{dt}"))
    return params


@pytest.mark.parametrize("spec,case,dtype", expand(SPECS))
def test_op_table(spec: Spec, case: str, dtype: str) -> None:
    inputs = spec_inputs(spec, case, dtype)
    check_op(spec.op, inputs, dict(spec.attrs), opset=spec.opset, **tolerance(dtype))


# ---- semantics onnxruntime defines its own way ----------------------------------------------

SIGNS = (np.array([-7, 7, -7, 7, 0, -1, 6]), np.array([2, 2, -2, -2, 3, 5, -3]))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_integer_div_truncates(dtype: str) -> None:
    got = check_op("Div", [SIGNS[0].astype(dtype), SIGNS[1].astype(dtype)])
    np.testing.assert_array_equal(got[0], [-3, 3, 3, -3, 0, 0, -2])


@pytest.mark.parametrize("dtype", ["int32", "int64", "int16"])
@pytest.mark.parametrize("fmod", [0, 1])
def test_integer_mod(dtype: str, fmod: int) -> None:
    got = check_op("Mod", [SIGNS[0].astype(dtype), SIGNS[1].astype(dtype)], {"fmod": fmod})
    want = [-1, 1, -1, 1, 0, -1, 0] if fmod else [1, 1, -1, -1, 0, 4, 0]
    np.testing.assert_array_equal(got[0], want)


def test_float_mod_fmod() -> None:
    a = np.array([-7.5, 7.5, -7.0, 7.0, np.inf, 1.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 2.0, np.inf], np.float32)
    check_op("Mod", [a, b], {"fmod": 1})


@pytest.mark.parametrize("base,exp", [
    ("int32", "float32"), ("int64", "float64"), ("float32", "int32"), ("float32", "int64"),
    ("float32", "float64"), ("float16", "float32"), ("float32", "float16"), ("int64", "int64"),
])
def test_pow_mixed_dtypes(base: str, exp: str) -> None:
    a = np.array([2, 3, 5, 7, 1, 4], base)
    b = np.array([0.5, 2.5, 2, 3, 7, 0.25] if np.dtype(exp).kind == "f" else [0, 2, 2, 3, 7, 1],
                 exp)
    got = check_op("Pow", [a, b], **tolerance("float16" if "float16" in (base, exp) else ""))
    assert got[0].dtype == np.dtype(base)


def test_pow_negative_integer_exponent() -> None:
    got = check_op("Pow", [np.array([2, 3, 1, -1], np.int32), np.array([-1, -2, -3, -3],
                                                                        np.int32)])
    np.testing.assert_array_equal(got[0], [0, 0, 1, -1])


def test_round_half_to_even() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, np.nan], np.float32)
    got = check_op("Round", [x])
    np.testing.assert_array_equal(got[0], [0, 2, 2, -0.0, -2, -2, 3, np.nan])


@pytest.mark.parametrize("neg,pos", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf_attrs(neg: int, pos: int) -> None:
    got = check_op("IsInf", [SPECIAL.astype(np.float32)],
                   {"detect_negative": neg, "detect_positive": pos})
    assert got[0].sum() == neg + pos


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gelu(approximate: str, dtype: str) -> None:
    x = np.concatenate([SPECIAL, np.linspace(-6, 6, 49)]).astype(dtype)
    check_op("Gelu", [x], {"approximate": approximate}, opset=20, **tolerance(dtype))


@pytest.mark.parametrize("dtype", ["uint8", "uint32", "uint64"])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift(dtype: str, direction: str) -> None:
    bits = np.dtype(dtype).itemsize * 8
    rng = rng_for("BitShift", dtype, direction)
    x = rng.integers(0, 2 ** min(bits, 62), (3, 4), dtype=np.uint64).astype(dtype)
    check_op("BitShift", [x, np.arange(4).astype(dtype) * (bits // 8)],
             {"direction": direction})
    check_op("BitShift", [x, np.array(bits - 1, dtype)], {"direction": direction})


VARIADIC_SHAPES = [[(2, 3)], [(3, 1, 5), (4, 5)], [(3, 1, 5), (4, 5), (1,)],
                   [(), (2, 3), (1, 3)], [(0, 3), (3,), ()]]


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("shapes", VARIADIC_SHAPES, ids=lambda s: str(len(s)) + "in")
def test_variadic(op: str, shapes: list) -> None:
    rng = rng_for(op, shapes)
    xs = [rand(rng, s, "float32", -3, 3) for s in shapes]
    check_op(op, xs)


@pytest.mark.parametrize("op", ["Max", "Min"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float16"])
def test_variadic_dtypes(op: str, dtype: str) -> None:
    rng = rng_for(op, dtype)
    check_op(op, [rand(rng, (3, 4), dtype, -9, 9) for _ in range(3)], **tolerance(dtype))


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic_nan(op: str) -> None:
    a = SPECIAL.astype(np.float32)
    check_op(op, [a, a[::-1].copy(), np.zeros_like(a)])


CAST_PAIRS = [
    ("float32", "int32"), ("float32", "int64"), ("float32", "int8"), ("float64", "int32"),
    ("float32", "float16"), ("float64", "float32"), ("float16", "float64"), ("float32", "bool"),
    ("int32", "float32"), ("int64", "float16"), ("int32", "int8"), ("int64", "uint8"),
    ("bool", "float32"), ("bool", "int64"), ("int8", "bool"), ("uint8", "int32"),
    ("float32", "float32"),
]


@pytest.mark.parametrize("src,dst", CAST_PAIRS)
def test_cast(src: str, dst: str) -> None:
    from onnx import helper
    to = helper.np_dtype_to_tensor_dtype(np.dtype(dst))
    dst_dt = np.dtype(dst)
    lo, hi = (-100, 100)
    if dst_dt.kind in "iu" and np.dtype(src).kind == "f":
        # float -> int truncates toward zero; out-of-range values are undefined behaviour
        lo, hi = (0, 250) if dst_dt.kind == "u" else (-100, 100)
    x = rand(rng_for("Cast", src, dst), (3, 5), src, lo, hi)
    if np.dtype(src).kind == "f":
        x = x + np.asarray(0.5, src)  # fractional parts reach the truncation
    check_op("Cast", [x], {"to": to})
    check_op("Cast", [x[:0]], {"to": to})


def test_cast_special_floats() -> None:
    x = SPECIAL.astype(np.float64)
    check_op("Cast", [x], {"to": 1})   # float64 -> float32 keeps NaN/inf
    check_op("Cast", [x], {"to": 10})  # -> float16
    check_op("Cast", [x], {"to": 9})   # -> bool: NaN is true


@pytest.mark.parametrize("src,like", [("float32", "float16"), ("int32", "float64"),
                                      ("float64", "int64"), ("bool", "float32")])
def test_cast_like(src: str, like: str) -> None:
    x = rand(rng_for("CastLike", src, like), (2, 3), src, -5, 5)
    check_op("CastLike", [x, np.zeros((1,), like)])


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("which", ["both", "min", "max", "none", "crossed"])
def test_clip(dtype: str, which: str) -> None:
    x = rand(rng_for("Clip", dtype, which), (3, 4), dtype, -9, 9)
    lo, hi = np.array(2, dtype), np.array(6, dtype)
    inputs = {"both": [x, lo, hi], "min": [x, lo], "max": [x, None, hi], "none": [x],
              "crossed": [x, hi, lo]}[which]
    check_op("Clip", inputs, **tolerance(dtype))


def test_clip_special() -> None:
    x = SPECIAL.astype(np.float32)
    check_op("Clip", [x, np.array(-1, np.float32), np.array(1, np.float32)])
    check_op("Clip", [np.zeros((0, 2), np.float32), np.array(0, np.float32)])
    check_op("Clip", [np.array(3.5, np.float32), None, np.array(1, np.float32)])


@pytest.mark.parametrize("shapes", [[(4, 5), (3, 1, 5), (1,)], [(), (2, 3), ()],
                                    [(2, 1), (1, 3), (2, 3)], [(0, 3), (3,), (1, 3)],
                                    [(1,), (1,), (1,)]])
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "uint8"])
def test_where(shapes: list, dtype: str) -> None:
    rng = rng_for("Where", shapes, dtype)
    cond = rand(rng, shapes[0], "bool", 0, 1)
    check_op("Where", [cond, rand(rng, shapes[1], dtype, -5, 5), rand(rng, shapes[2], dtype, -5, 5)])


@pytest.mark.parametrize("slope_shape", [(5,), (4, 5), (1, 5), (3, 4, 5), (1,), (4, 1), ()])
def test_prelu_slope_shapes(slope_shape: tuple) -> None:
    rng = rng_for("PRelu", slope_shape)
    x = rand(rng, (3, 4, 5), "float32", -3, 3)
    check_op("PRelu", [x, rand(rng, slope_shape, "float32", 0, 1)])


# ---- infer rules -------------------------------------------------------------------------

def ctx(op: str, dtypes: list, shapes: list, attrs: dict | None = None) -> InferContext:
    """An InferContext with every input present and no constant values."""
    dts = [np.dtype(d) for d in dtypes]
    return InferContext(op, dts, shapes, [None] * len(dts), attrs or {}, [True] * len(dts),
                        "node7")


@pytest.mark.parametrize("op", ["Add", "Mul", "Equal", "Max", "PRelu", "Pow"])
def test_broadcast_mismatch_raises(op: str) -> None:
    with pytest.raises(ShapeInferenceError, match="node7"):
        ops.get(op).infer(ctx(op, ["float32", "float32"], [(3,), (4,)]))


@pytest.mark.parametrize("op,dtypes,shapes,attrs", [
    ("Add", ["float32", "int32"], [(3,), (3,)], {}),          # mixed dtypes
    ("Sqrt", ["int32"], [(3,)], {}),                          # float-only op
    ("And", ["float32", "float32"], [(3,), (3,)], {}),        # bool-only op
    ("Mod", ["float32", "float32"], [(3,), (3,)], {}),        # float Mod needs fmod=1
    ("BitShift", ["uint8", "uint8"], [(3,), (3,)], {"direction": "UP"}),
    ("Gelu", ["float32"], [(3,)], {"approximate": "erf"}),
    ("Cast", ["float32"], [(3,)], {"to": 17}),                # float8e4m3fn: not typed
    ("Where", ["float32", "float32", "float32"], [(3,), (3,), (3,)], {}),
    ("Clip", ["float32", "float32"], [(3,), (2,)], {}),       # min must be a scalar
    ("PRelu", ["float32", "float32"], [(3,), (2, 3)], {}),    # slope of higher rank
])
def test_infer_rejects(op: str, dtypes: list, shapes: list, attrs: dict) -> None:
    with pytest.raises(ShapeInferenceError, match=op):
        ops.get(op).infer(ctx(op, dtypes, shapes, attrs))


@pytest.mark.parametrize("a,b,want", [
    (("N", 1, 5), (4, 5), ("N", 4, 5)),
    (("a",), ("b",), (None,)),
    (("a",), (1,), ("a",)),
    (("a", 3), (3,), ("a", 3)),
    ((2, "a"), ("a",), (2, "a")),
    (None, (3,), None),
])
def test_symbolic_broadcast(a: tuple, b: tuple, want: tuple) -> None:
    [(dt, shape)] = ops.get("Add").infer(ctx("Add", ["float32", "float32"], [a, b]))
    assert shape == want and dt == np.float32


def test_where_three_way_symbolic() -> None:
    [(dt, shape)] = ops.get("Where").infer(ctx("Where", ["bool", "int64", "int64"],
                                               [("B", 1), (1, "S"), ()]))
    assert (dt, shape) == (np.int64, ("B", "S"))


ALL_OPS = {s.op for s in SPECS} | {"BitShift", "Where", "Cast", "CastLike", "Clip"}


def test_table_entries() -> None:
    for op in ALL_OPS:
        d = ops.get(op)
        assert d is not None and d.kind == ops.ELEMENTWISE, op
        assert set(d.groups) <= {"CONV_EPILOGUE"}, op
        narrow = ops.NARROW_INT_TYPES if op in ("Cast", "CastLike") else frozenset()
        assert d.dtypes is None or d.dtypes <= ops.COMPILABLE_TYPES | narrow, op
    assert ops.get("Sqrt").dtypes == frozenset(ops.FLOAT_TYPES)
    assert ops.get("IsNaN").dtypes == frozenset(ops.FLOAT_TYPES) | {ops.BOOL}
    assert ops.get("And").dtypes == {ops.BOOL}
    assert ops.get("Add").dtypes == ops.COMPILABLE_TYPES - {ops.BOOL}
    assert ops.get("Equal").dtypes is None
    assert ops.get("Cast").dtypes == ops.COMPILABLE_TYPES | ops.NARROW_INT_TYPES


@pytest.mark.parametrize("op,inputs", [
    ("Max", [np.ones(3, np.float32)]), ("Sum", [np.ones(3, np.float32)]),
    ("Clip", [np.ones(3, np.float32)]), ("Relu", [np.ones(3, np.float32)]),
    ("Cast", [np.ones(3, np.float32)]),
])
def test_ref_outputs_do_not_alias_inputs(op: str, inputs: list) -> None:
    [y] = ops.get(op).ref(inputs, {"to": 1})
    y[...] = 7  # constant folding may hand outputs on to in-place consumers
    assert inputs[0][0] == 1


# ---- signed zeros and NaN where onnxruntime's kernels decide ----------------------------

_Z = [-0.0, 0.0, -0.0, 0.0, np.nan, -1.5, 2.0, np.nan]
_W = [0.0, -0.0, -0.0, 0.0, 1.0, np.nan, 2.0, np.nan]
SIGNED_ZERO_CASES = {  # name: (nodes, inputs: x and w are _Z and _W tiled, lo and hi scalars)
    "Relu": ("y = Relu (x)", {}),
    "Sign": ("y = Sign (x)", {}),
    "Max": ("y = Max (x, w)", {}),
    "Min": ("y = Min (x, w)", {}),
    "Max3": ("y = Max (x, w, x)", {}),
    "Min3": ("y = Min (w, x, w)", {}),
    "Clip": ("y = Clip (x, lo, hi)", {"lo": 0.0, "hi": 1.0}),
    "Clip-": ("y = Clip (x, lo, hi)", {"lo": -1.0, "hi": -0.0}),
}


@pytest.mark.parametrize("dtype", ["float", "double", "float16"])
@pytest.mark.parametrize("case", sorted(SIGNED_ZERO_CASES))
@pytest.mark.parametrize("side", ["cpu", "interpreter", "gpu-sim"])
def test_signed_zeros_and_nan_as_onnxruntime(monkeypatch, side, case, dtype):
    # Relu(-0.0) and Clip(-0.0, 0, 1) are -0.0, Sign(-0.0) +0.0 (float16's Sign(NaN) 0),
    # and Max/Min give the later operand of equal ones (-0.0, +0.0), the earlier in float16:
    # onnxruntime's kernels; llvm.maximum's IEEE order (max(-0, +0) = +0) disagreed
    import onnx.parser
    from support.op_harness import run_ort

    import autoclust
    from autoclust import registry
    monkeypatch.setitem(registry.BACKENDS, "gpu-sim", "support.gpu_sim_backend")
    body, scalars = SIGNED_ZERO_CASES[case]
    n = 8 * 5  # a 40-wide row: the vector loop and its scalar tail
    np_type = {"float": np.float32, "double": np.float64, "float16": np.float16}[dtype]
    rows = {"x": _Z, "w": _W}
    names = [x for x in ("x", "w") if f"{x})" in body or f"{x}," in body]
    feeds = {x: np.tile(np.array(rows[x], np_type), 5) for x in names}
    feeds.update({k: np.array(v, np_type) for k, v in scalars.items()})
    sig = ", ".join(f"{dtype}[{n}] {x}" for x in names) + "".join(f", {dtype} {k}" for k in scalars)
    model = onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : 18]>\n'
                                    f"g ({sig}) => ({dtype}[{n}] y) {{ {body} }}")
    (want,) = run_ort(model, feeds)
    sess = autoclust.InferenceSession(model.SerializeToString(), device=side, min_cluster_size=1,
                                      autotune=False)
    (got,) = sess.run(None, feeds)
    if side != "interpreter":
        assert [c["kernels"] for c in sess.stats()["clusters"]] == [[1]]
    np.testing.assert_array_equal(got, want)  # NaN where NaN
    assert np.signbit(got).tolist() == np.signbit(want).tolist()
