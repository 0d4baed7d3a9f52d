"""Prove that no kernel load or store leaves its buffer, before any code is generated.

Every index in kernel IR is affine in the loop indices, plus data-dependent terms for
gathers whose int64 expressions the lowering clamps into their dim. This pass bounds each
access's element offset over the kernel's whole loop domain by interval arithmetic:
affine terms exactly over the box of loop extents (clamped loops inside their clamp),
data-dependent terms through their expression (an index loaded from a buffer can hold
any value of its dtype; `max(min(x, n - 1), 0)` bounds it again), and a `select` on a
comparison of x with a constant narrows x in each branch (Pad's reflect, negative
indices). An offset that may leave [0, size) raises CompileError naming the kernel, the
buffer and the nodes: the cluster then falls back to onnxruntime (must-compile raises),
so a missing shape check becomes a compile failure, never a read outside a buffer.

    kernel k0 [4 | 1]: x[0*i0 + i1] with x of 0 elements -> offsets [0, 0]: CompileError

Only sound bounds are used; anything this pass cannot bound (a float cast to an integer,
a shift) counts as its dtype's whole range. What happens at run time is checked by
`--check_bounds` instead (every generated access compared with its buffer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from autoclust import symbolic
from autoclust.errors import CompileError
from autoclust.kernel import ir as kir

Interval = tuple[int, int]  # inclusive


@dataclasses.dataclass(frozen=True)
class Access:
    """One load or store of a kernel, where it runs (phase, per-row store, element)."""

    buf: int
    index: kir.Affine
    clamps: tuple = ()
    dyn: tuple = ()
    store: bool = False
    per_row: bool = False


def accesses(k: kir.Kernel) -> Iterator[Access]:
    """Every load (with the store it feeds: per-row stores run at inner index 0) and store."""
    for r in k.reductions:
        yield from _loads(r.expr, False)
    for s in k.stores:
        yield Access(s.buf, s.index, store=True, per_row=s.per_row)
        yield from _loads(s.expr, s.per_row)


def _loads(e: kir.Expr, per_row: bool) -> Iterator[Access]:
    for x in kir.walk([e]):
        if isinstance(x, kir.Load):
            yield Access(x.buf, x.index, x.clamps, x.dyn, per_row=per_row)


def check_program(program: kir.Program, env: dict[str, int] | None = None) -> None:
    """Raise CompileError if some access of some kernel (library calls' epilogues
    included) may leave its buffer. `env`: values of the program's symbolic dims (a
    Parametric's binding); only what the proof reads is evaluated at them (buffer sizes,
    loop extents, each distinct access), not the kernels' whole expressions: substituting
    the whole program took half of BERT-base's binding (18K calls for 1.7K of these)."""
    memo: dict[int, Any] = {}

    def at(x: Any) -> Any:
        return x if env is None else symbolic.substitute(x, env, memo)

    buffers = {b.id: b for b in at(program.buffers)}
    for k in kir.kernels(program.thunks):
        if env is not None:
            k = dataclasses.replace(k, shape=at(k.shape))
        if not k.empty:
            check_kernel(k, buffers, at if env is not None else None)


def check_kernel(k: kir.Kernel, buffers: dict[int, kir.Buffer],
                 at: Callable[[Any], Any] | None = None) -> None:
    """Raise CompileError if an access of kernel k may leave its buffer (`at`: evaluates
    an access's symbolic dims; k's shape is already concrete)."""
    n_outer = len(k.shape) - k.n_inner
    inner_empty = any(d == 0 for d in k.shape[n_outer:])
    seen: set[Access] = set()
    for a in accesses(k):
        if a in seen:
            continue
        seen.add(a)
        if inner_empty and not a.per_row:  # loops over an empty row never run
            continue
        if at is not None:  # the parts, the program's own objects (at's memo is by id)
            a = dataclasses.replace(a, index=at(a.index), clamps=at(a.clamps), dyn=at(a.dyn))
        lo, hi = offset_range(a, k)
        size = buffers[a.buf].size
        if lo < 0 or hi >= size:
            b = buffers[a.buf]
            what = "store to" if a.store else "load of"
            raise CompileError(
                f"kernel {k.name} (nodes: {', '.join(k.nodes)}): a {what} {b.name!r} "
                f"({b.dtype}{list(b.shape)}, {size} elements) may reach elements "
                f"[{lo}, {hi}]: a shape check is missing")


def loop_ranges(k: kir.Kernel, per_row: bool) -> list[Interval]:
    """The range of each loop index: inner ones are 0 for a per-row store."""
    n_outer = len(k.shape) - k.n_inner
    return [(0, 0) if per_row and d >= n_outer else (0, max(e - 1, 0))
            for d, e in enumerate(k.shape)]


def offset_range(a: Access, k: kir.Kernel) -> Interval:
    """[lo, hi] of the element offset of access `a` over kernel k's loop domain."""
    loops = loop_ranges(k, a.per_row)
    ranged = list(loops)
    for d, lo, hi in a.clamps:  # min(max(i_d, lo), hi), applied in order
        ranged[d] = (min(max(ranged[d][0], lo), hi), min(max(ranged[d][1], lo), hi))
    total = affine_range(a.index, ranged)
    env = Ranges(loops)
    for e, stride in a.dyn:
        total = _add(total, _mul(env.of(e), (stride, stride)))
    return total


