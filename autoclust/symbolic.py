"""Symbolic dims: integer polynomials in named dims, and the guards a compile records.

A cluster compiled for one run's shapes can serve other values of a dim (a new sequence
length) when every decision the compiler made holds for them too. The compiler runs on
`Sym` dims instead of ints: each Sym is a polynomial with integer coefficients in the
symbols (`768*seq`, `seq^2*12`) and carries its value in the run being compiled (its hint).
Arithmetic stays symbolic; every *decision* (a comparison, `bool`, `int()`, a remainder)
is answered from the hints and recorded as a `Guard`, unless it holds for every value the
symbols may take (they are all >= 2: dims of size 0 and 1 change what broadcasting and
empty loops do, so they are never symbolic):

    with recording() as guards:
        s = dim("seq", 128)
        s * 64 == 8192       # True, guard "64*seq - 8192 == 0" (this pins seq to 128)
        s * 64 > 1           # True, no guard: 64*seq - 2 >= 0 for every seq >= 2
        (s * 3) % 2          # 0, guard "3*seq % 2 == 0"
        int(s)               # 128, guard "seq - 128 == 0": the code needed a number

The result is valid for every assignment of the symbols that satisfies the guards: the
`ShapeClass` a compiled executable serves (runtime/runner.py checks each new signature
against it).

`==` on dims is a decision like any other (`seq == 768` is a guard). Hashing is
structural (a Sym is a dict key of its own: memo tables never compare a Sym with an int
of the same value), and the kernel IR's records compare structurally (kernel/ir.py), so
looking an expression up never pins a dim. Code that must decide without a guard, where
"unequal" is always safe (fusing two loop nests of the same shape), uses `same`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

LOWER = 2  # every symbol is at least this (0 and 1 are never symbolic)
UPPER = 2**31 - 1  # ... and at most this (a bigger dim stays concrete)

Monomial = tuple[tuple[str, int], ...]   # ((name, power), ...) sorted by name; () = 1
Terms = tuple[tuple[Monomial, int], ...]  # ((monomial, coefficient), ...) sorted


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    if not a:
        return b
    if not b:
        return a
    powers = dict(a)
    for name, p in b:
        powers[name] = powers.get(name, 0) + p
    return tuple(sorted(powers.items()))


def _add_into(acc: dict, terms: Terms, scale: int = 1) -> None:
    for mono, c in terms:
        acc[mono] = acc.get(mono, 0) + c * scale


def _freeze(acc: dict) -> Terms:
    return tuple(sorted((m, c) for m, c in acc.items() if c))


def _mul_terms(a: Terms, b: Terms) -> Terms:
    acc: dict = {}
    for ma, ca in a:
        for mb, cb in b:
            m = _mono_mul(ma, mb)
            acc[m] = acc.get(m, 0) + ca * cb
    return _freeze(acc)


def _terms(x: Any) -> Terms:
    if isinstance(x, Sym):
        return x.terms
    return (((), int(x)),) if x else ()


def _hint(x: Any) -> int:
    return x.hint if isinstance(x, Sym) else int(x)


def _make(terms: Terms, hint: int) -> Any:
    """A Sym, or a plain int when no symbol is left."""
    if not terms:
        return 0
    if len(terms) == 1 and terms[0][0] == ():
        return terms[0][1]
    return Sym(terms, hint)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


class Sym:
    """An integer polynomial in named dims (>= LOWER each), with its value in this run."""

    __slots__ = ("hint", "terms")
    __array_ufunc__ = None  # numpy scalars and arrays defer to our operators

    def __init__(self, terms: Terms, hint: int):
        self.terms = terms
        self.hint = int(hint)

    # ---- arithmetic (stays symbolic) ------------------------------------------------------
    def __add__(self, other: Any) -> Any:
        if not (isinstance(other, Sym) or _is_int(other)):
            return NotImplemented
        acc = dict(self.terms)
        _add_into(acc, _terms(other))
        return _make(_freeze(acc), self.hint + _hint(other))

    __radd__ = __add__

    def __neg__(self) -> Any:
        return _make(tuple((m, -c) for m, c in self.terms), -self.hint)

    def __pos__(self) -> Sym:
        return self

    def __sub__(self, other: Any) -> Any:
        if not (isinstance(other, Sym) or _is_int(other)):
            return NotImplemented
        return self + (-other)

    def __rsub__(self, other: Any) -> Any:
        if not _is_int(other):
            return NotImplemented
        return (-self) + other

    def __mul__(self, other: Any) -> Any:
        if not (isinstance(other, Sym) or _is_int(other)):
            return NotImplemented
        return _make(_mul_terms(self.terms, _terms(other)), self.hint * _hint(other))

    __rmul__ = __mul__

    def __pow__(self, p: int) -> Any:
        if not _is_int(p) or p < 0:
            return NotImplemented
        out: Any = 1
        for _ in range(int(p)):
            out = out * self
        return out

    def __floordiv__(self, other: Any) -> Any:
        if not (isinstance(other, Sym) or _is_int(other)):
            return NotImplemented
        q = exact_quotient(self, other)
        if q is not None:
            return q
        if _is_int(other) and int(other) > 0:  # (2*seq + 1) // 2 = seq, if 2*seq + 1 is odd
            r = self.hint % int(other)
            q = exact_quotient(self - r, other)
            if q is not None:
                _record(Guard("mod", self.terms, r, int(other)))
                return q
        return specialize(self) // specialize(other)

    def __rfloordiv__(self, other: Any) -> Any:
        if not _is_int(other):
            return NotImplemented
        q = exact_quotient(other, self)
        if q is not None:
            return q
        if 0 <= int(other) < self:  # a small offset over a dim-sized stride: 0
            return 0
        return int(other) // specialize(self)

    def __mod__(self, other: Any) -> Any:
        if not (isinstance(other, Sym) or _is_int(other)):
            return NotImplemented
        if exact_quotient(self, other) is not None:
            return 0
        if _is_int(other) and int(other) > 0:  # a divisibility class: "3*seq % 2 == 0"
            r = self.hint % int(other)
            _record(Guard("mod", self.terms, r, int(other)))
            return r
        return specialize(self) % specialize(other)

    def __rmod__(self, other: Any) -> Any:
        if not _is_int(other):
            return NotImplemented
        if exact_quotient(other, self) is not None:  # 0 % (512*seq) is 0 for every seq
            return 0
        if 0 <= int(other) < self:
            return int(other)
        return int(other) % specialize(self)

    def __truediv__(self, other: Any) -> float:
        return specialize(self) / (specialize(other) if isinstance(other, Sym) else other)

    def __rtruediv__(self, other: Any) -> float:
        return other / specialize(self)

    def __abs__(self) -> Any:
        return self if self >= 0 else -self

    # ---- decisions (answered from hints, recorded as guards) ------------------------------
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (float, np.floating)):
            return specialize(self) == other
        if not (isinstance(other, Sym) or _is_int(other)):
            return NotImplemented
        if isinstance(other, Sym) and other.terms == self.terms:
            return True
        return _decide_eq(self - other)

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    # An integer against a float bound compares against the nearest integer that keeps
    # the answer (x < 4.5 is x < 5, x <= 4.5 is x <= 4); against inf or NaN the answer does
    # not depend on x at all.
    def __lt__(self, other: Any) -> bool:
        b = _bound(other, math.ceil)
        if b is None:
            return NotImplemented if not _is_float(other) else self.hint < other
        return not _decide_ge(self - b)

    def __le__(self, other: Any) -> bool:
        b = _bound(other, math.floor)
        if b is None:
            return NotImplemented if not _is_float(other) else self.hint <= other
        return _decide_ge(b - self)

    def __gt__(self, other: Any) -> bool:
        b = _bound(other, math.floor)
        if b is None:
            return NotImplemented if not _is_float(other) else self.hint > other
        return not _decide_ge(b - self)

    def __ge__(self, other: Any) -> bool:
        b = _bound(other, math.ceil)
        if b is None:
            return NotImplemented if not _is_float(other) else self.hint >= other
        return _decide_ge(self - b)

    def __bool__(self) -> bool:
        return not _decide_eq(self)

    def __hash__(self) -> int:
        return hash(self.terms)  # structural (see the module docstring)

    # ---- leaving the symbolic world (pins the symbols) ------------------------------------
    def __index__(self) -> int:
        return specialize(self)

    __int__ = __index__

    def __float__(self) -> float:
        return float(specialize(self))

    def __reduce__(self) -> tuple:
        return (Sym, (self.terms, self.hint))

    def __repr__(self) -> str:
        return format_terms(self.terms)

    __str__ = __repr__


def _is_float(x: Any) -> bool:
    return isinstance(x, (float, np.floating))


def _bound(other: Any, to_int: Any) -> Any:
    """A comparison's other side as an int or Sym (a finite float rounded by `to_int`, see
    Sym.__lt__), or None for anything else (inf, NaN, other types)."""
    if isinstance(other, Sym) or _is_int(other):
        return other
    if _is_float(other) and math.isfinite(other):
        return int(to_int(other))
    return None


def format_terms(terms: Terms) -> str:
    """'768*seq + 1' style text (deterministic: code keys contain it)."""
    if not terms:
        return "0"
    parts = []
    for mono, c in reversed(terms):  # highest monomials first
        names = "*".join(n if p == 1 else f"{n}^{p}" for n, p in mono)
        if not names:
            parts.append(str(c))
        elif c == 1:
            parts.append(names)
        elif c == -1:
            parts.append(f"-{names}")
        else:
            parts.append(f"{c}*{names}")
    return " + ".join(parts).replace("+ -", "- ")


# ---- guards ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Guard:
    """A fact about the symbols the compiled code relies on.

    kind "eq": (poly == 0) is `want` (a bool); "ge": (poly >= 0) is `want`;
    "mod": poly % modulus == want. `where` names the code that asked (for messages)."""

    kind: str
    terms: Terms
    want: Any
    modulus: int = 0
    where: str = dataclasses.field(default="", compare=False)

    def holds(self, env: dict[str, int]) -> bool:
        v = eval_terms(self.terms, env)
        if self.kind == "eq":
            return (v == 0) == self.want
        if self.kind == "ge":
            return (v >= 0) == self.want
        return v % self.modulus == self.want

    def __str__(self) -> str:
        p = format_terms(self.terms)
        if self.kind == "eq":
            return f"{p} {'==' if self.want else '!='} 0"
        if self.kind == "ge":
            return f"{p} {'>=' if self.want else '<'} 0"
        return f"{p} % {self.modulus} == {self.want}"

    def pins(self) -> str | None:
        """The symbol this guard fixes to one value ("seq - 128 == 0"), else None."""
        if self.kind != "eq" or not self.want or len(self.terms) > 2:
            return None
        names = {n for m, _ in self.terms for n, _ in m}
        return names.pop() if len(names) == 1 else None


class Pinned(ValueError):
    """Raised instead of pinning a symbol inside `trial()`: the caller gives up on the
    attempt (constant folding leaves a node whose result would need a concrete dim)."""


class Recorder:
    """The guards one compile records (see `recording`); a nested recorder also passes
    its guards to the enclosing one."""

    def __init__(self, pin: bool = True, parent: Recorder | None = None):
        self.guards: list[Guard] = []
        self._seen: set[Guard] = set()
        self.pin = pin  # False: specialize() raises Pinned
        self.parent = parent

    def add(self, g: Guard) -> None:
        if g not in self._seen:
            self._seen.add(g)
            self.guards.append(g)
            if self.parent is not None:
                self.parent.add(g)


_ACTIVE: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "autoclust_guards", default=None)


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """Record the guards of decisions made on Syms inside the block (per thread); inside
    another recording, the guards reach that one too."""
    outer = _ACTIVE.get()
    rec = Recorder(pin=True if outer is None else outer.pin, parent=outer)
    token = _ACTIVE.set(rec)
    try:
        yield rec
    finally:
        _ACTIVE.reset(token)


TRACE_FRAMES = 1  # frames named in Guard.where (more: debugging what pinned a dim)


@contextlib.contextmanager
def trial() -> Iterator[None]:
    """Run an attempt that must not pin symbols: specialize() raises Pinned inside it,
    and its guards reach the enclosing recorder only when it succeeds."""
    outer = _ACTIVE.get()
    if outer is None:
        yield
        return
    inner = Recorder(pin=False)  # merged into `outer` below, on success only
    token = _ACTIVE.set(inner)
    try:
        yield
    finally:
        _ACTIVE.reset(token)
    for g in inner.guards:  # reached only without an exception
        outer.add(g)


def _caller() -> str:
    """file:line of the first frames outside this module (what made the decision)."""
    f: types.FrameType | None = sys._getframe(2)
    while f is not None and f.f_code.co_filename == __file__:
        f = f.f_back
    where: list[str] = []
    while f is not None and len(where) < TRACE_FRAMES:
        short = "/".join(f.f_code.co_filename.split("/")[-2:])
        where.append(f"{short}:{f.f_lineno} ({f.f_code.co_name})")
        f = f.f_back
    return " < ".join(where) or "?"


def _record(g: Guard) -> None:
    rec = _ACTIVE.get()
    if rec is None:
        raise RuntimeError(f"a decision on symbolic dims outside a compile: {g}")
    rec.add(dataclasses.replace(g, where=_caller()))


def assume(guards: Any) -> None:
    """Record guards decided elsewhere (a cached Program's) in the active recording."""
    rec = _ACTIVE.get()
    if rec is not None:
        for g in guards:
            rec.add(g)


def hold_at_hints(guards: Any, values: Any) -> bool:
    """Whether every guard holds for the hints of the Syms in `values` (a compile's input
    types): a cached Program lowered for another run may not fit this one."""
    env = {}
    for sym in syms_in(values):
        if len(sym.terms) == 1 and sym.terms[0][1] == 1 and len(sym.terms[0][0]) == 1:
            (name, p), = sym.terms[0][0]
            if p == 1:
                env[name] = sym.hint
    try:
        return all(g.holds(env) for g in guards)
    except KeyError:
        return False


def specialize(x: Any) -> int:
    """x's value in this run, pinning its symbols to it (a guard) when it is a Sym."""
    if not isinstance(x, Sym):
        return int(x)
    rec = _ACTIVE.get()
    if rec is not None and not rec.pin:
        raise Pinned(f"{x} would be pinned to {x.hint}")
    _record(Guard("eq", (x - x.hint).terms, True))
    return x.hint


def _shifted(terms: Terms) -> dict:
    """terms with every symbol s replaced by LOWER + t_s (t_s >= 0), expanded."""
    acc: dict = {}
    for mono, c in terms:
        part: Terms = (((), c),)
        for name, p in mono:
            for _ in range(p):
                part = _mul_terms(part, (((), LOWER), (((name, 1),), 1)))
        _add_into(acc, part)
    return acc


def _interval(terms: Terms) -> tuple[int, int]:
    """Bounds of the polynomial over symbols in [LOWER, UPPER] (interval arithmetic)."""
    lo = hi = 0
    for mono, c in terms:
        a = b = 1
        for _, p in mono:
            a, b = a * LOWER ** p, b * UPPER ** p
        lo, hi = (lo + c * a, hi + c * b) if c > 0 else (lo + c * b, hi + c * a)
    return lo, hi


def _sign(terms: Terms) -> int:
    """1 when the polynomial is > 0 for every symbol in [LOWER, UPPER], -1 when < 0,
    0 when that is not proven."""
    lo, hi = _interval(terms)
    if lo > 0:
        return 1
    if hi < 0:
        return -1
    shifted = _shifted(terms)
    coeffs = list(shifted.values())
    const = shifted.get((), 0)
    if all(c >= 0 for c in coeffs) and const > 0:
        return 1
    if all(c <= 0 for c in coeffs) and const < 0:
        return -1
    return 0


def _nonneg(terms: Terms) -> bool:
    return _interval(terms)[0] >= 0 or all(c >= 0 for c in _shifted(terms).values())


def _decide_eq(diff: Any) -> bool:
    """Whether diff == 0 in this run; a guard unless it is settled for every value."""
    if not isinstance(diff, Sym):
        return diff == 0
    if _sign(diff.terms) != 0:
        return False
    result = diff.hint == 0
    _record(Guard("eq", diff.terms, result))
    return result


def _decide_ge(diff: Any) -> bool:
    """Whether diff >= 0 in this run; a guard unless it is settled for every value."""
    if not isinstance(diff, Sym):
        return diff >= 0
    if _nonneg(diff.terms):
        return True
    if _sign(diff.terms) < 0:
        return False
    result = diff.hint >= 0
    _record(Guard("ge", diff.terms, result))
    return result


def exact_quotient(a: Any, b: Any) -> Any:
    """a / b when b divides a as polynomials (for every value of the symbols), else None."""
    if not isinstance(b, Sym):
        b = int(b)
        if b == 0:
            return None
        if not isinstance(a, Sym):
            return None  # plain ints: the caller divides
        if all(c % b == 0 for _, c in a.terms):
            return _make(tuple((m, c // b) for m, c in a.terms), a.hint // b)
        return None
    if len(b.terms) != 1:  # only monomial divisors: c * seq^k
        return None
    (bm, bc), = b.terms
    bp = dict(bm)
    out = []
    for m, c in _terms(a):
        powers = dict(m)
        if c % bc or any(powers.get(n, 0) < p for n, p in bp.items()):
            return None
        rest = tuple(sorted((n, q - bp.get(n, 0)) for n, q in powers.items()
                            if q - bp.get(n, 0)))
        out.append((rest, c // bc))
    return _make(tuple(sorted(out)), _hint(a) // b.hint)


# ---- evaluation -------------------------------------------------------------------------------

def dim(name: str, value: int) -> Sym:
    """The symbol `name` (a dim of at least LOWER) whose value in this run is `value`."""
    if not LOWER <= value <= UPPER:
        raise ValueError(f"symbolic dim {name} = {value}: outside [{LOWER}, {UPPER}]")
    return Sym(((((name, 1),), 1),), value)


def same(a: Any, b: Any) -> bool:
    """Whether a and b (dims, or tuples of dims) are equal for every value of the symbols:
    no guard. For decisions where "unequal" is always safe (fuse two loop nests only when
    their shapes are the same)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and \
            all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Sym) or isinstance(b, Sym):
        return (is_dim(a) and is_dim(b)) and _terms(a) == _terms(b)
    return a == b


def is_sym(x: Any) -> bool:
    return isinstance(x, Sym)


def is_dim(x: Any) -> bool:
    """A known dim: an int or a Sym (str and None dims are unknown)."""
    return isinstance(x, (int, Sym)) and not isinstance(x, bool)


def hint(x: Any) -> Any:
    """x with every Sym replaced by its value in this run (no guard: for estimates only)."""
    return x.hint if isinstance(x, Sym) else x


def eval_terms(terms: Terms, env: dict[str, int]) -> int:
    total = 0
    for mono, c in terms:
        for name, p in mono:
            c *= env[name] ** p
        total += c
    return total


def symbols_of(x: Any) -> set[str]:
    """Names of the symbols in x (a Sym, int, or nested tuples/lists/dataclasses)."""
    return {n for sym in syms_in(x) for m, _ in sym.terms for n, _ in m}


def syms_in(x: Any) -> list[Sym]:
    """The distinct Syms (by structure) in x, in order of first appearance."""
    found: dict[Terms, Sym] = {}
    _walk_syms(x, found, set())
    return list(found.values())


def _walk_syms(x: Any, found: dict, seen: set[int]) -> None:
    if isinstance(x, Sym):
        found.setdefault(x.terms, x)
    elif isinstance(x, (tuple, list)):
        for y in x:
            _walk_syms(y, found, seen)
    elif isinstance(x, dict):
        for y in x.values():
            _walk_syms(y, found, seen)
    elif isinstance(x, np.ndarray) and x.dtype == object:
        for y in x.reshape(-1):
            _walk_syms(y, found, seen)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        if id(x) in seen:
            return
        seen.add(id(x))
        for f in dataclasses.fields(x):
            _walk_syms(getattr(x, f.name), found, seen)


def has_syms(x: Any) -> bool:
    return bool(symbols_of(x))


def substitute(x: Any, env: dict[str, int], memo: dict[int, Any] | None = None) -> Any:
    """x with every Sym evaluated at `env` (nested tuples, lists, dicts, frozen
    dataclasses, object arrays); shared sub-objects stay shared."""
    memo = {} if memo is None else memo
    key = id(x)
    if key in memo:
        return memo[key]
    if isinstance(x, Sym):
        out: Any = eval_terms(x.terms, env)
    elif isinstance(x, tuple):
        items = tuple(substitute(y, env, memo) for y in x)
        out = x if all(a is b for a, b in zip(items, x)) else \
            (type(x)(*items) if hasattr(x, "_fields") else items)
    elif isinstance(x, list):
        out = [substitute(y, env, memo) for y in x]
    elif isinstance(x, dict):
        out = {k: substitute(y, env, memo) for k, y in x.items()}
    elif isinstance(x, np.ndarray) and x.dtype == object:
        flat = [substitute(y, env, memo) for y in x.reshape(-1)]
        out = np.array(flat, dtype=np.int64).reshape(x.shape)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        changes = {}
        for f in dataclasses.fields(x):
            old = getattr(x, f.name)
            new = substitute(old, env, memo)
            if new is not old:
                changes[f.name] = new
        out = dataclasses.replace(x, **changes) if changes else x
    else:
        out = x
    memo[key] = out
    return out


def sym_array(values: list, shape: tuple | None = None) -> np.ndarray:
    """An int64 tensor that holds Syms: an object array (ints stay ints)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out.reshape((len(values),) if shape is None else shape)


def is_sym_array(a: Any) -> bool:
    """Whether `a` is an object array of ints and Syms (an int64 tensor with symbols)."""
    return isinstance(a, np.ndarray) and a.dtype == object and \
        all(is_dim(x) for x in a.reshape(-1))


def tensor_dtype(a: np.ndarray) -> np.dtype:
    """The tensor dtype of array `a`: int64 for an object array of Syms."""
    return np.dtype(np.int64) if a.dtype == object else a.dtype


class ShapeOnly:
    """A stand-in for a tensor with symbolic dims, for refs that read only its shape
    (Shape, Size)."""

    def __init__(self, shape: tuple, dtype: np.dtype | None):
        self.shape = tuple(shape)
        self.ndim = len(self.shape)
        self.dtype = dtype if dtype is not None else np.dtype("float32")
        size: Any = 1
        for d in self.shape:
            size = size * d
        self.size = size


def ints(a: Any) -> list:
    """The elements of an integer array as ints, Syms kept (int() would pin them)."""
    return [x if isinstance(x, Sym) else int(x) for x in np.asarray(a).reshape(-1)]


def product(dims: Any) -> Any:
    """The product of ints and Syms (1 for none)."""
    out: Any = 1
    for d in dims:
        out = out * d
    return out
