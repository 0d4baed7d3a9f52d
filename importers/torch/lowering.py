"""The context an ATen lowering writes against: operands, emitted nodes, sizes, types.

`Lowering` gives a lowering its FX node's arguments as op-table values (`tensor`, `operand`
with a cast to a dtype, Python scalars as constants), emits op-table nodes whose output types
come from the op table's infer rules (`emit`, `one`), builds shape tensors from ints and
symbolic sizes (`dims`), and at the end checks the outputs against the dtypes and shapes
torch recorded for the node, taking torch's symbolic shapes (`settle`). A lowering that
cannot express its arguments raises `Unmapped(reason)`.

Symbolic sizes become shape computations on the node's own inputs: a symbol that is dim d
of input x is `Shape(x, start=d, end=d+1)`; products, sums and floor divisions of symbols
become Mul, Add and Div of those. A cluster folds them once shapes are concrete.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch import fx
from torch.utils._sympy.functions import FloorDiv

from autoclust import ops
from autoclust.errors import ShapeInferenceError
from autoclust.ir import Graph, Node, Value

INT64_MAX = 2**63 - 1

_NP_DTYPES = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
    torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8,
    torch.uint8: np.uint8, torch.bool: np.bool_,
}


class Unmapped(Exception):
    """A node this module cannot lower; str(exc) is the reason a user sees."""


def np_dtype(dtype: torch.dtype) -> np.dtype | None:
    """numpy dtype of a torch dtype; None for bfloat16, complex and other types numpy lacks."""
    dt = _NP_DTYPES.get(dtype)
    return None if dt is None else np.dtype(dt)


def ir_dim(d: Any) -> int | str:
    """An IR dim from a torch size: int, or the symbol's expression as text ("s0*s1")."""
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if expr.is_number else str(expr)
    return int(d)


def ir_type(val: Any) -> tuple[np.dtype | None, tuple]:
    """(dtype, shape) of a (fake) tensor for the IR."""
    return np_dtype(val.dtype), tuple(ir_dim(d) for d in val.shape)


def sym_expr(x: Any) -> Any:
    """The sympy expression of a SymInt argument (fx.Node or SymInt); ints stay ints."""
    if isinstance(x, fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.SymInt):
        expr = x.node.expr
        return int(expr) if expr.is_number else expr
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    raise Unmapped(f"expected an int or a symbolic int, got {type(x).__name__}")


def _onnx_type(dtype: np.dtype) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