def affine_range(a: kir.Affine, loops: list[Interval]) -> Interval:
    lo = hi = a.const
    for c, (a_lo, a_hi) in zip(a.coeffs, loops):
        lo += min(c * a_lo, c * a_hi)
        hi += max(c * a_lo, c * a_hi)
    return lo, hi


def _dtype_range(dtype: str) -> Interval:
    if dtype == "bool":
        return 0, 1
    dt = np.dtype(dtype)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return int(info.min), int(info.max)
    info64 = np.iinfo(np.int64)
    return int(info64.min), int(info64.max)  # a float cast to int: any int64


def _add(a: Interval, b: Interval) -> Interval:
    return a[0] + b[0], a[1] + b[1]


def _mul(a: Interval, b: Interval) -> Interval:
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


class Ranges:
    """Interval evaluation of integer expressions over a loop domain."""

    def __init__(self, loops: list[Interval]):
        self.loops = loops
        self.memo: dict[tuple, Interval] = {}

    def of(self, e: kir.Expr, env: tuple = ()) -> Interval:
        """The range of e where each (expr, interval) of env narrows that expr."""
        key = (id(e), env)
        got = self.memo.get(key)
        if got is None:
            got = self._of(e, env)
            full = _dtype_range(e.dtype)
            if got[0] < full[0] or got[1] > full[1]:  # integer arithmetic wraps
                got = full
            self.memo[key] = got
        return got

    def _of(self, e: kir.Expr, env: tuple) -> Interval:
        for x, r in env:
            if x is e:
                return r
        if isinstance(e, kir.Const):
            v = int(e.value) if not isinstance(e.value, float) else None
            return (v, v) if v is not None else _dtype_range("int64")
        if isinstance(e, kir.Index):
            return affine_range(e.index, self.loops)
        if not isinstance(e, kir.Op):  # a loaded value, a reduction's result
            return _dtype_range(e.dtype)
        if e.name == "select":
            return self._select(e, env)
        if e.name == "cast" and np.dtype(e.args[0].dtype).kind in "iub":
            return self.of(e.args[0], env)  # wraps outside e.dtype (see `of`)
        args = [self.of(a, env) for a in e.args] if e.dtype != "bool" else []
        return _op_range(e, args, self, env)

    def _select(self, e: kir.Op, env: tuple) -> Interval:
        cond, yes, no = e.args
        t_env, f_env = self._narrow(cond, env)
        if t_env is None:
            return self.of(no, env)
        if f_env is None:
            return self.of(yes, env)
        a, b = self.of(yes, t_env), self.of(no, f_env)
        return min(a[0], b[0]), max(a[1], b[1])

    def _narrow(self, cond: kir.Expr, env: tuple) -> tuple[tuple | None, tuple | None]:
        """(env where cond holds, env where it does not); None for a branch that cannot
        be taken. Understands `x < c`, `x <= c`, `x > c`, `x >= c` with c constant."""
        if not (isinstance(cond, kir.Op) and cond.name in ("lt", "le", "gt", "ge")):
            return env, env
        x, c = cond.args
        name = cond.name
        if isinstance(x, kir.Const) and not isinstance(c, kir.Const):  # c op x: flip
            x, c = c, x
            name = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}[name]
        if not isinstance(c, kir.Const) or isinstance(c.value, float) or \
                np.dtype(x.dtype).kind not in "iu":
            return env, env
        v = int(c.value)
        below = {"lt": v - 1, "le": v}  # x <= below when the compare holds
        above = {"gt": v + 1, "ge": v}
        lo, hi = self.of(x, env)
        if name in below:
            yes, no = (lo, min(hi, below[name])), (max(lo, below[name] + 1), hi)
        else:
            yes, no = (max(lo, above[name]), hi), (lo, min(hi, above[name] - 1))
        return (None if yes[0] > yes[1] else env + ((x, yes),),
                None if no[0] > no[1] else env + ((x, no),))


def _op_range(e: kir.Op, args: list[Interval], ranges: Ranges, env: tuple) -> Interval:
    full = _dtype_range(e.dtype)
    name = e.name
    if name == "add":
        return _add(args[0], args[1])
    if name == "sub":
        return args[0][0] - args[1][1], args[0][1] - args[1][0]
    if name == "mul":
        return _mul(args[0], args[1])
    if name == "neg":
        return -args[0][1], -args[0][0]
    if name == "abs":
        lo, hi = args[0]
        return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
    if name in ("max", "min"):
        pick = max if name == "max" else min
        return pick(args[0][0], args[1][0]), pick(args[0][1], args[1][1])
    if name in ("div", "mod", "fmod"):
        return _divide(name, args[0], args[1], full)
    return full  # shifts, bit operations, ...: anything


def _divide(name: str, x: Interval, y: Interval, full: Interval) -> Interval:
    """Ranges of trunc division and the remainders, for a positive constant divisor."""
    if y[0] != y[1] or y[0] <= 0:
        return full
    n = y[0]
    if name == "div":
        return int(x[0] / n) if x[0] < 0 else x[0] // n, int(x[1] / n) if x[1] < 0 else \
            x[1] // n
    if name == "mod":  # the divisor's sign: [0, n)
        return (x[0] % n, x[1] % n) if x[1] - x[0] < n and x[0] % n <= x[1] % n \
            else (0, n - 1)
    return (max(x[0], -(n - 1)), min(x[1], n - 1)) if x[0] < 0 else (0, min(x[1], n - 1))
