"""autoclust.jit and autoclust.trace: NumPy functions traced, clustered and compiled.

    @autoclust.jit                      # or autoclust.jit(fn, threads=2, device="interpreter")
    def f(x, w, scale=0.5):
        return np.tanh(x @ w) * scale

    y = f(x, w)                         # NumPy in, NumPy out
    c = autoclust.trace(f, x, w)        # c.as_text(), c.to_onnx(), c.explain()

A call's signature is the dtypes and shapes of its array arguments plus the values of
everything else (Python scalars, None, strings, tuples, `static_argnums`/`static_argnames`
arguments): static, so a new value traces again. Arrays may sit inside lists, tuples and
dicts. Each signature is traced once (importers/numpy/trace.py) into a graph, written as
ONNX and run by an autoclust.InferenceSession, which clusters and compiles it. Results
come back as NumPy arrays in the function's own structure (tuples, lists, dicts).

The megamorphic rule is the sessions' (autoclust/runtime/runner.py): a function traced more than
--megamorphic_compiles times with fewer than RUNS_PER_COMPILE runs per trace stops
compiling and runs as plain NumPy from then on, with one warning.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from autoclust import flags as flags_mod
from autoclust import registry
from autoclust.errors import TraceError

_STATIC_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _static_key(x: Any, where: str) -> Any:
    """The hashable cache key of a static value (floats by repr: -0.0 and nan differ)."""
    if isinstance(x, float):
        return ("float", repr(x))
    try:
        hash(x)
    except TypeError:
        raise TraceError(f"{where}: a {type(x).__name__} is neither an array nor hashable; "
                         "pass arrays (or lists/tuples/dicts of them) or hashable "
                         "static values") from None
    return (type(x), x)


def _arg_key(x: Any, where: str, arrays: list[tuple[str, np.ndarray]]) -> Any:
    """Cache key of one argument; appends its arrays (name, array) to `arrays`."""
    if isinstance(x, np.ndarray | np.generic):
        a = np.asarray(x)
        arrays.append((where, a))
        return ("array", a.dtype.str, a.shape)
    if isinstance(x, list | tuple):
        kind = type(x) if _is_namedtuple(x) else type(x).__name__
        return (kind, tuple(_arg_key(v, f"{where}_{i}", arrays) for i, v in enumerate(x)))
    if isinstance(x, dict):
        return ("dict", tuple((k, _arg_key(v, f"{where}_{k}", arrays)) for k, v in x.items()))
    return ("static", _static_key(x, where))


def _with_tracers(x: Any, tracers: Any) -> Any:
    """x with its arrays replaced, in _arg_key's order, by the next of `tracers`."""
    if isinstance(x, np.ndarray | np.generic):
        return next(tracers)
    if isinstance(x, list | tuple):
        items = [_with_tracers(v, tracers) for v in x]
        return type(x)(*items) if _is_namedtuple(x) else type(x)(items)
    if isinstance(x, dict):
        return {k: _with_tracers(v, tracers) for k, v in x.items()}
    return x


# Module-level recursion, no nested recursive closures: a closure that calls itself sits
# in a reference cycle (function -> cell -> function) with everything it captured, here
# every output of every call; only the cycle collector freed them (issue 24 item 13).

def flatten_result(x: Any) -> tuple[list[Any], Any]:
    """(leaves, tree) of a function's result: tuples, lists and dicts are structure."""
    leaves: list[Any] = []
    return leaves, _walk(x, leaves)


def _walk(v: Any, leaves: list[Any]) -> Any:
    if isinstance(v, list | tuple):
        return (type(v), [_walk(c, leaves) for c in v])
    if isinstance(v, dict):
        return (dict, {k: _walk(c, leaves) for k, c in v.items()})
    leaves.append(v)
    return None


def unflatten_result(tree: Any, leaves: Sequence[Any]) -> Any:
    """Rebuild flatten_result's structure from `leaves`."""
    return _build(tree, iter(leaves))


