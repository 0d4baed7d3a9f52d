"""Auto-jit for unmodified onnxruntime programs.

The package installs `autoclust-hook.pth`, whose one line runs at interpreter start-up:
it reads AUTOCLUST_FLAGS and, only when that asks for --auto_jit=1 or 2, imports this
module and calls install(). Without the variable nothing is imported.

install() replaces onnxruntime.InferenceSession (now, or when the program imports
onnxruntime) by a subclass that also builds an autoclust session and routes run()
through it. Everything else (io_binding, profiling, metadata) is onnxruntime's own.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

_installed = False


def make_jit_class(original: type) -> type:
    """A subclass of onnxruntime's InferenceSession whose run() goes through autoclust."""

    class InferenceSession(original):  # type: ignore[misc, valid-type]
        __doc__ = original.__doc__

        def __init__(self, path_or_bytes: Any, sess_options: Any = None, providers: Any = None,
                     provider_options: Any = None, **kwargs: Any):
            super().__init__(path_or_bytes, sess_options, providers, provider_options, **kwargs)
            from autoclust.errors import AutoclustError
            from autoclust.session import InferenceSession as Jit
            try:
                self._autoclust = Jit(path_or_bytes, sess_options, providers, provider_options)
            except AutoclustError as exc:
                warnings.warn(f"autoclust: auto-jit disabled for this session: {exc}",
                              RuntimeWarning, stacklevel=2)
                self._autoclust = None

        def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
            jit = getattr(self, "_autoclust", None)
            if jit is None:
                return super().run(output_names, input_feed, run_options)
            return jit.run(output_names, input_feed, run_options)

    InferenceSession.__module__ = original.__module__
    InferenceSession.__qualname__ = original.__qualname__
    return InferenceSession


def patch(module: Any) -> None:
    """Swap the session class in an imported onnxruntime module (idempotent)."""
    current = module.InferenceSession
    if getattr(current, "_autoclust_patched", False):
        return
    # Our own sub-sessions must keep onnxruntime's class.
    import autoclust.backends.ort as ort_backend
    ort_backend.ORIGINAL_SESSION = current
    jit = make_jit_class(current)
    jit._autoclust_patched = True
    module.InferenceSession = jit
    capi = sys.modules.get("onnxruntime.capi.onnxruntime_inference_collection")
    if capi is not None and getattr(capi, "InferenceSession", None) is current:
        capi.InferenceSession = jit


class _Finder(importlib.abc.MetaPathFinder):
    """Patches onnxruntime right after the program imports it."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "onnxruntime":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module: Any) -> None:
            original_exec(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Turn auto-jit on for onnxruntime sessions created from now on."""
    global _installed
    if _installed:
        return
    _installed = True
    if "onnxruntime" in sys.modules:
        patch(sys.modules["onnxruntime"])
    else:
        sys.meta_path.insert(0, _Finder())


def startup() -> None:
    """Called from autoclust-hook.pth: cheap unless AUTOCLUST_FLAGS asks for auto-jit."""
    from autoclust.flags import env_requests_jit
    if env_requests_jit():
        install()
