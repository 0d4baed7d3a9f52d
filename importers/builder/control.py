"""Control flow for the Builder: ONNX Loop and If with bodies built by Python callables.

    x, i = b.while_loop(cond_fn, body_fn, [x0, 0])    # Loop(M="", cond, x0, 0)
    q, r = b.fori_loop(n, body_fn, [q0, r0])          # Loop(M=n, cond="", q0, r0)
    y = b.if_(c, then_fn, else_fn)                    # If(c) {then_branch, else_branch}

A body function receives a sub-builder (plus the loop's values) and returns its results;
it may read operands of every enclosing builder (ONNX outer-scope values: they become the
node's implicit inputs). Loop-carried values keep their dtype and rank: a body returning
another type raises BuildError naming the value and both types. cond_fn of while_loop
runs twice: once on the initial values (in the enclosing builder), once on the body's
results (in the body), as ONNX Loop wants the next condition from the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from autoclust.importers.builder.operand import Operand, active
from autoclust.importers.builder.ops import OPSET
from autoclust.importers.onnx.export import export_model

from autoclust.errors import BuildError

if TYPE_CHECKING:
    from autoclust.importers.builder import Builder

BOOL = np.dtype(bool)
INT64 = np.dtype(np.int64)


def _call(sb: Builder, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(sb, *args) with sb the active builder: operators on outer operands build there,
    so a branch's `n / d` stays inside the branch."""
    with active(sb):
        return fn(sb, *args)


def _as_list(values: Any) -> tuple[list[Any], bool]:
    """(values as a list, whether a single value was given)."""
    if isinstance(values, list | tuple):
        return list(values), False
    return [values], True


def _results(b: Builder, out: Any, count: int | None, what: str) -> list[Operand]:
    values, _ = _as_list(out)
    if count is not None and len(values) != count:
        raise BuildError(f"{what} returned {len(values)} values, expected {count}")
    result = []
    for k, v in enumerate(values):
        if not isinstance(v, Operand):
            v = b._as_operand(v, f"{what} result {k}")
        result.append(v)
    return result


def _merge_shape(a: tuple | None, b: tuple | None) -> tuple | None:
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def _check_same_type(what: str, first: Operand, second: Operand, how: str,
                     same_dims: bool = False) -> None:
    """dtype and rank must match (and known dims too, with same_dims)."""
    a, b = first.shape, second.shape
    ok = first.dtype == second.dtype and (a is None or b is None or len(a) == len(b))
    if ok and same_dims and a is not None and b is not None:
        ok = all(x == y or x is None or y is None for x, y in zip(a, b))
    if not ok:
        need = "dtype and shape" if same_dims else "dtype and rank"
        raise BuildError(f"{what}: {how}: {first.value.type_str()} vs "
                         f"{second.value.type_str()} ({need} must match)")


def _condition(b: Builder, c: Any, what: str) -> Operand:
    if not isinstance(c, Operand):
        c = b._as_operand(np.asarray(c, dtype=bool), what)
    if c.dtype != BOOL or (c.shape is not None and c.shape not in ((), (1,))):
        raise BuildError(f"{what} must be a bool scalar, got {c.value.type_str()}")
    return c


def finish(sb: Builder) -> Any:
    """The sub-builder's graph (outputs set) as an ONNX GraphProto."""
    model = export_model(sb.graph, ir_version=10)
    versions = {imp.domain: imp.version for imp in model.opset_import}
    if versions.get("", OPSET) != OPSET:
        raise BuildError(f"body {sb.name!r} needs opset {versions['']}; the Builder "
                         f"writes opset {OPSET}")
    return model.graph


def _loop(b: Builder, trip: Operand | None, cond: Operand | None, init: list[Operand],
          sb: Builder, body_out: list[Operand]) -> tuple[Operand, ...]:
    sb._set_outputs([("", x) for x in body_out])
    types = [(x.dtype, _merge_shape(x.shape, y.shape)) for x, y in zip(init, body_out[1:])]
    return b._emit_control("Loop", [trip, cond, *init], {"body": sb}, types)


