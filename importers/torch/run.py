"""Running torch.compile clusters, and the reports behind `torch_fx.explain`.

A cluster of an ATen graph runs as one call in the rewritten FX graph:

    autoclust_cluster_0000(view_3, arg2_1, s0)  ->  (add_4, mul_9)

Its tensors cross into compiled code without copies (`Tensor.numpy()` shares the tensor's
memory, like `np.from_dlpack`, at a third of its cost: 0.65 us vs 2.1 us per tensor
measured here); outputs come back through `torch.from_numpy`, which shares the array. The
executable is compiled per signature (dtypes and shapes) by `ClusterRunner`'s cache, with
its megamorphic rule; a cluster that fails to compile or turns megamorphic runs its ATen
nodes as eager torch from then on, with one warning.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from autoclust.runtime.runner import ClusterRunner

_EAGER = "eager torch"
_DYNAMO_DIR = os.path.join("torch", "_dynamo", "")


def to_array(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (no copy; strided tensors stay strided)."""
    if t.requires_grad:
        t = t.detach()
    try:
        return t.numpy()
    except (RuntimeError, TypeError):  # conjugate/negative bit views: materialize them
        return t.resolve_conj().resolve_neg().numpy()


class TorchClusterRunner(ClusterRunner):
    """ClusterRunner whose fallback is the cluster's ATen nodes run as eager torch."""

    def try_run(self, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
        """Run compiled for this signature (compiling first); None means: run eager."""
        if self.fallback is not None:
            return None
        key = self.signature(arrays)
        exe = self.cache.get(key)
        if exe is None:
            exe = self._compile(key, arrays)
            if exe is None:
                return None
        self.runs += 1
        outs = exe.run(arrays)
        if self.check_numerics:
            self._check_numerics(outs)
        return outs

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self.fallback = _EAGER
        warnings.warn(f"autoclust: {self.name} falls back to eager torch ({reason})",
                      RuntimeWarning, stacklevel=5)
        if self.dumper is not None:
            self.dumper.write_failure(self.name, reason)


def make_cluster_call(name: str, runner: TorchClusterRunner, array_args: list[int],
                      build_eager: Callable[[], Callable]) -> Callable:
    """The function the rewritten FX graph calls for one cluster.

    It takes the cluster's external FX values (tensors and symbolic sizes) and returns its
    outputs as a tuple of tensors; `array_args` index the ones compiled code reads.
    """
    eager: list[Callable] = []
    lock = threading.Lock()

    def run_eager(args: tuple) -> tuple:
        if not eager:
            with lock:
                if not eager:
                    eager.append(build_eager())
        return eager[0](*args)

    def call(*args: Any) -> tuple:
        if runner.fallback is None:
            outs = runner.try_run([to_array(args[i]) for i in array_args])
            if outs is not None:
                return tuple(torch.from_numpy(o) for o in outs)
        return run_eager(args)

    call.__name__ = call.__qualname__ = f"autoclust_{name}"
    call.runner = runner  # type: ignore[attr-defined]
    return call


# ---- reports ------------------------------------------------------------------------------

@dataclasses.dataclass
class ClusterReport:
    """One cluster of a graph: its ATen nodes, op-table nodes and run statistics."""

    name: str
    aten_nodes: list[str]
    aten_ops: dict[str, int]
    ops: dict[str, int]
    runner: TorchClusterRunner | None = None

    def stats(self) -> dict[str, Any]:
        r = self.runner
        if r is None:
            return {"compiles": 0, "runs": 0, "kernels": [], "fallback": None}
        kernels = [getattr(e, "num_kernels", 0) for e in r.cache.values()]
        return {"compiles": r.compiles, "runs": r.runs, "kernels": kernels,
                "fallback": r.fallback_reason or None}


@dataclasses.dataclass
class GraphReport:
    """One ATen graph torch.compile handed to autoclust: clusters and eager nodes with reasons."""

    index: int
    kind: str                       # "inference", "forward" (training) or "backward"
    codes: tuple = ()               # code objects Dynamo traced, its frame's first
    aten_nodes: int = 0
    clusters: list[ClusterReport] = dataclasses.field(default_factory=list)
    eager: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    folded: list[str] = dataclasses.field(default_factory=list)  # nodes made constants
    failure: str | None = None      # the whole graph runs eager: why
    plan: Any = None                # the autoclust Plan over the op-table graph
    aten_code: str = ""             # the ATen graph as Python (gm.code)
    frozen: int = 0                 # parameters and buffers compiled as constants
    refreshes: int = 0              # rebuilds because a frozen tensor changed

    def clear(self) -> None:
        """Forget what the last build found (a refresh builds the graph again)."""
        self.clusters, self.eager, self.folded = [], [], []
        self.failure, self.plan = None, None

    @property
    def where(self) -> str:
        if not self.codes:
            return "?"
        c = self.codes[0]
        if _DYNAMO_DIR in c.co_filename:  # Dynamo's wrapper of a torch.nn module: the
            c = self.codes[-1]            # outermost inlined function is traced last
        return f"{c.co_name} ({c.co_filename}:{c.co_firstlineno})"

    def covered(self) -> int:
        return sum(len(c.aten_nodes) for c in self.clusters)

    def explain_text(self) -> str:
        """Clusters with their ATen op histograms, then each eager node and why."""
        head = (f"graph {self.index} [{self.kind}] from {self.where}: {self.aten_nodes} ATen "
                f"nodes, {_count(len(self.clusters), 'cluster')} covering {self.covered()}, "
                f"{len(self.eager)} run as eager torch, {len(self.folded)} folded to constants")
        if self.frozen:
            head += f", {_count(self.frozen, 'parameter')} frozen"
            head += f" (rebuilt {self.refreshes}x after changes)" if self.refreshes else ""
        lines = [head]
        if self.failure:
            lines.append(f"  whole graph runs as eager torch: {self.failure}")
        for c in self.clusters:
            s = c.stats()
            runs = f"compiled {s['compiles']}x, ran {s['runs']}x, kernels {s['kernels']}"
            if s["fallback"]:
                runs += f", fell back to eager torch: {s['fallback']}"
            lines.append(f"  {c.name}: {_count(len(c.aten_nodes), 'node')}  {_fmt(c.aten_ops)}")
            lines.append(f"      -> {_fmt(c.ops)}; {runs}")
        for node, target, reason in self.eager:
            lines.append(f"  eager {node} ({target}): {reason}")
        return "\n".join(lines)

    def explain_json(self) -> dict[str, Any]:
        return {"index": self.index, "kind": self.kind, "where": self.where,
                "aten_nodes": self.aten_nodes, "failure": self.failure, "folded": self.folded,
                "frozen": self.frozen, "refreshes": self.refreshes,
                "clusters": [{"name": c.name, "aten_nodes": c.aten_nodes,
                              "aten_ops": c.aten_ops, "ops": c.ops, **c.stats()}
                             for c in self.clusters],
                "eager": [{"node": n, "target": t, "reason": r} for n, t, r in self.eager]}


def histogram(names: list[str]) -> dict[str, int]:
    """name -> count, most frequent first (ties by name)."""
    counts = Counter(names)
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _fmt(hist: dict[str, int]) -> str:
    return ", ".join(k if n == 1 else f"{k} x{n}" for k, n in hist.items()) or "-"


class ReportLog:
    """Every graph compiled in this process, in order (cleared by `reset`)."""

    def __init__(self) -> None:
        self._reports: list[GraphReport] = []
        self._lock = threading.Lock()

    def new(self, kind: str, codes: tuple) -> GraphReport:
        with self._lock:
            report = GraphReport(len(self._reports), kind, codes)
            self._reports.append(report)
            return report

    def clear(self) -> None:
        with self._lock:
            self._reports = []

    def select(self, fn: Any = None) -> list[GraphReport]:
        """All reports, or those whose graph traced `fn`'s code (or a graph-break resume
        function of it)."""
        reports = list(self._reports)
        if fn is None:
            return reports
        code = code_of(fn)
        return [r for r in reports if any(_same_source(c, code) for c in r.codes)]


def code_of(fn: Any) -> Any:
    """The code object torch.compile traces for `fn`: a function, module or compiled one."""
    fn = getattr(fn, "_torchdynamo_orig_callable", fn)
    fn = getattr(fn, "_orig_mod", fn)
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"explain() takes a function, module or torch.compile result, got "
                        f"{type(fn).__name__}")
    return code


def _same_source(code: Any, want: Any) -> bool:
    """`code` is `want`, or one of the resume functions Dynamo makes after a graph break."""
    if code is want:
        return True
    return code.co_filename == want.co_filename and \
        f"_in_{want.co_name}_at_" in code.co_name
