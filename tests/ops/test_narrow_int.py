"""int8/uint8/int16/uint16 elementwise arithmetic in compiled clusters (issue 12 part 7).

Narrow integers are stored narrow and computed in int32; every op's result wraps back to
its type (fusion.lower_node), as onnxruntime's int8 kernels do in C++ (the operation runs
on promoted ints and the result is stored narrow). Each case runs the same model through
onnxruntime's own narrow-integer kernels.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from support.narrow_int import (
    BINARY,
    TYPES,
    UNARY,
    chain_nodes,
    narrow_model,
    narrow_values,
)

import autoclust


def _check(m, feeds, n_clusters=1):
    want = ort.InferenceSession(m.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = autoclust.InferenceSession(m.SerializeToString(), must_compile=True,
                                      min_cluster_size=1)
    got = sess.run(None, feeds)
    assert len(sess.plan.clusters) == n_clusters
    assert all(c["fallback"] is None for c in sess.stats()["clusters"])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return sess




@pytest.mark.parametrize("op, dtype", [(op, t) for op, ts in BINARY.items() for t in ts])
def test_binary_ops_wrap_like_onnxruntime(op, dtype):
    code = TYPES[dtype]
    m = narrow_model([helper.make_node(op, ["a", "b"], ["y"])],
               [("a", code, [8, 16]), ("b", code, [16])], [("y", code, [8, 16])])
    a = narrow_values(dtype, 128, 0).reshape(8, 16)
    b = narrow_values(dtype, 16, 1, nonzero=op in ("Div", "Mod"))
    _check(m, {"a": a, "b": b})


@pytest.mark.parametrize("op, dtype", [(op, t) for op, ts in UNARY.items() for t in ts])
def test_unary_ops_wrap_like_onnxruntime(op, dtype):
    code = TYPES[dtype]
    m = narrow_model([helper.make_node(op, ["a"], ["y"])], [("a", code, [64])], [("y", code, [64])])
    _check(m, {"a": narrow_values(dtype, 64, 2)})  # Abs(-128) and Neg(-128) wrap to -128




@pytest.mark.parametrize("dtype", list(TYPES))
def test_a_chain_wraps_after_every_op(dtype):
    # (a + b) * a < b, then Where: one kernel; an int32 intermediate kept unwrapped
    # (100 + 100 = 200 instead of int8 -56) flips the comparison
    code = TYPES[dtype]
    nodes = chain_nodes() if dtype in ("int8", "uint8") \
        else [helper.make_node("Add", ["a", "b"], ["s"]),
              helper.make_node("Mul", ["s", "a"], ["p"]),
              helper.make_node("Sub", ["p", "b"], ["d"]),
              helper.make_node("Abs", ["d"], ["y"])]  # no int16 Less/Where in onnxruntime
    m = narrow_model(nodes, [("a", code, [256]), ("b", code, [256])], [("y", code, [256])])
    a, b = narrow_values(dtype, 256, 3), narrow_values(dtype, 256, 4)
    sess = _check(m, {"a": a, "b": b})
    assert [c["kernels"] for c in sess.stats()["clusters"]] == [[1]]  # one kernel


def test_comparison_of_narrow_ints_gives_bool():
    m = narrow_model([helper.make_node("Add", ["a", "b"], ["s"]),
                helper.make_node("Equal", ["s", "c"], ["y"])],
               [("a", TensorProto.UINT8, [32]), ("b", TensorProto.UINT8, [32]),
                ("c", TensorProto.UINT8, [32])], [("y", TensorProto.BOOL, [32])])
    a, b = narrow_values("uint8", 32, 5), narrow_values("uint8", 32, 6)
    c = a + b  # numpy wraps: 255 + 1 == 0, and Equal must see the wrapped sum
    c[::2] += 1
    _check(m, {"a": a, "b": b, "c": c})
