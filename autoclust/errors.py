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


class DeviceUnavailableError(AutoclustError):
    """A device was asked for (--device=gpu) that this machine lacks: the message names what
    is missing (CuPy, a CUDA GPU)."""
