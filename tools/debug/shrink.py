"""Shrink a failing ONNX model to a minimal one that still fails (delta debugging).

One shrinker serves `autoclust fuzz` (a failing random graph) and `autoclust minify` (a
user's model or a dumped cluster). `shrink(model, feeds, still_fails)` runs these phases
in order, each a ddmin (Zeller's delta debugging: keep a half, else a quarter, ..., or
drop one; repeat on what still fails):

  outputs    keep fewer graph outputs (the nodes only they needed go with them)
  nodes      keep a subset of the nodes: a value a kept node reads from a removed one
             becomes a graph input fed with what onnxruntime computed for it (an integer
             scalar or vector, a shape or axes, becomes a constant instead, so shape
             computations stay static); a kept value a removed node read becomes an output
  constants  graph inputs become initializers holding their feed
  shapes     each input and initializer is cut along each axis: to size 1, else halved

Every candidate is a standalone model, and `still_fails(model, feeds)` decides (callers
run it in a worker process, so a crash or a hang is an answer, not the end). The result
is 1-minimal per phase: dropping any one more output, node or input loses the failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from autoclust.tools.debug.repro import run_ort
from onnx import helper, numpy_helper

Feeds = dict[str, np.ndarray]
Predicate = Callable[[onnx.ModelProto, Feeds], bool]
PHASES = ("outputs", "nodes", "constants", "shapes")


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _info(name: str, value: np.ndarray) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    return helper.make_tensor_value_info(name, elem, list(value.shape))


# ---- standalone models ------------------------------------------------------------------

def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The array of a Constant node with a numeric value, else None."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") \
            or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return numpy_helper.to_array(attr.t)
    kinds = {"value_float": np.float32, "value_floats": np.float32,
             "value_int": np.int64, "value_ints": np.int64}
    if attr.name in kinds:
        return np.asarray(helper.get_attribute_value(attr), kinds[attr.name])
    return None


def normalize(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node named (`{op}_{i}` when unnamed, as the importer does); numeric Constant
    nodes become initializers, so they neither count as nodes nor get shrunk one by one."""
    out = _copy(model)
    taken: set[str] = set()
    for i, node in enumerate(out.graph.node):
        base = node.name or f"{node.op_type}_{i}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        node.name = name
    keep = []
    for node in out.graph.node:
        value = _constant_value(node)
        if value is None:
            keep.append(node)
        else:
            out.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def all_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are every node output, in graph order."""
    probe = _copy(model)
    names = [o for n in probe.graph.node for o in n.output if o]
    del probe.graph.output[:]
    probe.graph.output.extend([onnx.ValueInfoProto(name=n) for n in names])
    return probe


def intermediate_values(model: onnx.ModelProto, feeds: Feeds) -> dict[str, np.ndarray]:
    """Every node output computed by onnxruntime (optimizations off), by name."""
    probe = all_outputs(model)
    return dict(zip([o.name for o in probe.graph.output], run_ort(probe, feeds)))


def _keep_value_info(model: onnx.ModelProto) -> None:
    """Drop value_info of values that are no longer internal (they would conflict)."""
    g = model.graph
    internal = {o for n in g.node for o in n.output} - {o.name for o in g.output}
    kept = [vi for vi in g.value_info if vi.name in internal]
    del g.value_info[:]
    g.value_info.extend(kept)


def prune(model: onnx.ModelProto, feeds: Feeds) -> tuple[onnx.ModelProto, Feeds]:
    """Drop nodes no graph output needs, then unused graph inputs and initializers."""
    g = model.graph
    needed = {o.name for o in g.output}
    keep = []
    for node in reversed(g.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    keep.reverse()
    out = _copy(model)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    inputs = [v for v in g.input if v.name in needed]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    inits = [t for t in g.initializer if t.name in needed]
    del out.graph.initializer[:]
    out.graph.initializer.extend(inits)
    _keep_value_info(out)
    return out, {k: v for k, v in feeds.items() if k in needed}


def static_value(value: np.ndarray) -> bool:
    """Integer scalars and vectors (shapes, axes, indices) are kept as constants."""
    return value.dtype.kind in "iu" and value.ndim <= 1


def subset(model: onnx.ModelProto, keep: list[int], values: dict[str, np.ndarray]
           ) -> tuple[onnx.ModelProto, Feeds] | None:
    """A standalone model of the nodes at `keep`; None when it would observe nothing."""
    g = model.graph
    chosen = set(keep)
    nodes = [n for i, n in enumerate(g.node) if i in chosen]
    produced = {o for n in nodes for o in n.output if o}
    read_elsewhere = {x for i, n in enumerate(g.node) if i not in chosen for x in n.input}
    graph_outputs = {o.name: o for o in g.output}
    outputs = [o for n in nodes for o in n.output
               if o and (o in graph_outputs or o in read_elsewhere)]
    reads = list(dict.fromkeys(x for n in nodes for x in n.input if x and x not in produced))
    inits = {t.name for t in g.initializer}
    if not outputs or any(x not in inits and x not in values for x in reads) or any(
            o not in graph_outputs and o not in values for o in outputs):
        return None
    out = _copy(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    old_inputs = {v.name: v for v in g.input}
    inputs, feeds, consts = [], {}, []
    for x in reads:
        if x in inits:
            continue
        if x not in old_inputs and static_value(values[x]):
            consts.append(numpy_helper.from_array(values[x], x))
            continue
        inputs.append(old_inputs.get(x) or _info(x, values[x]))
        feeds[x] = values[x]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    used = [t for t in g.initializer if t.name in reads]
    del out.graph.initializer[:]
    out.graph.initializer.extend(used + consts)
    del out.graph.output[:]
    out.graph.output.extend(graph_outputs.get(o) or _info(o, values[o]) for o in outputs)
    _keep_value_info(out)
    return out, feeds


# ---- delta debugging --------------------------------------------------------------------

def _chunks(items: list, n: int) -> list[list]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


def ddmin(items: list, test: Callable[[list], bool]) -> list:
    """A 1-minimal sublist of `items` (which pass `test`) that still passes `test`."""
    seen: dict[tuple, bool] = {}

    def check(sub: list) -> bool:
        key = tuple(sub)
        if key not in seen:
            seen[key] = test(sub)
        return seen[key]

    n = 2
    while len(items) >= 2:
        chunks = _chunks(items, n)
        found = next((c for c in chunks if check(c)), None)
        if found is not None:
            items, n = found, 2
            continue
        if n > 2:  # with two chunks the complements are the chunks themselves
            rests = ([x for j, c in enumerate(chunks) if j != k for x in c]
                     for k in range(len(chunks)))
            found = next((r for r in rests if check(r)), None)
            if found is not None:
                items, n = found, max(n - 1, 2)
                continue
        if n >= len(items):
            break
        n = min(len(items), 2 * n)
    return items


# ---- the phases ---------------------------------------------------------------------------

def _with_outputs(model: onnx.ModelProto, keep: list[int]) -> onnx.ModelProto:
    out = _copy(model)
    kept = [model.graph.output[i] for i in keep]
    del out.graph.output[:]
    out.graph.output.extend(kept)
    return out


def shrink_outputs(model: onnx.ModelProto, feeds: Feeds, still_fails: Predicate
                   ) -> tuple[onnx.ModelProto, Feeds]:
    """Keep a 1-minimal set of graph outputs that still fails."""
    def test(keep: list[int]) -> bool:
        return still_fails(*prune(_with_outputs(model, keep), feeds))

    keep = ddmin(list(range(len(model.graph.output))), test)
    return prune(_with_outputs(model, keep), feeds)


def shrink_nodes(model: onnx.ModelProto, feeds: Feeds, still_fails: Predicate
                 ) -> tuple[onnx.ModelProto, Feeds]:
    """Keep a 1-minimal set of nodes that still fails (cut values fed from onnxruntime)."""
    try:
        values = {**feeds, **intermediate_values(model, feeds)}
    except Exception:  # noqa: BLE001 - onnxruntime cannot run it: no node edits possible
        return model, feeds

    def test(keep: list[int]) -> bool:
        cand = subset(model, keep, values)
        return cand is not None and still_fails(*prune(*cand))

    keep = ddmin(list(range(len(model.graph.node))), test)
    cand = subset(model, keep, values)
    return prune(*cand) if cand is not None else (model, feeds)


def _as_constants(model: onnx.ModelProto, feeds: Feeds, names: set[str]
                  ) -> tuple[onnx.ModelProto, Feeds]:
    out = _copy(model)
    inputs = [v for v in model.graph.input if v.name not in names]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    out.graph.initializer.extend(numpy_helper.from_array(feeds[n], n) for n in sorted(names))
    return out, {k: v for k, v in feeds.items() if k not in names}


def shrink_constants(model: onnx.ModelProto, feeds: Feeds, still_fails: Predicate
                     ) -> tuple[onnx.ModelProto, Feeds]:
    """Turn as many graph inputs as still fail into constants."""
    names = [v.name for v in model.graph.input if v.name in feeds]
    if not names:
        return model, feeds

    def test(kept: list[str]) -> bool:
        return still_fails(*_as_constants(model, feeds, set(names) - set(kept)))

    kept = [] if test([]) else ddmin(names, test)
    return _as_constants(model, feeds, set(names) - set(kept))


def _resized(model: onnx.ModelProto, feeds: Feeds, name: str, axis: int, size: int
             ) -> tuple[onnx.ModelProto, Feeds]:
    """The model with array `name` (a feed or an initializer) cut to `size` along `axis`."""
    out = _copy(model)
    feeds = dict(feeds)
    cut = (slice(None),) * axis + (slice(0, size),)
    if name in feeds:
        feeds[name] = np.ascontiguousarray(feeds[name][cut])
        vi = next(v for v in out.graph.input if v.name == name)
        dim = vi.type.tensor_type.shape.dim[axis]
        if dim.HasField("dim_value"):
            dim.dim_value = size
    else:
        t = next(t for t in out.graph.initializer if t.name == name)
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(
            numpy_helper.to_array(t)[cut]), name))
    for o in out.graph.output:  # output and intermediate dims change: let them be inferred
        for dim in o.type.tensor_type.shape.dim:
            dim.Clear()
    del out.graph.value_info[:]
    return out, feeds


def _arrays(model: onnx.ModelProto, feeds: Feeds) -> dict[str, tuple[int, ...]]:
    """Shrinkable arrays: feeds, and initializers that are not shape-like integer vectors."""
    out = {v.name: feeds[v.name].shape for v in model.graph.input if v.name in feeds}
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        if arr.size > 1 and not static_value(arr):
            out[t.name] = arr.shape
    return out


def shrink_shapes(model: onnx.ModelProto, feeds: Feeds, still_fails: Predicate
                  ) -> tuple[onnx.ModelProto, Feeds]:
    """Cut each array along each axis to size 1, else halve it while it still fails."""
    for name, shape in _arrays(model, feeds).items():
        for axis, size in enumerate(shape):
            target, tried_one = 1, False
            while 1 <= target < size and not (target == 1 and tried_one):
                cand = _resized(model, feeds, name, axis, target)
                if still_fails(*cand):
                    (model, feeds), size = cand, target
                elif target != 1:
                    break
                tried_one = tried_one or target == 1
                target = size // 2
    return model, feeds


STEPS = {"outputs": shrink_outputs, "nodes": shrink_nodes, "constants": shrink_constants,
         "shapes": shrink_shapes}


def shrink(model: onnx.ModelProto, feeds: Feeds, still_fails: Predicate,
           phases: tuple[str, ...] = PHASES,
           log: Callable[[str], Any] = lambda s: None) -> tuple[onnx.ModelProto, Feeds]:
    """A smaller model (and its feeds) for which `still_fails` still holds."""
    model, feeds = prune(normalize(model), feeds)
    for phase in phases:
        before = len(model.graph.node)
        model, feeds = STEPS[phase](model, feeds, still_fails)
        inputs = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in feeds.items())
        log(f"  {phase}: {before} -> {len(model.graph.node)} nodes; inputs: {inputs or '-'}")
    return model, feeds