class Lowering:
    """What one FX node's lowering sees: its operands as IR values, and emit helpers."""

    def __init__(self, graph: Graph, node: fx.Node, values: dict[fx.Node, Any],
                 graph_inputs: Sequence[Value]):
        self.graph = graph
        self.node = node
        self.values = values
        self.graph_inputs = graph_inputs
        self.emitted: list[Node] = []
        self.val = node.meta.get("val")

    # ---- operands ---------------------------------------------------------------------
    def tensor(self, a: Any) -> Value:
        """The IR value of tensor argument `a`."""
        v = self.values.get(a) if isinstance(a, fx.Node) else None
        if not isinstance(v, Value):
            raise Unmapped(f"argument {a} is not a tensor autoclust can read")
        if v.dtype is None:
            raise Unmapped(f"argument {a.name} has dtype {a.meta['val'].dtype}, which numpy "
                           "cannot hold")
        return v

    def operand(self, a: Any, dtype: np.dtype) -> Value:
        """Tensor or Python scalar argument `a` as an IR value of `dtype`."""
        if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor):
            return self.cast(self.tensor(a), dtype)
        if isinstance(a, (bool, int, float)):
            return self.const(np.array(a).astype(dtype))
        if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.SymInt):
            return self.cast(self.one("Reshape", self.dim(a), self.ints([])), dtype)
        raise Unmapped(f"scalar argument {a} is only known at run time")

    def out_dtype(self, i: int = 0) -> np.dtype:
        val = self.val[i] if isinstance(self.val, (list, tuple)) else self.val
        dt = np_dtype(val.dtype)
        if dt is None:
            raise Unmapped(f"output dtype {val.dtype} has no numpy type")
        return dt

    def used_items(self) -> set[int]:
        """Indices of a tuple-valued node's outputs that some getitem reads."""
        return {u.args[1] for u in self.node.users
                if u.target is operator.getitem and u.users}

    # ---- emitting ---------------------------------------------------------------------
    def emit(self, op: str, inputs: list[Value | None], n_out: int = 1,
             **attrs: Any) -> list[Value]:
        """Append an op-table node; its outputs get types from the op's infer rule."""
        node = self.graph.make_node(op, inputs, n_out, attrs, name=self.graph.unique_name(
            f"{self.node.name}.{op}_"))
        self.emitted.append(node)
        try:
            types = ops.infer_node(node, self.graph)
        except ShapeInferenceError as exc:
            raise Unmapped(f"{op} rejects the arguments: {exc}") from None
        for v, (dt, shape) in zip(node.outputs, types):
            v.dtype = None if dt is None else np.dtype(dt)
            v.shape = shape
        return node.outputs

    def one(self, op: str, *inputs: Value | None, **attrs: Any) -> Value:
        return self.emit(op, list(inputs), 1, **attrs)[0]

    def const(self, array: Any) -> Value:
        array = np.asarray(array)
        return self.graph.add_initializer(self.graph.unique_name(f"{self.node.name}.c"), array)

    def ints(self, values: Sequence[int]) -> Value:
        return self.const(np.asarray(list(values), np.int64).reshape(len(values)))

    def cast(self, v: Value, dtype: np.dtype) -> Value:
        dtype = np.dtype(dtype)
        if v.dtype == dtype:
            return v
        const = self.graph.constant_value(v)
        if const is not None:
            return self.const(const.astype(dtype))
        return self.one("Cast", v, to=_onnx_type(dtype))

    # ---- sizes --------------------------------------------------------------------------
    def dims(self, sizes: Sequence[Any]) -> Value:
        """A 1-D int64 tensor of `sizes` (ints, SymInts): a constant, or a shape computation."""
        exprs = [sym_expr(s) for s in sizes]
        if all(isinstance(e, int) for e in exprs):
            return self.ints(exprs)
        parts = [self.ints([e]) if isinstance(e, int) else self._expr(e) for e in exprs]
        return parts[0] if len(parts) == 1 else self.one("Concat", *parts, axis=0)

    def dim(self, size: Any) -> Value:
        return self.dims([size])

    def _expr(self, expr: Any) -> Value:
        """A shape-expression tensor [1] for a sympy expression over the size symbols."""
        if expr.is_Integer:
            return self.ints([int(expr)])
        if expr.is_Symbol:
            return self._symbol(str(expr))
        if expr.is_Mul or expr.is_Add:
            op = "Mul" if expr.is_Mul else "Add"
            out = self._expr(expr.args[0])
            for a in expr.args[1:]:
                out = self.one(op, out, self._expr(a))
            return out
        if isinstance(expr, FloorDiv):  # sizes are >= 0: Div's truncation is floor division
            return self.one("Div", self._expr(expr.args[0]), self._expr(expr.args[1]))
        raise Unmapped(f"symbolic size {expr} is not a product/sum of sizes")

    def _symbol(self, name: str) -> Value:
        for v in self._size_sources():
            if v.shape is not None and name in v.shape:
                d = v.shape.index(name)
                return self.one("Shape", v, start=d, end=d + 1)
        raise Unmapped(f"no input tensor has symbolic size {name} as a dim")

    def _size_sources(self) -> list[Value]:
        own = [self.values.get(a) for a in self.node.all_input_nodes]
        return [v for v in own if isinstance(v, Value)] + list(self.graph_inputs)

    # ---- outputs ------------------------------------------------------------------------
    def settle(self, outs: list[Value | None]) -> list[Value | None]:
        """Check outputs against torch's types and take torch's (symbolic) shapes."""
        vals = self.val if isinstance(self.val, (list, tuple)) else [self.val]
        for i, (v, val) in enumerate(zip(outs, vals)):
            if v is None:
                continue
            dt, shape = ir_type(val)
            if v.dtype != dt:
                raise Unmapped(f"lowering gives dtype {v.dtype} for output {i}, torch {dt}")
            if not _compatible(v.shape, shape):
                raise Unmapped(f"lowering gives shape {v.shape} for output {i}, torch {shape}")
            v.shape = shape
        return outs


def _compatible(inferred: tuple | None, torch_shape: tuple) -> bool:
    """Shapes agree where both dims are known ints (None and symbols match anything)."""
    if inferred is None:
        return True
    return len(inferred) == len(torch_shape) and all(
        not (isinstance(a, int) and isinstance(b, int)) or a == b
        for a, b in zip(inferred, torch_shape))


def promoted(a: Any, b: Any) -> np.dtype:
    """torch's type promotion of two tensor or scalar arguments (torch.result_type)."""
    sa, sb = _stand_in(a), _stand_in(b)
    if not isinstance(sa, torch.Tensor):
        sa = torch.tensor(sa)
    out = np_dtype(torch.result_type(sa, sb))
    if out is None:
        raise Unmapped(f"promoting {a} and {b} gives a dtype numpy lacks")
    return out


def _stand_in(x: Any) -> Any:
    """A tiny real tensor (0-d stays 0-d: it promotes like a scalar) or a Python scalar."""
    val = x.meta.get("val") if isinstance(x, fx.Node) else x
    if isinstance(val, torch.Tensor):
        return torch.empty((1,) * min(val.dim(), 1), dtype=val.dtype)
    if isinstance(val, torch.SymInt):
        return 1
    if isinstance(val, (bool, int, float)):
        return val
    raise Unmapped(f"cannot promote argument {x}")


def is_deterministic(node: fx.Node) -> bool:
    """An ATen call that computes the same result from the same arguments and writes none
    of them (not random, not in place): evaluating it once at compile time is safe."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags and \
        not target._schema.is_mutable
