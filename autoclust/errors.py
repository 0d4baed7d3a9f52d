"""The exceptions autoclust raises. Every message names what is wrong: input, shape, dtype, node, op."""


class AutoclustError(Exception):
    """Base class of every error autoclust raises on purpose."""


class FlagError(AutoclustError, ValueError):
    """An unknown flag or a bad flag value in AUTOCLUST_FLAGS or keyword overrides."""


class ModelLoadError(AutoclustError):
    """The model could not be read, parsed or checked."""


class InvalidInputError(AutoclustError, ValueError):
    """A feed passed to run() has a wrong name, dtype, rank or dimension."""


class ShapeInferenceError(AutoclustError):
    """An op's shape or dtype rule rejected its inputs."""


class UnsupportedOpError(AutoclustError):
    """An op is not in the op table (or not for this device)."""


class CompileError(AutoclustError):
    """A cluster failed to compile; the runtime falls back to onnxruntime unless must-compile."""


class NotCompilableError(AutoclustError):
    """Under --must_compile, some nodes could not be compiled; the message lists each and why."""


class BuildError(AutoclustError, ValueError):
    """A Builder program is malformed: an unknown attribute, a wrong operand, a loop body
    whose outputs do not match its inputs, ... The message names the op and the operands."""


class TraceError(AutoclustError, TypeError):
    """A Python function cannot be traced: an unsupported NumPy function or argument type,
    or Python control flow that depends on a traced value."""
