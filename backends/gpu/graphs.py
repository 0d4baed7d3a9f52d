"""Whole runs replayed as CUDA graphs (as torch.compile's "reduce-overhead" mode).

A plan qualifies when every step is a GPU cluster (no onnxruntime segment, no fallback,
no shape-deciding input) and every library call is capturable: cuBLAS GEMMs are when they
go through blas.py's own handles (CuPy 14's wrapper refuses stream capture), Einsum,
integer MatMul and custom calls are not. Per input signature (names, dtypes, shapes):

    run 1      eager: every cluster compiles for the signature
    run 2      capture: static device inputs, outputs and temps; one graph of every launch
    run 3...   replay: copy the feeds into the static inputs, launch the graph, read the
               check flags, hand out copies of the static outputs

At most MAX_GRAPHS signatures are captured; `--cuda_graphs=false` turns this off, and so
does --check_numerics (it inspects every cluster's outputs). `GraphRunner.reason` says
why a plan does not qualify.

Streams: a capture runs on a stream of its own, whose scratch memory (each executable's
temps, workspaces and check flags; cuBLAS's workspace) is made before the capture begins
and is used by nothing but that graph. Every replay runs on that stream too -- after the
caller's stream's earlier work, and before its later work (events) -- so two replays of
one graph, from any threads and streams, never overlap.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from autoclust.backends.gpu import device

MAX_GRAPHS = 8


class _Captured:
    """One signature's graph: its static inputs and the static arrays it writes, the
    stream it was captured on and replays on, and the memory it points at."""

    def __init__(self, graph: Any, inputs: dict[str, Any], outputs: dict[str, Any],
                 exes: list[Any], stream: Any, keep: list[Any]):
        self.graph = graph
        self.inputs = inputs
        self.outputs = outputs
        self.exes = exes
        self.stream = stream
        self.keep = keep  # cuBLAS's workspace of that stream: alive as long as the graph


class GraphRunner:
    """runtime.DeviceRun asks run(feeds) first: an env of the run, or None (run eagerly)."""

    def __init__(self, runtime: Any):
        self.runtime = runtime
        self.graphs: dict[tuple, _Captured] = {}
        self.seen: dict[tuple, int] = {}
        self.replays = 0
        self.reason = self._structural_reason()
        self._lock = threading.Lock()

    def _structural_reason(self) -> str:
        from autoclust.runtime.runner import ClusterRunner
        rt = self.runtime
        if rt.flags.check_numerics:
            return "--check_numerics inspects every cluster's outputs"
        for r in rt.runners:
            if not isinstance(r, ClusterRunner):
                return f"{r.name} runs in onnxruntime"
            if r.shape_value_index:
                return f"{r.name} has shape-deciding inputs"
        return ""

    def run(self, feeds: dict[str, Any]) -> dict[str, Any] | None:
        if self.reason:
            return None
        sig = tuple(sorted((n, str(x.dtype), tuple(x.shape)) for n, x in feeds.items()))
        with self._lock:
            g = self.graphs.get(sig)
            if g is None:
                self.seen[sig] = self.seen.get(sig, 0) + 1
                if self.seen[sig] < 2 or len(self.graphs) >= MAX_GRAPHS:
                    return None
                g = self._capture(feeds)
                if g is None:
                    return None
                self.graphs[sig] = g
            return self._replay(g, feeds)

    # ---- capture -------------------------------------------------------------------------
    def _walk(self, env: dict[str, Any], prepared: list | None) -> tuple[list, list] | None:
        """Walk the steps binding each cluster's executable for its inputs: (executables,
        their output arrays). With `prepared`, launch into those outputs (the capture)."""
        rt = self.runtime
        exes, outs_all = [], []
        for i, (runner, (_, in_names, out_names, _)) in enumerate(zip(rt.runners, rt.steps)):
            if not runner.on_device():
                self.reason = f"{runner.name} falls back to onnxruntime"
                return None
            args = [env[n] for n in in_names]
            exe = runner.cache.get(runner.signature(args))
            if exe is None or not getattr(exe, "capturable", False):
                if exe is not None and not getattr(exe, "pending", False):
                    self.reason = _not_capturable(runner.name, exe)
                return None  # (a step still timing its choice: try again next run)
            outs = exe.prepare() if prepared is None else prepared[i]
            if prepared is not None:
                exe.launch(args, outs)
            exes.append(exe)
            outs_all.append(outs)
            env.update(zip(out_names, outs))
        return exes, outs_all

    def _static_env(self, feeds: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        inputs = {n: device.empty(x.shape, x.dtype) for n, x in feeds.items()}
        env = {n: device.to_device(v, count=False) for n, v in self.runtime.defaults.items()}
        env.update(inputs)
        return env, inputs

    def _capture(self, feeds: dict[str, Any]) -> _Captured | None:
        cp = device.cupy()
        env, inputs = self._static_env(feeds)
        walked = self._walk(dict(env), None)  # bind executables, allocate outputs
        if walked is None:
            return None
        exes, prepared = walked
        stream = cp.cuda.Stream(non_blocking=True)
        keep = []
        with contextlib.ExitStack() as locks:
            for exe in exes:
                locks.enter_context(exe._lock)
            try:
                with stream:
                    for exe in exes:  # allocations: none may happen under capture
                        exe.scratch(stream.ptr)
                    keep = _prepare_blas(stream)
                    stream.begin_capture()
                    try:
                        self._walk(env, prepared)
                    finally:
                        graph = stream.end_capture()
            except Exception as exc:  # noqa: BLE001 - any capture failure: run eagerly
                self.reason = f"CUDA graph capture failed: {type(exc).__name__}: {exc}"
                return None
        outputs = {n: env[n] for n in self.runtime.output_names}
        return _Captured(graph, inputs, outputs, exes, stream, keep)

    def _replay(self, g: _Captured, feeds: dict[str, Any]) -> dict[str, Any]:
        caller = device.cupy().cuda.get_current_stream()
        feeds = {name: device.to_device(x) for name, x in feeds.items()}  # on the caller's
        g.stream.wait_event(caller.record())
        with contextlib.ExitStack() as locks:
            for exe in g.exes:
                locks.enter_context(exe._lock)
            with g.stream:
                for name, x in feeds.items():
                    device.copyto(g.inputs[name], x)
                g.graph.launch(stream=g.stream)
                for exe in g.exes:
                    exe.finish(g.stream.ptr)
                # the graph rewrites its outputs next replay: the caller gets copies
                env = {n: y.copy() for n, y in g.outputs.items()}
            caller.wait_event(g.stream.record())
        for r in self.runtime.compiled_clusters():
            r.runs += 1
        self.replays += 1
        return env


def _prepare_blas(stream: Any) -> list[Any]:
    """Create this thread's cuBLAS handle and the stream's workspace before a capture: both
    allocate, which a stream under capture cannot (a thread's first GEMM may be the
    captured one). Returns what the graph must keep alive."""
    from autoclust.backends.gpu import blas
    lib = blas.get()
    if lib is None:
        return []
    lib.handle(stream.ptr)
    return [lib.workspace(stream.ptr)]


def _not_capturable(name: str, exe: Any) -> str:
    """Why executable `exe` of cluster `name` cannot be captured."""
    from autoclust.backends.gpu import blas
    why = getattr(exe, "uncapturable", "")
    if why and why != blas.WRAPPER:
        return f"{name}: {why}"
    hosted = [c.reason for c in getattr(exe, "choices", ()) if c.chosen != "gpu"]
    if hosted:
        return f"{name}: {hosted[0]}"
    return f"{name} {blas.WRAPPER}: {blas.reason() or 'no libcublas for blas.py'}"
