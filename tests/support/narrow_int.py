"""int8/uint8/int16/uint16 models and values (test_narrow_int, test_gpu_types)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
         "uint16": TensorProto.UINT16}


def narrow_model(nodes, inputs, outputs):
    g = helper.make_graph(nodes, "narrow", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m


def narrow_values(dtype: str, n: int, seed: int, nonzero: bool = False) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = np.array([info.min, info.max, 0, 1, info.max - 1, info.min + 1,
                      min(info.max, 100), min(info.max, 3)], np.int64)
    rng = np.random.default_rng(seed)
    x = np.concatenate([edges, rng.integers(info.min, int(info.max) + 1, n - len(edges))])
    if nonzero:
        x[x == 0] = 7
    return x.astype(dtype)


# op -> dtypes onnxruntime 1.31's CPU provider has kernels for
BINARY = {"Add": TYPES, "Sub": TYPES, "Mul": TYPES, "Div": TYPES, "Mod": TYPES,
          "BitwiseAnd": TYPES, "Max": ("int8", "uint8"), "Min": ("int8", "uint8")}


UNARY = {"Abs": TYPES, "Sign": TYPES, "Neg": ("int8", "int16"), "Relu": ("int8",)}


def chain_nodes() -> list:
    """(a + b) * a < b, then Where(c, |p - b|, a + b): one kernel."""
    return [helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Mul", ["s", "a"], ["p"]),
            helper.make_node("Less", ["p", "b"], ["c"]),
            helper.make_node("Sub", ["p", "b"], ["d"]),
            helper.make_node("Abs", ["d"], ["e"]),
            helper.make_node("Where", ["c", "e", "s"], ["y"])]