def _carried_inputs(sb: Builder, init: list[Operand]) -> list[Operand]:
    return [Operand(sb, sb.graph.add_input(sb.graph.unique_name(f"carry{k}_"), x.dtype,
                                            x.shape)) for k, x in enumerate(init)]


def _loop_header(sb: Builder) -> tuple[Operand, Operand]:
    i = sb.graph.add_input(sb.graph.unique_name("iter_"), INT64, ())
    c = sb.graph.add_input(sb.graph.unique_name("cond_"), BOOL, ())
    return Operand(sb, i), Operand(sb, c)


def _carried_results(what: str, init: list[Operand], new: list[Operand]) -> None:
    for k, (x, y) in enumerate(zip(init, new)):
        _check_same_type(what, x, y, f"carried value {k} enters as {x.value.type_str()} but "
                                     "the body returns another type", same_dims=True)


def while_loop(b: Builder, cond_fn: Callable[..., Any], body_fn: Callable[..., Any],
               init_values: Any, max_trip_count: Any = None) -> Any:
    """See Builder.while_loop."""
    values, single = _as_list(init_values)
    init = [b._as_operand(v, f"while_loop init value {k}") for k, v in enumerate(values)]
    first = _condition(b, _call(b, cond_fn, *init), "while_loop cond_fn")
    sb = b._sub("while")
    _, _ = _loop_header(sb)
    carried = _carried_inputs(sb, init)
    new = _results(sb, _call(sb, body_fn, *carried), len(init), "while_loop body_fn")
    _carried_results("while_loop", init, new)
    again = _condition(sb, _call(sb, cond_fn, *new), "while_loop cond_fn (on the body's results)")
    trip = None if max_trip_count is None else _trip_count(b, max_trip_count)
    outs = _loop(b, trip, first, init, sb, [again, *new])
    return outs[0] if single else outs


def _trip_count(b: Builder, n: Any) -> Operand:
    if isinstance(n, Operand):
        if n.dtype != INT64 or n.shape not in ((), (1,), None):
            n = b.op("Cast", b.op("Reshape", n, [-1]) if n.shape not in ((), None) else n,
                     to=INT64)
        return n
    if not isinstance(n, int | np.integer) or n < 0:
        raise BuildError(f"loop trip count must be an int >= 0 or an int64 Operand, got {n!r}")
    return b.constant(np.int64(n))


def fori_loop(b: Builder, n: Any, body_fn: Callable[..., Any], init_values: Any) -> Any:
    """See Builder.fori_loop."""
    values, single = _as_list(init_values)
    init = [b._as_operand(v, f"fori_loop init value {k}") for k, v in enumerate(values)]
    trip = _trip_count(b, n)
    sb = b._sub("fori")
    i, c = _loop_header(sb)
    carried = _carried_inputs(sb, init)
    new = _results(sb, _call(sb, body_fn, i, *carried), len(init), "fori_loop body_fn")
    _carried_results("fori_loop", init, new)
    outs = _loop(b, trip, None, init, sb, [sb.op("Identity", c), *new])
    return outs[0] if single else outs


def if_(b: Builder, cond: Any, then_fn: Callable[..., Any], else_fn: Callable[..., Any]
        ) -> Any:
    """See Builder.if_."""
    c = _condition(b, cond, "if_ condition")
    tb, eb = b._sub("then"), b._sub("else")
    raw = _call(tb, then_fn)
    _, single = _as_list(raw)
    then_out = _results(tb, raw, None, "if_ then_fn")
    else_out = _results(eb, _call(eb, else_fn), len(then_out), "if_ else_fn")
    for k, (x, y) in enumerate(zip(then_out, else_out)):
        _check_same_type("if_", x, y, f"output {k} differs between the branches")
    tb._set_outputs([("", x) for x in then_out])
    eb._set_outputs([("", x) for x in else_out])
    types = [(x.dtype, _merge_shape(x.shape, y.shape)) for x, y in zip(then_out, else_out)]
    outs = b._emit_control("If", [c], {"then_branch": tb, "else_branch": eb}, types)
    return outs[0] if single else outs
