"""The exceptions autoclust raises. Every message names what is wrong: input, shape, dtype, node, op.

Raised through a session, they are also the exception type onnxruntime raises for the same
mistake (`also(InvalidInputError, InvalidArgument)`), so `except` clauses written for
onnxruntime keep working under autoclust; this module itself never imports onnxruntime.
"""

from __future__ import annotations

import threading


class AutoclustError(Exception):
    """Base class of every error autoclust raises on purpose."""


class FlagError(AutoclustError, ValueError):
    """An unknown flag or a bad flag value in AUTOCLUST_FLAGS or keyword overrides."""


class ModelLoadError(AutoclustError):
    """The model could not be read, parsed or checked."""


class InvalidInputError(AutoclustError, ValueError):
    """A feed passed to run() has a wrong name, dtype, rank or dimension."""


class InvalidShapeError(InvalidInputError):
    """At run time a value's shape is impossible: a negative dim, a size past int64, a
    buffer over --max_buffer_bytes, or a shape its op rejects mid-run (Pad cropping more
    than the tensor holds). Names the node, the value and the shape. onnxruntime raises
    its Fail for these (not InvalidArgument), and so does a session."""


class OutOfBoundsError(AutoclustError, RuntimeError):
    """Under --check_bounds a compiled kernel tried to read or write outside a buffer (an
    autoclust bug: a shape check is missing); names the kernel, its nodes, the buffer and
    the element."""


class ShapeInferenceError(AutoclustError):
    """An op's shape or dtype rule rejected its inputs."""


class UnsupportedOpError(AutoclustError):
    """An op is not in the op table (or not for this device)."""


class CompileError(AutoclustError):
    """A cluster failed to compile; the runtime falls back to onnxruntime unless must-compile."""


class NotCompilableError(AutoclustError):
    """Under --must_compile, some nodes could not be compiled; the message lists each and why."""


class RunTerminatedError(AutoclustError):
    """run() stopped between steps because its RunOptions.terminate was set."""


_mixed: dict[tuple[type, type], type] = {}
_mixed_lock = threading.Lock()


def also(cls: type[AutoclustError], other: type[BaseException]) -> type[AutoclustError]:
    """A subclass of `cls` that is also an `other` (an onnxruntime exception type, say).

    It keeps `cls`'s name and module, so tracebacks still read autoclust.errors.<Name>, and
    pickles by rebuilding the same pair. Made once per pair.
    """
    if issubclass(cls, other):
        return cls
    key = (cls, other)
    with _mixed_lock:
        sub = _mixed.get(key)
        if sub is None:
            sub = type(cls.__name__, (cls, other), {
                "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                "__doc__": f"{cls.__doc__} Also an {other.__module__}.{other.__qualname__}.",
                "__reduce__": _reduce})
            _mixed[key] = sub
    return sub


def _reduce(self: BaseException) -> tuple:
    base, other = next(k for k, v in _mixed.items() if v is type(self))
    return _rebuild, (base, other, self.args)


def _rebuild(base: type[AutoclustError], other: type[BaseException], args: tuple) -> BaseException:
    return also(base, other)(*args)


class BuildError(AutoclustError, ValueError):
    """A Builder program is malformed: an unknown attribute, a wrong operand, a loop body
    whose outputs do not match its inputs, ... The message names the op and the operands."""


class TraceError(AutoclustError, TypeError):
    """A Python function cannot be traced: an unsupported NumPy function or argument type,
    or Python control flow that depends on a traced value."""


class DeviceUnavailableError(AutoclustError):
    """A device was asked for (--device=gpu) that this machine lacks: the message names what
    is missing (CuPy, a CUDA GPU)."""


class RegistrationError(AutoclustError, ValueError):
    """autoclust.register_op was given a bad registration (a duplicate, a bad kernel or
    shape rule); the message names the op as DOMAIN::OP_TYPE."""


class KernelError(AutoclustError, RuntimeError):
    """A custom op's kernel failed: it raised, returned an error code or results of the wrong
    dtype/shape; the message names the op and the node."""
