"""Layout, shape and data-dependent ops: reference and infer vs onnxruntime, symbolic infer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.op_harness import check_op

from autoclust import ops
from autoclust.errors import InvalidInputError, ShapeInferenceError
from autoclust.ops import InferContext

RNG = np.random.default_rng(0)
BIG = np.iinfo(np.int64).max
SMALL = np.iinfo(np.int64).min


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def ints(shape: tuple, low: int, high: int, dtype: str = "int64") -> np.ndarray:
    return RNG.integers(low, high, size=shape).astype(dtype)


# (op, inputs, attrs, n_outputs)
CASES = [
    # Reshape: 0 copies, -1 infers, allowzero, 0-d, empty
    ("Reshape", [f32(2, 3, 4), i64(0, -1)], {}, 1),
    ("Reshape", [f32(2, 3, 4), i64(-1)], {}, 1),
    ("Reshape", [f32(2, 3, 4), i64(4, 0, 2)], {}, 1),
    ("Reshape", [f32(1), np.zeros(0, np.int64)], {}, 1),
    ("Reshape", [f32(1, 1), np.zeros(0, np.int64)], {}, 1),
    ("Reshape", [f32(0, 3), i64(-1, 3)], {}, 1),
    ("Reshape", [f32(0, 3), i64(3, 0)], {"allowzero": 1}, 1),
    ("Reshape", [ints((2, 6), 0, 9, "int32"), i64(3, 1, -1)], {}, 1),
    # Transpose
    ("Transpose", [f32(2, 3, 4)], {}, 1),
    ("Transpose", [f32(2, 3, 4)], {"perm": [1, 0, 2]}, 1),
    ("Transpose", [f32(2, 0, 4)], {"perm": [2, 0, 1]}, 1),
    ("Transpose", [np.array(3.0, np.float32)], {}, 1),
    # Squeeze / Unsqueeze
    ("Squeeze", [f32(1, 3, 1, 2)], {}, 1),
    ("Squeeze", [f32(1, 3, 1, 2), i64(-2)], {}, 1),
    ("Squeeze", [f32(1), i64(0)], {}, 1),
    ("Unsqueeze", [f32(3, 4), i64(0, -1)], {}, 1),
    ("Unsqueeze", [np.array(2.0, np.float32), i64(0)], {}, 1),
    ("Unsqueeze", [f32(3, 0), i64(1, 3)], {}, 1),
    # Flatten
    ("Flatten", [f32(2, 3, 4)], {}, 1),
    ("Flatten", [f32(2, 3, 4)], {"axis": 0}, 1),
    ("Flatten", [f32(2, 3, 4)], {"axis": -1}, 1),
    ("Flatten", [f32(2, 3, 4)], {"axis": 3}, 1),
    ("Flatten", [f32(2, 0, 4)], {"axis": 2}, 1),
    # Expand: bidirectional
    ("Expand", [f32(3, 1), i64(2, 1, 4)], {}, 1),
    ("Expand", [f32(2, 3), i64(3)], {}, 1),
    ("Expand", [f32(2, 3), i64(1, 1)], {}, 1),
    ("Expand", [np.array(1.5, np.float32), i64(2, 2)], {}, 1),
    ("Expand", [f32(1, 3), i64(0, 1)], {}, 1),
    # Concat
    ("Concat", [f32(2, 3), f32(2, 5)], {"axis": 1}, 1),
    ("Concat", [f32(2, 3), f32(1, 3), f32(4, 3)], {"axis": -2}, 1),
    ("Concat", [f32(0, 3), f32(2, 3)], {"axis": 0}, 1),
    ("Concat", [i64(1, 2), i64(3)], {"axis": 0}, 1),
    # Tile
    ("Tile", [f32(2, 3), i64(2, 1)], {}, 1),
    ("Tile", [f32(2, 3), i64(0, 3)], {}, 1),
    # Slice: clamping, negative steps, axes, int32 indices
    ("Slice", [f32(5, 6), i64(1), i64(4)], {}, 1),
    ("Slice", [f32(5, 6), i64(-3, 1), i64(BIG, 100), i64(0, 1)], {}, 1),
    ("Slice", [f32(5, 6), i64(4), i64(SMALL), i64(-1), i64(-1)], {}, 1),
    ("Slice", [f32(5, 6), i64(10), i64(-10), i64(1), i64(-2)], {}, 1),
    ("Slice", [f32(5, 6), i64(-100), i64(100), i64(0), i64(2)], {}, 1),
    ("Slice", [f32(5, 6), i64(3), i64(1), i64(0), i64(1)], {}, 1),
    ("Slice", [f32(5, 6), i64(0, 5), i64(5, -7), i64(-1, 0), i64(-2, 1)], {}, 1),
    ("Slice", [f32(5, 6), np.array([1], np.int32), np.array([3], np.int32)], {}, 1),
    ("Slice", [f32(0, 4), i64(1), i64(3), i64(1)], {}, 1),
    # Split: split input, num_outputs even and uneven
    ("Split", [f32(6, 4), i64(2, 4)], {"axis": 0}, 2),
    ("Split", [f32(6, 4), i64(1, 0, 3)], {"axis": -1}, 3),
    ("Split", [f32(6, 4)], {"axis": 0, "num_outputs": 3}, 3),
    ("Split", [f32(7, 2)], {"axis": 0, "num_outputs": 3}, 3),
    ("Split", [f32(2, 5)], {"axis": 1, "num_outputs": 2}, 2),
    # Pad: every mode, negative pads, constant value, axes
    ("Pad", [f32(3, 4), i64(1, 2, 0, 1)], {}, 1),
    ("Pad", [f32(3, 4), i64(1, 2, 0, 1), np.array(2.5, np.float32)], {}, 1),
    ("Pad", [f32(3, 4), i64(-1, 1, 2, -2)], {}, 1),
    ("Pad", [f32(3, 4), i64(2, 1, 1, 3)], {"mode": "reflect"}, 1),
    ("Pad", [f32(3, 4), i64(2, 1, 1, 3)], {"mode": "edge"}, 1),
    ("Pad", [f32(3, 4), i64(2, 1, 1, 3)], {"mode": "wrap"}, 1),
    ("Pad", [f32(5), i64(-1, 2)], {"mode": "reflect"}, 1),
    ("Pad", [f32(2, 3, 4), i64(1, 2), None, i64(-1)], {"mode": "edge"}, 1),
    ("Pad", [ints((2, 3), 0, 9), i64(1, 0, 0, 1), i64(7)], {}, 1),
    ("Pad", [f32(0, 3), i64(1, 0, 1, 0)], {}, 1),
    # Trilu
    ("Trilu", [f32(4, 5)], {}, 1),
    ("Trilu", [f32(2, 4, 5), i64(1).reshape(())], {"upper": 0}, 1),
    ("Trilu", [f32(4, 5), i64(-2).reshape(())], {"upper": 1}, 1),
    ("Trilu", [f32(3, 3), i64(-7).reshape(())], {"upper": 0}, 1),
    ("Trilu", [ints((3, 0), 0, 5)], {}, 1),
    # Identity, Dropout
    ("Identity", [f32(2, 3)], {}, 1),
    ("Identity", [np.array(True)], {}, 1),
    ("Dropout", [f32(2, 3)], {}, 1),
    ("Dropout", [f32(2, 3)], {}, 2),
    # DepthToSpace / SpaceToDepth
    ("DepthToSpace", [f32(1, 8, 2, 3)], {"blocksize": 2}, 1),
    ("DepthToSpace", [f32(2, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, 1),
    ("SpaceToDepth", [f32(2, 3, 4, 6)], {"blocksize": 2}, 1),
    # Gather family
    ("Gather", [f32(5, 4), i64(0, -1, 3)], {}, 1),
    ("Gather", [f32(5, 4), i64(2).reshape(())], {"axis": 1}, 1),
    ("Gather", [f32(5, 4, 3), ints((2, 2), -4, 4, "int32")], {"axis": -2}, 1),
    ("Gather", [f32(5, 4), np.zeros((0,), np.int64)], {"axis": 0}, 1),
    ("Gather", [i64(3, 7, 9), i64(1).reshape(())], {}, 1),
    ("GatherElements", [f32(3, 4), ints((3, 2), -4, 4)], {"axis": 1}, 1),
    ("GatherElements", [f32(3, 4), ints((2, 4), -3, 3)], {"axis": 0}, 1),
    ("GatherND", [f32(3, 4, 2), ints((5, 2), -3, 3)], {}, 1),
    ("GatherND", [f32(3, 4, 2), ints((3, 1), 0, 4)], {"batch_dims": 1}, 1),
    ("GatherND", [f32(2, 3, 4), ints((2, 5, 2), 0, 3)], {"batch_dims": 1}, 1),
    ("GatherND", [f32(3, 4), np.zeros((0, 2), np.int64)], {}, 1),
    # Scatter family
    ("ScatterElements", [f32(3, 4), i64(0, 2, 1).reshape(3, 1), f32(3, 1)], {"axis": 1}, 1),
    ("ScatterElements", [f32(3, 4), i64(0, -1, 0, 2).reshape(2, 2), f32(2, 2)],
     {"axis": 0, "reduction": "add"}, 1),
    ("ScatterElements", [f32(3, 4), i64(0, 0, 1, 1).reshape(2, 2), f32(2, 2)],
     {"axis": 1, "reduction": "mul"}, 1),
    ("ScatterElements", [f32(3, 4), i64(3, 3, 1).reshape(1, 3), f32(1, 3)],
     {"axis": 1, "reduction": "max"}, 1),
    ("ScatterND", [f32(4, 3), i64(1, 3).reshape(2, 1), f32(2, 3)], {}, 1),
    ("ScatterND", [f32(4, 3), i64(1, 2, 1, 2, 0, 0).reshape(3, 2), f32(3)],
     {"reduction": "add"}, 1),
    ("ScatterND", [f32(4, 3), i64(1, 1).reshape(2, 1), f32(2, 3)], {"reduction": "min"}, 1),
    # OneHot: negative and out-of-range indices, axis
    ("OneHot", [i64(0, 2, -1, 5), i64(4), np.array([0.0, 1.0], np.float32)], {}, 1),
    ("OneHot", [ints((2, 3), 0, 3), i64(3), i64(-2, 7)], {"axis": 0}, 1),
    ("OneHot", [ints((2, 3), 0, 3), i64(3), np.array([0.5, 2.0], np.float32)],
     {"axis": -2}, 1),
    # ReverseSequence: time-major and batch-major
    ("ReverseSequence", [f32(4, 3, 2), i64(4, 1, 2)], {}, 1),
    ("ReverseSequence", [f32(3, 5), i64(0, 5, 2)], {"batch_axis": 0, "time_axis": 1}, 1),
]

SHAPE_CASES = [
    ("Shape", [f32(2, 3, 4)], {}, 1),
    ("Shape", [f32(2, 3, 4)], {"start": 1}, 1),
    ("Shape", [f32(2, 3, 4)], {"start": -2, "end": -1}, 1),
    ("Shape", [f32(2, 3, 4)], {"start": 5, "end": 9}, 1),
    ("Shape", [np.array(1.0, np.float32)], {}, 1),
    ("Size", [f32(2, 3, 4)], {}, 1),
    ("Size", [f32(0, 3)], {}, 1),
    ("ConstantOfShape", [i64(2, 3)], {}, 1),
    ("ConstantOfShape", [i64(2, 0)], {}, 1),
    ("ConstantOfShape", [np.zeros(0, np.int64)],
     {"value": helper.make_tensor("value", TensorProto.FLOAT, [1], [2.5])}, 1),
    ("ConstantOfShape", [i64(3)], {"value": numpy_helper.from_array(i64(7))}, 1),
    ("Range", [i64(0).reshape(()), i64(10).reshape(()), i64(3).reshape(())], {}, 1),
    ("Range", [i64(10).reshape(()), i64(2).reshape(()), i64(-3).reshape(())], {}, 1),
    ("Range", [i64(5).reshape(()), i64(2).reshape(()), i64(1).reshape(())], {}, 1),
    ("Range", [np.array(0.1, np.float32), np.array(10.0, np.float32),
               np.array(0.3, np.float32)], {}, 1),
    ("Range", [np.array(1, np.int32), np.array(-4, np.int32), np.array(-2, np.int32)], {}, 1),
    ("EyeLike", [f32(3, 4)], {}, 1),
    ("EyeLike", [f32(4, 3)], {"k": -1, "dtype": TensorProto.INT64}, 1),
    ("EyeLike", [ints((3, 3), 0, 2, "int32")], {"k": 5}, 1),
    ("NonZero", [np.array([[1, 0, 2], [0, 0, 3]], np.float32)], {}, 1),
    ("NonZero", [np.zeros((0, 3), np.float32)], {}, 1),
    ("NonZero", [np.array([True, False, True])], {}, 1),
    ("NonZero", [np.array(3.0, np.float32)], {}, 1),
    ("Unique", [np.array([3, 1, 3, 2, 1, 5], np.float32)], {}, 4),
    ("Unique", [np.array([3, 1, 3, 2, 1, 5], np.float32)], {"sorted": 0}, 4),
    ("Unique", [ints((3, 4), 0, 3)], {}, 4),
    ("Unique", [np.array([[3, 1], [3, 1], [0, 2]], np.int64)], {"axis": 0}, 4),
    ("Unique", [np.array([[3, 1], [3, 1], [0, 2]], np.int64)], {"axis": 0, "sorted": 0}, 4),
    ("Unique", [np.array([[2, 1, 2], [0, 3, 0]], np.float32)], {"axis": -1}, 4),
    ("Unique", [np.zeros(0, np.float32)], {}, 4),
]


def _case_id(case: tuple) -> str:
    op, inputs, attrs, _ = case
    shapes = "_".join("x".join(map(str, np.shape(x))) or "s" for x in inputs if x is not None)
    keys = "_".join(f"{k}" for k in attrs)
    return f"{op}-{shapes}-{keys}"


@pytest.mark.parametrize("case", CASES + SHAPE_CASES, ids=_case_id)
def test_op_matches_onnxruntime(case: tuple) -> None:
    op, inputs, attrs, n_outputs = case
    check_op(op, inputs, attrs, n_outputs=n_outputs)


# ---- symbolic infer ----------------------------------------------------------------------

def infer(op: str, shapes: list, values: list | None = None, attrs: dict | None = None,
          dtypes: list | None = None) -> list:
    """Run op's infer rule on symbolic shapes; values[i] is input i's constant or None."""
    values = values or [None] * len(shapes)
    dtypes = dtypes or [np.dtype("float32")] + [np.dtype("int64")] * (len(shapes) - 1)
    present = [s is not None or v is not None for s, v in zip(shapes, values)]
    ctx = InferContext(op, dtypes, shapes, values, attrs or {}, present, "n0")
    return ops.get(op).infer(ctx)


def out_shape(*args, **kw) -> tuple | None:
    return infer(*args, **kw)[0][1]


@pytest.mark.parametrize("x, spec, expected", [
    (("B", "S", 768), [0, 0, 12, 64], ("B", "S", 12, 64)),
    (("B", "S", 768), [-1, 768], (None, 768)),
    (("B", 12, 64), [-1, 768], ("B", 768)),
    (("B", "S", 12, 64), [0, 0, -1], ("B", "S", 768)),
    (("B", "S", 12, 64), [0, -1, 64], ("B", None, 64)),
    ((2, 3, 4), [-1, 4], (6, 4)),
    (("B", "S"), [0, 1, -1], ("B", 1, "S")),
])
def test_reshape_symbolic(x: tuple, spec: list, expected: tuple) -> None:
    assert out_shape("Reshape", [x, (len(spec),)], [None, i64(*spec)]) == expected


def test_reshape_unknown_shape_value_keeps_rank() -> None:
    assert out_shape("Reshape", [("B", 768), (4,)]) == (None,) * 4
    assert out_shape("Reshape", [("B", 768), ("k",)]) is None


def test_reshape_mismatch_names_node() -> None:
    with pytest.raises(ShapeInferenceError, match="n0.*Reshape"):
        out_shape("Reshape", [(2, 3), (2,)], [None, i64(4, 2)])


def test_shape_size_symbolic() -> None:
    assert infer("Shape", [("B", 3)]) == [(np.dtype("int64"), (2,))]
    assert out_shape("Shape", [("B", 3, "S")], attrs={"start": -1}) == (1,)
    assert out_shape("Shape", [None]) == (None,)
    assert out_shape("Size", [("B", 3)]) == ()


def test_concat_symbolic() -> None:
    assert out_shape("Concat", [("B", 3), ("B", 5)], attrs={"axis": 1}) == ("B", 8)
    assert out_shape("Concat", [("B", 3), ("C", 3)], attrs={"axis": 0}) == (None, 3)
    assert out_shape("Concat", [("B", 3), (0, 3)], attrs={"axis": 0}) == ("B", 3)
    assert out_shape("Concat", [("B", 3), (2, 3)], attrs={"axis": 0}) == (None, 3)
    assert out_shape("Concat", [("B", 3), (2, "D")], attrs={"axis": 0}) == (None, 3)
    with pytest.raises(ShapeInferenceError, match="Concat"):
        out_shape("Concat", [("B", 3), ("B", 4)], attrs={"axis": 0})


def test_gather_symbolic() -> None:
    assert out_shape("Gather", [("B", "S", 768), ()], attrs={"axis": 1}) == ("B", 768)
    assert out_shape("Gather", [("B", 3), ("K", 2)], attrs={"axis": -1}) == ("B", "K", 2)
    assert out_shape("GatherND", [("B", 4, 5), ("B", 7, 1)], attrs={"batch_dims": 1}) \
        == ("B", 7, 5)
    with pytest.raises(ShapeInferenceError, match="int32 or int64"):
        infer("Gather", [(3,), (2,)], dtypes=[np.dtype("float32"), np.dtype("float32")])


def test_slice_symbolic() -> None:
    full = out_shape("Slice", [("B", 6), (1,), (1,), (1,)],
                     [None, i64(0), i64(BIG), i64(0)])
    assert full == ("B", 6)
    part = out_shape("Slice", [("B", 6), (2,), (2,), (2,)],
                     [None, i64(0, 1), i64(2, -1), i64(0, 1)])
    assert part == (None, 4)
    assert out_shape("Slice", [("B", 6), (1,), (1,)]) == (None, None)


def test_layout_symbolic_misc() -> None:
    assert out_shape("Squeeze", [("B", 1, 3), (1,)], [None, i64(1)]) == ("B", 3)
    assert out_shape("Squeeze", [("B", 1, 3)]) is None  # B may be 1
    assert out_shape("Squeeze", [("B", 1, 3), (1,)]) == (None, None)
    assert out_shape("Unsqueeze", [("B", 3), (2,)], [None, i64(0, -1)]) == (1, "B", 3, 1)
    assert out_shape("Flatten", [("B", 3, 4)], attrs={"axis": 1}) == ("B", 12)
    assert out_shape("Flatten", [("B", "S", 4)], attrs={"axis": 2}) == (None, 4)
    assert out_shape("Expand", [("B", 1), (3,)], [None, i64(2, 1, 5)]) == (2, "B", 5)
    assert out_shape("Expand", [(3, 1), (3,)]) == (None, 3, None)
    assert out_shape("Transpose", [("B", "S", 4)]) == (4, "S", "B")
    assert out_shape("Tile", [("B", 3), (2,)], [None, i64(1, 2)]) == ("B", 6)
    assert out_shape("Pad", [("B", 3), (4,)], [None, i64(0, 1, 0, 1)]) == ("B", 5)
    assert out_shape("DepthToSpace", [("B", 8, 2, 3)], attrs={"blocksize": 2}) \
        == ("B", 2, 4, 6)
    assert out_shape("OneHot", [("B", 3), (), (2,)], [None, i64(10), None],
                     dtypes=[np.dtype("int64")] * 2 + [np.dtype("float32")]) == ("B", 3, 10)


def test_split_symbolic() -> None:
    outs = infer("Split", [("B", 6)], attrs={"axis": 0, "num_outputs": 2})
    assert [s for _, s in outs] == [(None, 6), (None, 6)]
    outs = infer("Split", [("B", 6), (2,)], [None, i64(2, 4)], attrs={"axis": 1})
    assert [s for _, s in outs] == [("B", 2), ("B", 4)]


def test_shape_ops_symbolic() -> None:
    assert out_shape("ConstantOfShape", [(3,)], dtypes=[np.dtype("int64")]) \
        == (None, None, None)
    assert out_shape("Range", [(), (), ()], [i64(0), None, i64(1)],
                     dtypes=[np.dtype("int64")] * 3) == (None,)
    assert out_shape("NonZero", [("B", 3)]) == (2, None)
    outs = infer("Unique", [("B", 3)], attrs={"axis": 1})
    assert [s for _, s in outs] == [("B", None), (None,), (3,), (None,)]
    assert infer("Unique", [(2, 3)])[2][1] == (6,)


# ---- errors, registration ------------------------------------------------------------------

def test_ref_errors() -> None:
    with pytest.raises(InvalidInputError, match="Gather.*out of range"):
        ops.get("Gather").ref([f32(3, 2), i64(3)], {})
    with pytest.raises(ShapeInferenceError, match="Reshape"):
        ops.get("Reshape").ref([f32(2, 3), i64(4, -1)], {})
    with pytest.raises(ShapeInferenceError, match="Split"):
        ops.get("Split").ref([f32(5)], {"num_outputs": 4})
    with pytest.raises(ShapeInferenceError, match="Split"):
        ops.get("Split").ref([f32(4)], {"num_outputs": 3})  # onnxruntime rejects it too
    with pytest.raises(ShapeInferenceError, match="Concat.*axis 2"):
        ops.get("Concat").ref([f32(2, 3), f32(2, 3)], {"axis": 2})
    with pytest.raises(InvalidInputError, match="ReverseSequence"):
        ops.get("ReverseSequence").ref([f32(3, 2), i64(4, 1)], {})
    with pytest.raises(ShapeInferenceError, match="Slice"):
        ops.get("Slice").ref([f32(5), i64(0), i64(3), i64(0), i64(0)], {})


def test_registration() -> None:
    expect = {"Reshape": (1,), "Expand": (1,), "Squeeze": (1,), "Unsqueeze": (1,),
              "Slice": (1, 2, 3, 4), "Split": (1,), "Pad": (1, 3), "Tile": (1,),
              "OneHot": (1,), "Gather": (), "Trilu": (), "ConstantOfShape": (0,),
              "Range": (0, 1, 2)}
    for op, shape_inputs in expect.items():
        assert ops.get(op).shape_inputs == shape_inputs, op
    assert ops.get("Transpose").kind == ops.LAYOUT
    assert ops.get("Shape").kind == ops.SHAPE
    for op in ("NonZero", "Unique"):
        assert ops.get(op).kind == ops.DATA_DEPENDENT and ops.get(op).data_dependent
    shape_like = {d.op for d in ops.all_ops() if d.shape_like}
    assert {"Shape", "Gather", "Concat", "Reshape", "Cast"} <= shape_like
    assert "MatMul" not in shape_like


def test_space_to_depth_crd_mode() -> None:
    # Regression (ONNX node case test_spacetodepth_crd_mode_example, opset 26+; onnxruntime
    # 1.31 cannot load it, so NumPy is the oracle): CRD must not be computed as DCR.
    x = f32(2, 3, 4, 6)
    (y,) = ops.get("SpaceToDepth").ref([x], {"blocksize": 2, "mode": "CRD"})
    want = x.reshape(2, 3, 2, 2, 3, 2).transpose(0, 1, 3, 5, 2, 4).reshape(2, 12, 2, 3)
    np.testing.assert_array_equal(y, want)
    # DepthToSpace CRD is its inverse.
    (back,) = ops.get("DepthToSpace").ref([y], {"blocksize": 2, "mode": "CRD"})
    np.testing.assert_array_equal(back, x)
