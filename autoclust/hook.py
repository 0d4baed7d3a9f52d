"""Auto-jit for unmodified onnxruntime programs.

The package installs `autoclust-hook.pth`, whose one line runs at interpreter start-up:
when AUTOCLUST_FLAGS is set (and not empty) it imports this module and calls startup().
Without the variable nothing is imported.

The flags mean what they mean for the API, defaults included: without --auto_jit the hook
is on with auto_jit's default, 2 (`autoclust flags` lists it), so
`AUTOCLUST_FLAGS=--dump_to=DIR` clusters and dumps; the first session says once (a
RuntimeWarning) that --auto_jit was not given. `--auto_jit=0` turns the hook off, with one
warning when other flags were given, since they then do nothing.

install() replaces onnxruntime.InferenceSession (now, or when the program imports
onnxruntime) by a subclass that also builds an autoclust session, and routes run(),
run_with_ort_values(), run_async(), io_binding() and run_with_iobinding() through it.
autoclust's own onnxruntime sessions keep onnxruntime's class (`ORIGINAL_SESSION` in
backends/ort: its segments, and the baselines of the benchmarks, the fuzzer and the
conformance run, which under the hook had compared autoclust with itself). A
bad AUTOCLUST_FLAGS raises FlagError at session creation, as the API does; under
--must_compile so does NotCompilableError. `--log` says on stderr, once per session, that
autoclust is active and what it clustered.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import warnings
from typing import Any

_installed = False
_noted_default = False


def _check_flags() -> None:
    """Parse AUTOCLUST_FLAGS (FlagError when bad) and note once a missing --auto_jit."""
    global _noted_default
    from autoclust import flags
    given = flags.parse_string(os.environ.get(flags.ENV_VAR, ""))
    if "auto_jit" not in given and not _noted_default:
        _noted_default = True
        warnings.warn(f"autoclust: {flags.ENV_VAR} does not set --auto_jit; running with its "
                      "default, --auto_jit=2 (--auto_jit=0 turns autoclust off)",
                      RuntimeWarning, stacklevel=3)


def make_jit_class(original: type) -> type:
    """A subclass of onnxruntime's InferenceSession whose runs go through autoclust."""

    class InferenceSession(original):
        __doc__ = original.__doc__
        _autoclust_patched = True
        _autoclust_original = original  # our own sub-sessions must keep onnxruntime's class

        def __init__(self, path_or_bytes: Any, sess_options: Any = None, providers: Any = None,
                     provider_options: Any = None, **kwargs: Any):
            _check_flags()  # before onnxruntime loads anything: FlagError as the API raises
            super().__init__(path_or_bytes, sess_options, providers, provider_options, **kwargs)
            from autoclust.errors import AutoclustError, FlagError, NotCompilableError
            from autoclust.session import InferenceSession as Jit
            try:
                self._autoclust: Jit | None = Jit(path_or_bytes, sess_options, providers,
                                                  provider_options)
            except (FlagError, NotCompilableError):
                raise
            except AutoclustError as exc:  # onnxruntime loaded it, we could not: run it as is
                warnings.warn(f"autoclust: auto-jit disabled for this session: {exc}",
                              RuntimeWarning, stacklevel=2)
                self._autoclust = None

        def run(self, output_names: Any, input_feed: Any, run_options: Any = None) -> Any:
            jit = getattr(self, "_autoclust", None)
            if jit is None:
                return super().run(output_names, input_feed, run_options)
            return jit.run(output_names, input_feed, run_options)

        def run_with_ort_values(self, output_names: Any, input_dict_ort_values: Any,
                                run_options: Any = None) -> Any:
            jit = getattr(self, "_autoclust", None)
            if jit is None:
                return super().run_with_ort_values(output_names, input_dict_ort_values,
                                                   run_options)
            return jit.run_with_ort_values(output_names, input_dict_ort_values, run_options)

        def run_async(self, output_names: Any, input_feed: Any, callback: Any, user_data: Any,
                      run_options: Any = None) -> Any:
            jit = getattr(self, "_autoclust", None)
            if jit is None:
                return super().run_async(output_names, input_feed, callback, user_data,
                                         run_options)
            return jit.run_async(output_names, input_feed, callback, user_data, run_options)

        def io_binding(self) -> Any:
            jit = getattr(self, "_autoclust", None)
            return super().io_binding() if jit is None else jit.io_binding()

        def run_with_iobinding(self, iobinding: Any, run_options: Any = None) -> Any:
            jit = getattr(self, "_autoclust", None)
            owner = getattr(iobinding, "_owner", None)  # the session that bound it
            if jit is None or owner is None or owner is not jit:
                return super().run_with_iobinding(iobinding, run_options)
            return jit.run_with_iobinding(iobinding, run_options)

    InferenceSession.__module__ = original.__module__
    InferenceSession.__qualname__ = original.__qualname__
    return InferenceSession


def patch(module: Any) -> None:
    """Swap the session class in an imported onnxruntime module (idempotent)."""
    current = module.InferenceSession
    if getattr(current, "_autoclust_patched", False):
        return
    jit = make_jit_class(current)
    module.InferenceSession = jit
    capi = sys.modules.get("onnxruntime.capi.onnxruntime_inference_collection")
    if capi is not None and getattr(capi, "InferenceSession", None) is current:
        capi_any: Any = capi  # a module: its attributes are untyped
        capi_any.InferenceSession = jit
    from autoclust import registry
    fallback: Any = registry.fallback()  # a module, by name
    fallback.ORIGINAL_SESSION = current


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
    """Called from autoclust-hook.pth: installs the hook unless AUTOCLUST_FLAGS turns
    autoclust off (empty, or --auto_jit=0); a bad value installs it too, so that session
    creation raises the FlagError."""
    from autoclust import flags
    if flags.env_requests_jit():
        install()
        return
    text = os.environ.get(flags.ENV_VAR, "")
    others = sorted(f"--{n}" for n in flags.parse_string(text) if n != "auto_jit")
    if others:
        warnings.warn(f"autoclust: {flags.ENV_VAR} sets --auto_jit=0, so autoclust is off and "
                      f"{', '.join(others)} do nothing", RuntimeWarning, stacklevel=2)
