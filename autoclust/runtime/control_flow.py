"""Control flow with clustered bodies, the running half: a ControlFlow step (planned by
autoclust/clustering/control_flow.py) run with NumPy holding the loop state, one Runtime
per body:

    Loop(M, cond, v...)  body(i, cond, v...) -> (cond, v..., scan...)
        runs while i < M (M omitted: no bound) and cond (omitted: true); scan outputs are
        the per-iteration values stacked along a new axis 0.
    If(cond)             then_branch() or else_branch() -> outputs
    Scan(s..., x...)     body(s..., x[t]...) -> (s..., y...), t along scan_input_axes
        (reversed where scan_input_directions is 1); y stacked along scan_output_axes.

Each body cluster compiles once per input signature, so iterations 2..N of a loop whose
shapes stay put compile nothing (stats() counts compiles and runs). Body nodes that do not
cluster run in onnxruntime segments of the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from autoclust.errors import InvalidInputError
from autoclust.ir import Graph, Node

if TYPE_CHECKING:
    from autoclust.clustering.partition import ControlFlow, Plan
    from autoclust.runtime.runner import Runtime

_INT64 = np.dtype(np.int64)


# ---- running ----------------------------------------------------------------------------

class _Body:
    """One body: its Runtime, formal input names, outer inputs it reads, output names."""

    def __init__(self, plan: Plan, make_runtime: Any, formal: int):
        self.runtime = make_runtime(plan)
        names = [v.name for v in plan.graph.inputs]
        self.formal = names[:formal]
        self.outer = names[formal:]
        self.outputs = [v.name for v in plan.graph.outputs]
        self.device = self.runtime.device

    def run(self, formal: list[np.ndarray], outer: dict[str, np.ndarray],
            run_options: Any) -> list[np.ndarray]:
        feeds = dict(zip(self.formal, formal))
        for name in self.outer:
            feeds[name] = outer[name]
        if self.device is not None:  # a device backend: bring the results to the host
            return self.device.run(feeds, self.outputs, on_device=False)
        env = self.runtime.run(feeds, run_options)
        return [env[n] for n in self.outputs]


class ControlFlowRunner:
    """Runs a ControlFlow step: the loop or branch in Python, its bodies' Runtimes."""

    def __init__(self, step: ControlFlow, graph: Graph,
                 make_runtime: Callable[[Plan], Runtime]):
        self.name = step.name
        self.node = graph.nodes[0]
        self.op = self.node.op
        self.input_names = [v.name for v in graph.inputs]
        self.output_names = [v.name for v in graph.outputs]
        self.constants = dict(graph.initializers)
        formal = {attr: len(self.node.attrs[attr].g.input) for attr in step.bodies}
        self.bodies = {attr: _Body(plan, make_runtime, formal[attr])
                       for attr, plan in step.bodies.items()}
        self.runs = 0
        self.iterations = 0  # body runs over all runs
        self._run = {"Loop": self._loop, "If": self._if, "Scan": self._scan}[self.op]

    def run(self, inputs: list[np.ndarray], run_options: Any = None) -> list[np.ndarray]:
        values = dict(self.constants)
        values.update(zip(self.input_names, inputs))
        args = [None if v is None else values[v.name] for v in self.node.inputs]
        self.runs += 1
        outs = self._run(args, values, run_options)
        by_name = dict(zip([v.name for v in self.node.outputs], outs))
        return [by_name[n] for n in self.output_names]

    def _body(self, attr: str, formal: list[np.ndarray], outer: dict[str, np.ndarray],
              run_options: Any) -> list[np.ndarray]:
        self.iterations += 1
        return self.bodies[attr].run(formal, outer, run_options)

    # ---- the three ops ------------------------------------------------------------------
    def _if(self, args: list[Any], outer: dict[str, Any], run_options: Any) -> list[Any]:
        cond = _scalar(args[0], self.node, "cond")
        return self._body("then_branch" if cond else "else_branch", [], outer, run_options)

    def _loop(self, args: list[Any], outer: dict[str, Any], run_options: Any) -> list[Any]:
        trip = None if len(args) < 1 or args[0] is None else int(_scalar(args[0], self.node,
                                                                          "M"))
        keep = True if len(args) < 2 or args[1] is None else \
            bool(_scalar(args[1], self.node, "cond"))
        carried = list(args[2:])
        n_carried = len(carried)
        scans: list[list[np.ndarray]] = []
        i = 0
        while keep and (trip is None or i < trip):
            outs = self._body("body", [np.array(i, _INT64), np.array(keep), *carried], outer,
                              run_options)
            keep = bool(_scalar(outs[0], self.node, "the body's cond output"))
            carried = outs[1:1 + n_carried]
            scans.append(outs[1 + n_carried:])
            i += 1
        n_scan = len(self.bodies["body"].outputs) - 1 - n_carried
        return carried + [self._stack(k, [s[k] for s in scans], 0, 1 + n_carried + k)
                          for k in range(n_scan)]

    def _scan(self, args: list[Any], outer: dict[str, Any], run_options: Any) -> list[Any]:
        m = int(self.node.attr("num_scan_inputs"))
        n = len(args) - m
        states, xs = list(args[:n]), args[n:]
        in_axes = [_axis(a, x.ndim, self.node) for a, x in
                   zip(self.node.attr("scan_input_axes") or [0] * m, xs)]
        in_rev = list(self.node.attr("scan_input_directions") or [0] * m)
        lengths = {x.shape[a] for x, a in zip(xs, in_axes)}
        if len(lengths) != 1:
            raise InvalidInputError(f"Scan {self.node.name!r}: scan inputs have different "
                                    f"lengths {sorted(lengths)} along their scan axes")
        length = lengths.pop()
        ys: list[list[np.ndarray]] = []
        for t in range(length):
            slices = [np.take(x, length - 1 - t if rev else t, axis=a)
                      for x, a, rev in zip(xs, in_axes, in_rev)]
            outs = self._body("body", [*states, *slices], outer, run_options)
            states, y = outs[:n], outs[n:]
            ys.append(y)
        k = len(self.bodies["body"].outputs) - n
        out_axes = list(self.node.attr("scan_output_axes") or [0] * k)
        out_rev = list(self.node.attr("scan_output_directions") or [0] * k)
        scans = []
        for j in range(k):
            per_step = [y[j] for y in ys]
            if out_rev[j]:
                per_step.reverse()
            scans.append(self._stack(j, per_step, out_axes[j], n + j))
        return states + scans

    def _stack(self, k: int, values: list[np.ndarray], axis: int, out_index: int) -> np.ndarray:
        """Per-iteration values stacked along `axis` (a zero-trip loop: an empty array)."""
        if not values:
            return self._empty_scan(out_index)
        shapes = {v.shape for v in values}
        if len(shapes) != 1:
            raise InvalidInputError(f"{self.op} {self.node.name!r}: scan output {k} changes "
                                    f"shape between iterations: {sorted(shapes)}")
        stacked = np.stack(values)
        return np.moveaxis(stacked, 0, _axis(axis, stacked.ndim, self.node))

    def _empty_scan(self, out_index: int) -> np.ndarray:
        """The scan output of zero iterations: shape (0,) + the body output's static dims,
        as onnxruntime gives it."""
        v = self.bodies["body"].runtime.graph.outputs[out_index]
        dims = v.shape if v.shape is not None else ()
        if not all(isinstance(d, int) for d in dims):
            dims = ()
        return np.zeros((0, *dims), v.dtype)

    # ---- inspection ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Runs, body runs and each body's compile counts (nested control flow included)."""
        return {"name": self.name, "node": self.node.name, "op": self.op, "runs": self.runs,
                "iterations": self.iterations,
                "bodies": {attr: runtime_stats(b.runtime) for attr, b in self.bodies.items()}}

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the bodies' background compiles (--async_compile)."""
        for b in self.bodies.values():
            b.runtime.wait_compiles(timeout)


def runtime_stats(runtime: Any) -> dict[str, Any]:
    """{"clusters": [...], "control_flow": [...]} of a Runtime, as session.stats() counts."""
    clusters = [{"name": r.name, "compiles": r.compiles, "runs": r.runs,
                 "kernels": [getattr(e, "num_kernels", 0) for e in r.cache.values()],
                 "fallback": r.fallback_reason or None} for r in runtime.compiled_clusters()]
    flows = [r.stats() for r in runtime.runners if isinstance(r, ControlFlowRunner)]
    return {"clusters": clusters, "control_flow": flows}


def _scalar(x: Any, node: Node, what: str) -> Any:
    a = np.asarray(x)
    if a.size != 1:
        raise InvalidInputError(f"{node.op} {node.name!r}: {what} must have one element, got "
                                f"shape {a.shape}")
    return a.reshape(()).item()


def _axis(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < rank:
        raise InvalidInputError(f"{node.op} {node.name!r}: axis {axis} is out of range for "
                                f"rank {rank}")
    return axis % rank
