"""`autoclust bisect MODEL`: find the first node whose compiled code makes the outputs wrong.

    autoclust bisect model.onnx [--input NAME=FILE.npy ...] [--dim seq=64] [--flags "..."]
    autoclust bisect /tmp/ac/cluster_0003          # a dumped cluster, on its saved inputs

1. onnxruntime computes every value of the model once, with its spread: how far it moves
   when every float input and initializer moves by one ulp (the fuzzer's oracle,
   tools/fuzz/check.py). Every trial is compared with these values, so no trial builds an
   onnxruntime session of its own (BERT-base: 3 s a session, 6 s a spread).
2. Run the model under autoclust (with --flags). A failure is a mismatch beyond
   --rtol/--atol (plus 8 spreads), a compile error (a cluster fell back), an exception or
   a crash. Every trial runs in a worker process (tools/fuzz/command.py's Worker), so a
   crash or a hang in compiled code ends a trial, not the tool; the worker keeps what it
   compiled, so a kernel compiles once per bisect.
3. Bisect the nodes in graph order: the shortest prefix that fails as a standalone model
   clustered with --flags (the values it hands to the rest of the graph compared with
   onnxruntime's). Its last node is the first node whose compiled result is wrong.
4. Shrink the failing prefix from the front: the shortest run of nodes ending at that node
   that still fails alone, fed with onnxruntime's values and free to cluster however small
   (often the node alone). When even the whole prefix passes alone, the failure needs
   --flags' clustering, and the repro is the prefix.
5. Write --out: the --dump_to plan files of the whole model (manifest, clustering.*; not
   its cluster models, which can hold every weight), the repro as a standalone model with
   its real inputs (bad_nodes.onnx, bad_nodes.inputs.npz, keyed by input name) and
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
# Trials of a few nodes on their own: every node may cluster, however small.
ALONE = {"min_cluster_size": 1, "auto_jit": 2}
NOT_FOR_TRIALS = ("dump_to", "dump_inputs", "clustering_fuel")
REPRO = "bad_nodes"


def failed(outcome: Outcome) -> bool:
    """Whether a trial shows a compiled-code failure (compile fallbacks count)."""
    return outcome.kind in FAILURES and outcome.where != "interpreter"


def describe(outcome: Outcome, width: int = 0) -> str:
    """'kind: first line of the message', cut to `width` characters when given."""
    first = outcome.message.splitlines()[0] if outcome.message else ""
    text = f"{outcome.kind}: {first}" if first else outcome.kind
    return text[:width - 3] + "..." if width and len(text) > width else text


def verdict(outcome: Outcome) -> str:
    """A short line for a trial log: 'ok', "mismatch: 12 of 64 elements of 'y' (Softmax)
    differ, first got 2.5 for 1.0", or the failure cut to 100 characters."""
    if not failed(outcome):
        return "ok"
    found = re.match(r"output \d+ \((\w+) '(.*)'\): (\d+ of \d+) elements differ.*?"
                     r"got (\S+), expected (\S+) ", outcome.message)
    if outcome.kind == fuzz_check.MISMATCH and found:
        op, name, count, got, want = found.groups()
        name = name if len(name) <= 32 else "..." + name[-29:]
        return (f"mismatch: {count} elements of '{name}' ({op}) differ, first got {got} for "
                f"{want}")
    return describe(outcome, 100)


class Reference:
    """Every value of a model as onnxruntime computes it, and its spread (step 1)."""

    def __init__(self, values: Feeds, spread: dict[str, np.ndarray | None] | None):
        self.values = values
        self.spread = spread  # None: onnxruntime raised; trials compute their own

    def expected(self, model: onnx.ModelProto) -> fuzz.Expected | None:
        """The outputs of `model` (a piece of the graph) with their spreads, or None."""
        names = [o.name for o in model.graph.output]
        if self.spread is None or any(n not in self.spread for n in names):
            return None
        return {n: (self.values[n], self.spread[n]) for n in names}


def reference(graph: Graph, model: onnx.ModelProto, feeds: Feeds) -> Reference:
    """onnxruntime's value and spread of every node output of `graph` on `feeds`."""
    from autoclust.importers.onnx import export_model
    known = {**graph.initializers, **feeds}
    probe = shrink.all_outputs(model)  # onnxruntime on the user's model, as the user ran it
    names = [o.name for o in probe.graph.output]
    if not {o.name for n in graph.nodes for o in n.outputs} <= set(names):
        probe = shrink.all_outputs(export_model(graph))  # the importer named new values
        names = [o.name for o in probe.graph.output]
    feeds = {v.name: feeds[v.name] for v in probe.graph.input if v.name in feeds}
    try:
        outs, spread = fuzz_check.outputs_and_spread(probe, feeds)
    except Exception:  # noqa: BLE001 - it raises on these feeds: trials decide alone
        return Reference(known, None)
    return Reference({**known, **dict(zip(names, outs))}, dict(zip(names, spread)))


