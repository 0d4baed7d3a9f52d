"""Tensors onnxruntime's Python API cannot take or return as NumPy arrays.

onnxruntime computes bfloat16, the float8 types, int4/uint4 and int2/uint2, but its
`run()` refuses their NumPy arrays ("Numpy_type 256 can't be converted to MLDataType") and
cannot return them ("No corresponding Numpy type for Tensor Type"). The NumPy types are
ml_dtypes' (what onnx.helper.tensor_dtype_to_np_dtype and onnx.numpy_helper use). A
session with such an input or output runs through `run_with_ort_values`: each of these
arrays is copied into an OrtValue of its ONNX type (sub-byte types packed, low bits first,
as ONNX stores them) and each such output is read back from the OrtValue's bytes.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

# ONNX element types whose NumPy type is an ml_dtypes type -> bits per element.
_BITS = {"BFLOAT16": 16, "FLOAT8E4M3FN": 8, "FLOAT8E4M3FNUZ": 8, "FLOAT8E5M2": 8,
         "FLOAT8E5M2FNUZ": 8, "FLOAT8E8M0": 8, "UINT4": 4, "INT4": 4, "FLOAT4E2M1": 4,
         "UINT2": 2, "INT2": 2}
BITS: dict[int, int] = {getattr(onnx.TensorProto, n): b for n, b in _BITS.items()
                        if hasattr(onnx.TensorProto, n)}
ELEM_TYPE: dict[np.dtype, int] = {np.dtype(helper.tensor_dtype_to_np_dtype(t)): t for t in BITS}
# onnxruntime's type strings for them ("tensor(bfloat16)", ...), as NodeArg.type says.
TYPE_STRINGS = frozenset(f"tensor({onnx.TensorProto.DataType.Name(t).lower()})" for t in BITS)


def needs_ort_values(session: Any) -> bool:
    """True when a session has an input or output of a type run() cannot pass as NumPy."""
    args = list(session.get_inputs()) + list(session.get_outputs())
    return any(a.type in TYPE_STRINGS for a in args)


def to_ort_value(value: Any) -> ort.OrtValue:
    """An OrtValue holding `value` (a copy for ml_dtypes types, shared memory otherwise)."""
    if isinstance(value, ort.OrtValue):
        return value
    arr = np.ascontiguousarray(value)
    elem = ELEM_TYPE.get(arr.dtype)
    if elem is None:
        return ort.OrtValue.ortvalue_from_numpy(arr)
    out = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), elem, "cpu")
    data = _pack(arr, BITS[elem])
    if data.nbytes:
        ctypes.memmove(out.data_ptr(), data.ctypes.data, data.nbytes)
    return out


def from_ort_value(value: Any) -> Any:
    """The NumPy array (ml_dtypes type where NumPy has none) of an OrtValue tensor; anything
    that is not an OrtValue as it is."""
    if not isinstance(value, ort.OrtValue):
        return value
    elem = value.element_type() if value.is_tensor() else None
    bits = BITS.get(elem) if elem is not None else None
    if bits is None:
        return value.numpy()
    shape = tuple(value.shape())
    nbytes = value.tensor_size_in_bytes()
    raw = np.frombuffer(ctypes.string_at(value.data_ptr(), nbytes) if nbytes else b"",
                        np.uint8)
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
    return _unpack(raw, bits, int(np.prod(shape, dtype=np.int64))).view(dtype).reshape(shape)


def packed_bytes(arr: np.ndarray) -> np.ndarray:
    """The bytes onnxruntime holds for `arr` (sub-byte types packed), as uint8."""
    elem = ELEM_TYPE.get(arr.dtype)
    arr = np.ascontiguousarray(arr)
    return _pack(arr, BITS[elem] if elem is not None else 8)


def _pack(arr: np.ndarray, bits: int) -> np.ndarray:
    """The bytes ONNX stores for `arr`: as is for whole bytes, else 8 // bits per byte."""
    raw = arr.reshape(-1).view(np.uint8)
    if bits >= 8:
        return raw
    per = 8 // bits
    mask = (1 << bits) - 1
    padded = np.zeros(-(-raw.size // per) * per, np.uint8)
    padded[:raw.size] = raw & mask
    lanes = padded.reshape(-1, per)
    out = np.zeros(lanes.shape[0], np.uint8)
    for k in range(per):  # element i sits in bits (i % per) * bits of byte i // per
        out |= lanes[:, k] << (k * bits)
    return out


def _unpack(raw: np.ndarray, bits: int, count: int) -> np.ndarray:
    """One byte per element from ONNX's packed bytes (ml_dtypes sub-byte types read the
    low bits, sign included)."""
    if bits >= 8:
        return raw.copy()
    per = 8 // bits
    mask = (1 << bits) - 1
    lanes = [(raw >> (k * bits)) & mask for k in range(per)]
    return np.stack(lanes, axis=1).reshape(-1)[:count].astype(np.uint8)


def run(session: Any, output_names: list[str] | None, feeds: dict[str, Any],
        run_options: Any = None) -> list[Any]:
    """session.run() for sessions needs_ort_values() is True for: OrtValues in and out."""
    names = output_names or [o.name for o in session.get_outputs()]
    values = {name: to_ort_value(x) for name, x in feeds.items()}
    outs = session.run_with_ort_values(names, values, run_options)
    return [from_ort_value(v) for v in outs]
