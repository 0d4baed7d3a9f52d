"""Rewrite older ONNX opset forms of a node into the newest form the op table expects.

The contract is /work/briefs/forms.md. Values that used to be attributes become constant
initializer inputs; a node whose old form has no exact newest-form equivalent moves to
domain LEGACY, so the op table never sees it and it falls back to onnxruntime:

    ReduceSum-11(x){axes=[1]}   ->  ReduceSum(x, %axes=[1])
    Clip-6(x){min=0., max=6.}   ->  Clip(x, %min=0., %max=6.)
    Softmax-11(x:[a,b,c]){axis=1} -> autoclust.legacy::Softmax (flattening semantics)

Nodes keep `proto` (the original NodeProto), so the exporter still writes the old form.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autoclust.ir import Node, Value

LEGACY = "autoclust.legacy"

# (node, hint, array) -> a new constant initializer Value with a unique name
AddConst = Callable[[Node, str, np.ndarray], Value]

# The opset in which each op reached the form forms.md describes (the exporter uses it
# to know which default-domain opset a node without proto needs).
FORM_VERSION = {
    "ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceProd": 18,
    "ReduceL1": 18, "ReduceL2": 18, "ReduceLogSum": 18, "ReduceLogSumExp": 18,
    "ReduceSumSquare": 18, "Squeeze": 13, "Unsqueeze": 13, "Split": 18, "Slice": 10,
    "Clip": 11, "Pad": 11, "Dropout": 12, "TopK": 11, "Softmax": 13, "LogSoftmax": 13,
    "Hardmax": 13, "BatchNormalization": 15, "LayerNormalization": 17,
    "GroupNormalization": 21, "Gelu": 20, "ArgMax": 12, "ArgMin": 12, "Reshape": 5,
    "Cast": 6, "Concat": 4,
}

_BINARY_BROADCAST_OPS = ("Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal",
                         "Greater", "Less", "PRelu")


def _set_input(node: Node, index: int, value: Value | None) -> None:
    while len(node.inputs) <= index:
        node.inputs.append(None)
    node.inputs[index] = value


def _rank(v: Value | None) -> int | None:
    return None if v is None else v.rank


def _axes_to_input(node: Node, add: AddConst, version: int, since: int) -> None:
    # ReduceX(x){axes} -> ReduceX(x, axes); Squeeze/Unsqueeze likewise
    if version >= since:
        return
    axes = node.attrs.pop("axes", None)
    if axes is not None:
        _set_input(node, 1, add(node, "axes", np.asarray(axes, np.int64).reshape(-1)))


def _split(node: Node, add: AddConst, version: int) -> bool:
    if version < 13 and "split" in node.attrs:
        split = np.asarray(node.attrs.pop("split"), np.int64).reshape(-1)
        _set_input(node, 1, add(node, "split", split))
    has_split = len(node.inputs) > 1 and node.inputs[1] is not None
    if not has_split:
        node.attrs["num_outputs"] = len(node.outputs)
    return True


def _slice(node: Node, add: AddConst, version: int) -> bool:
    if version >= 10:
        return True
    for index, key in enumerate(("starts", "ends", "axes"), start=1):
        if key in node.attrs:
            array = np.asarray(node.attrs.pop(key), np.int64).reshape(-1)
            _set_input(node, index, add(node, key, array))
    return True


def _clip(node: Node, add: AddConst, version: int) -> bool:
    if version >= 11:
        return True
    node.attrs.pop("consumed_inputs", None)
    dtype = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
    bounds = [(i, key) for i, key in ((1, "min"), (2, "max")) if key in node.attrs]
    if bounds and dtype is None:
        return False
    for index, key in bounds:
        _set_input(node, index, add(node, key, np.asarray(node.attrs.pop(key), dtype)))
    return True


def _pad(node: Node, add: AddConst, version: int) -> bool:
    if version >= 11:
        return True
    pads = node.attrs.pop("pads", node.attrs.pop("paddings", None))
    value = float(node.attrs.pop("value", 0.0))
    if pads is None:
        return False
    mode = node.attrs.get("mode", "constant")
    dtype = node.inputs[0].dtype if node.inputs[0] is not None else None
    if mode == "constant" and value != 0.0 and dtype is None:
        return False
    _set_input(node, 1, add(node, "pads", np.asarray(pads, np.int64).reshape(-1)))
    if mode == "constant" and dtype is not None:
        _set_input(node, 2, add(node, "constant_value", np.asarray(value, dtype)))
    return True


def _dropout(node: Node, add: AddConst, version: int) -> bool:
    if version >= 12:
        return True
    for key in ("ratio", "is_test", "consumed_inputs"):
        node.attrs.pop(key, None)
    # Before opset 10 the mask had the data's dtype; the newest form's is bool.
    return version >= 10 or len(node.outputs) < 2


def _topk(node: Node, add: AddConst, version: int) -> bool:
    if version < 10:
        if "k" not in node.attrs:
            return False
        k = np.asarray([node.attrs.pop("k")], np.int64)
        _set_input(node, 1, add(node, "k", k))
    return True


def _softmax(node: Node, add: AddConst, version: int) -> bool:
    if version >= 13:
        return True
    # Before 13 the input is flattened to 2-D at `axis`; that equals a softmax along one
    # axis only when `axis` is the last one.
    rank = _rank(node.inputs[0])
    axis = int(node.attrs.get("axis", 1))
    if rank is None or rank == 0 or not -rank <= axis < rank:
        return False
    if axis % rank != rank - 1:
        return False
    node.attrs["axis"] = -1
    return True


def _batch_norm(node: Node, add: AddConst, version: int) -> bool:
    if len(node.outputs) > 1 or int(node.attrs.get("training_mode", 0)) == 1:
        return False
    if int(node.attrs.get("spatial", 1)) == 0 or int(node.attrs.get("is_test", 1)) == 0:
        return False
    for key in ("is_test", "spatial", "consumed_inputs", "momentum", "training_mode"):
        node.attrs.pop(key, None)
    return True


def _group_norm(node: Node, add: AddConst, version: int, constant: ConstOf) -> bool:
    if version >= 21:
        return True
    # Opset 18-20 take scale and bias per group; 21 per channel: repeat each group's value.
    x = node.inputs[0]
    groups = node.attrs.get("num_groups")
    channels = x.shape[1] if x is not None and x.shape and len(x.shape) > 1 else None
    if not isinstance(channels, int) or not groups or channels % int(groups):
        return False
    params = [constant(v) for v in node.inputs[1:3]]
    if len(params) != 2 or any(p is None or p.size != groups for p in params):
        return False
    for index, (key, p) in enumerate(zip(("scale", "bias"), params), start=1):
        per_channel = np.repeat(p.reshape(-1), channels // int(groups))
        _set_input(node, index, add(node, key, per_channel))
    return True


def _binary_broadcast(node: Node, add: AddConst, version: int) -> bool:
    if version >= 7 or "broadcast" not in node.attrs:
        return True
    broadcast = int(node.attrs.pop("broadcast"))
    axis = node.attrs.pop("axis", None)
    if broadcast and axis is not None:
        # Legacy broadcasting aligns B at `axis`; NumPy's aligns it at the end.
        ra, rb = _rank(node.inputs[0]), _rank(node.inputs[1])
        if ra is None or rb is None or int(axis) % max(ra, 1) != ra - rb:
            return False
    return True


def _reshape(node: Node, add: AddConst, version: int) -> bool:
    if version < 5:
        if "shape" not in node.attrs:
            return False
        shape = np.asarray(node.attrs.pop("shape"), np.int64).reshape(-1)
        _set_input(node, 1, add(node, "shape", shape))
    return True


def _cast(node: Node, add: AddConst, version: int) -> bool:
    to = node.attrs.get("to")
    if isinstance(to, str | bytes):
        from onnx import TensorProto
        name = to.decode() if isinstance(to, bytes) else to
        try:
            node.attrs["to"] = int(TensorProto.DataType.Value(name.upper()))
        except ValueError:
            return False
    return True


def _concat(node: Node, add: AddConst, version: int) -> bool:
    if version < 4:
        node.attrs.setdefault("axis", 1)
    return True


def _gemm(node: Node, add: AddConst, version: int) -> bool:
    if version < 7:
        node.attrs.pop("broadcast", None)
    return True


ConstOf = Callable[[Value | None], np.ndarray | None]
Rule = Callable[[Node, AddConst, int], bool]

_RULES: dict[str, Rule] = {
    "Split": _split, "Slice": _slice, "Clip": _clip, "Pad": _pad, "Dropout": _dropout,
    "TopK": _topk, "Softmax": _softmax, "LogSoftmax": _softmax, "Hardmax": _softmax,
    "BatchNormalization": _batch_norm, "Reshape": _reshape, "Cast": _cast,
    "Concat": _concat, "Gemm": _gemm,
}
for _op in _BINARY_BROADCAST_OPS:
    _RULES[_op] = _binary_broadcast


def normalize_node(node: Node, version: int, add: AddConst, constant: ConstOf) -> None:
    """Rewrite `node` (default domain, opset `version`) in place into its newest form.

    Moves it to domain LEGACY when the old form cannot be expressed in the new one.
    `add` makes constant initializers; `constant` returns a value's constant array or None.
    """
    if node.domain not in ("", "ai.onnx"):
        return
    if version < 6:
        node.attrs.pop("consumed_inputs", None)
    op = node.op
    ok = True
    saved_attrs, saved_inputs = dict(node.attrs), list(node.inputs)
    if op.startswith("Reduce") and op in FORM_VERSION:
        _axes_to_input(node, add, version, FORM_VERSION[op])
    elif op in ("Squeeze", "Unsqueeze"):
        _axes_to_input(node, add, version, 13)
    elif op == "GroupNormalization":
        ok = _group_norm(node, add, version, constant)
    elif op in _RULES:
        ok = _RULES[op](node, add, version)
    if not ok:
        # A legacy node keeps exactly its original attributes and inputs.
        node.attrs, node.inputs = saved_attrs, saved_inputs
        node.domain = LEGACY
