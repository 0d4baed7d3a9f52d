"""`autoclust bisect MODEL`: find the first node whose compiled code makes the outputs wrong.

    autoclust bisect model.onnx [--input NAME=FILE.npy ...] [--dim seq=64] [--flags "..."]
    autoclust bisect /tmp/ac/cluster_0003          # a dumped cluster, on its saved inputs

1. Run the model under autoclust (with --flags) and under onnxruntime. A failure is a
   mismatch beyond --rtol/--atol, a compile error (a cluster fell back to onnxruntime), an
   exception or a crash. Every trial runs in a worker process (tools/fuzz/command.py's Worker,
   the fuzzer's oracle), so a crash or a hang in compiled code ends a trial, not the tool.
2. Bisect --clustering_fuel: the smallest N that still fails when only the first N
   candidates (graph order) may cluster.
3. Run each cluster of that plan alone, as a standalone model fed with the values
   onnxruntime computed for its inputs: the first that fails is the bad cluster.
4. Bisect inside it: the shortest prefix of its nodes (graph order) that fails alone. Its
   last node is the first node whose compiled result breaks the outputs.
5. Write --out in the --dump_to format (manifest, clustering.*, cluster_NNNN.onnx) plus the
   bad cluster and the failing prefix as standalone models with their real inputs
   (cluster_NNNN.inputs.npz and cluster_NNNN.bad_prefix.*, keyed by input name) and
   bisect.json; print the `autoclust replay` and `autoclust minify` commands.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from autoclust.tools.debug import repro, shrink
from autoclust.tools.fuzz import check as fuzz_check
from autoclust.tools.fuzz import command as fuzz
from autoclust.tools.fuzz.check import Outcome

from autoclust.ir import Graph, Node

Feeds = dict[str, np.ndarray]
FAILURES = (fuzz_check.MISMATCH, fuzz_check.ERROR, fuzz_check.CRASH, fuzz_check.FALLBACK)
# Trials of one cluster or prefix on its own: every node may cluster, however small.
ALONE = {"min_cluster_size": 1, "auto_jit": 2}
NOT_FOR_TRIALS = ("dump_to", "dump_inputs", "clustering_fuel")


def failed(outcome: Outcome) -> bool:
    """Whether a trial shows a compiled-code failure (compile fallbacks count)."""
    return outcome.kind in FAILURES and outcome.where != "interpreter"


def describe(outcome: Outcome, width: int = 0) -> str:
    """'kind: first line of the message', cut to `width` characters when given."""
    first = outcome.message.splitlines()[0] if outcome.message else ""
    text = f"{outcome.kind}: {first}" if first else outcome.kind
    return text[:width - 3] + "..." if width and len(text) > width else text


def verdict(outcome: Outcome) -> str:
    """A short line for a trial log: 'ok', 'mismatch: output 0: 12 of 64 elements differ
    (max abs diff 1.5)', or the failure cut to 90 characters."""
    if not failed(outcome):
        return "ok"
    found = re.match(r"(output \d+: \d+ of \d+ elements differ).*(max abs diff \S+)$",
                     outcome.message)
    if outcome.kind == fuzz_check.MISMATCH and found:
        return f"mismatch: {found.group(1)} ({found.group(2)})"
    return describe(outcome, 90)


class Trials:
    """Runs trials in an isolated worker and logs them (above a progress bar on a terminal)."""

    def __init__(self, flags: dict[str, Any], worker: Any, log: Callable[[str], Any] | None = None,
                 desc: str = "autoclust"):
        from autoclust.report.progress import Progress
        self.flags = {k: v for k, v in flags.items() if k not in NOT_FOR_TRIALS}
        self.worker = worker
        # every trial already prints a line: the bar (a terminal only) counts them
        self.progress = Progress(desc, unit="trial", log=False)
        self.log = log or (lambda s: self.progress.write(s, sys.stdout))
        self.count = 0

    def run(self, model: onnx.ModelProto, feeds: Feeds, **extra: Any) -> Outcome:
        """The worker's verdict on `model` with the user's flags plus `extra`."""
        self.count += 1
        try:
            return self.worker(model, feeds, [{**self.flags, **extra}])
        finally:
            self.progress.update()

    def close(self) -> None:
        """Remove the progress bar."""
        self.progress.close()


