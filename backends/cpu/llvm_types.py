"""LLVM types of each dtype, as stored in buffers and as computed in registers, and constants
of them: shared by the kernel emitter (codegen.py) and the math and vector code it calls."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from autoclust.backends.cpu.loops import I64
from llvmlite import ir

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
PTR = ir.PointerType()
# Narrow integers are stored narrow and computed in int32 (as float16 is in float32): loads
# widen (sign- or zero-extend), stores truncate, and casts to them wrap (mathops.cast).
NARROW_INTS = {"int8": I8, "uint8": I8, "int16": I16, "uint16": I16}
# bfloat16 is stored as its 16 bits and computed in float32 (mathops.bfloat16_to_float /
# round_bfloat16: llvmlite has no bfloat type).
STORAGE = {"float16": ir.HalfType(), "float32": ir.FloatType(), "float64": ir.DoubleType(),
           "int32": I32, "int64": I64, "bool": I8, "bfloat16": I16, **NARROW_INTS}
COMPUTE = {"float16": ir.FloatType(), "float32": ir.FloatType(), "float64": ir.DoubleType(),
           "int32": I32, "int64": I64, "bool": ir.IntType(1), "bfloat16": ir.FloatType(),
           **{name: I32 for name in NARROW_INTS}}


def is_float(dtype: str) -> bool:
    return dtype.startswith("float") or dtype == "bfloat16"


def constant(value, dtype: str) -> ir.Constant:
    ty = COMPUTE[dtype]
    if dtype == "bool":
        return ir.Constant(ty, int(bool(value)))
    if dtype == "bfloat16":  # the register holds the rounded value
        return ir.Constant(ty, float(np.float32(ml_dtypes.bfloat16(value))))
    if is_float(dtype):
        return ir.Constant(ty, float(value))
    return ir.Constant(ty, int(value))