class Trials:
    """Runs trials in an isolated worker and logs them (above a progress bar on a terminal)."""

    def __init__(self, flags: dict[str, Any], worker: Any, log: Callable[[str], Any] | None = None,
                 desc: str = "autoclust", interpreter: bool = True):
        from autoclust.report.progress import Progress
        self.flags = {k: v for k, v in flags.items() if k not in NOT_FOR_TRIALS}
        self.worker = worker
        self.interpreter = interpreter  # False: compiled code only (bisect after its first)
        # every trial already prints a line: the bar (a terminal only) counts them
        self.progress = Progress(desc, unit="trial", log=False)
        self.log = log or (lambda s: self.progress.write(s, sys.stdout))
        self.count = 0

    def run(self, model: onnx.ModelProto, feeds: Feeds, expected: fuzz.Expected | None = None,
            **extra: Any) -> Outcome:
        """The worker's verdict on `model` with the user's flags plus `extra`, against
        `expected` outputs when given (else onnxruntime in the worker)."""
        self.count += 1
        try:
            return self.worker(model, feeds, [{**self.flags, **extra}], expected,
                               self.interpreter)
        finally:
            self.progress.update()

    def close(self) -> None:
        """Remove the progress bar."""
        self.progress.close()


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


def try_nodes(trials: Trials, graph: Graph, nodes: list[Node], ref: Reference, label: str,
              **extra: Any) -> Outcome:
    """One trial of `nodes` standalone against the reference, logged as `label`."""
    model, feeds = standalone(graph, nodes, ref.values, "bisect")
    outcome = trials.run(model, feeds, ref.expected(model), **extra)
    trials.log(f"  {label}: {verdict(outcome)}")
    return outcome


def boundary(test: Callable[[int], Outcome], fails: int, passes: int, found: Outcome
             ) -> tuple[int, Outcome]:
    """Binary search between an index that fails (with `found`) and one that passes: the
    failing index next to a passing one, and its failure."""
    while abs(passes - fails) > 1:
        mid = (fails + passes) // 2
        outcome = test(mid)
        if failed(outcome):
            fails, found = mid, outcome
        else:
            passes = mid
    return fails, found


def shortest_prefix(test: Callable[[int], Outcome], n: int, found: Outcome
                    ) -> tuple[int, Outcome]:
    """The smallest m in 1..n for which test(m) fails (test(n) failed with `found`; m = 0
    is taken to pass), and that failure."""
    return boundary(test, n, 0, found)


def shortest_suffix(test: Callable[[int], Outcome], n: int, found: Outcome
                    ) -> tuple[int, Outcome]:
    """The largest s in 0..n-1 for which test(s) (items s..n-1) fails (test(0) failed
    with `found`; test(n - 1), the last item alone, is tried first), and that failure."""
    last = test(n - 1)
    return (n - 1, last) if failed(last) else boundary(test, 0, n - 1, found)


def cluster_part(trials: Trials, model: onnx.ModelProto, node: Node, graph: Graph
                 ) -> list[Node]:
    """The nodes of the failing prefix `model` that --flags cluster with `node`, in graph
    order up to it ([] when it is not clustered there)."""
    from autoclust.importers.onnx import import_model

    from autoclust import flags as flags_mod
    from autoclust import registry
    from autoclust.clustering.partition import cluster
    f = flags_mod.parse(**trials.flags)
    c = cluster(import_model(model), f, registry.get_backend(f.device).why_not
                ).cluster_of(node.name)
    names = {n.name for n in c.nodes} if c is not None else set()
    part = [n for n in graph.nodes if n.name in names]
    return part[:part.index(node) + 1] if node in part else []


def localize(trials: Trials, graph: Graph, ref: Reference, whole: Outcome
             ) -> tuple[list[Node], Node, Outcome, bool]:
    """(the repro's nodes, the first bad node, the repro's failure, whether the repro
    needs --flags' clustering): steps 3 and 4 of the module docstring."""
    nodes = graph.nodes
    seen: dict[tuple[int, ...], Outcome] = {}

    def prefix(m: int) -> Outcome:
        return try_nodes(trials, graph, nodes[:m], ref, f"first {m} of {len(nodes)} nodes")

    def alone(part: list[Node], label: str) -> Outcome:
        key = tuple(id(n) for n in part)
        if key not in seen:
            seen[key] = try_nodes(trials, graph, part, ref, label, **ALONE)
        return seen[key]

    end, found = shortest_prefix(prefix, len(nodes), whole)
    model, _ = standalone(graph, nodes[:end], ref.values, "bisect")
    part = cluster_part(trials, model, nodes[end - 1], graph)
    trials.log(f"  first failing prefix: {end} of {len(nodes)} nodes; its last cluster holds "
               f"{len(part)} of them")
    if not part:
        return nodes[:end], nodes[end - 1], found, True  # no cluster to look into
    # Most often the prefix's last node is the bad one: two trials say so.
    last = alone(part[-1:], f"{part[-1].name} alone")
    if failed(last):
        rest = alone(part[:-1], f"the {len(part) - 1} before it alone") if part[:-1] else whole
        if not failed(rest):
            return part[-1:], part[-1], last, False
        n, found = len(part) - 1, rest
    else:
        n, found = len(part), alone(part, f"those {len(part)} alone")
        if not failed(found):
            return nodes[:end], nodes[end - 1], found, True  # it needs --flags' clustering
    m, found = shortest_prefix(lambda k: alone(part[:k], f"first {k} of them alone"), n, found)
    begin, found = shortest_suffix(
        lambda k: alone(part[k:m], f"{part[m - 1].name} alone" if k == m - 1
                        else f"their nodes {k + 1}-{m} alone"), m, found)
    return part[begin:m], part[m - 1], found, False


