"""autoclust: an auto-clustering graph compiler for ONNX models.

    import autoclust
    sess = autoclust.InferenceSession("model.onnx")   # drop-in for onnxruntime.InferenceSession
    outs = sess.run(None, {"x": x})
"""

__version__ = "0.1.0"

from autoclust import errors  # noqa: E402,F401
from autoclust.errors import (  # noqa: E402,F401
    AutoclustError, FlagError, InvalidInputError, ModelLoadError, NotCompilableError,
)


def __getattr__(name):
    # InferenceSession imports onnxruntime; keep `import autoclust` cheap for the hook.
    if name == "InferenceSession":
        from autoclust.session import InferenceSession
        return InferenceSession
    raise AttributeError(f"module 'autoclust' has no attribute {name!r}")
