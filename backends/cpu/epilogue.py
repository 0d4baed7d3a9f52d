"""A GEMM call's epilogue (kernel IR LibraryCall.epilogue) as oneDNN post-ops.

The epilogue kernel stores f(t[i], r[i], b[col], ...) where t is the GEMM's result.
`post_ops` reads f as a chain of steps applied to t, each one a oneDNN post-op:

    add / mul / sub  an operand of the result's shape (a residual) or a row [N] (a bias)
    linear           alpha * y + beta (constants: x * 0.5, x + 1, ...)
    gelu_tanh, silu, sigmoid, tanh
                     an activation, recognized numerically: the kernel's expression of one
                     sub-expression s (which holds every read of t) must equal
                     alpha * act(s) at 90 points in [-20, 20] (rel 1e-5) and at +inf, -inf
                     and NaN exactly as oneDNN computes them

GPT-2's `0.5 * x * (1 + tanh(0.797 * (x + 0.0447 * x^3)))` is gelu_tanh; with its 0.5
folded into the next GEMM's alpha it is 2 * gelu_tanh, linear(2, 0) after gelu_tanh.
Not taken, measured against onnxruntime's semantics: oneDNN's gelu_erf gives NaN for +inf
(onnxruntime +inf) and relu gives 0 for NaN (onnxruntime NaN); those epilogues stay our
kernel, run right after the call.

With --fast_math (which already lets LLVM assume no NaN or inf in elementwise code) the
FAST_ACTIVATIONS join them: GELU with erf (BERT, ViT, Whisper, Swin, ConvNeXt) as oneDNN's
gelu_erf, whose erf is a short polynomial. It costs 0.04-0.28 ns an element inside the GEMM
against ~0.33 ns for our kernel after it (ConvNeXt-tiny 5% faster, Swin 3%, Whisper 1%,
BERT and ViT level: docs/performance.md),
at a precision onnxruntime does not have: up to 2.1e-4 relative error for x in [-3, -1),
absolute errors up to 1.1e-6 below (onnxruntime: 1.8e-5 and 1e-7); +inf gives NaN, values
above 1.7e38 give +inf, -0 gives +0.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable

import numpy as np

from autoclust.kernel import ir as kir
from autoclust.kernel.epilogues import is_flat, reads_elementwise
from autoclust.kernel.passes import code_key, renumber

SAMPLES = np.concatenate([np.linspace(-20.0, 20.0, 81), [-1e-3, -1e-6, 0.0, 1e-6, 1e-3,
                                                         0.3, -0.7, 1.5, -2.5]])
SPECIALS = np.array([np.inf, -np.inf, np.nan], np.float32)
_ERF = np.vectorize(math.erf)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


# activation -> (its float64 formula, oneDNN's value at +inf, -inf, NaN: measured)
ACTIVATIONS: dict[str, tuple[Callable, tuple[float, float, float]]] = {
    "gelu_tanh": (lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) *
                                                    (x + 0.044715 * x ** 3))),
                  (np.inf, np.nan, np.nan)),
    "silu": (lambda x: x * _sigmoid(x), (np.inf, np.nan, np.nan)),
    "sigmoid": (_sigmoid, (1.0, 0.0, np.nan)),
    "tanh": (np.tanh, (1.0, -1.0, np.nan)),
}
# activations taken only with --fast_math: oneDNN approximates them (see the module doc)
FAST_ACTIVATIONS: dict[str, Callable] = {
    "gelu_erf": lambda x: 0.5 * x * (1 + _ERF(x / math.sqrt(2.0))),
}
# kernel IR primitive -> NumPy, for the numeric check (anything else: not an activation)
_NUMPY: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "mul_exact": np.multiply,
    "div": np.divide, "div_exact": np.divide, "neg": np.negative, "abs": np.abs,
    "max": np.maximum, "min": np.minimum, "exp": np.exp, "tanh": np.tanh, "erf": _ERF,
    "sigmoid": _sigmoid, "sqrt": np.sqrt, "pow": np.power,
}


@dataclasses.dataclass(frozen=True)
class Step:
    """One post-op: kind, and for a binary step its operand's buffer and shape; for a
    linear or activation step its scale alpha and shift beta (linear: alpha * y + beta)."""

    kind: str
    buf: int | None = None
    shape: tuple[int, ...] = ()
    alpha: float = 1.0
    beta: float = 0.0

    def onednn(self) -> tuple:
        """The step in onednn.Matmul's epilogue format."""
        if self.buf is not None:
            return (self.kind, self.shape)
        if self.kind == "linear":
            return ("linear", (), self.alpha, self.beta)
        return (self.kind, ())


class _NoMatch(Exception):
    pass