def write_dump(out_dir: str, plan: Any, nodes: list[Node], values: Feeds) -> str:
    """The --dump_to plan files of `plan`, then `nodes` standalone with their real inputs;
    returns DIR/bad_nodes (the replay and minify argument)."""
    from autoclust.report.dump import Dumper
    dumper = Dumper.create(out_dir, plan.flags)
    if dumper is None:
        raise OSError(f"cannot write to {out_dir}")
    dumper.write_plan(plan, clusters=False)
    model, feeds = standalone(plan.graph, nodes, values, REPRO)
    base = dumper.path(REPRO)
    onnx.save_model(model, base + ".onnx")
    repro.save_arrays(base + ".inputs.npz", feeds)
    return base


def _in_plan(plan: Any, node: Node) -> str:
    """Where the user's plan put `node`: 'in cluster_0001 (9 nodes)' or why it did not."""
    c = plan.cluster_of(node.name)
    if c is None:
        return f"not clustered: {plan.reasons.get(node.name, 'no reason given')}"
    return f"in {c.name} ({len(c.nodes)} nodes)"


def bisect(model: onnx.ModelProto, feeds: Feeds, out_dir: str, trials: Trials
           ) -> dict[str, Any]:
    """Bisect one failing model; returns what was found (see the module docstring)."""
    from autoclust.importers.onnx import import_model

    from autoclust import flags as flags_mod
    from autoclust import registry
    from autoclust.clustering.partition import cluster
    log = trials.log
    getattr(trials.worker, "start", lambda: None)()  # its imports overlap the reference
    graph = import_model(model)
    start = time.perf_counter()
    ref = reference(graph, model, feeds)
    log(f"  reference: onnxruntime computed {len(ref.spread or ())} values and their spread "
        f"({time.perf_counter() - start:.1f} s)")
    whole = trials.run(model, feeds, ref.expected(model))
    trials.interpreter = False  # it ran only if autoclust passed; the rest is compiled code
    result: dict[str, Any] = {"failure": describe(whole), "flags": repro.flags_text(trials.flags)}
    if whole.where == "interpreter":
        return {**result, "result": "the op references (interpreter) disagree with onnxruntime"}
    if not failed(whole):
        return {**result, "result": "no failure: autoclust matches onnxruntime"}
    log(f"  whole model: {verdict(whole)}")
    nodes, node, outcome, needs_flags = localize(trials, graph, ref, whole)
    f = flags_mod.parse(**trials.flags)
    plan = cluster(graph, f, registry.get_backend(f.device).why_not)
    path = write_dump(out_dir, plan, nodes, ref.values)
    return {**result, "result": "found", "node": node.name, "op": node.op,
            "position": graph.nodes.index(node) + 1, "nodes": len(graph.nodes),
            "in_plan": _in_plan(plan, node), "repro_nodes": len(nodes),
            "needs_flags": needs_flags, "node_failure": describe(outcome), "repro": path}


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
    path = repro.shown(result["repro"])
    return [f"autoclust replay {path}{flags}", f"autoclust minify {path}{flags}"]


def _print_found(result: dict[str, Any], out: str, trials: int) -> None:
    print(f"first bad node: {result['node']} ({result['op']}), node {result['position']} of "
          f"{result['nodes']} in graph order ({result['in_plan']})")
    what = (f"the first {result['repro_nodes']} nodes, as --flags cluster them"
            if result["needs_flags"] else "the node alone" if result["repro_nodes"] == 1
            else f"the last {result['repro_nodes']} nodes of its cluster up to it, alone")
    print(f"  {what}: {result['node_failure']}")
    print(f"{trials} trials in {result['seconds']:.1f} s; dump in {out}")
    for line in commands(result):
        print(f"  {line}")


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
    _print_found(result, args.out, trials.count)
    return 1
