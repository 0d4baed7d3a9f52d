"""Types the CPU backend's library-call modules share: operand type, run function, dtypes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

TypeShape = tuple[np.dtype, tuple[int, ...]]
Arrays = Sequence[np.ndarray | None]
RunFn = Callable[[Arrays, Sequence[np.ndarray]], None]

F16, F32, F64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
INTS = tuple(np.dtype(t) for t in ("int32", "int64"))


def freeze(value: Any) -> Any:
    """A hashable copy of an attribute value (lists become tuples, arrays bytes)."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    return value


def describe(in_types: Sequence[TypeShape | None]) -> str:
    """dtype[shape] of each operand, for messages."""
    return ", ".join("None" if t is None else f"{t[0]}{list(t[1])}" for t in in_types)