def fuel_bisect(trials: Trials, model: onnx.ModelProto, feeds: Feeds, n_nodes: int
                ) -> int | None:
    """Smallest clustering fuel that fails; None when even fuel 0 fails."""
    outcome = trials.run(model, feeds, clustering_fuel=0)
    trials.log(f"  fuel 0: {verdict(outcome)}")
    if failed(outcome):
        return None
    lo, hi = 0, n_nodes  # lo passes; hi (as much fuel as there are nodes) failed already
    while hi - lo > 1:
        mid = (lo + hi) // 2
        outcome = trials.run(model, feeds, clustering_fuel=mid)
        trials.log(f"  fuel {mid}: {verdict(outcome)}")
        if failed(outcome):
            hi = mid
        else:
            lo = mid
    return hi


def standalone(graph: Graph, nodes: list[Node], values: Feeds, name: str
               ) -> tuple[onnx.ModelProto, Feeds]:
    """`nodes` of `graph` as a model fed with `values`; shape-like inputs become constants."""
    from autoclust.importers.onnx import export_model
    sub = graph.extract(nodes, name=name)
    feeds = {}
    for v in list(sub.inputs):
        value = np.asarray(values[v.name])
        if shrink.static_value(value):  # shapes and axes: static, as the runtime specializes them
            sub.inputs.remove(v)
            sub.initializers[v.name] = value
            v.dtype, v.shape = value.dtype, tuple(value.shape)
        else:
            feeds[v.name] = value
    return export_model(sub), feeds


def graph_values(graph: Graph, model: onnx.ModelProto, feeds: Feeds) -> Feeds:
    """Every value of `graph` as onnxruntime computes it (plus feeds and constants)."""
    from autoclust.importers.onnx import export_model
    try:
        values = shrink.intermediate_values(export_model(graph), feeds)
    except Exception:  # noqa: BLE001 - fall back to the original model's value names
        values = shrink.intermediate_values(shrink.normalize(model), feeds)
    return {**graph.initializers, **feeds, **values}


def in_order(graph: Graph, nodes: list[Node]) -> list[Node]:
    """`nodes` in graph order."""
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    return sorted(nodes, key=lambda n: position[id(n)])


def first_bad_cluster(trials: Trials, plan: Any, values: Feeds) -> tuple[Any, Outcome] | None:
    """The first cluster of `plan` that fails on its own, with the failure."""
    for c in plan.clusters:
        model, feeds = standalone(plan.graph, c.nodes, values, c.name)
        outcome = trials.run(model, feeds, **ALONE)
        trials.log(f"  {c.name} ({len(c.nodes)} nodes) alone: {verdict(outcome)}")
        if failed(outcome):
            return c, outcome
    return None


def prefix_bisect(trials: Trials, graph: Graph, nodes: list[Node], values: Feeds,
                  whole: Outcome) -> tuple[int, Outcome]:
    """Length of the shortest failing prefix of `nodes` (a cluster's), and its failure."""
    lo, hi, found = 0, len(nodes), whole
    while hi - lo > 1:
        mid = (lo + hi) // 2
        model, feeds = standalone(graph, nodes[:mid], values, "prefix")
        outcome = trials.run(model, feeds, **ALONE)
        trials.log(f"  first {mid} of {len(nodes)} nodes: {verdict(outcome)}")
        if failed(outcome):
            hi, found = mid, outcome
        else:
            lo = mid
    return hi, found


def write_dump(out_dir: str, plan: Any, cluster: Any, nodes: list[Node], values: Feeds) -> str:
    """The --dump_to files of `plan`, then the bad cluster and its failing prefix standalone
    with their real inputs; returns the prefix's DIR/cluster_NNNN.bad_prefix."""
    from autoclust.report.dump import Dumper
    dumper = Dumper.create(out_dir, plan.flags)
    if dumper is None:
        raise OSError(f"cannot write to {out_dir}")
    dumper.write_plan(plan)
    for tag, part in (("", cluster.nodes), (".bad_prefix", nodes)):
        model, feeds = standalone(plan.graph, part, values, cluster.name + tag)
        base = dumper.path(cluster.name + tag)
        onnx.save_model(model, base + ".onnx")
        repro.save_arrays(base + ".inputs.npz", feeds)
    return dumper.path(cluster.name + ".bad_prefix")


def _candidate(graph: Graph, flags: Any, fuel: int, why_not: Any) -> str:
    """The node that fuel `fuel` lets cluster and `fuel - 1` does not."""
    from autoclust.clustering.partition import cluster
    plan = cluster(graph, flags.replace(clustering_fuel=fuel - 1), why_not)
    return next((n for n, r in plan.reasons.items() if r == "clustering fuel exhausted"), "?")


