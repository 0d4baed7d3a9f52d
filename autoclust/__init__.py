"""autoclust: an auto-clustering graph compiler for ONNX models.

    import autoclust
    sess = autoclust.InferenceSession("model.onnx")   # drop-in for onnxruntime.InferenceSession
    outs = sess.run(None, {"x": x})
"""

from autoclust.version import __version__  # noqa: F401


def _add_source_tree() -> None:
    # importers/, backends/, tools/ and models/ install as autoclust.importers, ... (see
    # pyproject.toml). Run from a source checkout without installing, they sit beside this
    # package: let the import system find them there too (after the installed locations).
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and \
            os.path.isdir(os.path.join(root, "importers")) and root not in __path__:
        __path__.append(root)


_add_source_tree()

from autoclust import errors  # noqa: F401
from autoclust.errors import (  # noqa: F401
    AutoclustError,
    FlagError,
    InvalidInputError,
    ModelLoadError,
    NotCompilableError,
)


def __getattr__(name):
    # InferenceSession imports onnxruntime; keep `import autoclust` cheap for the hook.
    # (`from autoclust import registry` here would recurse: it asks this __getattr__ first.)
    from autoclust.registry import public
    return public(name)
