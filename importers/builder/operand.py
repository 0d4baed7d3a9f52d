"""Operand, a value of a Builder's graph whose Python operators build ONNX ops, and the
active-builder stack that decides where `x + y` is built inside control-flow bodies."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from autoclust.errors import BuildError
from autoclust.ir import Value

if TYPE_CHECKING:
    from autoclust.importers.builder import Builder


class Operand:
    """A value of a Builder's graph: `dtype`, `shape`, `name`; operators build ONNX ops."""

    __slots__ = ("builder", "value")
    __array_ufunc__ = None  # `ndarray + operand` defers to Operand.__radd__

    def __init__(self, builder: Builder, value: Value):
        self.builder = builder
        self.value = value

    @property
    def dtype(self) -> np.dtype | None:
        return self.value.dtype

    @property
    def shape(self) -> tuple | None:
        return self.value.shape

    @property
    def name(self) -> str:
        return self.value.name

    def __repr__(self) -> str:
        return f"Operand(%{self.name}: {self.value.type_str()}, builder {self.builder.name!r})"

    def __bool__(self) -> bool:
        raise BuildError(f"{self!r} has no truth value while building; use b.if_(...) or "
                         "b.while_loop(...) for control flow that depends on it")

    def _binary(self, op: str, other: Any, reverse: bool = False) -> Operand:
        builder = _target(self, other)
        if not isinstance(other, Operand):  # a Python/NumPy value: a constant of our dtype
            other = builder.constant(other, dtype=None if isinstance(
                other, np.ndarray | np.generic) else self.dtype)
        a, b = (other, self) if reverse else (self, other)
        return builder.op(op, a, b)

    def __add__(self, other: Any) -> Operand:
        return self._binary("Add", other)

    def __radd__(self, other: Any) -> Operand:
        return self._binary("Add", other, True)

    def __sub__(self, other: Any) -> Operand:
        return self._binary("Sub", other)

    def __rsub__(self, other: Any) -> Operand:
        return self._binary("Sub", other, True)

    def __mul__(self, other: Any) -> Operand:
        return self._binary("Mul", other)

    def __rmul__(self, other: Any) -> Operand:
        return self._binary("Mul", other, True)

    def __truediv__(self, other: Any) -> Operand:
        return self._binary("Div", other)

    def __rtruediv__(self, other: Any) -> Operand:
        return self._binary("Div", other, True)

    def __matmul__(self, other: Any) -> Operand:
        return self._binary("MatMul", other)

    def __rmatmul__(self, other: Any) -> Operand:
        return self._binary("MatMul", other, True)

    def __pow__(self, other: Any) -> Operand:
        return self._binary("Pow", other)

    def __neg__(self) -> Operand:
        return _target(self, None).op("Neg", self)

    def __lt__(self, other: Any) -> Operand:
        return self._binary("Less", other)

    def __le__(self, other: Any) -> Operand:
        return self._binary("LessOrEqual", other)

    def __gt__(self, other: Any) -> Operand:
        return self._binary("Greater", other)

    def __ge__(self, other: Any) -> Operand:
        return self._binary("GreaterOrEqual", other)


_ACTIVE = threading.local()  # the body being built (Builder.while_loop & co. set it)


@contextlib.contextmanager
def active(b: Builder) -> Iterator[None]:
    """Make `b` the builder operators emit into while a body function runs."""
    stack = _ACTIVE.__dict__.setdefault("stack", [])
    stack.append(b)
    try:
        yield
    finally:
        stack.pop()


def _target(x: Operand, other: Any) -> Builder:
    """Where `x op other` is built: the active body when it sees both operands, else the
    innermost of their builders."""
    owners = [x.builder] + ([other.builder] if isinstance(other, Operand) else [])
    stack = getattr(_ACTIVE, "stack", [])
    if stack and all(o.encloses(stack[-1]) for o in owners):
        return stack[-1]
    return max(owners, key=lambda o: sum(1 for p in owners if p.encloses(o)))