def bisect(model: onnx.ModelProto, feeds: Feeds, out_dir: str, trials: Trials
           ) -> dict[str, Any]:
    """Bisect one failing model; returns what was found (see the module docstring)."""
    from autoclust.importers.onnx import import_model

    from autoclust import flags as flags_mod
    from autoclust import registry
    from autoclust.clustering.partition import cluster
    log = trials.log
    whole = trials.run(model, feeds)
    result: dict[str, Any] = {"failure": describe(whole), "flags": repro.flags_text(trials.flags)}
    if whole.where == "interpreter":
        return {**result, "result": "the op references (interpreter) disagree with onnxruntime"}
    if not failed(whole):
        return {**result, "result": "no failure: autoclust matches onnxruntime"}
    log(f"  whole model: {verdict(whole)}")
    graph = import_model(model)
    f = flags_mod.parse(**trials.flags)
    backend = registry.get_backend(f.device)
    fuel = fuel_bisect(trials, model, feeds, len(graph.nodes))
    if fuel is None:
        return {**result, "result": "fails with nothing clustered (not a compiled-code bug)"}
    candidate = _candidate(graph, f, fuel, backend.why_not)
    log(f"  first failing fuel: {fuel} (it lets node {candidate} cluster)")
    plan = cluster(graph, f.replace(clustering_fuel=fuel), backend.why_not)
    values = graph_values(graph, model, feeds)
    found = first_bad_cluster(trials, plan, values)
    result.update(fuel=fuel, candidate=candidate)
    if found is None:
        return {**result, "result": "no cluster fails alone: the failure needs several"}
    bad, outcome = found
    nodes = in_order(plan.graph, bad.nodes)
    length, outcome = prefix_bisect(trials, plan.graph, nodes, values, outcome)
    node = nodes[length - 1]
    prefix = write_dump(out_dir, plan, bad, nodes[:length], values)
    return {**result, "result": "found", "cluster": bad.name, "cluster_nodes": len(bad.nodes),
            "node": node.name, "op": node.op, "prefix_nodes": length,
            "node_failure": describe(outcome), "prefix": prefix}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autoclust bisect", description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model, or a dumped cluster DIR/cluster_NNNN")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                   help="value for a symbolic dim when inputs are generated")
    p.add_argument("--flags", default="", help="AUTOCLUST_FLAGS of the failing runs")
    p.add_argument("--rtol", type=float, default=fuzz_check.RTOL,
                   help="relative tolerance for every float dtype (default: per dtype, "
                   "1e-4 float32, 8 ulps float16, 1e-9 float64)")
    p.add_argument("--atol", type=float, default=fuzz_check.ATOL,
                   help="absolute tolerance (default: the dtype's smallest normal number)")
    p.add_argument("--out", default="bisect_out", help="dump folder (default bisect_out)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per trial")
    p.add_argument("--seed", type=int, default=0, help="seed of generated inputs")
    return p


def commands(result: dict[str, Any]) -> list[str]:
    """The replay and minify command lines for a bisect result."""
    flags = f" --flags={shlex.quote(result['flags'])}" if result["flags"] else ""
    prefix = repro.shown(result["prefix"])
    return [f"autoclust replay {prefix}{flags}", f"autoclust minify {prefix}{flags}"]


def main(argv: list[str]) -> int:
    """Entry point of `autoclust bisect`: exit 1 when a failing node was found."""
    from autoclust.tools.run import parse_assignments

    from autoclust import flags as flags_mod
    args = _parser().parse_args(argv)
    dims = {k: int(v) for k, v in parse_assignments(args.dim, "--dim").items()}
    model, feeds, source = repro.load_target(args.model, parse_assignments(args.input, "--input"),
                                             dims, args.seed)
    flags = flags_mod.parse_string(args.flags)
    print(f"autoclust bisect {args.model}: {source}; flags {args.flags or '(none)'}", flush=True)
    start = time.perf_counter()
    worker = fuzz.Worker(args.timeout, args.rtol, args.atol)
    trials = Trials(flags, worker, desc="autoclust bisect")
    try:
        result = bisect(model, feeds, args.out, trials)
    finally:
        worker.close()
        trials.close()
    result.update(model=args.model, trials=trials.count,
                  seconds=round(time.perf_counter() - start, 2))
    if result["result"] != "found":
        clean = result["result"].startswith("no failure")
        print(f"{result['result']} ({trials.count} trials)"
              + ("" if clean else f"; the model's failure: {result['failure']}"))
        return 0 if clean else 1
    with open(os.path.join(args.out, "bisect.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"first bad node: {result['node']} ({result['op']}), node {result['prefix_nodes']} "
          f"of {result['cluster']}'s {result['cluster_nodes']}")
    print(f"  its first {result['prefix_nodes']} nodes alone: {result['node_failure']}")
    print(f"{trials.count} trials in {result['seconds']:.1f} s; dump in {args.out}")
    for line in commands(result):
        print(f"  {line}")
    return 1
