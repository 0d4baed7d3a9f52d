"""Backends, the onnxruntime fallback and importers by name: the core reaches them only here.

A backend is a module with
    NAME                          its --device name
    POLICY                        a Policy: what the core asks it (data, not code paths)
    why_not(node, graph)          None when it can compile the node, else the reason
    compile(program, flags)       kernel IR Program -> Executable   (POLICY.lowers)
    compile(graph, flags)         optimized Graph -> Executable     (not POLICY.lowers)
and may offer `render(program, flags) -> {file suffix: text}` (generated code without
compiling it, for `autoclust compile`) and `require_device()` (raise
DeviceUnavailableError when this machine cannot run it; sessions call it). An Executable
has `run(inputs) -> outputs`, `num_kernels` and `dumps` ({file suffix: text}).

Built-in backends are listed in BACKENDS; third parties register under the
`autoclust.backends` entry-point group (name = device, value = module path), and every
`--device` choice comes from `device_names()`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from importlib import metadata
from types import ModuleType
from typing import TYPE_CHECKING, Any

from autoclust.errors import FlagError

if TYPE_CHECKING:
    from autoclust.ir import Node

BACKENDS = {
    "cpu": "autoclust.backends.cpu",
    "gpu": "autoclust.backends.gpu",
    "interpreter": "autoclust.runtime.interpreter",
}
FALLBACK = "autoclust.backends.ort"      # runs whatever is not clustered
IMPORTERS = {"onnx": "autoclust.importers.onnx", "numpy": "autoclust.importers.numpy",
             "builder": "autoclust.importers.builder"}
# The public API's names (autoclust.InferenceSession, ...) -> "module:attribute", resolved
# when first used: `import autoclust` stays cheap, and a lower layer that must hand a model
# to a session (Builder.compile) reaches the front door here instead of importing it.
PUBLIC = {
    "InferenceSession": "autoclust.session:InferenceSession",
    "Builder": "autoclust.importers.builder:Builder",
    "register_op": "autoclust.ops.custom:register_op",
    "unregister_op": "autoclust.ops.custom:unregister_op",
    "jit": "autoclust.tracing:jit",
    "trace": "autoclust.tracing:trace",
}
# `autoclust.ray`'s names (batch inference on Ray Data), resolved the same way.
RAY_API = {
    "Predictor": "autoclust.serve.predictor:Predictor",
    "ModelPredictor": "autoclust.serve.predictor:ModelPredictor",
}


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a backend tells the core, so the core never branches on a device name."""

    lowers: bool = True   # compile() takes kernel IR; False: the optimized graph (interpreter)
    # Ops onnxruntime runs better than this device's library calls, and the ops onnxruntime
    # fuses into them when they follow one (Conv + BatchNorm + Relu): left unclustered.
    leave_to_onnxruntime: frozenset = frozenset()
    onnxruntime_epilogues: frozenset = frozenset()
    # Of those ops, the nodes this backend takes after all (CPU: a depthwise Conv, its
    # generated code in backends/cpu/dwconv.py; a Conv tiling its input, a MatMul by
    # passes/patchify.py): clustered like any other op. None: none.
    generates: Callable[[Node], bool] | None = None
    # MatMul + constant bias Add as one Gemm call: "" never, "alone" when no loop kernel
    # reads the sum, "always" (see fusion.bias_folds).
    fold_bias: str = ""
    # Library ops whose operands and results may be strided views of buffers (a transpose
    # in front of or behind a GEMM read or written in place: kernel/views.py).
    library_views: frozenset = frozenset()
    # Library ops whose calls take the elementwise kernel after them as an epilogue
    # (kernel/epilogues.py): the backend runs it inside the call or right after it.
    library_epilogues: frozenset = frozenset()
    # Values live in the device's own memory: the runtime copies them to the host for
    # onnxruntime segments and back, and the backend module offers to_device(x),
    # to_host(x), is_device(x) (and may offer capture(runtime), a whole-run replay).
    device_memory: bool = False
    # Attention (softmax(Q K^T) V) as one FusedAttention library call (passes/attention.py)
    # for head dims up to this; 0: never (the unfused ops lower as usual).
    fused_attention: int = 0
    # the dtypes of Q, K, V it fuses (CPU: float32; empty: the pass's own list), and the
    # fewest keys worth it (CPU: shorter rows stay unfused, their scores fit in cache)
    attention_dtypes: tuple = ()
    attention_min_keys: int = 0
    # whether it fuses attention whose sizes are symbolic (CPU: no, its kernel's sizes are
    # in its code; that attention stays unfused)
    attention_symbolic: bool = True
    # dtypes this backend's library calls take beyond the op table's (GPU: bfloat16 GEMMs)
    library_dtypes: frozenset = frozenset()
    # Whether a kernel may store its output over one of its inputs, the input's last
    # reader (kernel, input buffer, output buffer): the memory plan then gives both one
    # slot (kernel/memplan.py). None: never.
    writes_over: Callable[[Any, Any, Any], bool] | None = None
    # compile() takes Programs whose dims may be symbolic (autoclust/symbolic.py) and
    # returns an object whose bind(dims) gives the Executable for their values: one
    # compile serves every sequence length of a shape class (runtime/shape_class.py).
    symbolic_dims: bool = False


_loaded: dict[str, ModuleType] = {}


def _entry_points() -> dict[str, str]:
    try:
        eps = metadata.entry_points(group="autoclust.backends")
    except Exception:  # noqa: BLE001 - broken metadata must not break the built-in backends
        return {}
    return {ep.name: ep.value for ep in eps}


def device_names() -> list[str]:
    """Every --device choice: the built-in backends, then entry-point ones."""
    return list(BACKENDS) + sorted(n for n in _entry_points() if n not in BACKENDS)


def get_backend(name: str) -> ModuleType:
    """The backend module called `name`; FlagError when unknown or unavailable."""
    mod = _loaded.get(name)
    if mod is not None:
        return mod
    path = BACKENDS.get(name) or _entry_points().get(name)
    if path is None:
        raise FlagError(f"unknown device {name!r}; known devices: {', '.join(device_names())}")
    try:
        mod = importlib.import_module(path)
    except ImportError as exc:
        raise FlagError(f"device {name!r} is not available here: {exc}") from None
    missing = [a for a in ("compile", "why_not") if not hasattr(mod, a)]
    if missing:
        raise FlagError(f"device {name!r} ({path}) is not a backend: it lacks {missing}")
    _loaded[name] = mod
    return mod


def policy(backend: ModuleType) -> Policy:
    """A backend's Policy (the default one when it declares none)."""
    return getattr(backend, "POLICY", Policy())


def fallback() -> ModuleType:
    """The onnxruntime fallback backend (segments and sessions)."""
    return importlib.import_module(FALLBACK)


def importer(name: str) -> ModuleType:
    """The importer package for a front end: "onnx", "numpy" or "builder"."""
    return importlib.import_module(IMPORTERS[name])


def public(name: str) -> Any:
    """The public API object `autoclust.<name>`; AttributeError when there is none."""
    return _resolve(PUBLIC, "autoclust", name)


def _resolve(table: dict[str, str], owner: str, name: str) -> Any:
    if name not in table:
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    module, _, attr = table[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def ray_api(name: str) -> Any:
    """`autoclust.ray.<name>`; AttributeError when there is none."""
    return _resolve(RAY_API, "autoclust.ray", name)


def session_class() -> type:
    """autoclust.InferenceSession."""
    return public("InferenceSession")
