"""Inputs for every lowered op (CASES: op -> cases), shared by the CPU lowering tests and
the GPU rendering tests."""

from __future__ import annotations

import numpy as np
import onnx

from support.compiled import rand

TO_INT32 = onnx.TensorProto.INT32


TO_F16 = onnx.TensorProto.FLOAT16


def x(*shape, dtype="float32", lo=-3.0, hi=3.0):
    return rand(shape, dtype, lo, hi)


def i64(values):
    return np.array(values, np.int64)


def f32(values):
    return np.array(values, np.float32)


# op -> [(inputs, attrs, const_inputs, n_outputs)]; a None input is an omitted optional one.
CASES: dict[str, list[tuple]] = {
    **{op: [([x(3, 5)], {}, (), 1)] for op in (
        "Neg", "Abs", "Sign", "Floor", "Ceil", "Round", "Erf", "Tanh", "Sin", "Cos", "Tan",
        "Atan", "Sinh", "Cosh", "Asinh", "Exp", "Sigmoid", "Relu", "LeakyRelu", "Elu", "Selu",
        "Celu", "Gelu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Mish",
        "ThresholdedRelu", "Shrink", "IsNaN", "IsInf", "Identity", "Reciprocal")},
    **{op: [([x(4, 6, lo=-0.9, hi=0.9)], {}, (), 1)] for op in ("Asin", "Acos", "Atanh")},
    **{op: [([x(4, 6, lo=0.1, hi=4.0)], {}, (), 1)] for op in ("Sqrt", "Log")},
    "Acosh": [([x(4, 6, lo=1.0, hi=4.0)], {}, (), 1)],
    **{op: [([x(3, 1, 5), x(4, 5)], {}, (), 1), ([x(2, 3, dtype="int64"), x(3, dtype="int64")],
                                                   {}, (), 1)]
       for op in ("Add", "Sub", "Mul", "Max", "Min", "Equal", "Less", "Greater",
                  "LessOrEqual", "GreaterOrEqual")},
    "Div": [([x(3, 1, 5), x(4, 5, lo=0.5, hi=3.0)], {}, (), 1),
            ([i64([[7, -7, 9]]), i64([2, -3, 4])], {}, (), 1)],
    "Mod": [([i64([[7, -7, 9], [5, 6, -8]]), i64([2, 3, -4])], {}, (), 1),
            ([x(2, 5), x(5, lo=0.5, hi=2.0)], {"fmod": 1}, (), 1)],
    "Pow": [([x(3, 4, lo=0.1, hi=2.0), x(4, lo=-2.0, hi=2.0)], {}, (), 1),
            ([x(3, 4), f32(2.0)], {}, (1,), 1), ([x(3, 4), f32(3.0)], {}, (1,), 1),
            ([x(3, 4, lo=0.0, hi=3.0), f32(0.5)], {}, (1,), 1)],
    "Sum": [([x(2, 3), x(3), x(2, 1)], {}, (), 1)],
    "Mean": [([x(2, 3), x(3), x(2, 1)], {}, (), 1)],
    "PRelu": [([x(2, 3, 4), x(3, 1)], {}, (), 1)],
    "And": [([x(3, 4, dtype="bool"), x(4, dtype="bool")], {}, (), 1)],
    "Or": [([x(3, 4, dtype="bool"), x(4, dtype="bool")], {}, (), 1)],
    "Xor": [([x(3, 4, dtype="bool"), x(4, dtype="bool")], {}, (), 1)],
    "Not": [([x(3, 4, dtype="bool")], {}, (), 1)],
    **{op: [([x(3, 4, dtype="int32"), x(4, dtype="int32")], {}, (), 1)]
       for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")},
    "BitwiseNot": [([x(3, 4, dtype="int64")], {}, (), 1)],
    "Where": [([x(3, 4, dtype="bool"), x(4), x(3, 1)], {}, (), 1)],
    "Cast": [([x(3, 4)], {"to": TO_INT32}, (), 1), ([x(3, 4)], {"to": TO_F16}, (), 1)],
    "CastLike": [([x(3, 4), np.zeros(1, np.int64)], {}, (), 1)],
    "Clip": [([x(3, 4), f32(-1), f32(1.5)], {}, (1, 2), 1), ([x(3, 4), None, f32(0.5)], {},
                                                             (2,), 1)],
    **{op: [([x(3, 4, 5), i64([1])], {"keepdims": 1}, (1,), 1),
            ([x(3, 4, 5), i64([0, 2])], {"keepdims": 0}, (1,), 1)]
       for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                  "ReduceLogSumExp", "ReduceSumSquare")},
    "ReduceProd": [([x(3, 4, 5, lo=0.5, hi=1.5), i64([1])], {}, (1,), 1)],
    "ReduceLogSum": [([x(3, 4, 5, lo=0.1, hi=2.0), i64([2])], {}, (1,), 1)],
    "ArgMax": [([x(4, 6)], {"axis": 1}, (), 1), ([x(4, 6)], {"axis": 0, "keepdims": 0}, (), 1)],
    "ArgMin": [([x(4, 6)], {"axis": -1, "select_last_index": 1}, (), 1)],
    "CumSum": [([x(3, 5), np.array(1, np.int64)], {}, (1,), 1),
               ([x(3, 5), np.array(0, np.int64)], {"exclusive": 1, "reverse": 1}, (1,), 1),
               ([x(4, 3, dtype="int64"), np.array(-1, np.int64)], {"reverse": 1}, (1,), 1)],
    "Softmax": [([x(3, 4, 7)], {"axis": -1}, (), 1), ([x(3, 4, 7)], {"axis": 1}, (), 1)],
    "LogSoftmax": [([x(3, 4, 7)], {"axis": -1}, (), 1)],
    "Hardmax": [([x(3, 7)], {"axis": -1}, (), 1)],
    "LayerNormalization": [([x(2, 3, 8), x(8), x(8)], {"axis": -1}, (1, 2), 3),
                           ([x(2, 3, 8), x(3, 8), None], {"axis": 1}, (1,), 1)],
    "BatchNormalization": [([x(2, 3, 4, 5), x(3), x(3), x(3), x(3, lo=0.5, hi=2)], {},
                            (1, 2, 3, 4), 1)],
    "InstanceNormalization": [([x(2, 3, 4, 5), x(3), x(3)], {}, (1, 2), 1)],
    "GroupNormalization": [([x(2, 6, 4, 5), x(6), x(6)], {"num_groups": 3}, (1, 2), 1)],
    "LpNormalization": [([x(3, 6)], {"p": 2, "axis": -1}, (), 1),
                        ([x(3, 6)], {"p": 1, "axis": 0}, (), 1)],
    "MeanVarianceNormalization": [([x(2, 3, 4, 5)], {}, (), 1)],
    "Reshape": [([x(2, 3, 4), i64([4, 6])], {}, (1,), 1), ([x(2, 3, 4), i64([0, -1])], {},
                                                           (1,), 1)],
    "Squeeze": [([x(2, 1, 4), i64([1])], {}, (1,), 1)],
    "Unsqueeze": [([x(2, 4), i64([0, 2])], {}, (1,), 1)],
    "Flatten": [([x(2, 3, 4)], {"axis": 2}, (), 1)],
    "Transpose": [([x(2, 3, 4)], {"perm": [2, 0, 1]}, (), 1)],
    "Expand": [([x(3, 1), i64([2, 3, 4])], {}, (1,), 1)],
    "Dropout": [([x(3, 4)], {}, (), 1), ([x(3, 4)], {}, (), 2)],
    "Slice": [([x(5, 6), i64([1, -1]), i64([4, 0]), i64([0, 1]), i64([2, -2])], {},
               (1, 2, 3, 4), 1)],
    "Split": [([x(6, 4), i64([2, 4])], {"axis": 0}, (1,), 2),
              ([x(4, 6)], {"axis": 1, "num_outputs": 3}, (), 3)],
    "Concat": [([x(2, 3), x(4, 3), x(1, 3)], {"axis": 0}, (), 1)],
    "Tile": [([x(2, 3), i64([2, 3])], {}, (1,), 1)],
    "Pad": [([x(3, 4), i64([1, 2, 0, 1]), f32(0.5)], {"mode": "constant"}, (1, 2), 1),
            ([x(3, 4), i64([2, 1, 2, 3])], {"mode": "reflect"}, (1,), 1),
            ([x(3, 4), i64([1, 2, 3, 0])], {"mode": "edge"}, (1,), 1),
            ([x(3, 4), i64([-1, 1, 0, -2])], {"mode": "constant"}, (1,), 1)],
    "Trilu": [([x(3, 4, 5), np.array(1, np.int64)], {"upper": 0}, (), 1),
              ([x(4, 5)], {"upper": 1}, (), 1)],
    "Gather": [([x(5, 4), i64([[0, 4], [-1, 2]])], {"axis": 0}, (), 1),
               ([x(3, 5), i64([4, -5, 1])], {"axis": 1}, (), 1),
               ([x(5, 4), np.array(2, np.int64)], {"axis": 0}, (), 1)],
    "GatherElements": [([x(4, 3), i64([[1, 0, 3], [-1, 2, 0]])], {"axis": 0}, (), 1)],
    "GatherND": [([x(3, 4, 5), i64([[0, 1], [2, 3]])], {}, (), 1),
                 ([x(2, 3, 4), i64([[1], [2]])], {"batch_dims": 1}, (), 1)],
    "OneHot": [([i64([1, 3, -1, 7]), np.array(4, np.int64), f32([0.0, 2.5])], {"axis": -1},
                (1,), 1)],
    "ReverseSequence": [([x(5, 3, 2), i64([2, 5, 0])], {"batch_axis": 1, "time_axis": 0}, (),
                         1)],
    "DepthToSpace": [([x(1, 8, 2, 3)], {"blocksize": 2, "mode": "DCR"}, (), 1),
                     ([x(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, (), 1)],
    "SpaceToDepth": [([x(1, 2, 4, 6)], {"blocksize": 2}, (), 1)],
    "Shape": [([x(2, 3, 4)], {}, (), 1), ([x(2, 3, 4)], {"start": 1}, (), 1)],
    "Size": [([x(2, 3, 4)], {}, (), 1)],
    "ConstantOfShape": [([i64([2, 3])], {"value": onnx.numpy_helper.from_array(f32([1.5]))},
                         (0,), 1)],
    "Range": [([f32(1.0), f32(9.0), f32(0.7)], {}, (0, 1, 2), 1),
              ([np.array(2, np.int64), np.array(-9, np.int64), np.array(-3, np.int64)], {},
               (0, 1, 2), 1)],
    "EyeLike": [([x(4, 5)], {"k": 1}, (), 1)],
    "Swish": [([x(3, 5)], {"alpha": 0.7}, (), 1)],
    "RMSNormalization": [([x(2, 3, 8), x(8)], {"axis": -1}, (1,), 1),
                         ([x(2, 3, 8), x(3, 8)], {"axis": 1, "epsilon": 1e-3}, (1,), 1)],
    "SimplifiedLayerNormalization": [([x(2, 3, 8), x(8)], {"axis": -1}, (1,), 2),
                                     ([x(2, 3, 8), x(3, 8)], {"axis": 1, "epsilon": 1e-3},
                                      (1,), 1)],
    "QuantizeLinear": [([x(3, 5), np.float32(0.05), np.uint8(7)], {}, (1, 2), 1),
                       ([x(3, 5), x(5, lo=0.01, hi=0.1), None], {"axis": 1}, (), 1)],
    "DequantizeLinear": [([np.arange(15, dtype=np.int8).reshape(3, 5), np.float32(0.05),
                           np.int8(-3)], {}, (1, 2), 1)],
    "CumProd": [([x(3, 5, lo=0.5, hi=1.5), np.array(1, np.int64)], {"exclusive": 1}, (1,), 1),
                ([x(4, 3, dtype="int64"), np.array(0, np.int64)], {"reverse": 1}, (1,), 1)],
}


# An op whose lowering no compilable dtype reaches: clustering refuses it by dtype.
NO_COMPILABLE_DTYPE = {"BitShift": "unsigned integers only (uint8..uint64 are not compiled)"}
