"""The Builder's op methods, generated from the op table and the ONNX schemas.

For every op of `autoclust.ops.all_ops()`, `Builder.<Op>(*inputs, **kwargs)` binds
positional arguments to the schema's inputs and keyword arguments to its attributes (or to
inputs by their ONNX name: `b.ReduceSum(x, axes=[1], keepdims=0)`), coerces attribute
values to the schema's types (`b.Cast(x, to=np.float16)`), and turns plain Python or NumPy
values given as inputs into constants of the dtype the op needs:

    b.Add(x, 1.0)          # 1.0 becomes a constant of x's dtype (same type parameter T)
    b.Reshape(x, [2, -1])  # the shape input is tensor(int64)
"""

from __future__ import annotations

import functools
import inspect
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from autoclust import ops
from autoclust.errors import BuildError

# The default-domain opset of every Builder graph (bodies of Loop/If share the model's).
# 21 holds the newest form of every op in the table (GroupNormalization's, the newest).
OPSET = 21

_ATTR = onnx.defs.OpSchema.AttrType
_OPTION = onnx.defs.OpSchema.FormalParameterOption
_DTYPE_ATTRS = ("to", "dtype")  # INT attributes that hold a TensorProto data type


@functools.cache
def schema(op: str, domain: str = "") -> onnx.defs.OpSchema:
    """The ONNX schema of `op` at the Builder's opset."""
    try:
        return onnx.defs.get_schema(op, OPSET, domain)
    except onnx.defs.SchemaError as exc:
        raise BuildError(f"{op}: no ONNX schema at opset {OPSET}: {exc}") from None


def _tensor_dtype(type_str: str) -> np.dtype | None:
    """'tensor(float)' -> float32; None for types NumPy cannot hold (bfloat16, string)."""
    if not type_str.startswith("tensor(") or not type_str.endswith(")"):
        return None
    name = type_str[len("tensor("):-1].upper()
    try:
        dt = np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.DataType.Value(name)))
    except (KeyError, TypeError, ValueError):
        return None
    return dt if dt.kind in "biuf" and dt.itemsize <= 8 else None


@functools.cache
def _allowed(op: str, domain: str, type_param: str) -> tuple[np.dtype, ...]:
    for c in schema(op, domain).type_constraints:
        if c.type_param_str == type_param:
            found = (_tensor_dtype(t) for t in c.allowed_type_strs)
            return tuple(dt for dt in found if dt is not None)
    dt = _tensor_dtype(type_param)
    return () if dt is None else (dt,)


def formal_input(s: onnx.defs.OpSchema, index: int) -> onnx.defs.OpSchema.FormalParameter:
    """The schema's formal input for argument `index` (the last one repeats if variadic)."""
    return s.inputs[min(index, len(s.inputs) - 1)]


def bind(op: str, s: onnx.defs.OpSchema, args: Sequence[Any], kwargs: dict[str, Any]
         ) -> tuple[list[Any], dict[str, Any]]:
    """Split (positional, keyword) arguments into the op's inputs and its attributes."""
    inputs = list(args)
    variadic = bool(s.inputs) and s.inputs[-1].option == _OPTION.Variadic
    if len(inputs) > len(s.inputs) and not variadic:
        names = ", ".join(p.name for p in s.inputs)
        raise BuildError(f"{op} takes at most {len(s.inputs)} inputs ({names}), "
                         f"got {len(inputs)}")
    attrs: dict[str, Any] = {}
    input_index = {p.name: i for i, p in enumerate(s.inputs)}
    for key, value in kwargs.items():
        if key in s.attributes:
            attrs[key] = coerce_attr(op, s.attributes[key], key, value)
        elif key in input_index:
            i = input_index[key]
            if i < len(inputs) and inputs[i] is not None:
                raise BuildError(f"{op}: input {key!r} given both by position and by name")
            inputs += [None] * (i + 1 - len(inputs))
            inputs[i] = value
        else:
            raise BuildError(f"{op} has no attribute or input {key!r}; attributes: "
                             f"{', '.join(sorted(s.attributes)) or 'none'}; inputs: "
                             f"{', '.join(input_index)}")
    for i, p in enumerate(s.inputs):
        if p.option == _OPTION.Single and (i >= len(inputs) or inputs[i] is None):
            raise BuildError(f"{op}: missing required input {i} ({p.name!r})")
    for key, a in s.attributes.items():
        if a.required and key not in attrs:
            raise BuildError(f"{op}: missing required attribute {key!r}")
    return inputs, attrs


def _dtype_enum(value: Any) -> int:
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        return int(value)
    return helper.np_dtype_to_tensor_dtype(np.dtype(value))