@dataclasses.dataclass
class _Reader:
    """Reads one epilogue kernel: t (the GEMM's result), the loop nest, the result shape."""

    kernel: kir.Kernel
    t: int
    out_shape: tuple[int, ...]
    fast_math: bool = False  # --fast_math: FAST_ACTIVATIONS count too

    def is_t(self, e: kir.Expr) -> bool:
        return isinstance(e, kir.Load) and e.buf == self.t

    def holds_t(self, e: kir.Expr) -> bool:
        return any(self.is_t(x) for x in kir.walk([e]))

    def operand(self, e: kir.Expr) -> tuple[int, tuple[int, ...]] | None:
        """(buffer, shape) of a binary operand: the result's shape read element for
        element, or a row [N] read by column; None when e is neither."""
        if not isinstance(e, kir.Load) or e.clamps or e.dyn or e.index.const:
            return None
        k = self.kernel
        if is_flat(e.index, k):
            return e.buf, self.out_shape
        n = self.out_shape[-1]
        if k.shape[-1] == n and e.index.coeffs[-1] == 1 and not any(e.index.coeffs[:-1]):
            return e.buf, (n,)
        return None

    def chain(self, e: kir.Expr) -> list[Step]:
        """The steps turning t into e (raises _NoMatch)."""
        if self.is_t(e):
            return []
        if isinstance(e, kir.Op) and e.name in ("add", "mul", "sub") and len(e.args) == 2:
            a, b = e.args
            if self.holds_t(a) != self.holds_t(b):
                inner, other = (a, b) if self.holds_t(a) else (b, a)
                step = self.binary(e.name, other, other is a)
                if step is not None:
                    return self.chain(inner) + [step]
        return self.activation(e)

    def binary(self, name: str, other: kir.Expr, other_first: bool) -> Step | None:
        if isinstance(other, kir.Const):
            c = float(other.value)
            if name == "add":
                return Step("linear", beta=c)
            if name == "mul":
                return Step("linear", alpha=c)
            return Step("linear", alpha=-1.0, beta=c) if other_first else Step("linear",
                                                                              beta=-c)
        hit = self.operand(other)
        if hit is None or (name == "sub" and other_first):
            return None
        return Step(name, hit[0], hit[1])

    def activation(self, e: kir.Expr) -> list[Step]:
        """e = alpha * act(s) for a sub-expression s holding every read of t."""
        for s in sorted((x for x in kir.walk([e]) if x is not e and self.holds_t(x)),
                        key=lambda x: -len(kir.walk([x]))):
            outer = _replace(e, s)
            if outer is None or self.holds_t(outer):
                continue
            found = _which_activation(outer, self.fast_math)
            if found is not None:
                act, alpha = found
                steps = self.chain(s) + [Step(act)]
                return steps + ([Step("linear", alpha=alpha)] if alpha != 1.0 else [])
        raise _NoMatch


_HOLE = kir.Const("hole", "float32")  # stands for the activation's argument


def _replace(e: kir.Expr, s: kir.Expr) -> kir.Expr | None:
    """e with sub-expression s (by identity) replaced by _HOLE; None when e reads other
    buffers (an activation is a function of s alone)."""
    memo: dict[int, kir.Expr] = {}

    def go(x: kir.Expr) -> kir.Expr:
        if x is s:
            return _HOLE
        if id(x) in memo:
            return memo[id(x)]
        if isinstance(x, kir.Op):
            out: kir.Expr = dataclasses.replace(x, args=tuple(go(a) for a in x.args))
        elif isinstance(x, kir.Const):
            out = x
        else:
            raise _NoMatch
        memo[id(x)] = out
        return out

    try:
        return go(e)
    except _NoMatch:
        return None


def _evaluate(e: kir.Expr, t: np.ndarray) -> np.ndarray:
    """e at hole = t, in t's float type (raises _NoMatch on a primitive not in _NUMPY)."""
    if e is _HOLE:
        return t
    if isinstance(e, kir.Const):
        return np.asarray(e.value, t.dtype)
    fn = _NUMPY.get(e.name) if isinstance(e, kir.Op) else None
    if fn is None:
        raise _NoMatch
    with np.errstate(all="ignore"):
        return np.asarray(fn(*[_evaluate(a, t) for a in e.args]), t.dtype)


def _which_activation(outer: kir.Expr, fast_math: bool = False) -> tuple[str, float] | None:
    """(activation, alpha) with outer(t) == alpha * act(t), checked as the module says;
    with fast_math, FAST_ACTIVATIONS too (their values at inf and NaN unchecked)."""
    try:
        got = _evaluate(outer, SAMPLES.astype(np.float64))
        special = _evaluate(outer, SPECIALS.astype(np.float32))
    except _NoMatch:
        return None
    candidates = [(name, fn, at) for name, (fn, at) in ACTIVATIONS.items()]
    if fast_math:
        candidates += [(name, fn, None) for name, fn in FAST_ACTIVATIONS.items()]
    for name, fn, at_special in candidates:
        want = fn(SAMPLES)
        alpha = float(got[np.argmax(np.abs(want))] / want[np.argmax(np.abs(want))])
        if not np.isfinite(alpha) or alpha == 0 or \
                not np.allclose(got, alpha * want, rtol=1e-5, atol=1e-6):
            continue
        if at_special is None:
            return name, alpha
        expect = np.float32(alpha) * np.asarray(at_special, np.float32)
        if np.array_equal(special, expect, equal_nan=True):
            return name, alpha
    return None


def post_ops(call: kir.LibraryCall, buffers: dict[int, kir.Buffer], fast_math: bool = False
             ) -> tuple[list[Step], int] | None:
    """(steps, the buffer the fused call writes) when the call's epilogue is one store of
    a post-op chain of the call's result, else None; `fast_math` (--fast_math) admits the
    approximating FAST_ACTIVATIONS."""
    k = call.epilogue
    if k is None or len(k.stores) != 1 or k.reductions:
        return None
    t = call.outputs[0]
    out = buffers[k.stores[0].buf]
    if out.dtype != "float32" or buffers[t].dtype != "float32":
        return None
    if not reads_elementwise(k, t):
        return None  # the result's halves (a SwiGLU: kernel/epilogues.reads_halves)
    reader = _Reader(k, t, tuple(buffers[t].shape), fast_math)
    try:
        steps = reader.chain(k.stores[0].expr)
    except _NoMatch:
        return None
    return (steps, out.id) if steps else None


def kernel_key(k: kir.Kernel) -> str:
    """A short digest of the epilogue kernel's code (the measured choice's key)."""
    return hashlib.sha256(code_key(renumber(k)[0]).encode()).hexdigest()[:16]