def _build(t: Any, it: Any) -> Any:
    if t is None:
        return next(it)
    kind, kids = t
    if kind is dict:
        return {k: _build(c, it) for k, c in kids.items()}
    items = [_build(c, it) for c in kids]
    return kind(*items) if issubclass(kind, tuple) and hasattr(kind, "_fields") \
        else kind(items)


class Traced:
    """One traced signature of a function: its graph, ONNX model and clustering."""

    def __init__(self, name: str, builder: Any, tree: Any, input_names: list[str],
                 flags: dict[str, Any]):
        self.name = name
        self.builder = builder
        self.graph = builder.graph
        self.tree, self.slots = tree
        self.input_names = input_names
        self.flags = flags

    @property
    def has_outputs(self) -> bool:
        return bool(self.graph.outputs)

    def as_text(self) -> str:
        """The graph, one node per line (the IR printer)."""
        return str(self.graph)

    def to_onnx(self) -> Any:
        """An ONNX ModelProto (IR 10) that onnxruntime runs with the same outputs."""
        if not self.has_outputs:
            raise TraceError(f"{self.name}: the function returns no arrays; nothing to export")
        return self.builder.to_onnx()

    def explain(self) -> str:
        """How autoclust clusters the traced graph, and why the rest does not cluster."""
        from autoclust.clustering.partition import cluster
        from autoclust.report import explain
        f = flags_mod.parse(**self.flags)
        graph = registry.importer("onnx").import_model(self.to_onnx())
        return explain.explain_text(cluster(graph, f, registry.get_backend(f.device).why_not))

    def compile(self) -> Any:
        """An autoclust.InferenceSession-backed callable for this signature."""
        compiled = registry.importer("builder").Compiled
        return compiled(self.to_onnx(), **self.flags) if self.has_outputs else None

    def results(self, outputs: Sequence[np.ndarray]) -> Any:
        """The function's result: graph outputs put back into its structure."""
        slot = registry.importer("numpy").OutputSlot
        leaves = [outputs[s.index] if isinstance(s, slot) else s for s in self.slots]
        return unflatten_result(self.tree, leaves)


class _Entry:
    __slots__ = ("compiled", "input_names", "traced")

    def __init__(self, traced: Traced):
        self.traced = traced
        self.compiled = traced.compile()
        self.input_names = traced.input_names