def coerce_attr(op: str, a: onnx.defs.OpSchema.Attribute, key: str, value: Any) -> Any:
    """`value` as the plain Python type of attribute `key` (int, float, list, array, ...)."""
    t = a.type
    try:
        if t == _ATTR.INT:
            return _dtype_enum(value) if key in _DTYPE_ATTRS else operator.index(value)
        if t == _ATTR.FLOAT:
            return float(value)
        if t == _ATTR.STRING:
            return value.decode() if isinstance(value, bytes) else str(value)
        if t == _ATTR.INTS:
            return [operator.index(v) for v in np.asarray(value).reshape(-1).tolist()]
        if t == _ATTR.FLOATS:
            return [float(v) for v in np.asarray(value, dtype=np.float64).reshape(-1)]
        if t == _ATTR.STRINGS:
            return [str(v) for v in value]
        if t == _ATTR.TENSOR:
            return np.asarray(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BuildError(f"{op}: attribute {key}={value!r} must be {t.name.lower()}: "
                         f"{exc}") from None
    raise BuildError(f"{op}: attribute {key!r} has type {t.name}, which the Builder "
                     "does not set")


def constant_dtype(op: str, domain: str, index: int, value: Any,
                   peers: dict[str, np.dtype]) -> np.dtype:
    """The dtype a plain value given as input `index` becomes.

    NumPy arrays and scalars keep theirs. Python values take the dtype of an operand
    bound to the same type parameter (`Add(x, 1.0)`), else the only or the natural
    allowed type (int64 for ints, float32 for floats, bool)."""
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype
    p = formal_input(schema(op, domain), index)
    if p.type_str in peers:
        return peers[p.type_str]
    allowed = _allowed(op, domain, p.type_str)
    kind = np.asarray(value).dtype.kind
    for want in {"b": ("bool",), "i": ("int64", "int32", "float32"),
                 "u": ("int64", "float32"), "f": ("float32", "float64")}.get(kind, ()):
        if np.dtype(want) in allowed:
            return np.dtype(want)
    names = ", ".join(dt.name for dt in allowed)
    raise BuildError(f"{op}: input {index} ({p.name!r}) takes {names or 'no NumPy type'}; "
                     f"cannot make a constant of {value!r}")


def output_count(op: str, s: onnx.defs.OpSchema, attrs: dict[str, Any], inputs: list[Any],
                 requested: int | None) -> int:
    """How many outputs to create: `n_outputs` when given, else the required ones
    (Split: `num_outputs` or the length of a constant `split`)."""
    lo, hi = s.min_output, s.max_output
    if requested is not None:
        if not lo <= requested <= hi:
            raise BuildError(f"{op} has {lo} to {hi} outputs; n_outputs={requested}")
        return requested
    if s.outputs and s.outputs[-1].option == _OPTION.Variadic:
        if "num_outputs" in attrs:
            return int(attrs["num_outputs"])
        if len(inputs) > 1 and isinstance(inputs[1], list | tuple | np.ndarray):
            return len(np.asarray(inputs[1]).reshape(-1))
        raise BuildError(f"{op}: say how many outputs (num_outputs=, a constant split, or "
                         "n_outputs=)")
    return sum(1 for p in s.outputs if p.option == _OPTION.Single)


def returns_tuple(s: onnx.defs.OpSchema, count: int) -> bool:
    """Multi-output (and variadic-output) ops return tuples; the others one Operand."""
    return count > 1 or (bool(s.outputs) and s.outputs[-1].option == _OPTION.Variadic)


# ---- method generation ------------------------------------------------------------------

def _signature(s: onnx.defs.OpSchema) -> inspect.Signature:
    kind = inspect.Parameter
    params = [kind("self", kind.POSITIONAL_ONLY)]
    for p in s.inputs:
        if p.option == _OPTION.Variadic:
            params.append(kind(p.name, kind.VAR_POSITIONAL))
            break
        default = None if p.option == _OPTION.Optional else kind.empty
        params.append(kind(p.name, kind.POSITIONAL_OR_KEYWORD, default=default))
    for key, a in sorted(s.attributes.items()):
        default = kind.empty if a.required else _attr_default(a)
        params.append(kind(key, kind.KEYWORD_ONLY, default=default))
    params.append(kind("n_outputs", kind.KEYWORD_ONLY, default=None))
    params.append(kind("name", kind.KEYWORD_ONLY, default=""))
    return inspect.Signature(params)


def _attr_default(a: onnx.defs.OpSchema.Attribute) -> Any:
    if not a.default_value.name:
        return None
    value = helper.get_attribute_value(a.default_value)
    return value.decode() if isinstance(value, bytes) else value


def make_method(op: str, domain: str) -> Callable[..., Any]:
    """`Builder.<op>`: emits one `op` node; its signature and help come from the schema."""
    s = schema(op, domain)

    def method(self: Any, *inputs: Any, n_outputs: int | None = None, name: str = "",
               **kwargs: Any) -> Any:
        return self.op(op, *inputs, n_outputs=n_outputs, name=name, domain=domain, **kwargs)

    method.__name__ = method.__qualname__ = op
    ins = ", ".join(p.name + ("?" if p.option == _OPTION.Optional else "")
                    + ("..." if p.option == _OPTION.Variadic else "") for p in s.inputs)
    outs = ", ".join(p.name for p in s.outputs)
    method.__doc__ = (f"ONNX {op}({ins}) -> {outs} (opset {OPSET}, since "
                      f"{s.since_version}); keyword arguments are its attributes: "
                      f"{', '.join(sorted(s.attributes)) or 'none'}.")
    method.__signature__ = _signature(s)  # type: ignore[attr-defined]
    return method


def install_methods(cls: type) -> None:
    """Add a method per op of the op table that ONNX defines at OPSET to `cls` (never over an
    existing name); ops newer than OPSET (CumProd, Swish, RMSNormalization) need
    `b.op("CumProd", ...)` in a graph of a newer opset, which the Builder does not write."""
    for d in ops.all_ops():
        if d.domain == "" and not hasattr(cls, d.op) and onnx.defs.has(d.op, OPSET, d.domain):
            setattr(cls, d.op, make_method(d.op, d.domain))