class Jitted:
    """A NumPy function compiled per signature; call it like the function."""

    def __init__(self, fn: Callable[..., Any], static_argnums: Sequence[int] = (),
                 static_argnames: Sequence[str] = (), **flags: Any):
        if not callable(fn):
            raise TypeError(f"autoclust.jit needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = getattr(fn, "__name__", "function")
        self.static_argnums = {int(i) for i in _as_tuple(static_argnums)}
        self.static_argnames = set(_as_tuple(static_argnames))
        self.flags = dict(flags)
        self._parsed = flags_mod.parse(**flags)  # a bad flag fails here, not at first call
        self._params = _param_names(fn)
        self._cache: dict[Any, _Entry] = {}
        self._lock = threading.Lock()
        self.compiles = 0
        self.runs = 0
        self.fallback_reason = ""
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"autoclust.jit({self.name}, {len(self._cache)} signatures)"

    def _signature(self, args: tuple, kwargs: dict[str, Any]
                   ) -> tuple[Any, list[tuple[str, np.ndarray]]]:
        arrays: list[tuple[str, np.ndarray]] = []
        key = []
        for i, a in enumerate(args):
            name = self._params[i] if i < len(self._params) else f"arg{i}"
            if i in self.static_argnums or name in self.static_argnames:
                key.append(("static", _static_key(a, f"{self.name} argument {name!r}")))
            else:
                key.append(_arg_key(a, name, arrays))
        for k in sorted(kwargs):
            if k in self.static_argnames:
                key.append((k, _static_key(kwargs[k], f"{self.name} argument {k!r}")))
            else:
                key.append((k, _arg_key(kwargs[k], k, arrays)))
        return tuple(key), arrays

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Trace the function on these arguments (shapes and dtypes; values unused)."""
        _, arrays = self._signature(args, kwargs)
        return self._trace(args, kwargs, arrays)

    def _trace(self, args: tuple, kwargs: dict[str, Any],
               arrays: list[tuple[str, np.ndarray]]) -> Traced:
        trace_graph = registry.importer("numpy").trace_graph
        names = _unique_names([n for n, _ in arrays])

        def call(tracers: list[Any]) -> Any:
            it = iter(tracers)
            targs = [a if i in self.static_argnums or (i < len(self._params) and
                                                       self._params[i] in self.static_argnames)
                     else _with_tracers(a, it) for i, a in enumerate(args)]
            tkw = {k: v if k in self.static_argnames else _with_tracers(v, it)
                   for k, v in sorted(kwargs.items())}
            return self.fn(*targs, **tkw)

        builder, tree = trace_graph(self.name, list(zip(names, (a for _, a in arrays))),
                                    call, flatten_result)
        return Traced(self.name, builder, tree, names, self.flags)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.fallback_reason:
            return self.fn(*args, **kwargs)
        key, arrays = self._signature(args, kwargs)
        entry = self._cache.get(key)
        if entry is None:
            entry = self._compile(key, args, kwargs, arrays)
            if entry is None:
                return self.fn(*args, **kwargs)
        self.runs += 1
        outputs = []
        if entry.compiled is not None:
            outputs = entry.compiled.session.run(None, dict(zip(
                entry.input_names, (a for _, a in arrays))))
        return entry.traced.results(outputs)

    def _compile(self, key: Any, args: tuple, kwargs: dict[str, Any],
                 arrays: list[tuple[str, np.ndarray]]) -> _Entry | None:
        from autoclust.runtime.runner import RUNS_PER_COMPILE
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None or self.fallback_reason:
                return entry
            limit = self._parsed.megamorphic_compiles
            if self.compiles >= limit and self.runs < RUNS_PER_COMPILE * self.compiles:
                self._fall_back(f"megamorphic: traced {self.compiles} signatures in "
                                f"{self.runs} runs")
                return None
            entry = _Entry(self._trace(args, kwargs, arrays))
            self.compiles += 1
            self._cache[key] = entry
            return entry

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self._cache.clear()
        warnings.warn(f"autoclust.jit: {self.name} runs as plain NumPy from now on ({reason})",
                      RuntimeWarning, stacklevel=4)

    def stats(self) -> dict[str, Any]:
        """Traces, runs, cached signatures and the fallback reason (for tests and tuning)."""
        return {"compiles": self.compiles, "runs": self.runs, "signatures": len(self._cache),
                "fallback": self.fallback_reason or None}


def _as_tuple(x: Any) -> tuple:
    if x is None:
        return ()
    return tuple(x) if isinstance(x, list | tuple | set) else (x,)


def _param_names(fn: Callable[..., Any]) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def _unique_names(names: list[str]) -> list[str]:
    out: list[str] = []
    for n in names:
        base, k = n, 1
        while n in out:
            n, k = f"{base}_{k}", k + 1
        out.append(n)
    return out


def jit(fn: Callable[..., Any] | None = None, *, static_argnums: Sequence[int] = (),
        static_argnames: Sequence[str] = (), **flags: Any) -> Any:
    """Compile a NumPy function per signature: `@jit`, `@jit(threads=2)` or `jit(fn, ...)`.
    Keyword arguments other than static_argnums/static_argnames are autoclust flags."""
    if fn is None:
        return lambda f: Jitted(f, static_argnums, static_argnames, **flags)
    return Jitted(fn, static_argnums, static_argnames, **flags)


def trace(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Traced:
    """Trace fn on example arguments (like jax.xla_computation): a Traced with as_text(),
    to_onnx() and explain(). A jitted fn keeps its static arguments and flags."""
    jitted = fn if isinstance(fn, Jitted) else Jitted(fn)
    return jitted.trace(*args, **kwargs)
